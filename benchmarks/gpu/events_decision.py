"""Should ``wait`` listen for NVML events by default? (issue 22) At least 30 kills per mode, on the H200.

For each run, alternating the mode: start a small holder (``python -m nvmlcheck.holder``, 256 MiB), wait until NVML
lists it, start ``raw_observer.py`` (an independent process with its own cffi declarations polling in a tight loop),
SIGKILL the holder and ``wait_until_clean`` on GPU 0 with the default predicate plus ``pids_gone``, from a session
whose event listener runs (mode ``events``) or from one without (mode ``plain``). Per run: the detection lag
(nvmlcheck's first clean poll minus the observer's), the time to verified clean, polls, cost per poll and the CPU
this process used over the wait's wall time. Also measured: what starting a listener costs a fresh session (what
``wait --events`` pays at start), and the CPU an idle listener takes over 3 s.

    python3 benchmarks/gpu/events_decision.py              # from the repo root on the GPU host; JSON to $OUT
    python3 benchmarks/gpu/events_decision.py --runs 40 --budget 170

Bounded: stops adding runs once ``--budget`` seconds (default 150) have passed, so the whole stays under 3 minutes.
Prints each mode's lag and CPU, and the difference of the medians with a bootstrap 95 % interval; the decision
(docs/events.md, "Should wait listen by default?") is the coordinator's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nvmlcheck as nc

HERE = Path(__file__).resolve().parent
HOLDER_BYTES = 256 << 20
CLEAN_BYTES = 16 << 20


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def one_kill(gpus: nc.Session, events: bool) -> dict[str, Any]:
    holder = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck.holder", "--bytes", str(HOLDER_BYTES), "--chunks", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if not line.startswith("ready"):
        holder.kill()
        holder.wait()
        raise RuntimeError(f"the holder failed: {line!r}")
    listed_by = time.monotonic() + 30
    while time.monotonic() < listed_by:
        d = gpus.snapshot([0], fields=nc.Fields.WAIT).devices[0]
        if any(p.pid == holder.pid for p in d.compute_processes or ()):
            break
        time.sleep(0.005)
    observer = subprocess.Popen(
        [sys.executable, str(HERE / "raw_observer.py"), "--pid", str(holder.pid), "--clean-bytes", str(CLEAN_BYTES)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert observer.stdout is not None
    if observer.stdout.readline().strip() != "ready":
        holder.kill()
        holder.wait()
        observer.kill()
        observer.wait()
        raise RuntimeError("the observer did not start")
    reaper = threading.Thread(target=holder.wait)
    killed_ns = time.monotonic_ns()
    os.kill(holder.pid, signal.SIGKILL)
    reaper.start()
    cpu0, wall0 = _cpu_s(), time.monotonic()
    result = gpus.wait_until_clean(
        timeout=30, predicate=nc.default_predicate() & nc.pids_gone([holder.pid]), devices=[0], events=events
    )
    cpu1, wall1 = _cpu_s(), time.monotonic()
    truth = json.loads(observer.stdout.readline())
    observer.wait()
    reaper.join()
    return {
        "mode": "events" if events else "plain",
        **wait_times_ms(result, killed_ns, truth["clean_ns"]),
        "observer_period_us": truth["period_ns"] / 1e3,
        "polls": result.polls,
        "poll_cost_us": result.poll_cost_ns / 1e3,
        "cpu_fraction": (cpu1 - cpu0) / max(1e-9, wall1 - wall0),
    }


def wait_times_ms(result: nc.WaitResult, killed_ns: int, observer_clean_ns: int) -> dict[str, float]:
    """A run's times in ms from the signal (``killed_ns``, an absolute ``time.monotonic_ns``), and the lag against
    the observer's absolute clean stamp. ``result.clean_ns`` and ``result.confirmed_ns`` are offsets from
    ``result.started_ns`` (the one absolute reading), so each is made absolute before any difference is taken."""
    clean_ns = result.started_ns + result.clean_ns
    confirmed_ns = result.started_ns + result.confirmed_ns
    return {
        "lag_ms": (clean_ns - observer_clean_ns) / 1e6,
        "observer_clean_ms": (observer_clean_ns - killed_ns) / 1e6,
        "nvmlcheck_clean_ms": (clean_ns - killed_ns) / 1e6,
        "verified_ms": (confirmed_ns - killed_ns) / 1e6,
    }


def listener_start_ms(n: int) -> list[float]:
    """What ``listen()`` costs a fresh session (registration on every GPU, the thread's start)."""
    out = []
    for _ in range(n):
        with nc.open("nvml") as s:
            t0 = time.perf_counter()
            s.listen()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def idle_cpu(gpus: nc.Session, seconds: float) -> float:
    """This process's CPU fraction over ``seconds`` of sleep (with whatever listener ``gpus`` runs)."""
    cpu0, wall0 = _cpu_s(), time.monotonic()
    time.sleep(seconds)
    return (_cpu_s() - cpu0) / (time.monotonic() - wall0)


def bootstrap_diff(a: list[float], b: list[float], rounds: int = 2000) -> tuple[float, float, float]:
    """median(a) - median(b) and its percentile-bootstrap 95 % interval (seeded: the run is repeatable)."""
    rng = random.Random(22)
    diffs = sorted(
        statistics.median(rng.choices(a, k=len(a))) - statistics.median(rng.choices(b, k=len(b)))
        for _ in range(rounds)
    )
    return statistics.median(a) - statistics.median(b), diffs[int(0.025 * rounds)], diffs[int(0.975 * rounds)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="kills per mode (default 32)")
    parser.add_argument("--budget", type=float, default=150.0, help="stop adding runs after this many seconds")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for events_decision.json")
    args = parser.parse_args()
    t_start = time.monotonic()
    rows: list[dict[str, Any]] = []
    with nc.open("nvml") as plain, nc.open("nvml") as listening:
        listener = listening.listen()
        print(f"listener: state {listener.state}, covered {sorted(listener.covered)}, reason {listener.reason}")
        plain.wait_until_clean(timeout=30, devices=[0])
        one_kill(plain, False)  # warm-up (CUDA, the page cache), discarded
        idle = {"plain": idle_cpu(plain, 3.0)}
        for i in range(2 * args.runs):
            if time.monotonic() - t_start > args.budget:
                print(f"budget of {args.budget:.0f} s spent after {len(rows)} kills")
                break
            events = i % 2 == 1
            row = one_kill(listening if events else plain, events)
            row["run"] = i // 2
            rows.append(row)
            print(json.dumps(row), flush=True)
        idle["events"] = idle_cpu(listening, 3.0)
        seen = [e.to_json() for e in listener.events]
        listener_state = {"state": listener.state, "reason": listener.reason, "covered": sorted(listener.covered)}
    starts = listener_start_ms(10)
    summary: dict[str, Any] = {}
    print(f"\n{'mode':<8}{'n':>4}{'lag p50':>10}{'p90':>9}{'p99':>9}{'max':>9}{'verified p50':>14}"
          f"{'poll µs':>9}{'CPU':>7}")
    for mode in ("plain", "events"):
        sel = [r for r in rows if r["mode"] == mode]
        if not sel:
            continue
        lags = [r["lag_ms"] for r in sel]
        s = summary[mode] = {
            "n": len(sel), "lag_p50_ms": statistics.median(lags), "lag_p90_ms": _q(lags, 0.9),
            "lag_p99_ms": _q(lags, 0.99), "lag_max_ms": max(lags), "lag_min_ms": min(lags),
            "verified_p50_ms": statistics.median(r["verified_ms"] for r in sel),
            "poll_cost_p50_us": statistics.median(r["poll_cost_us"] for r in sel),
            "cpu_p50": statistics.median(r["cpu_fraction"] for r in sel), "idle_cpu": idle[mode],
        }  # fmt: skip
        print(f"{mode:<8}{s['n']:>4}{s['lag_p50_ms']:>8.3f}ms{s['lag_p90_ms']:>7.3f}ms{s['lag_p99_ms']:>7.3f}ms"
              f"{s['lag_max_ms']:>7.3f}ms{s['verified_p50_ms']:>12.1f}ms{s['poll_cost_p50_us']:>9.1f}"
              f"{s['cpu_p50'] * 100:>6.1f}%")  # fmt: skip
    comparison = None
    if "plain" in summary and "events" in summary:
        lag = bootstrap_diff([r["lag_ms"] for r in rows if r["mode"] == "events"],
                             [r["lag_ms"] for r in rows if r["mode"] == "plain"])  # fmt: skip
        cpu = bootstrap_diff([r["cpu_fraction"] for r in rows if r["mode"] == "events"],
                             [r["cpu_fraction"] for r in rows if r["mode"] == "plain"])  # fmt: skip
        comparison = {"lag_diff_ms": lag, "cpu_diff": cpu}
        print(f"events - plain, median lag: {lag[0]:+.3f} ms (95 % CI {lag[1]:+.3f} .. {lag[2]:+.3f})")
        print(f"events - plain, median CPU: {cpu[0] * 100:+.2f} points (95 % CI {cpu[1] * 100:+.2f} .. "
              f"{cpu[2] * 100:+.2f})")  # fmt: skip
    print(f"idle CPU over 3 s: plain {idle['plain'] * 100:.2f} %, listening {idle['events'] * 100:.2f} %")
    print(f"listen() on a fresh session: median {statistics.median(starts):.2f} ms, max {max(starts):.2f} ms (n=10)")
    print(f"events heard during the runs: {len(seen)} ({sorted({e['kind'] for e in seen})})")
    doc = {"runs": rows, "summary": summary, "comparison": comparison, "idle_cpu": idle,
           "listen_start_ms": starts, "listener": listener_state, "events": seen, "holder_bytes": HOLDER_BYTES,
           "wall_s": time.monotonic() - t_start}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "events_decision.json").write_text(json.dumps(doc, indent=1))
    print(f"wrote {out / 'events_decision.json'} ({doc['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
