"""A fake clock for waits in tests: polls complete however slowly a loaded machine runs them.

Public as :class:`nvmlcheck.testing.StepClock`.
"""

from __future__ import annotations

from ..errors import ArgumentError

__all__ = ["StepClock"]


class StepClock:
    """A clock and a sleep for ``wait_until_clean(clock=..., sleep=...)`` (or ``WaitOptions``) that never sleep.

    Every reading of :meth:`clock` moves it ``step_s`` on and :meth:`sleep` moves it by what is asked, so how many
    polls a wait makes before its timeout depends only on the code path, not on the machine's load; the deadline
    handed to the backend is on this clock too (an nvidia-smi run still has its own run timeout). With
    ``timeout=0.2`` on the real clock, a loaded CI machine may finish no poll at all and the timeout then names no
    GPU state.

    >>> from nvmlcheck.testing import StepClock
    >>> steps = StepClock(0.5)
    >>> steps.clock(), steps.clock()
    (500000000, 1000000000)
    """

    def __init__(self, step_s: float) -> None:
        if not step_s > 0:
            raise ArgumentError(f"step_s must be a positive number of seconds, got {step_s!r}")
        self.now_ns = 0
        self.step_ns = round(step_s * 1e9)

    def clock(self) -> int:
        """The time in integer ns, ``step_s`` later than at the last reading."""
        self.now_ns += self.step_ns
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        """Move the clock by ``seconds``; returns at once."""
        self.now_ns += round(seconds * 1e9)
