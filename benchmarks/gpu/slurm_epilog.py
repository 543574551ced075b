"""``nvmlcheck slurm epilog`` as slurmd runs it, timed end to end, against the sleep-based epilogs it replaces.

Two cases, ``--runs`` times each, on ``--gpus`` GPUs (one job worker per GPU, holding ``--bytes``):

A. *clean end*: the job's workers have just been SIGKILLed (as Slurm does at the end of a job) when the epilog
   starts; it only waits for the memory to come back.
B. *orphan*: the workers are alive at the start (they left the job); the epilog finds them by ``SLURM_JOB_ID`` in
   their environment and their user, kills them, and waits.

Each run is the whole command (``python -m nvmlcheck slurm epilog --no-drain``: interpreter start, NVML, the wait),
its wall time measured here, and the epilog's own record (``--record``: polls, when the GPUs were first clean, the
kill). No Slurm is needed: the environment slurmd would give is set by hand. Prints a table and writes
``slurm_epilog.json`` to ``--out`` (default ``$OUT`` or ``.``). Bounded: every epilog has ``--timeout 30``.

    python3 benchmarks/gpu/slurm_epilog.py --gpus 1 --bytes 8GiB --runs 10              # a real GPU
    python3 benchmarks/gpu/slurm_epilog.py --simulate --gpus 1 --runs 10                # the stub (120 ms release)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: A job worker on a real GPU: holds memory through the CUDA driver API until killed.
WORKER = r"""
import sys, time
from nvmlcheck.study.child import hold, parse_size
keep = hold(parse_size(sys.argv[1]), int(sys.argv[2]))
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

#: What the common epilogs wait, from their scripts (docs/slurm.md cites them): a fixed time, whatever the GPUs do.
SLEEP_BASED_S = {"DeepOps epilog (sleep 5)": 5.0, "Meta GCM (3 polls x 3 s)": 9.0}


def _parse_size(text: str) -> int:
    from nvmlcheck._units import parse_size

    return parse_size(text)


def _start_workers(args: argparse.Namespace, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    workers = []
    for gpu in range(args.gpus):
        if args.simulate:
            argv = [sys.executable, "-S", "-c", "import time; print('ready', flush=True); time.sleep(3600)"]
        else:
            argv = [args.python, "-c", WORKER, args.bytes, str(gpu)]
        w = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert w.stdout is not None
        if w.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"worker on GPU {gpu} did not start")
        workers.append(w)
    return workers


def _scenario(args: argparse.Namespace, workers: list[subprocess.Popen[bytes]], path: Path) -> None:
    from nvmlcheck.testing import Scenario

    sc = Scenario.h200(devices=args.gpus)
    for gpu, w in enumerate(workers):
        sc.add_process(gpu, w.pid, used_bytes=_parse_size(args.bytes), bound=True, list_ms=args.list_ms,
                       release_ms=args.release_ms)
    sc.write(path)


def one_run(args: argparse.Namespace, case: str, work: Path) -> dict[str, Any]:
    # The project first, then what the caller's PYTHONPATH holds (cffi installed from wheels on a GPU host).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    job_env = {**os.environ, "SLURM_JOB_ID": "4242", "PYTHONPATH": path}
    workers = _start_workers(args, job_env)
    try:
        scenario = work / "scenario.txt"
        if args.simulate:
            _scenario(args, workers, scenario)
        if case == "clean":
            for w in workers:
                w.send_signal(signal.SIGKILL)
            for w in workers:
                w.wait()
        record = work / "record.jsonl"
        record.unlink(missing_ok=True)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": path, "SLURM_JOB_ID": "4242",
               "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": ",".join(map(str, range(args.gpus))),
               "SLURMD_NODENAME": "bench", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}
        if "NVMLCHECK_STUB_CACHE" in os.environ:
            env["NVMLCHECK_STUB_CACHE"] = os.environ["NVMLCHECK_STUB_CACHE"]
        argv = [args.python, "-m", "nvmlcheck", *(["--simulate", str(scenario)] if args.simulate else []),
                "slurm", "epilog", "--timeout", "30", "--no-drain", "--record", str(record)]
        t0 = time.monotonic_ns()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
        wall_ms = (time.monotonic_ns() - t0) / 1e6
        doc = json.loads(record.read_text().splitlines()[-1]) if record.exists() else {}
        readiness = doc.get("readiness") or {}
        return {
            "case": case,
            "exit_code": done.returncode,
            "stderr": done.stderr.strip()[-300:],
            "wall_ms": wall_ms,
            "epilog_ms": doc.get("elapsed_ns", 0) / 1e6,
            "first_clean_ms": None if readiness.get("first_clean_ns") is None else readiness["first_clean_ns"] / 1e6,
            "polls": readiness.get("polls"),
            "killed": [k["pid"] for k in doc.get("killed", [])],
            "exited_ms": [None if k["exited_ns"] is None else k["exited_ns"] / 1e6 for k in doc.get("killed", [])],
        }
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait()


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):8.1f} (min {min(values):.1f}, max {max(values):.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--bytes", default="8GiB")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--simulate", action="store_true", help="the stub libnvidia-ml instead of a GPU")
    ap.add_argument("--release-ms", type=int, default=120,
                    help="(--simulate) memory back this long after a worker is gone (H200: one context ~110-125 ms)")
    ap.add_argument("--list-ms", type=int, default=90, help="(--simulate) off the process list this long after")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="nvmlcheck-slurm-bench-") as tmp:
        for _ in range(args.runs):
            for case in ("clean", "orphan"):
                results.append(one_run(args, case, Path(tmp)))
    bad = [r for r in results if r["exit_code"] != 0]
    where = f"SIMULATED (stub, release {args.release_ms} ms)" if args.simulate else "real GPU"
    print(f"nvmlcheck slurm epilog, {where}, {args.gpus} GPU(s) x {args.bytes}, {args.runs} runs per case; "
          "ms: median (min, max)")
    for case in ("clean", "orphan"):
        rs = [r for r in results if r["case"] == case and r["exit_code"] == 0]
        clean = [r["first_clean_ms"] for r in rs if r["first_clean_ms"] is not None]
        print(f"  {case:<7} whole command {_stats([r['wall_ms'] for r in rs])}   "
              f"epilog {_stats([r['epilog_ms'] for r in rs])}   GPUs clean after {_stats(clean)}")
    for name, seconds in SLEEP_BASED_S.items():
        print(f"  {name:<28} {seconds * 1000:8.0f} (fixed)")
    if bad:
        print(f"!! {len(bad)} runs did not end ready: {bad[:2]}")
    out = Path(args.out) / "slurm_epilog.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"wrote {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
