"""The pure parts of two GPU benchmarks, checked here because their runs spend scarce GPU time:
``events_decision.py`` reads WaitResult's offsets against one time base, and ``agent_device_files.py`` records a probe
that exited before its descriptors were read instead of crashing (docs/data/h200-2026-12-01/agents.txt)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import cast

import nvmlcheck as nc

GPU = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", GPU / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_events_decision_times_are_offsets_made_absolute() -> None:
    times = load("events_decision").wait_times_ms
    # the wait started 5 ms after the signal; clean at +100 ms of it, confirmed at +120 ms; the observer at +104 ms
    killed = 7_000_000_000_000
    result = cast(nc.WaitResult, SimpleNamespace(started_ns=killed + 5_000_000, clean_ns=100_000_000,
                                                 confirmed_ns=120_000_000))
    got = times(result, killed, killed + 104_000_000)
    assert got == {"lag_ms": 1.0, "observer_clean_ms": 104.0, "nvmlcheck_clean_ms": 105.0, "verified_ms": 125.0}


def test_agent_device_files_records_a_probe_that_exited() -> None:
    bench = load("agent_device_files")
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    try:
        p.wait()
        assert bench.nvidia_files(p.pid, frozenset({195})) is None  # reaped: no /proc/PID/fd to read
        assert bench.probe(p, frozenset({195})) == {"alive": False, "exit": 3, "files": None}
    finally:
        p.kill()
        p.wait()
        assert p.stderr is not None
        p.stderr.close()


def test_agent_device_files_reads_a_live_probe() -> None:
    bench = load("agent_device_files")
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert bench.probe(p, frozenset({195})) == {"alive": True, "exit": None, "files": []}
    finally:
        p.kill()
        p.wait()
        for f in (p.stdin, p.stderr):
            assert f is not None
            f.close()
