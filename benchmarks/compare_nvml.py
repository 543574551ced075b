"""One run, every reference side by side: per-call cost of nvmlcheck's typed NVML calls against the raw cffi call
and nvidia-ml-py, a full-device snapshot against the sum of the raw calls it makes, `import nvmlcheck` against a
bare interpreter, and one nvidia-smi poll when nvidia-smi exists.

    python benchmarks/compare_nvml.py [--json out.json] [--number 20000] [--repeats 5]

On a machine without a GPU, run it against the stub (figures then describe the stub, not a driver):

    NVMLCHECK_LIBNVML=... NVMLCHECK_STUB_SCENARIO=... python benchmarks/compare_nvml.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nvml_cases import interleaved_ns, open_cases, symbol_costs


def _run_ms(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        subprocess.run(argv, check=True, capture_output=True)
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def importtime_ms(module: str, runs: int = 11) -> float:
    """Median of ``python -X importtime -c 'import MODULE'``'s cumulative figure for MODULE: its own import cost,
    free of the interpreter's start-up noise."""
    values = []
    for _ in range(runs):
        err = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", f"import {module}"], check=True, capture_output=True, text=True
        ).stderr
        line = next(x for x in reversed(err.splitlines()) if x.rstrip().endswith(f"| {module}"))
        values.append(int(line.split("|")[1]) / 1000)
    return statistics.median(values)


def import_cost_ms(runs: int = 21) -> dict[str, float]:
    """Median wall time of `python -c pass` and `python -c 'import nvmlcheck'` (and with -S)."""
    exe = sys.executable
    return {
        "importtime_nvmlcheck_ms": importtime_ms("nvmlcheck"),
        "python_pass_ms": _run_ms([exe, "-c", "pass"], runs),
        "python_import_nvmlcheck_ms": _run_ms([exe, "-c", "import nvmlcheck"], runs),
        "python_import_nvmlcheck_open_ms": _run_ms(
            [exe, "-c", "import nvmlcheck as nc; nc.open('nvml').snapshot(fields=nc.Fields.WAIT)"], runs
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write all figures here")
    parser.add_argument("--number", type=int, default=5_000, help="calls per timed loop")
    parser.add_argument("--repeats", type=int, default=15, help="timed loops per case (the minimum is kept)")
    args = parser.parse_args()

    cases = open_cases()
    results: dict[str, dict[str, float]] = {}
    for name in cases.raw:
        n = args.number if "snapshot" not in name else max(args.number // 10, 100)
        if name == "full_snapshot":
            n = 50  # on an H200 one of its calls costs milliseconds (see symbols below)
        variants = {"raw_cffi_ns": cases.raw[name], "nvmlcheck_ns": cases.typed[name]}
        if name in cases.reference:
            variants["nvidia_ml_py_ns"] = cases.reference[name]
        results[name] = interleaved_ns(variants, n, args.repeats)
    symbols = symbol_costs(cases)
    system = cases.backend.system()
    device = cases.backend.snapshot([0], fields=__import__("nvmlcheck").Fields(0)).devices[0]
    cases.close()

    extra: dict[str, float] = import_cost_ms()
    smi = shutil.which("nvidia-smi")
    if smi and not os.environ.get("NVMLCHECK_LIBNVML"):
        extra["nvidia_smi_query_gpu_ms"] = _run_ms(
            [smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"], 15
        )

    print(f"device: {device.name} ({device.uuid}); driver {system.driver_version}; NVML {system.nvml_version}")
    print(f"host: {platform.node()} {platform.machine()} Python {platform.python_version()}")
    print(f"{'case':<15}{'raw cffi':>12}{'nvmlcheck':>12}{'nvidia-ml-py':>14}{'ours/raw':>10}{'ours/nvml-py':>14}")
    for name, row in results.items():
        raw, ours = row["raw_cffi_ns"], row["nvmlcheck_ns"]
        ref = row.get("nvidia_ml_py_ns")
        ref_txt = f"{ref / 1000:>12.2f}us" if ref else f"{'-':>14}"
        ratio_ref = f"{ours / ref:>14.2f}" if ref else f"{'-':>14}"
        print(f"{name:<15}{raw / 1000:>10.2f}us{ours / 1000:>10.2f}us{ref_txt}{ours / raw:>10.2f}{ratio_ref}")
    for key, value in extra.items():
        print(f"{key:<36}{value:>10.2f}")
    print("raw C symbol costs (µs per call, best of 5 x 200):")
    for key, value in symbols.items():
        print(f"  {key:<44}{value / 1000:>10.2f}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": device.name,
                    "driver": system.driver_version,
                    "nvml": system.nvml_version,
                    "host": platform.node(),
                    "python": platform.python_version(),
                    "library": os.environ.get("NVMLCHECK_LIBNVML", "libnvidia-ml.so.1"),
                    "per_call": results,
                    "symbols_ns": symbols,
                    "process": extra,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
