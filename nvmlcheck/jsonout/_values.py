"""Model values as plain dicts, and the header every document has (:func:`document`)."""

from __future__ import annotations

from ..model import (
    Clocks,
    ClockSet,
    DeviceFailure,
    DeviceState,
    GpuProcess,
    Health,
    Memory,
    MigDevice,
    Snapshot,
)

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ..holders import GpuUse, Holder
    from ..model import HealthCause

#: The version of every JSON document the CLI prints, but those in :data:`SCHEMA_VERSIONS`.
SCHEMA_VERSION = 1
#: Documents whose version moved on: ``wait``, ``kill`` and ``select`` 2 (``holders``, the structured culprits, beside
#: the ``culprits`` lines; every version 1 field kept). ``nvmlcheck/holders`` gained ``container``, and each of its
#: ``gpus`` the MIG instance (``mig_index``, ``mig_uuid``, ``gpu_instance_id``, ``compute_instance_id``,
#: ``why_instance_unknown``), within version 1.
SCHEMA_VERSIONS: dict[str, int] = {"wait": 2, "kill": 2, "select": 2}


def document(kind: str, **fields: Any) -> dict[str, Any]:
    """A top-level document of ``kind`` (``"snapshot"``, ``"wait"``, ``"kill"``, ``"error"``)."""
    return {"schema": f"nvmlcheck/{kind}", "version": SCHEMA_VERSIONS.get(kind, SCHEMA_VERSION), **fields}


def _memory(m: Memory | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "total_bytes": m.total_bytes,
        "used_bytes": m.used_bytes,
        "free_bytes": m.free_bytes,
        "reserved_bytes": m.reserved_bytes,
        "used_includes_reserved": m.used_includes_reserved,
        "granularity_bytes": m.granularity_bytes,
    }


def _process(p: GpuProcess) -> dict[str, Any]:
    return {
        "pid": p.pid,
        "kind": p.kind.value,
        "used_bytes": p.used_bytes,
        "name": p.name,
        "gpu_instance_id": p.gpu_instance_id,
        "compute_instance_id": p.compute_instance_id,
    }


def _processes(procs: tuple[GpuProcess, ...] | None) -> list[dict[str, Any]] | None:
    return None if procs is None else [_process(p) for p in procs]


def _clock_set(c: ClockSet) -> dict[str, int | None]:
    return {"graphics_mhz": c.graphics_mhz, "sm_mhz": c.sm_mhz, "memory_mhz": c.memory_mhz, "video_mhz": c.video_mhz}


def _clocks(c: Clocks | None) -> dict[str, Any] | None:
    if c is None:
        return None
    reasons = c.event_reasons
    return {
        "current": _clock_set(c.current),
        "max": _clock_set(c.max),
        "applications": _clock_set(c.applications),
        "event_reasons": None if reasons is None else int(reasons),
        "event_reason_names": None if reasons is None else list(reasons.names),
    }


#: The parts of :class:`Health`, each a ``health.<part>`` key of ``DeviceState.unknown`` when ``None``.
_HEALTH_PARTS = ("retired_pages", "retired_pages_pending", "remapped_rows", "ecc_uncorrected_volatile",
                 "ecc_uncorrected_aggregate", "recovery_action")


def _health_state(h: Health, causes: tuple[HealthCause, ...], unknown: Mapping[str, str]) -> str:
    """``"unhealthy"`` (a value the driver reported is a cause), ``"unknown"`` (no cause, but a value the GPU has
    could not be read, or the GPU reported no value at all: ``causes: []`` then says nothing) or ``"healthy"``."""
    if causes:
        return "unhealthy"
    from ..model import unsupported  # loaded already (the snapshot is one of its objects): no verdict import

    missing = [part for part in _HEALTH_PARTS if getattr(h, part) is None]
    if len(missing) == len(_HEALTH_PARTS):
        return "unknown"
    for part in missing:
        why = unknown.get(f"health.{part}", unknown.get("health"))
        if why is None or not unsupported(why):
            return "unknown"
    return "healthy"


def _health(h: Health | None, unknown: Mapping[str, str]) -> dict[str, Any] | None:
    if h is None:
        return None
    rows = h.remapped_rows
    causes = h.causes()
    return {
        "retired_pages": None
        if h.retired_pages is None
        else [{"address": p.address, "cause": p.cause.value, "timestamp": p.timestamp} for p in h.retired_pages],
        "retired_pages_pending": h.retired_pages_pending,
        "remapped_rows": None
        if rows is None
        else {
            "correctable": rows.correctable,
            "uncorrectable": rows.uncorrectable,
            "pending": rows.pending,
            "failure": rows.failure,
        },
        # Issue 22 (added fields; the version stays 1).
        "ecc_uncorrected_volatile": h.ecc_uncorrected_volatile,
        "ecc_uncorrected_aggregate": h.ecc_uncorrected_aggregate,
        "recovery_action": None if h.recovery_action is None else h.recovery_action.name.lower(),
        "recovery_action_code": None if h.recovery_action is None else int(h.recovery_action),
        "causes": [{"code": c.code, "text": c.text, "action": c.action.value} for c in causes],
        # Added in round 6 (the version stays 1): "causes": [] alone read as healthy when nothing could be read.
        "state": _health_state(h, causes, unknown),
    }


def _mig_device(m: MigDevice) -> dict[str, Any]:
    return {
        "index": m.index,
        "uuid": m.uuid,
        "gpu_instance_id": m.gpu_instance_id,
        "compute_instance_id": m.compute_instance_id,
        "memory": _memory(m.memory),
        "processes": _processes(m.processes),
        "unknown": dict(m.unknown),
    }


#: Fields the document derives from another one: ``null`` when their source is, for the same reason.
_DERIVED = {
    "clocks.event_reasons": "clocks.event_reason_names",
    "health.recovery_action": "health.recovery_action_code",
}


def _unknown_with_derived(unknown: Mapping[str, str]) -> dict[str, str]:
    """A device's ``unknown`` as the document says it: every ``null`` field keyed by its own dotted path, those
    derived from another field too (``event_reason_names`` is ``null`` because ``event_reasons`` is)."""
    out = dict(unknown)
    for source, derived in _DERIVED.items():
        if source in out and derived not in out:
            out[derived] = out[source]
    return out


def device_json(d: DeviceState) -> dict[str, Any]:
    """One device. ``mig_mode`` / ``mig_devices`` were added in issue 11 (``null`` when not read)."""
    return {
        "index": d.index,
        "uuid": d.uuid,
        "name": d.name,
        "pci_bus_id": d.pci_bus_id,
        "serial": d.serial,
        "minor_number": d.minor_number,
        "memory": _memory(d.memory),
        "processes": {
            "compute": _processes(d.compute_processes),
            "graphics": _processes(d.graphics_processes),
            "mps": _processes(d.mps_processes),
        },
        "clocks": _clocks(d.clocks),
        "health": _health(d.health, d.unknown),
        "unknown": _unknown_with_derived(d.unknown),
        "mig_mode": d.mig_mode,
        "mig_devices": None if d.mig_devices is None else [_mig_device(m) for m in d.mig_devices],
    }


def error_json(exc: BaseException) -> dict[str, Any]:
    """An exception as ``{"type", "message"}``, plus ``code``/``function``/``device_index`` for NVML errors,
    ``returncode`` for nvidia-smi errors, ``attempts`` (what was tried) when no backend opened, and for a
    :class:`~nvmlcheck.GpuFault` ``index``/``uuid``/``kind``/``xid``/``meaning``/``time_ns``/``wall_time``, and
    ``directory``/``path`` for a lock directory that cannot be used (``LockDirError``)."""
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    attrs: tuple[str, ...] = ("code", "function", "device_index", "returncode", "attempts", "directory", "path")
    if type(exc).__name__ == "GpuFault":  # by name: importing errors here would cost every other document
        attrs = ("index", "uuid", "kind", "xid", "meaning", "time_ns", "wall_time")
    for attr in attrs:
        value = getattr(exc, attr, None)
        if value is not None and value != ():
            out[attr] = list(value) if isinstance(value, tuple) else value
    return out


def gpu_use_json(g: GpuUse) -> dict[str, Any]:
    """One GPU (or MIG instance) a holder is listed on (``gpus`` of ``nvmlcheck/holders`` and of a kill plan's
    targets)."""
    return {
        "index": g.index,
        "uuid": g.uuid,
        "kinds": list(g.kinds),
        "used_bytes": g.used_bytes,
        "why_unknown": g.why_unknown,
        # Added within version 1: the MIG instance it runs in (null outside MIG mode, or unknown: then
        # why_instance_unknown says why).
        "mig_index": g.mig_index,
        "mig_uuid": g.mig_uuid,
        "gpu_instance_id": g.gpu_instance_id,
        "compute_instance_id": g.compute_instance_id,
        "why_instance_unknown": g.why_instance_unknown,
    }


def holder_json(h: Holder) -> dict[str, Any]:
    """One process holding a GPU (``nvmlcheck/holders``); ``null`` fields are unknown, the reason under
    ``"unknown"`` (``relation`` excepted: ``null`` means none; ``container`` is ``null`` for none too, unless
    ``"unknown"`` has a ``"container"`` reason: then it could not be told)."""
    unknown = dict(h.unknown)
    # Two fields the holder leaves without a reason of their own: the user comes from the uid, and a process not
    # visible here (no /proc entry: its start time unknown) has no open files to read.
    if h.user is None and "user" not in unknown and "uid" in unknown:
        unknown["user"] = unknown["uid"]
    if h.device_files is None and "device_files" not in unknown and "start_ticks" in unknown:
        unknown["device_files"] = unknown["start_ticks"]
    return {
        "pid": h.pid,
        "found_by": sorted(h.found_by),
        "gpus": [gpu_use_json(g) for g in h.gpus],
        "name": h.name,
        "state": h.state,
        "uid": h.uid,
        "user": h.user,
        "cmdline": None if h.cmdline is None else list(h.cmdline),
        "nspid": None if h.nspid is None else list(h.nspid),
        "ancestry": None if h.ancestry is None else list(h.ancestry),
        "device_files": None if h.device_files is None else list(h.device_files),
        "is_daemon": h.is_daemon,
        "relation": h.relation,
        "unknown": unknown,
        "container": h.container,
    }


def _failure(f: DeviceFailure) -> dict[str, Any]:
    return {"index": f.index, "uuid": f.uuid, "error": error_json(f.error)}


def snapshot_json(s: Snapshot) -> dict[str, Any]:
    """A snapshot's content (without the document header: embed it, or wrap it with :func:`document`)."""
    return {
        "backend": s.backend,
        "taken_ns": s.taken_ns,
        "duration_ns": s.duration_ns,
        "wall_time": s.wall_time,
        "system": {
            "driver_version": s.system.driver_version,
            "nvml_version": s.system.nvml_version,
            "cuda_driver_version": s.system.cuda_driver_version,
            "unknown": dict(s.system.unknown),  # the reason of each null above
        },
        "devices": [device_json(d) for d in s.devices],
        "failures": [_failure(f) for f in s.failures],
    }
