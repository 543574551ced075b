"""Pinned process identity: a PID held so that a later signal can only reach the process that was meant.

With a pidfd (Linux >= 5.3, ``os.pidfd_open``) the kernel guarantees it: signals go through
``signal.pidfd_send_signal``, which fails with ESRCH once that process has exited, even if its PID has been handed to
another process since; exit is seen by polling the pidfd (readable once the process has exited, zombie included).
Nothing is ever reaped.

Without a pidfd (``mode="start-time"``, or older kernels) the start time (field 22 of ``/proc/PID/stat``, clock
ticks since boot) is compared before every signal: a recycled PID has a later start time. A window of a few
microseconds remains between the comparison and ``kill()``, and two processes started in the same clock tick (10 ms)
under the same PID cannot be told apart; docs/killing.md says where each guarantee holds.

A pidfd costs a descriptor. :func:`descriptor_budget` raises the soft ``RLIMIT_NOFILE`` to the hard one and says how
many pidfds fit while :data:`FD_RESERVE` stay free; past it targets are pinned by start time. A ``/proc`` read that
fails for any reason but "no such process" (EMFILE, ENFILE, ENOMEM, EACCES) raises
:class:`~nvmlcheck._proc.procfs.ProcUnreadable`: it never reads as "the process is gone".
"""

from __future__ import annotations

import errno
import os
import select

from . import signals
from .procfs import ProcStat, ProcUnreadable, read_stat

TYPE_CHECKING = False  # no typing before a signal: start-up cost where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from typing import Literal

    #: ``"auto"``: a pidfd where the kernel offers one, else the start time. ``"pidfd"``: a pidfd or an error.
    #: ``"start-time"``: the fallback, forced (for tests and for kernels whose pidfd misbehaves).
    PinMode = Literal["auto", "pidfd", "start-time"]

__all__ = ["FD_RESERVE", "PinMode", "Pinned", "StaleIdentity", "descriptor_budget", "pidfd_available"]

#: Descriptors a kill keeps free for everything but pidfds (``/proc`` reads, NVML, pipes, the event listener).
FD_RESERVE = 64
#: pidfd_open failures that mean "no descriptor to spare", not "no such process": pin by start time instead.
_NO_DESCRIPTOR = (errno.EMFILE, errno.ENFILE, errno.ENOMEM)

_pidfd_ok: bool | None = None


def pidfd_available() -> bool:
    """Whether this Python and kernel offer pidfds (``pidfd_open`` and ``pidfd_send_signal``); probed once."""
    global _pidfd_ok
    if _pidfd_ok is None:
        ok = hasattr(os, "pidfd_open") and signals.has_pidfd_send()
        if ok:
            try:
                fd = os.pidfd_open(os.getpid())
            except OSError:
                ok = False
            else:
                os.close(fd)
        _pidfd_ok = ok
    return _pidfd_ok


def descriptor_budget(*, raise_limit: bool = True) -> int:
    """How many pidfds this process may still open: raise the soft ``RLIMIT_NOFILE`` to the hard limit (capped by
    ``/proc/sys/fs/nr_open``), then the limit less the descriptors open now and :data:`FD_RESERVE` (0 or more).

    ``raise_limit=False``: the soft limit as it is (``sysconf``), without importing ``resource`` (a kill's few
    targets fit in it; the caller raises the limit when they do not)."""
    if not raise_limit:
        soft_now = os.sysconf("SC_OPEN_MAX")
        return _left(soft_now) if soft_now > 0 else 0
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open", "rb") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = soft
    if soft == resource.RLIM_INFINITY:
        soft = target
    elif soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return _left(soft)


def _left(limit: int) -> int:
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
    return max(0, limit - in_use - FD_RESERVE)


class StaleIdentity(ProcessLookupError):
    """The PID no longer names the process that was seen (it exited, and maybe its PID was reused)."""


class Pinned:
    """One process, pinned. Create with :meth:`open`; :meth:`close` releases the pidfd (idempotent)."""

    __slots__ = ("_closed", "_fd", "_gone", "_mode", "comm", "pid", "start_ticks")

    def __init__(self, pid: int, comm: str, start_ticks: int, fd: int | None) -> None:
        self.pid = pid
        self.comm = comm
        self.start_ticks = start_ticks
        self._fd = fd
        self._mode: Literal["pidfd", "start-time"] = "start-time" if fd is None else "pidfd"
        self._gone = False
        self._closed = False

    @classmethod
    def open(cls, pid: int, *, mode: PinMode = "auto", expect_start_ticks: int | None = None) -> Pinned:
        """Pin ``pid`` as it is now (or, with ``expect_start_ticks``, only if it is still the process that had that
        start time). Raises :class:`ProcessLookupError` (:class:`StaleIdentity` for a changed identity),
        :class:`PermissionError` when this process may not signal it, and
        :class:`~nvmlcheck._proc.procfs.ProcUnreadable` when its ``/proc`` entry cannot be read (out of descriptors:
        never taken for "gone"). With ``"auto"``, a pidfd that cannot be had for want of descriptors falls back to
        the start time."""
        use_fd = mode == "pidfd" or (mode == "auto" and pidfd_available())
        before = read_stat(pid, strict=True)
        if before is None or before.pid != pid:
            raise ProcessLookupError(f"no process {pid}")
        if expect_start_ticks is not None and before.start_ticks != expect_start_ticks:
            raise StaleIdentity(f"PID {pid} now names another process (start time changed)")
        fd: int | None = None
        if use_fd:
            try:
                fd = os.pidfd_open(pid)  # ProcessLookupError if gone; the fd names whatever process had the PID now
            except OSError as exc:
                if exc.errno not in _NO_DESCRIPTOR or isinstance(exc, ProcessLookupError):
                    raise
                if mode == "pidfd":
                    raise ProcUnreadable(exc.errno, f"no descriptor for a pidfd of PID {pid}: {exc.strerror}") from None
        if fd is not None:
            try:
                after = read_stat(pid, strict=True)
            except BaseException:
                os.close(fd)
                raise
            # The fd was opened between two reads that show the same process: it names that process.
            if after is None or after.start_ticks != before.start_ticks:
                os.close(fd)
                raise StaleIdentity(f"PID {pid} exited while it was being pinned")
        pinned = cls(pid, before.comm, before.start_ticks, fd)
        try:
            pinned._probe()
        except BaseException:
            pinned.close()
            raise
        return pinned

    @property
    def mode(self) -> Literal["pidfd", "start-time"]:
        """How the identity is held."""
        return self._mode

    def _probe(self) -> None:
        """Signal 0: raises PermissionError where a real signal would be refused."""
        if self._fd is not None:
            try:
                signals.pidfd_send(self._fd, 0)
            except ProcessLookupError:
                self._gone = True
        elif self._same():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self._gone = True

    def _same(self) -> ProcStat | None:
        """The process's stat if the PID still names it, else ``None`` (and remember that it is gone); raises
        :class:`~nvmlcheck._proc.procfs.ProcUnreadable` when that cannot be told."""
        st = read_stat(self.pid, strict=True)
        if st is None or st.start_ticks != self.start_ticks:
            self._gone = True
            return None
        return st

    def exited(self) -> bool:
        """Whether the process has exited: gone, or a zombie (its files, GPU handles included, are closed). Never
        reaps it."""
        if self._gone:
            return True
        if self._fd is not None:
            p = select.poll()
            p.register(self._fd, select.POLLIN)
            if p.poll(0):
                self._gone = True
        else:
            st = self._same()
            if st is not None and st.state in ("Z", "X"):
                self._gone = True
        return self._gone

    def stat(self) -> ProcStat | None:
        """``/proc/PID/stat`` while the PID still names this process (``None`` once it has exited or was reused)."""
        if self.exited():
            return None
        st = read_stat(self.pid, strict=True)
        if st is None or st.start_ticks != self.start_ticks or self.exited():
            return None
        return st

    def send(self, sig: int) -> bool:
        """Send ``sig`` to this process if it has not exited; ``False`` when nothing was sent (it has exited, or its
        PID now names another process). Raises :class:`PermissionError` when refused."""
        if self._closed or self.exited():
            return False
        try:
            if self._fd is not None:
                signals.pidfd_send(self._fd, sig)
            else:
                if self._same() is None:
                    return False
                os.kill(self.pid, sig)
        except ProcessLookupError:
            self._gone = True
            return False
        return True

    def close(self) -> None:
        """Release the pidfd. Afterwards nothing more is sent; :meth:`exited` falls back to the start time."""
        self._closed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            try:  # noqa: SIM105 - contextlib is start-up this module avoids
                os.close(fd)
            except OSError:
                pass

    def __repr__(self) -> str:
        return f"<Pinned pid={self.pid} ({self.comm}) {self.mode}{' exited' if self._gone else ''}>"
