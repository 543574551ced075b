"""``ready``: can the next job start on these GPUs now, and if not, why and when?

:func:`ready_on` (also :meth:`Session.ready <nvmlcheck.Session.ready>`) reads the selected GPUs once with their
health; with a timeout it then waits through the one poller (:meth:`~nvmlcheck.Session.wait_until_clean`) with the
ready predicate (clean, and with a need, capacity: :func:`~nvmlcheck.predicates.memory_free_at_least`), listening for
XIDs, while a :class:`~nvmlcheck.verdict.Watch` sees every poll; the last reading is classified
(:func:`~nvmlcheck.verdict.classify`) into a :class:`~nvmlcheck.verdict.ReadyReport`. An unhealthy GPU, or a need
beyond what a GPU has with nothing running, ends it at once, and a stuck one at the poll that finds it past its bound:
waiting cannot help. :func:`ready` opens a session
first, bounded by the timeout as :func:`~nvmlcheck.wait_until_clean` is. Rules, exit codes and sources: docs/ready.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from ._deadline import hung_after, left_s, ns_or_none
from ._waitdefaults import READY_TIMEOUT, Default
from .errors import ArgumentError, BackendUnavailable, DeadlinePassed, GpuFault, NvmlCheckError, WaitTimeout
from .model import DeviceState, Fields, Snapshot, unsupported
from .predicates import (
    DEFAULT_MAX_USED_BYTES,
    check_bytes,
    check_fraction,
    instance_view,
    memory_free_at_least,
    memory_used_at_most,
    no_processes,
    on_devices,
)
from .verdict import Culprit, GpuVerdict, ReadyReport, Watch, classify

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable

    from .events import GpuEvent, ListeningGap
    from .holders import Holder
    from .predicates import Predicate
    from .session import DeviceSelector, Session
    from .wait import TracePoint, WaitOptions

__all__ = ["ready", "ready_on"]

#: ``ready``'s default timeout: one check ("is it ready now?"); a launch gate that may wait says how long.
DEFAULT_TIMEOUT_S = READY_TIMEOUT.value


def ready_on(
    session: Session,
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    *,
    need_bytes: int | None = None,
    need_fraction: float | None = None,
    max_used_bytes: int | None = None,
    timeout: float | None = READY_TIMEOUT,
    events: bool | None = None,
    options: WaitOptions | None = None,
) -> ReadyReport:
    """One verdict per selected GPU: ready (clean, healthy and, with a need, enough free memory) or why not.

    ``need_bytes``: what the next job allocates per GPU; ``need_fraction``: that as a fraction of each GPU's total
    (vLLM's ``gpu_memory_utilization``); free = total - reserved - used must reach it. ``max_used_bytes``: what
    clean allows (``None``: 16 MiB, as for waits). ``timeout`` in seconds: ``0`` (the default) judges one reading,
    ``None`` waits forever; otherwise it polls until every GPU is ready or the deadline passes (overrun by at most one
    query), listening for XIDs on the selected GPUs unless ``events=False``; the first reading counts as the first of
    the options' ``stable_polls``, and a clean reading that the deadline left unconfirmed is ``unknown``. An
    unhealthy GPU (a health cause, a fatal XID, a lost GPU) ends the call at once, as does a need beyond what a GPU
    has with nothing running (``GpuVerdict.beyond_capacity``); a ``stuck`` one ends it at the first poll that finds
    it past the reclaim model's bound (memory held with no holder, a zombie or D-state holder). ``options``: a
    :class:`~nvmlcheck.wait.WaitOptions` (policy, stable polls, ``on_poll``, ``clock``, ``sleep``; its ``timeout``
    and ``events`` where a caller set them and the keywords are not given: ``ready``'s own defaults are one check and
    listening).

    Never raises for "not ready": the :class:`~nvmlcheck.verdict.ReadyReport` says so, per GPU, with its
    culprits. Raises ``ValueError`` for a bad selection or need, :class:`~nvmlcheck.BackendUnavailable` when the
    backend sees no GPU.
    """
    opts = _ready_options(timeout, events, options)
    if devices is not None:
        from .session import _selectors

        # Read once: the selection is resolved, read for MIG instances and handed to the wait, and an iterator
        # (a generator of indices) would be empty by the second ("empty device selection").
        devices = _selectors(devices)
    bound = opts.timeout
    max_used_bytes = DEFAULT_MAX_USED_BYTES if max_used_bytes is None else check_bytes("max_used_bytes", max_used_bytes)
    capacity = _capacity(need_bytes, need_fraction)
    predicate = no_processes() & memory_used_at_most(max_used_bytes)
    if capacity is not None:
        predicate = predicate & capacity
    clock = opts.clock
    start = clock()
    bound_ns = None if bound is None else ns_or_none(bound)
    # Every step runs under one watchdog (the command line's handler, when installed): the MIG selection, the first
    # reading, the listener's registration, the wait, the device-file scan and the health read after it. A call that
    # never returns in any of them ends the command a second after the deadline (exit 3), not whenever it returns.
    with hung_after(None if bound_ns is None else start + bound_ns, clock):
        return _ready(session, devices, opts, predicate, max_used_bytes=max_used_bytes, need_bytes=need_bytes,
                      need_fraction=need_fraction, start=start)


def _ready(
    session: Session,
    devices: Iterable[DeviceSelector] | DeviceSelector | None,
    opts: WaitOptions,
    predicate: Predicate,
    *,
    max_used_bytes: int,
    need_bytes: int | None,
    need_fraction: float | None,
    start: int,
) -> ReadyReport:
    """:func:`ready_on` past its checks, from ``start`` on the options' clock."""
    clock, bound = opts.clock, opts.timeout
    bound_ns = None if bound is None else ns_or_none(bound)
    deadline_ns = None if bound_ns is None else start + bound_ns
    try:
        # The GPUs a UUID, cuda:N or MIG- selector names are read by the deadline too (one check always completes).
        indices = session._resolve(devices, deadline_ns if bound else None, clock)
    except DeadlinePassed:
        return _unresolved(session, devices, bound, start, clock)
    mig = _mig_instances(session, devices, bound, start, clock)
    watch = Watch(max_used_bytes=max_used_bytes)
    scan = _UnlistedScan(session, max_used_bytes, deadline_ns, clock)
    read_from_ns = time.monotonic_ns()  # the events' clock: what came before is in the first reading's health
    first, late = _first_reading(session, indices, opts, start, clock)
    if not first.devices and not first.failures:
        raise BackendUnavailable(f"the {session.backend.name} backend sees no GPU: refusing to call zero GPUs "
                                 "ready", [f"{session.backend.name}: device count 0"])
    watch.observe(first, clock())
    notes = _health_notes(first)
    health = first
    faults: list[GpuFault] = []
    errors: dict[int, BaseException] = {}

    # The GPU of each selected MIG instance, for one that a later reading no longer has.
    parents = {m.uuid: d.index for d in first.devices for m in d.mig_devices or () if m.uuid is not None}

    def judge(snap: Snapshot, read: Snapshot | None = None) -> tuple[GpuVerdict, ...]:
        """The verdicts on ``snap``, its health from ``read`` (default: the health read last)."""
        units = _units(snap, mig)
        now = clock()

        def verdicts(unlisted: tuple[Holder, ...], unscanned: str | None = None) -> tuple[GpuVerdict, ...]:
            return classify(snap, now_ns=now, watch=watch, max_used_bytes=max_used_bytes, need_bytes=need_bytes,
                            need_fraction=need_fraction, health=health if read is None else read, faults=faults,
                            errors=errors, unlisted=unlisted, unlisted_unknown=unscanned, units=units)

        out = verdicts(())
        # Memory held with an empty list past the bound reads as stuck: only then is the device-file scan worth its
        # cost (a process of another PID namespace's numbering makes it held instead; a scan that could not finish
        # makes it unknown: it cannot say that nothing holds the memory).
        if any(c.class_ == "stuck" and c.kind == "memory" for v in out for c in v.culprits):
            out = verdicts(*scan(units or snap.devices))
        return out + _missing_units(snap, mig, units, parents=parents, indices=indices,
                                   judged={v.index for v in out})

    verdicts = judge(first)
    # Waiting cannot help an unhealthy GPU, nor a need beyond what a GPU has with nothing running; and a first
    # reading cut by the deadline leaves no time to wait.
    if bound == 0 or late or any(v.class_ == "unhealthy" or v.beyond_capacity for v in verdicts):
        return ReadyReport(verdicts, first, clock() - start, 1, bound, notes)

    if mig:
        # The instances as resolved now, judged by UUID: one destroyed while waiting is then unknown (never ready),
        # where selecting it again by UUID would fail the call.
        predicate = on_devices(mig, predicate)
    if all(v.ready for v in verdicts) and predicate.check(first) is True:
        # The first reading (the wait's fields and health) is the first clean poll of the run that stable_polls
        # asks for: confirm it with the rest, each a reading with health, rather than start the count over.
        confirmed = _confirm(session, indices, opts, deadline_ns=deadline_ns, watch=watch,
                             judge=lambda snap: judge(snap, snap), predicate=predicate, first=(first, verdicts))
        if confirmed is not None:
            return ReadyReport(confirmed[1], confirmed[0], clock() - start, watch.observed, bound,
                               *_with_events(session, notes, indices, read_from_ns))

    recheck = _HealthOnEvents(session, indices, deadline_ns, clock, since_ns=read_from_ns,
                              pending=bool(_transient_gpus(first)))
    # Judged on the health read last while waiting (after an event), else the first reading's.
    stuck = _StuckEnds(watch, lambda snap: judge(snap, recheck.health(health)), clock, max_used_bytes=max_used_bytes,
                       mig=mig)
    while True:
        remaining = None if bound is None else left_s(bound, (clock() - start) / 1e9)  # used up: bounded, not 0
        waited = _wait(session, indices, predicate, opts.with_(timeout=remaining), watch,
                       faults=faults, errors=errors, after_poll=(recheck, stuck))
        final = waited[0] or first
        health = recheck.health(health)
        if not waited[1]:
            break
        # Ready: read the health again before saying so (one reading past the wait at most). A remap can become
        # pending while waiting with no XID heard: events off, the nvidia-smi backend, an XID 63 missed. Not after a
        # timeout: it would overrun the deadline, and the GPU is not called ready then anyway.
        health, transient = _health_again(session, indices, clock)
        verdicts = judge(final)
        # A health value that failed with a transient error (NVML_ERROR_UNKNOWN, a timeout, an nvidia-smi run that
        # failed) is asked again, as the poller asks again after a transient error: the wait goes on (its stable
        # polls, then the health) until the deadline. Only then is it unknown, with its reason. Not when another
        # GPU is not ready for a reason that waiting cannot change here (unhealthy, a lasting error).
        if (not transient or any(v.needs_operator or (not v.ready and v.index not in transient) for v in verdicts)
                or not _pause(opts, session, deadline_ns)):
            return ReadyReport(verdicts, final, clock() - start, watch.observed, bound,
                               *_with_events(session, notes, indices, read_from_ns))
    # A GPU stuck past its bound ended the wait at that poll (waiting cannot help: exit 5): its verdicts stand.
    final, verdicts = stuck.found or (final, judge(final))
    if all(v.ready for v in verdicts):
        # The deadline came after a clean reading but before the run stable_polls asks for (and the health reading
        # that follows it): not confirmed, never called ready.
        verdicts = tuple(_unconfirmed(v, opts.stable_polls) for v in verdicts)
    return ReadyReport(verdicts, final, clock() - start, watch.observed, bound,
                       *_with_events(session, notes, indices, read_from_ns))


def _with_events(session: Session, notes: tuple[str, ...], indices: tuple[int, ...] | None,
                 since_ns: int) -> tuple[tuple[str, ...], tuple[ListeningGap, ...] | None]:
    """``notes`` and, when the listener could not cover every GPU, why; then the times it did not listen to the
    selected GPUs since ``since_ns`` (``None``: no listener), each a note too: a ``ready`` that waited while the
    listener recovered or stalled heard no XID of those GPUs then, and said nothing of it once it ran again."""
    listener = session.listener
    if listener is None:
        return notes, None
    gaps = listener.gaps(indices, since_ns)
    reason = listener.reason
    # A gap that lasts is the listener's reason now (said once, below); one that ended, nothing else says.
    out = [*notes, *(f"events: {g.line()}" for g in gaps if g.ended_ns is not None or reason is None)]
    if reason is not None:
        out.append(f"events: {reason}")
    return tuple(out), gaps


def _pause(opts: WaitOptions, session: Session, deadline_ns: int | None) -> bool:
    """Sleep the polling policy's interval before asking again, never past ``deadline_ns``: whether time is left
    (``False``: the deadline came, nothing slept past it)."""
    from ._waitoptions import SMI_DEFAULT, _resolve_policy

    policy = SMI_DEFAULT if opts.policy is None and session.backend.name == "smi" else _resolve_policy(opts.policy)
    pause_ns = round(policy.interval_s * 1e9)
    if deadline_ns is not None:
        left = deadline_ns - opts.clock()
        if left <= pause_ns:
            return False
    if pause_ns > 0:
        opts.sleep(pause_ns / 1e9)
    return True


def _transient_gpus(snap: Snapshot) -> frozenset[int]:
    """The GPUs of a health reading that it could not read for a transient reason (a failure whose error is
    transient, a health value unread after a transient NVML code or nvidia-smi's ``[Unknown Error]``)."""
    out = {f.index for f in snap.failures if isinstance(f.error, NvmlCheckError) and f.error.TRANSIENT}
    for d in snap.devices:
        if any(key.startswith("health") and _transient_reason(why) for key, why in d.unknown.items()):
            out.add(d.index)
    return frozenset(out)


def _transient_reason(why: str) -> bool:
    """Whether an ``unknown`` reason tells of a transient failure: an NVML return code whose class is transient
    (``... returned NVML_ERROR_UNKNOWN (999)``), or nvidia-smi's ``[Unknown Error]`` (that code, printed)."""
    import re

    from .errors import error_class_for_code

    if "[Unknown Error]" in why:
        return True
    found = re.search(r"NVML_ERROR_[A-Z_]+ \((\d+)\)", why)
    return found is not None and error_class_for_code(int(found.group(1))).TRANSIENT


def _unresolved(session: Session, devices: Iterable[DeviceSelector] | DeviceSelector | None, bound: float | None,
                start: int, clock: Callable[[], int]) -> ReadyReport:
    """The report of a call whose deadline came while the GPUs its selection names were still being read (a UUID,
    ``cuda:N`` or ``MIG-...`` selector: a slow GPU or nvidia-smi run): which GPUs it names is unknown, so every GPU
    of the host is ``unknown`` with that reason (it may name any of them), never ready, never a hang."""
    from ._deadline import USED_UP_S
    from .session import _selectors

    named = ", ".join(repr(s) for s in _selectors(() if devices is None else devices))
    if bound is not None and 0 < bound <= USED_UP_S:  # the caller's setup (opening the GPUs) took the timeout
        why = NvmlCheckError(f"the timeout was used up before the GPUs the selection ({named}) names could be read "
                             "(opening the GPUs took it): which GPUs it names is unknown")
    else:
        why = NvmlCheckError(f"the deadline ({bound:g} s) came while the GPUs the selection ({named}) names were "
                             "still being read (a slow or hung GPU, or nvidia-smi): which GPUs it names is unknown")
    snap = _failed_reading(session, None, why, start, clock)
    if not snap.failures:
        raise BackendUnavailable(f"the {session.backend.name} backend sees no GPU: refusing to call zero GPUs ready",
                                 [f"{session.backend.name}: device count 0"])
    verdicts = classify(snap, now_ns=clock(), health=snap)
    return ReadyReport(verdicts, snap, clock() - start, 0, bound)


def _health_again(session: Session, indices: tuple[int, ...] | None,
                  clock: Callable[[], int]) -> tuple[Snapshot, frozenset[int]]:
    """The selected GPUs' health, read again, and the GPUs it could not read for a transient reason
    (:func:`_transient_gpus`: asking again may help). A reading that fails as a whole (an nvidia-smi run that
    failed) makes each GPU a failure saying so: judged unknown, never ready, and never an error that hides the
    verdicts."""
    backend = session.backend
    try:
        snap = backend.snapshot(indices, Fields.HEALTH)
    except NvmlCheckError as exc:
        snap = _failed_reading(session, indices, NvmlCheckError(f"the health could not be read again ({exc})"),
                               clock(), clock)
        return snap, frozenset(f.index for f in snap.failures) if exc.TRANSIENT else frozenset()
    return snap, _transient_gpus(snap)


def _failed_reading(session: Session, indices: tuple[int, ...] | None, why: Exception, start: int,
                    clock: Callable[[], int]) -> Snapshot:
    """A reading of the selected GPUs in which each is a failure with ``why``."""
    from .model import DeviceFailure

    backend = session.backend
    chosen = range(backend.device_count()) if indices is None else indices
    return Snapshot(backend=backend.name, taken_ns=start, duration_ns=clock() - start, wall_time=time.time(),
                    system=backend.system(), devices=(), failures=tuple(DeviceFailure(i, None, why) for i in chosen))


def _unconfirmed(v: GpuVerdict, stable_polls: int) -> GpuVerdict:
    """A verdict of ready from a wait that timed out, made ``unknown``: the clean reading was not confirmed."""
    from ._record import replace

    why = (f"clean on the last reading, but the deadline came before {stable_polls} consecutive clean polls "
           "confirmed it and its health was read again: not confirmed, never ready")
    return replace(v, class_="unknown", culprits=(Culprit(v.index, "unknown", "unconfirmed", why),))


def _confirm(
    session: Session,
    indices: tuple[int, ...] | None,
    opts: WaitOptions,
    *,
    deadline_ns: int | None,
    watch: Watch,
    judge: Callable[[Snapshot], tuple[GpuVerdict, ...]],
    predicate: Predicate,
    first: tuple[Snapshot, tuple[GpuVerdict, ...]],
) -> tuple[Snapshot, tuple[GpuVerdict, ...]] | None:
    """After a ``first`` reading that was ready: the ``stable_polls - 1`` confirmations the consecutive-clean rule
    still needs (none for 1), each after the policy's confirmation interval, read with health (so no health reading
    follows) and by the deadline. The last reading and its verdicts when every one was ready, or when one found what
    ends the call at once (an unhealthy GPU, a need beyond capacity); ``None`` when one was not ready, or the
    deadline came first: the wait's poller takes over, from a run of none."""
    from ._deadline import read_by
    from ._waitoptions import SMI_DEFAULT, _resolve_policy

    clock, sleep = opts.clock, opts.sleep
    policy = SMI_DEFAULT if opts.policy is None and session.backend.name == "smi" else _resolve_policy(opts.policy)
    pause_ns = round((policy.interval_s if policy.confirm_interval_s is None else policy.confirm_interval_s) * 1e9)
    last = first
    for _ in range(opts.stable_polls - 1):
        if pause_ns > 0:
            now = clock()
            wait_ns = pause_ns if deadline_ns is None else min(pause_ns, deadline_ns - now)
            if wait_ns <= 0:
                return None
            sleep(wait_ns / 1e9)
        try:
            snap = read_by(session.backend, indices, Fields.WAIT | Fields.HEALTH, deadline_ns, clock)
        except NvmlCheckError as exc:
            if exc.TRANSIENT:
                return None  # the wait's poller asks again, as it does after any transient error
            raise
        if snap is None:
            return None
        watch.observe(snap, clock())
        verdicts = judge(snap)
        if any(v.class_ == "unhealthy" or v.beyond_capacity for v in verdicts):
            # A cause this reading found (its health: a remap pending since the first): waiting cannot help, as
            # when the first reading finds it; handed to the wait, it was forgotten (judged on older health).
            return snap, verdicts
        if not all(v.ready for v in verdicts) or predicate.check(snap) is not True:
            return None
        last = snap, verdicts
    return last


def _mig_instances(session: Session, devices: Iterable[DeviceSelector] | DeviceSelector | None, bound: float | None,
                   start: int, clock: Callable[[], int]) -> list[DeviceSelector]:
    """The selected MIG instances, read by ``ready``'s deadline (:meth:`Session._mig_instances`). Cut by the
    deadline, none: each selected GPU is then judged whole (never laxer than its instance), by a first reading that
    the same deadline cuts too, so it is unknown, never ready."""
    from .errors import WaitTimeout

    try:
        return session._mig_instances(devices, bound, start, clock)
    except WaitTimeout:
        return []


def _ready_options(timeout: float | None, events: bool | None, options: WaitOptions | None) -> WaitOptions:
    """The wait options of a ``ready`` call: a keyword given wins; else the options' field where a caller set it;
    else ``ready``'s defaults (one check; listening for XIDs). Values are checked here, before anything opens."""
    from ._waitoptions import WaitOptions

    base = WaitOptions.or_default(options)
    if isinstance(timeout, Default):
        timeout = base.timeout if base.given("timeout") else timeout.value
    if events is None:
        events = base.events if base.given("events") and base.events is not None else True
    return base.with_(timeout=timeout, events=events)


def _first_reading(session: Session, indices: tuple[int, ...] | None, opts: WaitOptions, start: int,
                   clock: Callable[[], int]) -> tuple[Snapshot, bool]:
    """The first reading, health included, and whether the deadline cut it. One check (``bound`` 0) always completes,
    as a wait's does (an error is the call's). With a timeout (or none) the reading stops at the deadline (at most
    one query late), and a transient error (an nvidia-smi run that failed, NVML_ERROR_UNKNOWN for the whole
    reading) is asked again after a poll interval, as the poller asks again; cut by the deadline, every selected
    GPU is a failure saying why: judged unknown, never ready."""
    from ._deadline import USED_UP_S, ns_or_none, read_by

    backend, bound = session.backend, opts.timeout
    if bound == 0:  # one check, which always completes: only a hung call is cut (ready_on's watchdog)
        return backend.snapshot(indices, Fields.WAIT | Fields.HEALTH), False
    bound_ns = None if bound is None else ns_or_none(bound)
    deadline_ns = None if bound_ns is None else start + bound_ns
    failed: NvmlCheckError | None = None
    while True:
        try:
            snap = read_by(backend, indices, Fields.WAIT | Fields.HEALTH, deadline_ns, clock)
        except NvmlCheckError as exc:
            if not exc.TRANSIENT:
                raise
            failed = exc
            if _pause(opts, session, deadline_ns):
                continue
            snap = None
        if snap is not None:
            return snap, False
        if bound is not None and bound <= USED_UP_S:  # a caller's setup (opening, the selection) took the timeout
            why = ("the first reading did not complete: the timeout was used up before it (opening the GPUs and "
                   "reading the selection took it)")
        else:
            why = f"the first reading did not complete within the timeout ({bound:g} s)"
        if failed is not None:
            why += f"; the last attempt failed: {failed}"
        return _failed_reading(session, indices, NvmlCheckError(why), start, clock), True


def _capacity(need_bytes: int | None, need_fraction: float | None) -> Predicate | None:
    """The capacity predicate of a need (``None``: none given); a ``TypeError``/``ValueError`` naming the keyword
    for a bad one, or for both."""
    if need_bytes is None and need_fraction is None:
        return None
    if need_bytes is not None and need_fraction is not None:
        raise ArgumentError(f"give need_bytes or need_fraction, not both (got {need_bytes!r} and {need_fraction!r})")
    if need_fraction is not None:
        return memory_free_at_least(fraction=check_fraction("need_fraction", need_fraction))
    return memory_free_at_least(need_bytes)


def _wait(
    session: Session,
    devices: Iterable[DeviceSelector] | DeviceSelector | None,
    predicate: Predicate,
    opts: WaitOptions,
    watch: Watch,
    *,
    faults: list[GpuFault],
    errors: dict[int, BaseException],
    after_poll: Sequence[Callable[[], None]] = (),
) -> tuple[Snapshot | None, bool]:
    """Poll with the ready predicate through the session's wait, the watch seeing every poll: the last reading
    (``None``: none beyond what the watch saw) and whether the wait ended ready. A fatal event lands in
    ``faults``, a GPU that became unreadable in ``errors``: both are judged, not raised. ``after_poll``: called
    after each poll, in order (:class:`_HealthOnEvents` reads the health again after an XID or ECC event, and stops
    the wait when it finds a cause)."""
    if opts.timeout == 0:
        # No time left to wait (a timeout of 0 would be one check judged alone: ready on a single reading).
        return watch.last_full, False
    observe = watch.on_poll(opts.clock)
    user = opts.on_poll

    def on_poll(point: TracePoint) -> None:
        observe(point)
        if user is not None:
            user(point)
        for step in after_poll:
            step()

    try:
        return session.wait_until_clean(opts.timeout, predicate, devices=devices,
                                        options=opts.with_(on_poll=on_poll)).snapshot, True
    except WaitTimeout as exc:
        return exc.snapshot or watch.last_full, False
    except (_Unhealthy, _Stuck):
        pass
    except GpuFault as fault:
        faults.append(fault)
    except NvmlCheckError as exc:
        # A GPU that became unreadable (lost, no permission, an impossible value: CorruptData) is judged, as the
        # one-shot check judges it, not raised; an error of no one GPU is.
        index = getattr(exc, "device_index", None)
        if not isinstance(index, int) or isinstance(index, bool):
            raise
        errors[index] = exc
    return watch.last_full, False


class _Unhealthy(Exception):
    """Raised from a poll's ``on_poll`` to end ``ready``'s wait: the health read after an event found a cause."""


class _Stuck(Exception):
    """Raised from a poll's ``on_poll`` to end ``ready``'s wait: a GPU is ``stuck`` (:class:`_StuckEnds`)."""


class _StuckEnds:
    """After each poll: once something that can become ``stuck`` has lasted the least stuck bound (memory held with
    nothing listed: :meth:`~nvmlcheck.verdict.Watch.teardown_age_ns`; a listed zombie or D-state holder:
    :meth:`~nvmlcheck.verdict.Watch.exited_age_ns`), judge the poll (the device-file scan runs then, once, by the
    deadline, when memory is held with nothing listed); a ``stuck`` verdict ends the wait (:class:`_Stuck`), that
    poll and its verdicts in :attr:`found`. Waiting cannot help a stuck GPU (docs/ready.md, the decision table: exit
    5), so the wait does not go on to its deadline; the verdicts are those of that poll, never a later judgement that
    a zombie reaped since would make ``reclaiming``. A listed PID that is merely not visible here is never stuck
    (``held`` past the bound): it costs no judgement per poll."""

    def __init__(self, watch: Watch, judge: Callable[[Snapshot], tuple[GpuVerdict, ...]], clock: Callable[[], int],
                 *, max_used_bytes: int, mig: Sequence[int | str]) -> None:  # fmt: skip
        self.watch = watch
        self.judge = judge
        self.clock = clock
        self.max_used_bytes = max_used_bytes
        self.mig = mig
        self.found: tuple[Snapshot, tuple[GpuVerdict, ...]] | None = None

    def _due(self, last: Snapshot) -> bool:
        now = self.clock()
        if (self.watch.exited_age_ns(now) or 0) >= _MIN_BOUND_NS:
            return True
        if (self.watch.teardown_age_ns(now) or 0) < _MIN_BOUND_NS:
            return False
        # Memory held with nothing listed (a listed PID not visible here is held, never stuck).
        return any(_held_unlisted(d, self.max_used_bytes) for d in (*last.devices, *(_units(last, self.mig) or ())))

    def __call__(self) -> None:
        last = self.watch.last_full
        if self.found is not None or last is None or not self._due(last):
            return
        verdicts = self.judge(last)
        if any(v.class_ == "stuck" for v in verdicts):
            self.found = last, verdicts
            raise _Stuck


class _HealthOnEvents:
    """After each poll: when the listener has heard an XID or an ECC event on a selected GPU since the last call
    (XID 63: a row remapping recorded; 154: a recovery action set; 92, 94; a single-bit ECC event), read the
    selected GPUs' health again, by the deadline; a health cause (or a GPU that reading finds lost) ends the wait
    (:class:`_Unhealthy`), that reading in :attr:`unhealthy`. Fatal events stop the wait by themselves
    (``GpuFault``); clock, P-state and power events say nothing of health."""

    def __init__(self, session: Session, indices: tuple[int, ...] | None, deadline_ns: int | None,
                 clock: Callable[[], int], *, since_ns: int = 0, pending: bool = False) -> None:  # fmt: skip
        self.session = session
        # An event heard before the first reading (a listener the caller started earlier) is in that reading's
        # health already: it prompts no second one.
        self.since_ns = since_ns
        self.indices = indices
        self.deadline_ns = deadline_ns
        self.clock = clock
        self.seen = 0
        # An event whose health reading failed (as a whole, or a value unread for a transient reason), or a first
        # reading whose health did: read again after the next poll until a reading succeeds, never forgotten (the
        # wait would time out calling a GPU that needs a reset "held", or a held GPU "unknown").
        self.pending = pending
        self.unhealthy: Snapshot | None = None
        #: The last health reading made (``None``: none): newer than the first reading's.
        self.latest: Snapshot | None = None

    def health(self, last: Snapshot) -> Snapshot:
        """The health to judge by after a wait: the reading that found a cause (an XID or ECC event on a selected
        GPU, and the health read it prompted says reset: XID 63's pending remap, XID 154's recovery action; the
        wait stopped there), else the last one made while waiting (newer than ``last``), else ``last``."""
        if self.unhealthy is not None:
            return self.unhealthy
        return last if self.latest is None else self.latest

    def __call__(self) -> None:
        if self.unhealthy is not None:
            return
        listener = self.session.listener
        new: list[GpuEvent] = []
        if listener is not None:
            new, self.seen = listener.next_events(self.seen, 0.0)
        wanted = None if self.indices is None else frozenset(self.indices)
        if not self.pending and not any(e.kind.value in _HEALTH_EVENTS and (wanted is None or e.index in wanted)
                                        and e.time_ns >= self.since_ns for e in new):
            return
        from ._deadline import read_by
        from .verdict import error_culprit, health_causes

        self.pending = True
        try:
            snap = read_by(self.session.backend, self.indices, Fields.HEALTH, self.deadline_ns, self.clock)
        except NvmlCheckError:  # a reading that failed as a whole says nothing of health: the wait goes on
            return
        if snap is None:  # the deadline came first: the wait times out on its own
            return
        self.pending = bool(_transient_gpus(snap))
        self.latest = snap
        if any(c.class_ == "unhealthy" for d in snap.devices for c in health_causes(d)) or any(
            error_culprit(f.index, f.error).class_ == "unhealthy" for f in snap.failures
        ):
            self.unhealthy = snap
            raise _Unhealthy


#: The event kinds that can announce a change of health (``EventKind`` values): all but clock, P-state, power source
#: and MIG configuration changes (what runs where, not health); a type nvmlcheck cannot name may be health.
_HEALTH_EVENTS = frozenset({
    "xid", "single_bit_ecc", "double_bit_ecc", "single_bit_ecc_storm", "dram_retirement", "dram_retirement_failure",
    "nonfatal_poison", "fatal_poison", "gpu_unavailable", "gpu_recovery_action", "unknown",
})


def ready(
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    *,
    need_bytes: int | None = None,
    need_fraction: float | None = None,
    max_used_bytes: int | None = None,
    timeout: float | None = READY_TIMEOUT,
    backend: str = "auto",
    events: bool | None = None,
    options: WaitOptions | None = None,
) -> ReadyReport:
    """Open a session, judge the selected GPUs (:func:`ready_on`), close it. A finite ``timeout`` (``0``
    included) bounds the whole call, the opening included, by :func:`~nvmlcheck.wait_until_clean`'s rule
    (``session.open_timeouts``).

    >>> import nvmlcheck as nc
    >>> report = nc.ready([0], need_fraction=0.9, timeout=30.0)        # doctest: +SKIP
    >>> report.ready, [v.line() for v in report.verdicts]                # doctest: +SKIP
    """
    from .session import _checked_selection, in_session

    # Checked before the session opens, with this call's names: a bad one is refused with nothing read.
    timeout = _ready_options(timeout, events, options).timeout
    devices = _checked_selection(devices)
    _capacity(need_bytes, need_fraction)
    if max_used_bytes is not None:
        check_bytes("max_used_bytes", max_used_bytes)
    return in_session(backend, timeout, lambda session, left: ready_on(
        session, devices, need_bytes=need_bytes, need_fraction=need_fraction, max_used_bytes=max_used_bytes,
        timeout=left, events=events, options=options))


def _units(snap: Snapshot, mig: Sequence[int | str]) -> tuple[DeviceState, ...] | None:
    """The judged units of a MIG selection (each MIG UUID its instance, each other selector its GPU); ``None``
    without MIG (every device of the snapshot)."""
    if not mig:
        return None
    out: list[DeviceState] = []
    for s in mig:
        for d in snap.devices:
            if isinstance(s, int) and d.index == s:
                out.append(d)
            elif isinstance(s, str):
                out.extend(instance_view(d, m) for m in d.mig_devices or () if m.uuid == s)
    return tuple(out)


def _missing_units(
    snap: Snapshot,
    mig: Sequence[int | str],
    units: Sequence[DeviceState] | None,
    *,
    parents: dict[str, int],
    indices: tuple[int, ...] | None,
    judged: set[int],
) -> tuple[GpuVerdict, ...]:
    """An ``unknown`` verdict for each selected MIG instance the reading does not have (destroyed, or its GPU left
    MIG mode): never dropped from the report, which would call the rest of the selection ready. Not for one whose
    GPU failed: that GPU's own verdict says why."""
    if not mig or units is None:
        return ()
    found = {u.uuid for u in units}
    failed = {f.index for f in snap.failures}
    out: list[GpuVerdict] = []
    for s in mig:
        if not isinstance(s, str) or s in found:
            continue
        index = parents.get(s, indices[0] if indices else 0)
        if index in failed and index in judged:
            continue
        why = f"{s} is not in the reading (the MIG instance was destroyed, or its GPU left MIG mode): never ready"
        out.append(GpuVerdict(index, s, f"GPU {index} {s}", "unknown", (Culprit(index, "unknown", "query", why),)))
    return tuple(out)


#: The least stuck bound of any reclaim model (:meth:`~nvmlcheck.reclaim_model.ReclaimModel.stuck_after_ns`): no
#: teardown younger than this is stuck, so the wait looks for one only past it.
_MIN_BOUND_NS = 1_000_000_000


class _UnlistedScan:
    """The device-file scan of one ``ready`` call, run once (:func:`_unlisted`) by its deadline, and its result."""

    def __init__(self, session: Session, max_used_bytes: int, deadline_ns: int | None,
                 clock: Callable[[], int]) -> None:  # fmt: skip
        self.session = session
        self.max_used_bytes = max_used_bytes
        self.deadline_ns = deadline_ns
        self.clock = clock
        self.done = False
        self.result: tuple[tuple[Holder, ...], str | None] = ((), None)

    def __call__(self, units: Sequence[DeviceState]) -> tuple[tuple[Holder, ...], str | None]:
        """The unlisted holders and why the scan is incomplete (``None``: complete); scanned on the first call
        (later ones keep its holders that still live: a process ended since holds nothing)."""
        if not any(_held_unlisted(d, self.max_used_bytes) for d in units):
            return (), None
        if not self.done:
            self.done = True
            self.result = _unlisted(self.session, self.deadline_ns, self.clock)
        holders, why = self.result
        return tuple(h for h in holders if _same_process(h)), why


def _same_process(h: Holder) -> bool:
    from ._proc import procfs

    st = procfs.read_stat(h.pid)
    return st is not None and st.start_ticks == h.start_ticks and st.state not in ("Z", "X")


def _unlisted(session: Session, deadline_ns: int | None, clock: Callable[[], int]) -> tuple[tuple[Holder, ...],
                                                                                            str | None]:
    """Processes with an NVIDIA device file open that are on no GPU's list (they may hold memory from another PID
    namespace's numbering), and why the answer is incomplete (``None``: it is complete). Read by ``deadline_ns``:
    every GPU's process lists, then ``/proc/*/fd`` (seconds on a host with many descriptors), then each process
    found; what the deadline leaves unread is said, never taken for "no holder"."""
    import os

    from ._deadline import read_by
    from ._proc import devfiles, procfs
    from .holders import describe_process

    try:
        every = read_by(session.backend, None, Fields.PROCESSES, deadline_ns, clock)
        if every is None:
            return (), "the deadline came before every GPU's process list was read for the device-file scan"
        unread = [f.index for f in every.failures] + [d.index for d in every.devices if d.processes is None]
        if unread:
            return (), f"GPU {', '.join(map(str, sorted(unread)))}'s process list could not be read for the scan"
        fds = devfiles.scan(deadline_ns=deadline_ns, clock=clock)
    except (OSError, NvmlCheckError) as exc:  # any backend's error (nvidia-smi's too), or /proc unreadable
        return (), f"the device-file scan failed ({type(exc).__name__}: {exc})"
    why = None
    if fds.unscanned:
        why = (f"the device-file scan was cut short by the deadline ({fds.unscanned} processes not read; "
               "`nvmlcheck holders` reads them all)")
    elif fds.unreadable:
        why = (f"{len(fds.unreadable)} processes' open files could not be read (not permitted): run as root to see "
               "every holder")
    listed = {p.pid for d in every.devices for p in d.processes or ()}
    me = (os.getpid(), procfs.ancestors())
    out: list[Holder] = []
    for pid in sorted(set(fds.holders) - listed):
        if deadline_ns is not None and clock() >= deadline_ns:
            why = why or "the deadline came before every process the device-file scan found was read"
            break
        out.append(describe_process(pid, found_by=frozenset({"device-file"}), device_files=fds.holders[pid],
                                    gpu_device_files=fds.gpu_files.get(pid, ()), me=me))
    return tuple(out), why


def _held_unlisted(d: DeviceState, max_used_bytes: int) -> bool:
    m = d.memory
    return d.processes == () and m is not None and not m.used_includes_reserved and m.used_bytes > max_used_bytes


def _health_notes(snap: Snapshot) -> tuple[str, ...]:
    """Health values a GPU does not support: said once, never a refusal."""
    where: dict[tuple[str, str], list[str]] = {}
    for d in snap.devices:
        for key, why in sorted(d.unknown.items()):
            if key.startswith("health") and unsupported(why):
                where.setdefault((key, why), []).append(str(d.index))
    return tuple(f"{key} not judged on GPU {', '.join(gpus)} ({why})" for (key, why), gpus in where.items())
