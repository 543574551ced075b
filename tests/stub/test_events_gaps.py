"""A wait, ``ready`` and their documents say when the event listener did not listen during them (``listening_gaps``).

The GPUs are the stub's; the listener is one over a scripted event source (below), so that the test decides when
its wait call fails: the recovery is driven from the wait's first poll, which waits for the listener to finish it
(a condition, never a duration). Nothing asserts how long anything took.
"""

from __future__ import annotations

import time
from argparse import Namespace
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.errors import Unknown
from nvmlcheck.events import EventListener, EventTarget
from nvmlcheck.jsonout import ready_document, wait_document
from nvmlcheck.readiness import ready_on
from nvmlcheck.testing import Scenario, build_stub
from nvmlcheck.wait import WaitOptions

from .conftest import ScriptedEvents

pytestmark = pytest.mark.stub




def _listening(gpus: nc.Session, source: ScriptedEvents) -> EventListener:
    handle = object()
    listener = EventListener(source, [EventTarget(0, handle, "GPU-0")], id).start()
    assert listener.state == "running"
    gpus._listener = listener  # the session's listener: waits with events=None use it
    return listener


def _recovered(listener: EventListener) -> bool:
    return any(g.cause == "recovering" and g.ended_ns is not None for g in listener.gaps())


def _recovery_on_first_poll(source: ScriptedEvents, listener: EventListener) -> Callable[[object], None]:
    polls = [0]

    def on_poll(_point: object) -> None:
        polls[0] += 1
        if polls[0] == 1:
            source.fail_next = Unknown(999, "nvmlEventSetWait_v2")  # transient: a new set, every GPU kept
            end = time.monotonic() + 30.0
            while not _recovered(listener):
                assert time.monotonic() < end, "the listener did not recover"
                time.sleep(0.001)

    return on_poll


def _wait_through_a_recovery(scenario_path: Path) -> nc.WaitResult:
    """A clean wait of one idle GPU through one recovery of the listener (its first poll drives it)."""
    Scenario.h200(1).write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        source = ScriptedEvents()
        listener = _listening(gpus, source)
        try:
            return gpus.wait_until_clean(timeout=60.0, stable_polls=2,
                                         on_poll=_recovery_on_first_poll(source, listener))
        finally:
            listener.stop()


def test_a_wait_through_a_recovery_says_its_gpu_was_not_listened_to_meanwhile(scenario_path: Path) -> None:
    Scenario.h200(1).write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        source = ScriptedEvents()
        listener = _listening(gpus, source)
        try:
            result = gpus.wait_until_clean(timeout=60.0, stable_polls=2,
                                           on_poll=_recovery_on_first_poll(source, listener))
            assert listener.state == "running" and listener.reason is None  # nothing says it any more...
            # ...but the result does. Before, it read as if XIDs had been heard throughout the wait.
            [gap] = result.listening_gaps or ()
            assert (gap.cause, gap.indices) == ("recovering", (0,)) and gap.ended_ns is not None
            doc = wait_document(result)
            assert [(g["cause"], g["gpus"]) for g in doc["listening_gaps"]] == [("recovering", [0])]
        finally:
            listener.stop()


def test_a_wait_that_listened_throughout_says_so_and_one_that_did_not_listen_says_nothing(
    scenario_path: Path,
) -> None:
    Scenario.h200(1).write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        assert gpus.wait_until_clean(timeout=60.0).listening_gaps is None
        assert wait_document(gpus.wait_until_clean(timeout=60.0))["listening_gaps"] is None
        listener = _listening(gpus, ScriptedEvents())
        try:
            assert gpus.wait_until_clean(timeout=60.0).listening_gaps == ()
            assert gpus.wait_until_clean(timeout=60.0, events=False).listening_gaps is None
        finally:
            listener.stop()


def test_the_wait_command_prints_each_gap_on_stderr(capsys: pytest.CaptureFixture[str], scenario_path: Path) -> None:
    from nvmlcheck.cli._wait import _print_clean

    result = _wait_through_a_recovery(scenario_path)
    _print_clean(Namespace(json=False), result)
    out, err = capsys.readouterr()
    assert out.startswith("clean: 1 GPU")
    assert "nvmlcheck: events: events not listened to on GPU 0 for " in err and "recovering" in err


def test_ready_through_a_recovery_says_so_in_its_notes_and_document(scenario_path: Path) -> None:
    sc = Scenario.h200(1)
    sc.add_process(0, 4_000_001, used_bytes=4 << 30)
    sc.at_call(60).remove_process(0, 4_000_001)  # held for a few readings: ready waits, listening
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        source = ScriptedEvents()
        listener = _listening(gpus, source)
        try:
            report = ready_on(gpus, timeout=60.0,
                              options=WaitOptions(on_poll=_recovery_on_first_poll(source, listener)))
        finally:
            listener.stop()
    assert report.ready and report.polls > 2  # it waited (the first reading held), listening
    assert [g.cause for g in report.listening_gaps or ()] == ["recovering"]
    assert any(n.startswith("events: events not listened to on GPU 0") for n in report.notes)
    doc = ready_document(report, exit_code=0)
    assert [g["cause"] for g in doc["listening_gaps"]] == ["recovering"]


def test_kill_documents_and_lines_carry_the_wait_s_gaps(capsys: pytest.CaptureFixture[str],
                                                        scenario_path: Path) -> None:
    """A kill's wait (and ``--all-*``'s wait with nothing to signal) says its listening gaps as ``wait`` does: the
    ``nvmlcheck/kill`` document's ``listening_gaps`` and a line on stderr. Both said nothing of them before."""
    from types import SimpleNamespace

    from nvmlcheck.cli._kill import _print_result
    from nvmlcheck.jsonout import kill_document, nothing_to_kill_document
    from nvmlcheck.kill import KillResult

    result = _wait_through_a_recovery(scenario_path)
    doc = nothing_to_kill_document(result, signal_name="SIGTERM", tree=False, selection=None)
    assert [(g["cause"], g["gpus"]) for g in doc["listening_gaps"]] == [("recovering", [0])]
    killed = KillResult("SIGTERM", 0, (), result.clean_ns, result.confirmed_ns, result.interval_ns, result)
    plan: Any = SimpleNamespace(left_alone=(), vanished=(), aside=())
    assert [g["cause"] for g in kill_document(killed, plan, None)["listening_gaps"]] == ["recovering"]
    assert kill_document(replace(killed, wait=replace(result, listening_gaps=None)), plan,
                         None)["listening_gaps"] is None
    capsys.readouterr()
    _print_result(Namespace(json=True), killed, plan, None)
    assert "nvmlcheck: events: events not listened to on GPU 0 for " in capsys.readouterr().err
