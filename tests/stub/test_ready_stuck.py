"""A wait on a ``stuck`` GPU ends at the stuck bound (exit 5), not at the deadline: the verdict says waiting will not
help (docs/ready.md, the decision table), so the wait does not wait.

Time is the injected StepClock: the bound and the deadline are steps of that clock, never slept; the assertions count
the clock's time, never the machine's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import cli, reclaim_model, verdict
from nvmlcheck.cli._ready import exit_code_of
from nvmlcheck.session import Session
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30
MODEL = reclaim_model.model_for("580.159.04")
#: A timeout far past any stuck bound here (the 580 entry's for 8 GiB held by one context: ~6.5 s).
LONG_S = 60.0


def steps(clock: StepClock) -> WaitOptions:
    return WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02)


def ended_near_the_bound(clock: StepClock, bound_ns: int) -> bool:
    """The wait ended past the stuck bound and far from the 60 s deadline: within 10 s of the clock past the bound
    (a few polls, and the device-file scan, which reads the clock once per process of this host: a busy CI host's
    thousands of processes are seconds of this clock, none of them slept)."""
    return bound_ns < clock.now_ns < bound_ns + 10_000_000_000


@pytest.fixture
def zombie() -> Iterator[int]:
    """A child that has exited and is not reaped (a zombie of this process) until the test ends."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # it has exited; WNOWAIT leaves it unreaped
    yield proc.pid
    proc.wait()


def test_memory_held_with_no_holder_ends_the_wait_at_the_stuck_bound(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=LONG_S, events=False, options=steps(clock))
    (v,) = report.verdicts
    assert v.class_ == "stuck" and report.needs_operator and exit_code_of(report) == 5
    assert v.culprits[0].action == "RESET_GPU" and v.stuck_after_ns == MODEL.stuck_after_ns(1, 8 * GIB)
    assert ended_near_the_bound(clock, MODEL.stuck_after_ns(1, 8 * GIB))


def test_a_zombie_still_holding_memory_ends_the_wait_at_the_bound_reap_zombie(
    gpus: Callable[[Scenario], nc.Session], zombie: int
) -> None:
    sc = Scenario.h200()
    sc.add_process(0, zombie, used_bytes=4 * GIB)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=LONG_S, events=False, options=steps(clock))
    (v,) = report.verdicts
    assert v.class_ == "stuck" and exit_code_of(report) == 5
    (c,) = v.culprits
    assert (c.pid, c.action, c.state) == (zombie, "REAP_ZOMBIE", "zombie")
    assert ended_near_the_bound(clock, MODEL.stuck_after_ns(1, 4 * GIB))


def test_a_holder_in_d_state_ends_the_wait_at_the_bound_node_reboot(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = verdict._proc_state
    monkeypatch.setattr(verdict, "_proc_state", lambda pid: "D" if pid == 4_000_020 else real(pid))
    sc = Scenario.h200()
    sc.add_process(0, 4_000_020, used_bytes=2 * GIB)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=LONG_S, events=False, options=steps(clock))
    (v,) = report.verdicts
    assert v.class_ == "stuck" and v.culprits[0].action == "NODE_REBOOT" and exit_code_of(report) == 5
    assert ended_near_the_bound(clock, MODEL.stuck_after_ns(1, 2 * GIB))


def test_a_live_holder_or_a_reclaim_that_finishes_is_waited_for_not_ended(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What is not stuck keeps the wait going: a holder in D state for less than the bound (a long I/O) that then
    returns and exits, after which its memory comes back."""
    real = verdict._proc_state
    monkeypatch.setattr(verdict, "_proc_state", lambda pid: "D" if pid == 4_000_021 else real(pid))
    sc = Scenario.h200()
    sc.add_process(0, 4_000_021, used_bytes=2 * GIB)
    sc.at_call(300).remove_process(0, 4_000_021)
    sc.at_call(300).set_device(0, used_bytes=0)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(timeout=LONG_S, events=False, options=steps(clock))
    assert report.ready and exit_code_of(report) == 0


def test_the_cli_ends_at_the_bound_with_exit_5_and_the_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``nvmlcheck ready --timeout 60`` on memory held with no holder: the command's wait is the library's, on the
    step clock here (the CLI's options, with the clock swapped in), so no time is slept."""
    clock = StepClock(0.001)
    real = Session.ready

    def on_steps(self: Session, *args: Any, options: WaitOptions | None = None, **kw: Any) -> Any:
        assert options is not None
        return real(self, *args, options=options.with_(clock=clock.clock, sleep=clock.sleep, policy=0.02), **kw)

    monkeypatch.setattr(Session, "ready", on_steps)
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    path = str(sc.write(tmp_path / "s.txt"))
    code = cli.main(["--simulate", path, "--json", "ready", "--timeout", "60", "--no-events"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 5 and doc["exit_code"] == 5 and doc["needs_operator"] is True
    (gpu,) = doc["gpus"]
    assert gpu["class"] == "stuck" and gpu["actions"] == ["RESET_GPU"]
    assert ended_near_the_bound(clock, MODEL.stuck_after_ns(1, 8 * GIB))
    code = cli.main(["--simulate", path, "ready", "--timeout", "60", "--no-events"])
    out = capsys.readouterr().out
    assert code == 5 and "stuck" in out.splitlines()[0] and "reset the GPU" in out and "needs an operator" in out
