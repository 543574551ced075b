"""A point in time that a wait hands down to a backend, so one pass stops at the wait's deadline.

Layer 1 (beside the model and the errors): the backends take it without importing the poller. Public as
:class:`nvmlcheck.wait.Deadline`. Also here: :func:`read_by` (one reading stopped at a deadline) and
:class:`hung_after` (a wait still running :data:`HUNG_AFTER_NS` after its deadline is stuck in a call no thread can
interrupt: an installed handler, the command line's, reports it and ends the process; docs/waiting.md, "A call that
does not return").
"""

from __future__ import annotations

import _thread
import math
import time
from collections.abc import Callable

from .errors import DeadlinePassed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .backends import Backend
    from .model import Fields, Snapshot

__all__ = ["HUNG_AFTER_NS", "USED_UP_S", "Deadline", "hung_after", "left_s", "ns_or_none", "on_hung", "read_by"]

_NS = 1_000_000_000


def ns_or_none(seconds: float) -> int | None:
    """``seconds`` (a number >= 0, checked by the caller) in integer ns; ``None`` when it cannot be counted in ns
    (``inf``, or beyond ~1.8e299 s, an int too large for a float included): no bound. The one rule for every
    timeout and grace the library takes."""
    try:
        ns = float(seconds) * _NS
    except OverflowError:  # an int beyond any float (10**400): longer than any wait, as inf is
        return None
    return None if math.isinf(ns) else round(ns)  # not ceil: 63225e-9 * 1e9 is 63225.00000000001


#: What a positive timeout that is used up leaves (:func:`left_s`): the least positive timeout, a check bounded by
#: it (which may be cut, so a wait times out), never 0, which is one whole check judged alone.
USED_UP_S = 1e-9


def left_s(timeout: float | None, spent_s: float) -> float | None:
    """What is left of ``timeout`` (seconds; ``None``: no bound) once ``spent_s`` of it went on something else (opening
    NVML, resolving the selection, registering events). 0 stays 0 (one check, judged alone: ``--timeout 0``); a
    positive timeout stays positive: used up, it is :data:`USED_UP_S`, so the wait that gets it answers as the
    library does for the same time (not confirmed in time), never as a one-check judgement that ignores
    ``stable_polls``. The one rule for every caller that hands on what its setup left of a timeout."""
    if not timeout:
        return timeout
    try:
        left = timeout - spent_s
    except OverflowError:  # an int beyond any float (10**400): longer than any wait, as inf is
        return timeout
    return left if left > 0 else USED_UP_S


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
        """The deadline ``seconds`` (a number >= 0) from now on ``clock``. A time too long to count in ns (``inf``)
        is no deadline: where one is optional, pass ``None`` instead (:class:`~nvmlcheck.ArgumentError`)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            from .errors import ArgumentTypeError

            raise ArgumentTypeError(f"a deadline is a number of seconds from now, got {seconds!r}")
        ns = ns_or_none(seconds) if seconds >= 0 else None  # NaN fails the comparison
        if ns is None:
            from .errors import ArgumentError

            raise ArgumentError(f"a deadline is a finite number of seconds >= 0 from now, got {seconds!r} (no "
                                "deadline: pass None where one is optional)")
        return cls(clock() + ns, clock)

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
        with hung_after(deadline_ns, clock):
            return backend.snapshot(indices, fields,
                                    deadline=None if deadline_ns is None else Deadline(deadline_ns, clock))
    except DeadlinePassed:
        return None


#: How long a wait may run past its deadline before it counts as stuck in a call: a query takes µs, a pass stops
#: at most one query after the deadline, and a query waits ~0.1 s at most while the driver tears contexts down
#: (docs/driver-facts.md). A wait still running a second after its deadline is in a call that has not returned
#: (a wedged driver or GPU: NVML calls can take minutes there), which no thread can interrupt.
HUNG_AFTER_NS = 1_000_000_000

_hung_handler: Callable[[float], object] | None = None
# Held by a handler that fires (which then ends the process) and taken by every wait's end: a wait that ends as
# the handler fires waits for the process to end instead of printing an answer after the handler's report.
_firing = _thread.allocate_lock()


def on_hung(handler: Callable[[float], object] | None) -> None:
    """Install ``handler`` (``None``: remove it), called in a watchdog thread when a wait is still running
    :data:`HUNG_AFTER_NS` after its deadline, with the seconds since the deadline. It must end the process (the
    waiting thread is in a call no exception can reach): the command line reports a hung reading and exits 3. The
    library installs none: its caller's thread stays in the call, as with any binding of a C library."""
    global _hung_handler
    _hung_handler = handler


class hung_after:
    """``with hung_after(deadline_ns, clock):`` around a wait with a deadline: when a handler is installed
    (:func:`on_hung`), a watchdog thread calls it if the ``with`` block is still running :data:`HUNG_AFTER_NS`
    after ``deadline_ns``. Nothing without a handler or a deadline, nor on an injected clock (a test's time is not
    the watchdog's). One thread per wait, none per poll."""

    __slots__ = ("_done",)

    def __init__(self, deadline_ns: int | None, clock: Callable[[], int] = time.monotonic_ns,
                 after_ns: int = HUNG_AFTER_NS) -> None:  # fmt: skip
        handler = _hung_handler
        self._done: _thread.LockType | None = None
        if handler is None or deadline_ns is None or clock is not time.monotonic_ns:
            return
        done = self._done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_watch, (done, deadline_ns, deadline_ns + after_ns, handler))

    def __enter__(self) -> hung_after:
        return self

    def __exit__(self, *exc: object) -> None:
        done = self._done
        if done is not None:
            with _firing:  # blocks only while a handler is ending the process
                done.release()


def _watch(done: _thread.LockType, deadline_ns: int, at_ns: int, handler: Callable[[float], object]) -> None:
    while (left_s := (at_ns - time.monotonic_ns()) / _NS) > 0:
        if done.acquire(True, min(left_s, _thread.TIMEOUT_MAX)):
            return  # the wait ended in time
    with _firing:
        if done.acquire(False):
            return  # it ended just now
        handler((time.monotonic_ns() - deadline_ns) / _NS)
