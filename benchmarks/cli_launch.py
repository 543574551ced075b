"""The CLI as a launch script sees it: launch → first signal, signal → verified clean, clean → exit, and
``wait --timeout 0`` against interpreter start, a bare ``nvmlInit`` and ``nvidia-smi --query-gpu``.

An independent clock: the target records ``CLOCK_MONOTONIC`` (system-wide) in its SIGTERM handler, so "launch →
signal" is measured by the process that receives it, not by nvmlcheck. Every figure is the median of ``--runs``
runs, printed with min and max, and each ratio is taken within the same run. Goals (issue 12): launch → first
signal ≤ interpreter start + 10 ms; clean → exit ≤ 3 ms; ``wait --timeout 0`` ≤ interpreter + nvmlInit + 5 ms.

    python benchmarks/cli_launch.py --runs 15 [--bytes 1GiB] [--python /usr/bin/python3] [--json out.json]
    python benchmarks/cli_launch.py --simulate --runs 15     # the stub, for the mechanism on a machine without a GPU
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# The target: optionally holds GPU memory, then on SIGTERM records when it arrived and exits at once.
TARGET = r"""
import os, signal, sys, time
out, nbytes = sys.argv[1], int(sys.argv[2])
def on_term(signum, frame):
    t = time.monotonic_ns()
    with open(out, "w") as f:
        f.write(str(t))
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
if nbytes:
    from nvmlcheck.study.child import hold
    keep = hold(nbytes, 0)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

RAW_INIT = "import ctypes; lib = ctypes.CDLL('libnvidia-ml.so.1'); assert lib.nvmlInit_v2() == 0"


def _stats(values: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(values), "min_ms": min(values), "max_ms": max(values)}


def _time_command(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic_ns()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return (time.monotonic_ns() - t0) / 1e6


#: How a launch script runs nvmlcheck: the console script (pip's wrapper imports nvmlcheck.cli and calls script();
#: `-c` is the same without an installed wrapper) or `python -m nvmlcheck` (which adds runpy, ~3-6 ms).
ENTRIES = {"script": ["-c", "import sys; sys.argv[0] = 'nvmlcheck'; from nvmlcheck.cli import script; script()"],
           "module": ["-m", "nvmlcheck"]}


def _kill_once(python: str, env: dict[str, str], nbytes: int, simulate: bool, tmp: Path,
               *, backend: str, entry: str, text: bool) -> dict[str, float]:
    mark = tmp / "signalled"
    mark.unlink(missing_ok=True)
    target = subprocess.Popen([python, "-c", TARGET, str(mark), str(nbytes)], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert target.stdout is not None
        assert target.stdout.readline().strip() == "ready", "the target did not start"
        argv = [python, *ENTRIES[entry], "--backend", backend, "kill", str(target.pid), "--timeout", "20"]
        if not text:
            argv.insert(3, "--json")
        if simulate:
            from nvmlcheck.testing import Scenario

            scenario = Scenario.h200()
            scenario.add_process(0, target.pid, used_bytes=16 << 30, bound=True, list_ms=90, release_ms=120)
            argv[3:3] = ["--simulate", str(scenario.write(tmp / "scenario.txt"))]
        t_launch = time.monotonic_ns()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        t_exit = time.monotonic_ns()
    finally:
        if target.poll() is None:
            target.kill()
        target.wait()
    if done.returncode != 0:
        raise SystemExit(f"nvmlcheck kill exited {done.returncode}: {done.stderr.strip()}")
    if text:  # "clean: ... (confirmed +123.4 ms, resolution 1.50 ms)"
        last = done.stdout.strip().splitlines()[-1]
        confirmed = float(last.split("confirmed +")[1].split(" ms")[0]) * 1e6
        resolution = float(last.split("resolution ")[1].split(" ms")[0]) * 1e6
        doc: dict[str, Any] = {"confirmed_ns": confirmed, "resolution_ns": resolution}
    else:
        doc = json.loads(done.stdout)
    t_signal = int(mark.read_text())
    clean_at = t_signal + doc["confirmed_ns"]
    return {
        "launch_to_signal_ms": (t_signal - t_launch) / 1e6,
        "signal_to_clean_ms": doc["confirmed_ns"] / 1e6,
        "clean_to_exit_ms": (t_exit - clean_at) / 1e6,
        "total_ms": (t_exit - t_launch) / 1e6,
        "resolution_ms": doc["resolution_ns"] / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--bytes", default="1GiB", help="held by the kill target on GPU 0 (0: nothing)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs nvmlcheck")
    parser.add_argument("--simulate", action="store_true", help="the stub libnvidia-ml instead of a GPU")
    parser.add_argument("--backend", default="auto", choices=("auto", "nvml", "smi"), help="nvmlcheck's backend")
    parser.add_argument("--entry", default="script", choices=tuple(ENTRIES), help="how nvmlcheck is started")
    parser.add_argument("--text", action="store_true", help="kill prints its table, not --json")
    parser.add_argument("--json", metavar="FILE", help="write the figures here")
    args = parser.parse_args()
    from nvmlcheck.study.child import parse_size

    nbytes = 0 if args.simulate or args.bytes == "0" else parse_size(args.bytes)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    py = args.python
    result: dict[str, Any] = {"python": py, "runs": args.runs, "simulate": args.simulate, "bytes": nbytes,
                              "backend": args.backend, "entry": args.entry, "text": args.text}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        base: dict[str, list[float]] = {k: [] for k in ("pass", "import_cli", "raw_init", "wait0", "smi")}
        kills: list[dict[str, float]] = []
        wait0 = [py, *ENTRIES[args.entry], "--backend", args.backend, "wait", "--timeout", "0"]
        if args.simulate:
            wait0[3:3] = ["--simulate", "h200"]
        for _ in range(args.runs):  # interleaved, so a slow moment of the machine hits every command alike
            base["pass"].append(_time_command([py, "-c", "pass"], env))
            base["import_cli"].append(_time_command([py, "-c", "import nvmlcheck.cli"], env))
            base["wait0"].append(_time_command(wait0, env))
            if not args.simulate:
                base["raw_init"].append(_time_command([py, "-c", RAW_INIT], env))
                base["smi"].append(_time_command(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv"],
                                                 env))
            kills.append(_kill_once(py, env, nbytes, args.simulate, tmp, backend=args.backend, entry=args.entry,
                                    text=args.text))
    result["commands"] = {k: _stats(v) for k, v in base.items() if v}
    result["kill"] = {k: _stats([r[k] for r in kills]) for k in kills[0]}
    med = {k: v["median_ms"] for k, v in result["commands"].items()}
    kill = {k: v["median_ms"] for k, v in result["kill"].items()}
    ratios = {
        "import_cli_over_pass_ms": med["import_cli"] - med["pass"],
        "launch_to_signal_over_interpreter_ms": kill["launch_to_signal_ms"] - med["pass"],
    }
    if "raw_init" in med:
        ratios["wait0_over_raw_init_ms"] = med["wait0"] - med["raw_init"]
        ratios["wait0_over_smi"] = med["wait0"] / med["smi"]
    result["ratios"] = ratios
    for name, s in {**result["commands"], **result["kill"]}.items():
        print(f"{name:24s} median {s['median_ms']:8.2f} ms  (min {s['min_ms']:.2f}, max {s['max_ms']:.2f})")
    for name, v in ratios.items():
        print(f"{name:40s} {v:8.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
