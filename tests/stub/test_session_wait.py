"""Session.wait_until_clean on the stub: what the session adds to the poller (probe, CPU accounting, the deadline
handed down to the backend).

No test here asserts a wall-clock duration: time is either injected (a clock that counts the stub's NVML calls) or
not asserted at all. The timing goal of the CPU accounting lives in ``benchmarks/bench_reap_polls.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import wait as wait_module
from nvmlcheck.testing import Scenario, StubProbe, build_stub, stub_source_dir

pytestmark = pytest.mark.stub
GIB = 1 << 30
MS = 1_000_000


def _busy() -> Scenario:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    return sc


def _capture_poll_until(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Record the keyword arguments the session hands the poller (it imports poll_until at call time)."""
    seen: list[dict[str, Any]] = []
    real = wait_module.poll_until

    def spy(*args: Any, **kwargs: Any) -> nc.WaitResult:
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(wait_module, "poll_until", spy)
    return seen


# --- CPU accounting of the duty cap ---------------------------------------------------------------------------------


def _burn_and_leave_unreaped(seconds: float) -> subprocess.Popen[bytes]:
    """A child that burns ``seconds`` of CPU and exits; returned once it has exited but before it is reaped."""
    burn = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass"
    child = subprocess.Popen([sys.executable, "-S", "-c", burn])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie: its CPU not yet ours
    return child


def _outlast_the_children_cache() -> None:
    """wait.cpu_time_ns reads the children's CPU at most every 10 ms: make its next call read them again."""
    wait_module._children_read_at = -(10**18)


def test_the_nvml_duty_cap_counts_this_threads_cpu_not_reaped_children(
    scenario_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launch script kills and reaps its workers during the wait: their CPU time lands in this process's
    # RUSAGE_CHILDREN. With NVML all of a poll's cost is in this thread, so the duty cap must count only that: the
    # clock it gets must not move when a CPU-heavy child is reaped. (It used to count children, and the H200 saw the
    # interval stretched to ~40 ms mid-wait; the timing itself is benchmarks/bench_reap_polls.py.)
    seen = _capture_poll_until(monkeypatch)
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        gpus.wait_until_clean(timeout=10)
    cpu_clock: Callable[[], int] | None = seen[0]["cpu_clock"]
    assert cpu_clock is not None, "the NVML wait must count CPU time, not wall time"
    child = _burn_and_leave_unreaped(0.2)
    before = cpu_clock()
    child.wait()  # the reap: 0.2 s of the child's CPU becomes this process's RUSAGE_CHILDREN
    _outlast_the_children_cache()
    charged = cpu_clock() - before
    assert charged < 100 * MS, f"the duty cap's clock charged {charged / 1e6:.1f} ms of a reaped child's CPU"


def test_the_poller_default_cpu_clock_does_count_reaped_children() -> None:
    # The other half of the mechanism: nvidia-smi burns its CPU in children, so the poller's default clock (used for
    # the smi backend) must count them.
    child = _burn_and_leave_unreaped(0.2)
    before = wait_module.cpu_time_ns()
    child.wait()
    _outlast_the_children_cache()
    assert wait_module.cpu_time_ns() - before >= 150 * MS  # 0.2 s of the child's CPU, in 10 ms clock ticks


def test_the_smi_wait_and_injected_clocks_get_the_pollers_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = _capture_poll_until(monkeypatch)
    fake_smi = [sys.executable, "-S", str(stub_source_dir() / "fake_nvidia_smi.py")]
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(Scenario.h200().write(tmp_path / "scenario.txt")))
    now = [0]

    def clock() -> int:
        now[0] += 1000
        return now[0]

    with nc.open("smi", smi_command=fake_smi) as gpus:
        gpus.wait_until_clean(timeout=10)
        gpus.wait_until_clean(timeout=10, clock=clock, sleep=lambda s: None)
    assert [kw["cpu_clock"] for kw in seen] == [None, None]  # the poller then counts children (real clock) or none


# --- the deadline inside a poll (issue 12) ----------------------------------------------------------------------------


class CallClock:
    """A clock on which every NVML call the stub answers takes ``per_call_ns``, and sleeps take what they ask: time
    that only NVML calls and sleeps move, read from the stub's own call counter (no real time involved)."""

    def __init__(self, probe: StubProbe, per_call_ns: int) -> None:
        self.probe = probe
        self.per_call_ns = per_call_ns
        self.slept_ns = 0

    def calls(self) -> int:
        return self.probe.call_count()

    def clock(self) -> int:
        return self.calls() * self.per_call_ns + self.slept_ns

    def sleep(self, seconds: float) -> None:
        self.slept_ns += round(seconds * 1e9)


def test_a_wait_stops_one_query_after_its_deadline_not_one_poll(scenario_path: Path) -> None:
    # The user's report: 300 ms per NVML query, timeout=1 returned after 2.13 s. The first poll makes ~14 calls
    # (system versions, identity, memory, three process lists); the deadline must stop it after the call that
    # crossed it.
    stub = build_stub()
    _busy().write(scenario_path)
    with nc.open("nvml", library_path=str(stub)) as gpus:
        t = CallClock(StubProbe(stub), per_call_ns=300 * MS)
        first = t.calls()
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=1.0, clock=t.clock, sleep=t.sleep)
        made = t.calls() - first
    # Calls end at 0.3, 0.6, 0.9 s (each before the deadline, so the next one runs) and 1.2 s: then it stops.
    assert made == 4, f"{made} NVML calls: the pass did not stop at the deadline"
    assert info.value.elapsed_ns == 1200 * MS and info.value.polls == 0
    assert "no poll finished before the deadline" in str(info.value)


def test_a_later_poll_is_cut_too_and_the_message_keeps_the_last_full_poll(scenario_path: Path) -> None:
    stub = build_stub()
    _busy().write(scenario_path)
    with nc.open("nvml", library_path=str(stub)) as gpus:
        gpus.snapshot()  # identity and versions read: a wait's poll is now memory + three process lists
        t = CallClock(StubProbe(stub), per_call_ns=30 * MS)
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=1.0, clock=t.clock, sleep=t.sleep, policy=0.05)
    err = info.value
    assert err.elapsed_ns - 1000 * MS <= 30 * MS  # at most one query past the deadline (a full poll is four)
    assert err.polls >= 2
    assert err.snapshot is not None and "pid 4000001" in str(err)  # the holder, from the last full snapshot


def test_timeout_zero_still_completes_its_one_check(scenario_path: Path) -> None:
    stub = build_stub()
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(stub)) as gpus:
        t = CallClock(StubProbe(stub), per_call_ns=300 * MS)
        result = gpus.wait_until_clean(timeout=0, clock=t.clock, sleep=t.sleep)
    assert result.clean and result.polls == 1  # a deadline of "now" must not cut the single check short
