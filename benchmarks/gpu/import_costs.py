"""What importing each module of a one-shot costs on this host, without ``-X importtime``'s own overhead.

For each module in the order a one-shot imports it, a fresh interpreter imports the ones before it, then stamps
``perf_counter_ns`` around importing that one (its own cost, its imports not already loaded included); ``--runs``
fresh interpreters per module, medians in µs. Run from the repo root (the tree's modules, byte-compiled first).

    python3 benchmarks/gpu/import_costs.py --python /usr/bin/python3 --runs 15
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ORDER = (
    "_cffi_backend", "nvmlcheck._nvml.library", "nvmlcheck.cli._common", "nvmlcheck.cli._main", "functools", "enum",
    "collections", "nvmlcheck.errors", "nvmlcheck._record", "nvmlcheck._record_methods", "nvmlcheck.model",
    "nvmlcheck.predicates", "nvmlcheck.backends.nvml", "nvmlcheck.session", "nvmlcheck._waitoptions",
    "nvmlcheck.wait", "nvmlcheck._readings", "nvmlcheck.verdict", "nvmlcheck.readiness", "nvmlcheck.cli._ready",
)
CHILD = r"""
import importlib, sys, time
for name in sys.argv[1].split(",") if sys.argv[1] else ():
    importlib.import_module(name)
t = time.perf_counter_ns()
importlib.import_module(sys.argv[2])
print((time.perf_counter_ns() - t) / 1e3)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    subprocess.run([args.python, "-m", "compileall", "-q", str(ROOT / "nvmlcheck")], check=False)
    total = 0.0
    print(f"{'module':32} {'median us':>10}   ({args.runs} fresh interpreters each, {args.python})")
    for i, name in enumerate(ORDER):
        before = ",".join(ORDER[:i])
        got = []
        for _ in range(args.runs):
            done = subprocess.run([args.python, "-c", CHILD, before, name], cwd=ROOT, capture_output=True, text=True,
                                  check=False)  # fmt: skip
            if done.returncode:
                print(f"{name}: {done.stderr.strip()[-300:]}")
                return 1
            got.append(float(done.stdout))
        med = statistics.median(got)
        total += med
        print(f"{name:32} {med:10.0f}")
    print(f"{'sum':32} {total:10.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
