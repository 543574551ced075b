"""The nvidia-smi backend's model assembly: one :class:`~nvmlcheck.model.DeviceState` from the parsed parts.

:func:`build_device_state` joins a ``--query-gpu`` row (:class:`~nvmlcheck.backends._smi.queries.GpuRecord`) with
the GPU's :class:`ProcessLists` (from ``-q -d PIDS`` or ``--query-compute-apps``), its retired pages and the cached
identity. Parts not in the requested :class:`~nvmlcheck.model.Fields` are ``None`` with the reason "not requested";
MIG devices get their processes attributed; a process using more memory than its GPU has raises
:class:`~nvmlcheck.CorruptData`. The parsers in :mod:`nvmlcheck.backends._smi` know nothing of this; only
:mod:`nvmlcheck.backends.smi` calls it.
Rules and reasons: docs/backends.md, "How nvidia-smi output is read".
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ..errors import CorruptData
from ..model import (
    MIB,
    DeviceState,
    Fields,
    GpuProcess,
    Health,
    MigDevice,
    ProcessKind,
    RetiredPage,
    attribute_processes,
    unknown_key,
)
from ._smi.queries import ECC_COLUMNS, GpuRecord

__all__ = ["ProcessLists", "build_device_state"]


@dataclass(frozen=True, slots=True)
class ProcessLists:
    """The three lists for one GPU, each ``None`` with a reason when unknown."""

    compute: tuple[GpuProcess, ...] | None
    graphics: tuple[GpuProcess, ...] | None
    mps: tuple[GpuProcess, ...] | None
    reasons: Mapping[str, str] = field(default_factory=dict)
    #: The GPU's MIG devices read from a full ``-q`` (``None`` when not read), processes not yet attributed.
    mig_devices: tuple[MigDevice, ...] | None = None


_MEMORY_BIT = Fields.MEMORY.value
_CLOCKS_BIT = Fields.CLOCKS.value
_PROCESSES_BIT = Fields.PROCESSES.value
_HEALTH_BIT = Fields.HEALTH.value


@functools.lru_cache(maxsize=32)
def _not_requested(wanted: int) -> Mapping[str, str]:
    """The reasons that depend only on which parts were asked for."""
    out = {"minor_number": "nvidia-smi --query-gpu has no minor number field"}
    for bit, key in ((_MEMORY_BIT, "memory"), (_CLOCKS_BIT, "clocks"), (_HEALTH_BIT, "health")):
        if not wanted & bit:
            out[key] = "not requested"
    if not wanted & _PROCESSES_BIT:
        out.update({unknown_key("processes", kind): "not requested" for kind in ProcessKind})
    return MappingProxyType(out)


def build_device_state(
    record: GpuRecord,
    fields: Fields,
    *,
    processes: ProcessLists | None = None,
    retired_pages: tuple[RetiredPage, ...] | str | None = None,
    identity: Mapping[str, str | None] | None = None,
    minor_number: int | None = None,
    extra_unknown: Iterable[tuple[str, str]] = (),
) -> DeviceState:
    """One :class:`DeviceState` from a ``--query-gpu`` row and the other queries' parts.

    ``retired_pages`` is the listed pages, or a reason string when they could not be listed; it is only consulted when
    the row's page counts are non-zero. ``identity`` supplies name/serial/PCI bus id cached from an earlier query when
    this row did not ask for them; ``minor_number`` the driver's (``None``: unknown, its reason in ``extra_unknown``).
    Parts not in ``fields`` are ``None`` with the reason "not requested".
    """
    wanted = fields.value  # int tests: Flag's "in" is slow, and this runs for every GPU every poll
    unknown = dict(_not_requested(wanted))
    unknown.update(record.unknown)
    unknown.update(extra_unknown)
    if minor_number is not None:
        del unknown["minor_number"]
    ident = identity or {}
    memory = record.memory if wanted & _MEMORY_BIT else None
    clocks = record.clocks if wanted & _CLOCKS_BIT else None
    compute = graphics = mps = None
    if wanted & _PROCESSES_BIT and processes is not None:
        compute, graphics, mps = processes.compute, processes.graphics, processes.mps
        unknown.update(processes.reasons)
        _check_process_memory(record, (compute, graphics, mps))
    health = _health(record, retired_pages, unknown) if wanted & _HEALTH_BIT else None
    mig_devices: tuple[MigDevice, ...] | None = None
    if record.mig_mode is False:
        mig_devices = ()
    elif record.mig_mode and processes is not None and processes.mig_devices is not None:
        every = None if compute is None else compute + (graphics or ()) + (mps or ())
        mig_devices = attribute_processes(processes.mig_devices, every)
    elif record.mig_mode:
        unknown.setdefault("mig_devices", "the MIG devices are read from nvidia-smi -q with Fields.PROCESSES")
    return DeviceState(
        index=record.index,
        uuid=record.uuid,
        name=record.name if record.name is not None else ident.get("name"),
        pci_bus_id=record.pci_bus_id if record.pci_bus_id is not None else ident.get("pci_bus_id"),
        serial=record.serial if record.serial is not None else ident.get("serial"),
        minor_number=minor_number,
        memory=memory,
        compute_processes=compute,
        graphics_processes=graphics,
        mps_processes=mps,
        clocks=clocks,
        health=health,
        unknown=MappingProxyType(unknown),
        mig_mode=record.mig_mode,
        mig_devices=mig_devices,
    )


def _check_process_memory(record: GpuRecord, lists: Iterable[tuple[GpuProcess, ...] | None]) -> None:
    if record.memory is None:
        return
    total = record.memory.total_bytes
    for procs in lists:
        for p in procs or ():
            if p.used_bytes is not None and p.used_bytes > total:
                raise CorruptData(
                    f"process {p.pid} uses {p.used_bytes // MIB} MiB, more than the GPU's {total // MIB} MiB",
                    "nvidia-smi process list",
                    record.index,
                )


def _health(
    record: GpuRecord, retired_pages: tuple[RetiredPage, ...] | str | None, unknown: dict[str, str]
) -> Health:
    pages: tuple[RetiredPage, ...] | None = None
    if record.retired_sbe is not None and record.retired_dbe is not None:
        if record.retired_sbe + record.retired_dbe == 0:
            pages = ()  # the counts say so: no need to list them
        elif isinstance(retired_pages, tuple):
            pages = retired_pages
        else:
            unknown.setdefault("health.retired_pages", retired_pages or "the retired pages were counted but not listed")
    if record.remapped_rows is None:
        unknown.setdefault("health.remapped_rows", "remapped_rows.* were not asked for")
    if record.retired_pending is None:
        unknown.setdefault("health.retired_pages_pending", "retired_pages.pending was not asked for")
    for attr, column in ECC_COLUMNS:
        if getattr(record, attr) is None:
            unknown.setdefault(f"health.{attr}", f"{column} was not asked for")
    if record.recovery_action is None:
        unknown.setdefault("health.recovery_action", "gpu_recovery_action was not asked for")
    return Health(
        pages,
        record.retired_pending,
        record.remapped_rows,
        record.ecc_uncorrected_volatile,
        record.ecc_uncorrected_aggregate,
        record.recovery_action,
    )
