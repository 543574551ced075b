"""Run records: one JSON object per run and GPU-run (schema ``nvmlcheck/reclaim-run``, version 1), written and read
as JSON Lines. docs/study-records.md describes every field; within version 1 fields are only added."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from .config import Ending, parse_ending
from .errors import RecordFormatError

__all__ = ["RECORD_SCHEMA", "RECORD_VERSION", "UNRECORDED", "DeviceRun", "RunRecord", "load_records",
           "record_writer", "repeated_run", "write_records"]

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
    #: Whether the run was simulated (``--simulate``: the stub libnvidia-ml and stub holders), added within version 1:
    #: ``True``, ``False`` (real GPUs and holders), or ``None`` when unknown, ``simulated_reason`` saying why (a record
    #: written before this field is never taken for a real one). ``simulation``: what simulated it (``None`` when not
    #: simulated or unknown).
    simulated: bool | None = None
    simulation: str | None = None
    simulated_reason: str | None = None

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

    @property
    def provenance(self) -> str:
        """``"simulated"``, ``"real"`` or ``"unknown"`` (see ``simulated``)."""
        return "unknown" if self.simulated is None else "simulated" if self.simulated else "real"

    def to_line(self) -> str:
        """One JSON Lines line (no trailing newline)."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunRecord:
        """Read a record written by :meth:`to_json`. Every field is checked for its type and range (a bool is not a
        number, a time is not negative, a number is finite): :class:`RecordFormatError` naming the field for
        anything else, another schema or a newer version."""
        schema, version = doc.get("schema"), doc.get("version")
        if schema != RECORD_SCHEMA:
            raise RecordFormatError(f"not a reclamation run record: schema {schema!r} (expected {RECORD_SCHEMA!r})")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise RecordFormatError(f"bad record version {version!r}")
        if version > RECORD_VERSION:
            raise RecordFormatError(
                f"record version {version} is newer than this nvmlcheck reads ({RECORD_VERSION}): upgrade nvmlcheck"
            )
        fields = _checked(doc, _RUN_FIELDS, cls.__dataclass_fields__, "")  # later fields of version 1: ignored
        if "devices" not in doc:
            raise RecordFormatError("missing field 'devices'")
        devices = doc["devices"]
        if not isinstance(devices, list) or not devices:
            raise RecordFormatError(f"field 'devices': expected a non-empty list of objects, got {_show(devices)}")
        runs = []
        for i, d in enumerate(devices):
            if not isinstance(d, dict):
                raise RecordFormatError(f"field 'devices[{i}]': expected an object, got {_show(d)}")
            values = _checked(d, _DEVICE_FIELDS, DeviceRun.__dataclass_fields__, f"devices[{i}].")
            last_held = values.get("last_held_ns")
            if last_held is not None and last_held < -values["signal_ns"]:
                raise RecordFormatError(f"field 'devices[{i}].last_held_ns': {last_held} is before the run's origin")
            runs.append(DeviceRun(**values))
        fields["devices"] = tuple(runs)
        _check_trace(fields.get("trace_columns"), fields.get("trace"))
        if fields.get("trace_columns") is not None:
            fields["trace_columns"] = tuple(fields["trace_columns"])
        if fields.get("trace") is not None:
            fields["trace"] = tuple(tuple(row) for row in fields["trace"])
        if fields.get("events") is not None:
            fields["events"] = tuple(fields["events"])
        fields.update(_provenance(doc, fields))
        try:
            fields["ending"] = parse_ending(fields["ending"])
        except ValueError as exc:
            raise RecordFormatError(f"field 'ending': {exc}") from None
        return cls(**fields)


# --- reading: every field checked for its type and range ----------------------------------------------------------

#: A check: the error (what was expected) for a value, or None when it is fine.
_Check = Callable[[Any], "str | None"]


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: Every integer of a record is within a signed 64-bit integer (what the driver and the clocks give: 2**63 ns is 292
#: years): larger ones are refused, not carried into statistics and fits where they overflow.
INT_LIMIT = 2**63


def _int(minimum: int | None) -> _Check:
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int):
            return "an integer" + ("" if minimum is None else f" >= {minimum}")
        if minimum is not None and v < minimum:
            return f"an integer >= {minimum}"
        return None if -INT_LIMIT < v < INT_LIMIT else "an integer of magnitude below 2**63"
    return check


def _seconds(v: Any) -> str | None:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and math.isfinite(v) and v >= 0
    return None if ok else "a finite number >= 0"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _str(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def _optional(check: _Check) -> _Check:
    def inner(v: Any) -> str | None:
        why = None if v is None else check(v)
        return None if why is None else f"{why} or null"
    return inner


def _mapping(check: _Check, what: str) -> _Check:
    def inner(v: Any) -> str | None:
        ok = isinstance(v, dict) and all(check(x) is None for x in v.values())
        return None if ok else f"an object of {what}"
    return inner


def _list_of(check: _Check, what: str) -> _Check:
    def inner(v: Any) -> str | None:
        return None if isinstance(v, list) and all(check(x) is None for x in v) else f"a list of {what}"
    return inner


def _one_of(*words: str) -> _Check:
    def check(v: Any) -> str | None:
        return None if v in words else " or ".join(map(repr, words))
    return check


_NS = _int(0)
_RUN_FIELDS: dict[str, _Check] = {
    "run": _int(0), "repeat": _int(0), "warmup": _bool, "size_bytes": _int(0), "ending": _str, "mode": _str,
    "backend": _str, "driver": _optional(_str), "nvmlcheck": _str, "wall_time": _seconds, "timed_out": _bool,
    "timeout_s": _seconds, "timeout_reason": _optional(_str), "polls": _int(0), "poll_interval_ns": _NS,
    "poll_cost_ns": _NS, "poll_cost_max_ns": _NS, "trace_columns": _optional(_list_of(_str, "strings")),
    "trace": _optional(_list_of(lambda row: None if isinstance(row, list) else "a list", "lists")),
    "holder": _str, "holder_count": _int(1), "per_gpu": _int(1), "concurrent": _one_of("gpus", "none"),
    "events": _optional(_list_of(lambda e: None if isinstance(e, dict) else "an object", "objects")),
    "events_reason": _optional(_str),
    # third edition (issue 26)
    "pinned_bytes": _int(0), "pin_mode": _optional(_one_of("alloc", "register")), "importers": _int(0),
    "first": _optional(_one_of("exporter", "importers")), "stage_gap_s": _optional(_seconds),
    # whether the run was simulated (added within version 1 after the third edition)
    "simulated": _optional(_bool), "simulation": _optional(_str), "simulated_reason": _optional(_str),
}
_DEVICE_FIELDS: dict[str, _Check] = {
    "index": _int(0), "uuid": _str, "name": _optional(_str), "pid": _int(1),
    "baseline_used_bytes": _optional(_int(0)), "held_bytes": _optional(_int(None)), "signal_ns": _NS,
    # The last poll that showed the GPU held may come just before this GPU's own signal (holders of several GPUs
    # are signalled one after another): negative, but never before the run's origin (checked with signal_ns).
    "last_held_ns": _optional(_int(None)), "first_clean_ns": _optional(_NS), "off_list_ns": _optional(_NS),
    "memory_back_ns": _optional(_NS), "waitpid_ns": _optional(_NS), "exit_status": _optional(_int(None)),
    "zombie_ns": _optional(_NS), "exited_ns": _optional(_NS), "files_closed_ns": _optional(_NS),
    "phase_resolution_ns": _optional(_mapping(_optional(_NS), "integers >= 0 or null")),
    "unknown": _optional(_mapping(_str, "strings")), "holder_steps": _optional(_mapping(_int(None), "integers")),
    # third edition (issue 26); held memory may read below the baseline (another process freed some meanwhile)
    "role": _one_of("holder", "exporter", "importer", "root", "rank", "client"),
    "held_at_signal_bytes": _optional(_int(None)),
}


#: Why a record without the ``simulated`` field is of unknown provenance.
UNRECORDED = ("written before records said whether they were simulated (no 'simulated' field), by holders that "
              "did not report the CUDA holder's steps (as in the first edition): it may come from the stub "
              "(--simulate) or from a real GPU")
#: The stub holder's mark on its ``ready`` line (``sim=1``), kept in ``holder_steps`` since the second edition.
_STUB_MARK = "sim"
#: The CUDA holder's own steps (``python -m nvmlcheck.holder``: ``cuInit``, then its context), on its ``ready`` line
#: since the second edition, as the stub holder's mark: a holder that reported them set up a context on a real GPU.
_CUDA_STEPS = ("init", "ctx")


def _provenance(doc: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any]:
    """``simulated``, ``simulation`` and ``simulated_reason`` of a record read back: as written; for an older record
    without them, simulated when its holders carry the stub's mark (``sim`` in ``holder_steps``), real when every
    holder reported the CUDA holder's steps (``init`` and ``ctx``, which the stub's holders never report: both marks
    came with the second edition), else unknown with the reason (a first-edition record: never taken for real)."""
    simulated = fields.get("simulated")
    if simulated is True:
        return {"simulated_reason": None}
    if simulated is False:
        return {"simulation": None, "simulated_reason": None}
    steps = [d.holder_steps or {} for d in fields["devices"]]
    if any(_STUB_MARK in s for s in steps):
        return {"simulated": True, "simulated_reason": None,
                "simulation": fields.get("simulation") or "the stub holders (their ready lines carry sim=1)"}
    if "simulated" in doc:
        return {}  # unknown, as written (with the writer's reason, if it gave one)
    if all(all(k in s for k in _CUDA_STEPS) for s in steps):
        return {"simulated": False, "simulation": None, "simulated_reason": None}
    return {"simulated": None, "simulation": None, "simulated_reason": UNRECORDED}


def _checked(doc: dict[str, Any], checks: dict[str, _Check], known: Any, where: str) -> dict[str, Any]:
    """The dataclass fields of ``doc``, each checked; a missing one without a default is an error."""
    out: dict[str, Any] = {}
    for name, spec in known.items():
        if name == "devices":
            continue
        if name not in doc:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise RecordFormatError(f"missing field '{where}{name}'")
            continue
        value = doc[name]
        why = checks[name](value)
        if why is not None:
            raise RecordFormatError(f"field '{where}{name}': expected {why}, got {_show(value)}")
        out[name] = value
    return out


def _check_trace(columns: list[str] | None, rows: list[list[Any]] | None) -> None:
    if rows is None:
        return
    width = None if columns is None else len(columns)
    for n, row in enumerate(rows):
        if width is not None and len(row) != width:
            raise RecordFormatError(f"field 'trace[{n}]': {len(row)} values for {width} trace_columns")
        if not row or _int(None)(row[0]) is not None:
            raise RecordFormatError(f"field 'trace[{n}]': expected an integer offset first, got {_show(row[:1])}")
        bad = next((x for x in row[1:] if x is not None and _NS(x) is not None), None)
        if bad is not None:
            raise RecordFormatError(f"field 'trace[{n}]': expected integers >= 0 or null, got {_show(bad)}")


def repeated_run(records: Iterable[RunRecord]) -> tuple[int, int] | None:
    """The positions of the first run found twice in ``records`` (the same record, field for field: a file given
    twice, or a file and one its records were appended to), or ``None``. A run counted twice weighs double in a fit
    and narrows a comparison's interval as if it had been measured twice."""
    seen: dict[str, int] = {}
    for i, r in enumerate(records):
        line = r.to_line()
        if line in seen:
            return seen[line], i
        seen[line] = i
    return None


def each_run_once(records: Iterable[RunRecord], where: str, harm: str) -> list[RunRecord]:
    """``records`` as a list; :class:`~nvmlcheck.ArgumentError` naming the first run found twice
    (:func:`repeated_run`): ``where`` holds it (``"B holds run"``, ``"the records hold run"``), ``harm`` says what
    counting it twice would do."""
    runs = list(records)
    twice = repeated_run(runs)
    if twice is not None:
        from ..errors import ArgumentError

        r = runs[twice[1]]
        raise ArgumentError(f"{where} {r.run} of the study at wall time {r.wall_time} twice (records {twice[0] + 1} "
                            f"and {twice[1] + 1}): a file given twice, or a file and one its records were appended "
                            f"to; {harm}")
    return runs


def write_records(records: Iterable[RunRecord], path: str | os.PathLike[str]) -> Path:
    """Write ``records`` as JSON Lines to ``path`` and return the path. The file is replaced whole (written beside it,
    then renamed over it): interrupted, ``path`` keeps what it held, never half a file."""
    out = Path(path)
    with _Lines(out) as lines:
        for r in records:
            lines.write(r.to_line())
        lines.publish()  # no record: an empty file, as asked
    return out


#: The longest line :func:`load_records` reads: a record with a trace of every poll of a 30 s run on 8 GPUs is tens
#: of MiB at most; a longer line (``/dev/zero``, a binary file) is refused before it fills the memory.
MAX_LINE_BYTES = 128 << 20


def load_records(path: str | os.PathLike[str], *, traces: bool = True) -> list[RunRecord]:
    """Read a JSON Lines file of run records (blank lines skipped), or the document of ``study reclaim --json`` (its
    ``records``, without their traces). ``traces=False``: each record's per-poll trace is checked, then left out
    (``trace`` and ``trace_columns`` ``None``): a traced record holds a Python object per poll and value, ~8 times its
    line's bytes, so compare and fit (which read no trace) would otherwise hold every run's trace at once. Raises
    :class:`RecordFormatError` naming the file and line for anything else:
    a field of the wrong type or range, ``NaN``/``Infinity``, text that is not UTF-8, a line longer than
    :data:`MAX_LINE_BYTES`, a last line cut short (its writer killed while writing it), another nvmlcheck document
    (``study compare --json``: named, with what to give instead). ``OSError`` when the file cannot be read."""
    records: list[RunRecord] = []
    with Path(path).open("rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:  # /dev/zero, a binary file: never read whole into memory
                raise RecordFormatError(f"{path}:{n}: a line longer than {MAX_LINE_BYTES >> 20} MiB is no run record "
                                        "(a record with its trace is at most a few MiB)")
            try:
                # An editor's byte-order mark on the first line is no part of the JSON (json.loads refuses it).
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")
                if not line.strip():
                    continue
                try:
                    doc = json.loads(line, parse_constant=_no_constant)
                except json.JSONDecodeError as exc:
                    whole = None if records or line.strip() != "{" else _whole_document(f)
                    if whole is not None:
                        return _records_of_document(whole)  # printed with indents (--json): not JSON Lines
                    if records or not raw.endswith(b"\n") or line.lstrip()[:1] in ("{", "["):
                        raise
                    # The first line is no JSON at all: most likely the study's table, saved from its stdout.
                    raise RecordFormatError(
                        f"not JSON ({exc}): run records are JSON Lines, as `study reclaim --out "
                        "FILE.jsonl` writes them (or the document `study reclaim --json` prints); the table `study "
                        "reclaim` prints is for reading, not records") from None
                if not isinstance(doc, dict):
                    raise RecordFormatError(f"a record is a JSON object, not {type(doc).__name__}")
                if not records and doc.get("schema") != RECORD_SCHEMA and _is_document(doc):
                    return _records_of_document(doc)  # one compact document (a --json line)
                records.append(_read(doc, traces))
            except UnicodeDecodeError:
                if not raw.endswith(b"\n"):
                    raise RecordFormatError(_cut_short(path, n)) from None
                raise RecordFormatError(f"{path}:{n}: not UTF-8 text") from None
            except (RecordFormatError, ValueError, RecursionError) as exc:
                if not raw.endswith(b"\n") and isinstance(exc, json.JSONDecodeError):
                    raise RecordFormatError(_cut_short(path, n)) from None
                raise RecordFormatError(f"{path}:{n}: {exc}") from exc
    return records


def _read(doc: dict[str, Any], traces: bool) -> RunRecord:
    """The record of ``doc``, every field checked; without its trace unless ``traces``."""
    record = RunRecord.from_json(doc)
    if not traces and (record.trace is not None or record.trace_columns is not None):
        record = replace(record, trace=None, trace_columns=None)
    return record


#: The document of ``study reclaim --json``, whose ``records`` are run records (without their traces).
REPORT_SCHEMA = "nvmlcheck/study-reclaim"
#: What the other study documents are, for the error that names one given as records.
_DOCUMENTS = {"nvmlcheck/study-compare": "the output of study compare --json",
              "nvmlcheck/study-fit": "the output of study fit --json", "nvmlcheck/error": "an error document"}


def _is_document(doc: dict[str, Any]) -> bool:
    schema = doc.get("schema")
    return isinstance(schema, str) and schema.startswith("nvmlcheck/") and schema != RECORD_SCHEMA


def _whole_document(f: Any) -> Any | None:
    """The file read whole as one JSON value (at most :data:`MAX_LINE_BYTES`), or ``None`` when it is not one."""
    f.seek(0)
    data = f.read(MAX_LINE_BYTES + 1)
    if len(data) > MAX_LINE_BYTES:
        return None
    try:
        doc = json.loads(data.decode("utf-8-sig"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) and _is_document(doc) else None


def _records_of_document(doc: dict[str, Any]) -> list[RunRecord]:
    """The records of a ``study reclaim --json`` document; for another document, an error naming it and the fix (the
    caller adds the file and line)."""
    schema, version = doc.get("schema"), doc.get("version")
    if schema != REPORT_SCHEMA:
        what = _DOCUMENTS.get(str(schema), "another nvmlcheck document")
        raise RecordFormatError(
            f"an {schema} document (version {version!r}: {what}), not run records: give the JSON Lines file of "
            f"study reclaim --out (schema {RECORD_SCHEMA}), or the document of study reclaim --json")
    if version != 1:
        raise RecordFormatError(f"an {REPORT_SCHEMA} document of version {version!r}: this nvmlcheck reads "
                                "version 1 (upgrade nvmlcheck for a newer one)")
    every = doc.get("records")
    if not isinstance(every, list):
        raise RecordFormatError(f"field 'records' of the {REPORT_SCHEMA} document: expected a list, got "
                                f"{_show(every)}")
    out = []
    for i, r in enumerate(every):
        if not isinstance(r, dict):
            raise RecordFormatError(f"records[{i}]: a record is a JSON object, not {type(r).__name__}")
        try:
            out.append(RunRecord.from_json(r))
        except RecordFormatError as exc:
            raise RecordFormatError(f"records[{i}]: {exc}") from exc
    return out


def _cut_short(path: str | os.PathLike[str], n: int) -> str:
    """The error for a last line that is not a whole record: its writer was killed while writing it."""
    before = f"the {n - 1} line{'s' if n != 2 else ''} before it" if n > 1 else "no line before it"
    return (f"{path}:{n}: the last line is cut short (no newline at its end, and not a whole JSON record): its writer "
            f"was killed while writing it; {before} can be read once it is removed (sed -i '$d' FILE)")


def _no_constant(name: str) -> Any:
    raise RecordFormatError(f"{name} is not a number a record can hold")



@contextlib.contextmanager
def record_writer(path: str | os.PathLike[str]) -> Iterator[Callable[[RunRecord], None]]:
    """A JSON Lines sink for ``run_study(on_record=...)``: each record is written whole as it comes (a study
    interrupted, by a signal or a full disk, leaves complete records, never half a line). ``path`` is replaced only
    by a file that holds the first record: a study that ends before its first record (refused at the baseline,
    skipped, interrupted) leaves ``path`` as it was."""
    with _Lines(Path(path)) as lines:

        def write(record: RunRecord) -> None:
            lines.write(record.to_line())
            lines.publish()

        yield write


class _Lines:
    """Whole lines appended to a file written beside ``path`` (same directory, a hidden temporary name) and renamed
    over it by :meth:`publish`; appended to in place after that. A line is written with ``os.write`` until all of it
    is out; if anything interrupts it (a signal's exception, ``ENOSPC``), the file is cut back to the line's start,
    so it only ever holds complete lines. Left unpublished, the temporary file is removed on exit. A ``path`` that
    exists and is no regular file (a FIFO, ``/dev/null``) is written in place; so is a file whose directory takes no
    new file (it is emptied only when the first line comes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.target = str(path)
        self.fd = -1
        self.temp: str | None = None
        self.in_place = False  # opened (and emptied) at the first line
        self.size = 0  # bytes of complete lines in the file

    def __enter__(self) -> _Lines:
        target = os.path.realpath(self.path)  # through a symbolic link, as opening it would
        try:
            mode = os.stat(target).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):
            self.fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            return self
        umask = os.umask(0)
        os.umask(umask)
        self.target = target
        try:
            fd, self.temp = tempfile.mkstemp(dir=os.path.dirname(target) or ".",
                                             prefix=f".{os.path.basename(target)}.", suffix=".partial")
        except PermissionError:
            if mode is None or not os.access(target, os.W_OK):
                raise
            self.in_place = True  # a writable file in a directory that takes no new file: written where it is
            return self
        os.fchmod(fd, stat.S_IMODE(mode) if mode is not None else 0o666 & ~umask)
        self.fd = fd
        return self

    def write(self, line: str) -> None:
        if self.in_place and self.fd < 0:
            self.fd = os.open(self.target, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        elif self.temp is None and self.size:
            self._still_ours()
        whole = (line + "\n").encode("utf-8")
        data = memoryview(whole)
        try:
            while data:
                data = data[os.write(self.fd, data):]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, self.size)  # cut back to the last complete line, and write on from there
                os.lseek(self.fd, self.size, os.SEEK_SET)
            raise
        self.size += len(whole)

    def _still_ours(self) -> None:
        """Refuse to write on when ``path`` is no longer this file (another study with the same ``--out`` renamed its
        own over it): the records so far are copied to a file of their own, named in the error, not lost with the
        unlinked file."""
        mine = os.fstat(self.fd)
        try:
            there = os.stat(self.target)
        except FileNotFoundError:
            there = None
        if there is not None and (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
            return
        if not stat.S_ISREG(mine.st_mode):
            return  # a FIFO or a device written in place
        keep = f"{self.target}.{os.getpid()}"
        with open(keep, "wb") as f:
            f.write(os.pread(self.fd, self.size, 0))
        raise OSError(errno.ESTALE, f"{self.target} was replaced or removed by another process (another study with "
                                    f"the same --out?); the records written so far are in {keep}")

    def publish(self) -> None:
        """Put the file at ``path`` (once): renamed over it, atomically."""
        if self.temp is not None:
            os.replace(self.temp, self.target)
            self.temp = None

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
        if self.temp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.temp)
