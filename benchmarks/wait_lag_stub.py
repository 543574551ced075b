"""Detection lag and CPU cost of ``wait_until_clean`` on the stub, with a time-based timeline (CPU only).

Each run loads a scenario where one H200's process leaves the list at T-30 ms and its 16 GiB come back at T ms
after the scenario loads (T random in 20..60 ms, as on a real H200: FACTS.md). The stub reports the exact load time
(``stub_loaded_ns``, CLOCK_MONOTONIC like ``time.monotonic_ns``), so the true clean moment is known to the ns; the
lag is nvmlcheck's first clean poll minus that moment. CPU is the process's user+system time over the wall time of
three 2-second waits (the stub runs in-process, so its work is counted too).

    python benchmarks/wait_lag_stub.py [--runs 200] [--json out.json] [--events]

``--events`` runs every wait with the session's NVML event listener (issue 15), to compare the lag with and without.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import time
from pathlib import Path

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StubProbe, use_stub

GIB = 1 << 30


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def run_mode(
    mode: str, runs: int, scenario_path: Path, library: Path, seed: int, *, events: bool = False
) -> dict[str, float]:
    """``runs`` short waits (clean 20..60 ms after load) for the lag, then 3 waits of 2 s for the steady CPU cost."""
    rng = random.Random(seed)
    probe = StubProbe(library)
    lags_ms: list[float] = []
    cpu_fraction: list[float] = []
    for run in range(runs + 3):
        long_wait = run >= runs
        clean_ms = 2000 if long_wait else rng.randint(20, 60)
        sc = Scenario.h200()
        sc.set_device(0, used_bytes=16 * GIB)
        sc.add_process(0, 4_123_456, used_bytes=16 * GIB, holds_bytes=0)
        sc.at_ms(clean_ms - 15).remove_process(0, 4_123_456)
        sc.at_ms(clean_ms).set_device(0, used_bytes=0)
        sc.write(scenario_path)
        with nc.open("nvml", library_path=str(library)) as gpus:
            truth_ns = probe.loaded_ns() + clean_ms * 1_000_000
            cpu0, wall0 = _cpu_s(), time.monotonic()
            result = gpus.wait_until_clean(timeout=5.0, policy=mode, events=events)
            cpu1, wall1 = _cpu_s(), time.monotonic()
        seen_ns = result.started_ns + result.clean_ns
        if seen_ns < truth_ns:
            raise AssertionError(f"{mode}: clean reported {(truth_ns - seen_ns) / 1e6:.3f} ms before it was true")
        if long_wait:
            cpu_fraction.append((cpu1 - cpu0) / (wall1 - wall0))
        else:
            lags_ms.append((seen_ns - truth_ns) / 1e6)
    return {
        "runs": runs,
        "lag_p50_ms": statistics.median(lags_ms),
        "lag_p99_ms": _percentile(lags_ms, 0.99),
        "lag_max_ms": max(lags_ms),
        "cpu_fraction_median": statistics.median(cpu_fraction),
        "cpu_fraction_max": max(cpu_fraction),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--events", action="store_true", help="wait with the NVML event listener running")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with use_stub(Scenario.h200()) as stub:
        os.environ.pop("NVMLCHECK_STUB_LOG", None)
        for mode in ("default", "precise"):
            results[mode] = run_mode(mode, args.runs, stub.scenario_path, stub.library_path, seed=1,
                                     events=args.events)
    print(f"{'mode':<9}{'runs':>6}{'lag p50':>10}{'lag p99':>10}{'lag max':>10}{'CPU median':>12}{'CPU max':>9}")
    for mode, r in results.items():
        print(
            f"{mode:<9}{int(r['runs']):>6}{r['lag_p50_ms']:>8.3f}ms{r['lag_p99_ms']:>8.3f}ms{r['lag_max_ms']:>8.3f}ms"
            f"{r['cpu_fraction_median'] * 100:>11.1f}%{r['cpu_fraction_max'] * 100:>8.1f}%"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
