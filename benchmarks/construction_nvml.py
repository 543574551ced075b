"""What building the model objects costs on the NVML poll path (issue 13; docs/performance.md, "Building the model
objects").

    python benchmarks/construction_nvml.py [--gpus 8] [--repeats 15] [--json out.json]

Cases, taking turns loop by loop in one process:

* a full snapshot (``Fields.ALL``), a wait snapshot (``Fields.WAIT``, what a poll reads) and a memory-only probe
  (``Fields.MEMORY``) of every GPU, each twice: with the backend's generated constructors (``fast``) and with the
  dataclasses' own ``__init__`` swapped in (``plain``);
* a full snapshot whose clocks and memory health are read the plain way (``raising``): one call per value that
  raises the mapped ``NvmlError``, caught by the backend, instead of ``NvmlCalls.clocks``/``health`` collecting
  ``(slot, symbol, code)`` for what did not answer (``full_snapshot_fast`` is the same read as shipped);
* one ``DeviceState`` built by the dataclass's keywords and by ``model.fast_constructor``.

Each loop is timed in wall time and in this thread's CPU time; on a shared machine the CPU time is the steadier
figure (it leaves out the time other processes hold the core). On a GPU host it reads the driver (``--gpus`` is then
ignored); elsewhere an idle-H200 stub with ``--gpus`` devices, and the figures describe the stub, not a driver. To
compare two checkouts, run this file alternately with ``PYTHONPATH`` at each (``--label`` tags the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from types import MappingProxyType
from typing import Any

import nvmlcheck
import nvmlcheck.backends.nvml as nvml_backend
from nvmlcheck import FunctionNotFound, NvmlCheckError, NvmlError
from nvmlcheck._nvml.calls import CLOCK_GRAPHICS, CLOCK_MEM, CLOCK_SM, CLOCK_VIDEO, Handle
from nvmlcheck.backends.nvml import NvmlBackend
from nvmlcheck.errors import codes_in_scope, error_class_for_code
from nvmlcheck.model import (
    Clocks,
    ClockSet,
    DeviceState,
    Fields,
    Memory,
    MemoryHealth,
    RemappedRows,
    RetiredPage,
    RetirementCause,
    Snapshot,
    fast_constructor,
)

Case = Callable[[], object]


def loop_ns(fn: Case, number: int) -> tuple[float, float]:
    """(wall, thread CPU) ns per call of one loop of ``number`` calls."""
    wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(number):
        fn()
    return (time.perf_counter_ns() - wall) / number, (time.thread_time_ns() - cpu) / number


def constructor_cases() -> dict[str, Case]:
    memory = Memory(150_754_820_096, 0, 150_109_880_320, 644_939_776, False, 1)
    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    reasons = MappingProxyType({"serial": "unreadable"})
    make = fast_constructor(DeviceState)

    def plain() -> object:
        return DeviceState(
            index=0,
            uuid=uuid,
            name="NVIDIA H200",
            pci_bus_id="00000000:00:06.0",
            serial=None,
            minor_number=0,
            memory=memory,
            compute_processes=(),
            graphics_processes=(),
            mps_processes=(),
            clocks=None,
            health=None,
            unknown=reasons,
            mig_mode=False,
            mig_devices=(),
        )

    def fast() -> object:
        return make(
            index=0,
            uuid=uuid,
            name="NVIDIA H200",
            pci_bus_id="00000000:00:06.0",
            serial=None,
            minor_number=0,
            memory=memory,
            compute_processes=(),
            graphics_processes=(),
            mps_processes=(),
            clocks=None,
            health=None,
            unknown=reasons,
            mig_mode=False,
            mig_devices=(),
        )

    return {"device_state_plain": plain, "device_state_fast": fast}


# --- clocks and health read the plain way: one call per value, raising; the backend catches --------------------

_DEVICE_LEVEL = codes_in_scope("device")  # these fail the device, others one value (errors.py)
_DOMAINS = (
    ("graphics_mhz", CLOCK_GRAPHICS),
    ("sm_mhz", CLOCK_SM),
    ("memory_mhz", CLOCK_MEM),
    ("video_mhz", CLOCK_VIDEO),
)
_PARTS = {
    part: (symbol, tuple((f"clocks.{part}.{key}", domain) for key, domain in _DOMAINS))
    for part, symbol in (
        ("current", "nvmlDeviceGetClockInfo"),
        ("max", "nvmlDeviceGetMaxClockInfo"),
        ("applications", "nvmlDeviceGetApplicationsClock"),
    )
}


def _soft(unknown: dict[str, str], key: str, read: Callable[..., Any], *args: object) -> Any:
    """``read(*args)``, or ``None`` with the reason under ``key`` when it raised an error that leaves the device
    readable (the reason text is the backend's)."""
    try:
        return read(*args)
    except NvmlError as exc:
        if exc.code in _DEVICE_LEVEL:
            raise
        unknown[key] = nvml_backend._code_reason(exc.function, exc.code)
        return None


def raising_reads(backend: NvmlBackend) -> tuple[Callable[..., Clocks], Callable[..., MemoryHealth]]:
    """``_clocks`` and ``_health`` for ``backend`` built from per-value calls that raise, as every other query of
    ``NvmlCalls`` does; same values, same reasons, same caching of the max clocks."""
    calls: Any = backend._calls
    buffers, clock_fns, health_fns = calls._buffers, calls._clock_fns, calls._health_fns
    symbols = calls._loaded.symbols
    max_cache: dict[int, tuple[ClockSet, dict[str, str]]] = {}

    def fail(rc: int, symbol: str, index: int) -> NvmlError:
        return error_class_for_code(rc)(rc, symbol, index)

    def clock(handle: Handle, symbol: str, domain: int, index: int) -> int:
        fn = clock_fns[symbol]
        if fn is None:
            raise FunctionNotFound(13, symbol, index)
        out = buffers.u32
        rc = fn(handle, domain, out)
        if rc:
            raise fail(rc, symbol, index)
        return int(out[0])

    def event_reasons(handle: Handle, index: int) -> int:
        if symbols.clock_event_reasons is None:
            raise FunctionNotFound(13, "nvmlDeviceGetCurrentClocksEventReasons", index)
        out = buffers.u64
        rc = calls._reasons_fn(handle, out)
        if rc:
            raise fail(rc, symbols.clock_event_reasons, index)
        return int(out[0])

    def retired_pages(handle: Handle, index: int) -> tuple[RetiredPage, ...]:
        name = symbols.retired_pages
        if name is None:
            raise FunctionNotFound(13, "nvmlDeviceGetRetiredPages_v2", index)
        found: list[RetiredPage] = []
        for cause in (RetirementCause.MULTIPLE_SINGLE_BIT_ECC, RetirementCause.DOUBLE_BIT_ECC):
            rc = calls._retired_pages(handle, name, cause, index, found)
            if rc:
                raise fail(rc, name, index)
        return tuple(found)

    def pending(handle: Handle, index: int) -> bool:
        fn = health_fns["nvmlDeviceGetRetiredPagesPendingStatus"]
        if fn is None:
            raise FunctionNotFound(13, "nvmlDeviceGetRetiredPagesPendingStatus", index)
        out = buffers.enable_state
        rc = fn(handle, out)
        if rc:
            raise fail(rc, "nvmlDeviceGetRetiredPagesPendingStatus", index)
        return bool(out[0])

    def remapped_rows(handle: Handle, index: int) -> RemappedRows:
        fn = health_fns["nvmlDeviceGetRemappedRows"]
        if fn is None:
            raise FunctionNotFound(13, "nvmlDeviceGetRemappedRows", index)
        quad = buffers.quad
        rc = fn(handle, quad, quad + 1, quad + 2, quad + 3)
        if rc:
            raise fail(rc, "nvmlDeviceGetRemappedRows", index)
        return RemappedRows(int(quad[0]), int(quad[1]), bool(quad[2]), bool(quad[3]))

    def read_clocks(handle: Handle, index: int, unknown: dict[str, str]) -> Clocks:
        sets: list[ClockSet] = []
        for part, (symbol, keys) in _PARTS.items():
            cached = max_cache.get(index) if part == "max" else None
            if cached is None:
                why: dict[str, str] = {}
                values = [_soft(why, key, clock, handle, symbol, domain, index) for key, domain in keys]
                cached = (ClockSet(*values), why)
                if part == "max":
                    max_cache[index] = cached
            sets.append(cached[0])
            unknown.update(cached[1])
        mask = _soft(unknown, "clocks.event_reasons", event_reasons, handle, index)
        return Clocks(sets[0], sets[1], sets[2], None if mask is None else nvml_backend._event_reasons(mask))

    def read_health(handle: Handle, index: int, unknown: dict[str, str]) -> MemoryHealth:
        return MemoryHealth(
            _soft(unknown, "health.retired_pages", retired_pages, handle, index),
            _soft(unknown, "health.retired_pages_pending", pending, handle, index),
            _soft(unknown, "health.remapped_rows", remapped_rows, handle, index),
        )

    return read_clocks, read_health


# --- cases --------------------------------------------------------------------------------------------------------

#: A case: the call, calls per loop, and what to hold while it runs (the backend's constructors or readers swapped).
Timed = tuple[Case, int, Callable[[], AbstractContextManager[None]]]


@contextmanager
def swapped(device: Callable[..., object], snapshot: Callable[..., object]) -> Iterator[None]:
    """The backend building its objects with ``device`` and ``snapshot`` for the duration."""
    saved = nvml_backend._make_device, nvml_backend._make_snapshot
    nvml_backend._make_device, nvml_backend._make_snapshot = device, snapshot  # type: ignore[assignment]
    try:
        yield
    finally:
        nvml_backend._make_device, nvml_backend._make_snapshot = saved


@contextmanager
def raising(backend: NvmlBackend) -> Iterator[None]:
    """``backend`` reading clocks and health with :func:`raising_reads`'s calls for the duration."""
    state: Any = backend
    state._clocks, state._health = raising_reads(backend)
    try:
        yield
    finally:
        del state._clocks, state._health


def snapshot_cases(backend: NvmlBackend, on_gpu: bool) -> dict[str, Timed]:
    def plain() -> AbstractContextManager[None]:
        return swapped(DeviceState, Snapshot)

    cases: dict[str, Timed] = {}
    for name, fields, number in (
        ("full_snapshot", Fields.ALL, 20 if on_gpu else 200),
        ("wait_snapshot", Fields.WAIT, 500),
        ("probe_snapshot", Fields.MEMORY, 500),
    ):

        def case(fields: Fields = fields) -> object:
            return backend.snapshot(None, fields)

        cases[f"{name}_fast"] = (case, number, nullcontext)
        cases[f"{name}_plain"] = (case, number, plain)
        if fields is Fields.ALL:
            cases[f"{name}_raising"] = (case, number, lambda: raising(backend))
    return cases


@contextmanager
def target(gpus: int) -> Iterator[str]:
    """``"gpu"`` when libnvidia-ml loads and sees a GPU, else an idle-H200 stub with ``gpus`` devices."""
    if not os.environ.get("NVMLCHECK_LIBNVML"):
        try:
            NvmlBackend().close()
        except NvmlCheckError:
            pass
        else:
            yield "gpu"
            return
    from nvmlcheck.testing import Scenario, use_stub

    with tempfile.TemporaryDirectory() as tmp, use_stub(Scenario.h200(gpus), tmp_dir=tmp):
        os.environ.pop("NVMLCHECK_STUB_LOG", None)  # logging every call would be measured too
        yield "stub"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=8, help="stub devices (ignored on a GPU host)")
    parser.add_argument("--repeats", type=int, default=15, help="timed loops per case")
    parser.add_argument("--label", default=str(Path(nvmlcheck.__file__).parent.parent), help="tag for the JSON")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    with target(args.gpus) as where:
        backend = NvmlBackend()
        try:
            n_gpus = len(backend.snapshot(None, Fields.ALL).devices)  # identities and max clocks, read once
            cases = snapshot_cases(backend, where == "gpu")
            cases.update({k: (v, 50_000, nullcontext) for k, v in constructor_cases().items()})
            for fn, number, use in cases.values():  # warm-up: cold caches, lazy binding
                with use():
                    loop_ns(fn, max(number // 10, 1))
            loops: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
            # Cases take turns loop by loop, so drift on a noisy machine hits them all alike.
            for _ in range(args.repeats):
                for name, (fn, number, use) in cases.items():
                    with use():
                        loops[name].append(loop_ns(fn, number))
        finally:
            backend.close()

    result = {
        name: {
            "wall_median_ns": statistics.median(w for w, _ in v),
            "wall_min_ns": min(w for w, _ in v),
            "cpu_median_ns": statistics.median(c for _, c in v),
            "cpu_min_ns": min(c for _, c in v),
        }
        for name, v in loops.items()
    }
    print(f"{args.label}: {where}, {n_gpus} GPU(s), Python {platform.python_version()} on {platform.node()}")
    print(f"  {'case':<28}{'CPU median':>12}{'CPU min':>12}{'wall median':>13}")
    for name, row in result.items():
        print(
            f"  {name:<28}{row['cpu_median_ns'] / 1000:>10.3f}µs{row['cpu_min_ns'] / 1000:>10.3f}µs"
            f"{row['wall_median_ns'] / 1000:>11.3f}µs"
        )
    for name, other, what in (
        ("full_snapshot", "plain", "plain constructors"),
        ("wait_snapshot", "plain", "plain constructors"),
        ("probe_snapshot", "plain", "plain constructors"),
        ("full_snapshot", "raising", "raising clock/health calls"),
    ):
        fast, slow = result[f"{name}_fast"]["cpu_median_ns"], result[f"{name}_{other}"]["cpu_median_ns"]
        print(f"  {name}: {what} cost {(slow - fast) / 1000:+.3f} µs ({slow / fast - 1:+.1%}, CPU medians)")
    if args.json:
        document = {
            "label": args.label,
            "target": where,
            "gpus": n_gpus,
            "python": platform.python_version(),
            "host": platform.node(),
            "cases": result,
        }
        args.json.write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
