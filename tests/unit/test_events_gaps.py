"""A listener says afterwards when it did not listen (``EventListener.gaps``): a wait or ``ready`` that ran while it
recovered, stalled or had not registered yet must not read as if every XID had been heard.

Fake event sources (tests/unit/fake_events.py) stand for the library; a stall is driven on an injected clock, hung
calls are released by the test. Nothing asserts how long anything took.
"""

from __future__ import annotations

import threading
import time

from fake_events import FakeEventCalls

from nvmlcheck import events as events_module
from nvmlcheck.errors import GpuLost, NotSupported
from nvmlcheck.events import EventKind, EventListener, EventTarget, GpuEvent, ListeningGap

_MS = 1_000_000


def _targets(n: int) -> list[EventTarget]:
    return [EventTarget(i, object(), f"GPU-{i}") for i in range(n)]


def _wait_for(predicate: object, what: str) -> None:
    """Until ``predicate()`` holds (the listener thread's work is asynchronous); 30 s at most, no duration asserted."""
    assert callable(predicate)
    end = time.monotonic() + 30.0
    while not predicate():
        assert time.monotonic() < end, what
        time.sleep(0.001)


def test_a_listener_that_listened_throughout_has_no_gap() -> None:
    listener = EventListener(FakeEventCalls(), _targets(2), id).start()
    try:
        assert listener.gaps() == ()
        assert listener.gaps([0], since_ns=time.monotonic_ns()) == ()
    finally:
        listener.stop()


def test_a_recovery_during_a_wait_is_a_gap_and_a_dropped_gpu_stays_one() -> None:
    source = FakeEventCalls()
    targets = _targets(2)
    listener = EventListener(source, targets, id).start()
    try:
        since = time.monotonic_ns()
        source.device_errors[1] = GpuLost(15, "nvmlDeviceGetSupportedEventTypes", 1)
        source.push_error(GpuLost(15, "nvmlEventSetWait_v2", None))
        source.push((id(targets[0].handle), 0x10, 0, None, None))  # delivered once the new set listens
        listener.next_events(0, 30.0)
        assert listener.state == "running" and listener.covered == frozenset({0}) and listener.kept == frozenset({0})
        # Before, nothing said it: the state was "running" again, the reason spoke of GPU 1 alone, and a wait on
        # GPU 0 that ran through the recovery read as if GPU 0 had been listened to throughout.
        rec, dropped = listener.gaps(since_ns=since)
        # GPU 0 listened to again; GPU 1 never: its gap goes on, as "dropped", from the same start.
        assert (rec.cause, rec.indices) == ("recovering", (0,)) and rec.ended_ns is not None
        assert rec.began_ns >= since and "nvmlEventSetWait_v2" in rec.why and "GPU_IS_LOST" in rec.why
        assert (dropped.cause, dropped.indices, dropped.ended_ns) == ("dropped", (1,), None)
        assert dropped.began_ns == rec.began_ns and "no longer listened to" in dropped.why
        # Narrowed to the GPUs asked about; a gap that ended before the wait began is not the wait's.
        assert [(g.cause, g.indices) for g in listener.gaps([0], since)] == [("recovering", (0,))]
        assert [g.cause for g in listener.gaps([0], rec.ended_ns + 1)] == []
        assert [g.cause for g in listener.gaps([1], rec.ended_ns + 1)] == ["dropped"]
        assert [g.cause for g in listener.gaps([1], since)] == ["dropped"]  # never "listening again"
    finally:
        listener.stop()


def test_a_stalled_wait_call_is_a_gap_while_it_lasts_and_after() -> None:
    now = [0]
    source = FakeEventCalls(block=True)  # the wait call returns when the test sets release
    listener = EventListener(source, _targets(2), id)
    listener._clock = lambda: now[0]
    listener.start()
    try:
        assert source.waiting.wait(30.0)
        assert listener.gaps() == ()  # in its slice: listening
        now[0] += int(events_module.STALLED_AFTER_S * 1e9) + 5 * _MS
        [open_gap] = listener.gaps([1])
        assert (open_gap.cause, open_gap.indices, open_gap.ended_ns) == ("stalled", (1,), None)
        source.waiting.clear()
        source.release.set()
        assert source.waiting.wait(30.0)
        _wait_for(lambda: listener.gaps() and listener.gaps()[0].ended_ns is not None, "the stall was not closed")
        # The same gap (its seq), now ended where the call returned; before, a stall that had ended left no trace.
        [closed] = listener.gaps()
        assert (closed.seq, closed.cause, closed.indices) == (open_gap.seq, "stalled", (0, 1))
        assert closed.ended_ns == now[0] and closed.began_ns == open_gap.began_ns
        assert "did not return for 1.0 s" in closed.why
    finally:
        source.release.set()
        listener.stop()


def test_a_registration_the_caller_went_on_without_is_a_gap_until_it_returns() -> None:
    source = FakeEventCalls(hang=("register",), hang_device=0)
    listener = EventListener(source, _targets(2), id)
    returned = threading.Event()

    def start() -> None:
        listener.start(time.monotonic_ns() + 20 * _MS)
        returned.set()

    threading.Thread(target=start, daemon=True).start()
    try:
        assert returned.wait(30.0)
        assert listener.state == "starting"
        [gap] = listener.gaps()
        assert (gap.cause, gap.indices, gap.ended_ns) == ("starting", (0, 1), None)
        assert "nvmlDeviceRegisterEvents on GPU 0 has not returned" in gap.why
        source.unhang.set()
        assert listener._registered.wait(30.0)
        by_cause = {g.cause: g for g in listener.gaps()}
        # Ended once the registration returned; GPU 1, whose turn came after the deadline, was never registered.
        assert by_cause["starting"].seq == gap.seq and by_cause["starting"].ended_ns is not None
        assert by_cause["unregistered"].indices == (1,) and by_cause["unregistered"].ended_ns is None
        assert listener.gaps([0], since_ns=by_cause["starting"].ended_ns + 1) == ()
    finally:
        source.unhang.set()
        listener.stop()


def test_a_gpu_never_registered_is_a_gap_from_the_start() -> None:
    source = FakeEventCalls()
    targets = _targets(2)
    source.device_errors[1] = NotSupported(3, "nvmlDeviceGetSupportedEventTypes", 1)
    listener = EventListener(source, targets, id).start()
    try:
        assert listener.covered == frozenset({0})
        [gap] = listener.gaps()
        assert (gap.cause, gap.indices, gap.ended_ns) == ("unregistered", (1,), None)
        assert "NOT_SUPPORTED" in gap.why
        assert listener.gaps([0]) == ()
    finally:
        listener.stop()


def test_an_unsupported_listener_is_a_gap_on_every_gpu_asked_about() -> None:
    listener = EventListener.unavailable("the smi backend has no events")
    [gap] = listener.gaps([2, 0])
    assert (gap.cause, gap.indices, gap.ended_ns, gap.why) == ("unregistered", (0, 2), None,
                                                               "the smi backend has no events")
    assert "every GPU" in listener.gaps()[0].line()


def test_a_gap_reads_as_a_line_and_as_json() -> None:
    gap = ListeningGap(3, "recovering", (0, 1), 1_000 * _MS, 1_250 * _MS, "nvmlEventSetWait_v2 failed: X")
    assert gap.line() == "events not listened to on GPUs 0, 1 for 250.0 ms: recovering: nvmlEventSetWait_v2 failed: X"
    assert gap.to_json() == {"seq": 3, "cause": "recovering", "gpus": [0, 1], "began_ns": 1_000 * _MS,
                             "ended_ns": 1_250 * _MS, "lasted_s": 0.25, "why": "nvmlEventSetWait_v2 failed: X"}
    long = ListeningGap(5, "stalled", (0,), 0, 2_500 * _MS, "y")
    assert long.line() == "events not listened to on GPU 0 for 2.5 s: stalled: y"
    still = ListeningGap(4, "dropped", (1,), 0, None, "GPU lost")
    assert still.line() == "events not listened to on GPU 1 (still not): dropped: GPU lost"
    assert still.to_json()["ended_ns"] is None and still.to_json()["lasted_s"] is None


def test_the_kept_gaps_are_bounded() -> None:
    listener = EventListener(FakeEventCalls(), _targets(1), id)
    with listener._cond:
        for _ in range(events_module.MAX_KEPT_GAPS + 1):
            listener._close_gap(listener._open_gap("stalled", [0], "x"))
        kept = len(listener._gaps)
    assert kept <= events_module.MAX_KEPT_GAPS


def _event(kind: EventKind) -> GpuEvent:
    return GpuEvent(0, "GPU-0", kind, None, 0, 0.0)


def test_fatal_poison_and_gpu_unavailable_stop_a_wait_nonfatal_poison_does_not() -> None:
    # Before, both were recorded only: a wait called a GPU clean that NVML had just called poisoned or unavailable.
    assert _event(EventKind.FATAL_POISON).fatal and _event(EventKind.GPU_UNAVAILABLE).fatal
    assert _event(EventKind.DOUBLE_BIT_ECC).fatal
    assert not _event(EventKind.NONFATAL_POISON).fatal and not _event(EventKind.SINGLE_BIT_ECC).fatal
    fault = _event(EventKind.GPU_UNAVAILABLE).fault()
    assert fault.kind == "gpu_unavailable" and "unavailable" in fault.meaning


class _WatchedRLock:
    """A re-entrant lock that says (``blocked``) when the listener thread has to wait for it: the test holds it and
    reads the gaps (re-entering it) at the moment the thread has returned from its call but not yet recorded it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.blocked = threading.Event()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        if threading.current_thread().name == "nvmlcheck events":
            self.blocked.set()
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    # What threading.Condition asks of a re-entrant lock (else it takes the lock for not owned: acquire(False)
    # succeeds for its owner).
    def _is_owned(self) -> bool:
        return bool(self._lock._is_owned())  # type: ignore[attr-defined]

    def _release_save(self) -> object:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: object) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_stall_that_just_ended_is_never_missing_from_the_gaps() -> None:
    now = [0]
    source = FakeEventCalls(block=True)
    listener = EventListener(source, _targets(1), id)
    listener._clock = lambda: now[0]
    listener.start()
    lock = _WatchedRLock()
    listener._cond = threading.Condition(lock)  # type: ignore[arg-type]
    try:
        assert source.waiting.wait(30.0)
        now[0] += int(events_module.STALLED_AFTER_S * 1e9)
        with lock:  # a wait reading the gaps holds the lock as the stalled call returns
            source.release.set()
            assert lock.blocked.wait(30.0)  # returned, and waiting for the lock to record the stall
            # Before, the call was said returned (no stall in flight) before the stall was recorded: a wait that
            # read the gaps then found none, and said its GPU listened to throughout.
            assert [g.cause for g in listener.gaps()] == ["stalled"]
        _wait_for(lambda: listener.gaps() and listener.gaps()[0].ended_ns is not None, "the stall was not kept")
        assert [g.cause for g in listener.gaps()] == ["stalled"]
    finally:
        source.release.set()
        listener.stop()


def test_a_recovery_that_ends_the_listener_is_one_gap_that_never_ends() -> None:
    source = FakeEventCalls()
    listener = EventListener(source, _targets(2), id).start()
    try:
        since = time.monotonic_ns()
        for i in (0, 1):
            source.device_errors[i] = GpuLost(15, "nvmlDeviceGetSupportedEventTypes", i)
        source.push_error(GpuLost(15, "nvmlEventSetWait_v2", None))
        assert listener.next_events(0, 30.0) == ([], 0)  # returns once the listener has failed
        assert listener.state == "failed"
        # Not "recovering" ended (a watch said "listening again") and then "failed": one gap, from the error on.
        [gap] = listener.gaps(since_ns=since)
        assert (gap.cause, gap.indices, gap.ended_ns) == ("failed", (0, 1), None)
        assert gap.began_ns >= since and "no GPU is listened to any more" in gap.why
    finally:
        listener.stop()
