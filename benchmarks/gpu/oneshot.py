"""One-shot checks side by side (issue 22, item 5): how long `nvmlcheck wait --timeout 0`, `snapshot` and `ready`
take from launch to exit, against one `nvidia-smi --query-gpu` run, a bare interpreter, nvidia-ml-py and raw cffi
doing the same one-shot read, and each command's floor (its NVML reads made by a minimal Python program: FLOOR).
The goal: nvmlcheck's one-shots within 2x one nvidia-smi run.

    python3 benchmarks/gpu/oneshot.py                  # on the GPU host, from the repo root; JSON to $OUT
    python3 benchmarks/gpu/oneshot.py --runs 30 --python /usr/bin/python3
    python3 benchmarks/gpu/oneshot.py --runs 30 --script /tmp/inst/bin/nvmlcheck   # as installed by pip
    python3 benchmarks/gpu/oneshot.py --runs 30 --script /tmp/a/bin/nvmlcheck --path /tmp/a \
        --base-script /tmp/b/bin/nvmlcheck --base-path /tmp/b        # and another version, run by run

Byte-compiles nvmlcheck first (as an installed package is), then runs each command N times, interleaved (one of
each per round, so drift of the host hits all alike), and prints medians, p10/p90 and each median's ratio to
nvidia-smi's. With ``--base-script`` a second installed version's one-shots join each round (rows ``base ...``):
two versions timed in separate calls differ by the host's drift (the bare interpreter moved 2.4 ms between two
back-to-back calls on one H200), interleaved they do not. Bounded: every run has a timeout, and the whole stops
adding rounds after --budget seconds (default 100). Without a GPU it still runs where $NVMLCHECK_LIBNVML points at
the stub (nvidia-smi and nvidia-ml-py are then skipped with a message).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The read a one-shot check makes, written with each library alone: init, handle 0, memory, compute processes, exit.
PYNVML = (
    "import os, pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
    "m = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2); p = n.nvmlDeviceGetComputeRunningProcesses(h); "
    "print(m.used, len(p)); os._exit(0)"
)
RAW_CFFI = r"""
import os, cffi
ffi = cffi.FFI()
ffi.cdef('''typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
int nvmlInit_v2(void); int nvmlDeviceGetHandleByIndex_v2(unsigned int, void **);
int nvmlDeviceGetMemoryInfo_v2(void *, mem_t *);
int nvmlDeviceGetComputeRunningProcesses_v3(void *, unsigned int *, proc_t *);''')
lib = ffi.dlopen(os.environ.get("NVMLCHECK_LIBNVML") or "libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
h = ffi.new("void **"); assert lib.nvmlDeviceGetHandleByIndex_v2(0, h) == 0
m = ffi.new("mem_t *"); m.version = ffi.sizeof("mem_t") | (2 << 24); assert lib.nvmlDeviceGetMemoryInfo_v2(h[0], m) == 0
n = ffi.new("unsigned int *", 64); p = ffi.new("proc_t[64]"); lib.nvmlDeviceGetComputeRunningProcesses_v3(h[0], n, p)
print(m.used, n[0]); os._exit(0)
"""


# The floor under a one-shot (issue 22 item 5): what any Python program pays to make the command's NVML reads with
# nothing of nvmlcheck but its prebuilt cffi module (no cdef parsing), serially, then exit: the interpreter's start,
# the loader, the driver's calls (first-call costs included) and the exit with NVML open. argv[1]: "wait" (the
# reads of `wait --timeout 0`), "snapshot" (those plus the table's identity and current clocks) or "ready" (wait's
# plus ready's health reads, in the session's order).
FLOOR = r"""
import os, sys
from nvmlcheck._nvml._ffi import ffi
lib = ffi.dlopen("libnvidia-ml.so.1")
assert lib.nvmlInit_v2() == 0
n = ffi.new("unsigned int *"); lib.nvmlDeviceGetCount_v2(n)
h = ffi.new("nvmlDevice_t *"); assert lib.nvmlDeviceGetHandleByIndex_v2(0, h) == 0
d = h[0]; text = ffi.new("char[96]"); u = ffi.new("unsigned int[4]")
lib.nvmlDeviceGetUUID(d, text, 96)
lib.nvmlDeviceGetMigMode(d, u, u + 1)
m = ffi.new("nvmlMemory_v2_t *"); m.version = ffi.sizeof("nvmlMemory_v2_t") | (2 << 24)
lib.nvmlDeviceGetMemoryInfo_v2(d, m)
p = ffi.new("nvmlProcessInfo_v2_t[64]")
for f in (lib.nvmlDeviceGetComputeRunningProcesses_v3, lib.nvmlDeviceGetGraphicsRunningProcesses_v3,
          lib.nvmlDeviceGetMPSComputeRunningProcesses_v3):
    n[0] = 64; f(d, n, p)
if sys.argv[1] == "snapshot":  # the table's identity and current clocks
    for f in (lib.nvmlDeviceGetName, lib.nvmlDeviceGetSerial):
        f(d, text, 96)
    pci = ffi.new("nvmlPciInfo_t *"); lib.nvmlDeviceGetPciInfo_v3(d, pci); lib.nvmlDeviceGetMinorNumber(d, u)
    for clock in range(4):
        lib.nvmlDeviceGetClockInfo(d, clock, u)
if sys.argv[1] == "ready":
    a = ffi.new("unsigned long long[64]"); t = ffi.new("unsigned long long[64]")
    n[0] = 64; lib.nvmlDeviceGetRetiredPages_v2(d, 0, n, a, t)
    s = ffi.new("nvmlEnableState_t *"); lib.nvmlDeviceGetRetiredPagesPendingStatus(d, s)
    lib.nvmlDeviceGetRemappedRows(d, u, u + 1, u + 2, u + 3)
    e = ffi.new("unsigned long long *")
    lib.nvmlDeviceGetTotalEccErrors(d, 1, 0, e); lib.nvmlDeviceGetTotalEccErrors(d, 1, 1, e)
    fv = ffi.new("nvmlFieldValue_t[1]"); fv[0].fieldId = 230; lib.nvmlDeviceGetFieldValues(d, 1, fv)
print(m.used); os._exit(0)
"""


#: The one-shots timed for a base version too (``--base-script``).
BASE_ROWS = ("nvmlcheck wait --timeout 0", "nvmlcheck snapshot", "nvmlcheck ready")


def commands(py: str, script: str | None, base_script: str | None = None) -> dict[str, list[str] | str]:
    """name -> argv, or a string saying why it is skipped. ``script``: the installed console script, timed as a user
    runs it (``python -m nvmlcheck`` is then timed for ``wait`` only, as a reference: runpy costs milliseconds);
    ``base_script``: another version's, timed for the one-shots as ``base ...``."""
    out: dict[str, list[str] | str] = {}
    cmd = [script] if script else [py, "-m", "nvmlcheck"]
    smi = shutil.which("nvidia-smi")
    out["nvidia-smi --query-gpu"] = (
        [smi, "--query-gpu=memory.used", "--format=csv"] if smi else "no nvidia-smi on PATH"
    )
    # A reference row, not the goal's: nvidia-smi making ready's health reads (its first calls cost the driver ms).
    health = ("memory.used,retired_pages.pending,remapped_rows.correctable,remapped_rows.uncorrectable,"
              "remapped_rows.pending,remapped_rows.failure,ecc.errors.uncorrected.volatile.total,"
              "ecc.errors.uncorrected.aggregate.total")
    out["nvidia-smi --query-gpu (health)"] = (
        [smi, f"--query-gpu={health}", "--format=csv"] if smi else "no nvidia-smi on PATH"
    )
    out["python3 -c pass"] = [py, "-c", "pass"]
    out["nvmlcheck wait --timeout 0"] = [*cmd, "wait", "--timeout", "0"]
    out["nvmlcheck snapshot"] = [*cmd, "snapshot"]
    out["nvmlcheck ready"] = [*cmd, "ready"]  # main() drops it for a version without the command
    if script:
        out["python3 -m nvmlcheck wait --timeout 0"] = [py, "-m", "nvmlcheck", "wait", "--timeout", "0"]
    has_pynvml = subprocess.run([py, "-c", "import pynvml"], capture_output=True, timeout=30, check=False)
    if has_pynvml.returncode == 0 and not os.environ.get("NVMLCHECK_LIBNVML"):
        out["nvidia-ml-py one-shot"] = [py, "-c", PYNVML]
    else:
        out["nvidia-ml-py one-shot"] = "nvidia-ml-py is not installed (or $NVMLCHECK_LIBNVML points at a stub)"
    has_cffi = subprocess.run([py, "-c", "import cffi"], capture_output=True, timeout=30, check=False)
    out["raw cffi one-shot"] = [py, "-c", RAW_CFFI] if has_cffi.returncode == 0 else "cffi is not installed"
    stub = os.environ.get("NVMLCHECK_LIBNVML")
    no_floor = "the floor needs a GPU (libnvidia-ml.so.1), not the stub" if stub else None
    out["floor: wait's reads"] = no_floor or [py, "-c", FLOOR, "wait"]
    out["floor: snapshot's reads"] = no_floor or [py, "-c", FLOOR, "snapshot"]
    out["floor: ready's reads"] = no_floor or [py, "-c", FLOOR, "ready"]
    if base_script:
        for name in BASE_ROWS:
            argv = out[name]
            out[f"base {name[len('nvmlcheck '):]}"] = [base_script, *argv[1:]] if isinstance(argv, list) else argv
    return out


def run_once(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[float, int]:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout_s,
                          check=False, env=env)  # fmt: skip
    return (time.perf_counter() - t0) * 1e3, done.returncode


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="runs of each command (default 30)")
    parser.add_argument("--python", default=shutil.which("python3") or sys.executable,
                        help="the interpreter to time (default: python3 on PATH, the system's)")  # fmt: skip
    parser.add_argument("--script", help="the installed nvmlcheck console script to time (default: python -m "
                        "nvmlcheck from this tree); $PYTHONPATH must then reach its package")
    parser.add_argument("--path", help="$PYTHONPATH for --script's runs (default: the inherited one)")
    parser.add_argument("--base-script", help="another installed version's console script, timed in the same rounds")
    parser.add_argument("--base-path", help="$PYTHONPATH for --base-script's runs")
    parser.add_argument("--budget", type=float, default=100.0, help="stop adding rounds after this many seconds")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for oneshot.json (default $OUT)")
    args = parser.parse_args()
    py = args.python
    t_start = time.monotonic()
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "nvmlcheck")], check=False, timeout=120)
    cmds = commands(py, args.script, args.base_script)
    live = {k: v for k, v in cmds.items() if isinstance(v, list)}
    envs: dict[str, dict[str, str] | None] = {}
    for name, argv in list(live.items()):
        mine = argv[0] == args.script or name.startswith("floor")  # the floor imports the package's cffi module
        path = args.base_path if name.startswith("base ") else args.path if mine else None
        envs[name] = None if path is None else dict(os.environ, PYTHONPATH=path)
        if name.endswith(" ready") and subprocess.run([*argv, "--help"], cwd=ROOT, capture_output=True, timeout=30,
                                                      env=envs[name], check=False).returncode:
            cmds[name] = "this nvmlcheck has no ready command (or its --help failed)"
            del live[name]
    for name, why in cmds.items():
        if isinstance(why, str):
            print(f"skip {name}: {why}")
    for name, argv in live.items():  # warm the page cache and __pycache__; not counted
        run_once(argv, 60, envs[name])
    times: dict[str, list[float]] = {k: [] for k in live}
    codes: dict[str, set[int]] = {k: set() for k in live}
    rounds = 0
    for _ in range(args.runs):
        if time.monotonic() - t_start > args.budget:
            print(f"budget of {args.budget:.0f} s spent after {rounds} rounds")
            break
        for name, argv in live.items():
            ms, rc = run_once(argv, 60, envs[name])
            times[name].append(ms)
            codes[name].add(rc)
        rounds += 1
    base = statistics.median(times["nvidia-smi --query-gpu"]) if times.get("nvidia-smi --query-gpu") else None
    # The ratios are to the plain query (memory.used), as the goal says; the health row is for reference.
    results: dict[str, dict[str, object]] = {}
    medians: dict[str, float] = {}
    print(f"{'command':32s} {'n':>3s} {'median':>8s} {'p10':>8s} {'p90':>8s}  {'/ nvidia-smi':>12s}  exit")
    for name, values in times.items():
        med = medians[name] = statistics.median(values)
        ratio = med / base if base else None
        results[name] = {"n": len(values), "median_ms": med, "p10_ms": quantile(values, 0.1),
                         "p90_ms": quantile(values, 0.9), "min_ms": min(values), "ratio_to_smi": ratio,
                         "exit_codes": sorted(codes[name]), "argv": live[name][:6]}  # fmt: skip
        r = f"{ratio:12.2f}" if ratio else f"{'-':>12s}"
        print(f"{name:32s} {len(values):3d} {med:8.1f} {quantile(values, 0.1):8.1f} {quantile(values, 0.9):8.1f}  {r}"
              f"  {sorted(codes[name])}")
    goal = None
    if base:
        worst = max((m for k, m in medians.items() if k.startswith("nvmlcheck")), default=None)  # not "-m", "base"
        goal = {"limit_ms": 2 * base, "worst_nvmlcheck_ms": worst, "met": worst is not None and worst <= 2 * base}
        print(f"goal: every nvmlcheck one-shot <= 2 x nvidia-smi = {2 * base:.1f} ms: "
              f"{'met' if goal['met'] else 'NOT met'} (worst {worst:.1f} ms)")
    for command, floor_row in (("wait --timeout 0", "floor: wait's reads"), ("snapshot", "floor: snapshot's reads"),
                               ("ready", "floor: ready's reads")):
        if base and f"nvmlcheck {command}" in medians and floor_row in medians:
            above = medians[f"nvmlcheck {command}"] - medians[floor_row]
            print(f"{command}: {above:+.1f} ms over its floor; the floor alone is {medians[floor_row] / base:.2f}x "
                  "nvidia-smi")
    health_smi = medians.get("nvidia-smi --query-gpu (health)")
    if health_smi and "nvmlcheck ready" in medians:
        # Like for like: nvidia-smi making ready's health reads pays the driver's first-call costs too.
        like = medians["nvmlcheck ready"] / health_smi
        print(f"ready against nvidia-smi reading the same health fields: {like:.2f}x")
    paired: dict[str, dict[str, float]] = {}
    for name in BASE_ROWS:
        base_name = f"base {name[len('nvmlcheck '):]}"
        if name in times and base_name in times:
            # Per round, this version minus the base: the host's drift cancels within a round.
            diffs = [a - b for a, b in zip(times[name], times[base_name], strict=False)]
            paired[name] = {"median_ms": statistics.median(diffs), "p25_ms": quantile(diffs, 0.25),
                            "p75_ms": quantile(diffs, 0.75), "n": len(diffs)}  # fmt: skip
            print(f"{name} minus base, per round: median {paired[name]['median_ms']:+.1f} ms "
                  f"(p25 {paired[name]['p25_ms']:+.1f}, p75 {paired[name]['p75_ms']:+.1f}, {len(diffs)} rounds)")
    version = subprocess.run([py, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    doc = {"python": py, "script": args.script, "base_script": args.base_script, "version": version,
           "paired_to_base": paired,
           "rounds": rounds, "skipped": {k: v for k, v in cmds.items() if isinstance(v, str)},
           "results": results, "goal": goal, "wall_s": time.monotonic() - t_start}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "oneshot.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'oneshot.json'} ({doc['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
