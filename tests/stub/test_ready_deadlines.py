"""``ready`` held to its deadline in every step, and what it says when the deadline cuts one: the selection's
resolution (a UUID, ``cuda:N``), a transient error while waiting, nvidia-smi's run bound.

Time is the injected StepClock: a slow call is a step of that clock, never a sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30


def hung_identity(session: nc.Session, clock: StepClock) -> list[Any]:
    """Every reading of the GPUs' identities alone (what resolving a UUID or ``cuda:N`` reads) hangs, as an
    nvidia-smi run on a wedged GPU does: 30 s of ``clock``, or until the deadline it is handed, where the backend
    stops it (as the nvidia-smi runner kills a run at the deadline). The deadlines handed."""
    real = session.backend.snapshot
    handed: list[Any] = []

    def snapshot(indices: Any, fields: Any, **kw: Any) -> Any:
        if fields == nc.Fields(0):
            deadline = kw.get("deadline")
            handed.append(deadline)
            if deadline is None:
                clock.sleep(30.0)
            else:
                clock.sleep(max(0.0, (deadline.at_ns - clock.now_ns) / 1e9))
                deadline.check()
        return real(indices, fields, **kw)

    session.backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
    return handed


@pytest.mark.parametrize("selector", ["cuda:1", "uuid"])
def test_a_selection_still_being_resolved_at_the_deadline_is_unknown_never_overrun(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch, selector: str
) -> None:
    """``ready(["cuda:1"], timeout=0.5)``: reading which GPU the selector names was not bounded by the deadline
    (the library's path: the command line's watchdog is not installed there), so a slow or hung reading overran
    it by all it took. It is now read by the deadline; cut, every GPU is unknown, saying why: never ready."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    clock = StepClock(0.001)
    with gpus(Scenario.h200(devices=4)) as session:
        uuid = session.devices()[1].uuid
        assert uuid is not None
        real_snapshot = session.backend.snapshot
        handed = hung_identity(session, clock)
        report = session.ready([uuid if selector == "uuid" else selector], timeout=0.5, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep))
        # The reading got the deadline and stopped there; nothing was read after it.
        assert handed and all(d is not None for d in handed)
        assert clock.now_ns <= (0.5 + 0.05) * 1e9 and report.polls == 0
        assert not report.ready and [v.class_ for v in report.verdicts] == ["unknown"] * 4
        reason = report.verdicts[0].culprits[0].reason
        assert "still being read" in reason and "which GPUs it names is unknown" in reason
        assert (uuid if selector == "uuid" else "cuda:1") in reason
        # One check (timeout 0) always completes, as a wait's does.
        session.backend.snapshot = real_snapshot  # type: ignore[method-assign]
        report = session.ready([uuid if selector == "uuid" else selector], timeout=0,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep))
        assert report.ready and [v.index for v in report.verdicts] == [1]


def held_then_gone() -> Scenario:
    """A GPU held until its 40th NVML call (a wait's few polls), clean after."""
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    sc.at_call(40).remove_process(0, 4_000_001)
    return sc


def test_a_transient_health_error_while_waiting_is_asked_again_not_unknown_at_once(
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    """``ready --timeout 5``: the wait ended clean, and the health read before saying so got NVML_ERROR_UNKNOWN
    once (a transient error: the poller retries it). The call ended there as unknown at 0.2 s of its 5; the health
    is now asked again (after more clean polls) until the deadline, and the GPU is ready."""
    sc = held_then_gone()
    sc.fault("nvmlDeviceGetRemappedRows", 999, after=1, count=1)  # the first reading's passes; the next fails once
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    assert report.ready, report.verdicts
    assert clock.now_ns < 1e9  # asked again at once (one poll interval), not at the deadline


def test_a_transient_health_error_that_lasts_is_unknown_at_the_deadline_with_its_reason(
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    sc = held_then_gone()
    sc.fault("nvmlDeviceGetRemappedRows", 999, after=1)  # every health reading after the first fails
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    (v,) = report.verdicts
    assert v.class_ == "unknown" and "NVML_ERROR_UNKNOWN" in v.line()
    # Until the deadline, never past it by more than one poll (a 20 ms interval, a reading of a few clock steps).
    assert 4.9e9 <= clock.now_ns <= 5.1e9


def test_a_lasting_health_error_ends_the_wait_at_once(gpus: Callable[[Scenario], nc.Session]) -> None:
    """No permission to read the remapped rows: asking again cannot help, so the call does not wait for it."""
    sc = held_then_gone()
    sc.fault("nvmlDeviceGetRemappedRows", 4, after=1)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    (v,) = report.verdicts
    assert v.class_ == "unknown" and "NVML_ERROR_NO_PERMISSION" in v.line() and clock.now_ns < 1e9


def test_a_transient_failure_of_the_whole_health_reading_is_asked_again(
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    """The health reading after the wait fails as a whole, once, with a transient error (an nvidia-smi run that
    failed): asked again, not unknown at once."""
    clock = StepClock(0.001)
    with gpus(held_then_gone()) as session:
        real = session.backend.snapshot
        failed: list[int] = []

        def snapshot(indices: Any, fields: Any, **kw: Any) -> Any:
            if fields == nc.Fields.HEALTH and not failed:
                failed.append(1)
                raise nc.SmiError(["nvidia-smi"], 15, "", "nvidia-smi exited with status 15")
            return real(indices, fields, **kw)

        session.backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    assert failed and report.ready, report.verdicts


@pytest.mark.parametrize(("code", "waits"), [(999, True), (4, False)])
def test_the_smi_backend_asks_a_transient_health_error_again_too(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, code: int, waits: bool
) -> None:
    """``[Unknown Error]`` for the remapped rows (nvidia-smi's NVML_ERROR_UNKNOWN) is asked again until the
    deadline; ``[Insufficient Permissions]`` ends the call at once. Both unknown, never ready."""
    import sys

    from nvmlcheck.testing import stub_source_dir

    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetRemappedRows", code, device=0)
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "s.txt")))
    clock = StepClock(0.001)
    with nc.open("smi", smi_command=[sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py")]) as session:
        report = session.ready(timeout=0.3, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    (v,) = report.verdicts
    assert v.class_ == "unknown" and "remapped_rows" in v.line()
    # Counted in polls on the step clock: the first reading and the wait's two stable polls, then (transient) the
    # health asked again after more waits until the deadline; (lasting) none more.
    assert (report.polls > 3) is waits and report.polls >= 3, report.polls


def test_a_one_shot_through_a_slow_smi_prefix_completes(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``ready --smi-prefix "ssh gpu01"`` (``--timeout 0``, the default): every nvidia-smi run was cut at 1 s, so
    a transport that takes a second to connect failed the one-shot ("nvidia-smi did not answer within 1 s", exit
    3). A run behind a prefix gets nvidia-smi's own bound (10 s): the one check completes, as a one-shot does."""
    from nvmlcheck import cli

    slow = tmp_path / "slow-transport"
    slow.write_text('#!/bin/sh\nsleep 1.1\nexec "$@"\n')  # a connection that takes more than the old 1 s bound
    slow.chmod(0o755)
    code = cli.main(["--simulate", "h200", "--backend", "smi", "--smi-prefix", str(slow), "ready"])
    out, err = capsys.readouterr()
    assert code == 0 and "GPU 0: ready" in out, err


def failing_readings(session: nc.Session, fail: Callable[[int], BaseException | None]) -> list[int]:
    """The backend's ``n``-th reading (from 1) raises ``fail(n)`` when that is not ``None``; the readings made."""
    real = session.backend.snapshot
    made: list[int] = []

    def snapshot(indices: Any, fields: Any, **kw: Any) -> Any:
        made.append(len(made) + 1)
        error = fail(len(made))
        if error is not None:
            raise error
        return real(indices, fields, **kw)

    session.backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
    return made


def smi_failed() -> nc.SmiError:
    return nc.SmiError(["nvidia-smi"], 15, "", "nvidia-smi exited with status 15")


@pytest.mark.parametrize("failing", [1, 2])  # the first reading; the reading that confirms it
def test_a_transient_failure_of_readys_own_reading_is_asked_again(gpus: Callable[[Scenario], nc.Session],
                                                                   failing: int) -> None:
    """``ready --timeout 5`` on an idle GPU whose first (or confirming) reading failed as a whole with a transient
    error (an nvidia-smi run that failed once): the error ended the call (exit 3), where the wait's poller asks
    again after the same error."""
    clock = StepClock(0.001)
    with gpus(Scenario.h200()) as session:
        failing_readings(session, lambda n: smi_failed() if n == failing else None)
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    assert report.ready, report.verdicts


def test_a_first_reading_that_keeps_failing_is_unknown_at_the_deadline(gpus: Callable[[Scenario], nc.Session]) -> None:
    clock = StepClock(0.001)
    with gpus(Scenario.h200()) as session:
        failing_readings(session, lambda n: smi_failed())
        report = session.ready(timeout=2.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
        (v,) = report.verdicts
        assert v.class_ == "unknown" and "status 15" in v.line() and "within the timeout (2 s)" in v.line()
        assert clock.now_ns <= 2.05e9
        # One check (timeout 0) is the call's one reading: its error is the call's, as before.
        with pytest.raises(nc.SmiError):
            session.ready(timeout=0)


def test_a_lasting_failure_of_the_first_reading_is_raised_at_once(gpus: Callable[[Scenario], nc.Session]) -> None:
    """An error that asking again cannot mend (nvidia-smi's parser does not know the output) is not waited on."""
    clock = StepClock(0.001)
    with gpus(Scenario.h200()) as session:
        made = failing_readings(session, lambda n: nc.SmiParseError("unexpected header", 1, "GPU,Mem"))
        with pytest.raises(nc.SmiParseError):
            session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep))
    assert made == [1]
