"""The poller's answers where a simpler loop goes wrong: what bounds the clean moment, the deadline when judging or
``on_poll`` is slow, a timeout too short to count in ns. Fake clocks only: no real sleeps, nothing timed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from snapshots import GIB, busy, dev, failure, idle, memory_only, snap

from nvmlcheck.errors import NvmlCheckError, Unknown, WaitTimeout
from nvmlcheck.model import DeviceState, Snapshot
from nvmlcheck.predicates import DevicePredicate, Predicate, memory_used_at_most, no_processes
from nvmlcheck.wait import PollPolicy, TracePoint, poll_until

START = 5_000_000_000
MS = 1_000_000

BUSY = busy(pid=1234, used=16 * GIB)
CLEAN = idle(0)
UNKNOWN = snap(dev(0, memory=None, unknown={"memory": "NVML_ERROR_UNKNOWN (999)"}))
UNREADABLE = snap(failures=[failure(0, Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 0))])
ERROR = Unknown(999, "nvmlDeviceGetComputeRunningProcesses_v3", 0)


class Fake:
    """A clock moved only by queries (``cost_ns`` each) and sleeps; answers come from ``states`` in order."""

    def __init__(self, states: Sequence[Snapshot | NvmlCheckError], cost_ns: int = MS) -> None:
        self.now = START
        self.cost_ns = cost_ns
        self._states: Iterator[Snapshot | NvmlCheckError] = iter(states)
        self.returned: list[int] = []  # when each query returned

    def clock(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)

    def snapshot(self) -> Snapshot:
        self.now += self.cost_ns
        self.returned.append(self.now - START)
        state = next(self._states)
        if isinstance(state, NvmlCheckError):
            raise state
        return state


# --- last_dirty_ns: the lower bound of the clean moment ----------------------------------------------------------


@pytest.mark.parametrize("blind", [ERROR, UNKNOWN, UNREADABLE], ids=["error", "unknown", "unreadable"])
def test_a_poll_that_saw_nothing_is_not_the_last_one_that_saw_the_gpu_held(blind: object) -> None:
    # Held, then 5 polls that could not tell, then clean: the holder may have left any time after the held poll, so
    # that poll, not the last blind one, bounds the clean moment from below.
    fake = Fake([BUSY, *[blind] * 5, CLEAN, CLEAN])  # type: ignore[list-item]
    res = poll_until(fake.snapshot, timeout=10, policy=PollPolicy.every(0.001), clock=fake.clock, sleep=fake.sleep)
    assert res.polls == 8
    assert res.clean_ns == fake.returned[6]
    assert res.last_dirty_ns == fake.returned[0]


def test_no_poll_saw_the_gpu_held_so_nothing_bounds_the_clean_moment() -> None:
    fake = Fake([ERROR, UNKNOWN, CLEAN, CLEAN])
    res = poll_until(fake.snapshot, timeout=10, policy=PollPolicy.every(0.001), clock=fake.clock, sleep=fake.sleep)
    assert res.clean_ns == fake.returned[2]
    assert res.last_dirty_ns is None


def test_a_readable_gpu_held_beside_an_unreadable_one_is_seen_held() -> None:
    both = snap(dev(1, procs=[]), failures=[failure(0, Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 0))])
    held = snap(dev(1, used=GIB), failures=[failure(0, Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 0))])
    clean = idle(0, 1)
    fake = Fake([held, both, clean, clean])
    res = poll_until(fake.snapshot, timeout=10, policy=PollPolicy.every(0.001), clock=fake.clock, sleep=fake.sleep)
    assert res.last_dirty_ns == fake.returned[0]  # GPU 1 held 1 GiB; the next poll could not judge GPU 0


def test_a_run_broken_by_a_blind_poll_is_confirmed_again() -> None:
    # Clean, unknown, clean, clean: two consecutive clean polls are still needed (the GPU may have been taken and
    # given back during the blind poll); no poll saw it held.
    fake = Fake([CLEAN, UNKNOWN, CLEAN, CLEAN])
    res = poll_until(fake.snapshot, timeout=10, policy=PollPolicy.every(0.001), clock=fake.clock, sleep=fake.sleep)
    assert res.polls == 4 and res.clean_ns == fake.returned[2] and res.last_dirty_ns is None


# --- the deadline when a poll's judging or on_poll is slow -------------------------------------------------------


def test_a_slow_on_poll_does_not_start_a_poll_after_the_deadline() -> None:
    fake = Fake([BUSY] * 10)
    calls: list[int] = []

    def on_poll(point: TracePoint) -> None:
        calls.append(point.offset_ns)
        fake.now += 3_000 * MS  # a status line written to a blocked terminal

    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, timeout=1.0, clock=fake.clock, sleep=fake.sleep, on_poll=on_poll)
    assert len(fake.returned) == 1 and len(calls) == 1  # the first poll ended before the deadline; no second one
    assert info.value.polls == 1
    assert info.value.elapsed_ns == 3_001 * MS  # the time really waited, on_poll included
    assert "pid 1234" in info.value.culprits[0]


def test_a_slow_on_poll_after_one_clean_poll_times_out_unconfirmed() -> None:
    fake = Fake([CLEAN] * 10)

    def on_poll(point: TracePoint) -> None:
        fake.now += 2_000 * MS

    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, timeout=1.0, clock=fake.clock, sleep=fake.sleep, on_poll=on_poll)
    assert len(fake.returned) == 1
    assert info.value.held is False and "only 1 of the 2" in info.value.culprits[0]


def test_a_poll_that_ends_before_the_deadline_is_followed_by_a_last_one_at_it() -> None:
    fake = Fake([BUSY, BUSY, CLEAN], cost_ns=MS)
    res = poll_until(fake.snapshot, no_processes(), timeout=0.010, stable_polls=1, policy=PollPolicy.every(0.004),
                     clock=fake.clock, sleep=fake.sleep)
    assert fake.returned == [1 * MS, 6 * MS, 11 * MS]  # the last sleep was cut to the deadline (10 ms)
    assert res.clean_ns == 11 * MS


# --- timeouts too short to count -----------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, 0.0, 1e-10, 4e-10])
def test_a_timeout_that_rounds_to_zero_ns_is_one_check_judged_alone(timeout: float) -> None:
    # Its deadline is the start, as timeout=0's: no second poll could begin before it, so stable_polls cannot apply.
    fake = Fake([CLEAN] * 3)
    res = poll_until(fake.snapshot, timeout=timeout, stable_polls=3, clock=fake.clock, sleep=fake.sleep)
    assert res.polls == 1 and len(fake.returned) == 1


# --- a timeout after a memory-only probe poll ------------------------------------------------------------------------


def test_a_timeout_after_a_probe_poll_names_what_the_probe_saw_when_the_last_full_read_was_clean() -> None:
    # Full reads: clean, then a failed one; the probe then sees 16 GiB held up to the deadline. The last full
    # snapshot is clean: it cannot name a holder, and "no detail, not held" would call a held GPU unjudged.
    fake = Fake([CLEAN, ERROR, *[BUSY] * 10])
    probes: list[int] = []

    def probe() -> Snapshot:
        fake.now += MS
        probes.append(fake.now - START)
        return memory_only(BUSY)

    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, timeout=0.0055, probe=probe, policy=PollPolicy.every(0.001), clock=fake.clock,
                   sleep=fake.sleep)
    assert len(fake.returned) == 2 and probes  # the timeout followed a probe-only poll
    assert info.value.held is True
    assert info.value.culprits == ("GPU 0: 16.0 GiB used, above the 16.0 MiB limit",)  # not "list unknown"


def test_a_timeout_after_a_probe_poll_names_the_processes_of_the_last_full_read_that_saw_them() -> None:
    fake = Fake([BUSY] * 10)

    def probe() -> Snapshot:
        fake.now += MS
        return memory_only(BUSY)

    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, timeout=0.0055, probe=probe, policy=PollPolicy.every(0.001), clock=fake.clock,
                   sleep=fake.sleep)
    assert info.value.held is True
    assert info.value.culprits[0] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"


# --- TracePoint.total_used_bytes: unknown is None, never 0 -----------------------------------------------------------


def test_the_total_of_a_poll_that_read_no_memory_is_unknown_not_zero() -> None:
    failed = TracePoint(1, 1, False, error="Unknown: nvmlDeviceGetMemoryInfo_v2 failed")
    unreadable = TracePoint(1, 1, False, (), (), (), failures=1)  # every selected GPU could not be read
    one_unread = TracePoint(1, 1, False, (1,), (GIB,), (0,), failures=1)  # GPU 0 unread, GPU 1 read
    assert failed.total_used_bytes is None
    assert unreadable.total_used_bytes is None
    assert one_unread.total_used_bytes is None  # not GPU 1's 1 GiB as the total
    assert TracePoint(1, 1, False, (0, 1), (GIB, 0), (1, 0)).total_used_bytes == GIB


@pytest.mark.parametrize(("snapshot_fn", "probe", "named"), [(5, None, "snapshot_fn"), (idle, 3, "probe")])
def test_a_snapshot_function_that_is_no_function_is_named_before_any_poll(snapshot_fn: object, probe: object,
                                                                          named: str) -> None:
    from nvmlcheck.errors import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match=f"poll_until's {named} must be a function"):
        poll_until(snapshot_fn, timeout=0, probe=probe)  # type: ignore[arg-type]


def test_on_devices_narrows_the_judgement_not_what_a_failure_of_another_gpu_does() -> None:
    # docs/waiting.md: a fatal failure of any GPU the wait reads ends it, even outside on_devices' selection.
    from nvmlcheck.errors import GpuLost
    from nvmlcheck.predicates import default_predicate, on_devices

    lost = snap(dev(0), failures=[failure(1, GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1))])
    only_0 = on_devices([0], default_predicate())
    assert only_0.check(lost) is True
    with pytest.raises(GpuLost, match="GPU 1"):
        poll_until(lambda: lost, only_0, timeout=0)


def test_a_failed_poll_after_a_probe_poll_still_names_what_was_seen_held_not_unread_lists() -> None:
    # Full reads: clean, then a failure; then the probe sees 16 GiB, then fails itself. The timeout names the failure
    # and the memory the probe saw, not "process list unknown" lines about lists a probe never reads.
    fake = Fake([CLEAN, *[ERROR] * 10])
    probes: Iterator[Snapshot | NvmlCheckError] = iter([memory_only(BUSY), *[ERROR] * 10])

    def probe() -> Snapshot:
        fake.now += MS
        state = next(probes)
        if isinstance(state, NvmlCheckError):
            raise state
        return state

    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, timeout=0.0075, probe=probe, policy=PollPolicy.every(0.001), clock=fake.clock,
                   sleep=fake.sleep)
    culprits = info.value.culprits
    assert culprits[0].startswith("the last poll failed (Unknown)")
    assert "GPU 0: 16.0 GiB used, above the 16.0 MiB limit" in culprits
    assert not any("process list unknown" in c for c in culprits)


def test_a_probe_that_ends_past_the_deadline_is_not_followed_by_a_full_read() -> None:
    # The probe could not prove "held" (memory back, lists unread), but the deadline passed while it read: the full
    # read would be a second pass after the deadline (a backend's pass always runs its first query).
    fake = Fake([BUSY] * 10)
    passed: list[bool] = []

    def probe(deadline: object) -> Snapshot:
        fake.now += 5 * MS  # a slow read: the deadline passes in it
        return memory_only(CLEAN)

    def full(deadline: object) -> Snapshot:
        passed.append(fake.now >= START + 2_500_000)
        return fake.snapshot()

    with pytest.raises(WaitTimeout) as info:
        poll_until(full, timeout=0.0025, probe=probe, pass_deadline=True, policy=PollPolicy.every(0.001),
                   clock=fake.clock, sleep=fake.sleep)
    assert passed == [False]  # the first poll's full read; none after the deadline
    assert info.value.polls == 1 and "pid 1234" in info.value.culprits[0]


# --- a timeout's holders: never empty for a GPU the predicate refused -------------------------------------------------

MIB = 1 << 20


class _Hot(DevicePredicate):
    """A predicate of one's own, on what no holder rule sees."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer

    def check_device(self, device: DeviceState) -> bool | None:
        return self.answer

    def describe(self) -> str:
        return "cool enough"


@pytest.mark.parametrize(("predicate", "class_", "reason"), [
    # 10 MiB used with no process: refused by a 1 MiB limit, within the holder rules' default 16 MiB.
    (memory_used_at_most(1 * MIB), "held", "10.0 MiB used with no visible process"),
    (_Hot(False), "held", "not cool enough"),
    (_Hot(None), "unknown", "cannot tell whether cool enough"),
], ids=["stricter-limit", "own-false", "own-unknown"])
def test_a_gpu_the_predicate_refused_has_a_holder_even_when_no_holder_rule_sees_it(
    predicate: Predicate, class_: str, reason: str
) -> None:
    # The holders were () (judged with the rules' own limit), which JSON readers take as "nothing holds it".
    fake = Fake([snap(dev(0, used=10 * MIB))] * 20)
    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, predicate, timeout=0.005, policy=PollPolicy.every(0.001), clock=fake.clock,
                   sleep=fake.sleep)
    (holder,) = info.value.holders
    assert (holder.gpu, holder.class_, holder.kind) == (0, class_, "predicate")
    assert holder.reason.startswith(reason) and not holder.reason.startswith("GPU 0")


def test_a_holder_the_rules_name_gets_no_predicate_line_beside_it() -> None:
    fake = Fake([BUSY] * 20)
    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, timeout=0.005, policy=PollPolicy.every(0.001), clock=fake.clock, sleep=fake.sleep)
    assert [h.kind for h in info.value.holders] == ["compute"]


class _Counted(DevicePredicate):
    def __init__(self) -> None:
        self.calls = 0

    def check_device(self, device: DeviceState) -> bool | None:
        self.calls += 1
        return False

    def describe(self) -> str:
        return "counted"


def test_a_timeout_judges_its_snapshot_once_not_once_per_use() -> None:
    # A predicate of one's own may be slow (docs: keep it cheap; it may not be): the message, the GPUs to blame and
    # the holders each asked it again after the deadline (4 to 6 calls per GPU, each as long as a poll's judgement).
    predicate = _Counted()
    fake = Fake([snap(dev(0))] * 20)
    with pytest.raises(WaitTimeout) as info:
        poll_until(fake.snapshot, predicate, timeout=0.005, policy=PollPolicy.every(0.001), clock=fake.clock,
                   sleep=fake.sleep)
    after = predicate.calls - info.value.polls  # each poll asks once per GPU
    assert after <= 3  # one check and one explanation (which checks again), once
    assert info.value.culprits == ("GPU 0: not counted",) and info.value.holders[0].kind == "predicate"
