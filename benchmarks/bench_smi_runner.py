"""What ``SmiRunner.run`` costs per run on top of the program it runs: spawn, pumping both pipes, reaping.

Two source trees (e.g. before and after a change to ``nvmlcheck/_proc/child.py`` or the runner) are compared in
alternating batches, each batch in a fresh interpreter with that tree first on ``sys.path``, so that drift of the
machine (other load, CPU frequency) falls on both alike; medians per run are reported, with the ratio after/before::

    git archive BASE | tar -x -C /tmp/base
    python benchmarks/bench_smi_runner.py --before /tmp/base            # --after defaults to this checkout
    python benchmarks/bench_smi_runner.py --before /tmp/base --runs 200 --batches 10

Two programs: ``/bin/true`` (the runner's own overhead dominates) and the fake nvidia-smi (``stubs/
fake_nvidia_smi.py`` under ``python -S``, ~15 ms a run: what a poll pays). Both trees run the same fake.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "stubs" / "fake_nvidia_smi.py"
QUERY = ("--query-gpu=index,uuid", "--format=csv,nounits")
PROGRAMS = {"true": ["/bin/true"], "fake-smi": [sys.executable, "-S", str(FAKE)]}


def worker(program: str, runs: int) -> None:
    """In the tree on sys.path: time ``runs`` runs (after 3 unmeasured) and print (wall, this process's CPU)
    nanoseconds per run as JSON."""
    from nvmlcheck.backends.smi import SmiRunner

    runner = SmiRunner(command=PROGRAMS[program], timeout_s=30.0)
    for _ in range(3):
        runner.run(QUERY)
    times: list[tuple[int, int]] = []
    for _ in range(runs):
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        result = runner.run(QUERY)
        times.append((time.perf_counter_ns() - t0, time.process_time_ns() - c0))
        if result.returncode != 0:
            raise SystemExit(f"{program} exited {result.returncode}: {result.output}")
    print(json.dumps(times))


def batch(tree: Path, program: str, runs: int, scenario: Path) -> list[tuple[int, int]]:
    env = {**os.environ, "PYTHONPATH": str(tree), "NVMLCHECK_STUB_SCENARIO": str(scenario)}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", program, "--runs", str(runs)],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    return [(wall, cpu) for wall, cpu in json.loads(out)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="the source tree to compare against (its root, holding nvmlcheck/)")
    ap.add_argument("--after", type=Path, default=ROOT, help="the source tree measured (default: this checkout)")
    ap.add_argument("--runs", type=int, default=200, help="runs per program and tree (default 200)")
    ap.add_argument("--batches", type=int, default=10, help="alternating batches the runs are split into")
    ap.add_argument("--worker", choices=sorted(PROGRAMS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker, args.runs)
        return
    trees = {"after": args.after.resolve()}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    per_batch = max(1, args.runs // args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        scenario = Path(tmp) / "scenario.txt"
        scenario.write_text("nvmlcheck-stub-scenario 1\ndevice index=0\n", encoding="utf-8")
        for program in PROGRAMS:
            times: dict[str, list[tuple[int, int]]] = {name: [] for name in trees}
            for b in range(args.batches):
                order = list(trees) if b % 2 == 0 else list(reversed(trees))
                for name in order:
                    times[name] += batch(trees[name], program, per_batch, scenario)
            for i, what in enumerate(("wall, median", "runner's own CPU, mean")):
                # The CPU time of the calling process is what the runner itself spends (spawn, pumping, reaping):
                # steadier than wall time on a loaded machine, which mostly measures the child and the scheduler.
                stat = statistics.median if i == 0 else statistics.fmean
                value = {name: stat(t[i] for t in ts) / 1e6 for name, ts in times.items()}
                line = ", ".join(f"{name} {v:.3f} ms" for name, v in value.items())
                if "before" in value:
                    line += f", ratio after/before {value['after'] / value['before']:.3f}"
                print(f"{program:>9} ({what}, n={per_batch * args.batches}): {line}")


if __name__ == "__main__":
    main()
