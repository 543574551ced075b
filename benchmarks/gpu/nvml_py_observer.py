"""An independent observer through nvidia-ml-py (``import pynvml``), sharing no code with nvmlcheck.

    python nvml_py_observer.py --pid PID --device 0 --clean-bytes N [--timeout 30]

The same contract as raw_observer.py (which uses its own cffi declarations): prints ``ready`` after its first poll,
then polls ``nvmlDeviceGetMemoryInfo`` (v2: ``used`` without the driver's reserve) and the compute process list back
to back until the PID is off the list and
``used`` is at most ``--clean-bytes``, and prints one JSON line with the ``time.monotonic_ns()`` readings
(CLOCK_MONOTONIC, comparable across processes) of the first poll that saw each. Exits 3 when nvidia-ml-py is not
installed or too old for the v2 memory call (the caller then uses raw_observer.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--clean-bytes", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args()
    try:
        import pynvml
    except ImportError:
        print("nvidia-ml-py is not installed", file=sys.stderr)
        return 3
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(args.device)
    now = time.monotonic_ns
    v2 = getattr(pynvml, "nvmlMemory_v2", None)
    if v2 is None:  # "used" would include the driver's reserve: not comparable with --clean-bytes (v2's used)
        print("this nvidia-ml-py has no nvmlMemory_v2", file=sys.stderr)
        return 3

    def poll() -> tuple[int, bool, bool]:
        used = pynvml.nvmlDeviceGetMemoryInfo(h, version=v2).used
        listed = any(p.pid == args.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h))
        return now(), listed, used <= args.clean_bytes

    poll()
    print("ready", flush=True)
    deadline = now() + int(args.timeout * 1e9)
    times: list[int] = []
    off_list = clean = None
    while now() < deadline:
        t, listed, back = poll()
        times.append(t)
        if not listed and off_list is None:
            off_list = t
        if back and not listed and clean is None:
            clean = t
        if off_list is not None and clean is not None:
            break
    periods = [b - a for a, b in itertools.pairwise(times)]
    print(json.dumps({"off_list_ns": off_list, "clean_ns": clean, "polls": len(times),
                      "period_ns": statistics.median(periods) if periods else None, "observer": "nvidia-ml-py"}),
          flush=True)
    return 0 if clean is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
