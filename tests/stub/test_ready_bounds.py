"""``ready``'s own costs and bounds on the simulated GPU: how many readings a wait on a ready GPU takes, and the
device-file scan (processes on no GPU list) held to the wait's deadline.

Time is the injected StepClock throughout: a slow ``/proc`` read is a step of that clock, counted, never slept.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import holders, reclaim_model
from nvmlcheck._proc import devfiles
from nvmlcheck._proc.devfiles import simulated_globs, simulated_stand_ins
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30
#: A timeout (s) past the stuck bound of 8 GiB held with no holder (the 580 entry's: ~6.4 s). The
#: device-file scan past the bound reads the step clock once per process of this host: 5 s of it is 5000 processes (a
#: busy CI host), not a margin that the host's process count could use up.
PAST_BOUND_S = reclaim_model.model_for("580.159.04").stuck_after_ns(1, 8 * GIB) / 1e9 + 5.0


def counting(session: nc.Session) -> list[Any]:
    """Count the backend's readings of ``session`` (the fields of each)."""
    backend = session.backend
    real = backend.snapshot
    calls: list[Any] = []

    def snapshot(indices: Any, fields: Any, **kw: Any) -> Any:
        calls.append(fields)
        return real(indices, fields, **kw)

    backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
    return calls


@pytest.mark.parametrize("stable", [1, 2, 3])
def test_a_wait_on_a_ready_gpu_reads_what_stable_polls_asks_and_no_more(
    gpus: Callable[[Scenario], nc.Session], stable: int
) -> None:
    """``ready --timeout 5`` on an idle GPU made 3 polls and 4 readings (the first, two of the wait's own, whose run
    started over, and a health reading after it): the first reading is the run's first clean poll."""
    clock = StepClock(0.001)
    with gpus(Scenario.h200()) as session:
        readings = counting(session)
        report = session.ready(timeout=5.0, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                stable_polls=stable))
    assert report.ready and report.polls == stable
    assert len(readings) == stable and all(nc.Fields.HEALTH in f for f in readings)  # each confirmation: health too


def test_a_confirmation_that_is_not_ready_hands_over_to_the_wait(gpus: Callable[[Scenario], nc.Session]) -> None:
    """The first reading is ready, the next is not (a process came): the wait then judges, from a run of none."""
    sc = Scenario.h200()
    sc.at_call(12).add_process(0, 4_000_001, used_bytes=GIB)  # after the first reading (its calls) is done
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=0.5, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    assert not report.ready and report.polls > 2
    assert report.verdicts[0].culprits[0].pid == 4_000_001


def slow_proc(monkeypatch: pytest.MonkeyPatch, clock: StepClock, step_s: float) -> list[str]:
    """Each process's descriptors take ``step_s`` of ``clock`` to read (a host with many of them); the PIDs read.

    The session's own wait adds a scan to the message of a timeout, bounded on the real clock
    (``holders.EXPLAIN_BUDGET_S``), which ``ready`` does not print: it is left out here, so that only ``ready``'s
    scan is timed on the step clock."""
    monkeypatch.setattr(holders, "timeout_explanation", lambda snapshot: [])
    real = devfiles._fds
    read: list[str] = []

    def fds(pid: int | str, rule: Any, proc: str) -> dict[str, str] | None:
        read.append(str(pid))
        clock.sleep(step_s)
        return real(pid, rule, proc)

    monkeypatch.setattr(devfiles, "_fds", fds)
    return read


def test_the_device_file_scan_stops_at_the_deadline_and_says_unknown(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memory held with no process past the stuck bound: the scan for a holder on no list ran after the wait's
    deadline, unbounded (every process of the host, here 1 s each), and whatever it did not read was taken for "no
    holder": stuck. It now runs by the deadline, and a scan cut short is unknown, with the reason."""
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    clock = StepClock(0.001)
    read = slow_proc(monkeypatch, clock, 1.0)
    with gpus(sc) as session:
        report = session.ready(timeout=PAST_BOUND_S, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    (v,) = report.verdicts
    assert read  # the scan ran
    # at most one process read (1 s) past the deadline, and the few clock readings after it
    assert clock.now_ns <= (PAST_BOUND_S + 1.0 + 0.1) * 1e9
    assert v.class_ == "unknown" and not report.needs_operator
    (c,) = v.culprits
    assert c.kind == "memory" and "cut short by the deadline" in c.reason and c.used_bytes == 8 * GIB


def test_a_device_file_scan_that_fails_is_unknown_never_stuck(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/proc`` unreadable (a hardened mount): the scan's error was taken for "no holder", and the GPU stuck."""
    def scan(*args: Any, **kwargs: Any) -> devfiles.FdScan:
        raise PermissionError(13, "Permission denied", "/proc")

    monkeypatch.setattr(devfiles, "scan", scan)
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=PAST_BOUND_S, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    (v,) = report.verdicts
    assert v.class_ == "unknown" and "scan failed" in v.culprits[0].reason and "Permission denied" in v.line()


def test_a_complete_scan_that_finds_no_holder_is_stuck_and_runs_within_the_wait(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan that can finish (10 ms a process here) still calls the memory stuck, and finishes before the
    deadline: it runs in the wait, on the first poll past the bound, not after the timeout."""
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    clock = StepClock(0.001)
    read = slow_proc(monkeypatch, clock, 0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=PAST_BOUND_S, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    (v,) = report.verdicts
    assert read and v.class_ == "stuck" and report.needs_operator
    assert clock.now_ns <= (PAST_BOUND_S + 0.1) * 1e9


def test_a_clean_reading_the_deadline_left_unconfirmed_is_never_ready(gpus: Callable[[Scenario], nc.Session]) -> None:
    """The holder leaves during the wait, but the deadline comes before the run of clean polls ``stable_polls``
    asks for. The wait timed out, and ``ready`` judged its last reading alone: ready (exit 0), on the health read
    at the start, so a remap that became pending while waiting went unseen."""
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    sc.at_call(40).remove_process(0, 4_000_001)
    sc.at_call(60).set_device(0, remapped_rows=(0, 1, True, False))  # no XID says so (events off)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=0.5, events=False, options=WaitOptions(
            clock=clock.clock, sleep=clock.sleep, policy=0.02, stable_polls=1000))  # more than fit before it
    assert not report.ready and report.polls > 2
    (v,) = report.verdicts
    assert v.class_ == "unknown" and v.culprits[0].kind == "unconfirmed" and "not confirmed" in v.line()


def mig_gpu(*instances_gib: int) -> Scenario:
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    for n, gib in enumerate(instances_gib):
        sc.add_mig_device(0, n, total_bytes=gib * GIB)
    return sc


def test_a_gpu_in_mig_mode_with_no_instance_is_never_ready(gpus: Callable[[Scenario], nc.Session]) -> None:
    """MIG mode on, no instance created: no CUDA process can run on it (CUDA sees only MIG devices there); it was
    ``ready`` on its idle parent's figures. Waiting cannot create one: the wait ends at once."""
    clock = StepClock(0.001)
    with gpus(mig_gpu()) as session:
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep))
    (v,) = report.verdicts
    assert not report.ready and report.polls == 1 and v.class_ == "short" and v.beyond_capacity
    assert "no MIG instance" in v.line()


@pytest.mark.parametrize(
    ("need", "fraction", "cls"),
    [
        (100 * GIB, None, "short"),  # the GPU has 139.8 GiB free, but no instance more than 70 GiB
        (None, 0.9, "ready"),  # 90% of an instance's total: what vLLM asks of the device it sees
        (60 * GIB, None, "ready"),
        (70 * GIB - (5 << 20), None, "short"),  # 10 MiB used in each (clean): short now, not beyond capacity
    ],
)
def test_a_need_on_a_whole_mig_gpu_is_judged_per_instance(
    gpus: Callable[[Scenario], nc.Session], need: int | None, fraction: float | None, cls: str
) -> None:
    """A CUDA process runs in one MIG instance: ``--need 100GiB`` on a GPU split 70 + 70 GiB was ready, judged
    against the whole GPU's free memory."""
    sc = mig_gpu()
    sc.set_device(0, mig=True)
    for n in (0, 1):
        sc.add_mig_device(0, n, total_bytes=70 * GIB, used_bytes=10 << 20)
    with gpus(sc) as session:
        (v,) = session.ready(need_bytes=need, need_fraction=fraction).verdicts
    assert v.class_ == cls
    if need == 100 * GIB:
        assert v.beyond_capacity and "in one MIG instance" in v.line() and "at most 70.0 GiB" in v.line()
    if cls == "short" and need != 100 * GIB:
        assert not v.beyond_capacity and "no MIG instance has" in v.line()


def test_a_health_reading_that_fails_as_a_whole_is_judged_unknown_not_raised(
    gpus: Callable[[Scenario], nc.Session]
) -> None:
    """The health read again after a wait that ended ready fails as a whole (as an nvidia-smi run that fails does):
    the call raised, losing every verdict; the GPU is now unknown, with the reason."""
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    sc.at_call(40).remove_process(0, 4_000_001)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        real = session.backend.snapshot

        def snapshot(indices: Any, fields: Any, **kw: Any) -> Any:
            if fields == nc.Fields.HEALTH:
                raise nc.NvmlCheckError("nvidia-smi exited with status 15")
            return real(indices, fields, **kw)

        session.backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
        report = session.ready(timeout=5.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    (v,) = report.verdicts
    assert not report.ready and v.class_ == "unknown"
    assert "could not be read again" in v.line() and "status 15" in v.line()


def test_a_listed_holder_past_a_second_is_not_judged_on_every_poll(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan's trigger judges a poll only when memory is held with nothing listed (the one case the scan
    serves): a listed PID not visible here (a teardown under way, or another namespace) costs no judgement per poll."""
    from nvmlcheck import readiness

    real = readiness.classify  # type: ignore[attr-defined]
    calls: list[int] = []

    def classify(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(readiness, "classify", classify)
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)  # listed, not visible from here
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=3.0, events=False, options=WaitOptions(clock=clock.clock, sleep=clock.sleep,
                                                                              policy=0.02))
    assert not report.ready and report.polls > 50
    assert len(calls) <= 3  # the first reading's verdict and the last's


def test_a_process_with_only_the_control_device_open_holds_no_gpu(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path
) -> None:
    """Memory held with nothing listed, past the bound; the only process on no list has ``nvidiactl`` open (as a
    monitoring tool or a process between CUDA calls may), no ``/dev/nvidiaN``: it holds no GPU's memory. It was named
    the holder (``held``, kill it), hiding the stuck GPU; ``kill --all-holders`` already refuses such a process."""
    (tmp_path / "dev").mkdir(exist_ok=True)
    ctl = tmp_path / "dev" / "nvidiactl"
    ctl.write_text("")
    child = subprocess.Popen([sys.executable, "-S", "-c", "import sys, time; f = open(sys.argv[1]); "
                              "print('ready', flush=True); time.sleep(60)", str(ctl)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        sc = Scenario.h200()
        sc.set_device(0, used_bytes=8 * GIB)
        clock = StepClock(0.001)
        stand_ins = simulated_stand_ins(simulated_globs(tmp_path / "scenario.txt"), "this test's simulation")
        with stand_ins, gpus(sc) as session:
            (v,) = session.ready(timeout=PAST_BOUND_S, events=False, options=WaitOptions(
                clock=clock.clock, sleep=clock.sleep, policy=0.02)).verdicts
    finally:
        child.kill()
        child.wait()
    assert v.class_ == "stuck" and not any(c.pid == child.pid for c in v.culprits)


def test_a_holders_text_reaches_the_terminal_without_its_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process name or container label is anyone's text (a program's file name, a cgroup's name): ``ready``
    printed it raw, so ``\\x1b[2J`` cleared the operator's screen; ``wait`` and ``holders`` escape it. JSON keeps it
    exact."""
    from nvmlcheck import cli, verdict

    monkeypatch.setattr(verdict, "_container", lambda pid: "pod \x1b[2Jevil")
    sleeper = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    try:
        sc = Scenario.h200()
        sc.add_process(0, sleeper.pid, used_bytes=GIB, bound=True)
        path = str(sc.write(tmp_path / "s.txt"))
        assert cli.main(["--simulate", path, "ready"]) == 1
        out = capsys.readouterr().out
        assert "\x1b" not in out and "pod \\x1b[2Jevil" in out
        assert cli.main(["--simulate", path, "--json", "ready"]) == 1
        assert "\x1b[2Jevil" in json.loads(capsys.readouterr().out)["holders"][0]["container"]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_scan_that_could_not_read_every_process_is_unknown_never_stuck(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without root, other users' descriptors cannot be read: one of those processes may hold the memory. The scan
    skipped them and said "no holder" (stuck: reset the GPU); it is unknown, saying to run as root."""
    real = devfiles._fds

    def fds(pid: int | str, rule: Any, proc: str) -> dict[str, str] | None:
        return None if str(pid) == "1" else real(pid, rule, proc)  # PID 1's: not permitted

    monkeypatch.setattr(devfiles, "_fds", fds)
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=PAST_BOUND_S, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    (v,) = report.verdicts
    assert v.class_ == "unknown" and "could not be read (not permitted)" in v.line() and "run as root" in v.line()


def test_the_command_on_a_ready_gpu_with_a_timeout_takes_two_polls(capsys: pytest.CaptureFixture[str]) -> None:
    """``nvmlcheck ready --timeout 5`` on an idle GPU said "3 polls": the default --stable-polls 2 needs two."""
    from nvmlcheck import cli

    assert cli.main(["--simulate", "h200", "--json", "ready", "--timeout", "5"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ready"] is True and doc["polls"] == 2
