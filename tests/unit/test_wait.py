"""The poller, driven by a fake clock: no real sleeps. Time advances only through the fake GPU's query cost and the
fake sleep, and the fake GPU answers with the state its timeline holds when the query returns."""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import cycle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from snapshots import GIB, busy, dev, failure, idle, memory_only, proc, snap

from nvmlcheck.errors import (
    BackendUnavailable,
    CorruptData,
    DeadlinePassed,
    DriverNotLoaded,
    FunctionNotFound,
    GpuLost,
    GpuRequiresReset,
    InsufficientSize,
    LibraryVersionMismatch,
    NoPermission,
    NotReady,
    NotSupported,
    NvmlCheckError,
    SmiError,
    SmiParseError,
    SmiTimeout,
    SmiTransportError,
    Timeout,
    Unknown,
    WaitTimeout,
)
from nvmlcheck.model import Snapshot
from nvmlcheck.predicates import (
    Predicate,
    always,
    default_predicate,
    memory_used_at_most,
    no_processes,
    on_devices,
    pids_gone,
)
from nvmlcheck.wait import DEFAULT, PRECISE, Deadline, PollPolicy, TracePoint, WaitResult, is_transient, poll_until

START = 1_000_000_000_000  # the fake clock's reading when a test begins (not 0: offsets must be relative)
MS = 1_000_000
US = 1_000

State = Snapshot | NvmlCheckError


# --- fakes ------------------------------------------------------------------------------------------------------


@dataclass
class FakeTime:
    """A clock that only moves when told. ``late_ns`` makes every sleep wake up that much late (timer slack)."""

    now: int = START
    late_ns: int = 0
    sleeps: list[tuple[int, int]] = field(default_factory=list)  # (when, requested ns)

    def clock(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        ns = round(seconds * 1e9)
        self.sleeps.append((self.now, ns))
        self.now += ns + self.late_ns


@dataclass
class FakeGpu:
    """``snapshot_fn``: costs ``costs`` ns per query (cycled), then answers with the timeline's state at that
    moment. ``timeline`` is ``[(offset_ns_from_START, state), ...]`` sorted; before the first change the first state
    holds."""

    time: FakeTime
    timeline: Sequence[tuple[int, State]]
    costs: Iterable[int] = (10 * US,)
    samples: list[tuple[int, State]] = field(default_factory=list)
    project: Callable[[Snapshot], Snapshot] | None = None  # e.g. memory_only: a probe of the same GPU

    def __post_init__(self) -> None:
        self._costs = cycle(self.costs)

    def state_at(self, t: int) -> State:
        current = self.timeline[0][1]
        for offset, state in self.timeline:
            if START + offset <= t:
                current = state
            else:
                break
        return current

    def __call__(self) -> Snapshot:
        self.time.now += next(self._costs)
        state = self.state_at(self.time.now)
        self.samples.append((self.time.now, state))
        if isinstance(state, NvmlCheckError):
            raise state
        return self.project(state) if self.project is not None else state


def wait(
    timeline: Sequence[tuple[int, State]],
    *,
    timeout: float | None = 1.0,
    costs: Iterable[int] = (10 * US,),
    late_ns: int = 0,
    predicate: Predicate | None = None,
    policy: PollPolicy | str | float | None = None,
    stable_polls: int = 2,
    keep_trace: bool = False,
) -> tuple[WaitResult, FakeGpu]:
    t = FakeTime(late_ns=late_ns)
    gpu = FakeGpu(t, timeline, costs)
    res = poll_until(
        gpu,
        predicate,
        timeout=timeout,
        policy=policy,
        stable_polls=stable_polls,
        clock=t.clock,
        sleep=t.sleep,
        keep_trace=keep_trace,
    )
    return res, gpu


def wait_timeout(timeline: Sequence[tuple[int, State]], **kw: object) -> tuple[WaitTimeout, FakeGpu]:
    gpu_box: list[FakeGpu] = []
    t = FakeTime()
    gpu = FakeGpu(t, timeline, kw.pop("costs", (10 * US,)))  # type: ignore[arg-type]
    gpu_box.append(gpu)
    with pytest.raises(WaitTimeout) as info:
        poll_until(gpu, clock=t.clock, sleep=t.sleep, **kw)  # type: ignore[arg-type]
    return info.value, gpu


HELD = snap(dev(0, used=16 * GIB))  # memory held, empty process list
BUSY = busy(pid=1234, used=16 * GIB)
CLEAN = idle(0)


# --- basics -----------------------------------------------------------------------------------------------------


def test_clean_at_once_takes_stable_polls_and_reports_the_first() -> None:
    res, _ = wait([(0, CLEAN)], costs=[10 * US])
    assert res.clean is True
    assert res.polls == 2
    assert res.clean_ns == 10 * US  # the first query returned 10 µs after the start
    assert res.last_dirty_ns is None
    # confirmed after the 0.25 ms confirmation interval and a second 10 µs query
    assert res.elapsed_ns == 10 * US + 250 * US + 10 * US
    assert res.started_ns == START
    # One time base with KillResult: offsets from the start; started_ns is the one absolute reading.
    assert res.confirmed_ns == res.elapsed_ns == 10 * US + 250 * US + 10 * US
    assert res.poll_cost_ns == 10 * US
    assert res.interval_ns == 260 * US
    assert res.snapshot is CLEAN


def test_first_clean_ns_is_the_deprecated_name_of_clean_ns() -> None:
    res, _ = wait([(0, CLEAN)], costs=[10 * US])
    with pytest.warns(DeprecationWarning, match=r"WaitResult\.first_clean_ns is deprecated.*clean_ns"):
        assert res.first_clean_ns == res.clean_ns == 10 * US
    assert res.policy is DEFAULT
    assert res.trace is None


def test_becomes_clean_after_the_holder_leaves() -> None:
    res, _ = wait([(0, BUSY), (50 * MS, CLEAN)], policy=PollPolicy.every(0.001), costs=[10 * US])
    # polls end at 10 µs + k * 1010 µs; the first at or after 50 ms is k = 50 -> 50.51 ms
    assert res.clean_ns == 10 * US + 50 * 1010 * US
    assert res.last_dirty_ns == 10 * US + 49 * 1010 * US
    assert res.clean_ns - 50 * MS <= 1 * MS + 10 * US
    assert res.elapsed_ns == res.clean_ns + 1010 * US
    assert res.polls == 52


def test_process_list_empty_before_memory_returns_does_not_return_early() -> None:
    # FACTS (H200): the process list emptied 28 ms before used returned to idle.
    res, _ = wait([(0, BUSY), (100 * MS, HELD), (128 * MS, CLEAN)])
    assert res.clean_ns >= 128 * MS
    assert res.clean_ns <= 128 * MS + 2 * MS


def test_flapping_list_resets_stability() -> None:
    # The list flips every 300 µs for 20 ms, so two consecutive polls never agree on "clean" until it settles.
    flaps: list[tuple[int, State]] = [(i * 300 * US, CLEAN if i % 2 else BUSY) for i in range(67)]
    policy = PollPolicy.every(0.0003)
    res, gpu = wait([*flaps, (20 * MS, CLEAN)], policy=policy, costs=[0, 0, 0, 1])
    assert res.clean_ns >= 20 * MS - 300 * US
    seen = [s is CLEAN for _, s in gpu.samples]
    assert any(seen[:-2]), "the test must actually show clean polls that were not confirmed"
    assert res.polls == len(gpu.samples)


def test_stable_polls_one_and_three() -> None:
    res1, _ = wait([(0, CLEAN)], stable_polls=1)
    assert res1.polls == 1 and res1.elapsed_ns == res1.clean_ns == 10 * US
    res3, _ = wait([(0, CLEAN)], stable_polls=3)
    assert res3.polls == 3 and res3.clean_ns == 10 * US


def test_default_predicate_is_used_when_none_given() -> None:
    err, _ = wait_timeout([(0, HELD)], timeout=0.01)
    assert "GPU 0: 16.0 GiB used with no visible process" in err.culprits[0]


# --- timeouts ---------------------------------------------------------------------------------------------------


def test_timeout_zero_is_exactly_one_check_judged_alone() -> None:
    res, gpu = wait([(0, CLEAN)], timeout=0, stable_polls=5)
    assert res.polls == 1 and len(gpu.samples) == 1
    assert gpu.time.sleeps == []
    err, gpu = wait_timeout([(0, BUSY)], timeout=0)
    assert err.polls == 1 and len(gpu.samples) == 1 and gpu.time.sleeps == []
    assert err.timeout_s == 0
    assert err.culprits[0] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"


def test_timeout_none_and_inf_wait_as_long_as_it_takes() -> None:
    for timeout in (None, math.inf):
        res, _ = wait([(0, BUSY), (60 * 1000 * MS, CLEAN)], timeout=timeout)
        assert res.clean_ns >= 60 * 1000 * MS


@pytest.mark.parametrize("bad", [-1, -1e-9, math.nan, -math.inf])
def test_bad_timeouts_are_value_errors(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout"):
        wait([(0, CLEAN)], timeout=bad)


@pytest.mark.parametrize("bad", ["1", True, [1]])
def test_timeouts_of_the_wrong_type_are_type_errors(bad: object) -> None:
    with pytest.raises(TypeError, match="timeout"):
        wait([(0, CLEAN)], timeout=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1, True, 1.0])
def test_bad_stable_polls(bad: object) -> None:
    with pytest.raises(ValueError, match="stable_polls"):
        wait([(0, CLEAN)], stable_polls=bad)  # type: ignore[arg-type]


def test_a_last_check_runs_at_the_deadline() -> None:
    # Clean exactly at the deadline: the last check (sleep shortened to the deadline) sees it, alone for stable=1.
    res, gpu = wait([(0, BUSY), (95 * MS, CLEAN)], timeout=0.095, stable_polls=1, policy=PollPolicy.every(0.01))
    assert res.polls == len(gpu.samples)
    assert res.elapsed_ns == 95 * MS + 10 * US
    # it slept 10 ms nine times, then only the 4.9 ms that were left before the deadline
    assert [ns for _, ns in gpu.time.sleeps][-2:] == [10 * MS, 95 * MS - 9 * 10_010 * US - 10 * US]


def test_never_sleeps_past_the_deadline_and_overruns_by_at_most_one_query() -> None:
    err, gpu = wait_timeout([(0, BUSY)], timeout=0.0105, policy=PollPolicy.every(0.004), costs=[300 * US])
    deadline = START + 10_500 * US
    assert all(when + ns <= deadline for when, ns in gpu.time.sleeps)
    assert gpu.time.now - deadline <= 300 * US
    assert gpu.samples[-1][0] >= deadline > gpu.samples[-2][0]
    assert err.elapsed_ns == gpu.time.now - START
    assert err.polls == len(gpu.samples) == 4


def test_clean_at_the_deadline_but_not_yet_confirmed() -> None:
    err, _ = wait_timeout([(0, BUSY), (10 * MS, CLEAN)], timeout=0.01, policy=PollPolicy.every(0.001))
    assert err.culprits == (
        "clean at the last poll, but only 1 of the 2 consecutive clean polls required were seen before the deadline",
    )


def test_a_timeout_on_gpus_that_could_not_be_judged_does_not_say_still_held() -> None:
    # Nothing was seen holding them: "still held" read as busy GPUs (the v1 reserve, an unreadable GPU).
    v1 = snap(dev(0, v1=True))  # used counts the driver's reserve: the 16 MiB limit cannot decide
    err, _ = wait_timeout([(0, v1)], timeout=0.01)
    assert err.held is False
    assert str(err).startswith("GPUs not confirmed clean") and "still held" not in str(err)
    back = pickle.loads(pickle.dumps(err))
    assert back.held is False and str(back) == str(err)
    lost = snap(dev(0), failures=[failure(1, Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 1))])
    err, _ = wait_timeout([(0, lost)], timeout=0.01)
    assert err.held is False and str(err).startswith("GPUs not confirmed clean")
    err, _ = wait_timeout([(0, BUSY)], timeout=0.01)
    assert err.held is True and "still held" in str(err)


def test_wait_timeout_message_names_every_culprit() -> None:
    state = snap(
        dev(0, procs=[proc(4242, 16 * GIB, name="sglang::scheduler")]),
        dev(1, used=3 * GIB // 2),
        dev(2),
    )
    err, _ = wait_timeout([(0, state)], timeout=0.05)
    assert isinstance(err, TimeoutError)
    assert err.culprits == (
        "GPU 0: pid 4242 (sglang::scheduler) holds 16.0 GiB (compute)",
        "GPU 0: 16.0 GiB used, above the 16.0 MiB limit",
        "GPU 1: 1.5 GiB used with no visible process (PID namespace or a process that already exited); "
        "clean means at most 16.0 MiB",
    )
    assert err.snapshot is state
    assert 50 * MS <= err.elapsed_ns <= 50 * MS + 10 * US
    assert err.timeout_s == 0.05
    text = str(err)
    assert "GPUs not clean after 0.050 s (timeout 0.05 s" in text
    assert "pid 4242 (sglang::scheduler) holds 16.0 GiB" in text
    bare = WaitTimeout(err.timeout_s, err.elapsed_ns, err.culprits, None, err.polls)
    assert str(pickle.loads(pickle.dumps(bare))) == text


def test_wait_timeout_with_its_snapshot_pickles() -> None:
    err, _ = wait_timeout([(0, BUSY)], timeout=0.001)
    assert pickle.loads(pickle.dumps(err)).snapshot == BUSY


# --- errors -----------------------------------------------------------------------------------------------------

FATAL = [
    GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 0),
    GpuRequiresReset(16, "nvmlDeviceGetMemoryInfo_v2", 0),
    NoPermission(4, "nvmlDeviceGetComputeRunningProcesses_v3", 0),
    DriverNotLoaded(9, "nvmlInit_v2"),
    LibraryVersionMismatch(18, "nvmlInit_v2"),
    CorruptData("pid 0 in the process list", "nvmlDeviceGetComputeRunningProcesses_v3", 0),
    BackendUnavailable("no GPU backend could be opened"),
    SmiParseError("3 columns, expected 4", 2, "0, 1024"),
    SmiTransportError(["ssh", "gpu1", "nvidia-smi"], 255, "Connection refused", "the command prefix failed"),
    NotSupported(3, "nvmlDeviceGetMemoryInfo_v2", 0),
    FunctionNotFound(13, "nvmlDeviceGetMemoryInfo_v2"),
]
TRANSIENT = [
    Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 0),
    Timeout(10, "nvmlDeviceGetComputeRunningProcesses_v3", 0),
    NotReady(27, "nvmlDeviceGetMemoryInfo_v2", 0),
    InsufficientSize(7, "nvmlDeviceGetComputeRunningProcesses_v3", 0),
    SmiTimeout(["nvidia-smi", "--query-gpu=index"], 5.0),
    SmiError(["nvidia-smi", "--query-gpu=index"], 15, "Unable to determine the device handle for GPU0"),
]


@pytest.mark.parametrize("exc", FATAL, ids=lambda e: type(e).__name__)
def test_fatal_errors_fail_fast(exc: NvmlCheckError) -> None:
    assert not is_transient(exc)
    t = FakeTime()
    gpu = FakeGpu(t, [(0, exc)])
    with pytest.raises(type(exc)) as info:
        poll_until(gpu, timeout=30.0, clock=t.clock, sleep=t.sleep)
    assert info.value is exc
    assert len(gpu.samples) == 1 and t.sleeps == []


@pytest.mark.parametrize("exc", TRANSIENT, ids=lambda e: type(e).__name__)
def test_transient_errors_are_retried_and_never_clean(exc: NvmlCheckError) -> None:
    assert is_transient(exc)
    # clean, error, clean, clean: the error resets the run, so the first clean of the confirming run is poll 3
    res, gpu = wait([(0, CLEAN), (100 * US, exc), (1200 * US, CLEAN)], policy=PollPolicy.every(0.001))
    kinds = [s for _, s in gpu.samples]
    assert kinds[0] is CLEAN and kinds[1] is exc and kinds[2] is CLEAN
    assert res.polls == 4
    assert res.clean_ns == gpu.samples[2][0] - START
    assert res.last_dirty_ns is None  # the failed poll saw nothing held: no poll did


def test_transient_error_until_the_deadline_is_named() -> None:
    exc = Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 0)
    err, _ = wait_timeout([(0, BUSY), (5 * MS, exc)], timeout=0.01)
    assert err.culprits[0] == f"the last poll failed (Unknown): {exc}"
    # and what the last good snapshot showed
    assert err.culprits[1] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"
    assert err.snapshot is BUSY


def test_error_on_every_poll_has_no_snapshot() -> None:
    exc = Timeout(10, "nvmlDeviceGetMemoryInfo_v2", 0)
    err, _ = wait_timeout([(0, exc)], timeout=0.002)
    assert err.snapshot is None
    assert err.culprits == (f"the last poll failed (Timeout): {exc}",)


def test_fatal_failure_inside_a_snapshot_is_raised_naming_the_device() -> None:
    lost = GpuLost(15, "nvmlDeviceGetMemoryInfo_v2")  # the backend did not say which GPU
    state = snap(dev(0), failures=[failure(3, lost)])
    t = FakeTime()
    with pytest.raises(GpuLost) as info:
        poll_until(FakeGpu(t, [(0, state)]), timeout=1.0, clock=t.clock, sleep=t.sleep)
    assert info.value.device_index == 3
    assert "for GPU 3" in str(info.value)
    assert info.value.__cause__ is lost


def test_fatal_failure_that_already_names_its_device_is_raised_as_is() -> None:
    corrupt = CorruptData("pid 0 in the process list", "nvmlDeviceGetComputeRunningProcesses_v3", 2)
    t = FakeTime()
    with pytest.raises(CorruptData) as info:
        poll_until(FakeGpu(t, [(0, snap(failures=[failure(2, corrupt)]))]), timeout=1.0, clock=t.clock, sleep=t.sleep)
    assert info.value is corrupt


def test_corrupt_data_failure_without_a_device_gets_one() -> None:
    corrupt = CorruptData("used bytes above total")
    t = FakeTime()
    with pytest.raises(CorruptData) as info:
        poll_until(FakeGpu(t, [(0, snap(failures=[failure(1, corrupt)]))]), timeout=1.0, clock=t.clock, sleep=t.sleep)
    assert info.value.device_index == 1 and "GPU 1" in str(info.value)


def test_other_fatal_failure_gets_a_note() -> None:
    parse = SmiParseError("bad row", 3, "x")
    t = FakeTime()
    with pytest.raises(SmiParseError) as info:
        poll_until(FakeGpu(t, [(0, snap(failures=[failure(4, parse)]))]), timeout=1.0, clock=t.clock, sleep=t.sleep)
    assert info.value is parse
    assert "(while reading GPU 4)" in getattr(parse, "__notes__", [])


def test_transient_failure_inside_a_snapshot_is_not_clean_even_for_always() -> None:
    flaky = Unknown(999, "nvmlDeviceGetComputeRunningProcesses_v3", 1)
    state = snap(dev(0), failures=[failure(1, flaky)])
    err, _ = wait_timeout([(0, state)], timeout=0.003, predicate=always())
    assert err.culprits == (f"GPU 1: could not be read: {flaky}",)
    res, _ = wait([(0, state), (2 * MS, idle(0, 1))], predicate=always())
    assert res.clean_ns >= 2 * MS


def test_non_nvmlcheck_exceptions_propagate() -> None:
    t = FakeTime()

    def broken() -> Snapshot:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        poll_until(broken, timeout=1.0, clock=t.clock, sleep=t.sleep)


@pytest.mark.parametrize("exc", [*FATAL, *TRANSIENT], ids=lambda e: type(e).__name__)
def test_is_transient_table(exc: NvmlCheckError) -> None:
    assert is_transient(exc) is (exc in TRANSIENT)


def test_is_transient_is_false_for_foreign_errors() -> None:
    assert not is_transient(RuntimeError("x"))
    assert not is_transient(KeyboardInterrupt())


# --- polling policy ---------------------------------------------------------------------------------------------


def test_precise_mode_never_sleeps() -> None:
    # time.sleep(0) alone costs ~80 µs on Linux: the precise loop must not call it at all.
    res, gpu = wait([(0, BUSY), (5 * MS, CLEAN)], policy=PRECISE, costs=[30 * US])
    assert gpu.time.sleeps == []
    assert res.clean_ns - 5 * MS <= 30 * US
    assert res.elapsed_ns - 5 * MS <= 60 * US  # well within the 100 µs target


def test_policy_by_name_and_number() -> None:
    res, gpu = wait([(0, CLEAN)], policy="precise")
    assert res.policy is PRECISE and gpu.time.sleeps == []
    res, _ = wait([(0, CLEAN)], policy="default")
    assert res.policy is DEFAULT
    res, gpu = wait([(0, BUSY), (10 * MS, CLEAN)], policy=0.002)
    assert res.policy == PollPolicy.every(0.002)
    assert {ns for _, ns in gpu.time.sleeps} == {2 * MS}
    with pytest.raises(ValueError, match="polling mode"):
        wait([(0, CLEAN)], policy="fast")
    with pytest.raises(TypeError):
        wait([(0, CLEAN)], policy=[1])  # type: ignore[arg-type]


def test_default_mode_detects_within_two_ms_despite_late_wakeups() -> None:
    # time.sleep(0.001) wakes up ~100 µs late on Linux; queries cost 40 µs (4 NVML calls on one GPU).
    res, gpu = wait([(0, BUSY), (300 * MS + 123 * US, CLEAN)], late_ns=100 * US, costs=[40 * US])
    lag = res.elapsed_ns - (300 * MS + 123 * US)
    assert 0 <= lag <= 2 * MS
    # the poller learned the lateness and asks for less, so real periods stay near 1 ms
    periods = [b[0] - a[0] for a, b in zip(gpu.samples[50:250], gpu.samples[51:251], strict=True)]
    assert max(periods) <= 1 * MS + 40 * US + 20 * US
    busy_ns = 40 * US * len(gpu.samples)
    assert busy_ns / res.elapsed_ns <= 0.05  # CPU budget: the query cost is the work


def test_default_mode_duty_cap_stretches_the_interval_for_slow_queries() -> None:
    # Without a CPU clock (an injected clock), the wall time of a query stands in: nvidia-smi costs ~20 ms per run,
    # so at most one run per ~400 ms.
    res, gpu = wait([(0, BUSY), (5000 * MS, CLEAN)], costs=[20 * MS], timeout=None)
    sleeps = [ns for _, ns in gpu.time.sleeps[3:-2]]
    assert min(sleeps) >= 19 * 20 * MS * 0.95
    assert 20 * MS * len(gpu.samples) / res.elapsed_ns <= 0.06


def test_default_mode_duty_cap_counts_cpu_time_of_the_whole_cycle() -> None:
    # 35 µs queries, but each cycle burns 60 µs of CPU (a VM's sleep wake-up costs ~20 µs): 5 % of a core means a
    # cycle of at least 1.2 ms, so the 1 ms interval stretches; without CPU accounting it would not.
    t = FakeTime()
    cpu = [0]

    class Gpu(FakeGpu):
        def __call__(self) -> Snapshot:
            cpu[0] += 60 * US  # the query and the previous wake-up, as the thread's CPU clock sees them
            return super().__call__()

    gpu = Gpu(t, [(0, BUSY), (200 * MS, CLEAN)], [35 * US])
    res = poll_until(gpu, timeout=1.0, clock=t.clock, sleep=t.sleep, cpu_clock=lambda: cpu[0])
    steady = [ns for when, ns in t.sleeps if START + 50 * MS < when < START + 190 * MS]
    assert min(steady) == max(steady) == 1200 * US - 35 * US
    assert cpu[0] / res.elapsed_ns <= 0.051
    _, gpu2 = wait([(0, BUSY), (200 * MS, CLEAN)], costs=[35 * US])  # injected clock: no CPU accounting
    assert {ns for when, ns in gpu2.time.sleeps if START + 50 * MS < when < START + 190 * MS} == {1 * MS}


@pytest.mark.parametrize("slow_cpu", [0, 30 * MS], ids=["blocking", "spinning"])
def test_a_few_slow_queries_do_not_stretch_the_interval(slow_cpu: int) -> None:
    # While the driver tears a killed process down, a few NVML queries take ~30 ms (H200), blocking or charged to
    # the thread as CPU: polling goes on at 1 ms, right when the clean moment is near.
    t = FakeTime()
    cpu = [0]
    slow = {60, 61, 62, 63}  # four slow polls in a row, as seen after a SIGKILL

    class Gpu(FakeGpu):
        def __call__(self) -> Snapshot:
            cpu[0] += slow_cpu if len(self.samples) in slow else 40 * US
            return super().__call__()

    costs = [30 * MS if i in slow else 40 * US for i in range(200)]
    gpu = Gpu(t, [(0, BUSY), (250 * MS, CLEAN)], costs)  # the slow polls end at ~183 ms
    res = poll_until(gpu, timeout=1.0, clock=t.clock, sleep=t.sleep, cpu_clock=lambda: cpu[0])
    assert {ns for _, ns in t.sleeps[:-1]} == {1 * MS}  # (the last one is the 0.25 ms confirmation)
    assert res.clean_ns - 250 * MS <= 1 * MS + 40 * US


def test_a_sustained_cost_does_stretch_the_interval() -> None:
    t = FakeTime()
    cpu = [0]

    class Gpu(FakeGpu):
        def __call__(self) -> Snapshot:
            cpu[0] += 40 * US if len(self.samples) < 50 else 200 * US  # from poll 50 on, 8 GPUs instead of one
            return super().__call__()

    gpu = Gpu(t, [(0, BUSY), (300 * MS, CLEAN)], [40 * US])
    poll_until(gpu, timeout=1.0, clock=t.clock, sleep=t.sleep, cpu_clock=lambda: cpu[0])
    sleeps = [ns for _, ns in t.sleeps]
    assert sleeps[40] == 1 * MS
    assert sleeps[70] == 200 * US * 20 - 40 * US  # 5 %: a 4 ms cycle


def test_cpu_time_counts_reaped_children(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    import time

    import nvmlcheck.wait as w

    def children() -> int:
        monkeypatch.setattr(w, "_children_read_at", -(10**18))  # the children's part is cached for 10 ms
        return w.cpu_time_ns() - time.thread_time_ns()

    before = children()
    subprocess.run([sys.executable, "-c", "sum(range(10**7))"], check=True)
    assert children() - before >= 20 * MS  # an nvidia-smi run's CPU is the child's


def test_default_mode_backs_off_after_ten_quiet_seconds_and_snaps_back_on_change() -> None:
    change = 20_000 * MS  # the holder exits after 20 s; the list empties 28 ms before the memory returns
    res, gpu = wait([(0, BUSY), (change, HELD), (change + 28 * MS, CLEAN)], timeout=None, costs=[10 * US])
    sleeps = gpu.time.sleeps
    early = [ns for when, ns in sleeps if when < START + 9_000 * MS]
    late = [ns for when, ns in sleeps if START + 12_000 * MS < when < START + change]
    assert max(early) <= 1 * MS
    assert min(late) == max(late) == 10 * MS  # backed off to the 10 ms cap
    # the list change reset the interval, so the memory return is still detected within 2 ms
    assert res.clean_ns - (change + 28 * MS) <= 1 * MS + 10 * US
    assert res.elapsed_ns - (change + 28 * MS) <= 2 * MS
    quiet = [when for when, _ in gpu.samples if START + 12_000 * MS < when < START + change]
    assert 10 * US * len(quiet) / (change - 12_000 * MS) < 0.002  # ~0.1 % of a core once backed off


@pytest.mark.parametrize(
    "kwargs",
    [
        {"interval_s": -1},
        {"interval_s": math.nan},
        {"interval_s": math.inf},
        {"confirm_interval_s": -0.1},
        {"max_duty": 0},
        {"max_duty": 1.5},
        {"backoff_factor": 0.5},
        {"interval_s": 0.01, "max_interval_s": 0.001},
        {"backoff_after_s": -1},
        {"mode": "turbo"},
    ],
)
def test_policy_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PollPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [
    {"interval_s": "1ms"},
    {"backoff_factor": True},  # a bool is no factor (True would read as 1: no back-off)
    {"backoff_factor": "2"},
    {"max_duty": True},  # True would read as a 100 % duty cap
    {"compensate_sleep": 1},
])
def test_policy_type_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(NvmlCheckError) as info:
        PollPolicy(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, TypeError) and next(iter(kwargs)) in str(info.value)


def test_policies_are_documented_values() -> None:
    assert DEFAULT.mode == "default" and DEFAULT.interval_s == 0.001 and DEFAULT.max_duty == 0.05
    assert PRECISE.mode == "precise" and PRECISE.interval_s == 0.0
    assert PollPolicy.every(0.5) == PollPolicy(interval_s=0.5, compensate_sleep=False)


# --- trace and callback -----------------------------------------------------------------------------------------


def test_trace_contents() -> None:
    two = snap(dev(0, procs=[proc(7, GIB)]), dev(1, used=GIB, graphics=None, unknown={"processes.graphics": "x"}))
    exc = NotReady(27, "nvmlDeviceGetMemoryInfo_v2", 0)
    res, _ = wait(
        [(0, two), (1 * MS, exc), (2 * MS, idle(0, 1))],
        policy=PollPolicy.every(0.001),
        costs=[10 * US],
        keep_trace=True,
    )
    assert res.trace is not None
    assert [p.offset_ns for p in res.trace] == [10 * US, 1020 * US, 2030 * US, 3040 * US]
    assert [p.clean for p in res.trace] == [False, False, True, True]
    first, second, third, _ = res.trace
    assert first == TracePoint(10 * US, 10 * US, False, (0, 1), (GIB, GIB), (1, None), 0, None)
    assert first.total_used_bytes == 2 * GIB
    assert second.error == f"NotReady: {exc}"
    assert second.used_bytes == () and second.total_used_bytes is None  # nothing was read: unknown, not 0
    assert third.used_bytes == (0, 0) and third.process_counts == (0, 0)
    assert all(p.snapshot is None for p in res.trace)  # the kept trace stays small


def test_trace_unknown_memory_total_is_none() -> None:
    res, _ = wait([(0, snap(dev(0, memory=None)))], timeout=0.0, keep_trace=True, predicate=always())
    assert res.trace is not None and res.trace[0].total_used_bytes is None


def test_on_poll_sees_every_poll_with_its_snapshot() -> None:
    t = FakeTime()
    gpu = FakeGpu(t, [(0, BUSY), (3 * MS, CLEAN)])
    seen: list[TracePoint] = []
    predicate = default_predicate()
    poll_until(gpu, predicate, timeout=1.0, clock=t.clock, sleep=t.sleep, on_poll=seen.append)
    assert len(seen) == len(gpu.samples)
    assert seen[0].snapshot is BUSY and seen[-1].snapshot is CLEAN
    assert seen[0].offset_ns == 10 * US
    # the CLI's live line: who holds what, from the point alone
    assert seen[0].snapshot is not None
    assert predicate.evaluate(seen[0].snapshot).reasons[0] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"


def test_custom_predicate() -> None:
    res, _ = wait([(0, BUSY), (5 * MS, HELD)], predicate=no_processes())
    assert 5 * MS <= res.clean_ns <= 6 * MS + 10 * US
    err, _ = wait_timeout([(0, HELD)], predicate=memory_used_at_most(GIB), timeout=0.001)
    assert err.culprits[0].startswith("GPU 0: 16.0 GiB used with no visible process")


# --- probe: a cheaper snapshot that can only prove "not clean" ----------------------------------------------------


def probe_wait(
    timeline: Sequence[tuple[int, State]], *, timeout: float | None = 1.0, keep_trace: bool = False
) -> tuple[WaitResult, FakeGpu, FakeGpu]:
    t = FakeTime()
    full = FakeGpu(t, timeline, [50 * US])  # memory and three process lists (~50 µs on an H200)
    probe = FakeGpu(t, timeline, [18 * US], project=memory_only)  # memory only (~18 µs)
    res = poll_until(full, timeout=timeout, clock=t.clock, sleep=t.sleep, probe=probe, keep_trace=keep_trace)
    return res, full, probe


def test_probe_answers_while_memory_is_held() -> None:
    res, full, probe = probe_wait([(0, BUSY), (300 * MS, HELD), (328 * MS, CLEAN)], keep_trace=True)
    assert 328 * MS <= res.clean_ns <= 328 * MS + 1 * MS + 18 * US + 50 * US
    # full queries: the first poll, one per 100 ms for the status line, and the two that saw and confirmed clean
    assert len(full.samples) == 1 + 3 + 2
    assert res.partial_polls == len(probe.samples) - 1  # the last probe saw 0 B used and could not decide
    assert res.polls == res.partial_polls + len(full.samples)
    assert res.trace is not None
    partial = [p for p in res.trace if p.partial]
    assert len(partial) == res.partial_polls
    assert all(p.process_counts == (None,) and not p.clean for p in partial)
    assert [p.process_counts for p in res.trace if not p.partial][:1] == [(1,)]  # the first poll named the holder


def test_probe_never_proves_clean() -> None:
    # memory back to 0, but a process is still listed: the memory-only probe cannot decide, the full query can
    still = snap(dev(0, used=0, procs=[proc(99, None, name="zombie")]))
    t = FakeTime()
    full = FakeGpu(t, [(0, still)])
    probe = FakeGpu(t, [(0, still)], project=memory_only)
    with pytest.raises(WaitTimeout) as info:
        poll_until(full, timeout=0.05, clock=t.clock, sleep=t.sleep, probe=probe)
    assert info.value.culprits == ("GPU 0: pid 99 (zombie) holds an unknown amount (NVML: not available) (compute)",)
    assert len(full.samples) == info.value.polls  # every poll needed the full query


def test_timeout_after_a_probe_poll_still_names_the_holder() -> None:
    t = FakeTime()
    full = FakeGpu(t, [(0, BUSY)], [50 * US])
    probe = FakeGpu(t, [(0, BUSY)], [18 * US], project=memory_only)
    with pytest.raises(WaitTimeout) as info:
        poll_until(full, timeout=0.05, clock=t.clock, sleep=t.sleep, probe=probe)
    err = info.value
    assert err.culprits == (
        "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)",
        "GPU 0: 16.0 GiB used, above the 16.0 MiB limit",
    )
    assert err.snapshot is full.samples[-1][1]  # the last full snapshot names the holder...
    assert len(full.samples) == 1  # ...rather than a fresh full read after the deadline (a whole poll late)
    assert t.now - (START + 50 * MS) <= 18 * US  # overrun: the one probe query that crossed the deadline


def test_probe_errors_are_errors() -> None:
    t = FakeTime()
    flaky = Timeout(10, "nvmlDeviceGetMemoryInfo_v2", 0)
    full = FakeGpu(t, [(0, BUSY), (5 * MS, CLEAN)])
    probe = FakeGpu(t, [(0, BUSY), (2 * MS, flaky), (5 * MS, CLEAN)], project=memory_only)
    res = poll_until(full, timeout=1.0, clock=t.clock, sleep=t.sleep, probe=probe, keep_trace=True)
    assert res.trace is not None
    assert any(p.error is not None and "Timeout" in p.error for p in res.trace)
    assert res.clean_ns >= 5 * MS
    lost = GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 0)
    t = FakeTime()
    with pytest.raises(GpuLost):
        poll_until(
            FakeGpu(t, [(0, BUSY)]),
            timeout=1.0,
            clock=t.clock,
            sleep=t.sleep,
            probe=FakeGpu(t, [(0, BUSY), (3 * MS, lost)], project=memory_only),
        )


def test_probe_with_a_failure_falls_back_to_the_full_query() -> None:
    lost = GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1)
    t = FakeTime()
    full = FakeGpu(t, [(0, BUSY)])
    probe = FakeGpu(t, [(0, BUSY), (3 * MS, snap(failures=[failure(1, lost)]))], project=memory_only)
    # The probe's failure proves nothing: each poll goes on to the full query, which is the one judged (a GPU that
    # is really lost fails that read too, and is raised from there).
    with pytest.raises(WaitTimeout) as info:
        poll_until(full, timeout=0.01, clock=t.clock, sleep=t.sleep, probe=probe)
    # Every probe that ended before the deadline: one that ended past it is not followed by a full read (a second
    # pass begun after the deadline).
    after = [when for when, _ in probe.samples if START + 3 * MS < when < START + 10 * MS]
    assert after and len([w for w, _ in full.samples if w > START + 3 * MS]) == len(after)
    assert info.value.culprits[0] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"


# --- random timelines (hypothesis) ------------------------------------------------------------------------------

KINDS = ["clean", "busy", "held", "unknown", "failure", "error"]
_STATES: dict[str, State] = {
    "clean": CLEAN,
    "busy": BUSY,
    "held": HELD,
    "unknown": snap(dev(0, procs=None, unknown={"processes.compute": "NVML_ERROR_UNKNOWN (999)"})),
    "failure": snap(failures=[failure(0, Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 0))]),
    "error": Timeout(10, "nvmlDeviceGetComputeRunningProcesses_v3", 0),
}


@dataclass
class Scenario:
    stable: int
    interval: int
    confirm: int | None
    costs: list[int]
    timeout: int | None  # ns
    changes: list[tuple[int, str]]  # (offset from START, kind)
    keep_trace: bool
    probe_cost: int | None = None  # a memory-only probe, and what one costs
    full_every: int = 100 * MS

    @property
    def needed(self) -> int:
        return 1 if self.timeout == 0 else self.stable

    @property
    def period(self) -> int:
        """The longest time from one poll's end to the next's."""
        sleep = max(self.interval, self.interval if self.confirm is None else self.confirm)
        return sleep + (self.probe_cost or 0) + max(self.costs)

    def kind_at(self, t: int) -> str:
        kind = self.changes[0][1]
        for offset, k in self.changes:
            if START + offset <= t:
                kind = k
        return kind

    def clean_stretches(self) -> list[tuple[float, float]]:
        """Maximal [begin, end) intervals (absolute ns) where the timeline is clean; -inf/inf at the ends."""
        out: list[tuple[float, float]] = []
        begin: float | None = None
        for i, (offset, kind) in enumerate(self.changes):
            at = -math.inf if i == 0 else float(START + offset)
            if kind == "clean" and begin is None:
                begin = at
            elif kind != "clean" and begin is not None:
                out.append((begin, at))
                begin = None
        if begin is not None:
            out.append((begin, math.inf))
        return out


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    interval = draw(st.integers(0, 3 * MS))
    confirm = draw(st.one_of(st.none(), st.integers(0, interval)))
    costs = draw(st.lists(st.integers(50 * US, 1 * MS), min_size=1, max_size=4))
    timeout = draw(st.one_of(st.none(), st.just(0), st.integers(0, 40 * MS)))
    first = draw(st.integers(-5 * MS, 0))  # the timeline may have started before the wait
    durations = draw(st.lists(st.integers(0, 12 * MS), min_size=0, max_size=6))
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=len(durations) + 1, max_size=len(durations) + 1))
    if timeout is None:
        kinds[-1] = "clean"  # otherwise an endless wait
    changes = [(first, kinds[0])]
    at = first
    for d, k in zip(durations, kinds[1:], strict=True):
        at += d
        changes.append((at, k))
    return Scenario(
        stable=draw(st.integers(1, 4)),
        interval=interval,
        confirm=confirm,
        costs=costs,
        timeout=timeout,
        changes=changes,
        keep_trace=draw(st.booleans()),
        probe_cost=draw(st.one_of(st.none(), st.integers(10 * US, 200 * US))),
        full_every=draw(st.integers(0, 20 * MS)),
    )


def _has_run(flags: Sequence[bool], n: int) -> bool:
    run = 0
    for f in flags:
        run = run + 1 if f else 0
        if run >= n:
            return True
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_timelines(sc: Scenario) -> None:
    t = FakeTime()
    timeline = [(offset, _STATES[kind]) for offset, kind in sc.changes]
    gpu = FakeGpu(t, timeline, sc.costs)
    probe = FakeGpu(t, timeline, [sc.probe_cost], project=memory_only) if sc.probe_cost is not None else None
    policy = PollPolicy(
        interval_s=sc.interval / 1e9,
        confirm_interval_s=None if sc.confirm is None else sc.confirm / 1e9,
        full_every_s=sc.full_every / 1e9,
    )
    timeout_s = None if sc.timeout is None else sc.timeout / 1e9
    deadline = None if sc.timeout is None else START + sc.timeout
    result: WaitResult | None = None
    raised: WaitTimeout | None = None
    try:
        result = poll_until(
            gpu,
            timeout=timeout_s,
            policy=policy,
            stable_polls=sc.stable,
            clock=t.clock,
            sleep=t.sleep,
            keep_trace=sc.keep_trace,
            probe=probe,
        )
    except WaitTimeout as exc:
        raised = exc

    assert all((s is CLEAN) == (sc.kind_at(when) == "clean") for when, s in gpu.samples)  # a faithful fake
    # The polls, from the fakes' own records: a full query ends a poll; a probe ends one when it alone proves "not
    # clean" (memory held) or fails; otherwise the full query follows in the same poll.
    events = [(when, True, sc.kind_at(when)) for when, _ in gpu.samples]
    events += [(when, False, sc.kind_at(when)) for when, _ in (probe.samples if probe else [])]
    events.sort()
    polls = [
        (when, full and kind == "clean", kind) for when, full, kind in events
        if full or kind in ("busy", "held", "error")
    ]
    if raised is not None and len(polls) == raised.polls + 1:
        assert events[-1][1], "only a full query, for the timeout's message, may follow the last poll"
        polls.pop()
    times = [when for when, _, _ in polls]
    clean = [c for _, c, _ in polls]
    # The polls that saw the GPU held; one that failed or could not judge (unknown, an unreadable GPU) saw nothing.
    seen_held = [when for when, _, kind in polls if kind in ("busy", "held")]
    n = sc.needed
    P = sc.period

    # It never sleeps past the deadline, and stops at most one poll after it (plus, after a probe-only last poll,
    # one full query for the timeout's message).
    if deadline is not None:
        assert all(when + ns <= deadline for when, ns in t.sleeps)
        assert t.now <= deadline + (sc.probe_cost or 0) + 2 * max(sc.costs)
    assert all(ns <= P for _, ns in t.sleeps)

    # The first moment a clean stretch is *guaranteed* to have been confirmed, whatever the poll phase.
    guaranteed: float = math.inf
    for begin, end in sc.clean_stretches():
        t0 = max(begin, START)
        if end > t0 + n * P and (deadline is None or t0 + (n - 1) * P < deadline):
            guaranteed = min(guaranteed, t0 + n * P)

    if result is not None:
        assert result.clean
        assert result.polls == len(times)
        # clean iff the last n polls saw clean and no earlier run of n did
        assert all(clean[-n:]) and len(clean) >= n
        assert not _has_run(clean[:-1], n)
        assert result.elapsed_ns == times[-1] - START
        first_clean = START + result.clean_ns
        assert first_clean == times[-n]
        # never earlier than the true clean moment, at most one interval plus one query later
        begin = max(b for b, e in sc.clean_stretches() if b <= first_clean < e)
        assert begin <= first_clean
        assert first_clean - max(begin, START) <= P
        if len(times) > n:
            assert first_clean - times[-n - 1] <= P
        before = [when for when in seen_held if when < first_clean]
        assert result.last_dirty_ns == (before[-1] - START if before else None)
        if before:  # the bracket holds: the GPU was last seen held before the clean stretch began
            assert sc.kind_at(before[-1]) != "clean" and begin >= before[-1] - max(sc.costs)
        assert times[-1] <= guaranteed
        if sc.keep_trace:
            assert result.trace is not None
            assert [p.offset_ns for p in result.trace] == [x - START for x in times]
            assert [p.clean for p in result.trace] == clean
            assert sum(p.partial for p in result.trace) == result.partial_polls
    else:
        assert raised is not None
        assert deadline is not None
        assert not _has_run(clean, n)
        assert guaranteed == math.inf, "a clean stretch long enough to be seen was missed"
        last = events[-1]
        if not last[1] and last[0] >= deadline and (not times or last[0] > times[-1]):
            # The last poll's probe ended past the deadline without proving "held": its full read, a second pass
            # begun after the deadline, was not taken, and that poll is not one.
            assert all(x < deadline for x in times)
            assert raised.elapsed_ns == last[0] - START
        else:
            assert times[-1] >= deadline  # it kept polling up to the deadline
            assert all(x < deadline for x in times[:-1])  # and stopped at the first poll that reached it
            assert raised.elapsed_ns == times[-1] - START
        assert raised.polls == len(times)
        assert raised.culprits


@settings(max_examples=150, deadline=None)
@given(
    late=st.integers(0, 300 * US),
    cost=st.integers(5 * US, 200 * US),
    change=st.integers(0, 200 * MS),
    timeout=st.one_of(st.none(), st.integers(1 * MS, 250 * MS)),
)
def test_default_policy_with_late_wakeups(late: int, cost: int, change: int, timeout: int | None) -> None:
    """The default policy (confirmation interval, duty cap, sleep compensation) keeps the guarantees when sleeps
    wake up late, as real ones do."""
    t = FakeTime(late_ns=late)
    gpu = FakeGpu(t, [(0, BUSY), (change, CLEAN)], [cost])
    deadline = None if timeout is None else START + timeout
    # The longest time between polls: 1 ms, or 19 query costs when the 5 % duty cap stretches it, plus the query
    # and the sleep's lateness (the compensation only learns it over a few polls).
    period = max(1 * MS, 19 * cost) + cost + late
    try:
        res = poll_until(gpu, timeout=None if timeout is None else timeout / 1e9, clock=t.clock, sleep=t.sleep)
    except WaitTimeout:
        assert deadline is not None
        # A clean poll before the deadline is always followed by a confirming one, so the first clean poll must
        # have come at or after the deadline.
        assert START + change + period >= deadline
        assert t.now <= deadline + cost + late
        return
    assert res.clean_ns >= change
    assert res.clean_ns - change <= period
    # the confirmation follows quickly: 0.25 ms, not a whole interval
    assert res.elapsed_ns - res.clean_ns <= 250 * US + cost + late
    if deadline is not None:
        assert t.now <= deadline + cost + late


# --- deadline inside a poll (issue 12: a hung query overran the timeout by a whole poll) --------------------------


@dataclass
class SlowPasses:
    """A deadline-taking snapshot function: each pass makes ``queries`` queries of ``cost_ns`` each on the fake
    clock and checks the deadline between them, as the NVML backend does. Counts every query and every deadline it
    was handed."""

    time: FakeTime
    state: Snapshot
    queries: int = 4
    cost_ns: int = 300 * MS
    made: int = 0
    deadlines: list[Deadline | None] = field(default_factory=list)

    def __call__(self, deadline: Deadline | None) -> Snapshot:
        self.deadlines.append(deadline)
        for i in range(self.queries):
            if i and deadline is not None:
                deadline.check()  # between queries, never before the first
            self.time.now += self.cost_ns
            self.made += 1
        return self.state


def test_a_hung_query_overruns_the_timeout_by_one_query_not_a_whole_poll() -> None:
    # The user's report: 300 ms per query, timeout=1 returned after 2.13 s: the first pass makes ~7 queries
    # (identity, memory, three process lists), and it ran to its end, a whole poll past the deadline.
    t = FakeTime()
    gpu = SlowPasses(t, BUSY, queries=7)
    with pytest.raises(WaitTimeout) as info:
        poll_until(gpu, timeout=1.0, clock=t.clock, sleep=t.sleep, pass_deadline=True)
    deadline = START + 1000 * MS
    assert gpu.deadlines and all(d is not None and d.at_ns == deadline for d in gpu.deadlines)
    assert gpu.made == 4  # queries at 0.3, 0.6, 0.9 s, then one that crossed the deadline at 1.2 s
    assert t.now - deadline <= gpu.cost_ns
    err = info.value
    assert err.polls == 0 and err.snapshot is None  # the cut pass is not a poll
    assert err.culprits == ("no poll finished before the deadline (a query was still running when it passed)",)


def test_a_timeout_used_up_before_the_first_poll_is_said_as_such_not_as_a_query_still_running() -> None:
    # `wait --timeout 1e-9`: opening NVML used the timeout up, and the CLI hands on the least positive bound
    # (_deadline.left_s). Nothing was running when the deadline passed; the message said a query was.
    from nvmlcheck._deadline import USED_UP_S

    t = FakeTime()
    gpu = SlowPasses(t, BUSY, queries=7)
    with pytest.raises(WaitTimeout) as info:
        poll_until(gpu, timeout=USED_UP_S, clock=t.clock, sleep=t.sleep, pass_deadline=True)
    (line,) = info.value.culprits
    assert "used up before the first poll" in line and "still running" not in line
    assert line.startswith("no poll finished before the deadline")  # names no holder (errors._NOT_HOLDERS)


def test_the_pass_is_cut_on_the_injected_clock() -> None:
    # The poller's clock governs the deadline it hands down: a fake clock that never moves never expires it.
    t = FakeTime()
    frozen = SlowPasses(t, CLEAN, cost_ns=0)
    res = poll_until(frozen, timeout=1.0, clock=t.clock, sleep=t.sleep, pass_deadline=True)
    assert res.clean and frozen.made == 4 * res.polls
    d = frozen.deadlines[0]
    assert d is not None and d.clock == t.clock and d.at_ns == START + 1000 * MS and not d.expired()


def test_a_cut_pass_keeps_the_last_complete_poll_for_the_message() -> None:
    t = FakeTime()
    gpu = SlowPasses(t, BUSY, cost_ns=100 * MS)  # a poll takes 400 ms: polls end at 0.4 and 0.8+ s
    with pytest.raises(WaitTimeout) as info:
        poll_until(gpu, timeout=1.0, policy=PollPolicy.every(0.01), clock=t.clock, sleep=t.sleep, pass_deadline=True)
    err = info.value
    assert err.polls == 2 and err.snapshot is BUSY
    assert err.culprits[0] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"
    assert t.now - (START + 1000 * MS) <= 100 * MS


def test_a_cut_confirmation_poll_says_it_was_clean_but_unconfirmed() -> None:
    t = FakeTime()
    gpu = SlowPasses(t, CLEAN, cost_ns=150 * MS)  # 600 ms a poll: the confirming poll is cut at 1.05 s
    with pytest.raises(WaitTimeout) as info:
        poll_until(gpu, timeout=1.0, policy=PollPolicy.every(0.01), clock=t.clock, sleep=t.sleep, pass_deadline=True)
    assert info.value.polls == 1
    assert "clean at the last poll, but only 1 of the 2" in info.value.culprits[0]


def test_timeout_zero_hands_down_no_deadline_so_its_one_check_completes() -> None:
    t = FakeTime()
    gpu = SlowPasses(t, CLEAN)
    res = poll_until(gpu, timeout=0, clock=t.clock, sleep=t.sleep, pass_deadline=True)
    assert res.clean and res.polls == 1 and gpu.deadlines == [None] and gpu.made == 4


def test_no_timeout_hands_down_no_deadline() -> None:
    t = FakeTime()
    gpu = SlowPasses(t, CLEAN, cost_ns=10 * US)
    poll_until(gpu, timeout=None, clock=t.clock, sleep=t.sleep, pass_deadline=True)
    assert set(gpu.deadlines) == {None}


def test_the_probe_gets_the_deadline_too() -> None:
    t = FakeTime()
    full = SlowPasses(t, BUSY, cost_ns=50 * US)
    probe = SlowPasses(t, memory_only(BUSY), queries=1, cost_ns=18 * US)
    with pytest.raises(WaitTimeout):
        poll_until(full, timeout=0.05, clock=t.clock, sleep=t.sleep, probe=probe, pass_deadline=True)
    assert probe.deadlines and all(d is not None and d.at_ns == START + 50 * MS for d in probe.deadlines)


def test_deadline_helpers() -> None:
    t = FakeTime()
    d = Deadline.after(0.5, t.clock)
    assert d.at_ns == START + 500 * MS and d.remaining_s() == 0.5 and not d.expired()
    d.check()
    t.now += 500 * MS
    assert d.expired() and d.remaining_s() == 0.0
    with pytest.raises(DeadlinePassed):
        d.check()
    assert not issubclass(DeadlinePassed, NvmlCheckError)  # no handler of real errors may swallow it


# --- a timeout's structured holders -----------------------------------------------------------------------------

# GPU 0 held by a process; GPU 1 with 512 MiB used and nothing listed: clean under a 1 GiB limit, not under 16 MiB.
TWO = snap(dev(0, procs=[proc(4_000_123, 8 * GIB)]), dev(1, used=GIB // 2))


@pytest.mark.parametrize("predicate", [
    no_processes() & memory_used_at_most(GIB),  # nvmlcheck wait --max-used 1GiB
    on_devices([0], default_predicate()),  # the wait judges GPU 0 only
    pids_gone([4_000_123]),  # a kill's: the target off the lists
], ids=["max-used", "on-devices", "pids-gone"])
def test_timeout_holders_name_only_the_gpus_the_predicate_refused(predicate: Predicate) -> None:
    exc, _ = wait_timeout([(0, TWO)], predicate=predicate, timeout=0.01)
    assert all(c.startswith("GPU 0") for c in exc.culprits)
    assert {c.gpu for c in exc.holders} == {0}  # never GPU 1, which the wait judged clean
    assert [c.pid for c in exc.holders] == [4_000_123]


def test_timeout_holders_of_a_predicate_refusing_every_gpu_are_those_of_the_snapshot() -> None:
    exc, _ = wait_timeout([(0, TWO)], timeout=0.01)  # the default: 16 MiB, every GPU
    assert {c.gpu for c in exc.holders} == {0, 1}
    exc, _ = wait_timeout([(0, TWO)], predicate=no_processes() & memory_used_at_most(GIB), timeout=0,
                          stable_polls=1)
    assert {c.gpu for c in exc.holders} == {0}  # one check too


def test_a_timeout_with_no_snapshot_has_unknown_holders_never_none() -> None:
    """No poll finished (or every one failed): ``holders`` says the GPUs are unknown, of no one GPU, rather than an
    empty list that a tool reads as "nothing holds them" (the ``nvmlcheck/wait`` document's ``holders``)."""
    t = FakeTime()
    with pytest.raises(WaitTimeout) as info:
        poll_until(SlowPasses(t, BUSY, queries=7), timeout=1.0, clock=t.clock, sleep=t.sleep, pass_deadline=True)
    (h,) = info.value.holders
    assert (h.gpu, h.class_, h.kind, h.pid) == (None, "unknown", "query", None)
    assert h.reason.startswith("no poll finished before the deadline")
    failing, _ = wait_timeout([(0, Unknown(999, "nvmlDeviceGetCount_v2"))], timeout=0.01)
    assert failing.snapshot is None and failing.holders
    assert all(c.class_ == "unknown" and c.gpu is None for c in failing.holders)
