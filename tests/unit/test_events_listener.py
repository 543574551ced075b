"""The event listener's contract with waits and ``watch``: its ``state`` tells the truth about its thread, and a GPU
that refuses some event types is still listened to for the ones that stop a wait.

Fake event sources (tests/unit/fake_events.py) stand for the library; nothing here measures time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from fake_events import FakeEventCalls

from nvmlcheck import events as events_module
from nvmlcheck._nvml import library
from nvmlcheck.errors import Uninitialized
from nvmlcheck.events import EventKind, EventListener, EventTarget, GpuEvent


def test_a_listener_whose_thread_dies_says_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    died: list[object] = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    # A wait that raises something that is not an NVML error (a record it cannot decode, ...).
    source = FakeEventCalls(wait_error=RuntimeError("cannot decode the event record"))
    listener = EventListener(source, [EventTarget(0, object(), "GPU-0")], id).start()
    thread = listener.thread
    assert thread is not None
    thread.join(10.0)
    assert not thread.is_alive()
    # It said "running" for ever: waits counted on it and `watch` waited for events that could never come.
    assert listener.state == "failed" and not listener.active
    assert listener.reason is not None and "RuntimeError" in listener.reason
    assert died == []  # said by the state and the reason, not by a traceback on stderr
    # A watcher blocked on it is released (None: no timeout; the state ends the wait).
    assert listener.next_events(0, None) == ([], 0)
    listener.stop()
    assert listener.state == "failed"


def test_a_gpu_refusing_ecc_events_is_still_listened_to_for_xids() -> None:
    # Every type reported supported, but any mask with an ECC type in it refused (ECC events are not delivered with
    # ECC off, say): NVML answers NOT_SUPPORTED for the whole mask, naming no type.
    source = FakeEventCalls(supported=0x1F, refuse_bits=0x3)
    listener = EventListener(source, [EventTarget(0, object(), "GPU-0")], id).start()
    try:
        # It was given up after the full mask and the fault kinds (XID + ECC) were refused: no events at all, and
        # an XID 79 during a wait went unheard.
        assert listener.state == "running" and listener.covered == frozenset({0})
        assert source.masks[-1] == 0x8 and listener.device_reasons == {}
    finally:
        listener.stop()


def test_a_failed_listener_frees_its_event_set_without_being_stopped() -> None:
    # Registration works; the wait fails as after NVML was re-initialised under the listener.
    source = FakeEventCalls(wait_error=Uninitialized(1, "nvmlEventSetWait_v2"))
    listener = EventListener(source, [EventTarget(0, object(), "GPU-0")], id).start()
    thread = listener.thread
    assert thread is not None
    thread.join(10.0)
    assert listener.state == "failed"
    # Session.listen() replaces a failed listener without stopping it: the set was never freed (one leaked per
    # failure, still registered in NVML).
    assert len(source.freed) == 1
    listener.stop()
    assert len(source.freed) == 1  # and never twice


@pytest.mark.parametrize("call", ["events", "fatal", "sleep", "next_events", "reason", "device_reasons"])
def test_a_forked_child_never_waits_on_the_parents_lock(monkeypatch: pytest.MonkeyPatch, call: str) -> None:
    # At fork() the parent's listener thread may hold the listener's lock (it appends each event under it); in the
    # child nobody ever releases it. Only state/reason/stop/start noticed the fork: a wait's fatal() (each poll), a
    # watcher's next_events() or `events` then blocked for ever on that lock.
    listener = EventListener(FakeEventCalls(supported=0x1F), [EventTarget(0, object(), "GPU-0")], id).start()
    thread, stop_thread = listener.thread, listener._stop  # the "fork" makes the listener forget both
    try:
        held, release = threading.Event(), threading.Event()

        def parents_thread() -> None:  # holds the lock "across the fork"
            with listener._cond:
                held.set()
                release.wait(60.0)

        holder = threading.Thread(target=parents_thread, daemon=True)
        holder.start()
        assert held.wait(30.0)
        generation = library.fork_generation()
        monkeypatch.setattr(library, "fork_generation", lambda: generation + 1)  # now "in the child"
        calls: dict[str, Callable[[], object]] = {
            "events": lambda: listener.events,
            "fatal": listener.fatal,
            "sleep": lambda: listener.sleep(0.0),
            "next_events": lambda: listener.next_events(0, 0.0),
            "reason": lambda: listener.reason,
            "device_reasons": lambda: listener.device_reasons,
        }
        done = threading.Event()
        def in_the_child() -> None:
            calls[call]()
            done.set()

        child = threading.Thread(target=in_the_child, daemon=True)
        child.start()
        assert done.wait(30.0), f"{call}() blocked on the lock the parent's thread held at fork()"
        assert listener.state == "stopped"
    finally:
        release.set()
        stop_thread.set()
        if thread is not None:
            thread.join(30.0)


def test_a_gpu_delivering_no_fault_events_is_not_counted_as_listened_to() -> None:
    listener = EventListener(FakeEventCalls(supported=0x10 | 0x4), [EventTarget(0, object(), "GPU-0")], id).start()
    try:
        # It was "running, covering GPU 0" with no reason: waits and `watch` said they listened for its XIDs.
        assert listener.state == "unsupported" and listener.covered == frozenset()
        assert "no XID or ECC events" in listener.device_reasons[0] and "pstate, clock" in listener.device_reasons[0]
    finally:
        listener.stop()


def _hear(listener: EventListener, count: int, etype: int = 0x10, data: int = 0) -> None:
    for _ in range(count):
        listener._received(0, etype, data, None, None)  # what the thread does with each event it is given


def test_a_wait_checks_the_fatal_events_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before every poll a wait asks fatal(): it scanned every event heard since listen(), clock events included, so
    # a session listening for hours paid for each of them on each poll (and each wake-up of sleep()).
    listener = EventListener(FakeEventCalls(supported=0x1F), [], id)
    _hear(listener, 1000)
    _hear(listener, 1, etype=0x8, data=79)
    looked_at: list[GpuEvent] = []
    fatal_of = vars(GpuEvent)["fatal"].fget

    def counted(ev: GpuEvent) -> bool:
        looked_at.append(ev)
        return bool(fatal_of(ev))

    monkeypatch.setattr(GpuEvent, "fatal", property(counted))
    found = listener.fatal()
    assert found is not None and found.xid == 79
    assert len(looked_at) <= 1


def test_a_long_listener_keeps_a_bounded_number_of_events(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events_module, "MAX_KEPT_EVENTS", 10)
    listener = EventListener(FakeEventCalls(supported=0x1F), [], id)
    _hear(listener, 1, etype=0x8, data=48)  # fatal, first: forgotten from `events`, never from fatal()
    _hear(listener, 24)
    assert len(listener.events) <= 10  # it kept all 25: a `watch` of weeks grew without bound
    fault = listener.fatal()
    assert fault is not None and fault.xid == 48
    # A reader's position counts every event received; one left behind gets what is kept, and catches up.
    new, after = listener.next_events(0, 0.0)
    assert after == 25 and new == list(listener.events)
    _hear(listener, 1)
    new, after = listener.next_events(after, 0.0)
    assert after == 26 and len(new) == 1


def _heard(source: FakeEventCalls, count: int) -> tuple[EventListener, list[GpuEvent]]:
    """A listener over ``source`` on GPU 0 (handle ``HANDLE``), and the first ``count`` events its thread received."""
    listener = EventListener(source, [EventTarget(0, HANDLE, "GPU-0")], id).start()
    got: list[GpuEvent] = []
    after = 0
    while len(got) < count:
        new, after = listener.next_events(after, 30.0)
        assert new, f"the listener passed on {len(got)} of {count} events"
        got += new
    return listener, got


HANDLE = object()


def test_an_event_type_nvmlcheck_does_not_know_reaches_the_caller_with_its_raw_code() -> None:
    # A type bit outside the listener's table (a newer driver's) produced no event at all: dropped without a word.
    source = FakeEventCalls(records=[
        (id(HANDLE), 0x10000, 7, None, None),  # unknown alone
        (id(HANDLE), 0x8 | 0x20000, 79, None, None),  # an XID with an unknown bit beside it
        (id(HANDLE), 0x0, 0, None, None),  # no type at all
    ])
    listener, got = _heard(source, 4)
    try:
        unknown = [e for e in got if e.kind is EventKind.UNKNOWN]
        assert [(e.event_type, e.event_data) for e in unknown] == [(0x10000, 7), (0x8 | 0x20000, 79), (0, 0)]
        assert [e.xid for e in got if e.kind is EventKind.XID] == [79]  # the known bit of the same record kept
        first = unknown[0]
        assert not first.fatal and first.index == 0 and "0x10000" in first.meaning and "0x10000" in first.line()
        doc = first.to_json()
        assert (doc["kind"], doc["event_type"], doc["event_data"], doc["fatal"]) == ("unknown", 0x10000, 7, False)
        assert listener.state == "running"  # never a crash
    finally:
        listener.stop()


def test_mig_configuration_changes_are_registered_and_recorded_not_fatal() -> None:
    # nvmlEventMigConfigChange was never asked for: an instance created or destroyed under a wait went unheard.
    source = FakeEventCalls(supported=0x1FF, records=[(id(HANDLE), 0x100, 0, None, None)])
    listener, got = _heard(source, 1)
    try:
        assert source.masks[0] & 0x100
        (ev,) = got
        assert ev.kind is EventKind.MIG_CONFIG and not ev.fatal and "MIG" in ev.meaning
        assert listener.fatal() is None  # what is on the GPU changed, not its health: the next poll reads it again
    finally:
        listener.stop()


def test_an_xid_storm_on_one_gpu_costs_a_wait_on_another_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every fatal event was kept in one list that each wait scanned before every poll: 200 000 XID 74s of a GPU in an
    # NVLink storm cost a wait on another GPU ~10 ms a poll (its polls are ~1 ms apart), and memory without bound.
    listener = EventListener(FakeEventCalls(supported=0x1F), [], id)
    listener._covered = {1: (1, "GPU-1"), 0: (0, "GPU-0")}  # handle address -> (index, uuid)
    for _ in range(5 * events_module.MAX_KEPT_FATAL_PER_GPU):
        listener._received(1, 0x8, 74, None, None)
    listener._received(0, 0x8, 79, None, None)
    looked_at: list[GpuEvent] = []
    time_of = events_module._event_time

    def counted(ev: GpuEvent) -> int:
        looked_at.append(ev)
        return time_of(ev)

    monkeypatch.setattr(events_module, "_event_time", counted)
    found = listener.fatal([0])
    assert found is not None and found.xid == 79 and found.index == 0
    assert len(looked_at) <= 4  # a binary search of GPU 0's one event; GPU 1's are not looked at
    storm = listener.fatal([1])
    assert storm is not None and storm.xid == 74  # a wait that began before the storm still stops on it
    assert len(looked_at) <= 4 + 2 * events_module.MAX_KEPT_FATAL_PER_GPU.bit_length()
    assert sum(1 for e in listener.events if e.fatal) > events_module.MAX_KEPT_FATAL_PER_GPU  # `events` keeps them
    assert listener.fatal([1], since_ns=found.time_ns + 1) is None


def test_every_event_kind_is_classed_for_readys_health_reading() -> None:
    # ready reads the health again after an event that can announce a change of it; the kinds added for nvml.h's
    # newer types (DRAM retirement, poison, recovery action, ...) and unknown ones were none of its three.
    from nvmlcheck.readiness import _HEALTH_EVENTS

    not_health = {EventKind.PSTATE, EventKind.CLOCK, EventKind.POWER_SOURCE, EventKind.MIG_CONFIG}
    assert {k.value for k in EventKind} - {k.value for k in not_health} == set(_HEALTH_EVENTS)


def test_a_listener_stopped_before_it_started_never_says_running() -> None:
    source = FakeEventCalls(supported=0x1F)
    listener = EventListener(source, [EventTarget(0, HANDLE, "GPU-0")], id)
    listener.stop()
    listener.start()
    try:
        # It said "running" (active: waits counted on it) while its thread had ended at once on the stop flag.
        assert listener.state == "stopped" and not listener.active and source.masks == []
    finally:
        listener.stop()


def test_a_gpu_refusing_a_newer_event_type_keeps_the_ones_it_delivered_before() -> None:
    # The listener now asks for every type nvml.h names; a GPU that reports, say, poison events supported but refuses
    # a mask with them fell back to XID and ECC alone: no more clock events for `watch` or the study.
    source = FakeEventCalls(supported=0xFFFF, refuse_bits=0x1000)
    listener = EventListener(source, [EventTarget(0, HANDLE, "GPU-0")], id).start()
    try:
        assert listener.covered == frozenset({0})
        assert source.masks == [0xFFFF & events_module.WANTED_MASK, 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x80 | 0x100]
    finally:
        listener.stop()


def test_a_wait_call_answering_timeout_at_once_does_not_spin_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # NVML answers NVML_ERROR_TIMEOUT at once when a signal interrupts nvmlEventSetWait_v2; one that did so again and
    # again (the stub with a TIMEOUT fault) spun the listener thread at a full core. The clock here never moves: each
    # TIMEOUT came "at once", so each must be followed by a pause for the rest of the slice.
    source = FakeEventCalls(supported=0x1F, instant=True, fail_after=200)
    listener = EventListener(source, [EventTarget(0, HANDLE, "GPU-0")], id)
    pauses: list[float] = []
    listener._clock = lambda: 0
    monkeypatch.setattr(listener, "_pause", pauses.append)
    listener.start()
    thread = listener.thread
    assert thread is not None
    thread.join(60.0)  # the fake fails its 201st wait: the thread ends
    assert listener.state == "failed"
    assert len(pauses) == 200 and all(p == events_module.WAIT_SLICE_MS / 1000 for p in pauses)
