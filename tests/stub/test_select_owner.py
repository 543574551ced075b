"""``select --lock``: an owner that exits during the wait or before the hand-over, and answers that are never
delivered (a signal or Ctrl-C while writing, or while the holder starts), leave nothing locked.

No durations are asserted: the owner is ended at a counted poll (a wrapper around ``selection._judge``), and a poll
count past which the wait should have ended stops the run with an assertion instead of hanging.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli, locks, selection
from nvmlcheck.errors import NoSuchProcess
from nvmlcheck.locks import take_locks, try_lock
from nvmlcheck.testing import Scenario, use_stub

from .test_select import clean_env  # noqa: F401 - the same autouse environment (CUDA variables, lock dir, NVML shut)

pytestmark = pytest.mark.stub
GIB = 1 << 30


def uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"




@pytest.fixture
def sleeper() -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """``start()``: a process standing for a launch script; every one is killed and reaped at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(120)"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _busy(devices: int = 2) -> Scenario:
    """GPUs that never become clean: a wait on them ends only by its owner or its deadline."""
    sc = Scenario.h200(devices=devices)
    for d in range(devices):
        sc.add_process(d, 4_100_000 + d, used_bytes=16 * GIB)
    return sc


def _end_at_poll(monkeypatch: pytest.MonkeyPatch, poll: int, action: Callable[[], None], cap: int = 10) -> list[int]:
    """Wrap ``selection._judge``: run ``action`` during poll ``poll``; fail at poll ``cap`` (the wait went on)."""
    calls: list[int] = []
    real = selection._judge

    def judge(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == poll:
            action()
        if len(calls) >= cap:
            raise AssertionError(f"still polling after {cap} polls: the owner's exit was not noticed")
        return real(*args, **kwargs)

    monkeypatch.setattr(selection, "_judge", judge)
    return calls


def _ended(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def end() -> None:
        proc.kill()
        proc.wait()  # reaped: its PID is free for the kernel to hand out again
    return end


def _all_free(lock_dir: Path, devices: int) -> bool:
    for i in range(devices):
        taken = try_lock(uuid(i), lock_dir)
        if taken is None:
            return False
        os.close(taken.fd)
    return True


def _no_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)  # an old kernel: the owner is told by its start time


# --- the owner exits during the wait ----------------------------------------------------------------------------------


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "start-time"])
def test_an_owner_that_exits_during_the_wait_is_refused_at_the_next_poll(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    sleeper: Callable[[], subprocess.Popen[bytes]], pidfd: bool,
) -> None:
    # `select --lock-pid P --wait 600` went on polling after P had exited, until GPUs were free, and only then
    # refused (or waited out the whole --wait on GPUs that stay busy).
    if not pidfd:
        _no_pidfd(monkeypatch)
    path = str(_busy().write(tmp_path / "sc.txt"))
    owner = sleeper()
    calls = _end_at_poll(monkeypatch, 2, _ended(owner))
    code = cli.main(["--simulate", path, "--json", "select", "1", "--lock-pid", str(owner.pid), "--wait", "600"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2, doc
    assert len(calls) == 2  # noticed before the third poll
    during = doc["error"]
    assert during["type"] == "UsageError" and doc["exit_code"] == 2
    assert during["message"].startswith(f"--lock-pid {owner.pid}: process {owner.pid} exited while GPUs were being")
    assert "nothing is locked" in during["message"]
    # The same refusal as for an owner already gone at the start.
    code = cli.main(["--simulate", path, "--json", "select", "1", "--lock-pid", str(owner.pid), "--wait", "600"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["error"]["type"] == during["type"] and doc["exit_code"] == 2
    assert doc["error"]["message"].startswith(f"--lock-pid {owner.pid}: process {owner.pid} ")
    assert _all_free(tmp_path / "locks", 2)


def test_the_default_owner_exiting_during_the_wait_ends_it_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    # Without --lock-pid the owner is nvmlcheck's parent (the launch script): its exit ends the wait the same way.
    path = str(_busy().write(tmp_path / "sc.txt"))
    owner = sleeper()
    monkeypatch.setattr(os, "getppid", lambda: owner.pid)
    calls = _end_at_poll(monkeypatch, 1, _ended(owner))
    code = cli.main(["--simulate", path, "select", "1", "--lock", "--wait", "none"])
    err = capsys.readouterr().err
    assert code == 2 and len(calls) == 1, err
    assert f"the parent process (PID {owner.pid}): process {owner.pid} exited while GPUs" in err


def test_an_owner_that_exits_as_the_gpus_are_chosen_leaves_nothing_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    owner = sleeper()
    lock_dir = tmp_path / "api-locks"
    calls = _end_at_poll(monkeypatch, 1, _ended(owner))  # the poll that finds both GPUs clean
    with use_stub(Scenario.h200(devices=2), tmp_dir=tmp_path):
        import nvmlcheck as nc

        with nc.open("nvml") as gpus, pytest.raises(NoSuchProcess, match="nothing is locked"):
            selection.select_clean(gpus, 2, lock=True, lock_dir=lock_dir, owner=owner.pid)
    assert len(calls) == 1 and _all_free(lock_dir, 2)


def test_select_clean_with_an_owner_ends_its_wait_when_the_owner_exits(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    owner = sleeper()
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 1:
            _ended(owner)()
        assert len(pauses) < 5, "the wait went on after its owner exited"

    with use_stub(_busy(), tmp_dir=tmp_path):
        import nvmlcheck as nc

        with nc.open("nvml") as gpus:
            with pytest.raises(NoSuchProcess, match=f"process {owner.pid} exited"):
                selection.select_clean(gpus, 1, timeout=None, interval=0.0, sleep=sleep, owner=owner.pid)
            assert len(pauses) == 1
            with pytest.raises(NoSuchProcess):  # gone at the start: refused before a poll
                selection.select_clean(gpus, 1, timeout=None, sleep=sleep, owner=owner.pid)


# --- a PID reused between the check and the hand-over -----------------------------------------------------------------


def test_a_reused_owner_pid_never_gets_the_locks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    # The owner was checked by PID at the start and looked up by PID again at the hand-over: had it exited and its
    # PID gone to another process meanwhile, the holder kept the GPUs until that stranger exited.
    owner, stranger = sleeper(), sleeper()
    real_pidfd = locks._owner_pidfd
    opened: list[int] = []

    def owner_pidfd(pid: int) -> int | None:
        opened.append(pid)
        # The first look-up is the owner; any later one finds its PID handed to the stranger.
        return real_pidfd(pid if len(opened) == 1 else stranger.pid)

    monkeypatch.setattr(locks, "_owner_pidfd", owner_pidfd)
    _end_at_poll(monkeypatch, 1, _ended(owner))
    path = str(Scenario.h200(devices=2).write(tmp_path / "sc.txt"))
    code = cli.main(["--simulate", path, "select", "2", "--lock-pid", str(owner.pid)])
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert f"--lock-pid {owner.pid}: process {owner.pid}" in err
    assert _all_free(tmp_path / "locks", 2)


def test_hold_until_a_pinned_owner_that_has_exited_is_refused(
    tmp_path: Path, sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    from nvmlcheck.locks import pin_owner

    owner = sleeper()
    with pin_owner(owner.pid) as pinned:
        held, _ = take_locks([uuid(0)], tmp_path)
        _ended(owner)()
        assert pinned.exited()
        with pytest.raises(ProcessLookupError, match=f"process {owner.pid} has exited"):
            held.hold_until(pinned)
        assert held.held_here  # still held here, as documented
        held.release()
    assert _all_free(tmp_path, 1)


# --- an answer not delivered ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("signal", [KeyboardInterrupt, "Terminated"])
def test_a_signal_while_the_answer_is_written_ends_the_holder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    sleeper: Callable[[], subprocess.Popen[bytes]], signal: Any,
) -> None:
    # Ctrl-C or SIGTERM after the holder took the locks, before the answer was out: the command exited 130/143
    # without printing, and its holder kept the GPUs locked for an owner who never learnt which they were.
    from nvmlcheck.cli import _select
    from nvmlcheck.cli._signals import Terminated

    raised = KeyboardInterrupt() if signal is KeyboardInterrupt else Terminated(15)

    def interrupted(doc: object) -> None:
        raise raised

    monkeypatch.setattr(_select, "print_json", interrupted)
    owner = sleeper()
    path = str(Scenario.h200(devices=2).write(tmp_path / "sc.txt"))
    code = cli.main(["--simulate", path, "--json", "select", "2", "--lock-pid", str(owner.pid)])
    capsys.readouterr()
    assert code == (130 if signal is KeyboardInterrupt else 143)
    assert _all_free(tmp_path / "locks", 2)  # the holder was ended and reaped before the command returned


def test_an_interrupt_while_the_holder_starts_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleeper: Callable[[], subprocess.Popen[bytes]],
) -> None:
    owner = sleeper()
    held, _ = take_locks([uuid(0), uuid(1)], tmp_path)

    def interrupted(fd: int, text: bytes) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(locks, "_write_info", interrupted)  # after the holder said ready, before the hand-over
    with pytest.raises(KeyboardInterrupt):
        held.hold_until(owner.pid)
    monkeypatch.undo()
    assert held.held_here and held.holder_pid is None  # not handed over: still held here only
    held.release()
    assert _all_free(tmp_path, 2)


# --- two selects choosing at the same moment --------------------------------------------------------------------------


def test_racing_selects_cannot_split_the_free_gpus_so_that_neither_gets_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two selects each wanting both of 2 free GPUs, taking their locks one by one at the same moment: A took GPU 0,
    # B (GPU 0 busy) took GPU 1, A found GPU 1 busy: both gave back and exited 1 (or, with --wait, collided again at
    # the next poll) though both GPUs were free. The interleaving is forced with events, never with timing.
    import fcntl
    import threading
    from types import SimpleNamespace

    monkeypatch.setattr(locks, "_CHOOSING_WAIT_S", 600.0)  # B waits for A's choice, however slow this machine is
    gpus: list[Any] = [SimpleNamespace(index=i, uuid=uuid(i)) for i in range(2)]  # what _choose reads of a GPU
    b_thread: list[threading.Thread] = []
    b_holds_1, b_blocked, a_tried_1 = threading.Event(), threading.Event(), threading.Event()
    results: dict[str, Any] = {}
    real_try, real_flock = locks.try_lock, fcntl.flock

    def in_b() -> bool:
        return bool(b_thread) and threading.current_thread() is b_thread[0]

    def flock(fd: int, operation: int) -> None:
        try:
            real_flock(fd, operation)
        except BlockingIOError:
            if in_b() and os.readlink(f"/proc/self/fd/{fd}").endswith(".choosing.lock"):
                b_blocked.set()  # B waits for A's choice to end
            raise

    def try_lock(gpu: str, directory: Path | None = None, *, record: bool = True) -> Any:
        if in_b():
            held = real_try(gpu, directory, record=record)
            if gpu == uuid(1) and held is not None:
                b_holds_1.set()
                assert a_tried_1.wait(60), "A never tried GPU 1"
            return held
        if gpu == uuid(1) and record:  # A, between GPU 0 and GPU 1: B starts choosing now
            b_thread.append(threading.Thread(target=lambda: results.update(b=selection._choose(gpus, 2, tmp_path))))
            b_thread[0].start()
            while not (b_holds_1.is_set() or b_blocked.is_set() or not b_thread[0].is_alive()):
                b_holds_1.wait(0.01)
            try:
                return real_try(gpu, directory, record=record)
            finally:
                a_tried_1.set()
        return real_try(gpu, directory, record=record)

    monkeypatch.setattr(locks, "try_lock", try_lock)
    monkeypatch.setattr(fcntl, "flock", flock)
    results["a"] = selection._choose(gpus, 2, tmp_path)
    b_thread[0].join(60)
    assert not b_thread[0].is_alive()
    won = [name for name in ("a", "b") if results[name][0] is not None]
    assert won == ["a"], results  # A chose first; B found both GPUs taken
    results["a"][1].release()


def test_a_chooser_file_held_on_purpose_costs_one_wait_not_one_per_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Someone holds .choosing.lock (a select stopped mid-choice, or on purpose in a shared directory): each select
    # waits for it once, then chooses without it at every later poll, still by the GPUs' own locks.
    import fcntl
    from types import SimpleNamespace

    squatter = os.open(tmp_path / ".choosing.lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(squatter, fcntl.LOCK_EX)
    monkeypatch.setattr(locks, "_CHOOSING_WAIT_S", 0.05)
    tries: list[int] = []
    real_flock = fcntl.flock

    def flock(fd: int, operation: int) -> None:
        if fd != squatter and os.readlink(f"/proc/self/fd/{fd}").endswith(".choosing.lock"):
            tries.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    gpus: list[Any] = [SimpleNamespace(index=i, uuid=uuid(i)) for i in range(2)]
    patience: list[float | None] = [None]
    try:
        first = selection._choose(gpus, 1, tmp_path, patience)
        assert first[0] is not None and first[1] is not None and tries  # gone around: GPU 0 is still chosen
        assert patience == [0.0]
        first[1].release()
        tries.clear()
        second = selection._choose(gpus, 2, tmp_path, patience)
        assert second[0] is not None and second[1] is not None and len(tries) == 1  # one try, no wait
        second[1].release()
    finally:
        os.close(squatter)
