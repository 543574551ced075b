"""The NVML backend: libnvidia-ml through cffi (:mod:`nvmlcheck._nvml.calls`), building model objects.

Identity (handle, name, UUID, PCI bus id, serial, minor number, total memory) is read once per device and cached;
live values (memory, processes, clocks, health) are read on every snapshot. What a device does not support is
``None`` with a reason; errors that make a device unreadable (lost, no permission, corrupt data) put it in
:attr:`Snapshot.failures` so the other devices still report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from .._nvml import library
from .._nvml.calls import CLOCK_GRAPHICS, CLOCK_MEM, CLOCK_SM, CLOCK_VIDEO, Handle, NvmlCalls
from ..errors import FunctionNotFound, NotSupported, NvmlCheckError, NvmlError
from ..model import (
    ClockEventReason,
    Clocks,
    ClockSet,
    DeviceFailure,
    DeviceState,
    Fields,
    GpuProcess,
    Memory,
    MemoryHealth,
    ProcessKind,
    RemappedRows,
    RetiredPage,
    RetirementCause,
    Snapshot,
    SystemInfo,
)

__all__ = ["NvmlBackend", "process_name"]

NOT_REQUESTED = "not requested"
_V1_MEMORY = (
    "this driver has only nvmlDeviceGetMemoryInfo (v1): used_bytes includes the driver's reserved memory and "
    "reserved_bytes is unknown"
)


def process_name(pid: int) -> str | None:
    """argv[0] of ``pid`` from ``/proc/<pid>/cmdline`` (or ``comm`` for kernel threads), ``None`` when the process is
    not visible from here (another PID namespace, already gone, no permission).

    NVML reports host PIDs; inside a container the same number may name another process, so this is best effort.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
        first = raw.split(b"\0", 1)[0]
        if first:
            return first.decode("utf-8", "replace")
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode("utf-8", "replace") or None
    except OSError:
        return None


def _reason(exc: NvmlError) -> str:
    if isinstance(exc, NotSupported):
        return f"not supported: {exc.function} returned NVML_ERROR_NOT_SUPPORTED"
    if isinstance(exc, FunctionNotFound):
        return f"not available: {exc.function} is missing from this driver's libnvidia-ml"
    return f"unreadable: {exc}"


def _soft(exc: NvmlError) -> bool:
    """Errors that make one value unknown rather than the device unreadable."""
    return isinstance(exc, NotSupported | FunctionNotFound)


@dataclass(frozen=True, slots=True)
class _Identity:
    handle: Handle
    uuid: str
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    minor_number: int | None
    unknown: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class _Plan:
    memory: bool
    processes: bool
    clocks: bool
    health: bool
    not_requested: Mapping[str, str]


def _plan(fields: Fields) -> _Plan:
    skipped = {}
    for flag, key in ((Fields.MEMORY, "memory"), (Fields.CLOCKS, "clocks"), (Fields.HEALTH, "health")):
        if not fields & flag:
            skipped[key] = NOT_REQUESTED
    if not fields & Fields.PROCESSES:
        skipped.update({f"processes.{k.value}": NOT_REQUESTED for k in ProcessKind})
    return _Plan(
        bool(fields & Fields.MEMORY),
        bool(fields & Fields.PROCESSES),
        bool(fields & Fields.CLOCKS),
        bool(fields & Fields.HEALTH),
        MappingProxyType(skipped),
    )


# Fields values are few; computing the plan (enum.Flag arithmetic costs microseconds) once each keeps polls cheap.
_PLANS: dict[Fields, _Plan] = {}
_KINDS = tuple(ProcessKind)
_Note = Callable[[str, NvmlError], None]
_CLOCK_DOMAINS = (CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO)
_CLOCK_KEYS = ("graphics_mhz", "sm_mhz", "memory_mhz", "video_mhz")


class NvmlBackend:
    """Reads GPUs through libnvidia-ml.

    ``library_path`` overrides ``$NVMLCHECK_LIBNVML`` and the default names. Opening initialises NVML (shared
    reference count per process); :meth:`close` releases it. After ``fork()`` the child re-initialises on its
    first snapshot.
    """

    name = "nvml"

    def __init__(self, library_path: str | None = None) -> None:
        self._loaded = library.load(library_path)
        self._loaded.acquire()
        self._closed = False
        self._generation = library.fork_generation()
        self._calls = NvmlCalls(self._loaded)
        self._identities: dict[int, _Identity] = {}
        # Total memory per device, from the first successful memory read: the bound process entries are checked
        # against (a process cannot hold more than the device has).
        self._totals: dict[int, int] = {}
        self._system: SystemInfo | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def library_path(self) -> str:
        """The libnvidia-ml this backend loaded."""
        return self._loaded.path

    @property
    def symbols(self) -> library.Symbols:
        """Which versioned symbol answers each capability (see :class:`nvmlcheck._nvml.library.Symbols`)."""
        return self._loaded.symbols

    def close(self) -> None:
        """Release this backend's NVML reference (the last one shuts NVML down). Idempotent."""
        if not self._closed:
            self._closed = True
            self._loaded.release()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("this nvmlcheck session is closed")
        if self._generation != library.fork_generation():
            # A forked child: NVML must be initialised again here, and handles re-read.
            self._loaded.acquire()
            self._generation = library.fork_generation()
            self._identities.clear()
            self._totals.clear()

    # --- system ---------------------------------------------------------------------------------------------------

    def system(self) -> SystemInfo:
        """Driver, NVML and CUDA driver versions (read once; they cannot change while the library is loaded)."""
        self._check_open()
        if self._system is None:
            unknown: dict[str, str] = {}
            values: dict[str, object] = {}
            for key, getter in (
                ("driver_version", self._calls.driver_version),
                ("nvml_version", self._calls.nvml_version),
                ("cuda_driver_version", self._calls.cuda_driver_version),
            ):
                try:
                    values[key] = getter()
                except NvmlError as exc:
                    if not _soft(exc):
                        raise
                    values[key] = None
                    unknown[key] = _reason(exc)
            self._system = SystemInfo(
                values["driver_version"],  # type: ignore[arg-type]
                values["nvml_version"],  # type: ignore[arg-type]
                values["cuda_driver_version"],  # type: ignore[arg-type]
                MappingProxyType(unknown),
            )
        return self._system

    def device_count(self) -> int:
        """nvmlDeviceGetCount_v2."""
        self._check_open()
        return self._calls.device_count()

    # --- snapshot -------------------------------------------------------------------------------------------------

    def snapshot(self, indices: Sequence[int] | None = None, fields: Fields = Fields.ALL) -> Snapshot:
        """Read ``indices`` (all devices when ``None``) in one pass; see :class:`~nvmlcheck.Snapshot`."""
        self._check_open()
        wall = time.time()
        start = time.monotonic_ns()
        system = self._system or self.system()
        plan = _PLANS.get(fields)
        if plan is None:
            plan = _PLANS[fields] = _plan(fields)
        if indices is None:
            indices = range(self._calls.device_count())
        devices: list[DeviceState] = []
        failures: list[DeviceFailure] = []
        for index in indices:
            ident = self._identities.get(index)
            try:
                if ident is None:
                    ident = self._identity(index)
                devices.append(self._state(index, ident, plan))
            except NvmlCheckError as exc:
                failures.append(DeviceFailure(index, ident.uuid if ident else None, exc))
        end = time.monotonic_ns()
        return Snapshot("nvml", start, end - start, wall, system, tuple(devices), tuple(failures))

    def _identity(self, index: int) -> _Identity:
        calls = self._calls
        handle = calls.handle(index)
        uuid = calls.uuid(handle, index)  # required: it is how devices are matched across backends and tools
        unknown: dict[str, str] = {}
        values: dict[str, object] = {}
        for key, getter in (
            ("name", calls.name),
            ("pci_bus_id", calls.pci_bus_id),
            ("serial", calls.serial),
            ("minor_number", calls.minor_number),
        ):
            try:
                values[key] = getter(handle, index)
            except NvmlError as exc:
                if not _soft(exc) and key != "serial":
                    raise
                # Serial numbers are often restricted (NO_PERMISSION) on consumer boards: unknown, not fatal.
                values[key] = None
                unknown[key] = _reason(exc)
        try:
            self._totals[index] = calls.memory(handle, index).total_bytes
        except NvmlCheckError:
            pass  # a live read will report the error; the total is only the bound for process entries
        ident = _Identity(
            handle,
            uuid,
            values["name"],  # type: ignore[arg-type]
            values["pci_bus_id"],  # type: ignore[arg-type]
            values["serial"],  # type: ignore[arg-type]
            values["minor_number"],  # type: ignore[arg-type]
            MappingProxyType(unknown),
        )
        self._identities[index] = ident
        return ident

    def _state(self, index: int, ident: _Identity, plan: _Plan) -> DeviceState:
        calls = self._calls
        handle = ident.handle
        unknown: dict[str, str] | None = None

        def note(key: str, exc: NvmlError) -> None:
            nonlocal unknown
            if not _soft(exc):
                raise exc
            if unknown is None:
                unknown = {}
            unknown[key] = _reason(exc)

        memory: Memory | None = None
        if plan.memory:
            try:
                memory = calls.memory(handle, index)
            except NvmlError as exc:
                note("memory", exc)
            else:
                self._totals[index] = memory.total_bytes
                if memory.used_includes_reserved:
                    if unknown is None:
                        unknown = {}
                    unknown["memory.reserved_bytes"] = _V1_MEMORY

        lists: list[tuple[GpuProcess, ...] | None] = [None, None, None]
        if plan.processes:
            total = self._totals.get(index, 1 << 63)
            for slot, kind in enumerate(_KINDS):
                try:
                    raw = calls.processes(handle, kind, index, total)
                except NvmlError as exc:
                    note(f"processes.{kind.value}", exc)
                    continue
                lists[slot] = tuple(GpuProcess(p, kind, u, process_name(p), gi, ci) for p, u, gi, ci in raw)

        clocks = self._clocks(handle, index, note) if plan.clocks else None
        health = self._health(handle, index, note) if plan.health else None

        if unknown is None:
            reasons: Mapping[str, str] = ident.unknown if not plan.not_requested else _merge(ident.unknown, plan)
        else:
            reasons = MappingProxyType({**ident.unknown, **plan.not_requested, **unknown})
        return DeviceState(
            index,
            ident.uuid,
            ident.name,
            ident.pci_bus_id,
            ident.serial,
            ident.minor_number,
            memory,
            lists[0],
            lists[1],
            lists[2],
            clocks,
            health,
            reasons,
        )

    def _clocks(self, handle: Handle, index: int, note: _Note) -> Clocks:
        calls = self._calls
        sets: list[ClockSet] = []
        for prefix, getter in (
            ("current", calls.clock_mhz),
            ("max", calls.max_clock_mhz),
            ("applications", calls.applications_clock_mhz),
        ):
            values: list[int | None] = []
            for domain, key in zip(_CLOCK_DOMAINS, _CLOCK_KEYS, strict=True):
                try:
                    values.append(getter(handle, domain, index))
                except NvmlError as exc:
                    note(f"clocks.{prefix}.{key}", exc)
                    values.append(None)
            sets.append(ClockSet(*values))
        reasons: ClockEventReason | None
        try:
            reasons = ClockEventReason(calls.clock_event_reasons(handle, index))
        except NvmlError as exc:
            note("clocks.event_reasons", exc)
            reasons = None
        return Clocks(sets[0], sets[1], sets[2], reasons)

    def _health(self, handle: Handle, index: int, note: _Note) -> MemoryHealth:
        calls = self._calls
        pages: tuple[RetiredPage, ...] | None = ()
        for cause in RetirementCause:
            try:
                got = calls.retired_pages(handle, cause, index)
            except NvmlError as exc:
                note("health.retired_pages", exc)
                pages = None
                break
            pages = (pages or ()) + got
        pending: bool | None
        try:
            pending = calls.retired_pages_pending(handle, index)
        except NvmlError as exc:
            note("health.retired_pages_pending", exc)
            pending = None
        remapped: RemappedRows | None
        try:
            remapped = calls.remapped_rows(handle, index)
        except NvmlError as exc:
            note("health.remapped_rows", exc)
            remapped = None
        return MemoryHealth(pages, pending, remapped)


def _merge(identity_unknown: Mapping[str, str], plan: _Plan) -> Mapping[str, str]:
    if not identity_unknown:
        return plan.not_requested
    return MappingProxyType({**identity_unknown, **plan.not_requested})
