"""Issue 23 on one real GPU: the seeds' restart replayed. A launcher runs as PID 1 of its own PID namespace
(``unshare --pid --fork --mount-proc``, as a server is in any ``docker run``; no SIGTERM handler) with two workers
holding ``--bytes`` each on GPU 0 (PyTorch, else the project's CUDA holder) and a CPU-only helper. It is ended:

- ``ritual``: the seeds' ``ps aux | grep … | awk | xargs kill -9; sleep 2`` (``fuser -k /dev/nvidia*`` left out:
  it would kill the observer and the other tenant too);
- ``tree``: ``nvmlcheck kill --tree INIT`` from the host (INIT: the launcher's host PID);
- ``cgroup``: ``nvmlcheck kill --cgroup DIR --yes`` (the tree started in a cgroup made for it, where one can be);
- ``match``: ``nvmlcheck kill --match TOKEN --yes`` from the host;
- ``inside``: ``nsenter -t INIT -p -m nvmlcheck kill --all-holders --yes`` (the launcher, PID 1 there, and the helper
  survive by design: they hold no GPU);
- ``shared``: another tenant (outside, its own ``--tenant-bytes``) on the same GPU; ``kill --tree INIT
  --only-targets`` must end 0 and name it "not ours", and ``shared-plain`` (the same without ``--only-targets``,
  ``--timeout 3``) shows why it is needed (exit 1).

An independent observer (nvidia-ml-py, else raw_observer.py's own cffi) stamps the memory back; CLOCK_MONOTONIC is
shared, so "exit after memory back" is the command's exit minus the observer's stamp. Survivors: processes of the
tree still running after the command (cleaned up afterwards).

    python3 benchmarks/gpu/restart_replay.py [--runs 2] [--bytes 8GiB] [--holder auto|torch|cuda] [--budget-s 230]

Prints a table (the one docs/killing.md publishes) and writes ``$OUT/restart_replay.json``. Needs root (unshare,
nsenter, a cgroup directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

WORKER = r"""
import sys, time
nbytes, holder = int(sys.argv[1]), sys.argv[2]
if holder == "torch":
    import torch
    keep = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
else:
    from nvmlcheck.study.child import hold
    keep = hold(nbytes, 0)
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

# PID 1 of the namespace: no SIGTERM handler (the kernel discards SIGTERM from outside), never reaps.
LAUNCHER = r"""
import subprocess, sys, time
nbytes, holder, token, worker = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
ws = [subprocess.Popen([sys.executable, "-c", worker, nbytes, holder, token], stdout=subprocess.PIPE, text=True)
      for _ in range(2)]
for w in ws:
    assert w.stdout.readline().strip() == "ready"
helper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(3600)", token])
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

TENANT = WORKER


def parse_size(text: str) -> int:
    units = {"": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    return int(float(num) * units[t[len(num):]])


def used_bytes(python: str, env: dict[str, str]) -> int:
    out = subprocess.run([python, "-m", "nvmlcheck", "--json", "snapshot", "--devices", "0"], capture_output=True,
                         text=True, env=env, timeout=60, check=True)
    return int(json.loads(out.stdout)["devices"][0]["memory"]["used_bytes"])


def stat(pid: int) -> tuple[int, str] | None:
    """(ppid, state) of a live process, else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    return int(rest[1]), rest[0].decode()


def alive(pid: int) -> bool:
    s = stat(pid)
    return s is not None and s[1] not in ("Z", "X")


def descendants(root: int) -> list[int]:
    table: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            s = stat(int(name))
            if s is not None:
                table.setdefault(s[0], []).append(int(name))
    out, queue = [], [root]
    while queue:
        for child in table.get(queue.pop(), []):
            out.append(child)
            queue.append(child)
    return out


def start_observer(pid: int, clean_bytes: int, env: dict[str, str], timeout_s: float) -> subprocess.Popen[str]:
    for script in ("nvml_py_observer.py", "raw_observer.py"):
        obs = subprocess.Popen([sys.executable, str(HERE / script), "--pid", str(pid), "--device", "0",
                                "--clean-bytes", str(clean_bytes), "--timeout", str(timeout_s)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert obs.stdout is not None
        if obs.stdout.readline().strip() == "ready":
            return obs
        obs.wait()
    raise RuntimeError("no observer could start")


def make_cgroup() -> Path | None:
    for hierarchy in ("unified", "pids", ""):
        base = Path("/sys/fs/cgroup") / hierarchy
        if (base / "cgroup.procs").is_file():
            path = base / f"nvmlcheck-replay-{uuid.uuid4().hex[:8]}"
            try:
                path.mkdir()
            except OSError:
                continue
            return path
    return None


class Tree:
    """The launcher in its namespace, its workers and helper; ``init`` is the launcher's host PID."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], cgroup: Path | None) -> None:
        self.token = f"replay-{uuid.uuid4().hex[:10]}"
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", args.python, "-c", LAUNCHER, str(args.nbytes),
               args.holder, self.token, WORKER]
        if cgroup is not None:
            cmd = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the tree did not start: {line!r}")
        kids = [p for p in descendants(self.proc.pid) if stat(p) is not None and stat(p)[0] == self.proc.pid]  # type: ignore[index]
        self.init = kids[0]
        self.pids = [self.proc.pid, *descendants(self.proc.pid)]
        self.workers = [p for p in descendants(self.init) if stat(p) is not None and stat(p)[0] == self.init]  # type: ignore[index]

    def survivors(self) -> list[int]:
        return [p for p in self.pids if p != self.proc.pid and alive(p)]

    def cleanup(self) -> None:
        for p in self.pids:
            if alive(p):
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def nvmlcheck(python: str, *argv: str) -> list[str]:
    return [python, "-m", "nvmlcheck", "--json", "kill", *argv]


def wait_back(python: str, env: dict[str, str], threshold: int, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and used_bytes(python, env) > threshold:
        time.sleep(0.2)


def run_case(case: str, args: argparse.Namespace, env: dict[str, str], threshold: int) -> dict[str, Any]:
    cg = make_cgroup() if case == "cgroup" else None
    if case == "cgroup" and cg is None:
        return {"case": case, "skipped": "no writable cgroup hierarchy"}
    tree = Tree(args, env, cg)
    try:
        obs = start_observer(tree.workers[0], threshold, env, 30.0)
        if case == "ritual":
            argv = ["sh", "-c", "ps aux | grep \"$T\" | grep -v grep | awk '{print $2}' | xargs -r kill -9; sleep 2"]
            cmd_env = env | {"T": tree.token}
        else:
            cmd_env = env
            argv = {
                "tree": nvmlcheck(args.python, "--tree", str(tree.init)),
                "cgroup": nvmlcheck(args.python, "--cgroup", str(cg), "--yes"),
                "match": nvmlcheck(args.python, "--match", tree.token, "--yes"),
                "inside": ["nsenter", "-t", str(tree.init), "-p", "-m", "--",
                           *nvmlcheck(args.python, "--all-holders", "--yes")],
                "shared": nvmlcheck(args.python, "--tree", str(tree.init), "--only-targets"),
                "shared-plain": nvmlcheck(args.python, "--tree", str(tree.init), "--timeout", "3"),
            }[case]
        t0 = time.monotonic_ns()
        done = subprocess.run(argv, capture_output=True, text=True, env=cmd_env, timeout=60, check=False)
        t_exit = time.monotonic_ns()
        survivors = tree.survivors()
        try:
            obs_out = obs.communicate(timeout=40)[0]
        except subprocess.TimeoutExpired:
            obs.kill()
            obs_out = obs.communicate()[0]
        seen = json.loads(obs_out.strip().splitlines()[-1]) if obs_out.strip() else {}
        back = seen.get("clean_ns")
        try:
            doc = json.loads(done.stdout) if done.stdout.strip() and case != "ritual" else None
        except json.JSONDecodeError:
            doc = {"unparsed": done.stdout[-2000:]}
        return {
            "case": case, "exit": done.returncode, "wall_ns": t_exit - t0,
            "memory_back_ns": None if back is None else back - t0,
            "exit_after_memory_back_ns": None if back is None else t_exit - back,
            "survivors": survivors, "init": tree.init, "workers": tree.workers,
            "observer": seen, "stderr": done.stderr[-3000:], "document": doc,
        }
    finally:
        tree.cleanup()
        if cg is not None:
            end = time.monotonic() + 10
            while time.monotonic() < end:
                try:
                    cg.rmdir()
                    break
                except OSError:
                    time.sleep(0.05)
        wait_back(args.python, env, threshold)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--bytes", dest="nbytes", type=parse_size, default=parse_size("8GiB"))
    parser.add_argument("--tenant-bytes", type=parse_size, default=parse_size("2GiB"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--holder", choices=("auto", "torch", "cuda"), default="auto")
    parser.add_argument("--budget-s", type=float, default=230.0)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = parser.parse_args()
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if args.holder == "auto":
        has_torch = subprocess.run([args.python, "-c", "import torch; assert torch.cuda.is_available()"],
                                   capture_output=True, timeout=120, check=False).returncode == 0
        args.holder = "torch" if has_torch else "cuda"
    deadline = time.monotonic() + args.budget_s
    rows: list[dict[str, Any]] = []
    base = used_bytes(args.python, env)
    threshold = base + (64 << 20)
    cases = ["ritual", "tree", "cgroup", "match", "inside"]
    for run in range(args.runs):
        for case in cases:
            if time.monotonic() > deadline:
                break
            r = run_case(case, args, env, threshold)
            r["run"] = run
            rows.append(r)
            print(json.dumps({k: r.get(k) for k in ("case", "run", "exit", "wall_ns", "memory_back_ns",
                                                    "exit_after_memory_back_ns", "survivors", "skipped")}),
                  flush=True)
    # The shared GPU: a tenant outside the namespace holds its own memory through both shared cases.
    if time.monotonic() < deadline:
        tenant = subprocess.Popen([args.python, "-c", TENANT, str(args.tenant_bytes), args.holder, "tenant"],
                                  stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert tenant.stdout is not None and tenant.stdout.readline().strip() == "ready"
            shared_threshold = used_bytes(args.python, env) + (64 << 20)
            for case in ("shared", "shared-plain"):
                if time.monotonic() > deadline:
                    break
                r = run_case(case, args, env, shared_threshold)
                r["run"] = 0
                r["tenant_alive"] = alive(tenant.pid)
                doc = r.get("document") or {}
                r["not_ours"] = doc.get("not_ours")
                rows.append(r)
        finally:
            tenant.kill()
            tenant.wait()
    table: list[dict[str, Any]] = []
    print("\n| case | runs | exit | wall (ms) | memory back (ms) | exit after memory back (ms) | survivors |")
    print("| --- | ---: | --- | ---: | ---: | ---: | --- |")
    for case in [*cases, "shared", "shared-plain"]:
        sel = [r for r in rows if r.get("case") == case and "skipped" not in r]
        if not sel:
            continue

        def med(key: str, sel: list[dict[str, Any]] = sel) -> float | None:
            vals = [r[key] for r in sel if r.get(key) is not None]
            return statistics.median(vals) / 1e6 if vals else None

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f}" if abs(v) >= 100 else f"{v:.1f}"

        exits = ",".join(sorted({str(r["exit"]) for r in sel}))
        surv = max(len(r["survivors"]) for r in sel)
        wall, back, after = med("wall_ns"), med("memory_back_ns"), med("exit_after_memory_back_ns")
        table.append({"case": case, "runs": len(sel), "exits": exits, "wall_ms": wall, "memory_back_ms": back,
                      "exit_after_memory_back_ms": after, "survivors_max": surv})
        print(f"| {case} | {len(sel)} | {exits} | {f(wall)} | {f(back)} | {f(after)} | {surv} |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "restart_replay.json"
    out.write_text(json.dumps({"holder": args.holder, "bytes": args.nbytes, "python": args.python, "table": table,
                               "runs": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
