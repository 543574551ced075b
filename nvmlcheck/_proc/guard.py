"""Private: a guard process that cleans up after an ssh fleet whose owner died without doing it (SIGKILL, OOM).

Run as ``python -I -S guard.py -- SSH [OPTION...]`` with its stdin the read end of a pipe whose write end only the
owner holds (standard library only: it must start in ~10 ms and without the owner's ``sys.path``). The owner writes
one line per fact: ``pid PID START`` (an ssh process-group leader and its start time in clock ticks), ``done PID``,
``dir PATH`` (a ControlMaster socket directory), ``exit`` (cleaned up already: nothing to do). End of file without
``exit`` means the owner died: each leader still running with the same start time is SIGKILLed with its group, each
socket's master is ended with ``SSH OPTION... -o ControlPath=SOCKET -O exit``, and the directory is removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys

__all__ = ["EXIT_WAIT_S", "end_masters", "main"]

#: Seconds an ``ssh -O exit`` may take before it is killed.
EXIT_WAIT_S = 5.0


def _start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (after the parenthesised name), or None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        rest = raw[raw.rfind(b")") + 2 :].split()
        return None if rest[0] in (b"Z", b"X") else int(rest[19])
    except (OSError, IndexError, ValueError):
        return None


def _kill_group(pid: int, start: int) -> None:
    """SIGKILL the group led by ``pid`` if ``pid`` is still the process that started at ``start`` (pinned by a
    pidfd while it is checked, so a recycled PID is never signalled)."""
    try:
        pidfd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        pidfd = -1
    try:
        if _start_ticks(pid) != start or os.getpgid(pid) != pid:
            return
        if pidfd >= 0:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        os.killpg(pid, signal.SIGKILL)  # its helpers (a ProxyCommand) share the group
    except OSError:
        pass
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def end_masters(ssh: list[str], directory: str) -> None:
    """End the ControlMaster of each socket in ``directory`` (``SSH... -O exit``, killed after
    :data:`EXIT_WAIT_S`) and remove the directory."""
    exits = []
    try:
        entries = os.listdir(directory)
    except OSError:
        entries = []
    for name in entries:
        path = os.path.join(directory, name)
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
            exits.append(subprocess.Popen([*ssh, "-o", f"ControlPath={path}", "-O", "exit", "--", "nvmlcheck-guard"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
        except OSError:
            continue
    for proc in exits:
        try:
            proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str]) -> int:
    """Read the owner's lines until ``exit`` or end of file; clean up after an owner that died."""
    ssh = argv[1:] if argv[:1] == ["--"] else argv
    leaders: dict[int, int] = {}
    directories: list[str] = []
    for raw in sys.stdin.buffer:
        word, _, rest = raw.decode("utf-8", "replace").rstrip("\n").partition(" ")
        try:
            if word == "exit":
                return 0
            if word == "pid":
                pid, start = rest.split()
                leaders[int(pid)] = int(start)
            elif word == "done":
                leaders.pop(int(rest), None)
            elif word == "dir":
                directories.append(rest)
        except ValueError:
            continue
    for pid, start in leaders.items():
        _kill_group(pid, start)
    for directory in directories:
        end_masters(ssh, directory)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the owner must not end the guard
    sys.exit(main(sys.argv[1:]))
