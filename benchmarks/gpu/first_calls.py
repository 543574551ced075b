"""Which NVML calls cost milliseconds only the first time in a process, and which on every call.

The early thread of a one-shot makes the calls whose *first* call is slow, so that the session finds them warm; a
call that is slow on *every* call gains nothing from that and only lengthens the driver's path. For each call a
one-shot makes, in ``--runs`` fresh processes (``--reverse``: the list last to first, which moves a first cost
that several calls share) (after ``nvmlInit`` and the first handle, each call in its own order
position as listed), the 1st, 2nd and 3rd call are timed. Prints medians in µs. Uses nvidia-ml-py.

    python3 benchmarks/gpu/first_calls.py --runs 8 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
calls = [
    ("MigMode", lambda: N.nvmlDeviceGetMigMode(h)),
    ("ComputeRunningProcesses", lambda: N.nvmlDeviceGetComputeRunningProcesses(h)),
    ("MemoryInfo", lambda: N.nvmlDeviceGetMemoryInfo(h)),
    ("ClockInfo.graphics", lambda: N.nvmlDeviceGetClockInfo(h, 0)),
    ("ClockInfo.sm", lambda: N.nvmlDeviceGetClockInfo(h, 1)),
    ("ClockInfo.mem", lambda: N.nvmlDeviceGetClockInfo(h, 2)),
    ("CurrentClocksEventReasons", lambda: getattr(N, "nvmlDeviceGetCurrentClocksEventReasons",
                                                  getattr(N, "nvmlDeviceGetCurrentClocksThrottleReasons", None))(h)),
    ("UUID", lambda: N.nvmlDeviceGetUUID(h)),
    ("PciInfo", lambda: N.nvmlDeviceGetPciInfo(h)),
    ("Name", lambda: N.nvmlDeviceGetName(h)),
    ("Serial", lambda: N.nvmlDeviceGetSerial(h)),
    ("MinorNumber", lambda: N.nvmlDeviceGetMinorNumber(h)),
    ("GraphicsRunningProcesses", lambda: N.nvmlDeviceGetGraphicsRunningProcesses(h)),
    ("MPSComputeRunningProcesses", lambda: N.nvmlDeviceGetMPSComputeRunningProcesses(h)),
    ("RemappedRows", lambda: N.nvmlDeviceGetRemappedRows(h)),
    ("RetiredPagesPendingStatus", lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(h)),
    ("TotalEccErrors.volatile", lambda: N.nvmlDeviceGetTotalEccErrors(h, 1, 0)),
    ("RetiredPages.sbe", lambda: N.nvmlDeviceGetRetiredPages(h, 0)),
    ("RetiredPages.dbe", lambda: N.nvmlDeviceGetRetiredPages(h, 1)),
    ("FieldValues.recovery", lambda: N.nvmlDeviceGetFieldValues(h, [230])),
    ("FieldValues.health", lambda: N.nvmlDeviceGetFieldValues(h, [31, 142, 143, 144, 145, 4])),
    ("MaxMigDeviceCount", lambda: N.nvmlDeviceGetMaxMigDeviceCount(h)),
    ("MigDeviceHandleByIndex0", lambda: N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)),
    ("SystemDriverVersion", lambda: N.nvmlSystemGetDriverVersion()),
]
if "--reverse" in sys.argv:  # the same calls last to first: a first cost shared by several calls moves
    calls.reverse()
out = {}
for name, fn in calls:
    got = []
    for _ in range(3):
        t = time.perf_counter_ns()
        try:
            fn()
        except Exception:  # an error answers too (NOT_SUPPORTED costs time as well); the time is what is kept
            pass
        got.append((time.perf_counter_ns() - t) / 1e3)
    out[name] = got
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", default=None)
    ap.add_argument("--reverse", action="store_true", help="make the calls last to first")
    args = ap.parse_args()
    times: dict[str, list[list[float]]] = {}
    for _ in range(args.runs):
        words = [args.python, "-c", CHILD, *(["--reverse"] if args.reverse else [])]
        done = subprocess.run(words, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode:
            print(f"exit {done.returncode}: {done.stderr.strip()[-400:]}")
            return 1
        for name, got in json.loads(done.stdout).items():
            times.setdefault(name, []).append(got)
    print(f"{'call':28} {'1st us':>9} {'2nd us':>9} {'3rd us':>9}   (medians of {args.runs} fresh processes)")
    for name, runs in times.items():
        cols = [statistics.median(r[i] for r in runs) for i in range(3)]
        print(f"{name:28} {cols[0]:9.1f} {cols[1]:9.1f} {cols[2]:9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(times, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
