"""The poller: take snapshots until a predicate holds for ``stable_polls`` consecutive polls, or a deadline passes.

:func:`poll_until` is the engine behind ``wait_until_clean``. It knows nothing about backends: it calls a
``snapshot_fn`` (typically ``lambda: backend.snapshot(devices, Fields.WAIT)``) and judges each snapshot with a
:class:`~nvmlcheck.predicates.Predicate`. Time comes from an injectable ``clock`` and ``sleep``. The deadline is
computed once and handed to the backend as a :class:`Deadline`, so a hanging query overruns it by at most one query.
:data:`DEFAULT`, :data:`PRECISE` and :data:`SMI_DEFAULT` are the ready-made :class:`PollPolicy` values. Transient
errors (:func:`is_transient`) are retried until the deadline; any other error fails the wait at once.

docs/waiting.md gives the rules (timeouts, resolution, policies, errors) and why; docs/performance.md the figures.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable

from ._deadline import USED_UP_S, Deadline, hung_after
from ._record import field, record
from ._waitdefaults import CLOCK, ON_POLL, POLICY, SLEEP, STABLE_POLLS, TIMEOUT, TRACE
from ._waitoptions import (  # _rebuild_options: what a pickled WaitOptions names (nvmlcheck.wait._rebuild_options)
    DEFAULT,
    PRECISE,
    SMI_DEFAULT,
    PollPolicy,
    WaitOptions,
    _rebuild_options,  # noqa: F401
    _resolve_policy,
    _timeout_ns,
)
from .errors import (
    ArgumentError,
    ArgumentTypeError,
    CorruptData,
    DeadlinePassed,
    NvmlCheckError,
    NvmlError,
    WaitTimeout,
)
from .model import DeviceFailure, Snapshot
from .predicates import (
    Predicate,
    _held_reasons,
    _Judged,
    check_predicate,
    default_predicate,
)

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from typing import cast

    from .events import ListeningGap
    from .verdict import Culprit
else:

    def cast(_type, value):  # typing.cast's run-time identity
        return value

__all__ = [
    "DEFAULT",
    "PRECISE",
    "SMI_DEFAULT",
    "Deadline",
    "OnPoll",
    "PollPolicy",
    "TracePoint",
    "WaitOptions",
    "WaitResult",
    "cpu_time_ns",
    "is_transient",
    "poll_until",
]

_NS = 1_000_000_000

def _no_poll_line(timeout_s: float | None) -> str:
    """Why a wait (or a select) timed out with no poll finished and none failed. A positive timeout the caller's
    setup used up (``_deadline.left_s``: :data:`~nvmlcheck._deadline.USED_UP_S`) left no time for a first poll: it
    was not a query still running at the deadline."""
    if timeout_s is not None and 0 < timeout_s <= USED_UP_S:
        return ("no poll finished before the deadline: the timeout was used up before the first poll (opening the "
                "GPUs and reading the selection took it)")
    return "no poll finished before the deadline (a query was still running when it passed)"


# --- deadline ---------------------------------------------------------------------------------------------------


#: A snapshot function that takes the wait's deadline (``None``: no deadline); see ``poll_until(pass_deadline=...)``.
DeadlineSnapshotFn = Callable[[Deadline | None], Snapshot]


# --- results ----------------------------------------------------------------------------------------------------


@record
class TracePoint:
    """One poll, summarised.

    ``offset_ns``: when the query returned, from the start of the wait; ``cost_ns``: how long the query took;
    ``clean``: whether this poll counted as clean; ``devices``, ``used_bytes``, ``process_counts``: per device of the
    snapshot, in its order (``None`` where unknown); ``failures``: devices that could not be read; ``error``: the
    transient error that replaced the snapshot, if any; ``partial``: the snapshot came from the ``probe`` alone (the
    process lists were not read: ``process_counts`` are ``None``). ``snapshot`` is the poll's snapshot in the point
    handed to ``on_poll`` (call ``predicate.evaluate(point.snapshot)`` there for who holds what; ``None`` when
    ``error`` replaced it); points kept in
    :attr:`WaitResult.trace` leave it ``None`` so long traces stay small. ``stamp_ns``: the same moment as
    ``offset_ns``, as the wait clock's reading (in the point handed to ``on_poll``; ``None`` in the trace), so a
    caller timing on that clock stamps what the poll saw with the poll's own time.
    """

    offset_ns: int
    cost_ns: int
    clean: bool
    devices: tuple[int, ...] = ()
    used_bytes: tuple[int | None, ...] = ()
    process_counts: tuple[int | None, ...] = ()
    failures: int = 0
    error: str | None = None
    partial: bool = False
    snapshot: Snapshot | None = field(default=None, compare=False, repr=False)
    stamp_ns: int | None = field(default=None, compare=False, repr=False)

    @property
    def total_used_bytes(self) -> int | None:
        """Bytes used over all devices (``None`` if any is unknown: its memory unread, a device that could not be
        read, a poll that failed or read no device; never 0 for what was not read)."""
        if self.error is not None or self.failures or not self.used_bytes:
            return None
        if any(u is None for u in self.used_bytes):
            return None
        return sum(u for u in self.used_bytes if u is not None)


#: ``on_poll`` callback: called with each poll's :class:`TracePoint` (its ``snapshot`` set, or ``None`` with its
#: ``error`` when a transient error replaced the snapshot).
OnPoll = Callable[[TracePoint], object]


@record(kw_only=True)
class WaitResult:
    """A successful wait (a timeout raises :class:`~nvmlcheck.WaitTimeout` instead).

    Every ``*_ns`` time is an offset in ns from the start of the wait, as in :class:`~nvmlcheck.KillResult` (whose
    start is its first signal); ``started_ns`` is the one absolute clock reading (``time.monotonic_ns`` unless
    injected), to correlate with other events (``started_ns + clean_ns`` is when the GPUs were seen clean).

    ``clean_ns``: the first poll of the confirming run of clean polls (when the GPUs were seen clean).
    ``confirmed_ns``: the poll that confirmed it; ``elapsed_ns`` is the same offset (the name
    :class:`~nvmlcheck.WaitTimeout` uses for the time waited). ``last_dirty_ns``: the last poll before that run
    that saw the GPUs held (the predicate ``False``; ``None`` if none did): the clean moment lies in
    ``(last_dirty_ns - poll_cost_ns, clean_ns]``. A poll that failed or could not judge saw nothing and does not
    count. ``poll_cost_ns``: median query cost; ``interval_ns``: median time
    between consecutive polls (0 with one poll): together the resolution of these figures. ``partial_polls``: how
    many polls the ``probe`` answered alone. ``trace``: every poll, when asked for.

    Until 0.3.0, ``first_clean_ns`` is ``clean_ns`` with a ``DeprecationWarning``. ``confirmed_ns`` was an absolute
    clock reading in 0.1: that moment is now ``started_ns + confirmed_ns``.
    """

    clean: bool = True
    elapsed_ns: int
    clean_ns: int
    last_dirty_ns: int | None
    started_ns: int
    confirmed_ns: int
    polls: int
    poll_cost_ns: int
    interval_ns: int
    snapshot: Snapshot
    policy: PollPolicy
    partial_polls: int = 0
    trace: tuple[TracePoint, ...] | None = None
    #: The times the event listener did not listen to selected GPUs during the wait
    #: (:class:`~nvmlcheck.events.ListeningGap`: it recovered, stalled, had not registered, dropped or never had a
    #: GPU): a fatal event then was not heard. ``()``: it listened throughout; ``None``: the wait did not listen.
    listening_gaps: tuple[ListeningGap, ...] | None = None

    @property
    def first_clean_ns(self) -> int:
        """Deprecated (until 0.3.0): :attr:`clean_ns`, the same offset."""
        import warnings

        warnings.warn("nvmlcheck.WaitResult.first_clean_ns is deprecated and goes in 0.3.0: use clean_ns (the same "
                      "offset from started_ns, as KillResult.clean_ns)", DeprecationWarning, stacklevel=2)
        return self.clean_ns


# --- errors -----------------------------------------------------------------------------------------------------

_children_ns = 0  # CPU time of reaped child processes, as last read
_children_read_at = -(10**18)


def cpu_time_ns() -> int:
    """CPU time spent by this thread plus that of reaped child processes (an nvidia-smi run burns its CPU in a
    child): what the duty cap counts by default. ``os.times`` counts children in clock ticks of 10 ms and costs a
    system call, so the children's part is read again at most every 10 ms."""
    global _children_ns, _children_read_at
    now = time.monotonic_ns()
    if now - _children_read_at >= 10_000_000:
        t = os.times()
        _children_ns, _children_read_at = round((t.children_user + t.children_system) * _NS), now
    return time.thread_time_ns() + _children_ns


def is_transient(exc: BaseException) -> bool:
    """Whether polling again may help: the error class's ``TRANSIENT`` (declared in :mod:`nvmlcheck.errors`), so
    ``True`` for the transient errors listed in the module docstring, ``False`` for lost GPUs, permissions, a missing
    driver, corrupt data, every other error and anything that is not an :class:`~nvmlcheck.NvmlCheckError`."""
    return isinstance(exc, NvmlCheckError) and exc.TRANSIENT


def _a_snapshot(value: object, name: str) -> Snapshot:
    """What a caller's ``snapshot_fn`` or ``probe`` returned, when it is a :class:`Snapshot`; else an
    :class:`~nvmlcheck.ArgumentTypeError` naming it (not an ``AttributeError`` from inside the poller)."""
    if isinstance(value, Snapshot):
        return value
    raise ArgumentTypeError(f"poll_until's {name} must return a Snapshot, got {value!r}")


def _naming_device(failure: DeviceFailure) -> BaseException:
    """The failure's error, made to name its device when it does not already."""
    err = failure.error
    if isinstance(err, NvmlError) and err.device_index is None:
        renamed: BaseException = type(err)(err.code, err.function, failure.index, err.detail)
    elif isinstance(err, CorruptData) and err.device_index is None:
        renamed = CorruptData(err.message, err.function, failure.index)
    else:
        if f"GPU {failure.index}" not in str(err) and hasattr(err, "add_note"):
            err.add_note(f"(while reading GPU {failure.index})")
        return err
    renamed.__cause__ = err
    return renamed


# --- the loop ---------------------------------------------------------------------------------------------------


def _summary(snap: Snapshot) -> tuple[tuple[int, ...], tuple[int | None, ...], tuple[int | None, ...]]:
    idx: list[int] = []
    used: list[int | None] = []
    counts: list[int | None] = []
    for d in snap.devices:
        idx.append(d.index)
        used.append(d.memory.used_bytes if d.memory is not None else None)
        procs = d.processes
        counts.append(len(procs) if procs is not None else None)
    return tuple(idx), tuple(used), tuple(counts)


def _median(values: deque[int]) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _judge(snap: Snapshot, check: Callable[[Snapshot], bool | None]) -> bool | None:
    """``True`` when a snapshot counts as clean, ``False`` when it saw the GPUs held (the predicate said so),
    ``None`` when it could not tell. A device failure is never clean: fatal ones are raised here, naming the device;
    with transient ones the poll is clean for no predicate (``always()`` included), held only if a GPU that was
    read says so."""
    if snap.failures:
        for f in snap.failures:
            if not is_transient(f.error):
                raise _naming_device(f)
        return False if check(snap) is False else None
    return check(snap)


class _Stats:
    """What the result reports: poll count, the run of clean polls, costs and periods (the last 1001 of each, for
    medians that follow the end of a long wait)."""

    __slots__ = ("costs", "last_dirty", "partial_polls", "periods", "polls", "prev_end", "run", "run_first", "start")

    def __init__(self, start: int) -> None:
        self.start = start
        self.polls = 0
        self.partial_polls = 0
        self.run = 0  # consecutive clean polls so far
        self.run_first = 0  # when the first poll of that run returned
        self.last_dirty: int | None = None
        self.prev_end: int | None = None
        self.costs: deque[int] = deque(maxlen=1001)
        self.periods: deque[int] = deque(maxlen=1001)

    def record(self, t0: int, t1: int, verdict: bool | None, partial: bool) -> None:
        """Count a poll: ``verdict`` ``True`` clean, ``False`` seen held, ``None`` not judged (a failed query, an
        unknown value, an unreadable GPU). Only a poll that saw the GPUs held bounds the clean moment from below: one
        that saw nothing says nothing of when the holder left."""
        self.polls += 1
        self.partial_polls += partial
        self.costs.append(t1 - t0)
        if self.prev_end is not None:
            self.periods.append(t1 - self.prev_end)
        self.prev_end = t1
        if verdict is not True:
            self.run = 0
            if verdict is False:
                self.last_dirty = t1
            return
        if self.run == 0:
            self.run_first = t1
        self.run += 1


class _Median:
    """The median of the last 15 values: the cost of a typical cycle. A median, not an average: while the driver
    tears a killed process down, a few NVML queries block for tens of milliseconds, which some hosts charge to the
    thread as CPU (docs/waiting.md); an average would stretch the interval exactly then, when the clean moment is
    near. A sustained cost (many GPUs,
    nvidia-smi) moves the median within 8 polls."""

    __slots__ = ("last", "value")

    def __init__(self) -> None:
        self.last: deque[int] = deque(maxlen=15)
        self.value = 0

    def add(self, x: int) -> None:
        self.last.append(x)
        self.value = sorted(self.last)[len(self.last) // 2]


class _Pacer:
    """How long to sleep before the next poll: the policy's interval (or its confirmation interval during a clean
    run), grown by back-off after a quiet spell, stretched by the duty cap, shortened by the sleep's measured
    lateness, and never past the deadline."""

    __slots__ = (
        "backoff_ns",
        "base_ns",
        "busy",
        "compensate",
        "confirm_ns",
        "cpu",
        "cpu_clock",
        "cpu_prev",
        "cur_ns",
        "duty",
        "factor",
        "last_sig",
        "late_ns",
        "max_ns",
        "sig_at",
        "sig_every",
        "unchanged_since",
    )

    def __init__(self, pol: PollPolicy, start: int, cpu_clock: Callable[[], int] | None) -> None:
        self.base_ns = self.cur_ns = round(pol.interval_s * _NS)
        self.confirm_ns = self.base_ns if pol.confirm_interval_s is None else round(pol.confirm_interval_s * _NS)
        self.max_ns = self.base_ns if pol.max_interval_s is None else round(pol.max_interval_s * _NS)
        self.factor = pol.backoff_factor
        self.compensate = pol.compensate_sleep
        self.late_ns = 0  # running estimate of how late sleep() wakes up
        # The duty cap wants load / period <= duty, i.e. sleep >= load / duty - busy, where busy is the wall time of
        # a typical poll and load the CPU time of a typical cycle (a sleep's wake-up costs CPU too); not
        # wall time, which blocking NVML calls inflate. Without a CPU clock (injected clocks), busy stands in.
        self.duty = pol.max_duty
        self.busy = _Median()  # a poll's wall time (query + judgement)
        self.cpu_clock = cpu_clock if self.duty is not None else None
        self.cpu_prev: int | None = None  # CPU clock at the start of the previous poll
        self.cpu = _Median()  # the CPU time of one cycle (poll + sleep overhead)
        # Back-off needs "nothing changed for backoff_after_s". While polling fast, sampling what we see 16 times per
        # backoff_after_s is precise enough and keeps the per-poll cost down; once backed off, every poll looks.
        self.backoff_ns = None if pol.backoff_after_s is None else round(pol.backoff_after_s * _NS)
        self.sig_every = self.backoff_ns // 16 if self.backoff_ns is not None else 0
        self.sig_at = start - self.sig_every
        self.last_sig: object = None
        self.unchanged_since = start

    def poll_starts(self) -> None:
        """Measure the CPU time of the cycle that just ended (duty cap)."""
        if self.cpu_clock is None:
            return
        now = self.cpu_clock()
        if self.cpu_prev is not None:
            self.cpu.add(now - self.cpu_prev)
        self.cpu_prev = now

    def saw(self, t1: int, clean: bool, snap: Snapshot | None) -> None:
        """Back-off: grow the interval after a quiet spell, snap back to the base on any change."""
        if self.backoff_ns is None or (self.cur_ns == self.base_ns and t1 - self.sig_at < self.sig_every):
            return
        self.sig_at = t1
        sig = (clean, _summary(snap), len(snap.failures)) if snap is not None else (clean, None, -1)
        if sig != self.last_sig:
            self.last_sig, self.unchanged_since, self.cur_ns = sig, t1, self.base_ns
        elif t1 - self.unchanged_since >= self.backoff_ns:
            self.cur_ns = min(self.max_ns, max(self.cur_ns + 1, int(self.cur_ns * self.factor)))

    def sleep_ns(self, *, confirming: bool, busy: int, now: int, deadline: int | None) -> int:
        """What to ask ``sleep`` for (0: poll again at once)."""
        if confirming:
            want = self.confirm_ns
        else:
            want = self.cur_ns
            if self.duty is not None:
                if self.cpu_clock is not None:
                    want = max(want, int(self.cpu.value / self.duty) - busy)
                else:
                    self.busy.add(busy)
                    want = max(want, int(self.busy.value / self.duty) - self.busy.value)
        if deadline is not None:
            want = min(want, deadline - now)  # never sleep past the deadline
        if want <= 0:
            return 0
        return max(0, want - self.late_ns) if self.compensate else want

    def woke(self, asked: int, before: int, after: int) -> None:
        """Learn how late ``sleep`` wakes up (timer slack, on Linux)."""
        if not self.compensate:
            return
        late = self.late_ns + ((after - before) - asked - self.late_ns) // 8
        # a one-off preemption must not make us spin: at most half the interval asked for
        self.late_ns = max(0, min(late, (asked + self.late_ns) // 2))


def poll_until(
    snapshot_fn: Callable[[], Snapshot] | DeadlineSnapshotFn,
    predicate: Predicate | None = None,
    *,
    timeout: float | None = TIMEOUT,
    policy: PollPolicy | str | float | None = POLICY,
    stable_polls: int = STABLE_POLLS,
    clock: Callable[[], int] = CLOCK,
    sleep: Callable[[float], object] = SLEEP,
    keep_trace: bool = TRACE,
    on_poll: OnPoll | None = ON_POLL,
    cpu_clock: Callable[[], int] | None = None,
    probe: Callable[[], Snapshot] | DeadlineSnapshotFn | None = None,
    pass_deadline: bool = False,
    options: WaitOptions | None = None,
) -> WaitResult:
    """Poll ``snapshot_fn`` until ``predicate`` (default: :func:`~nvmlcheck.predicates.default_predicate`) holds
    on ``stable_polls`` consecutive snapshots, and return when it was first seen clean.

    ``timeout`` in seconds: ``0`` checks once, ``None`` or ``inf`` waits forever, negative or NaN raises
    :class:`ValueError`. ``policy``: a :class:`PollPolicy`, ``"default"``, ``"precise"``, a fixed interval in
    seconds, or ``None`` for :data:`DEFAULT`. ``clock`` returns integer nanoseconds; ``sleep`` takes seconds.
    ``keep_trace`` keeps one :class:`TracePoint` per poll in the result; ``on_poll(point)`` is called after every
    poll (for a live status line: ``predicate.evaluate(point.snapshot).reasons`` says who holds what).
    ``cpu_clock`` (integer ns of CPU time) lets the duty cap count the CPU a cycle really costs, sleep wake-ups
    included; with the real ``clock`` it defaults to this thread's CPU time plus that of reaped child processes
    (:func:`cpu_time_ns`), with an injected one to none (then the wall time of queries stands in).

    ``probe`` is an optional cheaper snapshot (typically ``Fields.MEMORY`` only: one NVML call per GPU instead of
    four; docs/performance.md has the costs). While the GPUs are
    not clean, a poll first asks the probe; if the predicate is already ``False`` on it, the poll ends there, else
    the full ``snapshot_fn`` is read and judged. This is sound because Kleene logic is monotone: a verdict of
    ``False`` with the process lists unknown stays ``False`` whatever they hold, and the probe alone can never make
    a poll clean. Confirmation polls, the first poll, one poll every ``policy.full_every_s`` and the message of a
    timeout always use the full snapshot.

    ``pass_deadline=True``: ``snapshot_fn`` and ``probe`` take one argument, the wait's :class:`Deadline` on
    ``clock`` (``None`` when there is none: ``timeout`` ``None`` or ``inf``, and for ``timeout=0``'s single check,
    which always completes), and may raise :class:`~nvmlcheck.errors.DeadlinePassed` between two queries once it
    has come: the wait then times out at once, overrunning its deadline by at most one query instead of a whole
    poll. A backend's ``snapshot(indices, fields, deadline=d)`` is such a function.

    ``options`` (a :class:`WaitOptions`) holds the wait's settings in one value; the keyword arguments
    ``timeout`` (default 30 s, as everywhere), ``policy``, ``stable_polls``, ``clock``, ``sleep``, ``keep_trace``
    (the options' ``trace``) and ``on_poll`` are shortcuts that win over it. ``events=True`` in the options is a
    :class:`ValueError` here: events need a session's listener (:meth:`~nvmlcheck.Session.wait_until_clean`).

    Raises :class:`~nvmlcheck.WaitTimeout` at the deadline, naming what still holds each GPU; fatal errors
    (see :func:`is_transient`) are raised as they come. A timeout that follows a ``probe`` poll names the holders
    seen by the last full snapshot (at most ``policy.full_every_s`` older): reading a fresh one would overrun the
    deadline by a whole poll. When that snapshot did not see the GPUs held, it names the memory the probe saw.
    """
    opts = WaitOptions.or_default(options).with_(
        timeout=timeout, policy=policy, stable_polls=stable_polls, trace=keep_trace, on_poll=on_poll, clock=clock,
        sleep=sleep,
    )
    if opts.events:
        raise ArgumentError("events=True needs a session's event listener: use Session.wait_until_clean")
    check_predicate(predicate)
    for name, fn in (("snapshot_fn", snapshot_fn), ("probe", probe)):
        if not callable(fn) and not (name == "probe" and fn is None):  # not a TypeError from inside the first poll
            raise ArgumentTypeError(f"poll_until's {name} must be a function returning a Snapshot, got {fn!r}")
    take: DeadlineSnapshotFn
    cheap: DeadlineSnapshotFn | None
    if pass_deadline:
        take = cast("DeadlineSnapshotFn", snapshot_fn)
        cheap = cast("DeadlineSnapshotFn | None", probe)
    else:
        plain = cast("Callable[[], Snapshot]", snapshot_fn)
        take = lambda _deadline: plain()  # noqa: E731
        if probe is None:
            cheap = None
        else:
            plain_probe = cast("Callable[[], Snapshot]", probe)
            cheap = lambda _deadline: plain_probe()  # noqa: E731
    return _Poller(snapshot_fn=take, predicate=predicate, options=opts, cpu_clock=cpu_clock, probe=cheap).run()


class _Poller:
    """The state of one wait. Kept as plain attributes read into locals on the hot path."""

    def __init__(
        self,
        *,
        snapshot_fn: DeadlineSnapshotFn,
        predicate: Predicate | None,
        options: WaitOptions,
        cpu_clock: Callable[[], int] | None,
        probe: DeadlineSnapshotFn | None,
    ) -> None:
        timeout, clock = options.timeout, options.clock
        self.snapshot_fn = snapshot_fn
        self.predicate = predicate if predicate is not None else default_predicate()
        self.timeout_ns = _timeout_ns(timeout)
        self.timeout_s = math.inf if timeout is None else float(timeout)
        self.policy = _resolve_policy(options.policy)
        # timeout=0 is "is it clean right now?": one check, judged alone; so is a timeout that rounds to 0 ns, whose
        # deadline is the same instant (a second poll could never start before it).
        self.needed = 1 if self.timeout_ns == 0 else options.stable_polls
        self.clock = clock
        self.sleep = options.sleep
        self.trace: list[TracePoint] | None = [] if options.trace else None
        self.on_poll = options.on_poll
        # CPU accounting only makes sense against the real clock: with an injected clock it needs its own fake.
        if cpu_clock is None and clock is time.monotonic_ns:
            cpu_clock = cpu_time_ns
        self.cpu_clock = cpu_clock
        self.probe = probe
        self.judged: _Judged | None = None  # the timeout's judgement of its snapshot (_judged)

    def run(self) -> WaitResult:
        start = self.clock()
        if not isinstance(start, int) or isinstance(start, bool):  # time.monotonic (float s) read as ns: 30 s -> 950 y
            raise ArgumentTypeError(f"clock must return integer nanoseconds (as time.monotonic_ns does), got {start!r}")
        deadline = None if self.timeout_ns is None else start + self.timeout_ns
        with hung_after(deadline, self.clock):  # a call that never returns: the command line's handler ends it
            return self._run(start, deadline)

    def _run(self, start: int, deadline: int | None) -> WaitResult:
        clock, check, needed = self.clock, self.predicate.check, self.needed
        summarise = self.trace is not None or self.on_poll is not None
        # timeout=0 is one complete check: its deadline is now, so handing it down would cut the check short.
        cut = Deadline(deadline, clock) if deadline is not None and self.timeout_ns else None
        pacer = _Pacer(self.policy, start, self.cpu_clock)
        stats = _Stats(start)
        full_every = round(self.policy.full_every_s * _NS)
        last_full: int | None = None  # when the last full snapshot was asked for
        snap: Snapshot | None = None
        good: Snapshot | None = None  # the last snapshot a poll read (a probe's too: then good_partial)
        good_partial = False
        full: Snapshot | None = None  # the last full (not probe) snapshot: a timeout's message names its holders
        error: NvmlCheckError | None = None
        clean = partial = False
        t0 = start
        while True:
            pacer.poll_starts()
            probing = stats.run == 0 and last_full is not None and t0 - last_full < full_every
            try:
                snap, partial = self._take(probing, cut)
                error = None
            except NvmlCheckError as exc:
                if not is_transient(exc):
                    raise
                snap, error, partial = None, exc, False
            except DeadlinePassed:
                # The backend stopped between two queries: time out now, judged on the polls that completed.
                raise self._timeout(stats, clock(), full, good, error, clean=clean, partial=good_partial) from None
            t1 = clock()
            if not partial and error is None:
                last_full = t0
                full = snap
            # A probe answers a poll only when the predicate is False on it (_take): then it saw the GPUs held.
            verdict = (False if partial else _judge(snap, check)) if snap is not None else None
            if snap is not None:
                good, good_partial = snap, partial
            clean = verdict is True
            stats.record(t0, t1, verdict, partial)
            if summarise:
                self._report(t1, start, t1 - t0, clean=clean, snap=snap, error=error, partial=partial)
            pacer.saw(t1, clean, snap)
            if stats.run >= needed:
                assert snap is not None
                return self._result(stats, t1, snap)
            now = clock()
            if deadline is not None and now >= deadline:
                # Also when the poll ended before it but judging it or on_poll took the wait past it: a poll started
                # now would begin after the deadline (and a slow on_poll would run again).
                raise self._timeout(stats, now, full, good, error, clean=clean, partial=good_partial)
            ask = pacer.sleep_ns(confirming=stats.run > 0, busy=now - t0, now=now, deadline=deadline)
            if ask > 0:
                self.sleep(ask / _NS)
                t0 = clock()
                pacer.woke(ask, now, t0)
            else:
                t0 = now  # a tight loop (precise mode, or at the deadline): time.sleep(0) is not free either

    # --- helpers ------------------------------------------------------------------------------------------------

    def _take(self, probing: bool, deadline: Deadline | None) -> tuple[Snapshot, bool]:
        """One poll's snapshot, and whether it is the probe's: that only when the probe alone proves "not clean"."""
        if probing and self.probe is not None:
            cheap = _a_snapshot(self.probe(deadline), "probe")
            if not cheap.failures and self.predicate.check(cheap) is False:
                return cheap, True
            if deadline is not None:
                # The full read would be a second pass of this poll: not one begun after the deadline (a pass runs
                # its first query whatever the deadline), which would overrun it by more than one query.
                deadline.check()
        return _a_snapshot(self.snapshot_fn(deadline), "snapshot_fn"), False

    def _report(
        self,
        stamp: int,
        start: int,
        cost: int,
        *,
        clean: bool,
        snap: Snapshot | None,
        error: NvmlCheckError | None,
        partial: bool,
    ) -> None:
        """Append the poll to the trace and hand it to on_poll (with its snapshot and stamp; the trace keeps
        neither)."""
        offset = stamp - start
        if snap is None:
            why = f"{type(error).__name__}: {error}"
            if self.trace is not None:
                self.trace.append(TracePoint(offset, cost, clean, error=why))
            if self.on_poll is not None:
                self.on_poll(TracePoint(offset, cost, clean, error=why, stamp_ns=stamp))
            return
        idx, used, counts = _summary(snap)
        nfail = len(snap.failures)
        if self.trace is not None:
            self.trace.append(TracePoint(offset, cost, clean, idx, used, counts, nfail, partial=partial))
        if self.on_poll is not None:
            self.on_poll(TracePoint(offset, cost, clean, idx, used, counts, nfail, partial=partial, snapshot=snap,
                                    stamp_ns=stamp))

    def _result(self, stats: _Stats, t1: int, snap: Snapshot) -> WaitResult:
        start = stats.start
        return WaitResult(
            elapsed_ns=t1 - start,
            clean_ns=stats.run_first - start,
            last_dirty_ns=None if stats.last_dirty is None else stats.last_dirty - start,
            started_ns=start,
            confirmed_ns=t1 - start,
            polls=stats.polls,
            poll_cost_ns=_median(stats.costs),
            interval_ns=_median(stats.periods),
            snapshot=snap,
            policy=self.policy,
            partial_polls=stats.partial_polls,
            trace=tuple(self.trace) if self.trace is not None else None,
        )

    def _timeout(
        self,
        stats: _Stats,
        t1: int,
        full: Snapshot | None,
        good: Snapshot | None,
        error: NvmlCheckError | None,
        *,
        clean: bool,
        partial: bool,
    ) -> WaitTimeout:
        """The timeout, judged on ``good`` (the last snapshot read; ``partial``: a probe's, without process lists) or
        on ``full`` (the last full one) where that names the holders better."""
        probed = partial and good is not None
        if probed and full is not None and self.predicate.check(full) is False:
            # The probe proved "not clean" but did not read who holds the GPU. A fresh full read would overrun the
            # deadline by a whole poll: the last full snapshot (at most full_every_s older) names the processes,
            # when it too saw the GPUs held (not when it was clean, or could not tell: then the probe's own reading,
            # the memory held, is the answer).
            good, probed = full, False
        culprits: list[str] = []
        held = False  # only a predicate that said False saw something hold a GPU
        if error is not None:
            culprits.append(f"the last poll failed ({type(error).__name__}): {error}")
        if clean:
            culprits.append(
                f"clean at the last poll, but only {stats.run} of the {self.needed} consecutive clean polls required "
                "were seen before the deadline"
            )
        elif good is not None and probed:
            held = True  # the probe answers a poll only when the predicate is False on it
            culprits.extend(_held_reasons(self.predicate, good))  # not "process list unknown": it never reads them
        elif good is not None:
            verdict = self._judged(good).verdict()
            held = verdict.satisfied is False
            culprits.extend(verdict.reasons)
            # Failures make a poll unclean whatever the predicate says (always() ignores them).
            culprits.extend(f.describe() for f in good.failures)
        elif error is None:
            culprits.append(_no_poll_line(self.timeout_s))
        lines = tuple(dict.fromkeys(culprits))
        return WaitTimeout(self.timeout_s, t1 - stats.start, lines, good, stats.polls,
                           holders=self._holders(good, lines, clean=clean), held=held)

    def _judged(self, snap: Snapshot) -> _Judged:
        """The predicate's judgement of ``snap``, made once however often the timeout reads it."""
        judged = self.judged
        if judged is None or judged.snapshot is not snap:
            judged = self.judged = _Judged(self.predicate, snap)
        return judged

    def _holders(self, good: Snapshot | None, lines: tuple[str, ...], *, clean: bool) -> tuple[Culprit, ...] | None:
        """A timeout's structured holders: those of the GPUs the predicate refused (``WaitTimeout.holders``), never a
        GPU it judged clean (one within a laxer ``memory_used_at_most``, or outside ``on_devices``). With no snapshot
        at all (no poll finished, every poll failed), each line is an ``unknown`` culprit of no one GPU: never an
        empty list, which would read as nothing holding them. For the same reason a GPU the predicate refused on
        what the holders' rules do not see (10 MiB used under ``memory_used_at_most(1 MiB)``: their limit is the
        default 16 MiB; a predicate of one's own) gets the predicate's own reasons, kind ``"predicate"``
        (class ``"held"`` where the predicate said no, ``"unknown"`` where it could not tell)."""
        from .verdict import Culprit

        if good is None:
            return tuple(Culprit(None, "unknown", "query", line) for line in lines)
        from .verdict import holders_of, mig_units

        judged = self._judged(good)
        blamed = frozenset(f.index for f in good.failures) if clean else judged.blamed()
        units = mig_units(self.predicate, good)  # selected MIG instances: never another instance's processes
        if blamed is not None and not blamed:
            return ()
        found = holders_of(good, devices=blamed, units=units)
        if clean:
            return found
        named = {c.gpu for c in found}
        extra: list[Culprit] = []
        for device, truth, text in judged.device_reasons():
            if device in named or (blamed is not None and device not in blamed):
                continue
            prefix = f"GPU {device}: "
            reason = text[len(prefix):] if text.startswith(prefix) else text
            extra.append(Culprit(device, "held" if truth is False else "unknown", "predicate", reason))
        return (*found, *dict.fromkeys(extra)) if extra else found
