"""A holders reading has a time limit, and one cut by it is unknown, never "no holders". Before, ``find_holders``,
``Session.holders`` and ``select_kill_holders`` took no bound: a ``/proc`` scan of a host with many processes, a
``/proc`` read that hangs (a command line read under its process's memory-map lock) or a slow GPU held a caller
with a deadline (the Slurm epilog, ``kill --all-holders --timeout``) for as long as it took. Now each takes
``timeout`` and raises :class:`~nvmlcheck.HoldersIncomplete` (a ``TimeoutError``) carrying what it read. Time is
injected where the cut has to fall at a given place; the slow GPU is the stub's delayed call."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck._proc import devfiles
from nvmlcheck.testing import Scenario, StepClock

pytestmark = pytest.mark.stub
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def holders_of(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """Three processes with a stand-in /dev/nvidia0 open, and the stand-in's pattern."""
    d = tmp_path / "dev"
    d.mkdir()
    (d / "nvidia0").write_text("")
    started = []
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-S", "-c", HOLD, str(d / "nvidia0")], stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        started.append(p)
    yield f"{d}/nvidia[0-9]*", started
    for p in started:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def test_a_scan_cut_by_its_timeout_is_incomplete_not_empty(
        holders_of: tuple[str, list[subprocess.Popen[bytes]]]) -> None:
    pattern, procs = holders_of
    # Each clock reading is 0.1 s and the scan reads the clock before each process: this host has more than five.
    with pytest.raises(nc.HoldersIncomplete) as info:
        nc.find_holders(None, device_files=pattern, timeout=0.5, clock=StepClock(0.1).clock)
    exc = info.value
    assert isinstance(exc, TimeoutError) and exc.unscanned is not None and exc.unscanned > 0
    assert f"{exc.unscanned} processes were not scanned" in str(exc) and "unknown (not none)" in str(exc)
    assert pickle.loads(pickle.dumps(exc)).unscanned == exc.unscanned
    # Unbounded (the default) or with time enough, every holder.
    pids = {p.pid for p in procs}
    assert pids <= {h.pid for h in nc.find_holders(None, device_files=pattern)}
    assert pids <= {h.pid for h in nc.find_holders(None, device_files=pattern, timeout=60)}


def test_holders_described_past_the_timeout_are_cut_with_those_read(
        holders_of: tuple[str, list[subprocess.Popen[bytes]]], monkeypatch: pytest.MonkeyPatch) -> None:
    pattern, procs = holders_of
    now = [0]

    def clock() -> int:
        now[0] += 0 if now[0] < 900_000_000 else 50_000_000
        return now[0]

    real_scan = devfiles.scan

    def scan(*args: object, **kwargs: object) -> devfiles.FdScan:
        out = real_scan(pattern)  # the scan whole, and only our three holders
        out = out._replace(holders={p.pid: out.holders[p.pid] for p in procs})
        now[0] = 900_000_000  # the scan took 0.9 s of the 1 s; each reading from now on is 50 ms
        return out

    monkeypatch.setattr(devfiles, "scan", scan)
    with pytest.raises(nc.HoldersIncomplete) as info:
        nc.find_holders(None, device_files=pattern, timeout=1.0, clock=clock)
    exc = info.value
    assert [h.pid for h in exc.found] == [min(p.pid for p in procs)] and exc.unscanned == 0
    assert "2 of the 3 holders found were not read" in str(exc)


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
def test_a_bad_timeout_is_refused(timeout: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        nc.find_holders(None, timeout=timeout)  # type: ignore[arg-type]


def _slow_lists(tmp_path: Path, pid: int | None = None) -> str:
    sc = Scenario.h200(devices=4)
    if pid is not None:
        sc.add_process(0, pid, used_bytes=1 << 30, bound=True)
    # Every compute-process-list reading takes 0.3 s: four GPUs' lists take 1.2 s, the timeout is 0.5 s.
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", delay_ms=300)
    return str(sc.write(tmp_path / "s.txt"))


def test_session_holders_on_a_slow_gpu_stop_at_the_timeout(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200(devices=4)
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", delay_ms=300)
    with gpus(sc) as session:
        with pytest.raises(nc.HoldersIncomplete, match="process lists were still being read"):
            session.holders(timeout=0.5)
        with pytest.raises(nc.HoldersIncomplete, match="process lists were still being read"):
            nc.select_kill_holders(session, all_holders=True, timeout=0.5)


def test_kill_all_holders_with_a_cut_reading_signals_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        holders_of: tuple[str, list[subprocess.Popen[bytes]]]) -> None:
    _, procs = holders_of
    path = _slow_lists(tmp_path, procs[0].pid)
    code = cli.main(["--simulate", path, "--json", "kill", "--all-holders", "--yes", "--timeout", "0.5"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 3, (out, err)
    assert "nothing was signalled" in doc["error"]["message"] and "unknown (not none)" in doc["error"]["message"]
    assert all(p.poll() is None for p in procs)


def test_the_holders_command_is_bounded_and_a_cut_reading_is_an_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _slow_lists(tmp_path)
    code = cli.main(["--simulate", path, "--json", "holders", "--timeout", "0.5"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 3, (out, err)
    assert doc["error"]["type"] == "HoldersIncomplete" and "unknown (not none)" in doc["error"]["message"]
    # Carried to the hosts: each host's reading is bounded there as here.
    from nvmlcheck.cli._hosts import remote_command
    from nvmlcheck.cli._parser import build_parser

    words = remote_command(build_parser().parse_args(["holders", "--timeout", "5", "--host", "gpu01"]))
    assert float(words[words.index("--timeout") + 1]) == 5.0


def test_a_hung_proc_read_of_a_holder_ends_kill_all_holders_on_any_backend(
        python_child: Callable[..., subprocess.Popen[bytes]], tmp_path: Path,
        hung_cmdline_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    scenario = Scenario.h200().write(tmp_path / "s.txt")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    # Holds the simulation's stand-in /dev/nvidia0: a holder whose command line read "hangs".
    holder = python_child(HOLD, str(tmp_path / "dev" / "nvidia0"))
    # The nvidia-smi backend has no GPU watchdog (each nvidia-smi run has its own bound); the /proc read had none.
    out = hung_cmdline_cli(holder.pid, "--simulate", str(scenario), "--backend", "smi", "kill", "--all-holders",
                           "--yes", "--timeout", "0.5")
    assert out.returncode == 3, out.stderr
    # The reading leaves the hung read behind at --timeout (HoldersIncomplete, naming it); the command's watchdog,
    # a second later, is the backstop should this process not be scheduled in that second: either ends it.
    assert ("a /proc read has not returned" in out.stderr or (
        "the holders could not all be read" in out.stderr and "command line" in out.stderr)), out.stderr
    assert "nothing was signalled" in out.stderr
    assert holder.poll() is None


def test_a_clock_in_seconds_is_refused_not_read_as_nanoseconds() -> None:
    # find_holders(timeout=5, clock=time.monotonic) took the float seconds as ns: a bound of ~158 years, unchecked.
    import time

    with pytest.raises(TypeError, match="integer nanoseconds"):
        nc.find_holders(None, timeout=5, clock=time.monotonic)  # type: ignore[arg-type]


@pytest.mark.parametrize(("snapshot", "devices", "error"), [
    ("snapshot", None, TypeError), (None, 0, TypeError), (None, [0], ValueError), (None, ["0"], TypeError),
    (None, [True], TypeError),
])
def test_find_holders_refuses_what_it_cannot_read(snapshot: object, devices: object, error: type[Exception]) -> None:
    # A str snapshot failed with an AttributeError inside; devices=0 (or any devices with no snapshot) was ignored.
    with pytest.raises(error):
        nc.find_holders(snapshot, devices=devices)  # type: ignore[arg-type]
