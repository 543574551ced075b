"""A guarded child (``Child(..., guard=...)``) runs its command only once the guard knows its PID, whether its stdin is
``/dev/null`` (scontrol) or a pipe held open (a fleet's ssh): an owner that dies, or is interrupted, between the start
and the guard's note leaves no command running that nothing would end. Mechanism only: the time bounds below are hang
guards, never measurements."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_child import HANG_GUARD_S, dead
from test_child import guard as guard_deadline  # the hang guard: a deadline only a hung mechanism reaches

from nvmlcheck._proc.child import Child
from nvmlcheck._proc.guard import Guard


def ended(pid: int) -> bool:
    deadline = time.monotonic() + HANG_GUARD_S
    while not dead(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def hung_ssh(tmp_path: Path) -> Path:
    """A stand-in for an ssh stuck connecting: it notes that it ran, then neither reads its stdin nor ends."""
    path = tmp_path / "hung-ssh"
    path.write_text(f"#!/bin/sh\necho ran > {tmp_path / 'ran'}\nexec sleep 1000\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_the_held_bytes_reach_the_command_after_the_go_ahead() -> None:
    guard = Guard()
    try:
        child = Child(["head", "-c", "6"], hold_stdin=b"hello\n", guard=guard)
        assert child.wait(guard_deadline()) is True
        assert (child.returncode, bytes(child.stdout)) == (0, b"hello\n"), child.stderr
    finally:
        guard.dismiss()


@pytest.mark.parametrize("held", [b"hello\n", None], ids=["held-stdin", "dev-null"])
def test_an_owner_killed_before_the_guard_knows_its_child_leaves_no_command_running(held: bytes | None,
                                                                                    tmp_path: Path) -> None:
    # The owner is SIGKILLed inside Guard.watch: the child has started, the guard has not been told of it. The ssh of
    # a fleet (held stdin) once ran at once, and was then left running, unknown to the guard.
    owner = textwrap.dedent(f"""
        import os, signal, sys
        from nvmlcheck._proc.child import Child
        from nvmlcheck._proc.guard import Guard

        class Dying(Guard):
            def watch(self, pid):
                with open({str(tmp_path / 'pid')!r}, "w") as f:
                    f.write(str(pid))
                os.kill(os.getpid(), signal.SIGKILL)

        Child([{str(hung_ssh(tmp_path))!r}], hold_stdin={held!r}, guard=Dying())
    """)
    proc = subprocess.run([sys.executable, "-c", owner], capture_output=True, timeout=HANG_GUARD_S, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int((tmp_path / "pid").read_text())
    try:
        assert ended(pid), "the child went on running after its owner died unknown to the guard"
        assert not (tmp_path / "ran").exists(), "the command ran before the guard knew it"
    finally:
        if not dead(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


@pytest.mark.parametrize("held", [b"hello\n", None], ids=["held-stdin", "dev-null"])
def test_an_interruption_while_the_guard_is_told_leaves_no_child_and_no_descriptor(held: bytes | None,
                                                                                   tmp_path: Path) -> None:
    started: list[int] = []

    class Interrupted(Guard):
        def watch(self, pid: int) -> None:
            started.append(pid)
            raise KeyboardInterrupt

    guard = Interrupted()
    guard.start()
    before = open_fds()
    try:
        with pytest.raises(KeyboardInterrupt):
            Child([str(hung_ssh(tmp_path))], hold_stdin=held, guard=guard)
        assert open_fds() == before, "descriptors of the interrupted start were left open"
        assert len(started) == 1
        with pytest.raises(ChildProcessError):  # reaped: not a child of this process any more
            os.waitpid(started[0], os.WNOHANG)
        assert not (tmp_path / "ran").exists(), "the command ran before the guard knew it"
    finally:
        for pid in started:
            if not dead(pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
        guard.dismiss()


def test_an_nvidia_smi_run_of_a_fleet_is_guarded(tmp_path: Path) -> None:
    # The fleet's fallback for a host without nvmlcheck runs nvidia-smi over ssh through the smi backend's runner,
    # which started its children unguarded: a SIGKILLed fleet left those ssh clients running. Given the guard, a run
    # is told to it while it runs and forgotten once reaped.
    from nvmlcheck.backends.smi import SmiRunner

    told: list[tuple[str, int]] = []

    class Noting(Guard):
        def watch(self, pid: int) -> None:
            told.append(("watch", pid))
            super().watch(pid)

        def forget(self, pid: int) -> None:
            told.append(("forget", pid))
            super().forget(pid)

    guard = Noting()
    try:
        runner = SmiRunner(command=[sys.executable, "-c", "print('smi')"], guard=guard)
        result = runner.run(["--version"])
        assert result.returncode == 0 and result.stdout.strip() == "smi", result
        pids = {pid for _, pid in told}
        assert len(pids) == 1 and [what for what, _ in told] == ["watch", "forget"]
    finally:
        guard.dismiss()
