"""A fake clock for waits in tests: polls complete however slowly a loaded machine runs them.

Public as :class:`nvmlcheck.testing.StepClock`.
"""

from __future__ import annotations

import math
import numbers

from ..errors import ArgumentError, ArgumentTypeError

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
        step_ns = _to_ns("step_s", step_s)
        if step_ns < 1:  # 0 (or a step that rounds to 0 ns) would stop the clock, and a wait would never time out
            raise ArgumentError(f"step_s must be a positive number of seconds (at least 1 ns), got {step_s!r}")
        self.now_ns = 0
        self.step_ns = step_ns

    def clock(self) -> int:
        """The time in integer ns, ``step_s`` later than at the last reading."""
        self.now_ns += self.step_ns
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        """Move the clock by ``seconds``; returns at once. Like :func:`time.sleep`, refuses a negative or NaN
        length: the clock never goes back."""
        self.now_ns += _to_ns("sleep length", seconds)


def _to_ns(what: str, seconds: object) -> int:
    """``seconds`` (a finite, non-negative real number) in integer ns; ``TypeError``/``ValueError`` naming ``what``."""
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise ArgumentTypeError(f"{what} must be a number of seconds, not {type(seconds).__name__}")
    value = float(seconds)
    if not math.isfinite(value) or value < 0:
        raise ArgumentError(f"{what} must be a finite, non-negative number of seconds, got {seconds!r}")
    ns = value * 1e9
    if not math.isfinite(ns):  # 1e300 s is finite, its ns are not: round() would raise a bare OverflowError
        raise ArgumentError(f"{what} is too large to count in ns, got {seconds!r}")
    return round(ns)
