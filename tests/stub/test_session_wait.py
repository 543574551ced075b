"""Session.wait_until_clean on the stub: what the session adds to the poller (probe, CPU accounting)."""

from __future__ import annotations

import itertools
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
    # cap's 15-cycle median window, so counting children would stretch the interval to ~5 s.
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.25: pass"
    workers = [subprocess.Popen([sys.executable, "-c", burn]) for _ in range(12)]
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)
    sc.at_ms(3500).set_device(0, used_bytes=0)
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
    after = [p.offset_ns for p in result.trace if p.offset_ns >= reaped[0]]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert gaps and max(gaps) < 50_000_000, f"polls stretched after the reaps: {max(gaps) / 1e6:.1f} ms"
