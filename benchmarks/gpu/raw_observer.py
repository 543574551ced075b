"""An independent observer for reclaim timing: a tight loop of raw NVML calls, sharing no code with nvmlcheck.

    python raw_observer.py --pid PID --device 0 --clean-bytes N [--timeout 30]

It opens libnvidia-ml with its own cffi declarations, prints ``ready`` after its first poll, then polls
``nvmlDeviceGetMemoryInfo_v2`` and the three ``_v3`` process lists back to back until the PID is off every list and
``used`` is at most ``--clean-bytes``. It prints one JSON line: the ``time.monotonic_ns()`` readings
(CLOCK_MONOTONIC, comparable across processes) of the first poll that saw the PID gone and the first that saw the
memory back, the poll before each, and its poll count and median poll period (its resolution).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from typing import Any

import cffi

CDEF = """
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem2_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device);
int nvmlDeviceGetMemoryInfo_v2(void *device, mem2_t *memory);
int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *count, proc_t *infos);
int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, unsigned int *count, proc_t *infos);
int nvmlDeviceGetMPSComputeRunningProcesses_v3(void *device, unsigned int *count, proc_t *infos);
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--clean-bytes", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    lib: Any = ffi.dlopen("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0
    handle = ffi.new("void **")
    assert lib.nvmlDeviceGetHandleByIndex_v2(args.device, handle) == 0
    h = handle[0]
    mem: Any = ffi.new("mem2_t *")
    mem.version = ffi.sizeof("mem2_t") | (2 << 24)
    count = ffi.new("unsigned int *")
    procs = ffi.new("proc_t[]", 256)
    get_mem, get_procs, now = (
        lib.nvmlDeviceGetMemoryInfo_v2,
        lib.nvmlDeviceGetComputeRunningProcesses_v3,
        time.monotonic_ns,
    )
    pid, limit = args.pid, args.clean_bytes

    def poll() -> tuple[int, bool, bool]:
        assert get_mem(h, mem) == 0
        count[0] = 256
        assert get_procs(h, count, procs) == 0
        listed = any(procs[i].pid == pid for i in range(count[0]))
        return now(), listed, mem.used <= limit

    poll()
    print("ready", flush=True)
    deadline = now() + int(args.timeout * 1e9)
    times: list[int] = []
    off_list = clean = last_listed = last_dirty = None
    while now() < deadline:
        t, listed, memory_back = poll()
        times.append(t)
        if listed:
            last_listed = t
        elif off_list is None:
            off_list = t
        if not memory_back:
            last_dirty = t
        elif clean is None and not listed:
            clean = t
        if off_list is not None and clean is not None:
            break
    periods = [b - a for a, b in itertools.pairwise(times)]
    json.dump(
        {
            "off_list_ns": off_list,
            "last_listed_ns": last_listed,
            "clean_ns": clean,
            "last_dirty_ns": last_dirty,
            "polls": len(times),
            "period_ns": statistics.median(periods) if periods else None,
        },
        sys.stdout,
    )
    print(flush=True)
    return 0 if clean is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
