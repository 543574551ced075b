"""Killing what holds a GPU when it cannot be killed or cannot let go: a process of another container (EPERM) and a
zombie whose memory is still held. Sources: FACTS.md ("NVML reports host PIDs"; "zombies or D-state processes can
hold it for long", sglang PR #36589, PaddleOCR #2074)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.testing import Scenario

from ._support import GIB, Stub, dead, wait_for

pytestmark = pytest.mark.stub

#: A PID as NVML reports it for a process of another container: a host PID this process may not signal.
FOREIGN_PID = 4_000_123


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ``os.kill`` call; ``FOREIGN_PID`` answers EPERM as a process of another container does (the tests run
    as root, for whom the kernel would allow anything)."""
    sent: list[tuple[int, int]] = []
    real = os.kill

    def kill(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        if pid == FOREIGN_PID:
            raise PermissionError(1, "Operation not permitted")
        real(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    return sent


def _shared_gpu(mine: int) -> Scenario:
    sc = Scenario.h200()
    sc.add_process(0, mine, used_bytes=GIB, bound=True)
    sc.add_process(0, FOREIGN_PID, used_bytes=2 * GIB)
    return sc


def test_process_of_another_container_is_refused_and_nothing_is_signalled(
    stub: Stub, sleeper: subprocess.Popen[bytes], signals: list[tuple[int, int]]
) -> None:
    with stub.open(_shared_gpu(sleeper.pid)) as gpus, pytest.raises(nc.KillError) as info:
        nc.kill_and_wait(gpus, [sleeper.pid, FOREIGN_PID], timeout=5)
    assert info.value.pid == FOREIGN_PID and "EPERM" in str(info.value) and "container" in str(info.value)
    assert signals and all(sig == 0 for _, sig in signals)  # existence probes only: all or nothing
    assert sleeper.poll() is None


def test_cli_kill_all_on_gpu_with_a_foreign_process_exits_2_and_signals_nothing(
    stub: Stub,
    sleeper: subprocess.Popen[bytes],
    signals: list[tuple[int, int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    stub.write(_shared_gpu(sleeper.pid))
    code = cli.main(["kill", "--all-on-gpu", "--yes", "--backend", "nvml", "--timeout", "2"])
    assert code == cli.EXIT_USAGE
    assert f"cannot signal PID {FOREIGN_PID}" in capsys.readouterr().err
    assert all(sig == 0 for _, sig in signals) and sleeper.poll() is None


# --- a zombie that keeps its memory ----------------------------------------------------------------------------------

# Forks a child that sleeps, prints its PID and never reaps it: once killed, the child stays a zombie.
_NEGLECTFUL_PARENT = """
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
sys.stdout.write(f"{pid}\\n")
sys.stdout.flush()
time.sleep(60)
"""


@pytest.fixture
def zombie_to_be() -> Iterator[int]:
    """A PID (not our child) that becomes a zombie when signalled: its parent never reaps it."""
    parent = subprocess.Popen([sys.executable, "-S", "-c", _NEGLECTFUL_PARENT], stdout=subprocess.PIPE)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    yield pid
    parent.kill()  # the zombie goes to init, which reaps it
    parent.wait()
    parent.stdout.close()


def test_zombie_holding_memory_times_out_naming_it(stub: Stub, zombie_to_be: int) -> None:
    sc = Scenario.h200()
    sc.add_process(0, zombie_to_be, used_bytes=4 * GIB, bound=True, zombie_holds=True)
    with stub.open(sc) as gpus:
        with pytest.raises(nc.WaitTimeout) as info:
            nc.kill_and_wait(gpus, [zombie_to_be], timeout=0.5, grace_s=0.1)
        assert dead(zombie_to_be)  # it exited (a zombie) ...
        text = str(info.value)  # ... and the GPU is still held: the timeout says by whom
        assert f"pid {zombie_to_be}" in text and "4.0 GiB" in text


def test_cli_kill_of_a_zombie_holding_memory_exits_1(
    stub: Stub, zombie_to_be: int, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = Scenario.h200()
    sc.add_process(0, zombie_to_be, used_bytes=4 * GIB, bound=True, zombie_holds=True)
    stub.write(sc)
    code = cli.main(["kill", str(zombie_to_be), "--backend", "nvml", "--timeout", "0.5", "--grace", "0.1"])
    assert code == cli.EXIT_NOT_CLEAN
    assert f"pid {zombie_to_be}" in capsys.readouterr().err
    wait_for(lambda: dead(zombie_to_be), 2.0, "the signalled process to exit")


def test_kill_escalates_to_sigkill_and_ends_clean(stub: Stub) -> None:
    stubborn = subprocess.Popen(
        [sys.executable, "-S", "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print(1, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline()  # SIGTERM is ignored from here on
        sc = Scenario.h200()
        sc.add_process(0, stubborn.pid, used_bytes=GIB, bound=True, release_ms=50)
        with stub.open(sc) as gpus:
            result = nc.kill_and_wait(gpus, [stubborn.pid], timeout=10, grace_s=0.2)
        (pid,) = result.pids
        assert pid.killed_ns is not None and pid.killed_ns >= 0.2e9
        assert result.clean_ns >= pid.killed_ns  # (kill_and_wait reaped its own child: no exit status to read here)
    finally:
        stubborn.kill()
        stubborn.wait()
        assert stubborn.stdout is not None
        stubborn.stdout.close()
