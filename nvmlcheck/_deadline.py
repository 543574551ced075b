"""A point in time that a wait hands down to a backend, so one pass stops at the wait's deadline.

Layer 1 (beside the model and the errors): the backends take it without importing the poller. Public as
:class:`nvmlcheck.wait.Deadline`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .errors import DeadlinePassed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .backends import Backend
    from .model import Fields, Snapshot

__all__ = ["Deadline", "ns_or_none", "read_by"]

_NS = 1_000_000_000


def ns_or_none(seconds: float) -> int | None:
    """``seconds`` (a number >= 0, checked by the caller) in integer ns; ``None`` when it cannot be counted in ns
    (``inf``, or beyond ~1.8e299 s): no bound. The one rule for every timeout and grace the library takes."""
    ns = seconds * _NS
    return None if math.isinf(ns) else round(ns)  # not ceil: 63225e-9 * 1e9 is 63225.00000000001


class Deadline:
    """A point in time on ``clock`` (integer ns, default :func:`time.monotonic_ns`): what a wait hands a backend's
    ``snapshot(..., deadline=...)`` so that one pass stops at the wait's deadline, not a whole poll later.

    The poller builds it on its own (possibly injected) clock, so tests drive it with a fake clock.
    """

    __slots__ = ("at_ns", "clock")

    def __init__(self, at_ns: int, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.at_ns = at_ns
        self.clock = clock

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], int] = time.monotonic_ns) -> Deadline:
        """The deadline ``seconds`` from now on ``clock``."""
        return cls(clock() + round(seconds * _NS), clock)

    def expired(self) -> bool:
        """Whether the deadline has come."""
        return self.clock() >= self.at_ns

    def remaining_s(self) -> float:
        """Seconds left (0.0 once expired)."""
        return max(0.0, (self.at_ns - self.clock()) / _NS)

    def check(self) -> None:
        """Raise :class:`~nvmlcheck.errors.DeadlinePassed` once the deadline has come: a backend calls this between
        two queries of a pass."""
        if self.clock() >= self.at_ns:
            raise DeadlinePassed(f"the deadline passed {(self.clock() - self.at_ns) / 1e6:.3f} ms ago")

    def __repr__(self) -> str:
        return f"Deadline(at_ns={self.at_ns}, remaining_s={self.remaining_s():.6f})"


def read_by(backend: Backend, indices: tuple[int, ...] | None, fields: Fields, deadline_ns: int | None,
            clock: Callable[[], int] = time.monotonic_ns) -> Snapshot | None:
    """One reading of ``indices`` (all: ``None``) stopped at ``deadline_ns`` on ``clock`` (at most one query late):
    ``None`` when the deadline came first. The setup readings of commands with a deadline (``ready``'s first, the
    Slurm gate's, ``select``'s CUDA numbering) use it; the poller hands its own :class:`Deadline` to the backend."""
    try:
        return backend.snapshot(indices, fields, deadline=None if deadline_ns is None else Deadline(deadline_ns, clock))
    except DeadlinePassed:
        return None
