"""JSON output of the CLI: model objects to plain dicts, under a versioned schema.

Every document has ``"schema"`` (``"nvmlcheck/snapshot"``, ``"nvmlcheck/wait"``, ``"nvmlcheck/kill"``,
``"nvmlcheck/holders"``, ``"nvmlcheck/select"``,
``"nvmlcheck/error"``, ``"nvmlcheck/demo"``, ``"nvmlcheck/study-reclaim"``) and ``"version"``
(:data:`SCHEMA_VERSION`). Within a version, fields are only ever added;
a removal or change of meaning bumps the version. Bytes are integers in bytes, times integers in ns, and unknown
values are ``null`` with the reason under the device's ``"unknown"``. docs/cli.md documents each field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import (
    Clocks,
    ClockSet,
    DeviceFailure,
    DeviceState,
    GpuProcess,
    Memory,
    MemoryHealth,
    MigDevice,
    Snapshot,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .compare import Comparison
    from .errors import WaitTimeout
    from .holders import Holder, KillSelection
    from .hosts import HostResult
    from .kill import KillPlan, KillResult, KillTimeout
    from .selection import Selection, SelectTimeout
    from .study import StudyResult, SummaryRow
    from .wait import WaitResult

__all__ = [
    "SCHEMA_VERSION",
    "compare_document",
    "device_json",
    "document",
    "error_json",
    "holder_json",
    "hosts_document",
    "kill_document",
    "kill_timeout_document",
    "left_alone_json",
    "nothing_to_kill_document",
    "nothing_to_kill_timeout_document",
    "select_document",
    "select_timeout_document",
    "snapshot_json",
    "study_reclaim_document",
    "wait_document",
    "wait_timeout_document",
]

#: The version of every JSON document the CLI prints.
SCHEMA_VERSION = 1


def document(kind: str, **fields: Any) -> dict[str, Any]:
    """A top-level document of ``kind`` (``"snapshot"``, ``"wait"``, ``"kill"``, ``"error"``)."""
    return {"schema": f"nvmlcheck/{kind}", "version": SCHEMA_VERSION, **fields}


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


def _health(h: MemoryHealth | None) -> dict[str, Any] | None:
    if h is None:
        return None
    rows = h.remapped_rows
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
        "health": _health(d.health),
        "unknown": dict(d.unknown),
        "mig_mode": d.mig_mode,
        "mig_devices": None if d.mig_devices is None else [_mig_device(m) for m in d.mig_devices],
    }


def error_json(exc: BaseException) -> dict[str, Any]:
    """An exception as ``{"type", "message"}``, plus ``code``/``function``/``device_index`` for NVML errors,
    ``returncode`` for nvidia-smi errors, ``attempts`` (what was tried) when no backend opened, and for a
    :class:`~nvmlcheck.GpuFault` ``index``/``uuid``/``kind``/``xid``/``meaning``/``time_ns``/``wall_time``."""
    out: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    attrs: tuple[str, ...] = ("code", "function", "device_index", "returncode", "attempts")
    if type(exc).__name__ == "GpuFault":  # by name: importing errors here would cost every other document
        attrs = ("index", "uuid", "kind", "xid", "meaning", "time_ns", "wall_time")
    for attr in attrs:
        value = getattr(exc, attr, None)
        if value is not None and value != ():
            out[attr] = list(value) if isinstance(value, tuple) else value
    return out


def holder_json(h: Holder) -> dict[str, Any]:
    """One process holding a GPU (``nvmlcheck/holders``); ``null`` fields are unknown, the reason under
    ``"unknown"``."""
    return {
        "pid": h.pid,
        "found_by": sorted(h.found_by),
        "gpus": [
            {
                "index": g.index,
                "uuid": g.uuid,
                "kinds": list(g.kinds),
                "used_bytes": g.used_bytes,
                "why_unknown": g.why_unknown,
            }
            for g in h.gpus
        ],
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
        "unknown": dict(h.unknown),
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
        },
        "devices": [device_json(d) for d in s.devices],
        "failures": [_failure(f) for f in s.failures],
    }


# --- the commands' documents ------------------------------------------------------------------------------------


def wait_document(result: WaitResult) -> dict[str, Any]:
    """The ``nvmlcheck/wait`` document of a wait that ended clean."""
    return document(
        "wait",
        clean=True,
        elapsed_ns=result.elapsed_ns,
        first_clean_ns=result.first_clean_ns,
        last_dirty_ns=result.last_dirty_ns,
        polls=result.polls,
        poll_cost_ns=result.poll_cost_ns,
        interval_ns=result.interval_ns,
        culprits=[],
        snapshot=snapshot_json(result.snapshot),
    )


def wait_timeout_document(exc: WaitTimeout, kind: str = "wait", **extra: Any) -> dict[str, Any]:
    """The ``nvmlcheck/wait`` document of a wait that timed out; with ``kind="kill"`` the common part of a kill's,
    ``extra`` its kill fields."""
    return document(
        kind,
        clean=False,
        elapsed_ns=exc.elapsed_ns,
        timeout_s=exc.timeout_s,
        polls=exc.polls,
        culprits=list(exc.culprits),
        snapshot=None if exc.snapshot is None else snapshot_json(exc.snapshot),
        **extra,
    )


def left_alone_json(selection: KillSelection | None) -> list[dict[str, Any]]:
    """The holders ``--all-holders``/``--all-on-gpu`` did not signal, with why (a kill's ``left_alone``)."""
    return [] if selection is None else [{"pid": h.pid, "name": h.name, "reason": why} for h, why in selection.skipped]


def kill_document(result: KillResult, plan: KillPlan, selection: KillSelection | None) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of a kill that ended clean (``selection``: what ``--all-*`` chose)."""
    return document("kill", **result.to_json(), left_alone=left_alone_json(selection), vanished=list(plan.vanished),
                    snapshot=snapshot_json(result.snapshot))


def kill_timeout_document(exc: KillTimeout, plan: KillPlan, selection: KillSelection | None) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of a kill that timed out."""
    fields = {**exc.to_json(), "left_alone": left_alone_json(selection), "vanished": list(plan.vanished)}
    fields.pop("clean", None)  # the wait's part says it, first
    return wait_timeout_document(exc, "kill", **fields)


def _nothing_to_kill(signal_name: str, tree: bool, selection: KillSelection | None) -> dict[str, Any]:
    return {"signal": signal_name, "tree": tree, "pids": [], "left_alone": left_alone_json(selection), "vanished": []}


def nothing_to_kill_document(
    result: WaitResult, *, signal_name: str, tree: bool, selection: KillSelection | None
) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of ``--all-*`` with nothing to signal, whose plain wait ended clean."""
    return document("kill", clean=True, **_nothing_to_kill(signal_name, tree, selection),
                    clean_ns=result.first_clean_ns, confirmed_ns=result.elapsed_ns,
                    resolution_ns=max(result.interval_ns, result.poll_cost_ns), snapshot=snapshot_json(result.snapshot))


def nothing_to_kill_timeout_document(
    exc: WaitTimeout, *, signal_name: str, tree: bool, selection: KillSelection | None
) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of ``--all-*`` with nothing to signal, whose plain wait timed out."""
    return wait_timeout_document(exc, "kill", tree_hint=[], **_nothing_to_kill(signal_name, tree, selection))


def select_document(
    selection: Selection, *, count: int, format: str, timeout_s: float | None, value: str,
    holder_pid: int | None, owner_pid: int,
) -> dict[str, Any]:
    """The ``nvmlcheck/select`` document of GPUs found; ``lock`` is set when ``selection`` holds locks (then handed
    to ``holder_pid`` until ``owner_pid`` exits)."""
    locks = selection.locks
    lock = None if locks is None else {"dir": str(locks.directory), "uuids": list(locks.uuids),
                                       "holder_pid": holder_pid, "owner_pid": owner_pid}
    selected = [{"index": d.index, "uuid": d.uuid, "name": d.name, "pci_bus_id": d.pci_bus_id}
                for d in selection.devices]
    return document("select", count=count, format=format, timeout_s=timeout_s, found=True, value=value,
                    selected=selected, passed_over=list(selection.passed_over), elapsed_ns=selection.elapsed_ns,
                    polls=selection.polls, lock=lock, snapshot=snapshot_json(selection.snapshot))


def select_timeout_document(
    exc: SelectTimeout, *, count: int, format: str, timeout_s: float | None
) -> dict[str, Any]:
    """The ``nvmlcheck/select`` document of a selection that timed out."""
    return document("select", count=count, format=format, timeout_s=timeout_s, found=False, value=None, selected=[],
                    passed_over=list(exc.culprits), elapsed_ns=exc.elapsed_ns, polls=exc.polls, lock=None,
                    snapshot=None if exc.snapshot is None else snapshot_json(exc.snapshot))


def hosts_document(command: str, results: Sequence[HostResult], code: int) -> dict[str, Any]:
    """The ``nvmlcheck/hosts`` document (version 1): one verdict over every host, each host's own document."""

    def entry(r: HostResult) -> dict[str, Any]:
        return {
            "host": str(r.host),
            "verdict": r.verdict,
            "exit_code": r.exit_code,
            "via": r.via,
            "note": r.note,
            "elapsed_ns": r.elapsed_ns,
            "document": r.document,
            "error": None if r.error is None else {**error_json(r.error), "kind": r.error.kind, "host": r.error.host},
        }

    def named(verdict: str) -> list[str]:
        return [str(r.host) for r in results if r.verdict == verdict]

    return document("hosts", command=command, exit_code=code, clean=named("clean"), not_clean=named("not-clean"),
                    failed=named("failed"), hosts=[entry(r) for r in results])


def study_reclaim_document(
    result: StudyResult, rows: Sequence[SummaryRow], *, out: str | None, plots: Sequence[str]
) -> dict[str, Any]:
    """The ``nvmlcheck/study-reclaim`` document: the summary and every record (without its trace: ``--out`` keeps
    those)."""
    from .study import RECORD_SCHEMA, RECORD_VERSION

    timed_out = [r for r in result.records if r.timed_out]
    return document(
        "study-reclaim",
        complete=not timed_out,
        runs=len(result.records),
        measured_runs=len(result.measured),
        timed_out_runs=[r.run for r in timed_out],
        record_schema={"schema": RECORD_SCHEMA, "version": RECORD_VERSION},
        out=out,
        plots=list(plots),
        summary=[row.to_json() for row in rows],
        records=[{**r.to_json(), "trace": None} for r in result.records],
    )


def compare_document(result: Comparison, a: str, b: str) -> dict[str, Any]:
    """The ``nvmlcheck/study-compare`` document with the two record files compared."""
    return {**result.to_json(), "a": a, "b": b}
