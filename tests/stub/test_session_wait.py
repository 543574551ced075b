"""Session.wait_until_clean on the stub: what the session adds to the poller (probe, CPU accounting)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, build_stub

pytestmark = pytest.mark.stub
GIB = 1 << 30


def test_reaping_cpu_heavy_children_does_not_slow_the_polls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A launch script kills and reaps its workers during the wait: their CPU time lands in this process's
    # RUSAGE_CHILDREN. The duty cap must not charge it to the wait. One reap per poll for 12 polls fills most of the
    # cap's 15-cycle median window, so counting children would stretch the interval.
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.1: pass"
    workers = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(12)]
    for w in workers:  # let them all finish, unreaped (zombies): the reaps below then come one per poll
        os.waitid(os.P_PID, w.pid, os.WEXITED | os.WNOWAIT)
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)
    sc.at_ms(1000).set_device(0, used_bytes=0)
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "scenario.txt")))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    reaped: list[int] = []

    def on_poll(point: nc.TracePoint) -> None:
        for w in workers:
            if w.returncode is None and w.poll() is not None:  # poll() reaps it: one per poll
                reaped.append(point.offset_ns)
                return

    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        result = gpus.wait_until_clean(timeout=10, on_poll=on_poll, trace=True)
    assert len(reaped) == 12, "every worker should have been reaped during the wait"
    assert result.trace is not None
    during = [p.offset_ns for p in result.trace if reaped[0] <= p.offset_ns <= reaped[-1]]
    gaps = sorted(b - a for a, b in itertools.pairwise(during))
    median = gaps[len(gaps) // 2]
    # The default policy polls every ~1.1 ms; counting the children stretched it to the cap's ~6 ms ceiling.
    assert median < 3_000_000, f"polls stretched while workers were reaped: median gap {median / 1e6:.2f} ms"
