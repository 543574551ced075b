"""What importing each module of a one-shot costs on this host, without ``-X importtime``'s own overhead.

The modules and their order are those a run of the command imports beyond a bare interpreter (read once from
``-X importtime`` of the console script's body; without a GPU point ``$NVMLCHECK_LIBNVML`` at the stub). For
each, a fresh interpreter imports the ones before it, then stamps ``perf_counter_ns`` around importing that one;
``--runs`` fresh interpreters per module, medians in µs, and their sum. Run from the repo root (the tree's modules,
byte-compiled first).

    python3 benchmarks/gpu/import_costs.py --python /usr/bin/python3 --runs 15 [--command "wait --timeout 0"]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The console script's body as a current pip writes it (not ``-m``: runpy brings importlib.util and threading).
SCRIPT = "import sys\nfrom nvmlcheck.cli import script\nsys.argv[0] = 'nvmlcheck'\nsys.exit(script())"
#: Modules a bare interpreter has already loaded (``-X importtime`` lists them too): not the command's.
BARE = "import sys; print(' '.join(sys.modules))"

CHILD = r"""
import importlib, sys, time
for name in sys.argv[1].split(",") if sys.argv[1] else ():
    importlib.import_module(name)
t = time.perf_counter_ns()
importlib.import_module(sys.argv[2])
print((time.perf_counter_ns() - t) / 1e3)
"""


def modules_of(py: str, command: list[str]) -> list[str]:
    """The modules the console script imports for ``COMMAND``, in order, less the bare interpreter's."""
    bare = set(subprocess.run([py, "-c", BARE], capture_output=True, text=True, check=True).stdout.split())
    done = subprocess.run([py, "-X", "importtime", "-c", SCRIPT, *command], cwd=ROOT, capture_output=True, text=True,
                          check=False)  # fmt: skip
    names = [line.rsplit("|", 1)[-1] for line in done.stderr.splitlines()
             if line.startswith("import time:") and "|" in line and "cumulative" not in line]  # fmt: skip
    # The lines come as each import ends, so site's own imports (its .pth files') all come before its line.
    start = next((i + 1 for i, n in enumerate(names) if n.strip() == "site" and not n.startswith("  ")), 0)
    out: list[str] = []
    for raw in names[start:]:
        name = raw.strip()
        if name not in bare and name not in out:
            out.append(name)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--command", default="ready", help="the one-shot whose imports are timed (default: ready)")
    args = ap.parse_args()
    subprocess.run([args.python, "-m", "compileall", "-q", str(ROOT / "nvmlcheck")], check=False)
    order = modules_of(args.python, args.command.split())
    total = 0.0
    print(f"{'module':32} {'median us':>10}   ({args.runs} fresh interpreters each, {args.python}, "
          f"nvmlcheck {args.command})")
    for i, name in enumerate(order):
        before = ",".join(order[:i])
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
