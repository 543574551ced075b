"""Stopping the event listener is prompt (issue 27, item 10): a session's close waits for the one
``nvmlEventSetWait_v2`` in flight, which cannot be interrupted, so every wait is one short slice.

A fake event source stands for the library and records the timeout of each wait; nothing here measures time.
"""

from __future__ import annotations

import threading

from nvmlcheck.events import WAIT_SLICE_MS, EventListener, EventTarget


class _Source:
    """Event calls that never deliver an event; each wait blocks until released, recording its timeout."""

    missing = None

    def __init__(self) -> None:
        self.timeouts: list[int] = []
        self.waiting = threading.Event()
        self.release = threading.Event()
        self.freed = 0

    def create(self) -> object:
        return object()

    def supported(self, handle: object, index: int) -> int:
        return 0xFFFF

    def register(self, handle: object, index: int, mask: int, event_set: object) -> None:
        pass

    def wait(self, event_set: object, timeout_ms: int) -> None:
        self.timeouts.append(timeout_ms)
        self.waiting.set()
        self.release.wait(5.0)  # a real call returns at its timeout; here the test decides when

    def free(self, event_set: object) -> int:
        self.freed += 1
        return 0


def test_the_listener_waits_in_slices_of_at_most_10_ms() -> None:
    assert WAIT_SLICE_MS <= 10  # what stop() (a close) may have to wait out: it was 100 ms, added to every command
    source = _Source()
    listener = EventListener(source, [EventTarget(0, object(), "GPU-0")], id).start()
    assert listener.active and source.waiting.wait(5.0)
    stopper = threading.Thread(target=listener.stop)
    stopper.start()
    source.release.set()  # the call in flight returns (at its timeout, on a real library)
    stopper.join(10.0)
    assert not stopper.is_alive() and listener.state == "stopped" and source.freed == 1
    assert source.timeouts and max(source.timeouts) <= 10
