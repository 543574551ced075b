"""The defaults of :class:`nvmlcheck.wait.WaitOptions`, declared once, as markers that the wait APIs' signatures use.

A keyword argument whose value is still its marker was not given, so the options object's field applies; the marker
shows as its value (``timeout=30.0``) in ``help()`` and docs/api.md. Its own module, importing nothing but ``time``:
``session.py`` and ``kill.py`` put the markers in their signatures without loading the poller.
"""

from __future__ import annotations

import time

TYPE_CHECKING = False  # typing costs milliseconds of start-up where site has not loaded it
if TYPE_CHECKING:
    from typing import Any


class Default:
    """A keyword argument's default that stands for "not given": ``value`` is what applies when no options object
    says otherwise."""

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: object) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        value = self.value
        if callable(value):  # time.monotonic_ns, not <built-in function monotonic_ns>
            return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', '?')}"
        return repr(value)


# Typed Any so that a signature can say ``timeout: float | None = TIMEOUT``: the marker is never seen past the merge.
TIMEOUT: Any = Default("timeout", 30.0)
POLICY: Any = Default("policy", None)
STABLE_POLLS: Any = Default("stable_polls", 2)
TRACE: Any = Default("trace", False)
ON_POLL: Any = Default("on_poll", None)
CLOCK: Any = Default("clock", time.monotonic_ns)
SLEEP: Any = Default("sleep", time.sleep)
EVENTS: Any = Default("events", None)
#: ``ready``'s timeout: one check unless a caller's options (or the keyword) say how long to wait.
READY_TIMEOUT: Any = Default("timeout", 0.0)
