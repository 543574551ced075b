"""Advisory GPU locks: one lock file per GPU UUID, taken with ``flock``, so that launch scripts racing for the same
GPUs (``nvmlcheck select --lock``) end up with disjoint sets.

A lock is an exclusive ``flock`` on ``<dir>/<uuid>.lock`` in :func:`lock_dir` (``$NVMLCHECK_LOCK_DIR``, else
``/tmp/nvmlcheck-locks-<uid>``); the kernel releases it when its holder exits, however it exits. A lock counts only
while the path still names the locked file (checked after each ``flock``; the holder process re-creates a file that
a /tmp cleaner removed). A directory or file that cannot be used safely raises :class:`LockDirError`.
:meth:`LockSet.hold_until` hands the locks to a holder process (``python -m nvmlcheck.locks``) that keeps them until
an owner PID exits. Entry points: :func:`try_lock`, :func:`take_locks`, :func:`lock_info`, :class:`LockSet`,
:class:`GpuLock`. Why this directory, the owner PID, racing selects and removed files: docs/cuda.md, "Locks".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from ._text import printable
from .errors import ArgumentError, NoSuchProcess, NvmlCheckError

__all__ = [
    "ENV_LOCK_DIR", "GpuLock", "LockDirError", "LockHolderFailed", "LockSet", "Owner", "check_owner", "choosing",
    "lock_dir", "lock_info", "pin_owner", "prepare_lock_dir", "recorded_holder", "take_locks", "try_lock",
]

#: The environment variable that overrides where lock files live.
ENV_LOCK_DIR = "NVMLCHECK_LOCK_DIR"

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
# The default lock directory, per user (a module constant so that tests can move it).
_DEFAULT_DIR = "/tmp/nvmlcheck-locks-{uid}"
# How often a lock is taken again when its file is replaced between open and flock (a cleaner racing us).
_RETRIES = 8
# How often the holder process checks that its lock files are still there (seconds).
_RECHECK_S = 1.0
_NOT_RUNNING = "process {pid} is not running (no such process): locks held until it exits would end now"
# The most of a lock file's text that is read for a message.
_INFO_MAX_BYTES = 4096
# The file whose flock lets one select at a time choose among a directory's GPUs (no GPU's: a UUID never starts
# with a dot), and how long a select waits for another's choice before choosing without it (seconds).
_CHOOSING = ".choosing.lock"
_CHOOSING_WAIT_S = 5.0


class LockDirError(NvmlCheckError, OSError):
    """A lock directory or lock file that cannot be used safely: not a directory, another user's, a planted
    symbolic link or FIFO, not writable for a new GPU's file, or a lock file removed while it was being taken.
    ``directory`` names the lock directory, ``path`` the file (or ``None``); the message says how to fix it."""

    def __init__(self, directory: str | os.PathLike[str], message: str, path: str | os.PathLike[str] | None = None
                 ) -> None:
        self.directory = str(directory)
        self.path = None if path is None else str(path)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return self.message


class LockHolderFailed(NvmlCheckError, RuntimeError):
    """The process that was to keep the locks exited at start-up; the locks are still held by the caller only.
    Also a ``RuntimeError``."""

    __module__ = "nvmlcheck.locks"


def _who(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a regular file"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return word
    return "not a regular file"


def lock_dir(env: Mapping[str, str] | None = None, *, create: bool = True) -> Path:
    """The lock directory: ``$NVMLCHECK_LOCK_DIR``, else ``/tmp/nvmlcheck-locks-<uid>`` (docs/cuda.md, "Locks").

    With ``create``, make it when missing and check it (:func:`prepare_lock_dir`). Raises :class:`LockDirError`
    (an ``OSError``) when the default directory is a symlink, not a directory or another user's (someone could
    otherwise read or fake this user's locks), and when ``$NVMLCHECK_LOCK_DIR`` is not a usable directory.
    """
    env = os.environ if env is None else env
    configured = env.get(ENV_LOCK_DIR)
    if configured:
        path = Path(configured)
        if create:
            prepare_lock_dir(path)
        return path
    path = Path(_DEFAULT_DIR.format(uid=os.getuid()))
    if create:
        _prepare_private(path)
    return path


def _prepare_private(path: Path) -> None:
    """The default directory: this user's own, 0700, never a link (it lives in /tmp, where anyone can plant one)."""
    try:
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        st = path.lstat()
    except OSError as exc:
        raise LockDirError(path, f"lock directory {path}: {exc.strerror or exc}; set {ENV_LOCK_DIR} to a directory "
                                 "of your own") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        what = _kind(st.st_mode) if not stat.S_ISDIR(st.st_mode) else f"a directory owned by {_who(st.st_uid)}"
        raise LockDirError(path, f"lock directory {path} is {what}, not a directory owned by {_who(os.getuid())} "
                                 f"(someone else made it): remove it, or set {ENV_LOCK_DIR} to a directory of your own")


def prepare_lock_dir(path: str | os.PathLike[str]) -> Path:
    """Make a configured lock directory usable, or say why it is not (:class:`LockDirError`).

    A missing directory is created shared like ``/tmp`` (mode 1777: every user can add a GPU's file, none can remove
    another's), its parents with the usual mode. An existing one must be a directory (a link to one is followed: it
    was configured), and not writable by everyone without the sticky bit (anyone could then remove a held lock's
    file and take the GPU again). Returns the path.
    """
    path = Path(path)
    try:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)  # made private first, opened up below: never briefly 0777 without the sticky bit
            except FileExistsError:
                pass  # another process made it meanwhile: checked below like any existing directory
            else:
                os.chmod(path, 0o1777)
        st = os.stat(path)
    except OSError as exc:
        raise LockDirError(path, f"lock directory {path} ({ENV_LOCK_DIR}): {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise LockDirError(path, f"lock directory {path} ({ENV_LOCK_DIR}) is {_kind(st.st_mode)}, not a directory")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise LockDirError(path, f"lock directory {path} ({ENV_LOCK_DIR}) is writable by every user without the "
                                 f"sticky bit: anyone could remove a held lock's file; make it like /tmp: "
                                 f"chmod 1777 {path}")
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


def _open_lock_file(path: Path, directory: Path) -> int:
    """Open (creating it if needed) ``path`` for a lock: never through a symbolic link, never blocking on a FIFO,
    and only a regular file. Raises :class:`LockDirError` saying what is wrong and how to fix it."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_RDWR, 0o644)
        except PermissionError:
            # Another user's file in a shared directory (or fs.protected_regular refusing O_CREAT on it): flock
            # works on a read-only descriptor. ENOENT here means the file is missing and cannot be created.
            fd = os.open(path, flags | os.O_RDONLY)
    except OSError as exc:
        raise _open_error(path, directory, exc) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise _open_error(path, directory, exc) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(path, directory, st)
    return fd


def _not_regular(path: Path, directory: Path, st: os.stat_result) -> LockDirError:
    return LockDirError(directory, f"lock file {path} is {_kind(st.st_mode)} owned by {_who(st.st_uid)}, not a "
                                   "regular file: someone may have planted it; remove it", path)


def _open_error(path: Path, directory: Path, exc: OSError) -> LockDirError:
    try:
        found: os.stat_result | None = os.lstat(path)
    except OSError:
        found = None
    try:
        dir_st: os.stat_result | None = os.stat(directory)
    except OSError:
        dir_st = None
    if exc.errno == errno.ELOOP or (found is not None and stat.S_ISLNK(found.st_mode)):
        owner = f" owned by {_who(found.st_uid)}" if found is not None else ""
        return LockDirError(directory, f"lock file {path} is a symbolic link{owner}: nvmlcheck never follows one "
                                       "there (someone may have planted it to make nvmlcheck write elsewhere); "
                                       "remove it", path)
    if dir_st is None or not stat.S_ISDIR(dir_st.st_mode):
        what = "does not exist" if dir_st is None else f"is {_kind(dir_st.st_mode)}"
        return LockDirError(directory, f"lock directory {directory} {what}: cannot open {path.name}", path)
    if found is not None and not stat.S_ISREG(found.st_mode):
        # A directory (EISDIR), a socket (ENXIO): refused at the open, as a FIFO or a device is after it.
        return _not_regular(path, directory, found)
    if found is None and exc.errno in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS):
        mode = stat.S_IMODE(dir_st.st_mode)
        return LockDirError(directory, f"cannot create lock file {path.name} in {directory} (mode {mode:04o}, owned "
                                       f"by {_who(dir_st.st_uid)}): it is not writable by {_who(os.getuid())}. A lock "
                                       "directory shared by several users must let each add files, like /tmp: "
                                       f"chmod 1777 {directory}", path)
    if found is not None and exc.errno in (errno.EACCES, errno.EPERM):
        return LockDirError(directory, f"cannot open lock file {path} (mode {stat.S_IMODE(found.st_mode):04o}, owned "
                                       f"by {_who(found.st_uid)}): {_who(os.getuid())} cannot read it; its owner can "
                                       f"make it readable (chmod 644 {path}) or remove it", path)
    return LockDirError(directory, f"cannot open lock file {path}: {exc.strerror or exc}", path)


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a lock on a removed or replaced file counts for no one)."""
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def try_lock(uuid: str, directory: Path | None = None, *, record: bool = True) -> GpuLock | None:
    """Take the lock of GPU ``uuid`` without blocking; ``None`` when another open file holds it (another process,
    or another lock in this one). The lock lasts until :meth:`LockSet.release` or this process exits. ``record``:
    write this process's PID in the file (for messages).

    After the ``flock`` the path must still name the locked file (a cleaner may remove it between the open and the
    lock); if not, the lock is taken again. Raises :class:`LockDirError` for a file or directory that cannot be used.
    """
    directory = lock_dir() if directory is None else directory
    path = _lock_path(directory, uuid)
    for _ in range(_RETRIES):
        fd = _open_lock_file(path, directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return None
            raise LockDirError(directory, f"cannot lock {path}: {exc.strerror or exc}", path) from None
        if _same_file(fd, path):
            if record:
                _write_info(fd, _describe_self(None))
            return GpuLock(uuid, path, fd)
        os.close(fd)  # removed or replaced between the open and the flock: a lock nobody else would see
    raise LockDirError(directory, f"lock file {path} was removed or replaced {_RETRIES} times while it was being "
                                  "locked: something keeps deleting files in the lock directory", path)


@contextlib.contextmanager
def choosing(directory: Path, wait_s: float | None = None) -> Iterator[bool]:
    """While the block runs, no other select chooses among ``directory``'s GPUs (an ``flock`` on its
    ``.choosing.lock``). Two selects that take their GPUs' locks one by one at the same time can otherwise split the
    free GPUs so that neither gets enough (each wanting 2 of 2: one takes GPU 0, the other GPU 1), and both give up
    though the GPUs were free. Best effort, never a failure: a file that cannot be opened, or a chooser that does not
    finish within ``wait_s`` (default 5 s; 0: one try), stopped or someone holding the file, is gone around; the
    GPUs' own locks are what count. Yields whether the file was locked."""
    try:
        fd: int | None = _open_lock_file(directory / _CHOOSING, directory)
    except LockDirError:
        fd = None
    taken = False
    try:
        if fd is not None:
            end = time.monotonic() + (_CHOOSING_WAIT_S if wait_s is None else wait_s)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    taken = True
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN) or time.monotonic() >= end:
                        break
                time.sleep(0.001)
        yield taken
    finally:
        if fd is not None:
            os.close(fd)


def lock_info(uuid: str, directory: Path | None = None) -> str | None:
    """Who holds GPU ``uuid``'s lock, as its file says (``"holder=123 owner=45 since=..."``), when it is held;
    ``None`` when it is free. Probed by taking and releasing the lock: for that instant another process's
    :func:`try_lock` of the same GPU fails, so a caller that already knows the lock is held (its own
    :func:`try_lock` failed) should not ask this (``select`` reads the file's text only)."""
    directory = lock_dir() if directory is None else directory
    taken = try_lock(uuid, directory, record=False)  # a probe: keep the last holder's text
    if taken is not None:
        os.close(taken.fd)
        return None
    return recorded_holder(uuid, directory)


def recorded_holder(uuid: str, directory: Path) -> str:
    """What GPU ``uuid``'s lock file says of its holder (``"held (no holder recorded)"`` when it says nothing),
    read without touching the lock: for a lock known to be held."""
    text = ""
    with contextlib.suppress(OSError):
        fd = os.open(_lock_path(directory, uuid), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                text = os.read(fd, _INFO_MAX_BYTES).decode("utf-8", "replace").strip()
        finally:
            os.close(fd)
    if not text:
        return "held (no holder recorded)"
    # Anyone who can write the file (another user in a shared directory) decides its text: no control characters.
    return printable(text) + _stopped_hint(text)


def _stopped_hint(text: str) -> str:
    """A holder process that was stopped (SIGSTOP, Ctrl-Z) keeps its locks past its owner's exit, since it cannot
    run to see the owner go: say so, rather than leave a GPU "locked" with no explanation."""
    found = re.search(r"\bholder=(\d{1,10})\b", text)
    if found is None:
        return ""
    from ._proc.procfs import read_stat

    st = read_stat(int(found.group(1)))
    if st is None or st.state not in ("T", "t"):
        return ""
    return (f"; holder process {st.pid} is stopped: it releases the lock only once continued "
            f"(kill -CONT {st.pid}) or ended")


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

    def lost(self) -> tuple[str, ...]:
        """The UUIDs of the locks held here whose file was removed or replaced since (a lock on a file that no
        longer has its name counts for nobody else: another process can lock the new file)."""
        return tuple(lock.uuid for lock in self.locks if lock.fd >= 0 and not _same_file(lock.fd, lock.path))

    def hold_until(self, pid: int | Owner) -> int:
        """Keep the locks after this process exits, until process ``pid`` exits: start a holder process that
        inherits the descriptors and waits for ``pid`` (through a pidfd where the kernel has them, else by polling
        ``/proc/<pid>`` start time every 0.5 s), then release them here. Returns the holder's PID.

        ``pid`` may be an :class:`Owner` pinned earlier (:func:`pin_owner`): the holder then waits for that very
        process, even if it exited meanwhile and its PID now names another one (then this raises).

        The holder checks every second that each lock file is still there and re-creates and locks a removed one
        (a /tmp cleaner). Raises ``ProcessLookupError`` when ``pid`` is not running or has exited (a zombie): the
        locks would end at once; :class:`LockDirError` when a lock file was removed or replaced before the holder
        could keep it (nothing is then locked here or there). The locks are still held here after either. When the
        call does not return (a signal, Ctrl-C), a holder it started is ended: nothing stays locked by it. PID 1
        (init, which never exits) is an ``ArgumentError``, a ``pid`` that is neither an int nor an :class:`Owner` an
        ``ArgumentTypeError``.
        """
        import subprocess

        if not isinstance(pid, Owner) and (isinstance(pid, bool) or not isinstance(pid, int)):
            from .errors import ArgumentTypeError

            raise ArgumentTypeError(f"hold_until takes a PID (int) or an Owner, got {pid!r}")
        if (pid.pid if isinstance(pid, Owner) else pid) == 1:
            raise ArgumentError("hold_until(1): PID 1 (init) never exits, so the locks would be held until reboot")
        fds = [lock.fd for lock in self.locks if lock.fd >= 0]
        if not fds or self.holder_pid is not None:
            raise ArgumentError("no locks held here to hand over")
        held = [lock for lock in self.locks if lock.fd >= 0]
        owner_pid = pid.pid if isinstance(pid, Owner) else pid
        argv = [sys.executable, "-m", "nvmlcheck.locks", "--owner", str(owner_pid), "--fds",
                ",".join(map(str, fds))]
        for lock in held:
            argv += ["--path", str(lock.path)]
        pidfd, how = _owner_for_holder(pid)
        argv += how
        # The holder says it is running, and that each lock file still names its lock, before the locks are called
        # handed over: one that died at start-up (an import error) would release them silently, and "locked" must
        # never be said of a free GPU.
        ready_r, ready_w = os.pipe()
        argv += ["--ready", str(ready_w)]
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            holder = subprocess.Popen(
                argv,
                env=env,
                pass_fds=(*fds, ready_w, *([pidfd] if pidfd is not None else [])),
                stdin=subprocess.DEVNULL,
                # Not the caller's stdout: `$(nvmlcheck select --lock)` waits for every writer of its pipe to close.
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session: a terminal's SIGHUP or a Ctrl-C to the launch script's group does not end it.
                start_new_session=True,
                cwd="/",
            )
        except BaseException:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
            if pidfd is not None:
                os.close(pidfd)
        self._popen = holder  # kept so that a long-lived caller reaps it (subprocess's own cleanup)
        try:
            return self._handed_to(holder, ready_r, held, owner_pid)
        except BaseException:
            # Not handed over (a signal, Ctrl-C, an error): a holder in its own session would otherwise keep the GPUs
            # locked for an owner who was never told. The locks stay held here, as documented.
            self.end_holder()
            del self._popen
            self.holder_pid = self.owner_pid = None
            raise

    def _handed_to(self, holder: Any, ready_r: int, held: Sequence[GpuLock], pid: int) -> int:
        """The rest of :meth:`hold_until` once the holder runs: wait for its word, then let go here."""
        with open(ready_r, "rb") as ready:  # closes ready_r
            said = ready.read(4096)
        if said != b"ready":
            holder.wait()
            if said.startswith(b"lost "):
                gone = [held[int(i)] for i in said[5:].split(b",") if i.isdigit() and int(i) < len(held)]
                names = ", ".join(str(lock.path) for lock in gone)
                raise LockDirError(self.directory, f"lock file {names} was removed or replaced while the locks were "
                                                   "being handed over, and another process holds the new file: "
                                                   "nothing is locked for the owner; select again",
                                   gone[0].path if gone else None)
            raise LockHolderFailed(f"the lock holder process exited at start-up (status {holder.returncode}); "
                               "the locks are still held by this process only")
        # The holder already shares the open files (inherited at fork), so the locks are never free in between.
        for lock in self.locks:
            if lock.fd >= 0:
                _write_info(lock.fd, f"holder={holder.pid} owner={pid} since="
                                     f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
        self.release()
        self.holder_pid, self.owner_pid = holder.pid, pid
        return int(holder.pid)

    def end_holder(self) -> None:
        """End the holder :meth:`hold_until` started, and reap it: its locks are free after. For a caller whose answer
        naming the locked GPUs was never delivered (stdout closed, disk full): nobody would use them. Idempotent."""
        import subprocess

        popen = getattr(self, "_popen", None)
        if popen is None or popen.poll() is not None:
            return
        popen.terminate()  # our own unreaped child: its PID cannot name another process
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()

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
    """Try each GPU's lock; the set of those taken and the UUIDs that were busy. On an error (:class:`LockDirError`)
    the locks taken so far are released before it is raised."""
    taken: list[GpuLock] = []
    busy: list[str] = []
    try:
        for uuid in uuids:
            lock = try_lock(uuid, directory)
            if lock is None:
                busy.append(uuid)
            else:
                taken.append(lock)
    except BaseException:
        LockSet(taken, directory).release()
        raise
    return LockSet(taken, directory), busy


#: The kernel's highest possible PID (``PID_MAX_LIMIT`` on 64-bit Linux): a larger number names no process.
_PID_MAX_LIMIT = 1 << 22


def check_owner(pid: int) -> None:
    """Raise ``ProcessLookupError`` (with a message) unless ``pid`` names a running process: missing, or exited and
    not yet reaped (a zombie, which holds nothing and whose exit has already happened)."""
    pidfd = _owner_pidfd(pid)
    if pidfd is not None:
        os.close(pidfd)
    else:
        _start_time(pid)


class Owner:
    """A process whose exit ends locks, pinned when it was checked (:func:`pin_owner`): through a pidfd where the
    kernel has them, else by its PID and start time, so that its PID, handed to another process after it exited,
    never stands for it. Pass it to :meth:`LockSet.hold_until` (the holder then waits for this very process) and
    to :func:`~nvmlcheck.selection.select_clean` (``owner=``: its exit ends the wait).

    ``pid``: its PID. :meth:`exited` says whether it has exited (gone, or a zombie). :meth:`close` releases the
    pidfd (idempotent; also on leaving a ``with`` block); a closed owner still tells its exit by start time.
    """

    __slots__ = ("_exited", "_fd", "pid", "start_time")

    def __init__(self, pid: int, pidfd: int | None, start_time: int) -> None:
        self.pid = pid
        self._fd = pidfd
        #: The start time in clock ticks (``/proc/<pid>/stat``): with the PID, it names one process.
        self.start_time = start_time
        self._exited = False

    def exited(self) -> bool:
        """Whether the process has exited: gone, or exited and not yet reaped (a zombie). Never reaps it."""
        if self._exited:
            return True
        if self._fd is not None:
            import select

            poller = select.poll()
            poller.register(self._fd, select.POLLIN)
            self._exited = bool(poller.poll(0))  # a pidfd is readable once its process has exited
        else:
            self._exited = not _alive(self.pid, self.start_time)
        return self._exited

    def gone_error(self) -> NoSuchProcess:
        """The error for an owner that has exited: locks held until it exits would end at once."""
        return NoSuchProcess(f"process {self.pid} has exited: locks held until it exits would end now")

    def dup_pidfd(self) -> int | None:
        """A new descriptor of the pidfd (for a holder process to inherit), or ``None`` without one."""
        return None if self._fd is None else os.dup(self._fd)

    def close(self) -> None:
        """Release the pidfd. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Owner:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def __repr__(self) -> str:
        how = "pidfd" if self._fd is not None else f"start time {self.start_time}"
        return f"<nvmlcheck Owner pid={self.pid} ({how}){' exited' if self._exited else ''}>"


def _owner_for_holder(owner: int | Owner) -> tuple[int | None, list[str]]:
    """How the holder is to tell the owner: (a pidfd for it to inherit, or ``None``; its arguments). Raises
    ``ProcessLookupError`` when the owner has exited."""
    if isinstance(owner, Owner):
        if owner.exited():
            raise owner.gone_error()
        pidfd = owner.dup_pidfd()
    else:
        pidfd = _owner_pidfd(owner)
    if pidfd is not None:
        return pidfd, ["--pidfd", str(pidfd)]
    # No pidfd (old kernel): identify the owner by start time.
    start = owner.start_time if isinstance(owner, Owner) else _start_time(owner)
    return None, ["--start-time", str(start)]


def pin_owner(pid: int) -> Owner:
    """Pin the running process ``pid`` as an :class:`Owner` (a pidfd where the kernel has them, else its start
    time). Raises ``ProcessLookupError`` (:class:`~nvmlcheck.NoSuchProcess`, with a message) when it is gone or has
    exited (a zombie), as :func:`check_owner` does."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"an owner is a PID (int), got {pid!r}")
    pidfd = _owner_pidfd(pid)
    if pidfd is None:
        return Owner(pid, None, _start_time(pid))
    try:
        start = _start_time(pid)  # kept for after close(); it exited if this fails (the pidfd would say so too)
    except BaseException:
        os.close(pidfd)
        raise
    return Owner(pid, pidfd, start)


def _owner_pidfd(pid: int) -> int | None:
    """A pidfd of the running process ``pid``; ``None`` where the kernel has no pidfds (then checked through
    ``/proc``). ``ProcessLookupError`` when it is gone or has exited (a zombie's pidfd is readable at once)."""
    if not 0 < pid <= _PID_MAX_LIMIT:  # past the kernel's limit it is no PID (and overflows pidfd_open's int)
        raise NoSuchProcess(_NOT_RUNNING.format(pid=pid))
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        raise NoSuchProcess(_NOT_RUNNING.format(pid=pid)) from None
    except (OSError, AttributeError):
        return None
    import select

    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if poller.poll(0):
        os.close(pidfd)
        raise NoSuchProcess(f"process {pid} has exited (a zombie its parent has not reaped): locks held until "
                                 "it exits would end now")
    return pidfd


def _start_time(pid: int) -> int:
    """The start time of ``pid`` in clock ticks: with the PID, it names one process. ``ProcessLookupError`` when it
    is gone or has exited (a zombie)."""
    from ._proc.procfs import read_stat

    st = read_stat(pid)
    if st is None:
        raise NoSuchProcess(_NOT_RUNNING.format(pid=pid))
    if st.state in ("Z", "X"):
        raise NoSuchProcess(f"process {pid} has exited (a zombie its parent has not reaped): locks held until "
                                 "it exits would end now")
    return st.start_ticks


def _alive(pid: int, start_time: int) -> bool:
    try:
        return _start_time(pid) == start_time
    except (OSError, ValueError, IndexError):
        return False


def _keep(fd: int, path: Path, owner: int) -> bool:
    """In the holder: make sure ``path`` names the file locked as ``fd``. A removed or replaced file is locked anew
    (created if missing) and put in ``fd``'s place; False when another process holds the new file."""
    if _same_file(fd, path):
        return True
    try:
        lock = _relock(path)
    except OSError:
        return False
    if lock is None:
        return False
    os.dup2(lock, fd, inheritable=False)  # the orphaned lock goes with the old descriptor
    os.close(lock)
    _write_info(fd, f"holder={os.getpid()} owner={owner} since="
                    f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
    return True


def _relock(path: Path) -> int | None:
    """Lock the file at ``path`` (creating it); its descriptor, or ``None`` when another process holds it."""
    for _ in range(_RETRIES):
        fd = _open_lock_file(path, path.parent)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        if _same_file(fd, path):
            return fd
        os.close(fd)
    return None


def _hold(argv: Sequence[str]) -> int:
    """The holder process: keep the inherited lock descriptors open until the owner exits, and their files there."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nvmlcheck.locks", description=__doc__.split("\n")[0])
    parser.add_argument("--owner", type=int, required=True)
    parser.add_argument("--fds", required=True)
    parser.add_argument("--path", action="append", default=[])
    parser.add_argument("--pidfd", type=int, default=-1)
    parser.add_argument("--start-time", type=int, default=None)
    parser.add_argument("--ready", type=int, default=-1)
    args = parser.parse_args(argv)
    fds = [int(fd) for fd in args.fds.split(",")]
    for fd in fds:
        os.fstat(fd)  # the locks really were inherited (EBADF otherwise: exit before saying ready)
    held = list(zip(fds, map(Path, args.path), strict=False))
    lost = [str(i) for i, (fd, path) in enumerate(held) if not _keep(fd, path, args.owner)]
    if args.ready >= 0:
        os.write(args.ready, f"lost {','.join(lost)}".encode() if lost else b"ready")
        os.close(args.ready)
    if lost:
        return 1
    if args.pidfd < 0 and args.start_time is None:
        parser.error("--pidfd or --start-time is needed")
    poller = None
    if args.pidfd >= 0:
        import select

        poller = select.poll()
        poller.register(args.pidfd, select.POLLIN)
    while True:
        if poller is not None:
            if poller.poll(round(_RECHECK_S * 1000)):  # readable once the owner has exited
                return 0
        else:
            if not _alive(args.owner, args.start_time):
                return 0
            time.sleep(min(0.5, _RECHECK_S))
        for fd, path in held:
            _keep(fd, path, args.owner)


if __name__ == "__main__":
    sys.exit(_hold(sys.argv[1:]))
