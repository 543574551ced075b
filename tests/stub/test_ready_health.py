"""``ready``'s health verdicts: each cause's action and what the line tells the operator to do."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub


@pytest.mark.parametrize("code", [99, 4294967295])
def test_an_unknown_recovery_action_claims_nothing_it_does_not_know(gpus: Callable[[Scenario], nc.Session],
                                                                    code: int) -> None:
    """A recovery action code newer than this version (a driver's new action) asks for the strongest action,
    CONTACT_SUPPORT, but its hint said "service the GPU (RMA): a reset does not help": nothing is known of it, and
    the action it names may well be a reset."""
    sc = Scenario.h200()
    sc.set_device(0, recovery_action=code)
    with gpus(sc) as session:
        (v,) = session.ready().verdicts
    assert v.class_ == "unhealthy" and v.actions == ("CONTACT_SUPPORT",)
    line = v.line()
    assert f"ACTION_{code} ({code})" in line and "does not know" in line and "nvidia-smi -q -i 0" in line
    assert "a reset does not help" not in line


def test_a_known_recovery_action_keeps_its_hint(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, recovery_action=1)
    with gpus(sc) as session:
        (v,) = session.ready().verdicts
    assert v.actions == ("RESET_GPU",) and "nvidia-smi -r -i 0" in v.line()


def test_an_event_whose_health_reading_failed_is_read_again(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """XID 63 on a held GPU (a row marked for remapping), and the health read it prompts fails once
    (NVML_ERROR_UNKNOWN): the event was forgotten, so the wait ran to its timeout and called the GPU held (exit 1:
    "wait"), where it needs a reset (exit 5). The reading is now made again after the next poll."""
    from nvmlcheck import cli

    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 << 30)  # never ready: only the health can end the wait early
    step = sc.at_ms(50)
    step.set_device(0, remapped_rows=(0, 1, True, False))
    step.raise_event(0, "xid", xid=63)
    sc.fault("nvmlDeviceGetRemappedRows", 999, after=1, count=1)  # the first reading's passes, the next fails
    # Only the health can end the wait before its timeout, so a long one costs nothing: 3 s was a wall-clock bound
    # on a loaded CI host (the event comes 50 ms after the stub loads, then a failed and a second health reading).
    code = cli.main(["--simulate", str(sc.write(tmp_path / "s.txt")), "--json", "ready", "--timeout", "120"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 5 and doc["gpus"][0]["class"] == "unhealthy", doc["gpus"][0]["line"]


@pytest.mark.parametrize(("used", "need", "shown"), [
    (0, 150_110_797_824, "150,110,797,824 B needed can never be free on this GPU: at most 150,109,880,320 B"),
    (8 << 20, 150_109_000_000, "clean, but 150,101,491,712 B free, 150,109,000,000 B needed"),
    (0, 140 << 30, "140.0 GiB needed can never be free on this GPU: at most 139.8 GiB"),  # apart: rounded
])
def test_a_need_close_to_the_free_memory_is_said_in_bytes(gpus: Callable[[Scenario], nc.Session], used: int,
                                                          need: int, shown: str) -> None:
    """"139.8 GiB needed can never be free on this GPU: at most 139.8 GiB": both figures rounded alike, the
    refusal told nothing. Where the rounded figures would look the same, both are given in bytes."""
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=used)
    with gpus(sc) as session:
        (v,) = session.ready(need_bytes=need).verdicts
    assert v.class_ == "short" and shown in v.line(), v.line()


@pytest.mark.parametrize("backend", ["nvml", "smi"])
def test_a_driver_without_the_recovery_action_is_noted_not_refused(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A driver before the recovery action's field (565): NVML answers INVALID_ARGUMENT for the field's id, and
    nvidia-smi does not know ``gpu_recovery_action``. Both read as a failed reading, so every GPU of such a host was
    "unknown: health unknown is never ready" for good (ready.md: a value the driver does not have is not a refusal).
    Now noted, not judged."""
    from nvmlcheck import cli

    sc = Scenario.h200()
    if backend == "nvml":
        sc.fault("nvmlDeviceGetFieldValues", 2)
    else:
        monkeypatch.setenv("FAKE_SMI_REFUSE_FIELDS", "gpu_recovery_action")
    code = cli.main(["--simulate", str(sc.write(tmp_path / "s.txt")), "--backend", backend, "--json", "ready"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["ready"], doc["gpus"][0]["line"]
    assert any(n.startswith("health.recovery_action not judged on GPU 0") for n in doc["notes"]), doc["notes"]


def test_a_recovery_action_that_could_not_be_read_is_still_unknown(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetFieldValues", 999)  # a failed read, not a missing field
    with gpus(sc) as session:
        (v,) = session.ready().verdicts
    assert v.class_ == "unknown" and "health.recovery_action could not be read" in v.line()


def test_a_held_gpu_whose_first_health_reading_failed_is_held_at_the_timeout(
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    """The first reading's remapped rows failed once (NVML_ERROR_UNKNOWN) on a GPU a process holds throughout: at
    the timeout the GPU was judged on that first health and called "unknown: health.remapped_rows could not be
    read" (unknown outranks held), hiding the holder to stop. The health is read again while waiting until a
    reading succeeds, and the verdict is held, naming the process."""
    from nvmlcheck.testing import StepClock
    from nvmlcheck.wait import WaitOptions

    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 << 30)
    sc.fault("nvmlDeviceGetRemappedRows", 999, count=1)  # the first reading's
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=0.5, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    (v,) = report.verdicts
    assert v.class_ in ("held", "reclaiming") and v.culprits[0].pid == 4_000_001, v.line()
    assert "could not be read" not in v.line()


def test_a_need_close_to_a_mig_instances_free_memory_is_said_in_bytes(gpus: Callable[[Scenario], nc.Session]) -> None:
    """The same on a GPU in MIG mode, judged per instance: "no MIG instance has 70.0 GiB free: the most is 70.0
    GiB" said nothing."""
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    for n in (0, 1):
        sc.add_mig_device(0, n, total_bytes=70 << 30, used_bytes=10 << 20)
    with gpus(sc) as session:
        (v,) = session.ready(need_bytes=(70 << 30) - (5 << 20)).verdicts
    assert v.class_ == "short" and "no MIG instance has 75,156,684,800 B free" in v.line(), v.line()
    assert "the most is 75,151,441,920 B" in v.line()


def test_a_cause_found_by_a_confirming_reading_ends_the_call_at_once(gpus: Callable[[Scenario], nc.Session]) -> None:
    """The first reading is ready; the confirming one (read with health) finds a row remap pending and a process that
    came meanwhile (no event heard: events off). The confirmation handed over to the wait, forgetting the cause: the
    wait timed out on the held GPU and judged it on the first reading's health, "held" (exit 1), where a reset is
    needed (exit 5). A cause found then ends the call as one found by the first reading does."""
    from nvmlcheck.cli._ready import exit_code_of
    from nvmlcheck.testing import StepClock, StubProbe, build_stub
    from nvmlcheck.wait import WaitOptions

    probe = StubProbe(build_stub())
    before = probe.call_count()
    with gpus(Scenario.h200()) as session:  # how many calls the opening and the first reading make
        session.ready()
    first = probe.call_count() - before
    sc = Scenario.h200()
    step = sc.at_call(first + 3)  # within the confirming reading (a dozen calls), after the first
    step.set_device(0, remapped_rows=(0, 1, True, False))
    step.add_process(0, 4_000_001, used_bytes=1 << 30)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    (v,) = report.verdicts
    assert v.class_ == "unhealthy" and "RESET_GPU" in v.actions and exit_code_of(report) == 5
    assert report.polls == 2 and clock.now_ns < 1_000_000_000  # the two readings, not a wait to the deadline


def test_a_recovery_value_that_cannot_be_trusted_is_unknown_never_ready(
        gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """Round 6: the field answered, but with a value that cannot be trusted (a double, or beyond 32 bits): unknown with
    the reason the call gave, never ``NONE`` (the masked or misread value) and never "not supported"."""
    from nvmlcheck._nvml import calls

    why = "unreadable: the field answered a value of type 0, not an integer type"
    monkeypatch.setattr(calls, "recovery_action_of", lambda value: why)
    with gpus(Scenario.h200()) as session:
        d = session.snapshot(fields=nc.Fields.HEALTH).devices[0]
        (v,) = session.ready().verdicts
    assert d.health is not None and d.health.recovery_action is None
    assert d.why_unknown("health.recovery_action") == why
    assert v.class_ == "unknown"
