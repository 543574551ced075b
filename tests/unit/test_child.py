"""The one way nvmlcheck runs a child with a deadline (``nvmlcheck._proc.child.Child``), with small shell and Python
children: the group kill reaches grandchildren, a pipe held open by a process outside the group never hangs the
read, the stop callable and the environment are honoured, and no zombie is left. Mechanism only: the time bounds
below are hang guards, never measurements."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvmlcheck._proc import child as child_module
from nvmlcheck._proc.child import Child

HANG_GUARD_S = 20.0


def guard() -> int:
    """A deadline far enough away that reaching it means the mechanism hung."""
    return time.monotonic_ns() + int(HANG_GUARD_S * 1e9)


def soon(seconds: float) -> int:
    return time.monotonic_ns() + int(seconds * 1e9)


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its new parent to reap it: either way it runs no more."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[-1].split()[0] == "Z"


def eventually(check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + HANG_GUARD_S
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def not_our_child(pid: int) -> bool:
    """Reaped: waitpid no longer knows it (a zombie of ours would still be waitable)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def first_line(child: Child) -> str:
    """Read until the child printed one line (it keeps running)."""
    hang = guard()
    while b"\n" not in child.stdout:
        assert child.returncode is None, "the child ended before printing"
        assert time.monotonic_ns() < hang, "no line within the hang guard"
        child.wait(soon(0.05))
    return child.stdout.split(b"\n", 1)[0].decode()


def start(argv: list[str], *, env: dict[str, str] | None = None, after_exit_s: float | None = None) -> Child:
    return Child(argv, env=env, after_exit_s=after_exit_s)


@pytest.fixture(params=["pidfd", "no-pidfd"])
def pidfd_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every mechanism with a pidfd and without one (Linux < 5.3: the exit is polled with waitid(WNOWAIT))."""
    if request.param == "no-pidfd":

        def no_pidfd(pid: int, flags: int = 0) -> int:
            raise OSError(38, "Function not implemented")

        monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    else:
        fd = child_module._pidfd(os.getpid())
        if fd is None:
            pytest.skip("no pidfd on this kernel")
        os.close(fd)
    yield request.param


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids a test started outside the group; killed at the end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_finished_child_is_read_fully_and_reaped(pidfd_mode: str) -> None:
    # More than a pipe holds on both pipes: both must be pumped while it runs, or it blocks on a full pipe.
    code = "import sys; sys.stdout.write('o' * 300_000); sys.stderr.write('e' * 300_000); sys.exit(3)"
    child = start([sys.executable, "-S", "-c", code])
    assert child.wait(guard()) is True
    assert child.returncode == 3
    assert bytes(child.stdout) == b"o" * 300_000 and bytes(child.stderr) == b"e" * 300_000
    assert not_our_child(child.proc.pid)


def test_argv_env_stdin_and_session() -> None:
    code = (
        "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('NVMLCHECK_T'),"
        " os.readlink('/proc/self/fd/0'), os.getsid(0) == os.getpid() == os.getpgid(0)]))"
    )
    child = start([sys.executable, "-S", "-c", code, "a b", "$HOME", ";"], env={"NVMLCHECK_T": "given"})
    assert child.wait(guard()) is True and child.returncode == 0, child.stderr
    # argv arrives untouched (no shell), the environment is the one given, stdin is /dev/null, and the child leads
    # its own session and process group.
    assert json.loads(child.stdout) == [["a b", "$HOME", ";"], "given", "/dev/null", True]


def test_a_program_that_cannot_start_raises_oserror() -> None:
    with pytest.raises(OSError):
        Child(["/no/such/program/here"])


def test_deadline_then_kill_ends_the_group_with_a_grandchild(pidfd_mode: str) -> None:
    child = start(["/bin/sh", "-c", "sleep 60 & echo $!; exec sleep 60"])
    grandchild = int(first_line(child))
    assert child.wait(soon(0.05)) is False  # the deadline came: nothing is killed by wait itself
    assert child.returncode is None and not dead(grandchild)
    assert child.kill() is True
    assert child.returncode == -signal.SIGKILL
    assert not_our_child(child.proc.pid)
    assert eventually(lambda: dead(grandchild)), "the grandchild in the group survived the kill"


def test_group_stays_signalable_until_the_output_ends(pidfd_mode: str) -> None:
    # The leader exits at once; a grandchild in its group holds the pipes. Read-to-end mode keeps the leader
    # unreaped (a zombie), so its pid is still the group's id and the kill reaches the grandchild.
    child = start(["/bin/sh", "-c", "sleep 60 & echo $!"])
    grandchild = int(first_line(child))
    assert child.wait(soon(0.2)) is False
    assert child.returncode is None  # exited, not reaped: the group id cannot be reused
    assert child.kill() is True and child.returncode == 0
    assert eventually(lambda: dead(grandchild))
    assert not_our_child(child.proc.pid)


@pytest.mark.parametrize("holds_pipes", [False, True], ids=["output-elsewhere", "holding-the-pipes"])
def test_what_the_leader_left_in_its_group_ends_at_its_reaping(pidfd_mode: str, holds_pipes: bool,
                                                               leftovers: list[int]) -> None:
    # The leader exits 0 at once and leaves a process in its group, writing elsewhere (nothing holds the pipes) or
    # holding them (the read ends at the grace). Unreaped, the leader's pid is still the group's id: the group is
    # SIGKILLed then, as at a deadline, so nothing of the run outlives it.
    out = "" if holds_pipes else " >/dev/null 2>&1"
    child = start(["/bin/sh", "-c", f"sleep 60{out} & echo $!"], after_exit_s=0.1)
    leftovers.append(int(first_line(child)))
    assert child.wait(guard()) is True and child.returncode == 0
    assert not_our_child(child.proc.pid)
    assert eventually(lambda: dead(leftovers[0])), "what the leader left in its group outlived the run"


def test_a_pipe_held_outside_the_group_ends_the_read_after_the_grace(pidfd_mode: str, leftovers: list[int]) -> None:
    # Like an ssh ControlMaster: a process in another session keeps copies of the pipes after the leader exits.
    child = start(["/bin/sh", "-c", "setsid sleep 60 & echo $!; echo done >&2"], after_exit_s=0.1)
    leftovers.append(int(first_line(child)))
    assert child.wait(guard()) is True  # ended by the grace after the exit, not by the hang guard
    assert child.returncode == 0 and child.stderr == b"done\n"
    assert not_our_child(child.proc.pid)
    assert not dead(leftovers[0])  # outside the group: not ours to kill


def test_kill_does_not_hang_on_a_pipe_held_outside_the_group(pidfd_mode: str, leftovers: list[int]) -> None:
    child = start(["/bin/sh", "-c", "setsid sleep 60 & echo $!; exec sleep 60"])  # read-to-end mode
    leftovers.append(int(first_line(child)))
    assert child.kill(grace_s=0.2) is True  # the leader is reaped; the pipes are given up after the grace
    assert child.returncode == -signal.SIGKILL
    assert not_our_child(child.proc.pid)


def test_kill_can_stop_reading_at_the_exit(pidfd_mode: str, leftovers: list[int]) -> None:
    child = start(["/bin/sh", "-c", "setsid sleep 60 & echo $!; exec sleep 60"], after_exit_s=HANG_GUARD_S)
    leftovers.append(int(first_line(child)))
    assert child.kill(grace_s=HANG_GUARD_S, read_after_exit=False) is True  # not held by the 20 s grace
    assert not_our_child(child.proc.pid)


def test_should_stop_is_asked_every_slice_and_ends_the_wait(pidfd_mode: str) -> None:
    child = start(["/bin/sh", "-c", "exec sleep 60"])
    calls: list[int] = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) >= 3

    assert child.wait(None, should_stop=should_stop, slice_s=0.01) is False  # no deadline: only the callable ends it
    assert len(calls) == 3 and child.returncode is None
    assert child.kill() is True and not_our_child(child.proc.pid)


def test_signal_group_from_another_thread_ends_a_wait(pidfd_mode: str) -> None:
    child = start(["/bin/sh", "-c", "sleep 60 & exec sleep 60"])
    killer = threading.Thread(target=child.signal_group)
    killer.start()
    try:
        assert child.wait(guard()) is True  # every holder of the pipes was in the group
    finally:
        killer.join()
    assert child.returncode == -signal.SIGKILL and not_our_child(child.proc.pid)


def test_no_signal_once_reaped() -> None:
    child = start(["/bin/true"])
    assert child.wait(guard()) is True
    assert child.signal_group() is False  # its pid may belong to another process by now
    assert child.kill() is True  # nothing to do, and no error


def test_wait_can_be_called_again_after_the_deadline(pidfd_mode: str) -> None:
    child = start([sys.executable, "-S", "-c", "import time; time.sleep(0.3); print('late')"])
    assert child.wait(soon(0.0)) is False
    assert child.wait(guard()) is True and child.stdout == b"late\n"


def test_ctrl_c_while_a_wait_registers_leaves_no_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    # tests/reliability/test_lifecycle.py once found one descriptor left after Ctrl-C during an nvidia-smi run: the
    # exit's pidfd was opened before the selector registrations and closed only by a `finally` entered after them.
    import selectors

    child = Child([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        real = selectors.DefaultSelector.register
        seen: list[int] = []

        def register(self: selectors.BaseSelector, fd: int, events: int, data: object = None) -> object:
            seen.append(fd)
            if len(seen) == 3:  # the pidfd, after the two pipes
                raise KeyboardInterrupt
            return real(self, fd, events, data)  # type: ignore[arg-type]

        monkeypatch.setattr(selectors.DefaultSelector, "register", register)
        with pytest.raises(KeyboardInterrupt):
            child.wait(None)
        monkeypatch.undo()
        assert len(seen) == 3 and sorted(os.listdir("/proc/self/fd")) == before
    finally:
        child.kill()


def test_an_interrupt_as_a_pipe_closes_leaves_the_kill_working() -> None:
    # A signal handler (Ctrl-C, SIGHUP) raising just as a finished pipe was closed left it listed: the kill's wait
    # then found its descriptor number reused by its own pidfd ("FD 6 is already registered") and the command ended
    # in a traceback instead of its exit code.
    c = Child([sys.executable, "-c", "import os, sys, time; os.close(1); time.sleep(30)"])

    class Interrupted(Exception):
        pass

    stdout = c.proc.stdout
    assert stdout is not None
    real_close = stdout.close

    def close_then_raise() -> None:
        real_close()
        raise Interrupted

    stdout.close = close_then_raise  # type: ignore[method-assign]
    with pytest.raises(Interrupted):
        c.wait(guard())  # stdout ends at once (the child closed it), and the "signal" comes as it is closed
    assert c.kill() is True  # no KeyError: nothing closed is listed
