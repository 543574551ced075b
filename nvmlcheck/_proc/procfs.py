"""Reading ``/proc``: one process's stat and status lines, its command line, children and ancestry.

Every reader returns ``None`` when the process is gone or the file cannot be read; none raises for a process that
exits while it is being read (that race is the normal case here).
"""

from __future__ import annotations

import os
from collections import namedtuple

TYPE_CHECKING = False  # no typing before a signal: start-up cost where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from typing import NamedTuple

__all__ = [
    "PID_MAX_LIMIT",
    "STATE_WORDS",
    "ProcStat",
    "ProcStatus",
    "ancestors",
    "parse_status",
    "children",
    "cmdline",
    "pid_max",
    "pidns_inode",
    "read_cgroup",
    "read_stat",
    "read_status",
]

#: Linux's largest possible PID, the hard upper bound on ``/proc/sys/kernel/pid_max`` (``PID_MAX_LIMIT`` of
#: include/linux/threads.h, 4 Mi on 64-bit): used when that file cannot be read, and the one definition in the package
#: (a process list naming a larger PID is corrupt data, from NVML or nvidia-smi).
PID_MAX_LIMIT = 4_194_304

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
        one)."""

        pid: int
        comm: str
        state: str
        ppid: int
        start_ticks: int

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

else:  # the same tuples without typing (collections is loaded by argparse anyway): the kill CLI's fast path
    ProcStat = namedtuple("ProcStat", "pid comm state ppid start_ticks")
    ProcStatus = namedtuple("ProcStatus", "tgid uid nspid sig_ign sig_cgt sig_blk", defaults=(None, None, None))


def read_stat(pid: int | str, proc: str = "/proc") -> ProcStat | None:
    """``/proc/PID/stat`` parsed, or ``None`` if the process is gone or unreadable. ``pid`` may be ``"self"``."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
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
        )
    except (IndexError, ValueError):
        return None


def read_status(pid: int | str, proc: str = "/proc") -> ProcStatus | None:
    """``Tgid``, real ``Uid``, ``NSpid`` and the signal masks from ``/proc/PID/status``, or ``None`` if gone or
    unreadable."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            raw = f.read()
    except OSError:
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


def read_cgroup(pid: int | str, proc: str = "/proc") -> str | None:
    """The text of ``/proc/PID/cgroup``, or ``None`` if gone or unreadable (parsed by :mod:`.container`)."""
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


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


def pid_max(proc: str = "/proc") -> int:
    """``/proc/sys/kernel/pid_max``: the largest PID this host hands out, plus one (``PID_MAX_LIMIT`` if
    unreadable)."""
    try:
        with open(f"{proc}/sys/kernel/pid_max", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def ancestors(pid: int | str = "self", proc: str = "/proc") -> tuple[int, ...]:
    """The chain of parents of ``pid``, nearest first, up to PID 1 (or the edge of this PID namespace, where the
    parent reads 0). Stops early, without error, where a process exits while it is read."""
    out: list[int] = []
    st = read_stat(pid, proc)
    while st is not None and st.ppid > 0 and st.ppid not in out:
        out.append(st.ppid)
        if st.ppid == 1:
            break
        st = read_stat(st.ppid, proc)
    return tuple(out)


def children(pid: int, proc: str = "/proc") -> set[int] | None:
    """The children of ``pid`` (of every thread of it), from ``/proc/PID/task/*/children``; ``None`` when the
    kernel has no such file (``CONFIG_PROC_CHILDREN`` off) or the process is gone."""
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    out: set[int] = set()
    seen_file = False
    for task in tasks:
        try:
            with open(f"{proc}/{pid}/task/{task}/children", "rb") as f:
                out.update(int(c) for c in f.read().split())
            seen_file = True
        except FileNotFoundError:
            continue  # the thread ended, or the kernel lacks the file
        except (OSError, ValueError):
            continue
    return out if seen_file else None


def all_children(proc: str = "/proc") -> dict[int, set[int]]:
    """Parent → children for every process, from every ``/proc/PID/stat`` (the slow path, where the ``children``
    files do not exist)."""
    out: dict[int, set[int]] = {}
    for name in os.listdir(proc):
        if name.isdigit():
            st = read_stat(name, proc)
            if st is not None:
                out.setdefault(st.ppid, set()).add(st.pid)
    return out
