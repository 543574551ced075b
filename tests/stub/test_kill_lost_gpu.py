"""A GPU lost mid-kill does not abandon the escalation (issue 27, item 8): a target that ignores SIGTERM is still
SIGKILLed when the grace period ends, and the error (document or exception) carries every target's record."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.kill import kill_records
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

GPU_IS_LOST = 15
# Catches SIGTERM and carries on (a handler, not SIG_IGN: a signal the kernel would discard gets SIGKILL at once).
IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); print('ready', flush=True); "
               "time.sleep(60)")


@pytest.fixture
def stubborn() -> Iterator[subprocess.Popen[bytes]]:
    """A process that survives SIGTERM (reaped whatever happens)."""
    p = subprocess.Popen([sys.executable, "-S", "-c", IGNORE_TERM], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    yield p
    if p.poll() is None:
        p.kill()
    p.wait()
    p.stdout.close()


def _losing_gpu(pid: int, after_ms: int) -> Scenario:
    """GPU 0 held by ``pid``, falling off the bus ``after_ms`` after the scenario is loaded."""
    sc = Scenario.h200()
    sc.add_process(0, pid, used_bytes=1 << 30, bound=True)
    step = sc.at_ms(after_ms)
    step.fault("nvmlDeviceGetMemoryInfo_v2", GPU_IS_LOST)
    step.fault("nvmlDeviceGetComputeRunningProcesses_v3", GPU_IS_LOST)
    return sc


def test_the_escalation_finishes_after_the_gpu_is_lost_and_the_error_names_the_targets(
    stubborn: subprocess.Popen[bytes], gpus: Callable[[Scenario], nc.Session]
) -> None:
    with gpus(_losing_gpu(stubborn.pid, 200)) as session:
        plan = nc.prepare_kill([stubborn.pid])
        plan.send_first(signal.SIGTERM)
        with pytest.raises(nc.GpuLost) as info:
            plan.wait(session, timeout=30, grace_s=1.0)
    (record,) = kill_records(info.value) or ()
    assert record.pid == stubborn.pid
    assert [s.name for s in record.signals] == ["SIGTERM", "SIGKILL"]
    assert record.exited_ns is not None and record.killed_ns is not None
    assert stubborn.wait(timeout=10) == -signal.SIGKILL


def test_with_grace_never_nothing_more_is_sent_and_the_records_still_come(
    stubborn: subprocess.Popen[bytes], gpus: Callable[[Scenario], nc.Session]
) -> None:
    with gpus(_losing_gpu(stubborn.pid, 100)) as session:
        plan = nc.prepare_kill([stubborn.pid])
        plan.send_first(signal.SIGTERM)
        with pytest.raises(nc.GpuLost) as info:
            plan.wait(session, timeout=30, grace_s=None)
    (record,) = kill_records(info.value) or ()
    assert [s.name for s in record.signals] == ["SIGTERM"] and record.exited_ns is None
    assert stubborn.poll() is None  # asked for no escalation: none happened


def test_the_cli_error_document_carries_the_targets(
    stubborn: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    path = _losing_gpu(stubborn.pid, 300).write(tmp_path / "scenario.txt")
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--simulate", str(path), "--json", "kill",
                           str(stubborn.pid), "--grace", "1", "--timeout", "30"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 3, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "nvmlcheck/error" and doc["error"]["type"] == "GpuLost"
    (target,) = doc["pids"]
    assert target["pid"] == stubborn.pid and [s["signal"] for s in target["signals"]] == ["SIGTERM", "SIGKILL"]
    assert target["exited_ns"] is not None
    assert stubborn.wait(timeout=10) == -signal.SIGKILL
