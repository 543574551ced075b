"""Kill exactly what holds the GPUs, and wait until they are verified clean, timing each phase.

:func:`prepare_kill` validates and pins every target before anything is signalled (all or nothing): a pidfd holds
each process's identity, so a signal can never reach a process that took a target's PID. :meth:`KillPlan.send_first`
sends the first signal; :meth:`KillPlan.wait` escalates to SIGKILL after the grace period (any target still alive,
on a GPU list or not), follows late-spawned descendants with ``tree=True``, and returns a :class:`KillResult` only
when every target has exited *and* the GPUs are clean. The split lets a CLI signal before it loads NVML.
:func:`kill_and_wait` does all three. Refused: PID 0, 1, negatives, PIDs above ``pid_max``, threads, kernel
threads, this process and every ancestor of it. Nothing is ever reaped. Rationale, guarantees and limits:
docs/killing.md.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._deadline import left_s, ns_or_none
from ._proc import procfs, signals, targets
from ._proc.procfs import ProcUnreadable
from ._proc.targets import Refused, Target, TargetSet
from ._text import printable
from ._waitdefaults import CLOCK, EVENTS, ON_POLL, POLICY, SLEEP, STABLE_POLLS, TIMEOUT, Default
from .errors import ArgumentError, ArgumentTypeError, BackendUnavailable, NvmlCheckError, StateError, WaitTimeout
from .holders import Holder, holder_list
from .model import Snapshot
from .predicates import Predicate, _Scope, _Why, check_predicate, default_predicate

if TYPE_CHECKING:
    # Types only: prepare_kill and send_first run before anything of the GPU side is needed (issue 12).
    from ._proc import selectors
    from ._proc.pin import PinMode
    from .session import DeviceSelector, Session
    from .verdict import Culprit
    from .wait import PollPolicy, TracePoint, WaitOptions, WaitResult

__all__ = [
    "FoundBy",
    "KillError",
    "KillPlan",
    "KillResult",
    "KillTimeout",
    "NotPermitted",
    "PidTimes",
    "ProcessGone",
    "SignalSent",
    "kill_and_wait",
    "kill_records",
    "prepare_kill",
]

#: How a target was chosen: named by the caller, a descendant of one (``tree=True``), a holder found by NVML or by
#: its open device files, a command line that ``match`` matched, or a member of ``container``.
FoundBy = Literal["named", "descendant", "nvml", "device-file", "match", "container"]

#: The shortest time between two scans for descendants while targets live (each scan reads a few /proc files per
#: process of the tree; the poller may poll every millisecond).
_SCAN_EVERY_NS = 5_000_000
#: When the GPU side fails mid-kill and the kill has no timeout: how long after the SIGKILL the targets' exits are
#: still awaited, with the operating system alone, before the error is raised with their records.
AFTER_KILL_WAIT_S = 5.0


class KillError(NvmlCheckError):
    """A PID cannot be signalled: refused (not a process ID, PID 1, a thread, a kernel thread, this process or an
    ancestor of it), no such process (ESRCH), or not permitted (EPERM: another user's or another container's
    process). Raised before anything is signalled."""

    __module__ = "nvmlcheck"

    def __init__(self, pid: int, reason: str) -> None:
        self.pid = pid
        self.reason = reason
        super().__init__(f"cannot signal PID {pid}: {reason}")


class ProcessGone(KillError):
    """The named PID names no process (ESRCH), or no longer the process that was found (it exited and its PID may
    have been reused). ``missing_ok=True`` (``--missing-ok``) skips such a PID instead."""

    __module__ = "nvmlcheck"


class NotPermitted(KillError):
    """This process may not signal that PID (EPERM): another user's process, or one in another container."""

    __module__ = "nvmlcheck"


@dataclass(frozen=True, slots=True)
class SignalSent:
    """One signal delivered to a target: its name (``"SIGTERM"``) and when, in ns from the first signal."""

    name: str
    sent_ns: int


@dataclass(frozen=True, slots=True)
class PidTimes:
    """What happened to one target, as offsets in ns from the first signal (``None``: not observed).

    ``found_by``: see :data:`FoundBy`; ``parent``: for a descendant, the target it descends from. ``signals``: every
    signal actually delivered (none when it had exited already). ``exited_ns``: first poll that found it exited (gone
    or a zombie: its GPU file descriptors are closed then). ``off_gpu_ns``: first poll whose process lists no longer
    showed its PID. ``pinning``: ``"pidfd"`` or ``"start-time"`` (docs/killing.md). ``discarded``: why the kernel
    would have discarded the first signal (it ignores it, or it is a PID-namespace init without a handler), so
    SIGKILL was sent at once instead; ``None`` when the first signal was sent as asked.
    """

    pid: int
    found_by: FoundBy
    name: str
    signals: tuple[SignalSent, ...]
    exited_ns: int | None
    off_gpu_ns: int | None
    parent: int | None = None
    pinning: Literal["pidfd", "start-time"] = "pidfd"
    discarded: str | None = None

    @property
    def killed_ns(self) -> int | None:
        """When SIGKILL was sent (``None`` if it was not)."""
        return next((s.sent_ns for s in self.signals if s.name == "SIGKILL"), None)

    def to_json(self) -> dict[str, Any]:
        """The target's entry in the ``nvmlcheck/kill`` JSON document."""
        return {
            "pid": self.pid,
            "name": self.name,
            "found_by": self.found_by,
            "parent": self.parent,
            "signals": [{"signal": s.name, "sent_ns": s.sent_ns} for s in self.signals],
            "killed_ns": self.killed_ns,
            "exited_ns": self.exited_ns,
            "off_gpu_ns": self.off_gpu_ns,
            "pinning": self.pinning,
            "discarded": self.discarded,
        }


@dataclass(frozen=True, slots=True)
class KillResult:
    """A kill that ended with every target exited and the GPUs clean. Times are offsets in ns from the first
    signal, named as in :class:`~nvmlcheck.WaitResult`; ``started_ns`` is the one absolute clock reading.

    ``pids``: one record per target (descendants included). ``clean_ns``: when the GPUs were first seen clean with
    every target exited and off the process lists (so never before any target's ``exited_ns`` or ``off_gpu_ns``:
    both are stamped on the same clock as the polls); ``confirmed_ns``: when that was confirmed. ``resolution_ns``:
    the poll period, the uncertainty of each time. ``started_ns``: the clock reading of the first signal.
    ``missing``: named PIDs that were gone already (``missing_ok``). ``only_targets``: "clean" judged only what the
    targets held (:func:`~nvmlcheck.released.targets_released`), and ``not_ours`` names what else holds the GPUs.
    ``wait``: the wait's own :class:`~nvmlcheck.WaitResult` (its offsets count from its own start, after the signal).
    """

    signal_name: str
    started_ns: int
    pids: tuple[PidTimes, ...]
    clean_ns: int
    confirmed_ns: int
    resolution_ns: int
    wait: WaitResult
    tree: bool = False
    missing: tuple[int, ...] = ()
    only_targets: bool = False
    not_ours: tuple[str, ...] = ()

    @property
    def snapshot(self) -> Snapshot:
        """The last snapshot (clean)."""
        return self.wait.snapshot

    def to_json(self) -> dict[str, Any]:
        """The fields of the ``nvmlcheck/kill`` JSON document (version 2) besides ``schema``/``version`` and the
        snapshot, which the CLI serialises itself."""
        return {
            "clean": True,
            "signal": self.signal_name,
            "tree": self.tree,
            "pids": [t.to_json() for t in self.pids],
            "clean_ns": self.clean_ns,
            "confirmed_ns": self.confirmed_ns,
            "resolution_ns": self.resolution_ns,
            "missing": list(self.missing),
            "judged": "targets" if self.only_targets else "gpus",
            "not_ours": list(self.not_ours),
        }


class KillTimeout(WaitTimeout):
    """The deadline passed before every target had exited and the GPUs were clean.

    Besides :class:`~nvmlcheck.WaitTimeout`'s fields (``culprits`` names what still runs or holds a GPU): ``pids``,
    one :class:`PidTimes` per target, and ``tree_hint``, the processes on a GPU list that descend from a target and
    were not killed (``tree=True``, ``--tree``, would have), as ``(pid, ancestor target)``; ``missing`` and
    ``only_targets`` as in :class:`KillResult`.
    """

    __module__ = "nvmlcheck"

    def __init__(
        self,
        timeout_s: float,
        elapsed_ns: int,
        culprits: Sequence[str],
        snapshot: Snapshot | None = None,
        polls: int = 0,
        *,
        pids: Sequence[PidTimes] = (),
        tree_hint: Sequence[tuple[int, int]] = (),
        signal_name: str = "SIGTERM",
        missing: Sequence[int] = (),
        only_targets: bool = False,
        holders: Sequence[Culprit] | None = None,
    ) -> None:
        super().__init__(timeout_s, elapsed_ns, culprits, snapshot, polls, holders=holders)
        self.pids: tuple[PidTimes, ...] = tuple(pids)
        self.tree_hint: tuple[tuple[int, int], ...] = tuple(tree_hint)
        self.signal_name = signal_name
        self.missing: tuple[int, ...] = tuple(missing)
        self.only_targets = only_targets

    def to_json(self) -> dict[str, Any]:
        """The kill-specific fields of the ``nvmlcheck/kill`` document of a timeout (the CLI adds the wait's)."""
        return {
            "clean": False,
            "signal": self.signal_name,
            "pids": [t.to_json() for t in self.pids],
            "tree_hint": [{"pid": pid, "descends_from": anc} for pid, anc in self.tree_hint],
            "missing": list(self.missing),
            "judged": "targets" if self.only_targets else "gpus",
        }


def _rebuild_timeout(args: tuple[Any, ...], extra: dict[str, Any]) -> KillTimeout:
    """Loads a :class:`KillTimeout` pickled by nvmlcheck 0.1.0 (its constructor's arguments; since then every
    exception pickles through ``errors._rebuild``): without this name such a pickle did not load at all."""
    return KillTimeout(*args, **extra)


# --- the plan ---------------------------------------------------------------------------------------------------


def kill_records(exc: BaseException) -> tuple[PidTimes, ...] | None:
    """The targets' records a kill attached to ``exc`` when it failed after the first signal (a lost GPU, an NVML
    error, a fatal event) or was interrupted there (``KeyboardInterrupt``): what was sent to each and whether it
    exited. ``None`` when ``exc`` carries none."""
    records = getattr(exc, "_nvmlcheck_kill_pids", None)
    return records if isinstance(records, tuple) else None


def _public(exc: Refused) -> KillError:
    kind = {"gone": ProcessGone, "eperm": NotPermitted}.get(getattr(exc, "kind", None) or "", KillError)
    return kind(exc.pid, exc.reason)  # type: ignore[arg-type]


def _record(t: Target) -> PidTimes:
    return PidTimes(t.pid, t.found_by, t.pinned.comm, tuple(SignalSent(n, at) for n, at in t.signals),  # type: ignore[arg-type]
                    t.exited_ns, t.off_gpu_ns, t.parent, t.pinned.mode, t.discarded)


class KillPlan:
    """Pinned targets, ready to be signalled. Made by :func:`prepare_kill`, or by wrapping targets that
    :func:`nvmlcheck._proc.targets.prepare` pinned (and maybe signalled) before this module, which loads the GPU side,
    was imported (the CLI does). Use as a context manager or call :meth:`close` (it releases the pidfds). Steps:
    :meth:`add_holders` (optional), :meth:`send_first`, :meth:`wait`."""

    def __init__(self, found: TargetSet) -> None:
        self._set = found

    # --- composition ---

    @property
    def targets(self) -> tuple[PidTimes, ...]:
        """One record per target so far (descendants join as they are found)."""
        return tuple(_record(t) for t in self._set.items)

    @property
    def vanished(self) -> tuple[int, ...]:
        """Holders left out by :meth:`add_holders`: they exited (or their PID was reused) after being found."""
        return tuple(self._set.vanished)

    @property
    def missing(self) -> tuple[int, ...]:
        """Named PIDs that were gone before they could be pinned (``missing_ok=True``): not targets."""
        return tuple(self._set.missing)

    @property
    def left_alone(self) -> tuple[tuple[int, str], ...]:
        """``(pid, why)`` of the processes ``match``/``container`` chose but this plan will not signal (this
        process, an ancestor, a zombie, EPERM)."""
        return tuple(self._set.left_alone)

    @property
    def started_ns(self) -> int | None:
        """The clock reading of the first signal (``None`` before :meth:`send_first`)."""
        return self._set.started

    def add_holders(self, holders: Iterable[Holder]) -> None:
        """Add holders (from :func:`~nvmlcheck.holders.select_kill_holders`) as targets, before :meth:`send_first`.
        Each is pinned only if its PID still names the process that was found (same start time); one that exited
        meanwhile is left out and listed in :attr:`vanished`. The same refusals as for named PIDs apply."""
        try:
            self._set.add_holders(holders)
        except Refused as exc:
            raise _public(exc) from None

    # --- signals ---

    def send_first(self, first_signal: signal.Signals | int = signal.SIGTERM, *,
                   clock: Callable[[], int] = time.monotonic_ns, sigkill_if_discarded: bool = True) -> int:
        """Send ``first_signal`` to every target (with ``tree``, first find and pin their descendants). Returns the
        clock reading taken just before the first signal: the origin of every time reported. ``first_signal``: a
        ``signal.Signals`` or the number of any signal this system has, real-time ones (``SIGRTMIN + 1``) included;
        a stop signal (SIGSTOP, SIGTSTP, ...) is refused, nothing sent.

        A target that would not receive it (it ignores the signal, or it is the init of a PID namespace, seen from
        outside, with no handler for it: the kernel discards such a signal) gets SIGKILL at once instead of waiting
        out the grace period, and its :attr:`PidTimes.discarded` says why. ``sigkill_if_discarded=False`` (for a
        kill that must never escalate) sends the first signal anyway and only records why."""
        try:
            return self._set.send_first(first_signal, clock=clock, sigkill_if_discarded=sigkill_if_discarded)
        except Refused as exc:  # a descendant's /proc entry could not be read (out of descriptors): nothing sent
            raise _public(exc) from None

    def escalate(self, sig: signal.Signals | int = signal.SIGKILL) -> tuple[int, ...]:
        """Send ``sig`` (SIGKILL) to every target that has not exited; returns their PIDs. :meth:`wait` calls it
        when the grace period ends. A stop signal is refused, as for :meth:`send_first`."""
        return self._set.escalate(sig)

    # --- waiting ---

    def exited_predicate(self) -> Predicate:
        """A predicate that holds when every target (descendants included) has exited; its reasons name the ones
        still running. It reads the pidfds, not the snapshot."""
        return _TargetsExited(self._set)

    def wait(
        self,
        session: Session,
        *,
        timeout: float | None = TIMEOUT,
        grace_s: float | None = 5.0,
        devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
        predicate: Predicate | None = None,
        policy: PollPolicy | str | float | None = POLICY,
        stable_polls: int = STABLE_POLLS,
        on_poll: Callable[[TracePoint], object] | None = ON_POLL,
        sleep: Callable[[float], object] = SLEEP,
        events: bool | None = EVENTS,
        options: WaitOptions | None = None,
        only_targets: Snapshot | None = None,
    ) -> KillResult:
        """Wait until every target has exited and ``predicate`` (default: :func:`default_predicate`) holds on the
        selected GPUs; SIGKILL the targets still alive once ``grace_s`` has passed since the first signal (``None``
        or ``inf``: never). ``timeout`` counts from the first signal too. The clock is the one given to
        :meth:`send_first`. Raises :class:`KillTimeout`; closes the plan either way. ``events``: as for
        :meth:`Session.wait_until_clean`: with the session's event listener running (``None``) or started
        (``True``), a fatal event on a selected GPU raises :class:`~nvmlcheck.GpuFault` at once.

        ``options``: a :class:`~nvmlcheck.wait.WaitOptions`; a keyword argument given wins over its field. Its
        ``clock`` must be the one given to :meth:`send_first` (or left at its default): the plan's clock is used.

        ``only_targets``: a snapshot of the selected GPUs taken just before :meth:`send_first` (memory and process
        lists). Given, the GPU half judges only what the targets held
        (:func:`~nvmlcheck.released.targets_released`: off every list, the used memory fallen by what they held),
        instead of the whole GPU; other tenants are named in :attr:`KillResult.not_ours`. Not with ``predicate``."""
        from .wait import WaitOptions

        found = self._set
        check_predicate(predicate)
        if only_targets is not None:
            predicate = _released(found, only_targets, predicate)
        if found.started is None or found.first is None:
            raise StateError("send the first signal before waiting")
        grace_ns = _grace_ns(grace_s)
        if not isinstance(timeout, Default):
            _check_timeout(timeout)  # a keyword's errors stay ValueErrors, as they always were here
        opts = WaitOptions.or_default(options).with_(timeout=timeout, policy=policy, stable_polls=stable_polls,
                                                     on_poll=on_poll, sleep=sleep, events=events)
        timeout, on_poll = opts.timeout, opts.on_poll
        start, clock = found.started, found.clock
        if opts.clock is not clock and opts.clock is not CLOCK.value:
            raise ArgumentError("options.clock is not the clock the first signal was timed on: give it to send_first")
        grace_end = None if grace_ns is None else start + grace_ns
        next_scan = start

        def observe(point: TracePoint) -> None:
            nonlocal next_scan
            now = clock()
            # Stamp exits on every poll (a probe poll may not have asked the exit predicate), scan less often.
            if not found.all_exited() and now >= next_scan:
                next_scan = now + _SCAN_EVERY_NS
                found.scan_descendants()
            _stamp_off_lists(found.items, point, now - start, start)
            if grace_end is not None and now >= grace_end and not found.escalated:
                found.escalate(signal.SIGKILL)
            if on_poll is not None:
                on_poll(point)

        # The exit predicate first: it is cheap (a poll of the pidfds) and stamps exits even on polls that the GPU
        # part alone already proves dirty.
        condition = self.exited_predicate() & (predicate if predicate is not None else default_predicate())
        try:
            # The escalation is made on each poll; a selection read before the first (a UUID, cuda:N, MIG-) on a
            # slow GPU or nvidia-smi must not hold back the SIGKILL the grace period promises.
            # (No deadline for timeout 0: one check always completes.)
            devices = self._resolve_by_grace(session, devices, grace_end, setup_deadline(timeout, start))
            result = session.wait_until_clean(
                # What the selection left, never 0 (one check judged alone) when it used a positive timeout up.
                None if timeout is None or math.isinf(timeout) else left_s(timeout, (clock() - start) / 1e9),
                condition,
                devices=devices,
                on_poll=observe,
                clock=clock,
                options=opts,
            )
        except WaitTimeout as exc:
            # The deadline may have come before any poll could escalate (the GPUs' setup readings took it all): a
            # grace period that has passed all the same owes its SIGKILL.
            self._escalate_after(grace_end)
            raise self._timeout(exc, timeout, only_targets is not None) from None
        except Refused as exc:  # /proc could not be read (out of descriptors): an error, never "exited"
            raise self._with_records(_public(exc)) from None
        except ProcUnreadable as exc:
            why = f"{exc.strerror}; the targets signalled already were left as they are"
            raise self._with_records(_public(Refused("(a target)", why))) from None
        except BaseException as exc:
            # The GPU side failed mid-kill (a GPU fell off the bus, a fatal event, an NVML error): the operator needs
            # the targets gone all the more. Finish the escalation from the OS side, then report each target. An
            # interrupt (Ctrl-C, SIGTERM to the caller) stops at once, as asked, and reports each target too.
            if isinstance(exc, Exception):
                self._finish_without_gpu(grace_end, timeout, opts.sleep)
            self._with_records(exc)
            raise
        finally:
            self.close()
        return self._result(result, only_targets is not None)

    def _escalate_after(self, grace_end: int | None) -> None:
        """SIGKILL the targets still alive if the grace period has ended and they have not had it."""
        found = self._set
        if grace_end is not None and found.clock() >= grace_end and not found.escalated:
            found.escalate(signal.SIGKILL)

    def _resolve_by_grace(self, session: Session, devices: Iterable[DeviceSelector] | DeviceSelector | None,
                          grace_end: int | None, deadline: int | None
                          ) -> Iterable[DeviceSelector] | DeviceSelector | None:
        """The selection for the wait, read first by the end of the grace period (and the deadline): when the
        grace period ends first, the SIGKILL goes out then, and the wait reads the selection again by its own
        deadline. Indices when it was read in time (the wait reads nothing more), the selection as given when it
        names MIG instances (the wait judges each instance) or was cut."""
        found = self._set
        if devices is None or isinstance(devices, int) or grace_end is None or found.escalated:
            return devices
        from .errors import DeadlinePassed

        session._check_open()
        items = [devices] if isinstance(devices, str) else list(devices)  # read once: resolved here, judged there
        bound = grace_end if deadline is None else min(grace_end, deadline)
        try:
            indices = session._resolve(items, bound, found.clock)
        except DeadlinePassed:
            self._escalate_after(grace_end)
            return items
        if indices is None or any(isinstance(i, str) and i.startswith("MIG-") for i in items):
            return items
        return list(indices)

    def _result(self, result: WaitResult, only_targets: bool) -> KillResult:
        found = self._set
        assert found.started is not None and found.first is not None
        start, records = found.started, self.targets
        # The poller stamps a poll when its query returns and judges it just after: an exit seen in that judgement
        # is stamped a few µs later. Clean means both, so it is never earlier than the last exit, nor than a
        # target's leaving the lists (a predicate that ignores them can hold first): off_gpu_ns <= clean_ns always.
        last_seen = max((max(t.exited_ns or 0, t.off_gpu_ns or 0) for t in records), default=0)
        clean_ns = max(result.started_ns + result.clean_ns - start, last_seen)
        return KillResult(
            signal_name=signals.name(found.first),
            started_ns=start,
            pids=records,
            clean_ns=clean_ns,
            confirmed_ns=max(result.started_ns + result.confirmed_ns - start, clean_ns),
            resolution_ns=max(result.interval_ns, result.poll_cost_ns),
            wait=result,
            tree=found.tree,
            missing=tuple(found.missing),
            only_targets=only_targets,
            not_ours=_not_ours(result.snapshot, records) if only_targets else (),
        )

    def _finish_without_gpu(self, grace_end: int | None, timeout: float | None,
                            sleep: Callable[[float], object]) -> None:
        """Stamp exits, SIGKILL the survivors when the grace period ends and wait for them, with the operating
        system alone, until the kill's timeout (no timeout: until :data:`AFTER_KILL_WAIT_S` past the SIGKILL).
        With no escalation planned (grace ``never``), or once the timeout has passed, it only stamps."""
        found = self._set
        assert found.started is not None
        clock, start = found.clock, found.started
        bound_ns = None if timeout is None else ns_or_none(timeout)
        deadline = None if bound_ns is None else start + bound_ns
        next_scan = clock()
        try:
            while not found.all_exited() and grace_end is not None:
                now = clock()
                if deadline is not None and now >= deadline:
                    return
                if now >= next_scan:
                    next_scan = now + _SCAN_EVERY_NS
                    found.scan_descendants()
                if now >= grace_end and not found.escalated:
                    found.escalate(signal.SIGKILL)
                    if deadline is None:
                        deadline = now + round(AFTER_KILL_WAIT_S * 1e9)
                wake = min(t for t in (None if found.escalated else grace_end, deadline, now + _SCAN_EVERY_NS)
                           if t is not None)
                sleep(max(0.0, (wake - now) / 1e9))
        except (Refused, ProcUnreadable):
            return  # /proc cannot be read now: the records say how far it got

    def _with_records(self, exc: BaseException) -> BaseException:
        """``exc`` with the targets' records attached (:func:`kill_records` reads them; error documents show them)."""
        exc._nvmlcheck_kill_pids = self.targets  # type: ignore[attr-defined]
        return exc

    def _timeout(self, exc: WaitTimeout, timeout: float | None, only_targets: bool = False) -> KillTimeout:
        found = self._set
        assert found.started is not None and found.first is not None
        culprits = list(exc.culprits)
        hint: list[tuple[int, int]] = []
        if not found.tree and exc.snapshot is not None:
            listed = sorted({p.pid for d in exc.snapshot.devices for p in (d.processes or ())})
            for pid in listed:
                entry = found.offspring.get(pid)
                st = procfs.read_stat(pid)
                if entry is not None and st is not None and st.start_ticks == entry[0]:
                    hint.append((pid, entry[1]))
            if hint:
                who = ", ".join(f"pid {pid} (descends from {anc})" for pid, anc in hint)
                culprits.append(f"{who} still on a GPU list and not signalled: kill the process tree with tree=True "
                                "(--tree)")
        # The device-file scan's lines (memory held with no process, zombies, D state) are already among the
        # culprits: Session.wait_until_clean adds them at its timeout.
        elapsed = found.clock() - found.started
        return KillTimeout(math.inf if timeout is None else float(timeout), elapsed, tuple(dict.fromkeys(culprits)),
                           exc.snapshot, exc.polls, pids=self.targets, tree_hint=hint,
                           signal_name=signals.name(found.first),
                           missing=found.missing, only_targets=only_targets,
                           holders=exc._holders)  # the wait's: the GPUs its predicate refused

    def close(self) -> None:
        """Release every pidfd; nothing more can be signalled through this plan. Idempotent."""
        self._set.close()

    def __enter__(self) -> KillPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stamp_off_lists(items: Iterable[Target], point: TracePoint, fallback_ns: int, start: int) -> None:
    """Stamp the targets that a complete poll (every GPU's lists read) no longer lists."""
    snap = point.snapshot
    if snap is None or snap.failures or any(d.processes is None for d in snap.devices):
        return
    listed = {p.pid for d in snap.devices for p in (d.processes or ())}
    # The poll's own time (when its query returned), the moment the clean stamp uses too: a reading taken in the
    # callback, after the poll was judged, could fall after the clean stamp of that same poll.
    polled = fallback_ns if point.stamp_ns is None else point.stamp_ns - start
    for t in items:
        if t.off_gpu_ns is None and t.pid not in listed:
            t.off_gpu_ns = polled


_ONLY_TARGETS_OR_PREDICATE = "only_targets judges the targets' memory: it replaces predicate, give one of them"


def _released(found: TargetSet, baseline: Snapshot, predicate: Predicate | None) -> Predicate:
    """``only_targets``: the targets' memory back (the targets read as they are: descendants join when found)."""
    if predicate is not None:
        raise ArgumentError(_ONLY_TARGETS_OR_PREDICATE)
    from .released import targets_released

    return targets_released(lambda: [t.pid for t in found.items], baseline)


def _not_ours(snapshot: Snapshot, records: Sequence[PidTimes]) -> tuple[str, ...]:
    from .released import not_ours

    return not_ours(snapshot, [t.pid for t in records])


class _TargetsExited(Predicate):
    """Every target of a plan has exited (not a device predicate: it reads the pidfds, whatever the snapshot)."""

    __slots__ = ("plan",)

    def __init__(self, plan: TargetSet) -> None:
        self.plan = plan

    def _check(self, scope: _Scope) -> bool | None:
        return self.plan.all_exited() if self.plan.started is not None else False

    def _explain(self, scope: _Scope) -> list[_Why]:
        out: list[_Why] = []
        for t in self.plan.alive():
            st = t.pinned.stat()
            extra = ""
            if st is not None and st.state == "D":
                extra = ": in uninterruptible sleep (D), no signal takes effect until its kernel call returns"
            elif st is not None and st.state in ("T", "t"):
                extra = ": stopped (SIGKILL still ends it)"
            sent = ", ".join(name for name, _ in t.signals) or "no signal delivered"
            if t.discarded is not None and all(name != "SIGKILL" for name, _ in t.signals):
                sent += f"; the kernel discards its first signal: {t.discarded}"  # sent, never received
            out.append(_Why(False, None, f"pid {t.pid} ({printable(t.pinned.comm)}) has not exited ({sent}){extra}"))
        return out

    def describe(self) -> str:
        return "every signalled process has exited"

    def __repr__(self) -> str:
        return f"<targets exited: {', '.join(str(t.pid) for t in self.plan.items)}>"


def _grace_ns(grace_s: float | None) -> int | None:
    if grace_s is None:
        return None
    if isinstance(grace_s, bool) or not isinstance(grace_s, int | float) or not grace_s >= 0:  # rejects NaN
        raise ArgumentError(f"grace_s must be None or a number of seconds >= 0, got {grace_s!r}")
    return ns_or_none(grace_s)  # inf, or too long to count in ns: never


def _check_timeout(timeout: float | None) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout >= 0:
        raise ArgumentError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")


def _kind(value: object) -> str:
    """``value`` and its type, for a message (a long repr cut)."""
    text = repr(value)
    return f"{text if len(text) <= 80 else text[:77] + '...'} ({type(value).__name__})"


def _pid_list(pids: Iterable[int]) -> list[int]:
    """``pids`` read once into a list, each an int: never a str or bytes (its characters) or a bare int."""
    what = "pids is an iterable of ints (PIDs)"
    if isinstance(pids, str | bytes | bytearray):
        text = pids.decode("ascii", "replace") if isinstance(pids, bytes | bytearray) else pids
        word = text.strip()
        hint = f"; for one PID give [{int(word)}]" if word.isascii() and word.isdigit() else ""
        raise ArgumentTypeError(f"{what}, not a {type(pids).__name__}: {pids!r}{hint}")
    if isinstance(pids, int) and not isinstance(pids, bool):
        raise ArgumentTypeError(f"{what}, not a bare int: for one PID give [{pids}]")
    try:
        out = list(pids)
    except TypeError:
        raise ArgumentTypeError(f"{what}, not {_kind(pids)}") from None
    for pid in out:
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise ArgumentTypeError(f"pids: a PID is an int, not {_kind(pid)}")
    return out


def _holder_list(holders: Iterable[Holder]) -> list[Holder]:
    """``holders`` read once into a list, each a :class:`~nvmlcheck.holders.Holder`."""
    return holder_list(holders, "holders is an iterable of Holder (Session.holders(), "
                       "select_kill_holders(...).targets)")


def _check_flags(**flags: object) -> None:
    """Each keyword is True or False (a truthy ``"no"`` must not turn a flag on)."""
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"{name} is True or False, not {_kind(value)}")


def _check_selectors(match: str | None, container: str | None) -> None:
    """``match`` and ``container`` are each ``None`` or a str (a compiled pattern would skip the check that refuses
    one matching every command line)."""
    if match is not None and not isinstance(match, str):
        hint = "; give its .pattern" if isinstance(getattr(match, "pattern", None), str) else ""
        raise ArgumentTypeError(f"match is None or a str (a regular expression, Python re syntax), not "
                                f"{_kind(match)}{hint}")
    if container is not None and not isinstance(container, str):
        raise ArgumentTypeError(f"container is None or a str (a container ID, lxc/NAME, a pod UID, slurm/JOBID, a "
                                f"systemd unit or a cgroup path), not {_kind(container)}")


def prepare_kill(
    pids: Iterable[int] = (),
    *,
    tree: bool = False,
    holders: Iterable[Holder] = (),
    pinning: PinMode = "auto",
    missing_ok: bool = False,
    match: str | None = None,
    container: str | None = None,
    exclude: Iterable[int | str] = (),
) -> KillPlan:
    """Validate and pin ``pids`` (and ``holders``) with the operating system alone: no NVML, nothing signalled.

    Raises :class:`TypeError` for a non-int PID, :class:`ValueError` when there is no target, and
    :class:`KillError` for the first PID refused (see :class:`KillError`: :class:`ProcessGone` for ESRCH,
    :class:`NotPermitted` for EPERM). All or nothing: when it raises, nothing stays pinned. ``tree``: the targets'
    descendants join them at the first signal and at every poll while they live. ``pinning``: ``"auto"`` (pidfd
    where available), ``"pidfd"``, or ``"start-time"`` (the fallback, forced). ``missing_ok``: a named PID that is
    gone is skipped (listed in :attr:`KillPlan.missing`), not an error.

    ``match``: also every process whose command line (arguments joined by spaces) the regular expression matches
    (``pkill -f``); ``container``: also every process of one container or cgroup (a docker/containerd/podman/cri-o
    ID or a 12-digit prefix, ``lxc/NAME``, a pod UID, ``slurm/JOBID``, a systemd unit, a cgroup path). Never this
    process, its ancestors or PID 1; what they chose but will not signal is in :attr:`KillPlan.left_alone`. A
    selector that matches nothing is not an error here (:attr:`KillPlan.targets` is then what else was named).

    ``exclude``: processes never to signal, however they were found (``holders``, ``match``, ``container``, and with
    ``tree`` descendants, each with everything it starts): an int is a PID, a str a pattern of the command line in
    ``match``'s syntax (a monitoring agent that keeps the GPUs open). They are listed in :attr:`KillPlan.left_alone`;
    a named PID that is excluded is a :class:`KillError`.
    """
    from ._proc import selectors

    pids, holders = _pid_list(pids), _holder_list(holders)
    _check_flags(tree=tree, missing_ok=missing_ok)
    _check_selectors(match, container)
    exclusion = _exclusion(exclude)
    found: list[tuple[int, int, str]] = []
    skipped: list[tuple[int, str]] = []
    for chosen, left in (selectors.by_match(match) if match is not None else ([], []),
                         selectors.by_container(container) if container is not None else ([], [])):
        kept, excluded = exclusion.split(chosen)
        found += kept
        skipped += left + excluded
    if (match is not None or container is not None) and not found and not pids and not holders:
        what = " and ".join(w for w, v in (("--match", match), ("--container", container)) if v is not None)
        raise ArgumentError(f"{what} selected no process" + (f" (left alone: {_alone(skipped)})" if skipped else ""))
    try:
        plan = KillPlan(targets.prepare(pids, tree=tree, holders=holders, pinning=pinning, missing_ok=missing_ok,
                                        found=found, exclude=exclusion.why if exclusion else None))
    except Refused as exc:
        raise _public(exc) from None
    plan._set.left_alone[:0] = skipped
    return plan


def _exclusion(exclude: Iterable[int | str]) -> selectors.Exclusion:
    """``exclude`` checked: an iterable of PIDs (ints) and patterns (strs), never a bare str or int."""
    from ._proc import selectors

    if isinstance(exclude, str | bytes | bytearray) or (isinstance(exclude, int) and not isinstance(exclude, bool)):
        raise ArgumentTypeError(f"exclude is an iterable of PIDs (ints) and patterns (strs), not a bare "
                                f"{type(exclude).__name__}: give [{exclude!r}]")
    try:
        words = list(exclude)
    except TypeError:
        raise ArgumentTypeError(f"exclude is an iterable of PIDs (ints) and patterns (strs), not {_kind(exclude)}") \
            from None
    for word in words:
        if isinstance(word, bool) or not isinstance(word, int | str):
            raise ArgumentTypeError(f"exclude: a PID (int) or a pattern (str), not {_kind(word)}")
    return selectors.check_exclude(words)


def setup_deadline(timeout: float | None, began: int) -> int | None:
    """The deadline of what a kill reads before its first signal: ``timeout`` after ``began`` (a clock reading);
    ``None`` (no bound) for no timeout, ``inf``, or 0 (one check always completes, as a wait's)."""
    bound = None if not timeout else ns_or_none(timeout)
    return None if bound is None else began + bound


def _cut_before_signal(what: str, timeout: float | None, began: int, clock: Callable[[], int],
                       signal_name: str) -> KillTimeout:
    return KillTimeout(
        math.inf if timeout is None else float(timeout), clock() - began,
        (f"no poll finished before the deadline: {what} still being read before the first signal (a slow or hung "
         "GPU, or nvidia-smi); nothing was signalled",),
        signal_name=signal_name, holders=())


def resolve_by(session: Session, devices: Iterable[DeviceSelector] | DeviceSelector | None, deadline_ns: int | None,
               clock: Callable[[], int], *, timeout: float | None, began: int,
               signal_name: str) -> tuple[int, ...] | None:
    """:meth:`Session.resolve` before a kill's first signal, its readings (a UUID, ``cuda:N``, ``MIG-…`` selector
    reads every GPU's identity) stopped at ``deadline_ns`` on ``clock``: a :class:`KillTimeout` that says nothing
    was signalled when the deadline came first."""
    from ._deadline import hung_after
    from .errors import DeadlinePassed

    session._check_open()
    try:
        with hung_after(deadline_ns, clock):
            return session._resolve(devices, deadline_ns, clock)
    except DeadlinePassed:
        mig = devices is not None and any(isinstance(i, str) and i.startswith("MIG-")
                                          for i in ([devices] if isinstance(devices, int | str) else devices))
        what = "the GPUs' MIG devices were" if mig else "the GPUs named by the selection were"
        raise _cut_before_signal(what, timeout, began, clock, signal_name) from None


def baseline_by(session: Session, indices: tuple[int, ...] | None, deadline_ns: int | None,
                clock: Callable[[], int], *, timeout: float | None, began: int, signal_name: str) -> Snapshot:
    """``only_targets``' baseline (memory and process lists of the selected GPUs), read before the first signal by
    ``deadline_ns``: a :class:`KillTimeout` that says nothing was signalled when the deadline came first."""
    from ._deadline import read_by
    from .model import Fields

    snap = read_by(session.backend, indices, Fields.WAIT, deadline_ns, clock)
    if snap is None:
        raise _cut_before_signal("the baseline of the selected GPUs (what the targets hold) was", timeout, began,
                                 clock, signal_name)
    return snap


def _alone(skipped: Sequence[tuple[int, str]]) -> str:
    return "; ".join(f"pid {pid}: {why}" for pid, why in skipped)


def kill_and_wait(
    session: Session,
    pids: Iterable[int],
    *,
    tree: bool = False,
    timeout: float | None = TIMEOUT,
    grace_s: float | None = 5.0,
    first_signal: signal.Signals | int = signal.SIGTERM,
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    predicate: Predicate | None = None,
    policy: PollPolicy | str | float | None = POLICY,
    stable_polls: int = STABLE_POLLS,
    on_poll: Callable[[TracePoint], object] | None = ON_POLL,
    clock: Callable[[], int] = CLOCK,
    sleep: Callable[[float], object] = SLEEP,
    pinning: PinMode = "auto",
    events: bool | None = EVENTS,
    options: WaitOptions | None = None,
    missing_ok: bool = False,
    only_targets: bool = False,
    match: str | None = None,
    container: str | None = None,
    exclude: Iterable[int | str] = (),
) -> KillResult:
    """Signal ``pids`` (with ``tree``, their descendants too), SIGKILL what is still alive after ``grace_s``, and wait
    until every one has exited and the selected GPUs are clean: :func:`prepare_kill`, :meth:`KillPlan.send_first`
    and :meth:`KillPlan.wait` in one call.

    ``timeout`` bounds the whole operation (seconds from the first signal; ``None``: no bound). ``grace_s=None`` or
    ``inf`` never escalates. Everything is checked before the first signal: raises :class:`KillError`,
    :class:`TypeError` or :class:`ValueError` for bad input, :class:`~nvmlcheck.BackendUnavailable` if the backend
    sees no GPU, all with nothing signalled; :class:`KillTimeout` (a :class:`~nvmlcheck.WaitTimeout`) if the
    targets have not exited or the GPUs are not clean in time. ``events`` (see :meth:`KillPlan.wait`): ``True``
    starts the session's event listener before the first signal; a fatal event on a selected GPU then raises
    :class:`~nvmlcheck.GpuFault` at once.

    ``options``: a :class:`~nvmlcheck.wait.WaitOptions` (``timeout``, ``policy``, ``stable_polls``, ``trace``,
    ``on_poll``, ``clock``, ``sleep``, ``events``); a keyword argument given wins over its field.

    ``missing_ok``, ``match``, ``container``, ``exclude``: as for :func:`prepare_kill`. ``only_targets``: judge only
    what the targets held (a GPU shared with other tenants): a snapshot of the selected GPUs is taken just before the
    first signal and :meth:`KillPlan.wait` is given it.
    """
    from .wait import WaitOptions

    pids = _pid_list(pids)  # read once: checked here, pinned by prepare_kill
    _check_flags(tree=tree, missing_ok=missing_ok, only_targets=only_targets)
    _check_selectors(match, container)
    exclude = list(_exclusion(exclude).words)  # read once: checked before the session is used
    _grace_ns(grace_s)
    if not isinstance(timeout, Default):
        _check_timeout(timeout)
    check_predicate(predicate)
    if only_targets and predicate is not None:
        raise ArgumentError(_ONLY_TARGETS_OR_PREDICATE)
    # Merged before anything is signalled: a bad option is refused with nothing sent.
    opts = WaitOptions.or_default(options).with_(timeout=timeout, policy=policy, stable_polls=stable_polls,
                                                 on_poll=on_poll, clock=clock, sleep=sleep, events=events)
    first_signal = targets.checked_signal(first_signal, "first_signal")  # before anything is read or signalled
    if devices is not None and not isinstance(devices, int | str):
        devices = list(devices)  # read twice: checked here, judged by the wait
    # What is read before the first signal (the selection's UUIDs, cuda:N, MIG devices; the baseline; the listener's
    # registration) is bounded by the call's deadline: a hung GPU or nvidia-smi ends the call, nothing signalled.
    began = opts.clock()
    deadline_ns = setup_deadline(opts.timeout, began)
    # A selector that names nothing is refused before anything is signalled.
    indices = resolve_by(session, devices, deadline_ns, opts.clock, timeout=opts.timeout, began=began,
                         signal_name=signals.name(first_signal))
    if indices is None and session.device_count() == 0:
        # The wait would refuse zero GPUs after the signals went out; refuse before anything is signalled.
        raise BackendUnavailable(
            f"the {session.backend_name} backend sees no GPU: nothing could prove the GPUs clean after the kill, "
            "so nothing was signalled",
            [f"{session.backend_name}: device count 0"],
        )
    if opts.events:
        # Before the signal: registration takes a few calls, the kill should not wait for them. Bounded by the
        # call's deadline (a GPU it could not register by then is named by the listener's reason).
        # A hung registration is waited for half of what is left at most: the kill's wait keeps the other half.
        session._listen(deadline_ns, opts.clock,
                        patience_s=None if deadline_ns is None else max(0.0, (deadline_ns - opts.clock()) / 2e9))
    with prepare_kill(pids, tree=tree, pinning=pinning, missing_ok=missing_ok, match=match,
                      container=container, exclude=exclude) as plan:
        baseline = None
        if only_targets:
            baseline = baseline_by(session, indices, deadline_ns, opts.clock, timeout=opts.timeout, began=began,
                                   signal_name=signals.name(first_signal))
        plan.send_first(first_signal, clock=opts.clock, sigkill_if_discarded=_grace_ns(grace_s) is not None)
        # The selection as given: a MIG UUID judges its instance, not the whole GPU its index would.
        return plan.wait(session, grace_s=grace_s, devices=devices, predicate=predicate, options=opts,
                         only_targets=baseline)
