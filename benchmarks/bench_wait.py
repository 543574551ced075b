"""Micro-benchmarks of the poller's own work: predicate evaluation and per-poll overhead, on synthetic snapshots
of 8 H200s with a few processes. No GPU and no backend: ``snapshot_fn`` returns prebuilt snapshots, so what is
measured is nvmlcheck's judgement and bookkeeping, which the default mode's CPU budget must leave room for
(5 % of a core at one poll per ms is 50 µs per poll, of which NVML itself takes ~30-40 µs on one GPU: FACTS).

    pytest benchmarks/bench_wait.py --benchmark-enable
    python benchmarks/bench_wait.py            # one-shot summary: µs per poll, per predicate call
    python benchmarks/bench_wait.py --realtime # real clock and sleep, simulated 35 µs query: lag p50/p99, CPU
    python benchmarks/bench_wait.py --nvml     # a real GPU: query cost, CPU while waiting (DEFAULT, PRECISE)

Per-poll figures are ``extra_info["per_poll_us"]`` (a whole wait of ``POLLS`` polls divided by ``POLLS``).
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))

from snapshots import GIB, dev, proc, snap

from nvmlcheck.model import ProcessKind, Snapshot
from nvmlcheck.predicates import Predicate, default_predicate, no_processes, on_devices, pids_gone
from nvmlcheck.wait import DEFAULT, PRECISE, PollPolicy, TracePoint, poll_until

try:
    from pytest_benchmark.fixture import BenchmarkFixture
except ImportError:  # pragma: no cover - the one-shot summary works without pytest-benchmark
    BenchmarkFixture = object  # type: ignore[assignment,misc]

GPUS = 8
POLLS = 1000


def _dirty() -> Snapshot:
    """8 GPUs; GPU 0 and 3 hold compute processes, GPU 5 a graphics one, GPU 6 memory with no visible process."""
    devices = []
    for i in range(GPUS):
        if i == 0:
            devices.append(dev(i, procs=[proc(1000, 40 * GIB), proc(1001, 2 * GIB, name="torchrun")]))
        elif i == 3:
            devices.append(dev(i, procs=[proc(3000, 70 * GIB, name="sglang::scheduler")]))
        elif i == 5:
            devices.append(dev(i, graphics=[proc(5000, GIB, name="Xorg", kind=ProcessKind.GRAPHICS)]))
        elif i == 6:
            devices.append(dev(i, used=GIB))
        else:
            devices.append(dev(i))
    return snap(*devices)


CLEAN = snap(*(dev(i) for i in range(GPUS)))
DIRTY = _dirty()
DEFAULT_PREDICATE = default_predicate()
COMPOSED = on_devices(range(GPUS), no_processes() & pids_gone([1000, 3000])) & default_predicate()


def _timeline(dirty_polls: int) -> Callable[[], Snapshot]:
    """``snapshot_fn`` that answers DIRTY ``dirty_polls`` times, then CLEAN."""
    count = 0

    def take() -> Snapshot:
        nonlocal count
        count += 1
        return DIRTY if count <= dirty_polls else CLEAN

    return take


def _no_sleep(_: float) -> None:
    """Sleeping would measure the kernel's timer, not the poller: the default policy's arithmetic still runs."""


def _wait(policy: PollPolicy, predicate: Predicate = DEFAULT_PREDICATE, **kw: object) -> int:
    res = poll_until(
        _timeline(POLLS - 2),
        predicate,
        timeout=None,
        policy=policy,
        sleep=_no_sleep,
        **kw,  # type: ignore[arg-type]
    )
    assert res.polls == POLLS
    return res.polls


def _per_poll(benchmark: BenchmarkFixture, fn: Callable[[], object]) -> None:
    benchmark(fn)
    if benchmark.stats is not None:  # None with --benchmark-disable
        benchmark.extra_info["per_poll_us"] = round(benchmark.stats.stats.median / POLLS * 1e6, 3)


# --- predicates ---------------------------------------------------------------------------------------------------


def test_check_default_clean_8gpu(benchmark: BenchmarkFixture) -> None:
    """The hot path: every poll of a wait that is about to succeed."""
    assert benchmark(DEFAULT_PREDICATE.check, CLEAN) is True


def test_check_default_dirty_8gpu(benchmark: BenchmarkFixture) -> None:
    """The hot path while waiting: no text is built."""
    assert benchmark(DEFAULT_PREDICATE.check, DIRTY) is False


def test_check_composed_clean_8gpu(benchmark: BenchmarkFixture) -> None:
    assert benchmark(COMPOSED.check, CLEAN) is True


def test_evaluate_default_dirty_8gpu(benchmark: BenchmarkFixture) -> None:
    """With reasons: what the timeout message and the CLI's status line pay (not per poll)."""
    verdict = benchmark(DEFAULT_PREDICATE.evaluate, DIRTY)
    assert len(verdict.reasons) == 8


# --- the poller ---------------------------------------------------------------------------------------------------


def test_snapshot_fn_baseline(benchmark: BenchmarkFixture) -> None:
    """The fake snapshot_fn alone, POLLS times: subtract it from the per-poll figures below."""

    def loop() -> None:
        take = _timeline(POLLS - 2)
        for _ in range(POLLS):
            take()

    _per_poll(benchmark, loop)


def test_poll_precise_8gpu(benchmark: BenchmarkFixture) -> None:
    """Tight loop: query, judge, bookkeeping; no summary (no trace, no back-off)."""
    _per_poll(benchmark, lambda: _wait(PRECISE))


def test_poll_default_8gpu(benchmark: BenchmarkFixture) -> None:
    """Default policy with a no-op sleep: adds the per-poll summary for back-off, the duty cap and the sleep
    compensation arithmetic."""
    _per_poll(benchmark, lambda: _wait(DEFAULT))


def test_poll_default_trace_and_callback_8gpu(benchmark: BenchmarkFixture) -> None:
    """What the CLI pays: a kept trace plus an on_poll callback."""
    sink: list[TracePoint] = []

    def run() -> None:
        sink.clear()
        _wait(DEFAULT, keep_trace=True, on_poll=sink.append)

    _per_poll(benchmark, run)


def test_poll_precise_1gpu(benchmark: BenchmarkFixture) -> None:
    """One GPU, as in the default mode's CPU target."""
    one_dirty, one_clean = snap(DIRTY.devices[0]), snap(CLEAN.devices[0])

    def run() -> None:
        count = 0

        def take() -> Snapshot:
            nonlocal count
            count += 1
            return one_dirty if count <= POLLS - 2 else one_clean

        poll_until(take, timeout=None, policy=PRECISE)

    _per_poll(benchmark, run)


# --- one-shot summary -----------------------------------------------------------------------------------------------


def _median_us(fn: Callable[[], object], inner: int, repeats: int = 7) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        runs.append((time.perf_counter_ns() - start) / inner / 1e3)
    return statistics.median(runs)


def main() -> None:
    one_dirty, one_clean = snap(DIRTY.devices[0]), snap(CLEAN.devices[0])

    def wait_1gpu() -> None:
        count = 0

        def take() -> Snapshot:
            nonlocal count
            count += 1
            return one_dirty if count <= POLLS - 2 else one_clean

        poll_until(take, timeout=None, policy=DEFAULT, sleep=_no_sleep)

    base = _median_us(lambda: [f() for f in [_timeline(POLLS - 2)] for _ in range(POLLS)], 5) / POLLS
    rows = {
        "check(default), 8 GPUs clean": _median_us(lambda: DEFAULT_PREDICATE.check(CLEAN), 20000),
        "check(default), 8 GPUs dirty": _median_us(lambda: DEFAULT_PREDICATE.check(DIRTY), 20000),
        "check(composed), 8 GPUs clean": _median_us(lambda: COMPOSED.check(CLEAN), 20000),
        "evaluate(default), 8 GPUs dirty": _median_us(lambda: DEFAULT_PREDICATE.evaluate(DIRTY), 5000),
        "per poll, PRECISE, 8 GPUs": _median_us(lambda: _wait(PRECISE), 5) / POLLS - base,
        "per poll, DEFAULT, 8 GPUs": _median_us(lambda: _wait(DEFAULT), 5) / POLLS - base,
        "per poll, DEFAULT + trace + on_poll, 8 GPUs": _median_us(
            lambda: _wait(DEFAULT, keep_trace=True, on_poll=lambda p: None), 5
        )
        / POLLS
        - base,
        "per poll, DEFAULT, 1 GPU": _median_us(wait_1gpu, 5) / POLLS - base,
    }
    print(f"python {sys.version.split()[0]}, fake snapshot_fn {base:.3f} µs/call subtracted")
    for name, us in rows.items():
        print(f"  {name:45s} {us:7.2f} µs")


def _q(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def realtime(runs: int = 200, query_us: float = 35.0) -> None:
    """Real clock, real sleep: a simulated one-GPU query that spins ``query_us`` (NVML memory + three process lists
    on an H200 cost ~35 µs, FACTS) turns clean at a random moment; report the detection lag (confirmation time minus
    the true moment) and the CPU used while waiting, for DEFAULT and PRECISE."""
    import random

    busy_snap, clean_snap = snap(DIRTY.devices[0]), snap(CLEAN.devices[0])
    spin_ns = int(query_us * 1e3)
    for name, policy in (("DEFAULT", DEFAULT), ("PRECISE", PRECISE)):
        lags: list[float] = []
        firsts: list[float] = []
        cpu = wall = 0.0
        for _ in range(runs):
            change = time.monotonic_ns() + random.randint(20, 60) * 1_000_000

            def take(change: int = change) -> Snapshot:
                t = time.monotonic_ns()
                while time.monotonic_ns() - t < spin_ns:
                    pass
                return clean_snap if time.monotonic_ns() >= change else busy_snap

            c0, w0 = time.process_time(), time.monotonic()
            res = poll_until(take, timeout=5.0, policy=policy)
            cpu += time.process_time() - c0
            wall += time.monotonic() - w0
            lags.append((res.started_ns + res.confirmed_ns - change) / 1e3)
            firsts.append((res.started_ns + res.clean_ns - change) / 1e3)
        lags.sort()
        firsts.sort()
        print(
            f"{name}: confirmed lag p50 {_q(lags, 0.5):7.0f} µs  p99 {_q(lags, 0.99):7.0f} µs | "
            f"first-clean lag p50 {_q(firsts, 0.5):6.0f} µs  p99 {_q(firsts, 0.99):6.0f} µs | "
            f"CPU {100 * cpu / wall:5.1f} % of a core ({runs} runs, query {query_us:g} µs)"
        )


def real_gpu(seconds: float = 3.0, device: int = 0, hold_gib: int = 4) -> None:
    """On a real GPU (NVML backend): the cost of one poll's query, then, while a child process (PyTorch) holds
    ``hold_gib`` GiB, the CPU the poller uses waiting ``seconds`` with the default predicate (DEFAULT, DEFAULT with a
    memory-only probe, PRECISE), then the child is killed and the wait that sees the memory come back is timed."""
    import signal
    import subprocess

    import nvmlcheck as nc
    from nvmlcheck.errors import WaitTimeout
    from nvmlcheck.model import Fields

    with nc.open("nvml") as gpus:

        def full() -> Snapshot:
            return gpus.snapshot([device], fields=Fields.WAIT)

        def memory() -> Snapshot:
            return gpus.snapshot([device], fields=Fields.MEMORY)

        for name, take in (("memory + 3 process lists", full), ("memory only", memory)):
            costs = []
            for _ in range(2000):
                t = time.perf_counter_ns()
                take()
                costs.append(time.perf_counter_ns() - t)
            costs.sort()
            print(f"query GPU {device}, {name}: p50 {costs[1000] / 1e3:.1f} µs, p99 {costs[1980] / 1e3:.1f} µs")

        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import torch, time; x = torch.empty({hold_gib} << 30, dtype=torch.uint8, device='cuda:{device}'); "
                "x.fill_(1); torch.cuda.synchronize(); print('holding', flush=True); time.sleep(600)",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            runs: list[tuple[str, PollPolicy, Callable[[], Snapshot] | None]] = [
                ("DEFAULT", DEFAULT, None),
                ("DEFAULT + probe", DEFAULT, memory),
                ("PRECISE", PRECISE, None),
            ]
            for name, policy, probe in runs:
                c0, t0, w0 = time.process_time(), time.thread_time(), time.monotonic()
                try:
                    poll_until(full, timeout=seconds, policy=policy, probe=probe)
                except WaitTimeout as exc:
                    polls, first = exc.polls, exc.culprits[0]
                wall = time.monotonic() - w0
                cpu, thread = time.process_time() - c0, time.thread_time() - t0
                print(
                    f"held, {name}: one poll per {wall / polls * 1e6:.0f} µs, CPU {100 * cpu / wall:.1f} % of a core "
                    f"(this thread {100 * thread / wall:.1f} %); culprit: {first}"
                )
            kill_ns = time.monotonic_ns()
            holder.send_signal(signal.SIGKILL)
            res = poll_until(full, timeout=30.0, probe=memory)
            print(
                f"SIGKILL -> first clean poll {(res.started_ns + res.clean_ns - kill_ns) / 1e6:.1f} ms, "
                f"confirmed {(res.started_ns + res.confirmed_ns - kill_ns) / 1e6:.1f} ms; last dirty poll "
                f"{(res.started_ns + (res.last_dirty_ns or 0) - kill_ns) / 1e6:.1f} ms; {res.polls} polls "
                f"({res.partial_polls} by the probe), median period {res.interval_ns / 1e3:.0f} µs"
            )
        finally:
            holder.kill()
            holder.wait()


if __name__ == "__main__":
    if "--realtime" in sys.argv:
        realtime()
    elif "--nvml" in sys.argv:
        real_gpu()
    else:
        main()


pytestmark = pytest.mark.filterwarnings("ignore::pytest_benchmark.logger.PytestBenchmarkWarning")
