"""kill_and_wait and the split API on the stub with real processes: escalation of a target on no GPU list, process
trees (named launcher, workers bound as GPU holders, late-spawned workers), the --tree hint, grace None/inf, and
the caller's own children left for the caller to reap. Mechanisms only: signals received, order, records."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

import nvmlcheck as nc
from nvmlcheck._proc.pin import Pinned
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30

WORKER = "import time; print('w', flush=True); time.sleep(60)"
# argv: number of workers, mode. Prints the workers' PIDs on one line. On SIGTERM: "ignore" ignores it, "die" dies
# (the default action), "late" starts one more worker, prints "late PID", waits for that worker and exits.
LAUNCHER = """
import os, signal, subprocess, sys, time
n, mode = int(sys.argv[1]), sys.argv[2]
WORKER = "import time; print('w', flush=True); time.sleep(60)"
workers = [subprocess.Popen([sys.executable, "-S", "-c", WORKER], stdout=subprocess.PIPE) for _ in range(n)]
for w in workers:
    w.stdout.readline()
late = []
def on_term(signum, frame):
    if mode == "late" and not late:
        late.append(subprocess.Popen([sys.executable, "-S", "-c", WORKER], stdout=subprocess.PIPE))
if mode in ("ignore", "late"):
    signal.signal(signal.SIGTERM, on_term)
print(" ".join(str(w.pid) for w in workers), flush=True)
while True:
    if late:
        late[0].stdout.readline()
        print("late", late[0].pid, flush=True)
        late[0].wait()
        os._exit(0)
    time.sleep(0.01)
"""


@pytest.fixture
def cleanup() -> Iterator[list[int]]:
    """PIDs this test started indirectly (workers of a launcher): SIGKILLed at the end if still the same process."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            pin = Pinned.open(pid)
        except (ProcessLookupError, PermissionError):
            continue
        pin.send(signal.SIGKILL)
        pin.close()


def launch(n: int, mode: str, cleanup: list[int]) -> tuple[subprocess.Popen[bytes], list[int]]:
    proc = subprocess.Popen([sys.executable, "-S", "-c", LAUNCHER, str(n), mode], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    workers = [int(p) for p in proc.stdout.readline().split()]
    cleanup.extend(workers)
    return proc, workers


def finish(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@pytest.mark.parametrize("pinning", ["pidfd", "start-time"])
def test_target_ignoring_sigterm_on_no_gpu_list_is_killed_and_waited_for(
    gpus: Callable[[Scenario], nc.Session], cleanup: list[int], pinning: Literal["pidfd", "start-time"]
) -> None:
    proc, _ = launch(0, "ignore", cleanup)
    try:
        with gpus(Scenario.h200()) as session:  # the GPUs are clean from the start: only the exit can end the wait
            result = nc.kill_and_wait(session, [proc.pid], timeout=30, grace_s=0.2, pinning=pinning)
        (t,) = result.pids
        assert t.pinning == pinning
        assert [s.name for s in t.signals] == ["SIGTERM", "SIGKILL"]
        assert t.exited_ns is not None and t.killed_ns is not None and t.exited_ns >= t.killed_ns
        assert result.clean_ns >= t.exited_ns
        assert proc.wait() == -signal.SIGKILL
    finally:
        finish(proc)


def test_escalation_follows_the_injected_clock(gpus: Callable[[Scenario], nc.Session], cleanup: list[int]) -> None:
    proc, _ = launch(0, "ignore", cleanup)
    now = [0]

    def clock() -> int:
        return now[0]

    def sleep(s: float) -> None:
        now[0] += int(s * 1e9)
        os.sched_yield()

    try:
        with gpus(Scenario.h200()) as session:
            result = nc.kill_and_wait(session, [proc.pid], timeout=3600, grace_s=5.0, policy=0.5, clock=clock,
                                      sleep=sleep)
        (t,) = result.pids
        assert t.killed_ns is not None and 5_000_000_000 <= t.killed_ns < 5_600_000_000
    finally:
        finish(proc)


@pytest.mark.parametrize("grace", [None, math.inf])
def test_grace_none_or_inf_never_escalates(
    grace: float | None, gpus: Callable[[Scenario], nc.Session], cleanup: list[int]
) -> None:
    proc, _ = launch(0, "ignore", cleanup)
    try:
        with gpus(Scenario.h200()) as session, pytest.raises(nc.KillTimeout) as info:
            nc.kill_and_wait(session, [proc.pid], timeout=0.3, grace_s=grace)
        (t,) = info.value.pids
        assert [s.name for s in t.signals] == ["SIGTERM"] and t.exited_ns is None
        assert f"pid {proc.pid}" in str(info.value) and "has not exited" in str(info.value)
        assert proc.poll() is None
        doc = info.value.to_json()
        assert doc["pids"][0]["signals"] == [{"signal": "SIGTERM", "sent_ns": 0}]
    finally:
        finish(proc)


def test_callers_child_is_not_reaped(gpus: Callable[[Scenario], nc.Session]) -> None:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    try:
        sc = Scenario.h200()
        sc.add_process(0, child.pid, used_bytes=GIB, bound=True)
        with gpus(sc) as session:
            result = nc.kill_and_wait(session, [child.pid], timeout=30)
        assert result.pids[0].exited_ns is not None
        assert child.returncode is None and child.wait() == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def _bind(workers: list[int]) -> Scenario:
    sc = Scenario.h200(2)
    for i, pid in enumerate(workers):
        sc.add_process(i % 2, pid, used_bytes=GIB, bound=True)
    return sc


@pytest.mark.parametrize("pinning", ["pidfd", "start-time"])
def test_tree_kills_workers_bound_to_the_gpus(
    gpus: Callable[[Scenario], nc.Session], cleanup: list[int], pinning: Literal["pidfd", "start-time"]
) -> None:
    proc, workers = launch(3, "ignore", cleanup)
    try:
        with gpus(_bind(workers)) as session:
            result = nc.kill_and_wait(session, [proc.pid], tree=True, timeout=30, grace_s=0.5, pinning=pinning)
        by_pid = {t.pid: t for t in result.pids}
        assert set(by_pid) == {proc.pid, *workers}
        assert by_pid[proc.pid].found_by == "named"
        for w in workers:
            assert by_pid[w].found_by == "descendant" and by_pid[w].parent == proc.pid
            assert by_pid[w].signals[0].name == "SIGTERM" and by_pid[w].exited_ns is not None
        assert [s.name for s in by_pid[proc.pid].signals] == ["SIGTERM", "SIGKILL"]  # the launcher ignored TERM
        assert result.tree and result.to_json()["tree"] is True
    finally:
        finish(proc)


def test_without_tree_the_timeout_names_the_workers_and_suggests_tree(
    gpus: Callable[[Scenario], nc.Session], cleanup: list[int]
) -> None:
    proc, workers = launch(2, "die", cleanup)
    try:
        with gpus(_bind(workers)) as session, pytest.raises(nc.KillTimeout) as info:
            nc.kill_and_wait(session, [proc.pid], timeout=0.5)
        exc = info.value
        assert [t.pid for t in exc.pids] == [proc.pid] and exc.pids[0].exited_ns is not None
        assert sorted(pid for pid, _ in exc.tree_hint) == sorted(workers)
        assert all(anc == proc.pid for _, anc in exc.tree_hint)
        assert "--tree" in str(exc)
        for w in workers:
            assert Path(f"/proc/{w}").exists()  # not signalled
    finally:
        finish(proc)


def test_tree_follows_a_worker_spawned_after_the_first_signal(
    gpus: Callable[[Scenario], nc.Session], cleanup: list[int]
) -> None:
    proc, workers = launch(1, "late", cleanup)
    try:
        with gpus(_bind(workers)) as session:
            # grace None: only the late worker's SIGTERM (found by a rescan) lets the launcher exit.
            result = nc.kill_and_wait(session, [proc.pid], tree=True, timeout=30, grace_s=None)
        assert proc.stdout is not None
        late = int(proc.stdout.readline().split()[1])
        cleanup.append(late)
        by_pid = {t.pid: t for t in result.pids}
        assert late in by_pid and by_pid[late].found_by == "descendant" and by_pid[late].parent == proc.pid
        assert [s.name for s in by_pid[late].signals] == ["SIGTERM"]
        assert proc.wait() == 0
    finally:
        finish(proc)


def test_split_api_signals_before_nvml_is_opened(gpus: Callable[[Scenario], nc.Session]) -> None:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    try:
        plan = nc.prepare_kill([child.pid])
        start = plan.send_first(signal.SIGTERM)
        assert plan.started_ns == start and plan.targets[0].signals[0].name == "SIGTERM"
        sc = Scenario.h200()
        sc.add_process(0, child.pid, used_bytes=GIB, bound=True)
        with gpus(sc) as session:  # NVML opens only now
            result = plan.wait(session, timeout=30)
        assert result.started_ns == start and result.pids[0].off_gpu_ns is not None
        assert child.wait() == -signal.SIGTERM
    finally:
        child.kill()
        child.wait()


def test_a_kill_on_a_mig_instance_judges_that_instance(gpus: Callable[[Scenario], nc.Session]) -> None:
    # Another tenant holds the other instance of the same GPU for good: the kill's wait must not judge it.
    ours, theirs = "MIG-5f0a0000-0000-5000-8000-0000000000b0", "MIG-5f0a0000-0000-5000-8000-0000000000b1"
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    try:
        sc = Scenario.h200()
        sc.set_device(0, mig=True)
        sc.add_mig_device(0, 0, gi=1, ci=0, total_bytes=16 * GIB, uuid=ours)
        sc.add_mig_device(0, 1, gi=2, ci=0, total_bytes=16 * GIB, uuid=theirs)
        sc.add_process(0, child.pid, used_bytes=GIB, gi=1, ci=0, bound=True)
        sc.add_process(0, 4_100_090, used_bytes=2 * GIB, gi=2, ci=0)
        with gpus(sc) as session:
            result = nc.kill_and_wait(session, [child.pid], timeout=30, devices=iter([ours]))
        assert result.pids[0].exited_ns is not None and result.clean_ns is not None
    finally:
        child.kill()
        child.wait()
