"""Killing what holds a GPU when it cannot be killed or cannot let go: a process of another container (EPERM) and a
zombie whose memory is still held. Sources: FACTS.md ("NVML reports host PIDs"; "zombies or D-state processes can
hold it for long", sglang PR #36589, PaddleOCR #2074)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.testing import Scenario

from ._support import GIB, Stub, dead, wait_for

pytestmark = pytest.mark.stub

#: A process that holds a (fake) NVIDIA device file open, as every CUDA process does: visible as a GPU holder here.
_HOLDING = "import sys, time; f = open(sys.argv[1]); time.sleep(60)"


def _start_holding(device_file: str) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-S", "-c", _HOLDING, device_file])

    def opened() -> bool:
        try:
            return any(os.readlink(f"/proc/{child.pid}/fd/{fd}") == device_file
                       for fd in os.listdir(f"/proc/{child.pid}/fd"))
        except OSError:
            return False

    wait_for(opened, 10.0, "the holder to open its device file")
    return child


@pytest.fixture
def device_file(tmp_path: Path) -> str:
    """A stand-in /dev/nvidia0 (CI has none): in dev/ next to the stub's scenario, the simulation's stand-ins."""
    path = tmp_path / "dev" / "nvidia0"
    path.parent.mkdir()
    path.write_text("")
    return str(path)


@pytest.fixture
def sleeper(device_file: str) -> Iterator[subprocess.Popen[bytes]]:
    child = _start_holding(device_file)
    yield child
    child.kill()
    child.wait()


@pytest.fixture
def foreign(device_file: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process that plays one of another container: every signal to it, probes included, answers EPERM."""
    real_kill = os.kill  # the signals fixture's patch may still be in place at teardown
    child = _start_holding(device_file)
    yield child
    real_kill(child.pid, signal.SIGKILL)
    child.wait()


def _pidfd_target(fd: int) -> int:
    """The PID a pidfd names, from ``/proc/self/fdinfo``."""
    for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise AssertionError(f"fd {fd} is not a pidfd")


@pytest.fixture
def signals(monkeypatch: pytest.MonkeyPatch, foreign: subprocess.Popen[bytes]) -> list[tuple[int, int]]:
    """Every signal sent (pidfd or ``os.kill``) as (pid, signal); ``foreign`` answers EPERM, as a process of another
    container does (the tests run as root, for whom the kernel would allow anything)."""
    sent: list[tuple[int, int]] = []
    real_pidfd, real_kill = signal.pidfd_send_signal, os.kill

    def check(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        if pid == foreign.pid:
            raise PermissionError(1, "Operation not permitted")

    def pidfd_send_signal(fd: int, sig: int, *args: object) -> None:
        check(_pidfd_target(fd), sig)
        real_pidfd(fd, sig)

    def kill(pid: int, sig: int) -> None:
        check(pid, sig)
        real_kill(pid, sig)

    monkeypatch.setattr("_signal.pidfd_send_signal", pidfd_send_signal)  # what _proc.signals calls
    monkeypatch.setattr(os, "kill", kill)
    return sent


def _shared_gpu(mine: int, theirs: int) -> Scenario:
    sc = Scenario.h200()
    sc.add_process(0, mine, used_bytes=GIB, bound=True)
    sc.add_process(0, theirs, used_bytes=2 * GIB)
    return sc


@pytest.mark.parametrize("pinning", ["pidfd", "start-time"])
def test_process_of_another_container_is_refused_and_nothing_is_signalled(
    stub: Stub,
    sleeper: subprocess.Popen[bytes],
    foreign: subprocess.Popen[bytes],
    signals: list[tuple[int, int]],
    pinning: Literal["pidfd", "start-time"],
) -> None:
    with stub.open(_shared_gpu(sleeper.pid, foreign.pid)) as gpus, pytest.raises(nc.KillError) as info:
        nc.kill_and_wait(gpus, [sleeper.pid, foreign.pid], timeout=5, pinning=pinning)
    assert info.value.pid == foreign.pid and "EPERM" in str(info.value) and "container" in str(info.value)
    assert signals and all(sig == 0 for _, sig in signals)  # permission probes only: all or nothing
    assert sleeper.poll() is None


def test_cli_kill_all_on_gpu_with_a_foreign_process_exits_2_and_signals_nothing(
    stub: Stub,
    sleeper: subprocess.Popen[bytes],
    foreign: subprocess.Popen[bytes],
    signals: list[tuple[int, int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    stub.write(_shared_gpu(sleeper.pid, foreign.pid))
    code = cli.main(["kill", "--all-on-gpu", "--yes", "--backend", "nvml", "--timeout", "2"])
    assert code == cli.EXIT_USAGE
    assert f"cannot signal PID {foreign.pid}" in capsys.readouterr().err
    assert all(sig == 0 for _, sig in signals) and sleeper.poll() is None


def test_cli_kill_all_on_gpu_names_a_foreign_holder_not_permitted(
    stub: Stub,
    sleeper: subprocess.Popen[bytes],
    foreign: subprocess.Popen[bytes],
    signals: list[tuple[int, int]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The error class a caller catches for EPERM, as for a named PID (it was the bare KillError for a holder).
    stub.write(_shared_gpu(sleeper.pid, foreign.pid))
    code = cli.main(["--json", "kill", "--all-on-gpu", "--yes", "--backend", "nvml", "--timeout", "2"])
    doc = json.loads(capsys.readouterr().out)
    assert code == cli.EXIT_USAGE and doc["error"]["type"] == "NotPermitted"
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
        text = str(info.value)  # ... and the GPU is still held: the timeout says by whom, and why no signal helps
        assert f"pid {zombie_to_be}" in text and "4.0 GiB" in text and "is a zombie" in text
        assert isinstance(info.value, nc.KillTimeout)
        (target,) = info.value.pids
        assert target.exited_ns is not None and target.off_gpu_ns is None


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
        [sys.executable, "-S", "-c", "import signal, time; signal.signal(signal.SIGTERM, lambda n, f: None); "
         "print(1, flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline()  # SIGTERM is caught (and does nothing)
        sc = Scenario.h200()
        sc.add_process(0, stubborn.pid, used_bytes=GIB, bound=True, release_ms=50)
        with stub.open(sc) as gpus:
            result = nc.kill_and_wait(gpus, [stubborn.pid], timeout=10, grace_s=0.2)
        (pid,) = result.pids
        assert [s.name for s in pid.signals] == ["SIGTERM", "SIGKILL"]
        assert pid.killed_ns is not None and pid.killed_ns >= 0.2e9
        assert pid.exited_ns is not None and result.clean_ns >= pid.exited_ns >= pid.killed_ns
        assert stubborn.wait() == -signal.SIGKILL  # nothing reaped it behind our back
    finally:
        stubborn.kill()
        stubborn.wait()
        assert stubborn.stdout is not None
        stubborn.stdout.close()


def test_the_descriptor_budget_reads_the_soft_limit_without_raising_it_first() -> None:
    import resource

    from nvmlcheck._proc.pin import FD_RESERVE, descriptor_budget

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd"))
    cheap = descriptor_budget(raise_limit=False)
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft  # nothing raised
    if soft != resource.RLIM_INFINITY:
        assert abs(cheap - max(0, soft - in_use - FD_RESERVE)) <= 2  # the listing's own descriptor, a racing one
