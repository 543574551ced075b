"""Private: a guard process that cleans up after an owner that died without doing it (SIGKILL, OOM): the children
it ran (an ssh fleet's clients, the Slurm gate's scontrol) and an ssh fleet's ControlMasters.

The owner's side is :class:`Guard`: it starts the process on first use and tells it the facts;
:class:`~nvmlcheck._proc.child.Child` given a guard tells it its child's start and reaping itself, so every child
run through the one runner with a guard is covered the same way.

The process is run as ``python -I -S guard.py -- SSH [OPTION...]`` (nothing after ``--`` where no master is to be
ended) with its stdin the read end of a pipe whose write end only the owner holds (standard library only: it must
start in ~10 ms and without the owner's ``sys.path``). The owner writes one line per fact: ``pid PID START`` (a
process-group leader and its start time in clock ticks), ``done PID``, ``dir PATH`` (a ControlMaster socket
directory), ``exit`` (cleaned up already: nothing to do). End of file without ``exit`` means the owner died: each
leader still running with the same start time is SIGKILLed with its group, each socket's master is ended with
``SSH OPTION... -o ControlPath=SOCKET -O exit``, and the directory is removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys

TYPE_CHECKING = False  # no typing import: the guard process must start fast
if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["EXIT_WAIT_S", "Guard", "end_masters", "main"]

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


class Guard:
    """The owner's side of a guard process: started on first use (:meth:`start`, or the first fact told), told each
    child's start (:meth:`watch`) and reaping (:meth:`forget`) and each ControlMaster directory (:meth:`directory`),
    dismissed after a clean end (:meth:`dismiss`: nothing for it to do). Should the owner die first, the guard sees
    its pipe close and SIGKILLs each child still running, with its group, and ends the masters. Safe from any thread.

    ``ssh``: the ssh program and options the masters are ended with (none where no master is to be ended). A guard
    that cannot be started, or that died, costs only the cleanup after a SIGKILL: nothing else depends on it. After
    :meth:`dismiss` nothing starts it again.
    """

    def __init__(self, ssh: Sequence[str] = ()) -> None:
        import threading

        self._ssh = list(ssh)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._write: int | None = None  # the write end of the guard's stdin: only this process holds it
        self._tried = False  # one try: a guard that cannot start is not retried for every child
        self._dismissed = False

    @property
    def pid(self) -> int | None:
        """The guard process's PID once started (for tests and diagnostics), else None."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Start the guard process now if it is not running yet (before a child, so that a SIGKILL a moment after
        the child's start finds it there)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._tried or self._dismissed:
            return
        self._tried = True
        _reap_ended()
        read_end, write_end = os.pipe()  # both close-on-exec: no child inherits the write end
        try:
            self._proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), "--", *self._ssh],
                                          stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True, cwd="/")
        except OSError:
            os.close(write_end)
            return
        finally:
            os.close(read_end)
        self._write = write_end

    def _tell(self, line: str) -> None:
        with self._lock:
            self._start()
            if self._write is None:
                return
            try:
                os.write(self._write, f"{line}\n".encode())
            except OSError:  # the guard died: nothing will clean up after a SIGKILL, all else works
                os.close(self._write)
                self._write = None

    def watch(self, pid: int) -> None:
        """``pid`` leads a process group to SIGKILL should the owner die (checked by its start time)."""
        start = _start_ticks(pid)
        if start is not None:
            self._tell(f"pid {pid} {start}")

    def forget(self, pid: int) -> None:
        """``pid`` was reaped (its number may be reused): not to be signalled."""
        with self._lock:
            if self._write is None:
                return
        self._tell(f"done {pid}")

    def directory(self, path: str) -> None:
        """A ControlMaster socket directory: each master in it ended, the directory removed, should the owner die."""
        self._tell(f"dir {path}")

    def dismiss(self, *, wait: bool = True) -> None:
        """Everything is cleaned up: tell the guard there is nothing to do, and reap it (``wait=False``: it ends by
        itself a moment later, once started, and is reaped by a later guard's start or dismissal: a short run need
        not wait for an interpreter to start)."""
        with self._lock:
            self._dismissed = True
            proc, write_end = self._proc, self._write
            self._proc, self._write = None, None
        if write_end is not None:
            with contextlib.suppress(OSError):
                os.write(write_end, b"exit\n")
            os.close(write_end)
        if proc is not None and not wait:
            _ending.append(proc)
        elif proc is not None:
            try:
                proc.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        _reap_ended()


#: Guards dismissed without waiting, not yet reaped.
_ending: list[subprocess.Popen[bytes]] = []


def _reap_ended() -> None:
    """Reap the guards dismissed without waiting that have ended (list operations are atomic: any thread)."""
    for proc in list(_ending):
        if proc.poll() is not None:
            with contextlib.suppress(ValueError):
                _ending.remove(proc)


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
