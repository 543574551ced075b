"""One variable of a process's initial environment, read from ``/proc/PID/environ``.

The kernel keeps the environment the process was started with (``execve``); a process cannot change what others
read there except by overwriting its own memory. The Slurm epilog uses it to recognise a job's process that left
the job's cgroup (a daemonised worker under ``proctrack/linuxproc`` or ``pgid``): Slurm puts ``SLURM_JOB_ID`` in
every job process's environment and children inherit it. Reading another user's environment needs root (or the
same user and ptrace access), which a Slurm epilog has.
"""

from __future__ import annotations

__all__ = ["environ_value"]


def environ_value(pid: int | str, name: str, proc: str = "/proc") -> str | None:
    """The value of ``name`` in ``pid``'s initial environment; ``None`` when it is not set there or the file cannot be
    read (exited, not permitted, a kernel thread)."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    key = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return item[len(key):].decode(errors="replace")
    return None
