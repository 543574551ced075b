"""A ``/proc`` read that blocks (``/proc/PID/cmdline`` is read under the process's memory-map lock, which a process
stuck in the driver can hold for good) no longer holds a holders reading past its caller's ``timeout``: the reading
runs in a worker that the caller's thread leaves behind at the deadline, and the answer is
:class:`~nvmlcheck.HoldersIncomplete` naming what was being read, never a short list. Before, ``find_holders(...,
timeout=0.3)`` returned after the read did (seconds, or never). ``timeout=0`` (one complete reading, no deadline)
is cut only by one read that does not return in ``HUNG_READ_S``: a slow scan that moves on is read whole, where
``holders --timeout 0`` used to be ended by the command line's watchdog 1 s after the scan began, as a hung read.

The blocked read is a stand-in that waits on an event the test sets at its end (bounded, so that the code before
the fix fails the assertion instead of hanging); the outcomes asserted do not depend on how fast this host is."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import holders as holders_module
from nvmlcheck._proc import procfs
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
ROOT = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def stuck(python_child: Callable[..., subprocess.Popen[bytes]], tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, int, int]]:
    """Two holders of a stand-in /dev/nvidia0; reading the command line of the second blocks (until teardown, at
    most 20 s). Yields the stand-in pattern, the readable holder's PID and the stuck one's."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    fine = python_child(HOLD, str(tmp_path / "dev" / "nvidia0"))
    hung = python_child(HOLD, str(tmp_path / "dev" / "nvidia0"))
    release = threading.Event()
    real = procfs.cmdline

    def cmdline(pid: int, proc: str = "/proc") -> tuple[str, ...] | None:
        if pid == hung.pid:
            release.wait(20)  # stands for a read blocked on the process's memory-map lock
        return real(pid, proc)

    monkeypatch.setattr(procfs, "cmdline", cmdline)
    yield f"{tmp_path}/dev/nvidia[0-9]*", fine.pid, hung.pid
    release.set()


def test_a_read_that_blocks_is_left_behind_at_the_timeout(stuck: tuple[str, int, int]) -> None:
    pattern, _, hung = stuck
    with pytest.raises(nc.HoldersIncomplete) as info:
        nc.find_holders(None, device_files=pattern, timeout=0.5)
    exc = info.value
    assert hung not in {h.pid for h in exc.found}  # only holders read whole
    assert "unknown (not none)" in str(exc) and exc.timeout_s == 0.5
    # Cut while reading the stuck holder (it is named), or, on a host too loaded to finish the scan in 0.5 s, in
    # the scan: either way the answer is incomplete, never a list without it.
    assert f"pid {hung}'s /proc entries" in exc.reason or "were not scanned" in exc.reason, exc.reason


@pytest.mark.parametrize("timeout", [0, 1e-10])  # 1e-10 s rounds to 0 ns: one complete reading too
def test_timeout_0_reads_whole_but_gives_up_on_a_hung_read(stuck: tuple[str, int, int],
                                                           monkeypatch: pytest.MonkeyPatch, timeout: float) -> None:
    pattern, _, hung = stuck
    monkeypatch.setattr(holders_module, "_HUNG_READ_NS", 200_000_000)  # 0.2 s instead of 1 s: a shorter test
    monkeypatch.setattr(holders_module, "HUNG_READ_S", 0.2)
    with pytest.raises(nc.HoldersIncomplete) as info:
        nc.find_holders(None, device_files=pattern, timeout=timeout)
    exc = info.value
    assert f"reading pid {hung}'s /proc entries" in exc.reason and "has not returned after 0.2 s" in exc.reason
    assert timeout or "within" not in str(exc)  # no "within 0 s": timeout 0 is one complete reading
    assert hung not in {h.pid for h in exc.found}
    # No bound asked (None): the caller's thread waits for the read, as it asked.
    assert holders_module._bounded(lambda progress: (), deadline_ns=None, clock=time.monotonic_ns,
                                   timeout_s=float("inf")) == ()


def test_a_process_still_blocking_an_earlier_reading_is_not_read_again(
        stuck: tuple[str, int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    # Each reading left one more worker thread (and its descriptor) blocked on the same process: a caller polling
    # the holders piled them up for as long as the lock was held. Now a later reading is incomplete at once.
    pattern, _, hung = stuck
    reads: list[int] = []
    blocked = procfs.cmdline

    def counted(pid: int, proc: str = "/proc") -> tuple[str, ...] | None:
        if pid == hung:
            reads.append(pid)
        return blocked(pid, proc)

    monkeypatch.setattr(procfs, "cmdline", counted)
    with pytest.raises(nc.HoldersIncomplete) as first:
        nc.find_holders(None, device_files=pattern, timeout=0.5)
    if f"pid {hung}'s /proc entries" not in first.value.reason:
        pytest.skip("this host was too loaded to reach the stuck holder in 0.5 s: " + first.value.reason)
    with pytest.raises(nc.HoldersIncomplete) as second:
        nc.find_holders(None, device_files=pattern, timeout=30)
    assert f"pid {hung}'s /proc entries" in second.value.reason
    assert "an earlier reading's read of them has not returned yet" in second.value.reason
    assert reads == [hung]  # read once, by the first reading's worker (still blocked), not again


def test_the_timeout_explanation_reports_a_hung_read_instead_of_hanging(stuck: tuple[str, int, int]) -> None:
    pattern, _, hung = stuck
    lines = nc.explain_unseen_holders(None, device_files=pattern, budget_s=0.2)
    assert any("the /proc reading that explains it was cut" in line for line in lines), lines
    assert not any(line.startswith(f"pid {hung} (") for line in lines)  # never read whole: no line of its own


SLOW_SCAN = """
import os, sys, time
from nvmlcheck._proc import devfiles
real = devfiles._fds
each = 1.5 / max(1, sum(name.isdigit() for name in os.listdir("/proc")))  # the whole scan: ~1.5 s, no read 0.1 s
def fds(pid, rule, proc):
    time.sleep(min(each, 0.1))
    return real(pid, rule, proc)
devfiles._fds = fds
sys.argv = ["nvmlcheck", "--simulate", sys.argv[1], "--json", *sys.argv[2:]]
from nvmlcheck import cli
cli.script()
"""


@pytest.mark.parametrize("command", [["holders", "--timeout", "0"],
                                     ["kill", "--all-holders", "--yes", "--timeout", "0"]])
def test_timeout_0_reads_a_slow_scan_whole(tmp_path: Path, command: list[str]) -> None:
    # Its own process (the command line's watchdogs are on): the scan takes longer than a second, each read moves on.
    # Before, the watchdogs ended both 1 s after the reading began (exit 3; the kill printed two error reports, its
    # GPU watchdog's and its /proc one's).
    scenario = Scenario.h200().write(tmp_path / "s.txt")
    out = subprocess.run([sys.executable, "-c", SLOW_SCAN, str(scenario), *command], capture_output=True, text=True,
                         timeout=120, check=False, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "has not returned" not in out.stderr and out.stdout.count('"schema"') == 1, out.stdout


HUNG_LIST = """
import sys
sys.argv = ["nvmlcheck", "--simulate", sys.argv[1], "holders", "--timeout", "0"]
from nvmlcheck import cli
cli.script()
"""


def test_holders_timeout_0_still_ends_on_a_hung_gpu_reading(tmp_path: Path) -> None:
    # The whole-command watchdog is gone from `holders`; an NVML call that does not return is still ended by the
    # GPU watchdog, as a wait's one check is.
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", delay_ms=60_000)
    scenario = sc.write(tmp_path / "s.txt")
    out = subprocess.run([sys.executable, "-c", HUNG_LIST, str(scenario)], capture_output=True, text=True,
                         timeout=50, check=False, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 3, out.stderr
    assert "a GPU reading has not returned" in out.stderr, out.stderr


EXCLUDE_HUNG = """
import sys, time
stuck, scenario = int(sys.argv[1]), sys.argv[2]
from nvmlcheck._proc import procfs
real = procfs.cmdline
reads = []
def cmdline(pid, proc="/proc"):
    if pid == stuck:
        reads.append(pid)
        if len(reads) > 1:  # the holders reading gets it; the lock is taken before --exclude reads it again
            time.sleep(3600)
    return real(pid, proc)
procfs.cmdline = cmdline
sys.argv = ["nvmlcheck", "--simulate", scenario, "kill", "--all-holders", "--yes", "--exclude", "some-agent",
            "--timeout", "2"]
from nvmlcheck import cli
cli.script()
"""


def test_an_exclude_pattern_read_that_hangs_ends_the_kill_with_nothing_signalled(
        python_child: Callable[..., subprocess.Popen[bytes]], tmp_path: Path) -> None:
    # --exclude PATTERN reads each holder's command line again after the (bounded) holders reading: unwatched, a read
    # that hung there held the command past --timeout for good.
    scenario = Scenario.h200().write(tmp_path / "s.txt")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    holder = python_child(HOLD, str(tmp_path / "dev" / "nvidia0"))
    out = subprocess.run([sys.executable, "-c", EXCLUDE_HUNG, str(holder.pid), str(scenario)], capture_output=True,
                         text=True, timeout=60, check=False, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 3, out.stderr
    # The watchdog ends it; on a host too loaded to read the holders in 2 s, the reading's own cut comes first.
    assert "a /proc read has not returned" in out.stderr or "the holders could not all be read" in out.stderr
    assert "nothing was signalled" in out.stderr and holder.poll() is None


def test_an_nvml_holder_the_scan_did_not_list_is_read_again_not_said_to_have_no_device_file(
        python_child: Callable[..., subprocess.Popen[bytes]], tmp_path: Path,
        gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch) -> None:
    # A process that started after the scan listed /proc (a CUDA process NVML lists by the time it is described)
    # was said to have no NVIDIA device file open: files never read, and --all-on-gpu then refused the whole
    # selection ("names python, which has no NVIDIA device file open") or left it alone as unproven.
    from nvmlcheck._proc import devfiles

    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").write_text("")
    pattern = f"{tmp_path}/dev/nvidia[0-9]*"
    late = python_child(HOLD, str(tmp_path / "dev" / "nvidia0"))
    real = devfiles.scan

    def before_it_started(*args: object, **kwargs: object) -> devfiles.FdScan:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        return out._replace(holders={p: f for p, f in out.holders.items() if p != late.pid},
                            gpu_files={p: f for p, f in out.gpu_files.items() if p != late.pid})

    monkeypatch.setattr(devfiles, "scan", before_it_started)
    sc = Scenario.h200()
    sc.add_process(0, late.pid, used_bytes=1 << 30)
    with gpus(sc) as session:
        (h,) = [h for h in session.holders(device_files=pattern) if h.pid == late.pid]
    assert h.device_files == (str(tmp_path / "dev" / "nvidia0"),) and h.gpu_device_files == h.device_files
    assert h.found_by == frozenset({"nvml", "device-file"})
