"""Lock files that are removed, planted or refused (issue 27, item 5) and owners that cannot end the locks (item 10).

A lock counts only while its path names the locked file: checked after every ``flock``, and kept by the holder
process, which re-creates a removed file. Lock-directory problems end as exit 3 with an ``nvmlcheck/error`` document
naming the directory, never a traceback or "not enough GPUs". Waits are for events, capped only against a hang.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck import cli, locks
from nvmlcheck.locks import LockDirError, lock_dir, lock_info, take_locks, try_lock
from nvmlcheck.testing import Scenario, StubProbe, build_stub

from .conftest import gone_within

pytestmark = pytest.mark.stub
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files owned by another user")


@pytest.fixture(autouse=True)
def _nvml_closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield
    assert StubProbe(build_stub()).init_refcount() == 0, "this test left NVML initialised"


def _select(capsys: pytest.CaptureFixture[str], tmp_path: Path, *extra: str) -> tuple[int, str, str]:
    scenario = Scenario.h200(devices=2).write(tmp_path / "sc.txt")
    code = cli.main(["--simulate", str(scenario), "select", "--count", "1", "--lock", *extra])
    out, err = capsys.readouterr()
    return code, out, err


# These runs fail on the lock directory before any lock is held: the owner named is this process, so the test does
# not depend on who started the suite (a parent that has exited makes the default owner init, which is refused).
_OWNER = ("--lock-pid", str(os.getpid()))


def _error(out: str) -> dict[str, object]:
    doc = json.loads(out)
    assert doc["schema"] == "nvmlcheck/error", doc
    error = doc["error"]
    assert isinstance(error, dict)
    return error


# --- a removed lock file ---------------------------------------------------------------------------------------------


def test_a_file_removed_between_open_and_flock_is_locked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / f"{UUID0}.lock"
    real_flock = fcntl.flock
    removed: list[int] = []

    def cleaner_in_between(fd: int, operation: int) -> None:
        if not removed:  # a /tmp cleaner removes the file after our open, before our flock
            removed.append(fd)
            path.unlink()
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", cleaner_in_between)
    lock = try_lock(UUID0, tmp_path)
    monkeypatch.undo()
    assert removed and lock is not None
    # The lock is on the file the path names now, so every other process sees it.
    assert os.fstat(lock.fd).st_ino == path.stat().st_ino
    assert try_lock(UUID0, tmp_path) is None
    os.close(lock.fd)


def test_the_holder_recreates_a_removed_lock_file(tmp_path: Path, owner: subprocess.Popen[bytes]) -> None:
    held, _ = take_locks([UUID0], tmp_path)
    holder = held.hold_until(owner.pid)
    path = tmp_path / f"{UUID0}.lock"
    path.unlink()  # a cleaner; without the holder's check the next select would get the GPU a second time
    end = time.monotonic() + 30
    info = None
    # The holder locks the new file, then writes who holds it: "held (no holder recorded)" may be read in between.
    while (info is None or f"holder={holder}" not in info) and time.monotonic() < end:
        info = lock_info(UUID0, tmp_path)
        time.sleep(0.05)
    assert info is not None and f"holder={holder}" in info, "the holder never locked the re-created file"
    assert try_lock(UUID0, tmp_path) is None
    owner.kill()
    owner.wait()
    assert gone_within(holder)
    assert lock_info(UUID0, tmp_path) is None


def test_lost_reports_a_removed_file(tmp_path: Path) -> None:
    held, _ = take_locks([UUID0, "GPU-b"], tmp_path)
    assert held.lost() == ()
    (tmp_path / "GPU-b.lock").unlink()
    assert held.lost() == ("GPU-b",)
    held.release()


# --- lock-directory problems: an error naming the directory, exit 3 -------------------------------------------------


def test_a_planted_symlink_is_refused_and_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (shared / f"{UUID0}.lock").symlink_to(victim)
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(shared))
    code, out, err = _select(capsys, tmp_path, "--json", *_OWNER)
    assert code == 3, (out, err)
    error = _error(out)
    assert error["type"] == "LockDirError" and error["directory"] == str(shared)
    assert error["path"] == str(shared / f"{UUID0}.lock") and "symbolic link" in str(error["message"])
    assert victim.read_text() == "precious\n"
    code, out, err = _select(capsys, tmp_path, *_OWNER)
    assert code == 3 and "symbolic link" in err and str(shared) in err and "Traceback" not in err


def test_a_planted_fifo_does_not_hang_and_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / f"{UUID0}.lock")
    with pytest.raises(LockDirError, match="a FIFO"):
        try_lock(UUID0, tmp_path)


def test_a_directory_that_is_a_file_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(tmp_path / "file"))
    code, out, _ = _select(capsys, tmp_path, "--json", *_OWNER)
    assert code == 3
    error = _error(out)
    assert error["directory"] == str(tmp_path / "file") and "not a directory" in str(error["message"])


@as_root
def test_a_squatted_default_directory_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NVMLCHECK_LOCK_DIR", raising=False)
    monkeypatch.setattr(locks, "_DEFAULT_DIR", str(tmp_path / "locks-{uid}"))
    squatted = tmp_path / f"locks-{os.getuid()}"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, NOBODY, NOBODY)
    with pytest.raises(LockDirError, match="owned by uid 65534"):
        lock_dir({})
    code, out, err = _select(capsys, tmp_path, "--json", *_OWNER)
    assert code == 3, (out, err)
    error = _error(out)
    assert error["type"] == "LockDirError" and error["directory"] == str(squatted)
    assert "NVMLCHECK_LOCK_DIR" in str(error["message"])


def _as_nobody() -> None:
    os.setgid(NOBODY)
    os.setuid(NOBODY)


@pytest.fixture
def world_tmp() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path sits under a 0700 directory of this user)."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="nvmlcheck-locktest-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _python_for_nobody() -> str:
    """An interpreter another user may run (this venv's may point into root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            probe = subprocess.run([candidate, "-S", "-c", "import sys; assert sys.version_info >= (3, 10)"],
                                   capture_output=True, preexec_fn=_as_nobody, check=False)
        except OSError:  # cannot even be executed by that user
            continue
        if probe.returncode == 0:
            return candidate
    pytest.skip(f"no Python interpreter uid {NOBODY} may run")


@as_root
def test_a_configured_shared_directory_is_created_usable_by_every_user(world_tmp: Path) -> None:
    shared = world_tmp / "a" / "locks"
    assert lock_dir({"NVMLCHECK_LOCK_DIR": str(shared)}) == shared
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    held = try_lock(UUID0, shared)  # this user's GPU file
    assert held is not None
    # Another user adds another GPU's file, and locks (read-only) the one this user made.
    code = ("import fcntl, os, sys; d = sys.argv[1]; "
            "fd = os.open(os.path.join(d, 'GPU-other.lock'), os.O_CREAT | os.O_RDWR, 0o644); "
            "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)")
    subprocess.run([_python_for_nobody(), "-S", "-c", code, str(shared)], check=True, preexec_fn=_as_nobody)
    assert (shared / "GPU-other.lock").stat().st_uid == NOBODY
    os.close(held.fd)


@as_root
def test_a_directory_another_user_cannot_write_says_how_to_share_it(world_tmp: Path) -> None:
    shared = world_tmp / "locks"
    shared.mkdir(mode=0o755)  # made by hand without the sticky, world-writable mode
    env = dict(os.environ, NVMLCHECK_LOCK_DIR=str(shared),
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    code = ("import sys\nfrom nvmlcheck.locks import LockDirError, try_lock, lock_dir\n"
            "try:\n    try_lock('GPU-x', lock_dir())\nexcept LockDirError as e:\n"
            "    print(e.directory); print(e); sys.exit(3)\n")
    proc = subprocess.run([_python_for_nobody(), "-c", code], env=env, capture_output=True, text=True,
                          preexec_fn=_as_nobody, check=False)
    if "ModuleNotFoundError" in proc.stderr or "Permission denied" in proc.stderr:
        pytest.skip(f"the checkout is not readable by uid {NOBODY}: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 3, proc.stderr
    directory, message = proc.stdout.splitlines()[:2]
    assert directory == str(shared) and f"chmod 1777 {shared}" in message and "mode 0755" in message


def test_a_world_writable_directory_without_sticky_bit_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(LockDirError, match="chmod 1777"):
        lock_dir({"NVMLCHECK_LOCK_DIR": str(open_dir)})


# --- owners that cannot end the locks --------------------------------------------------------------------------------


def test_a_zombie_lock_pid_is_refused_before_anything_is_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(tmp_path / "locks"))
    zombie = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    try:
        end = time.monotonic() + 30
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < end, "the child never became a zombie"
            time.sleep(0.01)
        code, out, err = _select(capsys, tmp_path, "--lock-pid", str(zombie.pid))
        assert code == 2 and out == "" and "zombie" in err, (out, err)
        assert not (tmp_path / "locks").exists()  # refused before any lock was taken
    finally:
        zombie.wait()


@pytest.mark.parametrize(("pid", "why"), [("1", "never exits (init)"), ("0", "is not a process ID"),
                                         ("-3", "is not a process ID")])
def test_a_lock_pid_that_cannot_end_the_locks_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pid: str, why: str
) -> None:
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(tmp_path / "locks"))
    code, out, err = _select(capsys, tmp_path, "--lock-pid", pid)
    assert code == 2 and out == "" and f"--lock-pid {pid}" in err and why in err, err  # -3 was called init
    assert not (tmp_path / "locks").exists()


def test_select_takes_timeout_as_the_other_commands_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(Scenario.h200().write(tmp_path / "sc.txt"))
    assert cli.main(["--simulate", scenario, "select", "--count", "1", "--timeout", "0.5"]) == 0
    assert capsys.readouterr().out.strip() == "0"
    assert cli.main(["--simulate", scenario, "select", "--count", "1", "--wait", "1", "--timeout", "2"]) == 2
    assert "given twice" in capsys.readouterr().err  # one option under two names


def test_select_takes_how_many_gpus_as_a_word_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(Scenario.h200(devices=2).write(tmp_path / "sc.txt"))
    for argv in (["select", "2"], ["select", "--count", "2"], ["select", "2", "--count", "2"]):
        assert cli.main(["--simulate", scenario, *argv]) == 0, argv
        assert capsys.readouterr().out.strip() == "0,1"
    for argv, text in ((["select"], "needs how many GPUs"), (["select", "1", "--count", "2"], "disagree"),
                       (["select", "0"], "at least 1")):
        assert cli.main(["--simulate", scenario, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert text in err and "simulated GPUs" not in err, err  # refused before the simulation starts


def test_hold_until_refuses_init_and_what_is_no_pid(tmp_path: Path) -> None:
    # hold_until(1) (or True, which is 1) started a holder waiting for init: the locks were held until reboot.
    held, _ = take_locks([UUID0], tmp_path)
    try:
        with pytest.raises(ValueError, match="PID 1"):
            held.hold_until(1)
        for bad in (True, "123", 1.0):
            with pytest.raises(TypeError, match="PID"):
                held.hold_until(bad)  # type: ignore[arg-type]
        assert held.held_here and held.holder_pid is None  # nothing was handed over
    finally:
        held.release()


def test_hold_until_a_zombie_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zombie = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    try:
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            time.sleep(0.01)
        held, _ = take_locks([UUID0], tmp_path)
        with pytest.raises(ProcessLookupError, match="zombie"):
            held.hold_until(zombie.pid)

        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)  # an old kernel: the /proc state says it
        with pytest.raises(ProcessLookupError, match="zombie"):
            held.hold_until(zombie.pid)
        assert held.held_here
        held.release()
    finally:
        zombie.wait()


def test_a_parent_outside_the_pid_namespace_gets_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    owner: subprocess.Popen[bytes],
) -> None:
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(os, "getppid", lambda: 0)  # what nsenter / docker exec give
    code, out, err = _select(capsys, tmp_path)
    assert code == 2 and out == ""
    assert "--lock-pid 0" not in err and "outside this PID namespace" in err and "--lock-pid PID" in err
    code, out, err = _select(capsys, tmp_path, "--lock-pid", str(owner.pid))
    assert code == 0, err  # naming the owner works there
    info = lock_info(UUID0, tmp_path / "locks")
    assert info is not None
    owner.kill()
    owner.wait()
    assert gone_within(int(info.split()[0].removeprefix("holder=")))


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/unshare").exists(), reason="needs root and unshare")
def test_select_in_a_pid_namespace_whose_parent_is_outside(tmp_path: Path) -> None:
    scenario = Scenario.h200(devices=1).write(tmp_path / "sc.txt")
    env = dict(os.environ, NVMLCHECK_LOCK_DIR=str(tmp_path / "locks"),
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "nvmlcheck",
                           "--simulate", str(scenario), "select", "--count", "1", "--lock"],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    if "unshare failed" in proc.stderr or "Operation not permitted" in proc.stderr:
        pytest.skip(f"no PID namespaces here: {proc.stderr.strip()}")
    assert proc.returncode == 2, proc.stderr
    assert "outside this PID namespace" in proc.stderr and "--lock-pid 0" not in proc.stderr


@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_a_lock_file_that_cannot_be_opened_as_one_says_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    # A directory (EISDIR) or a socket (ENXIO) where a GPU's lock file should be was refused with the bare errno
    # ("Is a directory"), unlike a FIFO or a symbolic link: not what it is, nor what to do.
    import socket

    locks_dir = tmp_path / "locks"
    locks_dir.mkdir()
    path = locks_dir / f"{UUID0}.lock"
    listener = None
    if kind == "directory":
        path.mkdir()
    else:
        listener = socket.socket(socket.AF_UNIX)
        here = os.getcwd()
        os.chdir(locks_dir)  # a relative name: tmp_path is too long for a socket's address
        try:
            listener.bind(path.name)
        finally:
            os.chdir(here)
    try:
        with pytest.raises(LockDirError, match=f"is a {kind} owned by .*not a regular file.*remove it"):
            try_lock(UUID0, locks_dir)
        monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(locks_dir))
        code, out, _ = _select(capsys, tmp_path, "--json", *_OWNER)
        error = _error(out)
        assert code == 3 and error["type"] == "LockDirError" and error["path"] == str(path)
        assert f"is a {kind}" in str(error["message"])
    finally:
        if listener is not None:
            listener.close()
