"""Where a CLI start goes on a GPU host: -X importtime of `kill` and `wait --timeout 0`, a cProfile of
`wait --timeout 0` in-process, and the cost of each NVML call of a first wait poll (cold, right after nvmlInit).

    python3 benchmarks/gpu/startup_profile.py --python /usr/bin/python3 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CALLS = r"""
import ctypes, json, time
lib = ctypes.CDLL("libnvidia-ml.so.1")
t = {}
def timed(name, fn, *a):
    t0 = time.perf_counter_ns(); rc = fn(*a); t[name] = (time.perf_counter_ns() - t0) / 1e3; return rc
timed("nvmlInit_v2", lib.nvmlInit_v2)
n = ctypes.c_uint(); timed("nvmlDeviceGetCount_v2", lib.nvmlDeviceGetCount_v2, ctypes.byref(n))
h = ctypes.c_void_p(); timed("nvmlDeviceGetHandleByIndex_v2", lib.nvmlDeviceGetHandleByIndex_v2, 0, ctypes.byref(h))
buf = ctypes.create_string_buffer(256)
for name in ("nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetSerial"):
    timed(name, getattr(lib, name), h, buf, 256)
pci = ctypes.create_string_buffer(128); timed("nvmlDeviceGetPciInfo_v3", lib.nvmlDeviceGetPciInfo_v3, h, pci)
m = ctypes.c_uint(); timed("nvmlDeviceGetMinorNumber", lib.nvmlDeviceGetMinorNumber, h, ctypes.byref(m))
for name in ("nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion"):
    timed(name, getattr(lib, name), buf, 80)
c = ctypes.c_int(); timed("nvmlSystemGetCudaDriverVersion_v2", lib.nvmlSystemGetCudaDriverVersion_v2, ctypes.byref(c))
mem = ctypes.create_string_buffer(64); ctypes.cast(mem, ctypes.POINTER(ctypes.c_uint))[0] = (2 << 24) | 40
timed("nvmlDeviceGetMemoryInfo_v2", lib.nvmlDeviceGetMemoryInfo_v2, h, mem)
cnt = ctypes.c_uint(0)
for name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
             "nvmlDeviceGetMPSComputeRunningProcesses_v3"):
    cnt.value = 0; timed(name, getattr(lib, name), h, ctypes.byref(cnt), None)
u = [ctypes.c_uint() for _ in range(4)]
timed("nvmlDeviceGetRemappedRows", lib.nvmlDeviceGetRemappedRows, h, *[ctypes.byref(x) for x in u])
timed("nvmlDeviceGetRetiredPagesPendingStatus", lib.nvmlDeviceGetRetiredPagesPendingStatus, h, ctypes.byref(u[0]))
ull = ctypes.c_ulonglong()
timed("nvmlDeviceGetTotalEccErrors", lib.nvmlDeviceGetTotalEccErrors, h, 1, 0, ctypes.byref(ull))
fv = ctypes.create_string_buffer(64); ctypes.cast(fv, ctypes.POINTER(ctypes.c_uint))[0] = 230
timed("nvmlDeviceGetFieldValues", lib.nvmlDeviceGetFieldValues, h, 1, fv)
for dom in range(2):
    timed(f"nvmlDeviceGetClockInfo[{dom}]", lib.nvmlDeviceGetClockInfo, h, dom, ctypes.byref(u[0]))
    timed(f"nvmlDeviceGetMaxClockInfo[{dom}]", lib.nvmlDeviceGetMaxClockInfo, h, dom, ctypes.byref(u[0]))
    timed(f"nvmlDeviceGetApplicationsClock[{dom}]", lib.nvmlDeviceGetApplicationsClock, h, dom, ctypes.byref(u[0]))
timed("nvmlShutdown", lib.nvmlShutdown)
print(json.dumps(t))
"""

PROFILE = r"""
import cProfile, pstats, sys, io
from nvmlcheck.cli import main
pr = cProfile.Profile(); pr.enable(); main(["wait", "--timeout", "0"]); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(45); print(s.getvalue())
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    out = Path(args.out)
    py = args.python
    sleeper = subprocess.Popen([py, "-c", "import time; time.sleep(60)"])
    try:
        for name, argv in {"importtime_kill": ["-m", "nvmlcheck", "kill", str(sleeper.pid), "--timeout", "5"],
                           "importtime_wait0": ["-m", "nvmlcheck", "wait", "--timeout", "0"],
                           "importtime_snapshot": ["-m", "nvmlcheck", "snapshot"],
                           "importtime_ready": ["-m", "nvmlcheck", "ready"]}.items():
            done = subprocess.run([py, "-X", "importtime", *argv], capture_output=True, text=True, check=False)
            (out / f"{name}.txt").write_text(done.stderr)
    finally:
        sleeper.kill()
        sleeper.wait()
    done = subprocess.run([py, "-c", PROFILE], capture_output=True, text=True, check=False)
    (out / "profile_wait0.txt").write_text(done.stdout + done.stderr)
    calls = []
    for _ in range(3):
        done = subprocess.run([py, "-c", CALLS], capture_output=True, text=True, check=False)
        calls.append(json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]})
        time.sleep(0.2)
    (out / "nvml_calls_us.json").write_text(json.dumps(calls, indent=1))
    for k in calls[0]:
        print(f"{k:45s}", "  ".join(f"{c.get(k, 0):9.1f}" for c in calls), "µs")
    print(os.path.basename(py), "done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
