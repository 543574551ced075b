"""Advisory GPU locks: one lock file per GPU UUID, taken with ``flock``, so that launch scripts racing for the same
GPUs (``nvmlcheck select --lock``) end up with disjoint sets.

A lock is an exclusive ``flock`` on ``<dir>/<uuid>.lock`` in :func:`lock_dir` (``$NVMLCHECK_LOCK_DIR``, else
``/tmp/nvmlcheck-locks-<uid>``); the kernel releases it when its holder exits, however it exits, so it needs no
cleanup. The file's text is for messages only. :meth:`LockSet.hold_until` hands the locks to a holder process
(``python -m nvmlcheck.locks``) that keeps them until an owner PID exits. Entry points: :func:`try_lock`,
:func:`take_locks`, :func:`lock_info`, :class:`LockSet`, :class:`GpuLock`. Why this directory, the owner PID and
racing selects: docs/cuda.md, "Locks".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .errors import ArgumentError, NoSuchProcess, NvmlCheckError

__all__ = ["ENV_LOCK_DIR", "GpuLock", "LockDirectoryError", "LockHolderFailed", "LockSet", "lock_dir", "lock_info",
           "take_locks", "try_lock"]

#: The environment variable that overrides where lock files live.
ENV_LOCK_DIR = "NVMLCHECK_LOCK_DIR"

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class LockDirectoryError(NvmlCheckError, PermissionError):
    """The default lock directory is a symlink or another user's: someone could read or fake this user's locks.
    Also a ``PermissionError``."""

    __module__ = "nvmlcheck.locks"


class LockHolderFailed(NvmlCheckError, RuntimeError):
    """The process that was to keep the locks exited at start-up; the locks are still held by the caller only.
    Also a ``RuntimeError``."""

    __module__ = "nvmlcheck.locks"
# The default lock directory, per user (a module constant so that tests can move it).
_DEFAULT_DIR = "/tmp/nvmlcheck-locks-{uid}"


def lock_dir(env: Mapping[str, str] | None = None, *, create: bool = True) -> Path:
    """The lock directory: ``$NVMLCHECK_LOCK_DIR``, else ``/tmp/nvmlcheck-locks-<uid>`` (docs/cuda.md, "Locks").

    With ``create``, make it when missing. Raises :class:`LockDirectoryError` (a ``PermissionError``) when the
    default directory is a symlink or another user's: someone could otherwise read or fake this user's locks.
    """
    env = os.environ if env is None else env
    configured = env.get(ENV_LOCK_DIR)
    if configured:
        path = Path(configured)
        if create:
            path.mkdir(parents=True, exist_ok=True)
        return path
    path = Path(_DEFAULT_DIR.format(uid=os.getuid()))
    if create:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = path.lstat()
        import stat

        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise LockDirectoryError(
                f"lock directory {path} is not a directory owned by uid {os.getuid()}; set {ENV_LOCK_DIR}")
    return path


def _lock_path(directory: Path, uuid: str) -> Path:
    return directory / f"{_SAFE.sub('_', uuid)}.lock"


@dataclass(frozen=True, slots=True)
class GpuLock:
    """A lock this process holds: the GPU's ``uuid``, the lock file ``path``, the open descriptor ``fd``."""

    uuid: str
    path: Path
    fd: int


def _describe_self(owner_pid: int | None) -> bytes:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    owner = "" if owner_pid is None else f" owner={owner_pid}"
    return f"holder={os.getpid()}{owner} since={stamp}\n".encode()


def _write_info(fd: int, text: bytes) -> None:
    # Information only (messages name the holder); a read-only descriptor (a shared directory) cannot write it.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, text, 0)


def try_lock(uuid: str, directory: Path | None = None, *, record: bool = True) -> GpuLock | None:
    """Take the lock of GPU ``uuid`` without blocking; ``None`` when another open file holds it (another process,
    or another lock in this one). The lock lasts until :meth:`LockSet.release` or this process exits. ``record``:
    write this process's PID in the file (for messages)."""
    directory = lock_dir() if directory is None else directory
    path = _lock_path(directory, uuid)
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_CREAT
    try:
        fd = os.open(path, flags | os.O_RDWR, 0o644)
    except PermissionError:
        fd = os.open(path, flags & ~os.O_CREAT | os.O_RDONLY)  # another user's file in a shared directory
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    if record:
        _write_info(fd, _describe_self(None))
    return GpuLock(uuid, path, fd)


def lock_info(uuid: str, directory: Path | None = None) -> str | None:
    """Who holds GPU ``uuid``'s lock, as its file says (``"holder=123 owner=45 since=..."``), when it is held;
    ``None`` when it is free (probed by taking and releasing it)."""
    directory = lock_dir() if directory is None else directory
    taken = try_lock(uuid, directory, record=False)  # a probe: keep the last holder's text
    if taken is not None:
        os.close(taken.fd)
        return None
    try:
        text = _lock_path(directory, uuid).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        text = ""
    return text or "held (no holder recorded)"


class LockSet:
    """Locks held together (what ``select_clean(lock=True)`` returns in :attr:`Selection.locks`).

    A context manager: leaving the block releases them. :meth:`hold_until` hands them to a holder process instead.
    ``locks``: the :class:`GpuLock` of each GPU; ``directory``: where their files are; ``holder_pid`` and
    ``owner_pid``: after :meth:`hold_until`, the holder process and the process whose exit ends the locks (else
    ``None``).
    """

    def __init__(self, locks: Sequence[GpuLock], directory: Path) -> None:
        self.locks: tuple[GpuLock, ...] = tuple(locks)
        self.directory = directory
        self.holder_pid: int | None = None
        self.owner_pid: int | None = None

    @property
    def uuids(self) -> tuple[str, ...]:
        """The locked GPUs' UUIDs."""
        return tuple(lock.uuid for lock in self.locks)

    @property
    def held_here(self) -> bool:
        """Whether this process still has the descriptors (neither released nor handed over)."""
        return any(lock.fd >= 0 for lock in self.locks) and self.holder_pid is None

    def release(self) -> None:
        """Close this process's descriptors. Idempotent. After :meth:`hold_until` the holder keeps the locks."""
        for lock in self.locks:
            with contextlib.suppress(OSError):
                os.close(lock.fd)
        self.locks = tuple(GpuLock(lock.uuid, lock.path, -1) for lock in self.locks)

    def hold_until(self, pid: int) -> int:
        """Keep the locks after this process exits, until process ``pid`` exits: start a holder process that
        inherits the descriptors and waits for ``pid`` (through a pidfd where the kernel has them, else by polling
        ``/proc/<pid>`` start time every 0.5 s), then release them here. Returns the holder's PID.

        Raises :class:`~nvmlcheck.NoSuchProcess` (a ``ProcessLookupError``) when ``pid`` is not running (the locks
        would end at once); the locks are still held here then.
        """
        import subprocess

        fds = [lock.fd for lock in self.locks if lock.fd >= 0]
        if not fds or self.holder_pid is not None:
            raise ArgumentError("no locks held here to hand over")
        argv = [sys.executable, "-m", "nvmlcheck.locks", "--owner", str(pid), "--fds", ",".join(map(str, fds))]
        pidfd = -1
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise NoSuchProcess(f"process {pid} is not running: locks held until it exits would end now") from None
        except (OSError, AttributeError):
            argv += ["--start-time", str(_start_time(pid))]  # no pidfd (old kernel): identify the owner by start time
        if pidfd >= 0:
            argv += ["--pidfd", str(pidfd)]
        # The holder says it is running before the locks are called handed over: one that died at start-up (an
        # import error) would release them silently, and "locked" must never be said of a free GPU.
        ready_r, ready_w = os.pipe()
        argv += ["--ready", str(ready_w)]
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            holder = subprocess.Popen(
                argv,
                env=env,
                pass_fds=(*fds, ready_w, *([pidfd] if pidfd >= 0 else [])),
                stdin=subprocess.DEVNULL,
                # Not the caller's stdout: `$(nvmlcheck select --lock)` waits for every writer of its pipe to close.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: a terminal's SIGHUP or a Ctrl-C to the launch script's group does not end it.
                start_new_session=True,
                cwd="/",
            )
        finally:
            os.close(ready_w)
            if pidfd >= 0:
                os.close(pidfd)
        with open(ready_r, "rb") as ready:  # closes ready_r
            said = ready.read()
        if said != b"ready":
            holder.wait()
            raise LockHolderFailed(f"the lock holder process exited at start-up (status {holder.returncode}); "
                               "the locks are still held by this process only")
        # The holder already shares the open files (inherited at fork), so the locks are never free in between.
        for lock in self.locks:
            if lock.fd >= 0:
                _write_info(lock.fd, f"holder={holder.pid} owner={pid} since="
                                     f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
        self._popen = holder  # kept so that a long-lived caller reaps it (subprocess's own cleanup)
        self.release()
        self.holder_pid, self.owner_pid = holder.pid, pid
        return holder.pid

    def __enter__(self) -> LockSet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        where = f"holder {self.holder_pid} until {self.owner_pid} exits" if self.holder_pid else "this process"
        return f"<nvmlcheck LockSet {list(self.uuids)} held by {where}>"


def take_locks(uuids: Iterable[str], directory: Path) -> tuple[LockSet, list[str]]:
    """Try each GPU's lock; the set of those taken and the UUIDs that were busy."""
    taken: list[GpuLock] = []
    busy: list[str] = []
    for uuid in uuids:
        lock = try_lock(uuid, directory)
        if lock is None:
            busy.append(uuid)
        else:
            taken.append(lock)
    return LockSet(taken, directory), busy


def _start_time(pid: int) -> int:
    """The start time of ``pid`` in clock ticks: with the PID, it names one process. OSError when it is gone."""
    from ._proc.procfs import read_stat

    st = read_stat(pid)
    if st is None:
        raise NoSuchProcess(f"process {pid} is not running")
    return st.start_ticks


def _alive(pid: int, start_time: int) -> bool:
    try:
        return _start_time(pid) == start_time
    except (OSError, ValueError, IndexError):
        return False


def _hold(argv: Sequence[str]) -> int:
    """The holder process: keep the inherited lock descriptors open until the owner exits."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nvmlcheck.locks", description=__doc__.split("\n")[0])
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--fds", required=True)
    parser.add_argument("--pidfd", type=int, default=-1)
    parser.add_argument("--start-time", type=int, default=None)
    parser.add_argument("--ready", type=int, default=-1)
    args = parser.parse_args(argv)
    for fd in map(int, args.fds.split(",")):
        os.fstat(fd)  # the locks really were inherited (EBADF otherwise: exit before saying ready)
    if args.ready >= 0:
        os.write(args.ready, b"ready")
        os.close(args.ready)
    if args.pidfd >= 0:
        import select

        poller = select.poll()
        poller.register(args.pidfd, select.POLLIN)
        while not poller.poll():  # readable once the owner has exited
            pass
        return 0
    if args.start_time is None:
        parser.error("--pidfd or --start-time is needed")
    while _alive(args.owner, args.start_time):
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(_hold(sys.argv[1:]))
