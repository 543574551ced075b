"""On a real GPU: nvmlcheck's detection lag against an independent raw observer, and kill-to-verified-clean time
against ``sleep 3 && nvidia-smi``.

For each size and run: start a holder (``python -m nvmlcheck.holder``), start ``raw_observer.py`` (its own cffi
declarations, a tight loop of raw NVML calls, in its own process), SIGKILL the holder, and wait with
``wait_until_clean`` (default or precise policy, alternating runs). The observer's first clean poll is the true
clean moment (to within its period); nvmlcheck's lag is its first clean poll minus that. CPU is this process's
user+system time during the wait over the wait's wall time.

    python benchmarks/gpu/reclaim_lag.py --sizes 1GiB,16GiB,64GiB,120GiB --runs 5 --json out.json

``--events`` starts the session's NVML event listener first (issue 15): every wait then runs with it, so the lag
with and without it can be compared; the listener's state, reason and the events it saw are printed and saved.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nvmlcheck as nc
from nvmlcheck.study.child import parse_size

HERE = Path(__file__).resolve().parent


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def one_run(gpus: nc.Session, nbytes: int, mode: str, clean_bytes: int) -> dict[str, Any]:
    chunks = max(1, nbytes // (16 << 30))
    holder = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck.holder", "--bytes", str(nbytes), "--chunks", str(chunks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if not line.startswith("ready"):
        holder.kill()
        raise RuntimeError(f"holder failed: {line!r}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until NVML lists it with its memory
        d = gpus.snapshot(0, fields=nc.Fields.WAIT).devices[0]
        if any(p.pid == holder.pid for p in d.compute_processes or ()) and d.memory and d.memory.used_bytes >= nbytes:
            break
        time.sleep(0.005)
    observer = subprocess.Popen(
        [sys.executable, str(HERE / "raw_observer.py"), "--pid", str(holder.pid), "--clean-bytes", str(clean_bytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert observer.stdout is not None
    assert observer.stdout.readline().strip() == "ready"
    reaped: dict[str, int] = {}

    def reap() -> None:
        os.waitpid(holder.pid, 0)
        reaped["ns"] = time.monotonic_ns()

    killed_ns = time.monotonic_ns()
    os.kill(holder.pid, signal.SIGKILL)
    reaper = threading.Thread(target=reap)
    reaper.start()
    cpu0, wall0 = _cpu_s(), time.monotonic()
    result = gpus.wait_until_clean(
        timeout=30, predicate=nc.default_predicate() & nc.pids_gone([holder.pid]), devices=[0], policy=mode
    )
    cpu1, wall1 = _cpu_s(), time.monotonic()
    truth = json.loads(observer.stdout.readline())
    observer.wait()
    reaper.join()
    holder.returncode = -9  # reaped by the thread above
    ours_ns = result.started_ns + result.clean_ns
    return {
        "bytes": nbytes,
        "mode": mode,
        "observer_clean_ms": (truth["clean_ns"] - killed_ns) / 1e6,
        "observer_off_list_ms": (truth["off_list_ns"] - killed_ns) / 1e6,
        "observer_period_us": truth["period_ns"] / 1e3,
        "waitpid_ms": (reaped["ns"] - killed_ns) / 1e6,
        "nvmlcheck_clean_ms": (ours_ns - killed_ns) / 1e6,
        "nvmlcheck_confirmed_ms": (result.started_ns + result.confirmed_ns - killed_ns) / 1e6,
        "lag_ms": (ours_ns - truth["clean_ns"]) / 1e6,
        "polls": result.polls,
        "poll_cost_us": result.poll_cost_ns / 1e3,
        "interval_us": result.interval_ns / 1e3,
        "cpu_fraction": (cpu1 - cpu0) / (wall1 - wall0),
    }


def sleep3_nvidia_smi_s() -> float | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    start = time.monotonic()
    subprocess.run(f"sleep 3 && {smi} | grep MiB", shell=True, check=False, capture_output=True)
    return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1GiB,16GiB,64GiB,120GiB")
    parser.add_argument("--runs", type=int, default=5, help="runs per size and mode")
    parser.add_argument("--modes", default="default,precise")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--events", action="store_true", help="run every wait with the NVML event listener")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    rows: list[dict[str, Any]] = []
    events: dict[str, Any] | None = None
    with nc.open("nvml") as gpus:
        listener = gpus.listen() if args.events else None
        if listener is not None:
            print(f"events: state {listener.state}, covered {sorted(listener.covered)}, reason {listener.reason}")
        gpus.wait_until_clean(timeout=30, devices=[0])
        clean_bytes = 16 << 20
        one_run(gpus, 1 << 30, "default", clean_bytes)  # warm-up, discarded
        for nbytes in sizes:
            for run in range(args.runs):
                for mode in modes:
                    row = one_run(gpus, nbytes, mode, clean_bytes)
                    row["run"] = run
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        if listener is not None:
            events = {
                "state": listener.state,
                "reason": listener.reason,
                "covered": sorted(listener.covered),
                "events": [e.to_json() for e in listener.events],
            }
            thread = listener.thread
    if listener is not None:
        assert events is not None
        events["thread_alive_after_close"] = thread is not None and thread.is_alive()
        events["state_after_close"] = listener.state
        print(f"events: {json.dumps(events)}")
    ritual = sleep3_nvidia_smi_s()
    print(
        f"\n{'size':>8} {'mode':<8}{'n':>3}{'truth p50':>11}{'lag p50':>10}{'lag p99':>10}{'lag max':>10}"
        f"{'verified p50':>14}{'CPU':>7}"
    )
    summary: list[dict[str, Any]] = []
    for nbytes in sizes:
        for mode in modes:
            sel = [r for r in rows if r["bytes"] == nbytes and r["mode"] == mode]
            lags = [r["lag_ms"] for r in sel]
            s = {
                "bytes": nbytes,
                "mode": mode,
                "n": len(sel),
                "truth_p50_ms": statistics.median(r["observer_clean_ms"] for r in sel),
                "lag_p50_ms": statistics.median(lags),
                "lag_p99_ms": _pct(lags, 0.99),
                "lag_max_ms": max(lags),
                "lag_min_ms": min(lags),
                "verified_p50_ms": statistics.median(r["nvmlcheck_confirmed_ms"] for r in sel),
                "cpu_median": statistics.median(r["cpu_fraction"] for r in sel),
            }
            summary.append(s)
            print(
                f"{nbytes >> 30:>5}GiB {mode:<8}{s['n']:>3}{s['truth_p50_ms']:>9.1f}ms{s['lag_p50_ms']:>8.3f}ms"
                f"{s['lag_p99_ms']:>8.3f}ms{s['lag_max_ms']:>8.3f}ms{s['verified_p50_ms']:>12.1f}ms"
                f"{s['cpu_median'] * 100:>6.1f}%"
            )
    for mode in modes:
        lags = [r["lag_ms"] for r in rows if r["mode"] == mode]
        print(
            f"all sizes {mode}: n={len(lags)} lag p50 {statistics.median(lags):.3f} ms, p99 {_pct(lags, 0.99):.3f} ms,"
            f" min {min(lags):.3f} ms (negative = before the observer saw it)"
        )
    if ritual is not None:
        verified = statistics.median(r["nvmlcheck_confirmed_ms"] for r in rows if r["mode"] == "default")
        print(
            f"`sleep 3 && nvidia-smi | grep MiB`: {ritual:.3f} s; nvmlcheck kill-to-verified-clean median "
            f"{verified / 1000:.3f} s ({ritual * 1000 / verified:.0f}x shorter)"
        )
    if args.json:
        doc = {"runs": rows, "summary": summary, "sleep3_nvidia_smi_s": ritual, "events": events}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
