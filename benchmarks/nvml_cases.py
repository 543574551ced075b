"""The NVML per-call cases measured side by side: raw cffi, nvmlcheck's typed call, nvidia-ml-py.

Used by ``bench_nvml.py`` (pytest-benchmark) and ``compare_nvml.py`` (one run, ratios, JSON for docs).
Works on a real GPU, or on the stub library when ``NVMLCHECK_LIBNVML``/``NVMLCHECK_STUB_SCENARIO`` point at it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nvmlcheck._nvml.calls import CLOCK_SM, NvmlCalls
from nvmlcheck.backends.nvml import NvmlBackend
from nvmlcheck.model import Fields, ProcessKind, RetirementCause

Case = Callable[[], object]


@dataclass
class Cases:
    """Everything opened once: our backend, the raw cffi library with preallocated buffers, nvidia-ml-py."""

    backend: NvmlBackend
    calls: NvmlCalls
    lib: Any
    handle: Any
    total_bytes: int
    pynvml: Any | None
    raw: dict[str, Case] = field(default_factory=dict)
    typed: dict[str, Case] = field(default_factory=dict)
    reference: dict[str, Case] = field(default_factory=dict)

    def close(self) -> None:
        self.backend.close()
        if self.pynvml is not None:
            self.pynvml.nvmlShutdown()


def open_cases() -> Cases:
    """Open NVML three ways on device 0 and build the cases."""
    from nvmlcheck._nvml._ffi import ffi

    backend = NvmlBackend()
    calls = backend._calls
    lib = backend._loaded.lib
    handle = calls.handle(0)
    total = calls.memory(handle, 0).total_bytes
    try:
        import pynvml

        if os.environ.get("NVMLCHECK_LIBNVML"):
            # nvidia-ml-py has its own loader; point it at the same library so both read the same "driver".
            pynvml.nvmlLib = pynvml.CDLL(os.environ["NVMLCHECK_LIBNVML"])
        pynvml.nvmlInit()
        ph = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # nvidia-ml-py missing or unusable here: measured without the reference
        pynvml = None
        ph = None
    cases = Cases(backend, calls, lib, handle, total, pynvml)

    mem: Any = ffi.new("nvmlMemory_v2_t *")
    mem.version = ffi.sizeof("nvmlMemory_v2_t") | (2 << 24)
    count = ffi.new("unsigned int *")
    procs = ffi.new("nvmlProcessInfo_v2_t[]", 64)
    clock = ffi.new("unsigned int *")
    reasons = ffi.new("unsigned long long *")
    pages = ffi.new("unsigned long long[]", 64)
    stamps = ffi.new("unsigned long long[]", 64)
    pending = ffi.new("int *")
    rows = ffi.new("unsigned int[4]")

    get_mem = lib.nvmlDeviceGetMemoryInfo_v2
    get_compute = lib.nvmlDeviceGetComputeRunningProcesses_v3
    get_graphics = lib.nvmlDeviceGetGraphicsRunningProcesses_v3
    get_mps = lib.nvmlDeviceGetMPSComputeRunningProcesses_v3
    get_clock = lib.nvmlDeviceGetClockInfo
    get_max = lib.nvmlDeviceGetMaxClockInfo
    get_app = lib.nvmlDeviceGetApplicationsClock
    get_reasons = lib.nvmlDeviceGetCurrentClocksEventReasons
    get_pages = lib.nvmlDeviceGetRetiredPages_v2
    get_pending = lib.nvmlDeviceGetRetiredPagesPendingStatus
    get_rows = lib.nvmlDeviceGetRemappedRows
    h = handle

    # "Raw" = the C call through cffi with a preallocated buffer, plus reading the values out: the least any
    # caller does to have the data. No error handling, no validation, no objects.
    def raw_memory() -> object:
        get_mem(h, mem)
        return (mem.total, mem.used, mem.free, mem.reserved)

    def raw_processes() -> object:
        count[0] = 64
        get_compute(h, count, procs)
        return [(procs[i].pid, procs[i].usedGpuMemory) for i in range(count[0])]

    def raw_clock() -> object:
        get_clock(h, CLOCK_SM, clock)
        return clock[0]

    def raw_wait_poll() -> object:
        out = [raw_memory()]
        for fn in (get_compute, get_graphics, get_mps):
            count[0] = 64
            fn(h, count, procs)
            out.append([(procs[i].pid, procs[i].usedGpuMemory) for i in range(count[0])])
        return out

    def raw_full_device() -> object:
        raw_wait_poll()
        values = []
        for fn in (get_clock, get_max, get_app):
            for domain in range(4):
                fn(h, domain, clock)
                values.append(clock[0])
        get_reasons(h, reasons)
        values.append(reasons[0])
        for cause in (0, 1):
            count[0] = 64
            get_pages(h, cause, count, pages, stamps)
        get_pending(h, pending)
        get_rows(h, rows, rows + 1, rows + 2, rows + 3)
        values.extend((pending[0], rows[0], rows[1], rows[2], rows[3]))
        return values

    cases.raw.update(
        memory=raw_memory,
        processes=raw_processes,
        clock=raw_clock,
        wait_snapshot=raw_wait_poll,
        full_snapshot=raw_full_device,
    )
    only0 = (0,)
    cases.typed.update(
        memory=lambda: calls.memory(h, 0),
        processes=lambda: calls.processes(h, ProcessKind.COMPUTE, 0, total),
        clock=lambda: calls.clock_mhz(h, CLOCK_SM, 0),
        wait_snapshot=lambda: backend.snapshot(only0, Fields.WAIT),
        full_snapshot=lambda: backend.snapshot(only0, Fields.ALL),
    )
    if pynvml is not None:
        v2 = pynvml.nvmlMemory_v2

        def ref_full() -> object:
            pynvml.nvmlDeviceGetMemoryInfo(ph, version=v2)
            pynvml.nvmlDeviceGetComputeRunningProcesses(ph)
            pynvml.nvmlDeviceGetGraphicsRunningProcesses(ph)
            pynvml.nvmlDeviceGetMPSComputeRunningProcesses(ph)
            return None

        cases.reference.update(
            memory=lambda: pynvml.nvmlDeviceGetMemoryInfo(ph, version=v2),
            processes=lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(ph),
            clock=lambda: pynvml.nvmlDeviceGetClockInfo(ph, pynvml.NVML_CLOCK_SM),
            wait_snapshot=ref_full,
        )
    _ = RetirementCause  # the full snapshot reads both causes, as raw_full_device does
    return cases


def per_call_ns(fn: Case, number: int = 20_000, repeats: int = 5) -> float:
    """Best of ``repeats`` loops of ``number`` calls, in ns per call (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter_ns() - start) / number)
    return best


def interleaved_ns(variants: dict[str, Case], number: int, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` ns per call of each variant, the variants taking turns loop by loop, so that drift in
    the machine (clock ramp-up, a neighbour's load) hits them all alike."""
    best = {name: float("inf") for name in variants}
    for fn in variants.values():  # warm-up: first calls pay for cold caches and lazy binding
        for _ in range(min(number, 1000)):
            fn()
    for _ in range(repeats):
        for name, fn in variants.items():
            start = time.perf_counter_ns()
            for _ in range(number):
                fn()
            best[name] = min(best[name], (time.perf_counter_ns() - start) / number)
    return best


def symbol_costs(cases: Cases, number: int = 200) -> dict[str, float]:
    """Best-of-5 ns per call of each raw C symbol a full snapshot makes (to find the expensive ones)."""
    from nvmlcheck._nvml._ffi import ffi

    lib, h = cases.lib, cases.handle
    mem: Any = ffi.new("nvmlMemory_v2_t *")
    mem.version = ffi.sizeof("nvmlMemory_v2_t") | (2 << 24)
    count = ffi.new("unsigned int *")
    procs = ffi.new("nvmlProcessInfo_v2_t[]", 64)
    u32 = ffi.new("unsigned int *")
    u64 = ffi.new("unsigned long long *")
    pages = ffi.new("unsigned long long[]", 64)
    state = ffi.new("int *")
    rows = ffi.new("unsigned int[4]")

    def listing(fn: Any) -> Case:
        def call() -> object:
            count[0] = 64
            return fn(h, count, procs)

        return call

    def retired() -> object:
        count[0] = 64
        return lib.nvmlDeviceGetRetiredPages_v2(h, 0, count, pages, pages)

    symbols: dict[str, Case] = {
        "nvmlDeviceGetMemoryInfo_v2": lambda: lib.nvmlDeviceGetMemoryInfo_v2(h, mem),
        "nvmlDeviceGetComputeRunningProcesses_v3": listing(lib.nvmlDeviceGetComputeRunningProcesses_v3),
        "nvmlDeviceGetGraphicsRunningProcesses_v3": listing(lib.nvmlDeviceGetGraphicsRunningProcesses_v3),
        "nvmlDeviceGetMPSComputeRunningProcesses_v3": listing(lib.nvmlDeviceGetMPSComputeRunningProcesses_v3),
        "nvmlDeviceGetClockInfo": lambda: lib.nvmlDeviceGetClockInfo(h, 1, u32),
        "nvmlDeviceGetMaxClockInfo": lambda: lib.nvmlDeviceGetMaxClockInfo(h, 1, u32),
        "nvmlDeviceGetApplicationsClock": lambda: lib.nvmlDeviceGetApplicationsClock(h, 1, u32),
        "nvmlDeviceGetCurrentClocksEventReasons": lambda: lib.nvmlDeviceGetCurrentClocksEventReasons(h, u64),
        "nvmlDeviceGetRetiredPages_v2": retired,
        "nvmlDeviceGetRetiredPagesPendingStatus": lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h, state),
        "nvmlDeviceGetRemappedRows": lambda: lib.nvmlDeviceGetRemappedRows(h, rows, rows + 1, rows + 2, rows + 3),
    }
    return {name: per_call_ns(fn, number, 5) for name, fn in symbols.items()}
