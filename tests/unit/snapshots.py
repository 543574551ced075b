"""Terse builders of model objects for unit tests (no backend, no GPU).

``snap(dev(0, used=2 * GIB, procs=[proc(1234, 2 * GIB)]), dev(1))`` is a two-GPU snapshot where GPU 0 holds one
compute process. Every list is known (empty) unless given; pass ``None`` to make a list or the memory unknown, with
a reason in ``unknown``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from nvmlcheck.model import (
    MIB,
    DeviceFailure,
    DeviceState,
    GpuProcess,
    Memory,
    ProcessKind,
    Snapshot,
    SystemInfo,
)

GIB = 1 << 30
#: An H200's memory, and the driver's reserve that the v1 memory call counts as used (FACTS).
H200_TOTAL = 143_771 * MIB
H200_RESERVED = 644_939_776

SYSTEM = SystemInfo(driver_version="580.159.04", nvml_version="13.580.159.04", cuda_driver_version=13000)

_DEFAULT: tuple[GpuProcess, ...] = ()


def proc(
    pid: int,
    used: int | None = 1 * GIB,
    *,
    name: str | None = "python3",
    kind: ProcessKind = ProcessKind.COMPUTE,
) -> GpuProcess:
    """One process-list entry."""
    return GpuProcess(pid=pid, kind=kind, used_bytes=used, name=name)


def mem(
    used: int = 0,
    *,
    total: int = H200_TOTAL,
    v1: bool = False,
    granularity: int = 1,
) -> Memory:
    """A memory reading. ``v1=True`` adds the driver's reserve to ``used``, as the v1 call does."""
    if v1:
        used += H200_RESERVED
    return Memory(
        total_bytes=total,
        used_bytes=used,
        free_bytes=total - used,
        reserved_bytes=None if v1 else H200_RESERVED,
        used_includes_reserved=v1,
        granularity_bytes=granularity,
    )


def dev(
    index: int = 0,
    *,
    used: int | None = None,
    memory: Memory | bool | None = True,
    procs: Iterable[GpuProcess] | None = (),
    graphics: Iterable[GpuProcess] | None = (),
    mps: Iterable[GpuProcess] | None = (),
    v1: bool = False,
    granularity: int = 1,
    unknown: Mapping[str, str] | None = None,
    uuid: str | None = None,
) -> DeviceState:
    """One device. ``used`` defaults to the sum of its processes' bytes; ``memory=None`` makes memory unknown."""
    compute = _kinded(procs, ProcessKind.COMPUTE)
    gfx = _kinded(graphics, ProcessKind.GRAPHICS)
    mpsp = _kinded(mps, ProcessKind.MPS)
    if memory is True:
        if used is None:
            used = sum(p.used_bytes or 0 for lst in (compute, gfx, mpsp) if lst is not None for p in lst)
        memory_obj: Memory | None = mem(used, v1=v1, granularity=granularity)
    elif memory is False or memory is None:
        memory_obj = None
    else:
        memory_obj = memory
    return DeviceState(
        index=index,
        uuid=uuid if uuid is not None else f"GPU-{index:08d}-0000-0000-0000-000000000000",
        name="NVIDIA H200",
        pci_bus_id=f"00000000:{index + 0x18:02X}:00.0",
        serial=None,
        minor_number=index,
        memory=memory_obj,
        compute_processes=compute,
        graphics_processes=gfx,
        mps_processes=mpsp,
        clocks=None,
        health=None,
        unknown=dict(unknown or {}),
    )


def _kinded(procs: Iterable[GpuProcess] | None, kind: ProcessKind) -> tuple[GpuProcess, ...] | None:
    if procs is None:
        return None
    return tuple(
        GpuProcess(pid=p.pid, kind=kind, used_bytes=p.used_bytes, name=p.name) if p.kind is not kind else p
        for p in procs
    )


def snap(
    *devices: DeviceState,
    failures: Sequence[DeviceFailure] = (),
    taken_ns: int = 0,
    backend: str = "nvml",
) -> Snapshot:
    """A snapshot of ``devices`` (and ``failures``)."""
    return Snapshot(
        backend=backend,
        taken_ns=taken_ns,
        duration_ns=0,
        wall_time=0.0,
        system=SYSTEM,
        devices=tuple(devices),
        failures=tuple(failures),
    )


def failure(index: int, error: Exception, uuid: str | None = None) -> DeviceFailure:
    """A device that could not be read."""
    return DeviceFailure(index=index, uuid=uuid, error=error)


def idle(*indices: int) -> Snapshot:
    """Clean GPUs (default: GPU 0)."""
    return snap(*(dev(i) for i in (indices or (0,))))


def busy(pid: int = 1234, used: int = 16 * GIB, index: int = 0) -> Snapshot:
    """One GPU holding one compute process."""
    return snap(dev(index, procs=[proc(pid, used)]))


def memory_only(s: Snapshot) -> Snapshot:
    """What a ``Fields.MEMORY`` read of the same moment returns: the process lists are not read (``None``)."""
    from dataclasses import replace

    return replace(
        s,
        devices=tuple(
            replace(d, compute_processes=None, graphics_processes=None, mps_processes=None) for d in s.devices
        ),
    )
