"""Issue 23, item 4 on a real GPU: does ``nvmlcheck kill`` signal at interpreter speed for every selector form, and
exit as soon as the memory is back?

For each form, ``--runs`` times: a target holds ``--bytes`` on GPU 0 (the project's CUDA holder, or PyTorch with
``--holder torch``) with a SIGTERM handler that stamps ``time.monotonic_ns()`` on arrival and ends the process
(``os._exit``: the driver tears the context down); an independent observer (nvidia-ml-py, else raw_observer.py's own
cffi) stamps the first poll with the target off the list and the memory back. Then the command is launched and
timed. Forms: ``bare`` (a bare interpreter's ``os.kill``: the floor), ``kill PID``, ``--devices 0``, ``--devices
GPU-…`` (a UUID prefix), ``--tree``, ``--devices 0 --tree``, ``--match TOKEN``, ``--cgroup DIR`` (where a cgroup can
be made). CLOCK_MONOTONIC is shared by every process, so the stamps compare across them.

Goals (issue 23): launch → signal ≤ bare + 10 ms for every form; kill wall ≤ launch → signal + teardown + 10 ms,
i.e. the command exits within 10 ms of the observer's "memory back".

    python3 benchmarks/gpu/kill_speed.py --summarise DIR/kill_speed.json ...   # where the late exits came from
    python3 benchmarks/gpu/kill_speed.py [--runs 5] [--bytes 1GiB] [--python /usr/bin/python3] [--holder cuda|torch]
        [--script /tmp/inst/bin/nvmlcheck]     # time the installed console script, not python -m nvmlcheck

Writes ``$OUT/kill_speed.json`` (every run and the medians) and prints a table; bounded by ``--budget-s``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

TARGET = r"""
import os, signal, sys, time
nbytes, device, holder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
keep = None
if nbytes and holder == "torch":
    import torch
    keep = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
    torch.cuda.synchronize()
elif nbytes:
    from nvmlcheck.study.child import hold
    keep = hold(nbytes, device)
def on_term(n, f):
    os.write(1, b"term %d\n" % time.monotonic_ns())
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

BARE = "import os, sys; os.kill(int(sys.argv[1]), 15)"


def parse_size(text: str) -> int:
    units = {"": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    return int(float(num) * units[t[len(num):]])


def used_bytes(python: str, env: dict[str, str]) -> tuple[int, str]:
    """GPU 0's used memory (v2: without the driver's reserve) and its UUID, through nvmlcheck (only a threshold for
    the observer; the stamps are the observer's own)."""
    out = subprocess.run([python, "-m", "nvmlcheck", "--json", "snapshot", "--devices", "0"], capture_output=True,
                         text=True, env=env, timeout=60, check=True)
    d = json.loads(out.stdout)["devices"][0]
    return int(d["memory"]["used_bytes"]), str(d["uuid"])


def start_observer(pid: int, clean_bytes: int, env: dict[str, str]) -> subprocess.Popen[str]:
    for script in ("nvml_py_observer.py", "raw_observer.py"):
        obs = subprocess.Popen([sys.executable, str(HERE / script), "--pid", str(pid), "--device", "0",
                                "--clean-bytes", str(clean_bytes), "--timeout", "30"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert obs.stdout is not None
        if obs.stdout.readline().strip() == "ready":
            return obs
        obs.wait()
    raise RuntimeError("no observer could start (neither nvidia-ml-py nor raw cffi)")


def finish(obs: subprocess.Popen[str]) -> str:
    """The observer's output (it stops at its own --timeout; killed if it does not)."""
    try:
        return obs.communicate(timeout=40)[0]
    except subprocess.TimeoutExpired:
        obs.kill()
        return obs.communicate()[0]


def cgroup_dir() -> Path | None:
    for hierarchy in ("unified", "pids", ""):
        base = Path("/sys/fs/cgroup") / hierarchy
        if (base / "cgroup.procs").is_file():
            path = base / f"nvmlcheck-speed-{uuid.uuid4().hex[:8]}"
            try:
                path.mkdir()
            except OSError:
                continue
            return path
    return None


def one_run(form: str, argv_tail: list[str], args: argparse.Namespace, env: dict[str, str], *, threshold: int,
            cg: Path | None) -> dict[str, Any]:
    token = f"kill-speed-{uuid.uuid4().hex[:10]}"
    target = subprocess.Popen([args.python, "-c", TARGET, str(args.nbytes), "0", args.holder, token],
                              stdout=subprocess.PIPE, text=True, env=env)
    assert target.stdout is not None
    try:
        assert target.stdout.readline().strip() == "ready"
        if form == "cgroup" and cg is not None:
            (cg / "cgroup.procs").write_text(str(target.pid))
        obs = start_observer(target.pid, threshold, env)
        words = [w.replace("{pid}", str(target.pid)).replace("{token}", token).replace("{cgroup}", str(cg))
                 for w in argv_tail]
        argv = [args.python, "-c", BARE, str(target.pid)] if form == "bare" else \
            [*nvmlcheck_argv(args), "--json", "kill", *words]
        t0 = time.monotonic_ns()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
        t_exit = time.monotonic_ns()
        ready, _, _ = select.select([target.stdout], [], [], 10.0)  # a kill that signalled nothing: no line
        line = target.stdout.readline().split() if ready else []
        signal_ns = int(line[1]) if len(line) == 2 and line[0] == "term" else None
        if signal_ns is None:
            target.kill()
        target.wait(timeout=30)
        obs_out = finish(obs)
        seen = json.loads(obs_out.strip().splitlines()[-1]) if obs_out.strip() else {}
        back = seen.get("clean_ns")
        doc = None
        if form != "bare":
            try:
                doc = json.loads(done.stdout)
            except json.JSONDecodeError:
                doc = {"unparsed": done.stdout[-2000:]}
        return {
            "form": form, "exit": done.returncode, "launch_to_signal_ns": None if signal_ns is None else signal_ns - t0,
            "wall_ns": t_exit - t0, "teardown_ns": None if back is None or signal_ns is None else back - signal_ns,
            "exit_after_memory_back_ns": None if back is None else t_exit - back,
            "observer": seen, "stderr": done.stderr[-2000:],
            "clean_ns": (doc or {}).get("clean_ns"),
            "discarded": [t.get("discarded") for t in (doc or {}).get("pids", [])],
            # Where a late exit comes from: each target's exit and off-list stamps and the poll count (ns after the
            # first signal, as clean_ns).
            "targets": [{k: t.get(k) for k in ("pid", "exited_ns", "off_gpu_ns")} for t in (doc or {}).get("pids", [])],
            "polls": (doc or {}).get("polls"), "resolution_ns": (doc or {}).get("resolution_ns"),
            "confirmed_ns": (doc or {}).get("confirmed_ns"),
        }
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def nvmlcheck_argv(args: argparse.Namespace) -> list[str]:
    """The command as a user runs it: the installed console script (``--script``), else ``python -m nvmlcheck``."""
    return [args.script] if args.script else [args.python, "-m", "nvmlcheck"]


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) / 1e6 if vals else None


def summarise(paths: list[str]) -> int:
    """Where each late exit came from, over the runs of kill_speed.json files: the target's own exit (its pidfd
    readable) against the observer's "memory back", the kill's clean stamp against that exit, and its exit after it."""
    rows = [r for p in paths for r in json.loads(Path(p).read_text())["runs"]
            if r["form"] != "bare" and r.get("targets") and r.get("clean_ns") is not None]
    if not rows:
        print("no run with per-target stamps")
        return 1
    ms = 1e6
    late = [r for r in rows if r["exit_after_memory_back_ns"] > 10 * ms]
    exited = [r["targets"][-1]["exited_ns"] for r in rows]
    after_clean = sorted((r["wall_ns"] - r["launch_to_signal_ns"] - r["clean_ns"]) / ms for r in rows)
    print(f"{len(rows)} kills; {len(late)} exited more than 10 ms after the observer's memory back")
    print("  in those, the target exited after the memory back by (ms):",
          sorted(round((r["targets"][-1]["exited_ns"] - r["teardown_ns"]) / ms, 1) for r in late))
    print(f"  clean stamp after the last target's exit: at most "
          f"{max(r['clean_ns'] - e for r, e in zip(rows, exited, strict=True)) / ms:.2f} ms")
    print(f"  exit after the kill's own clean stamp: median {after_clean[len(after_clean) // 2]:.1f} ms, "
          f"at most {after_clean[-1]:.1f} ms")
    prompt = [r["exit_after_memory_back_ns"] / ms for r, e in zip(rows, exited, strict=True)
              if e - r["teardown_ns"] < ms]
    if prompt:
        print(f"  where the target exited within 1 ms of the memory: exit after memory back at most "
              f"{max(prompt):.1f} ms")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bytes", dest="nbytes", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs nvmlcheck and bare")
    parser.add_argument("--holder", choices=("cuda", "torch"), default="cuda")
    parser.add_argument("--script", help="the installed nvmlcheck console script to time (default: python -m "
                        "nvmlcheck from this tree); $PYTHONPATH must then reach its package")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--forms", help="comma-separated forms to time (default: all)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    parser.add_argument("--summarise", nargs="+", metavar="JSON",
                        help="print where the late exits of these kill_speed.json files came from, and stop")
    args = parser.parse_args()
    if args.summarise:
        return summarise(args.summarise)
    env = dict(os.environ) if args.script else \
        os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    base_used, gpu_uuid = used_bytes(args.python, env)
    threshold = base_used + (64 << 20)
    cg = cgroup_dir()
    forms: list[tuple[str, list[str]]] = [
        ("bare", []),
        ("pid", ["{pid}"]),
        ("devices", ["--devices", "0", "{pid}"]),
        ("uuid", ["--devices", gpu_uuid[:12], "{pid}"]),
        ("tree", ["--tree", "{pid}"]),
        ("devices+tree", ["--devices", "0", "--tree", "{pid}"]),
        ("match", ["--match", "{token}", "--yes"]),
    ]
    if cg is not None:
        forms.append(("cgroup", ["--cgroup", "{cgroup}", "--yes"]))
    if args.forms:
        forms = [f for f in forms if f[0] in {"bare", *args.forms.split(",")}]
    deadline = time.monotonic() + args.budget_s
    rows: list[dict[str, Any]] = []
    try:
        for run in range(args.runs):
            for form, tail in forms:  # interleaved: a drift of the machine hits every form alike
                if time.monotonic() > deadline:
                    break
                r = one_run(form, tail, args, env, threshold=threshold, cg=cg)
                r["run"] = run
                rows.append(r)
    finally:
        if cg is not None:
            with contextlib.suppress(OSError):
                cg.rmdir()
    bare = median([r for r in rows if r["form"] == "bare"], "launch_to_signal_ns")
    summary = []
    print(f"{'form':<14}{'n':>3} {'launch->signal':>15} {'vs bare':>9} {'teardown':>10} {'wall':>9} "
          f"{'exit-back':>10}  goals")
    for form, _ in forms:
        sel = [r for r in rows if r["form"] == form]
        ls, td, wall, after = (median(sel, k) for k in ("launch_to_signal_ns", "teardown_ns", "wall_ns",
                                                         "exit_after_memory_back_ns"))
        over = None if ls is None or bare is None else ls - bare
        ok_signal = over is not None and over <= 10.0
        ok_exit = form == "bare" or (after is not None and after <= 10.0)
        summary.append({"form": form, "runs": len(sel), "launch_to_signal_ms": ls, "over_bare_ms": over,
                        "teardown_ms": td, "wall_ms": wall, "exit_after_memory_back_ms": after,
                        "signal_goal_met": ok_signal, "exit_goal_met": ok_exit,
                        "exits": sorted({r["exit"] for r in sel})})

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f}"

        print(f"{form:<14}{len(sel):>3} {f(ls):>15} {f(over):>9} {f(td):>10} {f(wall):>9} {f(after):>10}  "
              f"{'signal ok' if ok_signal else 'SIGNAL SLOW'}, {'exit ok' if ok_exit else 'EXIT LATE'}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "kill_speed.json"
    out.write_text(json.dumps({"python": args.python, "script": args.script, "holder": args.holder,
                               "bytes": args.nbytes, "summary": summary, "runs": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
