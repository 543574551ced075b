"""Soak: many snapshots and polls in one process, with no growth in file descriptors, child processes or memory
beyond a stated bound (tracemalloc for Python objects, the resident set for everything else, cffi buffers included).

The issue's counts (100,000 NVML snapshots, 8 threads x 10,000 snapshots, 10,000 nvidia-smi polls) run with
``NVMLCHECK_SOAK=full`` and take about 80 s on 2 cores (tracemalloc alone makes a snapshot ~3x slower); the default
run uses a fifth of them (~10 s). The figures measured at both counts are in docs/reliability.md; ``pytest -s``
prints them.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario

from ._support import FAKE_SMI_CMD, GIB, Smi, Stub, children, open_fds

pytestmark = [pytest.mark.stub, pytest.mark.slow]

FULL = os.environ.get("NVMLCHECK_SOAK") == "full"
NVML_SNAPSHOTS = 100_000 if FULL else 20_000
SMI_POLLS = 10_000 if FULL else 1_000
THREADS, PER_THREAD = 8, 10_000 if FULL else 2_000
#: Python memory still allocated after the soak beyond what the warm-up left (tracemalloc, after gc.collect()). A leak
#: of one small object per snapshot (~50 B) would exceed it well before 100,000 snapshots.
TRACED_BOUND = 256 * 1024
#: Resident set growth allowed (cffi buffers and C allocations are not traced by tracemalloc).
RSS_BOUND = 8 * 1024 * 1024
_PAGE = resource.getpagesize()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


@dataclass
class Growth:
    """What one soak left behind, measured against the state after its warm-up."""

    seconds: float
    traced_bytes: int
    traced_peak_bytes: int
    rss_bytes: int
    fds: set[int]
    fds_after: set[int]
    children_after: set[int]

    def check(self, label: str, count: int) -> None:
        print(
            f"\n{label}: {count} in {self.seconds:.2f} s ({self.seconds / count * 1e6:.1f} µs each); "
            f"traced growth {self.traced_bytes} B (peak {self.traced_peak_bytes} B over the start), "
            f"RSS growth {self.rss_bytes} B, fds {len(self.fds)} -> {len(self.fds_after)}, "
            f"children left {sorted(self.children_after)}"
        )
        assert self.fds_after == self.fds, "file descriptors leaked"
        assert not self.children_after, "child processes left behind"
        assert self.traced_bytes < TRACED_BOUND, f"Python memory grew by {self.traced_bytes} B"
        assert self.rss_bytes < RSS_BOUND, f"the resident set grew by {self.rss_bytes} B"


@contextmanager
def measured(warm: Callable[[], object]) -> Iterator[list[Growth]]:
    """Warm up with ``warm()``, then measure the block: yields a list that holds one :class:`Growth` afterwards."""
    for _ in range(1000):
        warm()
    out: list[Growth] = []
    gc.collect()
    tracemalloc.start()
    try:
        fds, rss = open_fds(), _rss()
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        start = time.perf_counter()
        yield out
        seconds = time.perf_counter() - start
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        out.append(Growth(seconds, current - base, peak - base, _rss() - rss, fds, open_fds(), children()))
    finally:
        tracemalloc.stop()


def _busy_pair() -> Scenario:
    """Two GPUs: one busy with a process of each kind, one whose process list answers NO_PERMISSION on every call
    (every snapshot then builds an exception and a DeviceFailure: the error path soaks too)."""
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    sc.add_process(0, 4_000_002, kind="graphics", used_bytes=None, holds_bytes=GIB)
    sc.add_process(0, 4_000_003, kind="mps", used_bytes=2 * GIB)
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", code=4, device=1)
    return sc


def test_soak_nvml_snapshots(stub: Stub) -> None:
    with stub.open(_busy_pair()) as gpus:

        def one() -> None:
            snap = gpus.snapshot(fields=nc.Fields.WAIT)
            assert len(snap.devices) == 1 and len(snap.failures) == 1

        with measured(one) as result:
            for _ in range(NVML_SNAPSHOTS):
                one()
        last = gpus.snapshot(fields=nc.Fields.WAIT)
    result[0].check("NVML snapshots", NVML_SNAPSHOTS)
    assert [p.pid for p in last.devices[0].processes or ()] == [4_000_001, 4_000_002, 4_000_003]
    assert stub.balanced()


def test_soak_8_threads_snapshots_balanced(stub: Stub) -> None:
    stub.write(_busy_pair())
    inits = stub.probe.init_total()
    errors: list[BaseException] = []
    counts = [0] * THREADS
    start = threading.Barrier(THREADS)

    def work(n: int) -> None:
        try:
            start.wait()
            with stub.open() as own:  # each thread its own session: concurrent acquire/release of the one init
                for _ in range(PER_THREAD):
                    snap = own.snapshot(fields=nc.Fields.WAIT)
                    if len(snap.devices) != 1 or len(snap.failures) != 1 or not snap.devices[0].processes:
                        raise AssertionError(f"inconsistent snapshot: {snap}")
                    counts[n] += 1
        except BaseException as exc:
            errors.append(exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    print(f"\n{THREADS} threads x {PER_THREAD} snapshots: {seconds:.2f} s, {stub.probe.init_total() - inits} init(s)")
    assert not errors, errors[:3]
    assert counts == [PER_THREAD] * THREADS
    assert stub.balanced()  # every init shut down, reference count 0


# --- nvidia-smi: canned answers -------------------------------------------------------------------------------------


@pytest.fixture
def canned_smi(smi: Smi) -> list[str]:
    """An nvidia-smi that answers each command line the backend uses with what the fake nvidia-smi printed for it
    (recorded once), in ~1 ms: the soak is about nvmlcheck's runner and parser, not the fake's start-up time."""
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    smi.write(sc)
    log = smi.tmp_path / "argv.jsonl"
    smi.knob("FAKE_SMI_ARGV_LOG", str(log))
    with smi.open() as gpus:
        gpus.snapshot(fields=nc.Fields.WAIT)
    smi.monkeypatch.delenv("FAKE_SMI_ARGV_LOG")
    lines = ["#!/bin/sh", 'case "$*" in']
    for i, argv in enumerate(dict.fromkeys(tuple(a) for a in map(json.loads, log.read_text().splitlines()))):
        run = subprocess.run([*FAKE_SMI_CMD, *argv], capture_output=True, text=True, check=True)
        out = Path(smi.tmp_path / f"answer{i}.txt")
        out.write_text(run.stdout)
        lines.append(f'  "{" ".join(argv)}") exec cat "{out}" ;;')
    lines += ['  *) echo "canned nvidia-smi: no answer for: $*" >&2; exit 2 ;;', "esac"]
    return [str(smi.script("canned-nvidia-smi", "\n".join(lines) + "\n"))]


def test_soak_nvidia_smi_polls(smi: Smi, canned_smi: list[str]) -> None:
    with smi.open(command=canned_smi) as gpus:

        def one() -> None:
            snap = gpus.snapshot(fields=nc.Fields.WAIT)
            assert len(snap.devices) == 2 and not snap.failures
            assert [p.pid for p in snap.devices[0].processes or ()] == [4_000_001]

        with measured(one) as result:
            for _ in range(SMI_POLLS):
                one()
    result[0].check("nvidia-smi polls", SMI_POLLS)
