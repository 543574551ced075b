"""Stopping the event listener is prompt (issue 27, item 10): a session's close waits for the one
``nvmlEventSetWait_v2`` in flight, which cannot be interrupted, so every wait is one short slice.

A fake event source (tests/unit/fake_events.py) stands for the library and records the timeout of each wait;
nothing here measures time.
"""

from __future__ import annotations

import threading

from fake_events import FakeEventCalls

from nvmlcheck.events import WAIT_SLICE_MS, EventListener, EventTarget


def test_the_listener_waits_in_slices_of_at_most_10_ms() -> None:
    assert WAIT_SLICE_MS <= 10  # what stop() (a close) may have to wait out: it was 100 ms, added to every command
    source = FakeEventCalls(block=True)  # never delivers; each wait blocks until released, recording its timeout
    listener = EventListener(source, [EventTarget(0, object(), "GPU-0")], id).start()
    assert listener.active and source.waiting.wait(5.0)
    stopper = threading.Thread(target=listener.stop)
    stopper.start()
    source.release.set()  # the call in flight returns (at its timeout, on a real library)
    stopper.join(10.0)
    assert not stopper.is_alive() and listener.state == "stopped" and len(source.freed) == 1
    assert source.timeouts and max(source.timeouts) <= 10
