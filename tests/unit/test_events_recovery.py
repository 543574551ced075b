"""The listener's recovery after a wait error: its state never claims events it does not hear, a transient
answer does not drop a healthy GPU, and an event is received when it is recorded (a wait's check that missed it
never precedes its time).

Fake event sources (tests/unit/fake_events.py) stand for the library: a hung call blocks until the test releases
it. Nothing here measures time: the interleavings are forced with the fake and a lock the test holds.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fake_events import FakeEventCalls

from nvmlcheck import events as events_module
from nvmlcheck.errors import GpuLost, InvalidArgument, NotReady, Unknown
from nvmlcheck.events import RECOVERY_ATTEMPTS, EventListener, EventTarget


def _targets(n: int) -> list[EventTarget]:
    return [EventTarget(i, object(), f"GPU-{i}") for i in range(n)]


def _lose(source: FakeEventCalls, index: int) -> None:
    """GPU ``index`` falls off the bus: it answers GPU_IS_LOST, and the set's wait does once."""
    source.device_errors[index] = GpuLost(15, "nvmlDeviceGetSupportedEventTypes", index)
    source.push_error(GpuLost(15, "nvmlEventSetWait_v2", None))


def _until(predicate: Any, listener: EventListener) -> None:
    """Wait (on the listener's own condition, notified at each change of state) until ``predicate()``."""
    with listener._cond:
        assert listener._cond.wait_for(predicate, 30.0)


def test_a_probe_that_hangs_leaves_the_listener_recovering_not_running() -> None:
    # GPU 1's registration probe passes; its probe after the wait error hangs (a GPU falling off the bus).
    source = FakeEventCalls(hang=("supported",), hang_device=1, hang_after=1)
    targets = _targets(2)
    listener = EventListener(source, targets, id).start()
    try:
        assert listener.state == "running" and listener.covered == frozenset({0, 1})
        _lose(source, 1)
        assert source.hung.wait(30.0)
        # Before, the state said "running" (and the reason nothing) while the thread hung in the probe: waits and
        # ready believed every GPU was listened to, and an XID 79 meanwhile was never heard.
        assert listener.state == "recovering" and not listener.active
        reason = listener.reason or ""
        assert reason.startswith("recovering after nvmlEventSetWait_v2")
        assert "nvmlDeviceGetSupportedEventTypes on GPU 1 has not returned" in reason
        assert "waits poll without events" in reason
        assert listener.covered == frozenset()
        assert set(listener.device_reasons) == {0, 1}
        assert all("while the listener recovers" in why for why in listener.device_reasons.values())
        # The call returns (GPU 1 lost): GPU 0 is listened to again on a new set.
        source.unhang.set()
        _until(lambda: listener._state != "recovering", listener)
        assert listener.state == "running" and listener.covered == frozenset({0})
        assert "NVML_ERROR_GPU_IS_LOST" in listener.device_reasons[1] and 0 not in listener.device_reasons
        source.push((id(targets[0].handle), 0x8, 79, None, None))
        assert listener.sleep(30.0)
    finally:
        source.unhang.set()
        listener.stop()


@pytest.mark.parametrize("call", ["create", "register"])
def test_a_rebuild_call_that_hangs_is_named_too(call: str) -> None:
    # Create and both registrations pass (create once, register twice); the recovery's own call hangs.
    source = FakeEventCalls(hang=(call,), hang_after=1 if call == "create" else 2)
    listener = EventListener(source, _targets(2), id).start()
    try:
        _lose(source, 1)
        assert source.hung.wait(30.0)
        fn = {"create": "nvmlEventSetCreate", "register": "nvmlDeviceRegisterEvents on GPU 0"}[call]
        assert listener.state == "recovering" and f"{fn} has not returned" in (listener.reason or "")
    finally:
        source.unhang.set()
        listener.stop()


def test_a_free_that_hangs_is_recovering_not_running() -> None:
    source = FakeEventCalls()
    freeing, unfree = threading.Event(), threading.Event()
    plain_free = source.free

    def free(event_set: object) -> int:
        freeing.set()
        unfree.wait(30.0)
        return plain_free(event_set)

    source.free = free  # type: ignore[method-assign]
    listener = EventListener(source, _targets(2), id).start()
    try:
        _lose(source, 1)
        assert freeing.wait(30.0)
        # Before, the new set was published ("running") and the old one freed after: a free that hung left the
        # listener "running" with nothing waiting on the new set.
        assert listener.state == "recovering" and "nvmlEventSetFree has not returned" in (listener.reason or "")
        unfree.set()
        _until(lambda: listener._state != "recovering", listener)
        assert listener.state == "running" and listener.covered == frozenset({0})
    finally:
        unfree.set()
        listener.stop()


def test_a_stop_that_gives_up_a_hung_probe_says_so_and_leaves_it_nothing_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_module, "STOP_TIMEOUT_S", 0.05)
    source = FakeEventCalls(hang=("supported",), hang_device=1, hang_after=1)
    listener = EventListener(source, _targets(2), id).start()
    _lose(source, 1)
    assert source.hung.wait(30.0)
    thread = listener.thread
    listener.stop()
    assert listener.state == "stopped"
    assert "its recovery (nvmlDeviceGetSupportedEventTypes on GPU 1 had not returned)" in (listener.reason or "")
    registered = len(source.registered)
    source.unhang.set()
    assert thread is not None
    thread.join(30.0)
    # It returned after the stop: no new set registered, nothing freed (NVML's shutdown may have run meanwhile).
    assert not thread.is_alive() and listener.state == "stopped"
    assert len(source.registered) == registered and source.freed == []


def test_a_transient_probe_error_does_not_drop_a_healthy_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "RECOVERY_RETRY_S", 0.0)
    source = FakeEventCalls()
    listener = EventListener(source, _targets(2), id).start()
    try:
        assert RECOVERY_ATTEMPTS >= 3
        # GPU 0 is lost; GPU 1 answers UNKNOWN, then NOT_READY, then its mask.
        source.device_errors[1] = [Unknown(999, "nvmlDeviceGetSupportedEventTypes", 1),
                                   NotReady(27, "nvmlDeviceGetSupportedEventTypes", 1)]
        _lose(source, 0)
        _until(lambda: listener._state != "running" or 0 in listener._device_reasons, listener)
        _until(lambda: listener._state != "recovering", listener)
        # Before, the first UNKNOWN dropped GPU 1 for good: with GPU 0 lost, the listener failed ("no GPU is
        # listened to any more") and heard nothing from either.
        assert listener.state == "running" and listener.covered == frozenset({1})
        assert source.probes[-3:] == [1, 1, 1] and set(listener.device_reasons) == {0}
    finally:
        listener.stop()


def test_a_gpu_dropped_after_transient_answers_says_how_often_it_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "RECOVERY_RETRY_S", 0.0)
    source = FakeEventCalls()
    listener = EventListener(source, _targets(2), id).start()
    try:
        source.device_errors[1] = Unknown(999, "nvmlDeviceGetSupportedEventTypes", 1)  # every time
        source.device_errors[0] = InvalidArgument(2, "nvmlDeviceGetSupportedEventTypes", 0)  # not transient
        before = len(source.probes)
        source.push_error(Unknown(999, "nvmlEventSetWait_v2", None))
        _until(lambda: listener._state not in ("running", "recovering"), listener)
        probes = source.probes[before:]
        # Bounded: asked RECOVERY_ATTEMPTS times, not until it answers; a lasting error asked once.
        assert probes.count(1) == RECOVERY_ATTEMPTS and probes.count(0) == 1
        assert listener.state == "failed"
        reason = listener.reason or ""
        assert "GPU 1: no longer listened to: nvmlEventSetWait_v2" in reason
        assert f"(asked {RECOVERY_ATTEMPTS} times: a transient error each time)" in reason
        assert "GPU 0: " in reason and "asked" not in reason.split("GPU 1:")[0]
    finally:
        listener.stop()


class _WatchedLock:
    """A lock that says (``blocked``) when the listener thread has to wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
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

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_an_event_a_check_missed_is_never_stamped_before_that_check() -> None:
    source = FakeEventCalls()
    targets = _targets(1)
    listener = EventListener(source, targets, id).start()
    lock = _WatchedLock()
    listener._cond = threading.Condition(lock)  # type: ignore[arg-type]
    try:
        with lock:  # a wait's check holds the listener's lock
            source.push((id(targets[0].handle), 0x8, 79, None, None))  # XID 79: the next wait slice returns it
            assert lock.blocked.wait(30.0)  # the listener thread has it in hand and waits for the lock
            checked_ns = time.monotonic_ns()
            assert listener._first_fatal(None, 0) is None  # the check finds nothing: the wait may call it clean
        assert listener.sleep(30.0)
        ev = listener.fatal()
        assert ev is not None and ev.xid == 79
        # Before, the event was stamped before the lock was taken: a fatal event recorded as received before the
        # check that missed it (the wait returned clean after a fault its listener had "received").
        assert ev.time_ns > checked_ns
    finally:
        listener.stop()


def test_a_wait_call_that_does_not_return_is_said_stalled_not_running() -> None:
    now = [0]
    source = FakeEventCalls(block=True)  # each wait returns when the test sets release: a call that hangs
    listener = EventListener(source, _targets(2), id)
    listener._clock = lambda: now[0]  # the test's clock: the thread reads when its call began on it
    listener.start()
    try:
        assert source.waiting.wait(30.0)
        assert listener.state == "running" and listener.reason is None  # in its slice: listening
        now[0] += int(events_module.STALLED_AFTER_S * 1e9)
        # Before, "running" for as long as the call hung: waits and ready counted on events that nobody heard.
        assert listener.state == "stalled" and not listener.active and listener.covered == frozenset()
        reason = listener.reason or ""
        assert reason.startswith("stalled: nvmlEventSetWait_v2 has not returned for 1.0 s")
        assert "GPUs not listened to meanwhile: 0, 1" in reason
        assert set(listener.device_reasons) == {0, 1}
        # The call returns: listening again (the next call began on the test's clock as it is now).
        source.waiting.clear()
        source.release.set()
        assert source.waiting.wait(30.0)
        assert listener.state == "running" and listener.reason is None and listener.covered == frozenset({0, 1})
    finally:
        source.release.set()
        listener.stop()


def test_a_transient_answer_during_the_registration_does_not_leave_a_gpu_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_module, "RECOVERY_RETRY_S", 0.0)
    source = FakeEventCalls()
    source.device_errors[1] = [Unknown(999, "nvmlDeviceGetSupportedEventTypes", 1),
                               NotReady(27, "nvmlDeviceGetSupportedEventTypes", 1)]
    listener = EventListener(source, _targets(2), id).start()
    try:
        # Before, GPU 1 was "not registered: nvmlDeviceGetSupportedEventTypes: NVML_ERROR_UNKNOWN" for good.
        assert listener.state == "running" and listener.covered == frozenset({0, 1})
        assert listener.device_reasons == {} and source.probes == [0, 1, 1, 1]
    finally:
        listener.stop()


def test_a_lasting_transient_answer_during_the_registration_is_asked_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(events_module, "RECOVERY_RETRY_S", 0.0)
    source = FakeEventCalls(create_error=Unknown(999, "nvmlEventSetCreate", None))
    listener = EventListener(source, _targets(1), id).start()
    assert listener.state == "unsupported"
    assert f"(asked {RECOVERY_ATTEMPTS} times: a transient error each time)" in (listener.reason or "")
    source = FakeEventCalls()
    source.device_errors[0] = Unknown(999, "nvmlDeviceGetSupportedEventTypes", 0)
    listener = EventListener(source, _targets(1), id).start()
    assert listener.state == "unsupported" and source.probes == [0] * RECOVERY_ATTEMPTS
    assert f"asked {RECOVERY_ATTEMPTS} times" in listener.device_reasons[0]
