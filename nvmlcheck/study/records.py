"""Run records: one JSON object per run and GPU-run (schema ``nvmlcheck/reclaim-run``, version 1), written and read
as JSON Lines. docs/study-records.md describes every field; within version 1 fields are only added."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import Ending, parse_ending
from .errors import RecordFormatError

__all__ = ["RECORD_SCHEMA", "RECORD_VERSION", "DeviceRun", "RunRecord", "load_records", "record_writer",
           "write_records"]

#: The ``schema`` of a run record.
RECORD_SCHEMA = "nvmlcheck/reclaim-run"
#: The record format version this module writes (and the newest it reads).
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class DeviceRun:
    """One GPU of one run. ``signal_ns`` is from the run origin; every other ``*_ns`` is from this GPU's own signal
    (``None``: not observed). docs/study-records.md describes each field."""

    index: int
    uuid: str
    name: str | None
    pid: int
    baseline_used_bytes: int | None
    held_bytes: int | None
    signal_ns: int
    last_held_ns: int | None
    first_clean_ns: int | None
    off_list_ns: int | None
    memory_back_ns: int | None
    waitpid_ns: int | None
    exit_status: int | None
    zombie_ns: int | None = None
    exited_ns: int | None = None
    files_closed_ns: int | None = None
    # Dicts are left out of the hash (a record stays hashable, as before these fields); equality still compares them.
    phase_resolution_ns: dict[str, int | None] | None = field(default=None, hash=False)
    unknown: dict[str, str] | None = field(default=None, hash=False)
    holder_steps: dict[str, int] | None = field(default=None, hash=False)
    #: The holder's part in its group (issue 26): ``holder``, ``exporter``/``importer`` (``ipc``), ``root``/``rank``
    #: (``nccl``), ``client`` (``mps``).
    role: str = "holder"
    #: The GPU's used memory above its baseline at the last poll before this holder's signal (``None``: not read):
    #: for a group ended in two stages, what the first stage left held when the second began.
    held_at_signal_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run: what was measured and how precisely. Serialise with :meth:`to_json` (one JSON Lines line)."""

    run: int
    repeat: int
    warmup: bool
    size_bytes: int
    ending: Ending
    mode: str
    backend: str
    driver: str | None
    nvmlcheck: str
    wall_time: float
    timed_out: bool
    timeout_s: float
    timeout_reason: str | None
    polls: int
    poll_interval_ns: int
    poll_cost_ns: int
    devices: tuple[DeviceRun, ...]
    poll_cost_max_ns: int = 0
    trace_columns: tuple[str, ...] | None = None
    trace: tuple[tuple[int | None, ...], ...] | None = None
    holder: str = "alloc"
    holder_count: int = 1
    per_gpu: int = 1
    concurrent: str = "gpus"
    #: Every NVML event seen during the run (``nvmlcheck/event`` documents), with ``StudyConfig.events``; ``None``:
    #: not listened for. Added within version 1 (issue 15).
    events: tuple[dict[str, Any], ...] | None = None
    #: Why events were not (all) heard: the listener's reason (smi backend, NOT_SUPPORTED, ...), or ``None``.
    events_reason: str | None = None
    #: Third edition (issue 26), added within version 1: pinned host bytes per holder, how they were pinned
    #: (``alloc``/``register``; ``None`` for other kinds), importers beside the exporter, which side of an IPC group
    #: was ended first (``None``: one stage) and the gap between the stages (s; ``None``: one stage).
    pinned_bytes: int = 0
    pin_mode: str | None = None
    importers: int = 0
    first: str | None = None
    stage_gap_s: float | None = None

    @property
    def resolution_ns(self) -> int:
        """The sampling period: the larger of the median poll interval and the median query cost."""
        return max(self.poll_interval_ns, self.poll_cost_ns)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (schema ``nvmlcheck/reclaim-run``, version 1)."""
        body = asdict(self)
        body["devices"] = [asdict(d) for d in self.devices]
        body["trace_columns"] = None if self.trace_columns is None else list(self.trace_columns)
        body["trace"] = None if self.trace is None else [list(row) for row in self.trace]
        return {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, **body}

    def to_line(self) -> str:
        """One JSON Lines line (no trailing newline)."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunRecord:
        """Read a record written by :meth:`to_json`; :class:`RecordFormatError` for another schema or version,
        ``KeyError``/``TypeError`` for a damaged one."""
        schema, version = doc.get("schema"), doc.get("version")
        if schema != RECORD_SCHEMA:
            raise RecordFormatError(f"not a reclamation run record: schema {schema!r} (expected {RECORD_SCHEMA!r})")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise RecordFormatError(f"bad record version {version!r}")
        if version > RECORD_VERSION:
            raise RecordFormatError(
                f"record version {version} is newer than this nvmlcheck reads ({RECORD_VERSION}): upgrade nvmlcheck"
            )
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in doc.items() if k in known}  # fields added later in version 1 are ignored
        device_fields = set(DeviceRun.__dataclass_fields__)
        fields["devices"] = tuple(
            DeviceRun(**{k: v for k, v in d.items() if k in device_fields}) for d in doc["devices"]
        )
        if fields.get("trace_columns") is not None:
            fields["trace_columns"] = tuple(fields["trace_columns"])
        if fields.get("trace") is not None:
            fields["trace"] = tuple(tuple(row) for row in fields["trace"])
        if fields.get("events") is not None:
            fields["events"] = tuple(fields["events"])
        fields["ending"] = parse_ending(str(fields["ending"]))
        return cls(**fields)


def write_records(records: Iterable[RunRecord], path: str | os.PathLike[str]) -> Path:
    """Write ``records`` as JSON Lines to ``path`` (replacing it) and return the path."""
    out = Path(path)
    with out.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_line() + "\n")
    return out


def load_records(path: str | os.PathLike[str]) -> list[RunRecord]:
    """Read a JSON Lines file of run records (blank lines skipped). Raises :class:`RecordFormatError` naming the file
    and line for anything that is not a version-1 ``nvmlcheck/reclaim-run`` record."""
    records: list[RunRecord] = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if not isinstance(doc, dict):
                    raise RecordFormatError(f"a record is a JSON object, not {type(doc).__name__}")
                records.append(RunRecord.from_json(doc))
            except (RecordFormatError, ValueError, KeyError, TypeError) as exc:
                what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise RecordFormatError(f"{path}:{n}: {what}") from exc
    return records



@contextlib.contextmanager
def record_writer(path: str | os.PathLike[str]) -> Iterator[Callable[[RunRecord], None]]:
    """A JSON Lines sink for ``run_study(on_record=...)``: each record is written and flushed as it comes."""
    with Path(path).open("w", encoding="utf-8") as f:

        def write(record: RunRecord) -> None:
            f.write(record.to_line() + "\n")
            f.flush()

        yield write
