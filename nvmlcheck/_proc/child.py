"""Private: one child process run with a deadline, its output read from both pipes, killed with its whole group.

Used by the nvidia-smi runner (``backends/smi.py``), the ssh fleet (``hosts.py``) and the Slurm gate's scontrol
(``slurm.py``). The child is started from an argv (never a shell) in a new session, so one ``killpg`` reaches
everything it started; the leader is reaped only through this class, after the reading is over, so its pid (= the
group id) cannot be reused while a signal may still be sent to the group.

What the leader leaves in its group ends with the run: when the leader has exited, the group is SIGKILLed just
before the leader is reaped (its pid, the group id, is still ours then), as at a deadline. A process that left the
group (a new session: an ssh ControlMaster daemonises so) is not reached, and is not meant to be.

Given a :class:`~nvmlcheck._proc.guard.Guard`, the child is told to it when started and forgotten when reaped: should
this process die without cleaning up (SIGKILL), the guard process SIGKILLs the child's group. Its command runs only
once the guard knows it (a shell waits for a go-ahead line on its stdin, written after the guard was told, then
becomes the command): a death between the start and that note leaves only a shell that reads end of file and exits.

Both pipes and a pidfd are watched with one selector, so the exit is seen the moment it happens. Each pipe keeps at
most ``max_output_bytes`` (a hostile or broken program must not fill this process's memory): past it the wait gives
up, as at a deadline, and :attr:`Child.overflow` names the pipe.
``Popen.communicate(timeout=...)`` would do for a plain run, but its wait polls ``waitpid`` with sleeps that start at
0.5 ms and double, which alone added ~1 ms to every nvidia-smi run (measured), and it cannot stop reading at a grace
after the exit or ask a stop callable.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Final

if TYPE_CHECKING:
    from .guard import Guard

__all__ = ["MAX_OUTPUT_BYTES", "REAP_GRACE_S", "Child"]

#: After a kill, how long to wait for the leader to be reaped (and, when asked, its pipes to close). A process that
#: left the group could hold the pipes forever, and one in uninterruptible sleep outlives SIGKILL: neither may hold
#: the caller.
REAP_GRACE_S: Final = 1.0

#: The most a child may print on each of stdout and stderr unless told otherwise: far above any nvidia-smi or
#: nvmlcheck document (an 8-GPU ``nvidia-smi -q`` is ~100 KiB), far below what would hurt this process.
MAX_OUTPUT_BYTES: Final = 16 << 20

# The longest single select: a deadline decades away (a --timeout of 1e308 s) would overflow the kernel's timeout.
_MAX_SELECT_S: Final = 3600.0

# How often the exit is polled where no pidfd can be had (Linux < 5.3): the first look is soon, later ones back off.
_POLL_FIRST_S: Final = 0.0005
_POLL_MAX_S: Final = 0.05


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits (Linux >= 5.3), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class Child:
    """A started child: ``argv`` in a new session, stdin from ``/dev/null`` (or, with ``hold_stdin``, a pipe that
    holds those bytes and that this process keeps open until the child is reaped, killed or closed: ssh then keeps
    the remote command's stdin open, and its end, or this process's death, reaches the remote command as end of
    file), stdout and stderr collected. ``guard``: a :class:`~nvmlcheck._proc.guard.Guard` that kills the child's
    group should this process die before reaping it (started first, if not yet running); the command then runs only
    once the guard knows its PID (``/bin/sh`` waits for a go-ahead line on its stdin, then becomes the command).

    ``after_exit_s``: ``None`` reads both pipes to their end (bounded by the deadline of :meth:`wait`); a number
    stops reading that many seconds after the exit even if the pipes are still open (an ssh ControlMaster keeps
    copies of its clients' pipes). ``env``: the child's environment (default: inherited). ``max_output_bytes``: the
    most kept of each pipe (``None``: no bound); past it :meth:`wait` returns False and :attr:`overflow` says
    ``"stdout"`` or ``"stderr"`` (what comes later is read and dropped). Raises ``OSError`` when the program cannot
    be started.

    ``proc`` is the :class:`subprocess.Popen` (for ``pid`` and ``returncode``); do not wait on it directly.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        after_exit_s: float | None = None,
        max_output_bytes: int | None = MAX_OUTPUT_BYTES,
        hold_stdin: bytes | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.after_exit_s = after_exit_s
        self.max_output_bytes = max_output_bytes
        #: ``"stdout"`` or ``"stderr"`` once that pipe went over ``max_output_bytes``, else ``None``.
        self.overflow: str | None = None
        self._killing = False
        # Both ends close-on-exec: only the child gets the read end (as its stdin), no other child the write end.
        self._stdin_w: int | None = None
        stdin_r = subprocess.DEVNULL
        # A guarded child's go-ahead, written on its stdin once the guard knows it (then the held bytes, if any).
        go_w: int | None = None
        if guard is not None:
            guard.start()  # before the child: a SIGKILL a moment after its start finds the guard running
            argv = _after_the_guard_knows(argv, env, keep_stdin=hold_stdin is not None)
            stdin_r, go_w = os.pipe()
        elif hold_stdin is not None:
            stdin_r, self._stdin_w = os.pipe()
            os.write(self._stdin_w, hold_stdin)  # a few bytes: the pipe's buffer takes them at once
        self._guard = guard
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=stdin_r,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=env,
            )
        except BaseException:
            self._release_stdin()
            if go_w is not None:
                os.close(go_w)
            raise
        finally:
            if stdin_r != subprocess.DEVNULL:
                os.close(stdin_r)
        if go_w is not None:
            self._go_ahead(go_w, hold_stdin)
        self.stdout = bytearray()
        self.stderr = bytearray()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._open: dict[int, tuple[IO[bytes], bytearray, str]] = {
            self.proc.stdout.fileno(): (self.proc.stdout, self.stdout, "stdout"),
            self.proc.stderr.fileno(): (self.proc.stderr, self.stderr, "stderr"),
        }
        self._exited_ns: int | None = None  # when the exit was seen (the leader may still be unreaped)
        # Reaping and signalling the group take turns, so a signal never goes to a reaped (reusable) group id.
        self._reap_lock = threading.Lock()

    def _go_ahead(self, go_w: int, hold_stdin: bytes | None) -> None:
        """Tell the guard of the started child, then let its command run: ``go`` on its stdin, then the held bytes
        (the shell's ``read`` takes its line byte by byte: the command reads exactly those). Interrupted meanwhile
        (Ctrl-C in this thread), the child's group is killed and reaped, and the interruption goes on: no child is
        left that nobody holds (one not told to go never ran its command)."""
        guard = self._guard
        assert guard is not None
        try:
            guard.watch(self.proc.pid)
            # A child gone already (killed) makes the write fail: its reaping says so. A few bytes: the pipe's buffer
            # takes them at once, all or nothing.
            with contextlib.suppress(OSError):
                os.write(go_w, b"go\n" + (hold_stdin or b""))
        except BaseException:
            os.close(go_w)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # unreaped: the group id is still ours
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(REAP_GRACE_S)
            if self.proc.returncode is not None:
                guard.forget(self.proc.pid)
            raise
        if hold_stdin is None:
            os.close(go_w)  # the command reads /dev/null, as an unguarded one does
        else:
            self._stdin_w = go_w  # held open, as an unguarded child's stdin

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped (negative: ended by that signal), else ``None``."""
        return self.proc.returncode

    def wait(
        self,
        deadline_ns: int | None,
        *,
        should_stop: Callable[[], bool] | None = None,
        slice_s: float = 0.05,
        after_exit_s: float | None = None,
    ) -> bool:
        """Read the pipes until the child exited and its output is complete (see ``after_exit_s``), then reap it.

        ``deadline_ns``: ``time.monotonic_ns()`` at which to give up (``None``: never). ``should_stop`` is called
        at least every ``slice_s`` seconds; giving up when it returns true. Returns True when reaped, False when the
        deadline came, ``should_stop`` said so or the output went over ``max_output_bytes`` first (nothing is
        killed: see :meth:`kill`). ``after_exit_s`` replaces the child's own for this call. Can be called again after
        False.
        """
        grace_s = self.after_exit_s if after_exit_s is None else after_exit_s
        grace_ns = None if grace_s is None else int(grace_s * 1e9)
        poll_s = _POLL_FIRST_S  # used only without a pidfd
        with selectors.DefaultSelector() as sel:
            pidfd = self._register(sel)
            try:
                while True:
                    if self._exited_ns is None and pidfd is None and self._exited():
                        self._exited_ns = time.monotonic_ns()
                    now = time.monotonic_ns()
                    if self._exited_ns is not None and (
                        not self._open or (grace_ns is not None and now - self._exited_ns >= grace_ns)
                    ):
                        return self._reap()
                    if self._give_up(now, deadline_ns, should_stop):
                        return False
                    timeout = self._timeout(now, deadline_ns, grace_ns, slice_s if should_stop else None)
                    if pidfd is None and self._exited_ns is None:
                        timeout = poll_s if timeout is None else min(timeout, poll_s)
                        poll_s = min(poll_s * 2, _POLL_MAX_S)
                    for key, _ in sel.select(timeout):
                        if key.fd == pidfd:
                            sel.unregister(pidfd)
                            os.close(pidfd)
                            pidfd = None
                            self._exited_ns = time.monotonic_ns()
                        elif self._read(key.fd):
                            sel.unregister(key.fd)
            finally:
                if pidfd is not None:
                    os.close(pidfd)

    def _register(self, sel: selectors.BaseSelector) -> int | None:
        """Register the open pipes, and a pidfd for the exit while the child runs (returned: the caller closes it).
        Ctrl-C while registering closes the pidfd it opened: an interrupted wait leaves no descriptor behind."""
        pidfd = _pidfd(self.proc.pid) if self._exited_ns is None and self.proc.returncode is None else None
        try:
            for fd in self._open:
                sel.register(fd, selectors.EVENT_READ)
            if pidfd is not None:
                sel.register(pidfd, selectors.EVENT_READ)
        except BaseException:
            if pidfd is not None:
                os.close(pidfd)
            raise
        return pidfd

    def _give_up(self, now: int, deadline_ns: int | None, should_stop: Callable[[], bool] | None) -> bool:
        """The deadline passed, ``should_stop`` says so, or the output went over its bound (unless being killed)."""
        if deadline_ns is not None and now >= deadline_ns:
            return True
        if self.overflow is not None and not self._killing:
            return True
        return should_stop is not None and should_stop()

    def _timeout(self, now: int, deadline_ns: int | None, grace_ns: int | None, slice_s: float | None) -> float | None:
        """Seconds the next select may block: to the deadline, to the end of the grace after exit, to the slice."""
        end = deadline_ns
        if self._exited_ns is not None and grace_ns is not None:
            after = self._exited_ns + grace_ns
            end = after if end is None or after < end else end
        timeout = None if end is None else max(0.0, (end - now) / 1e9)
        if slice_s is not None and (timeout is None or slice_s < timeout):
            timeout = slice_s
        return timeout if timeout is None else min(timeout, _MAX_SELECT_S)

    def _exited(self) -> bool:
        """Whether the leader exited, without reaping it (``WNOWAIT``), for where no pidfd can be had."""
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped already (by this class: returncode is set)
            return True

    def _reap(self) -> bool:
        """Reap the leader if it exited; first SIGKILL what it left in its group (its exit was seen and it is not
        reaped: its pid, the group id, is still ours). True when reaped."""
        with self._reap_lock:
            if self.proc.returncode is None and self._exited_ns is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.poll()
            guard = self._guard if self.proc.returncode is not None else None
            if guard is not None:
                self._guard = None
        if guard is not None:
            guard.forget(self.proc.pid)
        if self.proc.returncode is not None:
            self._release_stdin()
        return self.proc.returncode is not None

    def _release_stdin(self) -> None:
        """Close the held end of the child's stdin (``hold_stdin``): the child, and whatever it forwards its stdin
        to, reads end of file."""
        fd, self._stdin_w = self._stdin_w, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _read(self, fd: int) -> bool:
        """Read what is there; True at end of file (the pipe is then closed). Past ``max_output_bytes`` the rest is
        dropped and :attr:`overflow` set."""
        pipe, buf, name = self._open[fd]
        chunk = os.read(fd, 1 << 16)
        if chunk:
            cap = self.max_output_bytes
            if cap is not None and len(buf) + len(chunk) > cap:
                chunk = chunk[: max(0, cap - len(buf))]
                if self.overflow is None:
                    self.overflow = name
            buf += chunk
            return False
        # Forgotten before it is closed: a signal handler raising between the two (Ctrl-C, SIGHUP) must not leave a
        # closed descriptor listed, whose number a later wait (the kill's) would find reused by its own pidfd.
        del self._open[fd]
        pipe.close()
        return True

    def signal_group(self, sig: int = signal.SIGKILL) -> bool:
        """Send ``sig`` to the child's whole process group, only while the leader is unreaped (its pid, the group
        id, cannot have been reused). Safe from any thread. True when sent."""
        with self._reap_lock:
            if self.proc.returncode is not None:
                return False
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                return False
            return True

    def kill(
        self, grace_s: float = REAP_GRACE_S, *, read_after_exit: bool = True, deadline_ns: int | None = None
    ) -> bool:
        """SIGKILL to the group, then reap the leader within ``grace_s`` (and by ``deadline_ns``, on
        ``time.monotonic_ns()``, when given: a caller's deadline is not overrun by the grace), reading its last
        output (``read_after_exit``: the pipes to their end, or the child's ``after_exit_s``; False: stop at the
        exit). The pipes are closed either way. Returns whether the leader was reaped: a process outside the group
        may hold the pipes, or the leader be stuck in uninterruptible sleep; then it is left, not waited for."""
        self._release_stdin()  # first: a multiplexed ssh's remote command ends on it even if the master outlives us
        self.signal_group(signal.SIGKILL)
        self._killing = True  # an overflow no longer stops the wait: the leader is to be reaped
        end = time.monotonic_ns() + int(grace_s * 1e9)
        self.wait(end if deadline_ns is None else min(end, deadline_ns),
                  after_exit_s=None if read_after_exit else 0.0)
        self.close()
        if self.proc.returncode is None:
            # The leader usually did die (a helper outside the group held the pipes): reap it rather than leave a
            # zombie. One truly stuck is left to subprocess's own clean-up.
            self._reap()
        return self.proc.returncode is not None

    def close(self) -> None:
        """Stop reading: close the pipes (what was read stays in ``stdout`` and ``stderr``) and the held stdin."""
        self._release_stdin()
        pipes, self._open = list(self._open.values()), {}  # as in _read: forgotten first
        for pipe, _, _ in pipes:
            with contextlib.suppress(OSError):
                pipe.close()


#: What a guarded child runs first: it reads one line from its stdin, the word that the guard knows its PID, then
#: becomes the command (the same PID and group) with /dev/null as its stdin. Should this process die before (SIGKILL
#: between the start and the guard's note), the read meets the pipe's end and the command never runs: nothing the
#: guard could not end. No descriptor number is named (dash takes only 0-9).
_WAIT_FOR_GUARD: Final = 'read -r _ && exec "$@" </dev/null'
#: The same for a child whose stdin is held (a fleet's ssh): the command keeps the pipe as its stdin, and reads what
#: follows the go-ahead line (``read`` takes a pipe's bytes one at a time: it reads nothing past its line).
_WAIT_FOR_GUARD_KEEP_STDIN: Final = 'read -r _ && exec "$@"'


def _after_the_guard_knows(argv: Sequence[str], env: Mapping[str, str] | None, *,
                           keep_stdin: bool = False) -> list[str]:
    """``argv`` run by ``/bin/sh`` once told on its stdin (:data:`_WAIT_FOR_GUARD`; ``keep_stdin``: the command keeps
    that stdin, :data:`_WAIT_FOR_GUARD_KEEP_STDIN`). The program is looked up first: one that cannot be run raises
    ``FileNotFoundError``/``PermissionError`` here, as ``Popen`` would, rather than starting a shell that fails (a
    command "not started" is not one that ran). The words are handed on as given: the command's ``argv[0]`` (what
    ``ps`` shows: ``ssh``) is the caller's, as without a guard; the shell looks it up on the same ``PATH``."""
    import shutil

    program = argv[0]
    path = program if os.sep in program else shutil.which(program, path=(env if env is not None else os.environ)
                                                           .get("PATH", os.defpath))
    if path is None or not os.path.exists(path):
        raise FileNotFoundError(2, "No such file or directory", program)
    if os.path.isdir(path) or not os.access(path, os.X_OK):
        raise PermissionError(13, "Permission denied", program)
    script = _WAIT_FOR_GUARD_KEEP_STDIN if keep_stdin else _WAIT_FOR_GUARD
    return ["/bin/sh", "-c", script, "sh", *argv]
