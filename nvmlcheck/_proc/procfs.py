"""Reading ``/proc``: one process's stat and status lines, its command line, children and ancestry.

Every reader returns ``None`` when the process is gone or the file cannot be read; none raises for a process that
exits while it is being read (that race is the normal case here). Where "cannot be read" must not pass for "gone"
(a kill: out of descriptors, EMFILE, would otherwise read as "the process exited"), ``strict=True`` returns ``None``
only for ENOENT/ESRCH and raises :class:`ProcUnreadable` for anything else (EMFILE, ENFILE, ENOMEM, EACCES, ...).
"""

from __future__ import annotations

import errno
import os

from . import PID_MAX_LIMIT

TYPE_CHECKING = False  # no typing before a signal: start-up cost where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from typing import NamedTuple

__all__ = [
    "PF_EXITING",
    "PF_KTHREAD",
    "PID_MAX_LIMIT",
    "STATE_WORDS",
    "ProcStat",
    "ProcStatus",
    "ProcUnreadable",
    "ancestors",
    "parse_status",
    "children",
    "cmdline",
    "executable",
    "is_kernel_thread",
    "pid_max",
    "pidns_inode",
    "read_cgroup",
    "read_stat",
    "read_status",
    "state_of",
]

#: The words for the state letters of ``/proc/PID/stat`` (proc(5)).
STATE_WORDS: dict[str, str] = {
    "R": "running",
    "S": "sleeping",
    "D": "uninterruptible",
    "Z": "zombie",
    "T": "stopped",
    "t": "traced",
    "X": "dead",
    "I": "idle",
    "P": "parked",
    "W": "waking",
}


if TYPE_CHECKING:

    class ProcStat(NamedTuple):
        """The fields of ``/proc/PID/stat`` nvmlcheck uses. ``start_ticks`` (field 22) is the start time in clock
        ticks since boot: with the PID it names one process for the life of the system (a recycled PID has a later
        one). ``flags`` (field 9): the kernel's ``PF_*`` bits (:data:`PF_KTHREAD` marks a kernel thread)."""

        pid: int
        comm: str
        state: str
        ppid: int
        start_ticks: int
        flags: int = 0

    class ProcStatus(NamedTuple):
        """The fields of ``/proc/PID/status`` nvmlcheck uses (``None`` where the kernel does not print them).

        ``nspid``: the PID in each PID namespace it is in, outermost (this reader's view) first, its own last.
        ``sig_ign``, ``sig_cgt``, ``sig_blk``: the ignored, caught (handler installed) and blocked signal masks,
        bit ``n - 1`` for signal ``n``."""

        tgid: int | None
        uid: int | None
        nspid: tuple[int, ...] | None
        sig_ign: int | None = None
        sig_cgt: int | None = None
        sig_blk: int | None = None

else:  # the same tuples without typing or collections (2 ms of a kill's start-up before its first signal)
    from .._record import light_tuple

    ProcStat = light_tuple("ProcStat", "pid comm state ppid start_ticks flags", (0,), __name__)
    ProcStatus = light_tuple("ProcStatus", "tgid uid nspid sig_ign sig_cgt sig_blk", (None, None, None), __name__)


#: The errors that mean "no such process" (gone, or never was); every other one means "cannot tell".
_GONE = (errno.ENOENT, errno.ESRCH)


class ProcUnreadable(OSError):
    """A ``/proc`` file of a process could not be read for a reason other than the process being gone (out of
    descriptors, out of memory, not permitted): nothing may be concluded about that process."""


def _unreadable(exc: OSError, path: str) -> ProcUnreadable:
    code = exc.errno if exc.errno is not None else errno.EIO
    name = errno.errorcode.get(code, str(code))
    return ProcUnreadable(code, f"{path} cannot be read: {exc.strerror or exc} ({name})")


def _read(path: str, strict: bool) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        if strict and exc.errno not in _GONE:
            raise _unreadable(exc, path) from None
        return None


def read_stat(pid: int | str, proc: str = "/proc", *, strict: bool = False) -> ProcStat | None:
    """``/proc/PID/stat`` parsed, or ``None`` if the process is gone or unreadable (``strict``: gone only; else
    :class:`ProcUnreadable`). ``pid`` may be ``"self"``."""
    raw = _read(f"{proc}/{pid}/stat", strict)
    if raw is None:
        return None
    # The command name is parenthesised and may itself contain ") " and spaces: split at the last ")".
    close = raw.rfind(b")")
    open_ = raw.find(b"(")
    if close < 0 or open_ < 0:
        return None
    rest = raw[close + 2 :].split()
    try:
        return ProcStat(
            pid=int(raw[:open_]),
            comm=raw[open_ + 1 : close].decode("utf-8", "replace"),
            state=rest[0].decode("ascii", "replace"),
            ppid=int(rest[1]),
            start_ticks=int(rest[19]),
            flags=int(rest[6]),
        )
    except (IndexError, ValueError):
        return None


def state_of(st: ProcStat, proc: str = "/proc") -> str:
    """The state letter of the process ``st`` (from :func:`read_stat`) describes. ``/proc/PID/stat`` gives its main
    thread's: a main thread that exited (``pthread_exit``) while other threads run reads ``Z``, yet the process
    lives on, with its memory, its files (a GPU context too), and a signal still ends it: then the first live
    thread's state. A true zombie (or one whose threads cannot be read) stays ``Z``."""
    if st.state not in ("Z", "X"):
        return st.state
    try:
        tids = [t for t in os.listdir(f"{proc}/{st.pid}/task") if t != str(st.pid)]
    except OSError:
        return st.state
    for tid in sorted(tids):
        if not tid.isascii() or not tid.isdigit():
            continue
        thread = read_stat(f"{st.pid}/task/{tid}", proc)
        if thread is not None and thread.state not in ("Z", "X"):
            return thread.state
    return st.state


#: ``PF_KTHREAD`` (include/linux/sched.h), in field 9 of ``/proc/PID/stat``: the task is a kernel thread. A kernel
#: thread holds no GPU and is no process to kill: it ignores most signals, and the few that take one (``lockd``,
#: ``nfsd``) are the kernel's services, not a job's.
PF_KTHREAD = 0x00200000
#: ``PF_EXITING``: the task is exiting (set at the start of ``do_exit``, kept by a zombie). The kernel then prints
#: ``/`` for each of its cgroup v1 hierarchies in ``/proc/PID/cgroup`` (the v2 line stays true).
PF_EXITING = 0x00000004


def is_kernel_thread(st: ProcStat) -> bool:
    """Whether ``st`` (from :func:`read_stat`) is a kernel thread's (``PF_KTHREAD`` in its flags)."""
    return bool(st.flags & PF_KTHREAD)


def read_status(pid: int | str, proc: str = "/proc", *, strict: bool = False) -> ProcStatus | None:
    """``Tgid``, real ``Uid``, ``NSpid`` and the signal masks from ``/proc/PID/status``, or ``None`` if gone or
    unreadable (``strict``: as :func:`read_stat`)."""
    raw = _read(f"{proc}/{pid}/status", strict)
    if raw is None:
        return None
    return parse_status(raw)


def parse_status(raw: bytes) -> ProcStatus:
    """The text of ``/proc/PID/status`` parsed (:func:`read_status` without the read); a field absent or malformed is
    ``None``."""
    tgid: int | None = None
    uid: int | None = None
    nspid: tuple[int, ...] | None = None
    masks: dict[bytes, int] = {}
    for line in raw.splitlines():
        key, _, value = line.partition(b":")
        try:
            if key == b"Tgid":
                tgid = int(value)
            elif key == b"Uid":
                uid = int(value.split()[0])
            elif key == b"NSpid":
                nspid = tuple(int(v) for v in value.split())
            elif key in (b"SigIgn", b"SigCgt", b"SigBlk"):
                masks[key] = int(value, 16)
        except (IndexError, ValueError):
            continue
    return ProcStatus(tgid, uid, nspid, masks.get(b"SigIgn"), masks.get(b"SigCgt"), masks.get(b"SigBlk"))


def read_cgroup(pid: int | str, proc: str = "/proc", *, strict: bool = False, exact: bool = False) -> str | None:
    """The text of ``/proc/PID/cgroup``, or ``None`` if gone or unreadable (``strict``: as :func:`read_stat`; parsed
    by :mod:`.container`). Bytes that are not UTF-8 (a cgroup may be named with any) read as U+FFFD, which two
    names can share; ``exact`` keeps them as surrogate escapes, as ``os.fsdecode`` and ``sys.argv`` do, to compare
    with a path typed on the command line (never to print: such text cannot be written to a UTF-8 stream)."""
    raw = _read(f"{proc}/{pid}/cgroup", strict)
    return None if raw is None else raw.decode("utf-8", "surrogateescape" if exact else "replace")


def pidns_inode(pid: int | str, proc: str = "/proc") -> int | None:
    """The inode of ``/proc/PID/ns/pid`` (equal for two processes in one PID namespace), or ``None`` if gone or not
    permitted (reading another user's namespace needs ptrace access)."""
    try:
        return os.stat(f"{proc}/{pid}/ns/pid").st_ino
    except OSError:
        return None


def cmdline(pid: int, proc: str = "/proc") -> tuple[str, ...] | None:
    """The argument vector, or ``None`` if gone or unreadable. A kernel thread or a zombie has an empty one."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return tuple(a.decode("utf-8", "replace") for a in raw.split(b"\0")[:-1]) if raw else ()


def executable(pid: int, proc: str = "/proc") -> tuple[str, int, int] | None:
    """The program ``pid`` runs: ``(path, owner uid, mode)`` of ``/proc/PID/exe`` (the path may end in
    `` (deleted)``), or ``None`` when it cannot be read (gone, a kernel thread, or another user's process: reading
    it needs the right to trace the process)."""
    link = f"{proc}/{pid}/exe"
    try:
        path = os.readlink(link)
        st = os.stat(link)
    except OSError:
        return None
    return path, st.st_uid, st.st_mode


def foreign_numbering(proc: str = "/proc") -> str | None:
    """Why ``proc`` does not number processes as this process's PID namespace does (``None``: it does). A kill reads
    a process's identity in ``/proc`` and signals it by this namespace's numbering: the two must agree, or the
    process checked and the process signalled are two different ones. They disagree in a PID namespace entered
    without mounting its own procfs (``unshare --pid --fork`` without ``--mount-proc``; a container given the host's
    ``/proc``): ``/proc/self`` then names this process by another namespace's number, or not at all."""
    me = os.getpid()
    try:
        seen = os.readlink(f"{proc}/self")
    except OSError as exc:
        return (f"{proc}/self cannot be read ({exc.strerror}): {proc} is not the procfs of this process's PID "
                "namespace (or none is mounted)")
    if seen == str(me):
        return None
    return (f"{proc} is the procfs of another PID namespace: it calls this process {seen}, and this process is {me} "
            "in its own (a PID namespace entered without mounting its procfs, as `unshare --pid --fork` without "
            "--mount-proc does), so a PID read there names another process than a signal to that PID reaches; "
            "mount this namespace's procfs (unshare --mount-proc), or run nvmlcheck where /proc is its own")


def pid_max(proc: str = "/proc") -> int:
    """``/proc/sys/kernel/pid_max``: the largest PID this host hands out, plus one (``PID_MAX_LIMIT`` if
    unreadable)."""
    try:
        with open(f"{proc}/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def ancestors(pid: int | str = "self", proc: str = "/proc", *, strict: bool = False) -> tuple[int, ...]:
    """The chain of parents of ``pid``, nearest first, up to PID 1 (or the edge of this PID namespace, where the
    parent reads 0). Stops early, without error, where a process exits while it is read; ``strict`` raises
    :class:`ProcUnreadable` where a link cannot be read (a chain cut short there would leave an ancestor out)."""
    out: list[int] = []
    st = read_stat(pid, proc, strict=strict)
    while st is not None and st.ppid > 0 and st.ppid not in out:
        out.append(st.ppid)
        if st.ppid == 1:
            break
        st = read_stat(st.ppid, proc, strict=strict)
    return tuple(out)


def children(pid: int, proc: str = "/proc", *, strict: bool = False) -> set[int] | None:
    """The children of ``pid`` (of every thread of it), from ``/proc/PID/task/*/children``; ``None`` when the
    kernel has no such file (``CONFIG_PROC_CHILDREN`` off) or the process is gone. ``strict``: a file that cannot be
    read for another reason raises :class:`ProcUnreadable` (a child left out would never be signalled)."""
    base = f"{proc}/{pid}/task"
    try:
        tasks = os.listdir(base)
    except OSError as exc:
        if strict and exc.errno not in _GONE:
            raise _unreadable(exc, base) from None
        return None
    out: set[int] = set()
    seen_file = False
    for task in tasks:
        path = f"{base}/{task}/children"
        try:
            with open(path, "rb") as f:
                out.update(int(c) for c in f.read().split())
            seen_file = True
        except FileNotFoundError:
            continue  # the thread ended, or the kernel lacks the file
        except ValueError:
            continue
        except OSError as exc:
            if strict and exc.errno not in _GONE:
                raise _unreadable(exc, path) from None
            continue
    return out if seen_file else None


def all_children(proc: str = "/proc", *, strict: bool = False) -> dict[int, set[int]]:
    """Parent → children for every process, from every ``/proc/PID/stat`` (the slow path, where the ``children``
    files do not exist); ``strict`` as :func:`read_stat`."""
    out: dict[int, set[int]] = {}
    for name in os.listdir(proc):
        if name.isdigit():
            st = read_stat(name, proc, strict=strict)
            if st is not None:
                out.setdefault(st.ppid, set()).add(st.pid)
    return out
