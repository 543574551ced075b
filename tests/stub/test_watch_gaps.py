"""``watch`` says when the listener stops listening (recovering, stalled, a GPU dropped) and when it listens again.

The GPUs are the stub's; the session's listener is one over a scripted event source whose first wait call fails
(a transient error: a recovery on a new set, every GPU kept), so that the recovery happens once watch listens. The
watch is ended by an interrupt (exit 130) sent once it has said the end of the gap: driven by what it printed, never
by a duration.
"""

from __future__ import annotations

import _thread
import json
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.cli import _watch
from nvmlcheck.errors import GpuLost, Unknown
from nvmlcheck.events import EventListener, EventTarget, ListeningGap
from nvmlcheck.testing import Scenario

from .conftest import ScriptedEvents

pytestmark = pytest.mark.stub


class _FailsOnce(ScriptedEvents):
    """Event calls that deliver nothing; the first wait raises a transient error (NVML_ERROR_UNKNOWN)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = Unknown(999, "nvmlEventSetWait_v2")


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[EventListener]]:
    """The session's listen() gives a listener over :class:`_FailsOnce` for GPUs 0 and 1; watch is interrupted once
    it said a gap ended."""
    made: list[EventListener] = []

    def listen(self: nc.Session) -> EventListener:
        source = sys.modules[__name__]._FailsOnce()  # read when called: a test may put another source class there
        listener = EventListener(source, [EventTarget(i, object(), f"GPU-{i}") for i in (0, 1)], id).start()
        self._listener = listener
        made.append(listener)
        return listener

    monkeypatch.setattr(nc.Session, "listen", listen)
    write = _watch._Gaps._write

    def write_then_stop(self: _watch._Gaps, gap: ListeningGap, *, ended: bool) -> None:
        write(self, gap, ended=ended)
        if ended and sys.modules[__name__]._STOP_ON_END:
            _thread.interrupt_main()  # Ctrl-C: the watch ends (130) once it said the end

    monkeypatch.setattr(_watch._Gaps, "_write", write_then_stop)
    # interrupt_main() does nothing where SIGINT is not Python's own handler (SIG_IGN or SIG_DFL: a CI runner or an
    # earlier test may leave either): the watch then ran for ever, the net below too. Python's handler for the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # A watch that never says the end would run for ever: interrupted after 60 s all the same, and the test fails
    # on what it printed (a net, not a timing: nothing asserts how long it took).
    net = threading.Timer(60.0, _thread.interrupt_main)
    net.daemon = True
    net.start()
    try:
        yield made
    finally:
        net.cancel()
        signal.signal(signal.SIGINT, previous)


def test_watch_says_when_it_stops_listening_and_when_it_listens_again(
    scenario_path: Path, capsys: pytest.CaptureFixture[str], scripted: list[EventListener]
) -> None:
    from nvmlcheck import cli

    Scenario.h200(2).write(scenario_path)
    code = cli.main(["--simulate", str(scenario_path), "watch"])
    out, err = capsys.readouterr()
    assert code == 130, err
    assert out == ""  # stdout is the events alone
    # Before, nothing at all: an operator read the silence as a quiet GPU while no XID could be heard.
    lines = [line for line in err.splitlines() if "listening" in line.lower() and "watch: 20" in line]
    assert len(lines) == 2, err
    assert "NOT listening to GPUs 0, 1 (recovering): nvmlEventSetWait_v2 failed" in lines[0]
    assert "an XID meanwhile is not heard" in lines[0]
    assert "listening again to GPUs 0, 1 after " in lines[1] and lines[1].endswith("not listening (recovering)")


def test_watch_json_says_it_as_listening_documents(
    scenario_path: Path, capsys: pytest.CaptureFixture[str], scripted: list[EventListener]
) -> None:
    from nvmlcheck import cli

    Scenario.h200(2).write(scenario_path)
    code = cli.main(["--simulate", str(scenario_path), "--json", "watch", "--devices", "1"])
    out, _err = capsys.readouterr()
    assert code == 130
    docs = [json.loads(line) for line in out.splitlines()]
    gaps = [d for d in docs if d["schema"] == "nvmlcheck/listening"]
    assert [(d["version"], d["listening"], d["cause"], d["gpus"]) for d in gaps] == [
        (1, False, "recovering", [1]), (1, True, "recovering", [1])]  # GPU 1 alone: the one selected
    began, ended = gaps
    assert began["ended_ns"] is None and began["time_ns"] == began["began_ns"]
    assert ended["ended_ns"] is not None and ended["time_ns"] == ended["ended_ns"] and ended["lasted_s"] >= 0
    assert began["seq"] == ended["seq"] and "nvmlEventSetWait_v2" in began["why"]
    assert docs[-1]["schema"] == "nvmlcheck/error"  # the interrupt's document ends the stream, as before


_STOP_ON_END = True  # the fixture interrupts watch once it said a gap ended (a test that ends otherwise: False)
_LOOKING = threading.Event()  # set once watch's loop looks at the listener's gaps


class _LosesGpu1(_FailsOnce):
    """Once watch's loop runs, a wait fails as for a GPU fallen off the bus, and GPU 1 answers GPU_IS_LOST from then
    on (after watch's checks at the start, which would otherwise see GPU 1 gone already: the other valid order)."""

    failed = False

    def wait(self, event_set: object, timeout_ms: int) -> None:
        if not self.failed and _LOOKING.is_set():
            self.failed = True
            raise GpuLost(15, "nvmlEventSetWait_v2", None)
        self._idle.wait(timeout_ms / 1000)

    def supported(self, handle: object, index: int) -> int:
        if self.failed and index == 1:
            raise GpuLost(15, "nvmlDeviceGetSupportedEventTypes", 1)
        return 0xF


def test_watch_of_a_gpu_the_listener_drops_ends_with_exit_3(
    scenario_path: Path, capsys: pytest.CaptureFixture[str], scripted: list[EventListener],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nvmlcheck import cli

    monkeypatch.setattr(sys.modules[__name__], "_FailsOnce", _LosesGpu1)  # the fixture's listen() makes this one
    monkeypatch.setattr(sys.modules[__name__], "_STOP_ON_END", False)  # it ends by itself (or by the net: 130)
    say = _watch._Gaps.say

    def looking(self: _watch._Gaps, gaps: tuple[ListeningGap, ...]) -> None:
        _LOOKING.set()
        say(self, gaps)

    _LOOKING.clear()
    monkeypatch.setattr(_watch._Gaps, "say", looking)
    Scenario.h200(2).write(scenario_path)
    code = cli.main(["--simulate", str(scenario_path), "--json", "watch", "--devices", "1"])
    out, err = capsys.readouterr()
    # Before, it went on for ever (here: until the test's net interrupted it, 130), listening to GPU 0 alone.
    assert code == 3, err
    docs = [json.loads(line) for line in out.splitlines()]
    gaps = [(d["listening"], d["cause"], d["gpus"]) for d in docs if d["schema"] == "nvmlcheck/listening"]
    assert (False, "dropped", [1]) in gaps
    assert docs[-1]["schema"] == "nvmlcheck/error" and docs[-1]["exit_code"] == 3
    assert "no selected GPU is listened to any more (GPU 1: no longer listened to" in docs[-1]["error"]["message"]
    # GPU 0 was still listened to: watch ended for want of GPU 1 alone (the listener is stopped by now).
    assert set(scripted[0].device_reasons) == {1}


def test_a_gap_that_opened_and_ended_between_two_looks_is_said_both_ways(capsys: pytest.CaptureFixture[str]) -> None:
    from argparse import Namespace

    said = _watch._Gaps(Namespace(json=False), {})
    gap = ListeningGap(7, "stalled", (0,), 0, 2_000_000_000, "nvmlEventSetWait_v2 did not return for 2.0 s")
    said.say((gap,))
    said.say((gap,))  # seen again: said once
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "NOT listening to GPU 0 (stalled)" in err[0]
    assert "listening again to GPU 0 after 2.0 s not listening (stalled)" in err[1]
