"""One WaitOptions value, handed to every API that waits, on the stub: the poller, Session.wait_until_clean (and the
module-level wait_until_clean), kill_and_wait and KillPlan.wait all wait by it, and a keyword given wins over its
field."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.kill import prepare_kill
from nvmlcheck.model import Fields
from nvmlcheck.testing import Scenario, build_stub
from nvmlcheck.wait import TracePoint, WaitOptions, poll_until

pytestmark = pytest.mark.stub
GIB = 1 << 30


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that ends at SIGTERM (on no GPU list: only its exit holds a kill's wait)."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _options(seen: list[TracePoint]) -> WaitOptions:
    return WaitOptions(timeout=20.0, policy=0.001, stable_polls=3, trace=True, on_poll=seen.append, events=None)


def test_one_options_value_serves_every_api(
    scenario_path: Path, sleeper: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    Scenario.h200().write(scenario_path)
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(build_stub()))  # for the module-level wait_until_clean's open
    seen: list[TracePoint] = []
    opts = _options(seen)
    results = [nc.wait_until_clean(backend="nvml", options=opts)]
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        results += [
            poll_until(lambda: gpus.snapshot(fields=Fields.WAIT), options=opts),
            gpus.wait_until_clean(options=opts),
            nc.kill_and_wait(gpus, [sleeper.pid], options=opts).wait,
        ]
        assert sleeper.wait(timeout=10) < 0  # it was signalled
        other = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
        try:
            with prepare_kill([other.pid]) as plan:
                plan.send_first()
                results.append(plan.wait(gpus, options=opts).wait)
            assert other.wait(timeout=10) < 0
        finally:
            other.kill()
            other.wait()
    for res in results:
        assert res.polls >= 3 and res.policy == nc.PollPolicy.every(0.001)  # the options' policy and stable polls
        assert res.trace is not None and len(res.trace) == res.polls  # the options' trace
    assert len(seen) == sum(r.polls for r in results)  # the options' on_poll, on every poll of every wait


def test_a_keyword_wins_over_the_options_field(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.write(scenario_path)
    opts = WaitOptions(timeout=30.0, policy=0.001)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(0, options=opts)  # positional timeout: one check, not the options' 30 s
        assert info.value.polls == 1 and info.value.timeout_s == 0
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(options=opts.with_(timeout=0))
        assert info.value.polls == 1


def test_kill_plan_wait_refuses_a_clock_the_signal_was_not_timed_on(
    scenario_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus, prepare_kill([sleeper.pid]) as plan:
        plan.send_first()
        with pytest.raises(ValueError, match="clock"):
            plan.wait(gpus, options=WaitOptions(clock=time.perf_counter_ns))
        assert plan.wait(gpus, options=WaitOptions(clock=time.monotonic_ns)).pids[0].exited_ns is not None


def test_kill_and_wait_refuses_bad_options_before_signalling(
    scenario_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        with pytest.raises(ValueError, match="polling mode"):
            nc.kill_and_wait(gpus, [sleeper.pid], policy="fast")
        with pytest.raises(TypeError, match="WaitOptions"):
            nc.kill_and_wait(gpus, [sleeper.pid], options=30.0)  # type: ignore[arg-type]
        # A function where a Predicate goes, or a predicate with only_targets (which replaces it): refused before
        # the signal too (the first used to fail in the wait, after the SIGTERM; the second in KillPlan.wait).
        with pytest.raises(TypeError, match="must be a nvmlcheck Predicate"):
            nc.kill_and_wait(gpus, [sleeper.pid], predicate=lambda snap: True)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="only_targets"):
            nc.kill_and_wait(gpus, [sleeper.pid], only_targets=True, predicate=nc.no_processes())
    assert sleeper.poll() is None  # nothing was signalled


def test_every_call_that_takes_a_predicate_refuses_another_type(scenario_path: Path) -> None:
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        calls: dict[str, Callable[[Any], object]] = {
            "Session.wait_until_clean": lambda p: gpus.wait_until_clean(0, p),
            "poll_until": lambda p: poll_until(gpus.snapshot, p, timeout=0),
            "select_clean": lambda p: nc.select_clean(gpus, 1, predicate=p),
        }
        bad_values: tuple[object, ...] = (lambda snap: True, "no_processes", 1)
        for name, call in calls.items():
            for bad in bad_values:
                with pytest.raises(TypeError, match="must be a nvmlcheck Predicate"):
                    call(bad)
                    pytest.fail(f"{name} took {bad!r}")
        assert gpus.wait_until_clean(0, nc.no_processes()).clean  # a Predicate still works
