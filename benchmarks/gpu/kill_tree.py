"""Issue 10 on real GPUs: a TP-N-like server tree (a launcher and one worker per GPU, each holding memory through the
CUDA driver API) ended by ``nvmlcheck kill`` in four ways, with every phase recorded.

A. ``kill LAUNCHER`` without ``--tree``: the launcher dies, its workers outlive it (as vLLM's and SGLang's do); the
   command must time out (exit 1) naming both workers and hinting at ``--tree``. ``kill --all-holders --yes`` then
   cleans up and must exit 0.
B. ``kill --tree LAUNCHER``: exit 0, every process of the tree gone.
C. ``kill --all-holders --yes``: exit 0, every process of the tree gone.
D. Inside ``unshare --pid --fork --mount-proc``: a tree on GPU 0 inside, a holder on GPU 1 outside; inside,
   ``holders`` and ``kill --all-holders --yes --devices 0`` must end only the namespace's processes.

    python3 benchmarks/gpu/kill_tree.py --gpus 2 --bytes 8GiB --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# A worker: holds memory on one GPU until killed. (Not `python -m nvmlcheck.holder`, which exits at the end of its
# stdin: a worker whose launcher died would exit with it, and no worker would outlive the launcher.)
WORKER = r"""
import sys, time
from nvmlcheck.study.child import hold, parse_size
keep = hold(parse_size(sys.argv[1]), int(sys.argv[2]))
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

# The launcher: starts one worker per GPU, prints their PIDs once all are ready, then sleeps. SIGTERM's default
# action ends it alone: the workers are reparented and keep their memory.
LAUNCHER = r"""
import subprocess, sys, time
gpus, nbytes, worker = int(sys.argv[1]), sys.argv[2], sys.argv[3]
workers = [subprocess.Popen([sys.executable, "-c", worker, nbytes, str(i)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True) for i in range(gpus)]
for w in workers:
    line = w.stdout.readline()
    assert line.startswith("ready"), line
print("ready", " ".join(str(w.pid) for w in workers), flush=True)
while True:
    time.sleep(3600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def start_tree(gpus: int, nbytes: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], list[int]]:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(gpus), nbytes, WORKER], stdout=subprocess.PIPE,
                                text=True, env=env, start_new_session=True)
    assert launcher.stdout is not None
    line = launcher.stdout.readline().split()
    assert line and line[0] == "ready", f"the tree did not start: {line}"
    return launcher, [int(p) for p in line[1:]]


def nvmlcheck(*argv: str, env: dict[str, str], timeout: float = 60) -> tuple[int, Any, str, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--json", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False)
    wall = time.monotonic() - t0
    try:
        doc = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        doc = {"unparsed": done.stdout}
    return done.returncode, doc, done.stderr, wall


def phases(doc: Any) -> list[dict[str, Any]]:
    """Per target: how found, signals, exited, off the list (ms from the first signal)."""
    out = []
    for t in (doc or {}).get("pids", []):
        out.append({
            "pid": t["pid"], "found_by": t["found_by"], "parent": t.get("parent"),
            "signals": [(s["signal"], round(s["sent_ns"] / 1e6, 2)) for s in t["signals"]],
            "exited_ms": None if t["exited_ns"] is None else round(t["exited_ns"] / 1e6, 2),
            "off_gpu_ms": None if t["off_gpu_ns"] is None else round(t["off_gpu_ns"] / 1e6, 2),
        })
    return out


def reap(launcher: subprocess.Popen[str]) -> None:
    if launcher.poll() is None:
        launcher.kill()
    launcher.wait()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--bytes", default="8GiB")
    parser.add_argument("--out", default=".")
    parser.add_argument("--inside", action="store_true", help="(internal) scenario D inside the namespace")
    args = parser.parse_args()
    env = dict(os.environ)
    report: dict[str, Any] = {}
    if args.inside:
        launcher, workers = start_tree(1, args.bytes, env)
        rc, holders, err, _ = nvmlcheck("holders", env=env)
        report["holders_inside"] = {"rc": rc, "doc": holders, "stderr": err}
        rc, doc, err, wall = nvmlcheck("kill", "--all-holders", "--yes", "--devices", "0", "--timeout", "20", env=env)
        reap(launcher)
        report["D_inside"] = {"rc": rc, "wall_s": wall, "stderr": err, "phases": phases(doc),
                              "left_alone": (doc or {}).get("left_alone"), "clean_ns": (doc or {}).get("clean_ns"),
                              "gone": [not alive(p) for p in workers]}
        print(json.dumps(report))
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    # A: without --tree the workers outlive their launcher: exit 1, both named, --tree hinted.
    launcher, workers = start_tree(args.gpus, args.bytes, env)
    rc, doc, err, wall = nvmlcheck("kill", str(launcher.pid), "--timeout", "4", "--grace", "1", env=env)
    reap(launcher)
    hint = [h["pid"] for h in (doc or {}).get("tree_hint", [])]
    report["A_no_tree"] = {"rc": rc, "wall_s": wall, "workers": workers, "tree_hint": hint,
                           "named_in_stderr": [str(w) in err for w in workers], "stderr": err[-2000:],
                           "workers_alive_after": [alive(w) for w in workers]}
    rc, doc, err, wall = nvmlcheck("kill", "--all-holders", "--yes", "--timeout", "20", env=env)
    report["A_cleanup_all_holders"] = {"rc": rc, "wall_s": wall, "phases": phases(doc),
                                       "clean_ms": (doc or {}).get("clean_ns", 0) / 1e6, "stderr": err[-1000:],
                                       "gone": [not alive(w) for w in workers]}

    # B: --tree ends the launcher and its workers.
    launcher, workers = start_tree(args.gpus, args.bytes, env)
    rc, doc, err, wall = nvmlcheck("kill", "--tree", str(launcher.pid), "--timeout", "20", env=env)
    reap(launcher)
    report["B_tree"] = {"rc": rc, "wall_s": wall, "phases": phases(doc),
                        "clean_ms": (doc or {}).get("clean_ns", 0) / 1e6,
                        "stderr": err[-1000:], "gone": [not alive(w) for w in workers]}

    # C: --all-holders, the fuser -k /dev/nvidia* step.
    launcher, workers = start_tree(args.gpus, args.bytes, env)
    rc, holders, _, _ = nvmlcheck("holders", env=env)
    report["C_holders_before"] = holders
    rc, doc, err, wall = nvmlcheck("kill", "--all-holders", "--yes", "--timeout", "20", env=env)
    reap(launcher)
    report["C_all_holders"] = {"rc": rc, "wall_s": wall, "phases": phases(doc),
                               "clean_ms": (doc or {}).get("clean_ns", 0) / 1e6, "stderr": err[-1000:],
                               "left_alone": (doc or {}).get("left_alone"),
                               "gone": [not alive(w) for w in workers] + [not alive(launcher.pid)]}

    # D: a PID namespace. A holder outside on the last GPU; inside, a tree on GPU 0 killed with --all-holders.
    if args.gpus >= 2:
        outside = subprocess.Popen([sys.executable, "-c", WORKER, args.bytes, str(args.gpus - 1)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        assert outside.stdout is not None and outside.stdout.readline().startswith("ready")
        inside = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, __file__, "--inside",
                                 "--bytes", args.bytes], capture_output=True, text=True, env=env, timeout=120,
                                check=False)
        try:
            report.update(json.loads(inside.stdout.strip().splitlines()[-1]))
        except (json.JSONDecodeError, IndexError):
            report["D_error"] = {"rc": inside.returncode, "stdout": inside.stdout[-2000:],
                                 "stderr": inside.stderr[-2000:]}
        report["D_outside_holder_alive_after"] = outside.poll() is None
        outside.kill()
        outside.wait()

    (out / "kill_tree.json").write_text(json.dumps(report, indent=1))
    for name, value in report.items():
        if isinstance(value, dict) and "rc" in value:
            print(f"{name}: exit {value['rc']}, wall {value.get('wall_s', 0):.3f} s, "
                  f"gone {value.get('gone')}, hint {value.get('tree_hint')}")
    print(f"D outside holder alive after: {report.get('D_outside_holder_alive_after')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
