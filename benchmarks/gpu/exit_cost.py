"""What a process's exit costs once it has NVML open: the floor under "kill exits within 10 ms of the memory back"
and under every one-shot's wall time.

For each variant, ``--runs`` times, interleaved: a child interpreter does its part, writes one line with a
CLOCK_MONOTONIC stamp and ends with ``os._exit(0)``; the parent stamps the line's arrival and the ``waitpid`` that
reaps the child. Printed: the child's own phases (``nvmlInit_v2``, the first handle, a memory read, and for
``shutdown`` an ``nvmlShutdown`` before the stamp) and line → reaped (what the exit itself costs: the kernel closing
the driver's files). Variants: ``bare`` (no NVML), ``nvml`` (init + handle + memory read, then exit with NVML open),
``shutdown`` (the same, ``nvmlShutdown`` first), ``noattach`` (``nvmlInitWithFlags(NVML_INIT_FLAG_NO_ATTACH)``
instead of ``nvmlInit_v2``: where the init's time goes when it attaches no GPU), and what a one-shot adds to
``nvml``: ``thread`` (the start in another thread), ``reads`` (ready's MIG, process and health reads), ``heap``
(~20 MB more Python heap). ctypes only, so the figures are
the driver's, not a binding's.

    python3 benchmarks/gpu/exit_cost.py [--runs 20] [--python /usr/bin/python3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import ctypes, os, sys, time
variant = sys.argv[1]
phases = {}
def timed(key, call):  # a failing call is kept as its return code (NO_ATTACH's first handle fails), not raised
    t = time.monotonic_ns(); rc = call(); phases[key] = (time.monotonic_ns() - t) / 1e6
    if rc:
        phases[key.replace("_ms", "_rc")] = rc
def start():
    global lib, h
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    timed("init_ms", lambda: lib.nvmlInitWithFlags(2) if variant == "noattach" else lib.nvmlInit_v2())  # 2: NO_ATTACH
    h = ctypes.c_void_p()
    timed("handle_ms", lambda: lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)))
    mem = ctypes.create_string_buffer(64); ctypes.cast(mem, ctypes.POINTER(ctypes.c_uint))[0] = (2 << 24) | 40
    timed("memory_ms", lambda: lib.nvmlDeviceGetMemoryInfo_v2(h, mem))
if variant == "thread":  # the NVML start in another thread (as a one-shot's early start), ended before the exit
    import threading
    t = threading.Thread(target=start); t.start(); t.join()
elif variant != "bare":
    start()
if variant == "reads":  # ready's further reads: MIG mode, the process list, the health calls
    u = (ctypes.c_uint * 4)(); ull = ctypes.c_ulonglong(); fv = ctypes.create_string_buffer(64)
    ctypes.cast(fv, ctypes.POINTER(ctypes.c_uint))[0] = 230
    def reads():
        lib.nvmlDeviceGetMigMode(h, u, ctypes.byref(u, 4)); u[2] = 0
        lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(u, 8), None)
        lib.nvmlDeviceGetRemappedRows(h, u, ctypes.byref(u, 4), ctypes.byref(u, 8), ctypes.byref(u, 12))
        lib.nvmlDeviceGetRetiredPagesPendingStatus(h, u)
        lib.nvmlDeviceGetTotalEccErrors(h, 1, 0, ctypes.byref(ull))
        return lib.nvmlDeviceGetFieldValues(h, 1, fv)
    timed("reads_ms", reads)
if variant == "heap":  # a Python heap of a one-shot's size (~20 MB more), NVML as in "nvml"
    keep = [str(i) * 4 for i in range(300_000)]
if variant == "shutdown":
    timed("shutdown_ms", lib.nvmlShutdown)
phases["stamp_ns"] = time.monotonic_ns()
os.write(1, (repr(phases) + "\n").encode())
os._exit(0)
"""


_COLUMNS = ("init_ms", "handle_ms", "memory_ms", "reads_ms", "shutdown_ms", "exit_ms")


def once(py: str, variant: str) -> dict[str, float]:
    child = subprocess.Popen([py, "-c", CHILD, variant], stdout=subprocess.PIPE)
    assert child.stdout is not None
    line = child.stdout.readline()
    seen_ns = time.monotonic_ns()
    _, status = os.waitpid(child.pid, 0)
    reaped_ns = time.monotonic_ns()
    child.returncode = os.waitstatus_to_exitcode(status)
    phases = eval(line)  # our own child's repr of a dict of numbers
    stamp = phases.pop("stamp_ns")
    return {**phases, "line_ms": (seen_ns - stamp) / 1e6, "exit_ms": (reaped_ns - stamp) / 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    variants = ("bare", "nvml", "shutdown", "noattach", "thread", "reads", "heap")
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for v in variants:
        once(args.python, v)  # warm-up, not counted
    for _ in range(args.runs):
        for v in variants:
            rows[v].append(once(args.python, v))
    print(f"{'variant':10s} {'n':>3s}  " + "  ".join(f"{k:>12s}" for k in
          _COLUMNS) + "   (medians)")  # fmt: skip
    summary: dict[str, dict[str, float]] = {}
    for v, rs in rows.items():
        summary[v] = {k: statistics.median(r[k] for r in rs) for k in rs[0] if not k.endswith("_rc")}
        codes = sorted({f"{k}={r[k]}" for r in rs for k in r if k.endswith("_rc")})
        cells = [f"{summary[v][k]:12.3f}" if k in summary[v] else f"{'-':>12s}"
                 for k in _COLUMNS]
        print(f"{v:10s} {len(rs):3d}  " + "  ".join(cells) + (f"   failed: {', '.join(codes)}" if codes else ""))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "exit_cost.json").write_text(json.dumps({"python": args.python, "summary": summary, "runs": rows},
                                                   indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
