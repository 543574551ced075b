"""Kill targets, pinned and signalled with the operating system alone: the part of a kill that runs before NVML.

:func:`prepare` validates every PID (refusing 0, 1, negatives, PIDs at or above ``pid_max``, threads, this process
and every ancestor of it) and pins each one (:class:`~nvmlcheck._proc.pin.Pinned`), all or nothing; a
:class:`TargetSet` then sends the first signal, finds descendants (``tree``), escalates and sees exits. It imports
nothing of the GPU side (no errors tree, no dataclasses, no typing), so the CLI can send the first signal a few
milliseconds after the interpreter starts and open NVML while the driver tears the process down (issue 12).
:class:`nvmlcheck.KillPlan` wraps a set with the waiting and the typed records; refusals surface as
:class:`nvmlcheck.KillError`.
"""

from __future__ import annotations

import os
import time

from .._text import printable
from . import error as _error
from . import fate, procfs, signals
from .pin import Pinned, StaleIdentity, descriptor_budget
from .procfs import ProcUnreadable

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from ..holders import Holder
    from .pin import PinMode

__all__ = ["EPERM", "KERNEL_THREAD", "Refused", "Target", "TargetSet", "checked_signal", "prepare", "refusal"]

EPERM = "not permitted (EPERM): another user's process, or one in another container"
#: Why a kernel thread is never a target (named: refused; chosen by a selector: left alone).
KERNEL_THREAD = ("a kernel thread, not a process: it holds no GPU, and the kernel ignores signals to it (or, for "
                 "the few that take one, runs a service of its own)")
#: Rounds of stop-and-rescan before a tree's SIGKILL: each stops every member found, and a stopped process cannot
#: fork, so a round that finds no new member proves the tree whole (a fast forker takes two or three).
STOP_ROUNDS = 50
#: How long a tree's stop waits, in all, for its members to be seen stopped before each rescan (a process in
#: uninterruptible sleep, as a GPU process stuck in the driver, does not stop: the kill then goes on without it).
STOP_WAIT_NS = 200_000_000
#: The states of a process that cannot be inside fork() (proc(5)): stopped, traced, zombie, dead.
_NOT_FORKING = frozenset("TtZXx")


class Refused(Exception):
    """``pid`` may not be signalled, for ``reason`` (:class:`nvmlcheck.KillError` is the public form). ``kind``:
    ``"gone"`` (ESRCH, or its PID names another process now), ``"eperm"``, or ``None`` (refused by rule)."""

    def __init__(self, pid: object, reason: str, kind: str | None = None) -> None:
        self.pid = pid
        self.reason = reason
        self.kind = kind
        super().__init__(f"cannot signal PID {pid}: {reason}")


def _ordinal(n: int) -> str:
    return {1: "parent", 2: "grandparent"}.get(n, f"ancestor ({n} generations up)")


def refusal(pid: object, limit: int, me: int, lineage: tuple[int, ...]) -> str | None:
    """Why ``pid`` may never be signalled (``None``: it may be tried). Raises TypeError for a non-int."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise _error("ArgumentTypeError", f"a PID is an int, not {pid!r} ({type(pid).__name__})")
    if pid <= 0:
        return "not a process ID (0 and negative numbers name process groups, which are never signalled)"
    if pid == 1:
        return "PID 1 is init (of this PID namespace) and is never signalled"
    if pid >= limit:
        return f"not a process ID: PIDs on this host are below {limit} (/proc/sys/kernel/pid_max)"
    if pid == me:
        return "that is this process"
    if pid in lineage:
        st = procfs.read_stat(pid)
        name = f" ({printable(st.comm)})" if st is not None else ""
        return (f"that is this process's {_ordinal(lineage.index(pid) + 1)}{name}; signalling it would end the "
                "command that runs this one")
    return None


class Target:
    """One pinned target and what happened to it. ``signals``: ``(name, sent_ns)`` per signal delivered."""

    __slots__ = ("discarded", "exited_ns", "found_by", "off_gpu_ns", "parent", "pinned", "signals")

    def __init__(self, pinned: Pinned, found_by: str, parent: int | None = None) -> None:
        self.pinned = pinned
        self.found_by = found_by
        self.parent = parent
        #: Why the kernel would have discarded the first signal (then SIGKILL went instead), else ``None``.
        self.discarded: str | None = None
        self.signals: list[tuple[str, int]] = []
        self.exited_ns: int | None = None
        self.off_gpu_ns: int | None = None

    @property
    def pid(self) -> int:
        """The target's PID."""
        return self.pinned.pid


def _unreadable(pid: object, exc: ProcUnreadable, started: bool) -> Refused:
    """A ``/proc`` read that failed for want of descriptors (or memory, or permission): an error, never "gone"."""
    after = ("; the targets signalled already were left as they are" if started else "; nothing was signalled")
    return Refused(pid, f"{exc.strerror}{after}")


def pin_pid(pid: int, mode: PinMode, expect_start_ticks: int | None = None) -> Pinned:
    """Pin one named PID; :class:`Refused` for a thread, a process that is gone or changed, EPERM, or a ``/proc``
    entry that cannot be read (out of descriptors: never taken for "gone")."""
    try:
        status = procfs.read_status(pid, strict=True)
    except ProcUnreadable as exc:
        raise _unreadable(pid, exc, False) from None
    if status is not None and status.tgid is not None and status.tgid != pid:
        # /proc/TID exists for threads too; kill() of a TID would signal its whole process.
        raise Refused(pid, f"that is a thread of process {status.tgid}, not a process")
    if _kernel_thread(pid, False):
        raise Refused(pid, KERNEL_THREAD)
    try:
        return Pinned.open(pid, mode=mode, expect_start_ticks=expect_start_ticks)
    except ProcUnreadable as exc:
        raise _unreadable(pid, exc, False) from None
    except StaleIdentity:
        raise Refused(pid, "that PID no longer names the process that was found (it exited; the PID may have "
                           "been reused)", "gone") from None
    except ProcessLookupError:
        raise Refused(pid, "no such process (ESRCH)", "gone") from None
    except PermissionError:
        raise Refused(pid, EPERM, "eperm") from None


def _kernel_thread(pid: int, started: bool) -> bool:
    """Whether ``pid`` is a kernel thread (``False`` when it is gone: pinning says so); a ``/proc`` entry that cannot
    be read is :class:`Refused`, as everywhere before a signal."""
    try:
        st = procfs.read_stat(pid, strict=True)
    except ProcUnreadable as exc:
        raise _unreadable(pid, exc, started) from None
    return st is not None and procfs.is_kernel_thread(st)


def checked_signal(sig: object, what: str) -> int:
    """``sig`` as a signal a kill may send: a number of this system's signals (real-time ones included; not a
    ``bool``: ``True`` would be SIGHUP), never a stop signal (the target would stay, stopped, holding its GPU)."""
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise _error("ArgumentTypeError", f"{what} is a signal's number, not {sig!r}")
    try:
        signals.name(sig)
    except ValueError as exc:
        raise _error("ArgumentError", f"{what}: {exc}; nothing was signalled") from None
    if sig in signals.STOP_SIGNALS:
        raise _error("ArgumentError", signals.stop_refusal(sig) + "; nothing was signalled")
    return sig


class TargetSet:
    """Pinned targets: compose (:meth:`add_holders`), :meth:`send_first`, :meth:`escalate`, follow descendants,
    see exits. :meth:`close` releases the pidfds."""

    def __init__(self, targets: list[Target], *, tree: bool, mode: PinMode) -> None:
        self.items = targets
        self.tree = tree
        self.mode: PinMode = mode
        self.started: int | None = None
        self.first: int | None = None  # the first signal's number
        self.clock: Callable[[], int] = time.monotonic_ns
        self.closed = False
        self.escalated = False
        self.sigkill_if_discarded = True
        # Without tree: descendants seen while the targets lived (pid -> (start ticks, target)), for the hint.
        self.offspring: dict[int, tuple[int, int]] = {}
        self.vanished: list[int] = []
        self.fd_budget: int | None = None  # pidfds still to be had (pin.descriptor_budget); then start times
        self.fd_limit_raised = False  # whether the soft RLIMIT_NOFILE was raised to the hard one for them
        self.stopping = False  # the tree is being stopped for its SIGKILL: new members are stopped as found
        #: Named PIDs that had exited before they could be pinned (``missing_ok``).
        self.missing: list[int] = []
        #: Processes a selector chose that may not be signalled, with why.
        self.left_alone: list[tuple[int, str]] = []
        #: Why a process is kept out of the kill (``--exclude``), or ``None``; :func:`prepare` sets it.
        self.exclude: Callable[[int], str | None] | None = None
        #: Descendants ``exclude`` kept out (with ``tree``): left alone, with everything they start.
        self.excluded: set[int] = set()

    def pin_mode(self, pid: object) -> PinMode:
        """How the next target is pinned: a pidfd while descriptors last (the soft limit raised to the hard one
        first), then its start time; ``"pidfd"`` asked for explicitly and none left is :class:`Refused`."""
        if self.mode == "start-time":
            return "start-time"
        if self.fd_budget is None:
            self.fd_budget = descriptor_budget(raise_limit=False)  # no resource module while the soft limit will do
        if self.fd_budget <= 0 and not self.fd_limit_raised:
            self.fd_limit_raised = True
            self.fd_budget = descriptor_budget()
        if self.fd_budget > 0:
            self.fd_budget -= 1
            return self.mode
        if self.mode == "pidfd":
            raise Refused(pid, "no file descriptor left for a pidfd (RLIMIT_NOFILE, hard limit reached)"
                               + ("" if self.started is not None else "; nothing was signalled"))
        return "start-time"

    def add_selected(self, entries: Iterable[tuple[int, int, str]]) -> None:
        """Add ``(pid, start ticks, found_by)`` from a selector (``--match``, ``--container``) before the first
        signal, each pinned only while it is the process the selector saw; one gone since goes to :attr:`vanished`,
        one not permitted to :attr:`left_alone`. The caller has left out this process and its ancestors."""
        if self.started is not None:
            raise _error("StateError", "add targets before the first signal")
        known = {t.pid for t in self.items}
        for pid, ticks, found_by in entries:
            if pid in known or self._left_out(pid):
                continue
            if _kernel_thread(pid, False):
                self.left_alone.append((pid, KERNEL_THREAD))
                continue
            try:
                pinned = Pinned.open(pid, mode=self.pin_mode(pid), expect_start_ticks=ticks)
            except ProcUnreadable as exc:
                raise _unreadable(pid, exc, False) from None
            except ProcessLookupError:
                self.vanished.append(pid)
                continue
            except PermissionError:
                self.left_alone.append((pid, EPERM))
                continue
            known.add(pid)
            self.items.append(Target(pinned, found_by))

    def add_holders(self, holders: Iterable[Holder]) -> None:
        """Add holders as targets before the first signal, each pinned only if its PID still names the process
        that was found (same start time); one that exited meanwhile goes to :attr:`vanished`."""
        if self.started is not None:
            raise _error("StateError", "add holders before the first signal")
        try:
            lineage = procfs.ancestors(strict=True)
        except ProcUnreadable as exc:
            raise _unreadable("(this process's ancestry)", exc, False) from None
        limit, me = procfs.pid_max(), os.getpid()
        new: list[Target] = []
        try:
            for h in holders:
                if any(t.pid == h.pid for t in self.items + new) or self._left_out(h.pid):
                    continue
                why = refusal(h.pid, limit, me, lineage)
                if why is not None:
                    raise Refused(h.pid, why)
                if h.start_ticks is None:
                    raise Refused(h.pid, "not a process of this PID namespace")
                try:  # holders come from the /proc listing: processes, never thread IDs
                    pinned = Pinned.open(h.pid, mode=self.pin_mode(h.pid), expect_start_ticks=h.start_ticks)
                except ProcUnreadable as exc:
                    raise _unreadable(h.pid, exc, False) from None
                except ProcessLookupError:  # gone, or its PID now names another process (StaleIdentity)
                    self.vanished.append(h.pid)
                    continue
                except PermissionError:
                    raise Refused(h.pid, EPERM, "eperm") from None  # NotPermitted, as for a named PID
                new.append(Target(pinned, "nvml" if "nvml" in h.found_by else "device-file"))
        except BaseException:
            for t in new:
                t.pinned.close()
            raise
        self.items.extend(new)

    def _left_out(self, pid: int) -> bool:
        """Whether ``exclude`` keeps ``pid`` out (then it is listed in :attr:`left_alone`, once)."""
        why = None if self.exclude is None else self.exclude(pid)
        if why is not None and all(p != pid for p, _ in self.left_alone):
            self.left_alone.append((pid, why))
        return why is not None

    def send_first(self, first_signal: int = signals.SIGTERM, *, clock: Callable[[], int] = time.monotonic_ns,
                   sigkill_if_discarded: bool = True) -> int:
        """Send ``first_signal`` to every target (with ``tree``, first find and pin their descendants). Returns the
        clock reading taken just before the first signal: the origin of every time reported. A target whose status
        shows that the kernel would discard it gets SIGKILL instead (unless ``sigkill_if_discarded`` is false: a
        kill that never escalates); either way its ``discarded`` says why."""
        if self.closed:
            raise _error("StateError", "this kill plan is closed")
        if self.started is not None:
            raise _error("StateError", "the first signal was sent already")
        if not self.items and not self.missing:
            raise _error("ArgumentError", "nothing to kill: no target")
        sig = checked_signal(first_signal, "the first signal")
        self.clock = clock
        self.first = sig
        self.sigkill_if_discarded = sigkill_if_discarded
        if sig == signals.SIGKILL:
            self.escalated = True
        self.scan_descendants()
        # A tree that gets SIGKILL now (asked for, or instead of a signal its members would discard) is stopped
        # first, as for the escalation: nothing forked in the last instant escapes.
        frozen = self.tree and (sig == signals.SIGKILL or (
            sigkill_if_discarded and any(fate.fate_of(t.pid, sig) is not None for t in self.items)))
        # The stop is inside the try: an interrupt (Ctrl-C, SIGTERM) or a refusal while stopping still resumes
        # every member, so no tree stays SIGSTOPped holding its GPU.
        try:
            if frozen:
                self._stop_tree()
            fates = [fate.fate_of(t.pid, sig) for t in self.items]  # read before the first signal goes anywhere
            start = self.started = clock()
            for t, why in zip(self.items, fates, strict=True):
                self._send_first(t, sig, start, why)
        finally:
            if frozen:
                self._resume_tree()  # every member gets SIGCONT: one stopped before the kill is resumed too
        if not frozen:
            for t in self.items:
                self._resume_if_stopped(t)
        return start

    def _resume_if_stopped(self, t: Target) -> None:
        """SIGCONT (recorded) to a target still stopped after its first signal (``T``: Ctrl-Z, a SIGSTOP): a stopped
        process takes no signal but SIGKILL, so its SIGTERM, handled or not, would stay pending until the grace
        period's SIGKILL (with ``--grace never``, for good) and the shutdown it handles would never run. SIGKILL
        needs no SIGCONT; a traced stop (``t``) is the tracer's to resume."""
        if self.stopping or not t.signals or t.signals[-1][0] == "SIGKILL":
            return
        try:
            st = t.pinned.stat()
        except ProcUnreadable:
            return  # cannot tell: the grace period's SIGKILL still ends it
        if st is not None and st.state == "T":
            self._send(t, signals.SIGCONT, self.clock())

    def _send_first(self, t: Target, sig: int, now: int, why: str | None) -> None:
        """The first signal, or SIGKILL at once when the kernel would discard it (``why``, from :mod:`.fate`)."""
        t.discarded = why
        if why is not None and self.sigkill_if_discarded and not self.escalated:
            sig = signals.SIGKILL
        self._send(t, sig, now)

    def _send(self, t: Target, sig: int, now: int) -> None:
        try:
            sent = t.pinned.send(sig)
        except PermissionError:
            return  # pinned and probed as permitted; a change of credentials since: it stays a culprit
        if sent:
            assert self.started is not None
            t.signals.append((signals.name(sig), now - self.started))

    def escalate(self, sig: int = signals.SIGKILL) -> tuple[int, ...]:
        """Send ``sig`` (SIGKILL) to every target that has not exited; returns their PIDs."""
        if self.started is None:
            raise _error("StateError", "send the first signal first")
        sig = checked_signal(sig, "the escalation's signal")  # SIGSTOP here would leave every target stopped
        if sig == signals.SIGKILL:
            self.escalated = True
        frozen = sig == signals.SIGKILL and self.tree
        out: list[int] = []
        try:  # the stop inside: resumed whatever interrupts it (see send_first)
            if frozen:
                self._stop_tree()
            now = self.clock()
            for t in self.items:
                before = len(t.signals)
                self._send(t, sig, now)
                if len(t.signals) > before:
                    out.append(t.pid)
        finally:
            if frozen:
                self._resume_tree()
        return tuple(out)

    def _quietly(self, t: Target, sig: int) -> None:
        """Send ``sig`` without recording it (SIGSTOP and SIGCONT are the mechanism, not the kill's record)."""
        try:  # noqa: SIM105 - contextlib is start-up this module avoids
            t.pinned.send(sig)
        except PermissionError:
            pass

    def _stop_tree(self) -> None:
        """Stop the whole tree before its SIGKILL: SIGSTOP every member, wait until they are seen stopped, rescan,
        stop the new ones (as they are pinned), until a scan finds no new member (at most :data:`STOP_ROUNDS`). A
        worker forked in the last instant is then found and killed with the rest, instead of surviving a kill that
        reports clean."""
        self.stopping = True
        deadline = time.monotonic_ns() + STOP_WAIT_NS
        for _ in range(STOP_ROUNDS):
            for t in self.items:
                if not t.pinned.exited():
                    self._quietly(t, signals.SIGSTOP)
            # kill() only queues SIGSTOP: a fork already under way completes after it (since Linux 4.20 only a
            # fatal signal aborts one), and its child would appear after a rescan made at once. A member seen
            # stopped is not inside fork, so its children are all there to be found.
            self._await_stopped(deadline)
            before = len(self.items)
            self.scan_descendants()
            if len(self.items) == before:
                return

    def _await_stopped(self, deadline_ns: int) -> None:
        """Poll until every living member is stopped (or gone), or ``deadline_ns`` passes."""
        waiting = [t for t in self.items if not t.pinned.exited()]
        while waiting:
            still = []
            for t in waiting:
                try:
                    st = t.pinned.stat()
                except ProcUnreadable:
                    continue  # cannot tell: not waited for (the rescan reports an unreadable /proc itself)
                if st is not None and st.state not in _NOT_FORKING:
                    still.append(t)
            waiting = still
            if not waiting or time.monotonic_ns() >= deadline_ns:
                return
            time.sleep(0.0002)

    def _resume_tree(self) -> None:
        """SIGCONT every member after the SIGKILL: nothing stays stopped (one the SIGKILL did not reach, or one that
        got the first signal while stopped). An interrupt (Ctrl-C, SIGTERM to nvmlcheck) or an error on the way does
        not cut the round short: every member is still resumed (each tried twice), then the first one is raised."""
        self.stopping = False
        pending: BaseException | None = None
        for t in self.items:
            for _ in range(2):
                try:
                    if not t.pinned.exited():
                        self._quietly(t, signals.SIGCONT)
                    break
                except BaseException as exc:  # re-raised below, once every member is resumed
                    if pending is None:
                        pending = exc
        if pending is not None:
            raise pending

    def scan_descendants(self) -> None:
        """Pin (``tree``) or remember (for the hint) the descendants of every living target. A ``/proc`` file that
        cannot be read (out of descriptors, ...) is :class:`Refused`: a descendant left out would never be
        signalled."""
        try:
            self._scan_descendants()
        except ProcUnreadable as exc:
            raise _unreadable("(a descendant of the targets)", exc, self.started is not None) from None

    def _scan_descendants(self) -> None:
        known = {t.pid for t in self.items} | set(self.offspring) | self.excluded
        # (pid, the target it descends from, its pin when it is a target): the children of a PID are only taken
        # while that PID provably names the same process (its pin has not exited, or its start time is unchanged).
        queue: list[tuple[int, int, Pinned | None, int | None]] = [
            (t.pid, t.parent if t.parent is not None else t.pid, t.pinned, None)
            for t in self.items
            if not t.pinned.exited()
        ]
        queue += [(pid, origin, None, ticks) for pid, (ticks, origin) in self.offspring.items()]
        table: dict[int, set[int]] | None = None
        me = os.getpid()
        while queue:
            ppid, origin, pin, ticks = queue.pop()
            kids = procfs.children(ppid, strict=True)
            if kids is None:
                if table is None:
                    table = procfs.all_children(strict=True)
                kids = table.get(ppid, set())
            if pin is not None and pin.exited():
                continue  # the list may belong to a recycled PID
            if ticks is not None:
                now_st = procfs.read_stat(ppid, strict=True)
                if now_st is None or now_st.start_ticks != ticks:
                    continue
            for pid in sorted(kids - known - {me}):
                st = procfs.read_stat(pid, strict=True)
                if st is None or st.ppid != ppid:
                    continue
                known.add(pid)
                if not self.tree:
                    self.offspring[pid] = (st.start_ticks, origin)
                    queue.append((pid, origin, None, st.start_ticks))
                    continue
                if self._left_out(pid):
                    self.excluded.add(pid)  # not followed either: what it starts is its own
                    continue
                pinned = self._pin_descendant(pid, ppid, origin, st.start_ticks)
                if pinned is None:
                    continue
                child = Target(pinned, "descendant", origin)
                self.items.append(child)
                queue.append((pid, origin, pinned, None))
                if self.stopping:
                    self._quietly(child, signals.SIGSTOP)
                if self.started is not None and self.first is not None:
                    why = fate.fate_of(pid, self.first)
                    now = self.clock()
                    self._send_first(child, self.first, now, why)
                    if self.escalated:
                        self._send(child, signals.SIGKILL, now)
                    else:
                        self._resume_if_stopped(child)

    def _pin_descendant(self, pid: int, ppid: int, origin: int, ticks: int) -> Pinned | None:
        """The pin of descendant ``pid`` (child of ``ppid``, started at ``ticks``), or ``None``: gone, reparented
        (its parent exited meanwhile: not provably ours any more), or not ours to signal (another user's, a setuid
        helper: listed in :attr:`left_alone`, not dropped without a word, as a descendant that holds the GPU would
        leave the kill timing out with no reason given)."""
        try:
            pinned = Pinned.open(pid, mode=self.pin_mode(pid), expect_start_ticks=ticks)
        except ProcessLookupError:
            return None
        except PermissionError:
            if all(p != pid for p, _ in self.left_alone):
                self.left_alone.append((pid, f"a descendant of pid {origin}: {EPERM}"))
            return None
        st2 = pinned.stat()
        if st2 is not None and st2.ppid != ppid:
            pinned.close()
            return None
        return pinned

    def alive(self) -> Iterator[Target]:
        """The targets that have not exited."""
        return (t for t in self.items if not t.pinned.exited())

    def all_exited(self) -> bool:
        """Whether every target has exited; stamps ``exited_ns`` on those seen exited for the first time."""
        done = True
        now: int | None = None
        for t in self.items:
            if t.exited_ns is not None:
                continue
            if t.pinned.exited():
                if now is None:
                    now = self.clock()
                assert self.started is not None
                t.exited_ns = now - self.started
            else:
                done = False
        return done

    def close(self) -> None:
        """Release every pidfd (idempotent); nothing more is signalled."""
        self.closed = True
        for t in self.items:
            t.pinned.close()


def prepare(pids: Iterable[int] = (), *, tree: bool = False, holders: Iterable[Holder] = (),
            pinning: PinMode = "auto", missing_ok: bool = False,
            found: Iterable[tuple[int, int, str]] = (),
            exclude: Callable[[int], str | None] | None = None) -> TargetSet:
    """Validate and pin ``pids`` (and ``holders``, and ``found``: ``(pid, start ticks, found_by)`` from a selector),
    nothing signalled; all or nothing. Raises :class:`Refused`, TypeError for a non-int PID, and ValueError when
    there is no target or ``pinning`` is unknown. ``missing_ok``: a named PID that is gone goes to ``missing``.
    ``exclude(pid)``: why a process is kept out (``--exclude``), else ``None``: a holder, a selected process or
    (``tree``) a descendant it keeps out is left alone; a named PID it keeps out is :class:`Refused`."""
    if pinning not in ("auto", "pidfd", "start-time"):
        raise _error("ArgumentError", f"pinning is 'auto', 'pidfd' or 'start-time', not {pinning!r}")
    foreign = procfs.foreign_numbering()
    if foreign is not None:  # every check below would read one process and the signal reach another
        raise Refused("(every target)", f"{foreign}; nothing was signalled")
    try:
        lineage = procfs.ancestors(strict=True)
    except ProcUnreadable as exc:
        raise _unreadable("(this process's ancestry)", exc, False) from None
    limit, me = procfs.pid_max(), os.getpid()
    chosen: list[int] = []
    for pid in pids:
        why = refusal(pid, limit, me, lineage)
        kept = None if why is not None or exclude is None else exclude(pid)
        if kept is not None:  # excluded, or an exclusion that cannot be checked against it (selectors.Exclusion)
            why = (f"it is named and {kept}: name it or exclude it, not both" if kept.startswith("excluded") else
                   f"it is named, but {kept}")
        if why is not None:
            raise Refused(pid, why)
        if pid not in chosen:
            chosen.append(pid)
    holder_list = list(holders)
    # A selector's choice is checked against the lineage read here, strictly: the selector's own reading stops
    # without error where a link cannot be read (out of descriptors), and an ancestor left out of it would be chosen.
    selected: list[tuple[int, int, str]] = []
    refused: list[tuple[int, str]] = []
    for entry in found:
        why = refusal(entry[0], limit, me, lineage)
        if why is None:
            selected.append(entry)
        else:
            refused.append((entry[0], why))
    if not chosen and not holder_list and not selected and not refused:
        raise _error("ArgumentError", "no PID given")
    targets: list[Target] = []
    out = TargetSet(targets, tree=bool(tree), mode=pinning)
    out.exclude = exclude
    out.left_alone += refused
    try:
        for pid in chosen:
            try:
                targets.append(Target(pin_pid(pid, out.pin_mode(pid)), "named"))
            except Refused as exc:
                if not (missing_ok and exc.kind == "gone"):
                    raise
                out.missing.append(pid)
        if selected:
            out.add_selected(selected)
        if holder_list:
            out.add_holders(holder_list)
    except BaseException:
        out.close()
        raise
    return out
