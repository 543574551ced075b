"""The advisory GPU locks (nvmlcheck.locks) on their own: the directory's safety checks, the holder without a pidfd,
and `$(nvmlcheck select --lock)` in a shell, whose command substitution must not wait for the holder.

Nothing here asserts a duration: waits are for events (a process gone), capped only against a hang.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvmlcheck import locks
from nvmlcheck.locks import LockSet, lock_dir, lock_info, take_locks, try_lock
from nvmlcheck.testing import Scenario

from .conftest import gone_within

ROOT = Path(__file__).resolve().parents[2]



def test_default_directory_is_private_and_refused_when_not_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(locks, "_DEFAULT_DIR", str(tmp_path / "locks-{uid}"))
    path = lock_dir({})
    assert path == tmp_path / f"locks-{os.getuid()}" and (path.stat().st_mode & 0o777) == 0o700
    assert lock_dir({}) == path  # an existing directory of ours is fine
    path.rmdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    path.symlink_to(target)  # someone planted a link: never follow it
    with pytest.raises(locks.LockDirError, match="NVMLCHECK_LOCK_DIR"):
        lock_dir({})
    assert lock_dir({"NVMLCHECK_LOCK_DIR": str(tmp_path / "mine" / "sub")}) == tmp_path / "mine" / "sub"


def test_a_lock_excludes_other_open_files_and_ends_with_release(tmp_path: Path) -> None:
    held, busy = take_locks(["GPU-a", "GPU-b"], tmp_path)
    assert busy == [] and held.uuids == ("GPU-a", "GPU-b") and held.held_here
    assert try_lock("GPU-a", tmp_path) is None
    assert f"holder={os.getpid()}" in (lock_info("GPU-a", tmp_path) or "")
    again, busy = take_locks(["GPU-a", "GPU-c"], tmp_path)
    assert busy == ["GPU-a"] and again.uuids == ("GPU-c",)
    with held:
        pass  # leaving the block releases
    assert lock_info("GPU-a", tmp_path) is None and not held.held_here
    again.release()
    again.release()  # idempotent


def test_holder_without_pidfd_watches_the_owner_by_start_time(
    tmp_path: Path, owner: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    held, _ = take_locks(["GPU-x"], tmp_path)
    holder = held.hold_until(owner.pid)
    assert held.holder_pid == holder and held.owner_pid == owner.pid and not held.held_here
    # This process let go of its descriptors; the holder keeps the lock.
    assert try_lock("GPU-x", tmp_path) is None
    assert f"holder={holder} owner={owner.pid}" in (lock_info("GPU-x", tmp_path) or "")
    owner.kill()
    owner.wait()
    assert gone_within(holder), "the holder did not notice its owner's exit"
    taken = try_lock("GPU-x", tmp_path)
    assert taken is not None
    os.close(taken.fd)


def test_hold_until_a_dead_process_is_refused_and_keeps_the_locks_here(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    dead.wait()
    held, _ = take_locks(["GPU-y"], tmp_path)
    with pytest.raises(ProcessLookupError, match="not running"):
        held.hold_until(dead.pid)
    assert held.held_here and try_lock("GPU-y", tmp_path) is None
    held.release()
    with pytest.raises(ValueError, match="no locks held"):
        LockSet([], tmp_path).hold_until(os.getpid())


@pytest.mark.stub
def test_command_substitution_returns_and_the_lock_lasts_as_long_as_the_execd_server(tmp_path: Path) -> None:
    # `$(...)` waits until every writer of its pipe has closed it: a holder that kept stdout would hang the script
    # forever (its owner is that very shell). The owner by default is the shell that ran nvmlcheck.
    scenario = Scenario.h200(devices=2).write(tmp_path / "sc.txt")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["NVMLCHECK_LOCK_DIR"] = str(tmp_path / "locks")
    script = (
        f'GPUS=$("{sys.executable}" -m nvmlcheck --simulate "{scenario}" select --count 1 --lock --format uuid) '
        '|| exit 9\n'
        'echo "$GPUS $$"\n'
        # The launch script becomes its server (same PID): the lock lasts as long as the server runs.
        f'exec "{sys.executable}" -S -c "import sys; sys.stdin.readline()"\n'
    )
    shell = subprocess.Popen(["bash", "-c", script], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert shell.stdout is not None and shell.stdin is not None
    line = shell.stdout.readline()  # a hang here is the bug this test is about
    uuid, shell_pid = line.split()
    assert uuid == "GPU-00000000-0000-0000-0000-000000000000" and int(shell_pid) == shell.pid
    info = lock_info(uuid, tmp_path / "locks")
    assert info is not None and f"owner={shell.pid}" in info
    holder = int(info.split()[0].removeprefix("holder="))
    # The shell has exec'd the "server" by the time it reads its stdin; the lock is still held meanwhile.
    end = time.monotonic() + 30
    while b"\0-S\0-c\0" not in Path(f"/proc/{shell.pid}/cmdline").read_bytes() and time.monotonic() < end:
        time.sleep(0.01)
    assert b"\0-S\0-c\0" in Path(f"/proc/{shell.pid}/cmdline").read_bytes(), "the shell never exec'd the server"
    assert try_lock(uuid, tmp_path / "locks") is None
    shell.communicate("done\n", timeout=60)
    assert gone_within(holder)
    assert lock_info(uuid, tmp_path / "locks") is None


def test_a_select_reads_a_held_locks_holder_without_probing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # lock_info probes by taking the lock: for that instant a racing select's try_lock fails and it passes over a
    # free GPU. A select whose own try_lock failed knows the lock is held: it reads the file's text only.
    from nvmlcheck import selection
    from nvmlcheck.model import DeviceState

    held, _ = take_locks(["GPU-a"], tmp_path)
    attempts: list[str] = []
    real = locks.try_lock

    def counted(uuid: str, directory: Path | None = None, *, record: bool = True) -> locks.GpuLock | None:
        attempts.append(uuid)
        return real(uuid, directory, record=record)

    monkeypatch.setattr(locks, "try_lock", counted)
    gpus = [DeviceState.__new__(DeviceState) for _ in range(2)]
    for i, (d, uuid) in enumerate(zip(gpus, ["GPU-a", "GPU-b"], strict=True)):
        object.__setattr__(d, "index", i)
        object.__setattr__(d, "uuid", uuid)
    try:
        chosen, taken, busy = selection._choose(gpus, 1, tmp_path)
        assert attempts == ["GPU-a", "GPU-b"]  # one attempt each: no probe of the held one
        assert chosen is not None and [d.uuid for d in chosen] == ["GPU-b"]
        assert len(busy) == 1 and busy[0].startswith(f"GPU 0: locked by another process (holder={os.getpid()} ")
        assert taken is not None
        taken.release()
    finally:
        held.release()


def test_a_stopped_holder_is_named_as_such(tmp_path: Path) -> None:
    # A SIGSTOPped holder cannot see its owner exit and keeps the lock: the message says so and how to end it.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / "GPU-s.lock").write_text(f"holder={child.pid} owner=1 since=2026-01-01T00:00:00Z\n")
        held = os.open(tmp_path / "GPU-s.lock", os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            assert "stopped" not in locks.recorded_holder("GPU-s", tmp_path)
            os.kill(child.pid, 19)  # SIGSTOP
            for _ in range(1000):  # the state changes once the kernel has stopped it
                if "stopped" in locks.recorded_holder("GPU-s", tmp_path):
                    break
                time.sleep(0.01)
            assert f"kill -CONT {child.pid}" in locks.recorded_holder("GPU-s", tmp_path)
            assert f"kill -CONT {child.pid}" in (lock_info("GPU-s", tmp_path) or "")
        finally:
            os.close(held)
    finally:
        os.kill(child.pid, 9)
        child.wait()
