"""What the smi backend adds to a poll on top of nvidia-smi itself (pytest-benchmark, plus a one-shot summary).

One poll (``Fields.WAIT``) of 8 GPUs is one ``--query-gpu`` run and one ``-q -d PIDS`` run, started together. nvidia-smi
takes ~20 ms a run on an H200 (FACTS.md), so the budgets are: parsing one poll's output < 2 % of that (400 µs), and the
whole per-poll overhead above the nvidia-smi processes themselves (argv, spawn bookkeeping, parse, assembly) < 1 ms.

    pytest benchmarks/bench_smi_parser.py --benchmark-enable
    python benchmarks/bench_smi_parser.py              # parse cost, and overhead over an instant stand-in nvidia-smi
    python benchmarks/bench_smi_parser.py --real       # on a GPU host: snapshot() next to the same raw nvidia-smi runs

The stand-in is a shell script that prints prepared output, so "overhead" there is measured against running that
script the same way with bare ``subprocess`` (same argv, same parallelism, no parsing): the difference is ours.

Measured 2026-11-29 on the H200 host (driver 580.159.04, Python 3.12.3; ``--real --rounds 150``):

| | pids (default) | compute-apps |
| --- | --- | --- |
| parse + assemble one poll, 8 GPUs x 2 processes | 340 µs (1.3 % of a 26 ms poll) | 310-357 µs |
| snapshot(), median | 26.42 ms | 24.65 ms |
| the same two nvidia-smi runs, raw, in parallel | 26.37 ms | 24.36 ms |
| overhead above nvidia-smi itself, median | 0.05 ms | 0.28 ms |
| the same two runs one after the other | 46.9 ms | 47.0 ms |

Run-to-run noise of nvidia-smi (± 2 ms) is larger than the overhead; the parse figure is the firmer bound. The two runs
of a poll overlap, which is why a snapshot takes one nvidia-smi run's time rather than two.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from nvmlcheck.backends import smi_csv
from nvmlcheck.backends.smi import SmiBackend
from nvmlcheck.model import Fields

try:
    from pytest_benchmark.fixture import BenchmarkFixture
except ImportError:  # pragma: no cover - the one-shot summary works without pytest-benchmark
    BenchmarkFixture = object  # type: ignore[assignment,misc]

GPUS = 8
PROCS_PER_GPU = 2
WAIT_FIELDS = ("index", "uuid", "memory.total", "memory.used", "memory.free", "memory.reserved", "pci.bus_id",
               "mig.mode.current")
APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
IDENTITY_FIELDS = ("index", "uuid", "name", "pci.bus_id", "serial", "driver_version")


def uuid(i: int) -> str:
    return f"GPU-5d8f27a5-002a-ffba-d62e-d05aa034c2{i:02x}"


def pci(i: int) -> str:
    return f"00000000:{0x18 + i:02X}:00.0"


def query_gpu_text() -> str:
    """``--query-gpu`` of a WAIT poll of 8 busy H200s, as driver 580 prints it with ``csv,nounits``."""
    head = ("index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB], pci.bus_id, "
            "mig.mode.current")
    rows = [f"{i}, {uuid(i)}, 143771, {1551 + i}, {141604 - i}, 616, {pci(i)}, Disabled" for i in range(GPUS)]
    return "\n".join([head, *rows]) + "\n"


def identity_text() -> str:
    head = "index, uuid, name, pci.bus_id, serial, driver_version"
    rows = [f"{i}, {uuid(i)}, NVIDIA H200, {pci(i)}, 16550240270{i:02d}, 580.159.04" for i in range(GPUS)]
    return "\n".join([head, *rows]) + "\n"


def apps_text() -> str:
    head = "gpu_uuid, pid, process_name, used_gpu_memory [MiB]"
    rows = [
        f"{uuid(i)}, {1000 + i * 10 + k}, /usr/bin/python3 -m sglang.launch_server? tp {k}, {1542 + k}"
        for i in range(GPUS)
        for k in range(PROCS_PER_GPU)
    ]
    return "\n".join([head, *rows]) + "\n"


def pids_text() -> str:
    out = ["", "==============NVSMI LOG==============", "", f"{'Timestamp':<55}: Sun Nov 29 06:46:23 2026",
           f"{'Driver Version':<55}: 580.159.04", f"{'CUDA Version':<55}: 13.0", "",
           f"{'Attached GPUs':<55}: {GPUS}"]  # fmt: skip
    for i in range(GPUS):
        out += [f"GPU {pci(i)}", "    Processes"]
        for k in range(PROCS_PER_GPU):
            out += [
                f"        {'GPU instance ID':<34}: N/A",
                f"        {'Compute instance ID':<34}: N/A",
                f"        {'Process ID':<34}: {1000 + i * 10 + k}",
                f"            {'Type':<30}: C",
                f"            {'Name':<30}: /usr/bin/python3 -m sglang.launch_server, tp {k}",
                f"            {'Used GPU Memory':<30}: {1542 + k} MiB",
            ]
    return "\n".join([*out, ""]) + "\n"


QUERY_GPU = query_gpu_text()
APPS = apps_text()
PIDS = pids_text()


def parse_poll_pids() -> int:
    """What snapshot() does with one WAIT poll's text (default process query): parse both, assemble 8 devices."""
    records, _ = smi_csv.parse_query_gpu(QUERY_GPU, WAIT_FIELDS)
    listing = smi_csv.parse_pids_query(PIDS)
    states = []
    for r in records:
        key = r.pci_bus_id or ""
        lists = smi_csv.ProcessLists(listing.compute[key], listing.graphics[key], listing.mps[key])
        states.append(smi_csv.build_device_state(r, Fields.WAIT, processes=lists))
    return len(states)


def parse_poll_csv() -> int:
    """The same with ``process_query="compute-apps"``."""
    records, _ = smi_csv.parse_query_gpu(QUERY_GPU, WAIT_FIELDS)
    listing = smi_csv.parse_compute_apps(APPS, APPS_FIELDS)
    states = []
    for r in records:
        lists = smi_csv.ProcessLists(listing.by_gpu.get(r.uuid, ()), None, None)
        states.append(smi_csv.build_device_state(r, Fields.WAIT, processes=lists))
    return len(states)


# --- an instant stand-in for nvidia-smi ---------------------------------------------------------------------------

STANDIN = """#!/bin/sh
d=$(dirname "$0")
case "$*" in
  *--query-gpu=index,uuid,name*) cat "$d/identity.txt" ;;
  *--query-gpu=*pci.bus_id*) cat "$d/gpu.txt" ;;
  *--query-gpu=*) cat "$d/gpu_no_pci.txt" ;;
  *PIDS*) cat "$d/pids.txt" ;;
  *--query-compute-apps=*) cat "$d/apps.txt" ;;
  *--version*) printf 'NVIDIA-SMI version  : 580.159.04\\nCUDA Version        : 13.0\\n' ;;
esac
"""


def make_standin(directory: Path) -> Path:
    col = WAIT_FIELDS.index("pci.bus_id")  # the query without it: the same rows less that column
    no_pci = "".join(", ".join(c for i, c in enumerate(line.split(", ")) if i != col) + "\n"
                     for line in QUERY_GPU.splitlines())
    texts = (("identity", identity_text()), ("gpu", QUERY_GPU), ("gpu_no_pci", no_pci), ("pids", PIDS), ("apps", APPS))
    for name, text in texts:
        (directory / f"{name}.txt").write_text(text, encoding="utf-8")
    script = directory / "nvidia-smi"
    script.write_text(STANDIN, encoding="utf-8")
    script.chmod(0o755)
    return script


def raw_runs(argvs: Sequence[Sequence[str]]) -> int:
    """The floor: the same commands, started together, read to the end; nothing parsed."""
    procs = [subprocess.Popen(a, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for a in argvs]
    return sum(len(p.communicate()[0]) for p in procs)


def poll_argvs(command: str, process_query: str) -> list[list[str]]:
    """The argv lists SmiBackend.snapshot(fields=Fields.WAIT) runs."""
    fmt = "--format=csv,nounits"
    if process_query != "pids":
        return [[command, "--query-gpu=" + ",".join(f for f in WAIT_FIELDS if f != "pci.bus_id"), fmt],
                [command, "--query-compute-apps=" + ",".join(APPS_FIELDS), fmt]]  # fmt: skip
    processes = (
        ["-q", "-d", "PIDS"] if process_query == "pids" else ["--query-compute-apps=" + ",".join(APPS_FIELDS), fmt]
    )
    return [[command, "--query-gpu=" + ",".join(WAIT_FIELDS), fmt], [command, *processes]]


# --- pytest-benchmark -------------------------------------------------------------------------------------------------


def test_parse_query_gpu_8(benchmark: BenchmarkFixture) -> None:
    records, _ = benchmark(smi_csv.parse_query_gpu, QUERY_GPU, WAIT_FIELDS)
    assert len(records) == GPUS


def test_parse_compute_apps_16(benchmark: BenchmarkFixture) -> None:
    listing = benchmark(smi_csv.parse_compute_apps, APPS, APPS_FIELDS)
    assert sum(len(v) for v in listing.by_gpu.values()) == GPUS * PROCS_PER_GPU


def test_parse_pids_8(benchmark: BenchmarkFixture) -> None:
    listing = benchmark(smi_csv.parse_pids_query, PIDS)
    assert sum(len(v) for v in listing.compute.values()) == GPUS * PROCS_PER_GPU


@pytest.mark.parametrize("flavour", ["pids", "compute-apps"])
def test_parse_one_poll(benchmark: BenchmarkFixture, flavour: str) -> None:
    assert benchmark(parse_poll_pids if flavour == "pids" else parse_poll_csv) == GPUS


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_standin(tmp_path_factory.mktemp("standin"))


def test_snapshot_over_standin(benchmark: BenchmarkFixture, standin: Path) -> None:
    backend = SmiBackend(command=str(standin))
    snap = benchmark(backend.snapshot, None, Fields.WAIT)
    assert len(snap.devices) == GPUS


def test_raw_runs_of_standin(benchmark: BenchmarkFixture, standin: Path) -> None:
    assert benchmark(raw_runs, poll_argvs(str(standin), "pids")) > 0


# --- one-shot summary -------------------------------------------------------------------------------------------------


def per_call_us(fn: Callable[[], object], loops: int = 2000, repeats: int = 5) -> float:
    """Best of ``repeats`` of the mean over ``loops`` calls, in µs (after a warm-up: an idle CPU starts slow)."""
    deadline = time.perf_counter() + 0.3
    while time.perf_counter() < deadline:
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / loops / 1e3)
    return best


def interleaved_ms(a: Callable[[], object], b: Callable[[], object], rounds: int) -> tuple[list[float], list[float]]:
    """Run a and b alternately (so drift hits both), returning each one's wall times in ms."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(rounds):
        for fn, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter_ns()
            fn()
            out.append((time.perf_counter_ns() - t0) / 1e6)
    return ta, tb


def overhead(command: str, process_query: str, rounds: int) -> dict[str, float]:
    backend = SmiBackend(command=command, process_query=process_query)  # type: ignore[arg-type]
    snap_ms, raw_ms = interleaved_ms(
        lambda: backend.snapshot(None, Fields.WAIT), lambda: raw_runs(poll_argvs(command, process_query)), rounds
    )
    seq_ms = interleaved_ms(lambda: [raw_runs([a]) for a in poll_argvs(command, process_query)], lambda: None, rounds)[
        0
    ]
    return {
        "snapshot_median_ms": statistics.median(snap_ms),
        "raw_parallel_median_ms": statistics.median(raw_ms),
        "raw_sequential_median_ms": statistics.median(seq_ms),
        "overhead_median_ms": statistics.median(snap_ms) - statistics.median(raw_ms),
        "snapshot_min_ms": min(snap_ms),
        "raw_parallel_min_ms": min(raw_ms),
        "overhead_min_ms": min(snap_ms) - min(raw_ms),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--real", action="store_true", help="measure against the nvidia-smi on PATH")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    figures: dict[str, object] = {
        "machine": os.uname().nodename,
        "python": sys.version.split()[0],
        "parse_us": {
            "query_gpu_8": per_call_us(lambda: smi_csv.parse_query_gpu(QUERY_GPU, WAIT_FIELDS)),
            "compute_apps_16": per_call_us(lambda: smi_csv.parse_compute_apps(APPS, APPS_FIELDS)),
            "pids_8x2": per_call_us(lambda: smi_csv.parse_pids_query(PIDS)),
            "one_poll_pids": per_call_us(parse_poll_pids),
            "one_poll_compute_apps": per_call_us(parse_poll_csv),
        },
    }
    with tempfile.TemporaryDirectory() as tmp:
        standin = str(make_standin(Path(tmp)))
        figures["standin"] = {q: overhead(standin, q, args.rounds) for q in ("pids", "compute-apps")}
    if args.real:
        figures["real"] = {q: overhead("nvidia-smi", q, args.rounds) for q in ("pids", "compute-apps")}
    text = json.dumps(figures, indent=1, default=lambda x: round(x, 3) if isinstance(x, float) else x)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
