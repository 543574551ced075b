"""``slurm.Scontrol`` against stand-in scontrol programs that misbehave as a real one can when slurmctld does not
answer: one that blocks (and this process is interrupted meanwhile), one that leaves a process holding its output
pipe, one that cannot be started. Mechanism only: the time bounds here are hang guards, never measurements."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import slurm
from nvmlcheck._proc import child as child_module
from nvmlcheck.testing import Scenario

HANG_GUARD_S = 30.0
NODE_LINE = "NodeName=n1 State=IDLE ThreadsPerCore=1"


def guard() -> int:
    """A deadline far enough away that reaching it means the mechanism hung."""
    return time.monotonic_ns() + int(HANG_GUARD_S * 1e9)


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not check():
        assert time.monotonic() < deadline, f"not within the hang guard: {what}"
        time.sleep(0.01)


def gone(pid: int) -> bool:
    """No longer running: absent, or a zombie waiting to be reaped."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[-1].split()[0] == "Z"


def fake(directory: Path, body: str) -> Path:
    """An executable ``scontrol`` in ``directory`` running the shell ``body`` (``$1`` is ``-o`` or ``update``)."""
    path = directory / "scontrol"
    path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return path


@pytest.fixture
def pids(tmp_path: Path) -> Iterator[Callable[[], list[int]]]:
    """The pids a fake wrote to ``pids`` (one per line): SIGKILLed at the end whatever happened (they are ours)."""
    path = tmp_path / "pids"

    def read() -> list[int]:
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    yield read
    for pid in read():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def blocking(tmp_path: Path, on: str) -> Path:
    """A scontrol that answers ``-o show node`` at once except when ``on`` is ``-o``, and blocks in a child of its
    own on ``on`` (writing its pid and the child's to ``pids`` first): slurmctld not answering."""
    return fake(tmp_path, f'if [ "$1" = {on} ]; then sleep 300 & echo $$ $! > {tmp_path}/pids; wait; fi\n'
                          f'[ "$1" = -o ] && echo "{NODE_LINE}"\nexit 0')


# --- interrupted while scontrol runs -------------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_run_kills_scontrols_group(signum: int, tmp_path: Path,
                                                  pids: Callable[[], list[int]]) -> None:
    from nvmlcheck.cli._signals import Terminated, ending_on_signals

    scontrol = slurm.Scontrol(str(blocking(tmp_path, "-o")))

    def interrupt() -> None:
        eventually(lambda: len(pids()) == 2, "scontrol started")
        os.kill(os.getpid(), signum)  # the main thread gets it: KeyboardInterrupt, or the CLI's Terminated

    thread = threading.Thread(target=interrupt, daemon=True)
    thread.start()
    with ending_on_signals(), pytest.raises((KeyboardInterrupt, Terminated)):
        scontrol.node("n1", deadline_ns=guard())
    thread.join()
    # SIGKILLed: each is gone once the kernel has run its exit (a moment after the signal, not the same instant).
    eventually(lambda: all(gone(pid) for pid in pids()), "scontrol (or its child) outlived the interruption")


def test_a_signal_while_scontrol_is_being_started_leaves_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              pids: Callable[[], list[int]]) -> None:
    # The moment between the fork and the caller knowing its child: an exception raised there (as the CLI raises
    # SIGTERM) once left scontrol running, unknown to anything that would kill it.
    leaders: list[int] = []
    killed: list[int] = []
    init, kill, signal_group = child_module.Child.__init__, child_module.Child.kill, child_module.Child.signal_group
    taken = threading.Event()

    def on_sigint(signum: int, frame: object) -> None:
        taken.set()
        raise KeyboardInterrupt

    def starting(self: child_module.Child, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        leaders.append(self.proc.pid)
        os.kill(os.getpid(), signal.SIGINT)
        # The child is not known to the caller until this returns: held here until the main thread has taken the
        # interruption (it was a 0.2 s sleep, which a loaded machine can outlast: the signal then came after).
        assert taken.wait(HANG_GUARD_S), "the main thread never took the SIGINT"

    def killing(self: child_module.Child, *args: Any, **kwargs: Any) -> bool:
        killed.append(self.proc.pid)
        return kill(self, *args, **kwargs)

    def grouping(self: child_module.Child, *args: Any, **kwargs: Any) -> Any:
        killed.append(self.proc.pid)
        return signal_group(self, *args, **kwargs)

    monkeypatch.setattr(child_module.Child, "__init__", starting)
    monkeypatch.setattr(child_module.Child, "kill", killing)
    # Which of the two kills it depends on whether the worker had handed the child over when the main thread ran
    # its handler (the main thread's group kill, or the worker's own kill once it sees the stop): either is one.
    monkeypatch.setattr(child_module.Child, "signal_group", grouping)
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            slurm.Scontrol(str(blocking(tmp_path, "-o"))).node("n1", deadline_ns=guard())
        assert leaders != [] and set(killed) == set(leaders), "the exception went on before scontrol's group was killed"
        eventually(lambda: gone(leaders[0]), "scontrol outlived the interruption of its start")
    finally:
        signal.signal(signal.SIGINT, previous)
        for pid in leaders:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_slurmds_sigterm_during_a_drain_leaves_no_scontrol(signum: int, code: int, tmp_path: Path,
                                                           pids: Callable[[], list[int]]) -> None:
    # slurmd SIGTERMs a Prolog/Epilog at PrologEpilogTimeout; the health check drains at once (row remap pending).
    scenario = Scenario.h200(devices=2)
    scenario.set_device(1, remapped_rows=(0, 1, True, False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    argv = [sys.executable, "-m", "nvmlcheck", "--simulate", str(scenario.write(tmp_path / "remap.txt")), "slurm",
            "health", "--scontrol", str(blocking(tmp_path, "update")), "--node", "n1", "--timeout", "120"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        eventually(lambda: len(pids()) == 2 or proc.poll() is not None, "the drain started")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    assert len(pids()) == 2
    eventually(lambda: all(gone(pid) for pid in pids()), "scontrol (or its child) outlived nvmlcheck")


def test_a_sigkilled_gate_leaves_no_scontrol(tmp_path: Path, pids: Callable[[], list[int]]) -> None:
    # SIGKILL (slurmd's at the end of its kill wait, the OOM killer) runs no cleanup, and scontrol runs in a session
    # of its own, out of reach of a kill of nvmlcheck's group: the guard process ends it, as it ends a fleet's ssh.
    scenario = Scenario.h200(devices=2)
    scenario.set_device(1, remapped_rows=(0, 1, True, False))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    argv = [sys.executable, "-m", "nvmlcheck", "--simulate", str(scenario.write(tmp_path / "remap.txt")), "slurm",
            "health", "--scontrol", str(blocking(tmp_path, "update")), "--node", "n1", "--timeout", "120"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        eventually(lambda: len(pids()) == 2 or proc.poll() is not None, "the drain started")
        assert proc.poll() is None, "nvmlcheck ended before its drain"
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(pids()) == 2
    eventually(lambda: all(gone(pid) for pid in pids()), "scontrol (or its child) outlived a SIGKILLed nvmlcheck")


# --- a pipe held open by what scontrol left behind --------------------------------------------------------------------


def pipe_holder(tmp_path: Path, then: str) -> Path:
    """A scontrol that first starts a process of another session (no group kill reaches it) holding its stdout and
    stderr, then runs ``then``."""
    return fake(tmp_path, f"setsid sleep 77 &\necho $! >> {tmp_path}/pids\n{then}")


def test_an_answer_is_kept_though_a_process_it_left_holds_the_pipe(tmp_path: Path,
                                                                   pids: Callable[[], list[int]]) -> None:
    scontrol = slurm.Scontrol(str(pipe_holder(tmp_path, f'echo "{NODE_LINE}"; exit 0')))
    state = scontrol.node("n1", deadline_ns=guard())  # once: "timed out" at the deadline, the line thrown away
    assert state.state == "IDLE"
    run = scontrol.runs[0]
    assert run.exit_code == 0 and NODE_LINE in run.output
    assert pids() and not gone(pids()[0])  # the holder did hold the pipe all along


def test_no_wait_for_a_held_pipe_goes_past_the_deadline(tmp_path: Path, pids: Callable[[], list[int]],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # scontrol hangs and what it left holds the pipe: at the deadline the group is killed; the kill once waited
    # REAP_GRACE_S (1 s) more for the pipe, per call.
    asked: list[int | None] = []
    wait = child_module.Child.wait

    def spy(self: child_module.Child, deadline_ns: int | None, **kwargs: object) -> bool:
        asked.append(deadline_ns)
        return wait(self, deadline_ns, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(child_module.Child, "wait", spy)
    scontrol = slurm.Scontrol(str(pipe_holder(tmp_path, "exec sleep 300")))
    deadline = time.monotonic_ns() + 300_000_000
    with pytest.raises(slurm.ScontrolError, match="timed out"):
        scontrol.node("n1", deadline_ns=deadline)
    assert len(asked) >= 2  # the run's wait, then the kill's
    assert all(d is not None and d <= deadline + slurm._KILL_REAP_NS for d in asked), asked
    assert scontrol.runs[0].exit_code is None


def test_what_scontrol_leaves_in_its_group_after_exit_0_is_killed(tmp_path: Path,
                                                                   pids: Callable[[], list[int]]) -> None:
    # A helper left in scontrol's process group (not in a session of its own: that one is not ours) ends with the
    # run, as a run cut at its deadline does, and as a fleet's ssh leaves nothing in its group.
    scontrol = slurm.Scontrol(str(fake(tmp_path, f"sleep 300 >/dev/null 2>&1 &\necho $! >> {tmp_path}/pids\n"
                                                 f'echo "{NODE_LINE}"; exit 0')))
    assert scontrol.node("n1", deadline_ns=guard()).state == "IDLE"
    assert scontrol.runs[0].exit_code == 0
    assert len(pids()) == 1
    eventually(lambda: gone(pids()[0]), "what scontrol left in its group outlived its run")


# --- one that cannot be started --------------------------------------------------------------------------------------


def test_a_scontrol_that_cannot_be_started_is_not_said_to_time_out(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(slurm.ScontrolError) as raised:
        slurm.Scontrol(str(tmp_path / "nope" / "scontrol")).node("n1", deadline_ns=guard())
    message = str(raised.value)
    assert message.startswith(f"{tmp_path}/nope/scontrol -o show node n1: not started: ")
    assert "No such file or directory" in message and "timed out" not in message
    monkeypatch.setattr(slurm, "_find_scontrol", lambda: None)
    with pytest.raises(slurm.ScontrolError, match=r"^scontrol -o show node n1: not started: scontrol not found on "):
        slurm.Scontrol().node("n1", deadline_ns=guard())


def test_the_record_says_scontrol_was_not_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from nvmlcheck.cli import main

    for key in [k for k in os.environ if k.startswith("SLURM")]:
        monkeypatch.delenv(key)
    scenario = Scenario.h200(devices=2)
    scenario.set_device(1, remapped_rows=(0, 1, True, False))
    code = main(["--simulate", str(scenario.write(tmp_path / "remap.txt")), "slurm", "health", "--scontrol",
                 "/nope/scontrol", "--node", "n1", "--timeout", "5", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1  # unhealthy, and the drain failed
    assert doc["node_state_error"].startswith("/nope/scontrol -o show node n1: not started: [Errno 2] No such file")
    assert [(r["ran"], r["exit_code"]) for r in doc["scontrol"]] == [(False, None), (False, None)]
