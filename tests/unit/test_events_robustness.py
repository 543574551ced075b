"""The listener never hangs its caller in a registration call, and one GPU's failure does not end listening on the
others.

Fake event sources (tests/unit/fake_events.py) stand for the library: a hung call blocks until the test releases
it. Deadlines are given on a clock the test reads; nothing asserts how long anything took.
"""

from __future__ import annotations

import threading
import time

import pytest
from fake_events import FakeEventCalls

from nvmlcheck.errors import GpuLost, InvalidArgument, Unknown
from nvmlcheck.events import EventListener, EventTarget

_MS = 1_000_000


def _targets(n: int) -> list[EventTarget]:
    return [EventTarget(i, object(), f"GPU-{i}") for i in range(n)]


def _start_bounded(listener: EventListener, within_ms: int) -> None:
    """``listener.start`` with a deadline ``within_ms`` from now, in a helper thread the test joins: a start that
    hangs fails the test instead of hanging it."""
    returned = threading.Event()

    def start() -> None:
        listener.start(time.monotonic_ns() + within_ms * _MS)
        returned.set()

    threading.Thread(target=start, daemon=True).start()
    assert returned.wait(30.0), "start() did not return at its deadline: a hung registration hung its caller"


@pytest.mark.parametrize("call", ["create", "supported", "register"])
def test_a_hung_registration_of_the_first_gpu_ends_at_the_deadline(call: str) -> None:
    source = FakeEventCalls(hang=(call,), hang_device=0)
    listener = EventListener(source, _targets(2), id)
    try:
        _start_bounded(listener, 50)
        assert source.hung.is_set()
        # Before, start() waited in the call for as long as it took (for ever on a wedged driver), and the wait,
        # ready or kill that started it with it.
        assert listener.state == "starting" and not listener.active
        reason = listener.reason or ""
        fn = {"create": "nvmlEventSetCreate", "supported": "nvmlDeviceGetSupportedEventTypes",
              "register": "nvmlDeviceRegisterEvents"}[call]
        assert fn in reason and "has not returned" in reason and "GPUs not registered: 0, 1" in reason
        assert set(listener.device_reasons) == {0, 1}
        assert all(why.startswith("not registered: ") for why in listener.device_reasons.values())
        assert listener.covered == frozenset()
        # The call returns: the listener runs on what it registered, and says what it did not.
        source.unhang.set()
        assert listener._registered.wait(30.0)
        assert listener.state == "running" and 0 in listener.covered
        assert listener.reason is None or "GPU 1" in listener.reason
    finally:
        source.unhang.set()
        listener.stop()


def test_stop_does_not_wait_for_a_hung_registration() -> None:
    source = FakeEventCalls(hang=("register",))
    listener = EventListener(source, _targets(1), id)
    _start_bounded(listener, 20)
    thread = listener.thread
    assert thread is not None and thread.is_alive()
    stopped = threading.Event()

    def stop() -> None:
        listener.stop()
        stopped.set()

    threading.Thread(target=stop, daemon=True).start()
    # Before, stop() joined a thread that could not return (STOP_TIMEOUT_S on every close of such a session).
    assert stopped.wait(30.0) and thread.is_alive()
    assert listener.state == "stopped" and "nvmlDeviceRegisterEvents on GPU 0 had not returned" in (
        listener.reason or "")
    source.unhang.set()
    thread.join(30.0)
    assert not thread.is_alive()
    # The registration returned after the stop: the listener stays stopped, it never starts listening.
    assert listener.state == "stopped" and not listener.active and source.timeouts == []


def test_a_registration_without_deadline_is_waited_for() -> None:
    # No deadline asked (listen(), watch): the caller waits for the registration, as before.
    source = FakeEventCalls()
    listener = EventListener(source, _targets(2), id).start()
    try:
        assert listener.state == "running" and listener.covered == frozenset({0, 1})
    finally:
        listener.stop()


def test_a_lost_gpu_ends_listening_on_it_alone() -> None:
    source = FakeEventCalls()
    targets = _targets(2)
    listener = EventListener(source, targets, id).start()
    try:
        assert listener.covered == frozenset({0, 1})
        first_set = source.registered[0][2]
        # GPU 1 falls off the bus: the set's wait answers GPU_IS_LOST, and GPU 1 itself does too.
        source.device_errors[1] = GpuLost(15, "nvmlDeviceGetSupportedEventTypes", 1)
        source.push_error(GpuLost(15, "nvmlEventSetWait_v2", None))
        source.push((id(targets[0].handle), 0x8, 79, None, None))
        seen, _ = listener.next_events(0, 30.0)
        # Before, the error ended the listener for every GPU (state "failed"): the XID 79 on GPU 0 went unheard.
        assert [(e.index, e.xid) for e in seen] == [(0, 79)]
        assert listener.state == "running" and listener.covered == frozenset({0})
        assert set(listener.device_reasons) == {1}
        assert "no longer listened to" in listener.device_reasons[1]
        assert "NVML_ERROR_GPU_IS_LOST" in listener.device_reasons[1]
        assert "GPU 1" in (listener.reason or "") and "GPU 0" not in (listener.reason or "")
        # GPU 0 was registered again, with its mask, on a new set; the old one (which keeps failing) was freed.
        again = [r for r in source.registered if r[2] is not first_set]
        assert [(i, m) for i, m, _ in again] == [(0, source.registered[0][1])]
        assert first_set in source.freed
    finally:
        listener.stop()


def test_every_gpu_lost_fails_the_listener_naming_each() -> None:
    source = FakeEventCalls()
    listener = EventListener(source, _targets(2), id).start()
    for i in (0, 1):
        source.device_errors[i] = GpuLost(15, "nvmlDeviceGetSupportedEventTypes", i)
    source.push_error(GpuLost(15, "nvmlEventSetWait_v2", None))
    assert listener.next_events(0, 30.0) == ([], 0)
    assert listener.state == "failed"
    assert "GPU 0" in (listener.reason or "") and "GPU 1" in (listener.reason or "")
    listener.stop()


def test_a_lasting_error_no_gpu_answers_itself_fails_the_listener_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck import events as events_module

    monkeypatch.setattr(events_module, "RECOVERY_RETRY_S", 0.0)
    source = FakeEventCalls(wait_error=Unknown(999, "nvmlEventSetWait_v2", None))  # every wait, every set
    listener = EventListener(source, _targets(2), id).start()
    assert listener.next_events(0, 30.0) == ([], 0)
    assert listener.state == "failed"
    reason = listener.reason or ""
    assert "no GPU of the set answers an error itself" in reason
    assert f"{events_module.RECOVERY_ATTEMPTS} times in a row, on a new set each time" in reason
    assert len(source.timeouts) == events_module.RECOVERY_ATTEMPTS  # bounded: one wait per set
    listener.stop()


def test_a_lasting_error_no_gpu_answers_itself_fails_at_once() -> None:
    source = FakeEventCalls()
    listener = EventListener(source, _targets(2), id).start()
    source.push_error(InvalidArgument(2, "nvmlEventSetWait_v2", None))
    assert listener.next_events(0, 30.0) == ([], 0)
    assert listener.state == "failed" and "no GPU of the set answers an error itself)" in (listener.reason or "")
    listener.stop()


def test_a_transient_error_no_gpu_answers_itself_is_given_a_new_set() -> None:
    source = FakeEventCalls()
    targets = _targets(2)
    listener = EventListener(source, targets, id).start()
    first_set = source.registered[0][2]
    source.push_error(Unknown(999, "nvmlEventSetWait_v2", None))  # once
    source.push((id(targets[1].handle), 0x8, 79, None, None))
    seen, _ = listener.next_events(0, 30.0)
    # Before, one NVML_ERROR_UNKNOWN from the wait ended listening on every GPU (state "failed"): the XID 79 that
    # followed went unheard.
    assert [(e.index, e.xid) for e in seen] == [(1, 79)]
    assert listener.state == "running" and listener.covered == frozenset({0, 1}) and listener.reason is None
    assert first_set in source.freed and {i for i, _m, st in source.registered if st is not first_set} == {0, 1}
    listener.stop()


def test_a_stop_during_an_ordinary_registration_frees_the_set() -> None:
    # No deadline: start() waits; stop() from another thread meanwhile, then the call returns (not overdue: the
    # thread is waited for, and the set it made is freed, not left registered and queueing events for ever).
    source = FakeEventCalls(hang=("register",))
    listener = EventListener(source, _targets(1), id)
    threading.Thread(target=listener.start, daemon=True).start()
    assert source.hung.wait(30.0)
    stopper = threading.Thread(target=listener.stop, daemon=True)
    stopper.start()
    # The call returns once stop() has asked the thread to stop. Released at once, it could return first when the
    # stopper thread had not run yet (two loaded cores): the listener then ran and made a wait call, and the
    # `timeouts == []` below failed. That order is another test's (a stop after the listener runs).
    end = time.monotonic() + 30.0
    while not listener._stop.is_set():
        assert time.monotonic() < end, "stop() did not ask the thread to stop"
        time.sleep(0.001)
    source.unhang.set()
    stopper.join(30.0)
    assert not stopper.is_alive()
    assert listener.state == "stopped" and len(source.freed) == 1 and source.timeouts == []


def test_a_stop_that_gives_up_a_hung_rebuild_leaves_the_thread_nothing_to_touch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nvmlcheck import events as events_module

    monkeypatch.setattr(events_module, "STOP_TIMEOUT_S", 0.05)
    # Both GPUs register; GPU 1 is lost; registering GPU 0 again on the new set hangs.
    source = FakeEventCalls(hang=("register",), hang_after=2)
    targets = _targets(2)
    listener = EventListener(source, targets, id).start()
    assert listener.covered == frozenset({0, 1})
    source.device_errors[1] = GpuLost(15, "nvmlDeviceGetSupportedEventTypes", 1)
    source.push_error(GpuLost(15, "nvmlEventSetWait_v2", None))
    assert source.hung.wait(30.0)
    thread = listener.thread
    listener.stop()  # gives the thread up: it is in a call that has not returned
    assert listener.state == "stopped" and "did not return" in (listener.reason or "")
    source.unhang.set()
    assert thread is not None
    thread.join(30.0)
    # The thread returned after the stop: it neither published the new set nor freed the old one (NVML's shutdown
    # may have run meanwhile; a set freed after it is a stale handle).
    assert not thread.is_alive() and listener.state == "stopped"
    assert source.freed == [] and listener._set is None


def test_a_listener_starting_at_fork_is_stopped_in_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck._nvml import library

    source = FakeEventCalls(hang=("register",))
    listener = EventListener(source, _targets(1), id)
    try:
        _start_bounded(listener, 20)
        assert listener.state == "starting"
        generation = library.fork_generation()
        monkeypatch.setattr(library, "fork_generation", lambda: generation + 1)  # now "in the child"
        # The thread registering does not exist in the child: the listener is not "starting" there for ever.
        assert listener.state == "stopped" and "fork" in (listener.reason or "")
        assert listener.device_reasons == {} or all(isinstance(v, str) for v in listener.device_reasons.values())
    finally:
        monkeypatch.undo()
        source.unhang.set()
        listener.stop()


def test_a_deadline_already_passed_starts_the_registration_without_waiting_for_it() -> None:
    source = FakeEventCalls(hang=("create",))
    listener = EventListener(source, _targets(2), id)
    try:
        # A deadline already behind: start() returns at once, before the thread may have made any call.
        _start_bounded(listener, -1_000)
        assert listener.state == "starting"
        reason = listener.reason or ""
        assert reason.startswith("registration had not finished by the deadline")
        # Whichever point the thread reached, the words say it: no "... had not begun has not returned".
        assert "has not returned" in reason or "the registration has not begun" in reason
        assert "begun has not" not in reason and "begun had not" not in reason
        assert all(why.startswith("not registered: ") for why in listener.device_reasons.values())
    finally:
        source.unhang.set()
        listener.stop()
