"""Issue 27 on a real GPU: what the event listener's wait slice costs (WAIT_SLICE_MS: 10 ms now, 100 ms before).

For each slice: the CPU the listening thread takes per second (process CPU time while the main thread sleeps), the
``nvmlEventSetWait_v2`` calls per second, and how long ``EventListener.stop()`` takes when called at a random point
of a slice (what a session's close adds to a command). Writes ``event_slice.json`` to ``--out`` (default $OUT).

    python3 benchmarks/gpu/event_slice.py --out DIR          # ~30 s
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import nvmlcheck as nc


def measure(gpus: nc.Session, slice_ms: int, listen_s: float, stops: int) -> dict[str, Any]:
    calls = 0

    def counted(factory_listener: Any) -> Any:
        source = factory_listener._source
        real_wait = source.wait

        def wait(event_set: object, timeout_ms: int) -> Any:
            nonlocal calls
            calls += 1
            return real_wait(event_set, timeout_ms)

        source.wait = wait
        factory_listener._slice = slice_ms
        return factory_listener

    listener = counted(gpus.backend.event_listener()).start()  # type: ignore[attr-defined]
    assert listener.active, listener.reason
    cpu0, wall0, calls0 = time.process_time(), time.monotonic(), calls
    time.sleep(listen_s)
    cpu = time.process_time() - cpu0
    wall = time.monotonic() - wall0
    per_s = (calls - calls0) / wall
    listener.stop()
    latencies = []
    rng = random.Random(27)
    for _ in range(stops):
        one = counted(gpus.backend.event_listener()).start()  # type: ignore[attr-defined]
        time.sleep(0.05 + rng.random() * slice_ms / 1000)
        t0 = time.perf_counter()
        one.stop()
        latencies.append((time.perf_counter() - t0) * 1e3)
    return {"slice_ms": slice_ms, "listening_cpu_ms_per_s": cpu / wall * 1e3, "wait_calls_per_s": per_s,
            "stop_ms_median": statistics.median(latencies), "stop_ms_max": max(latencies),
            "stop_ms_p90": statistics.quantiles(latencies, n=10)[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--listen-s", type=float, default=5.0)
    parser.add_argument("--stops", type=int, default=40)
    args = parser.parse_args()
    results = []
    with nc.open("nvml") as gpus:
        for slice_ms in (10, 100):
            results.append(measure(gpus, slice_ms, args.listen_s, args.stops))
            print(json.dumps(results[-1]), flush=True)
    out = Path(args.out) / "event_slice.json"
    out.write_text(json.dumps({"nvmlcheck": nc.__version__, "results": results}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
