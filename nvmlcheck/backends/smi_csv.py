"""Pure parsers for nvidia-smi output: text in, :mod:`nvmlcheck.model` parts out. No I/O.

Four outputs are understood:

* ``--query-gpu=...``            -> :func:`parse_query_gpu` (one :class:`GpuRecord` per row)
* ``--query-compute-apps=...``   -> :func:`parse_compute_apps`
* ``--query-retired-pages=...``  -> :func:`parse_retired_pages`
* ``-q -d PIDS`` (text)          -> :func:`parse_pids_query` (all three process kinds, and the driver/CUDA versions)

and :func:`build_device_state` assembles one :class:`~nvmlcheck.model.DeviceState` from the parts.

Rules (each one is there because nvidia-smi breaks the naive reading):

* Keyed on the header, never on column position: nvidia-smi's man page says the format may change, the header renames
  fields (``clocks.sm`` prints as ``clocks.current.sm``), and older drivers print older names
  (``clocks_throttle_reasons.*``). Every name, requested or printed, is mapped to one canonical name (what driver 580
  prints). Output without a header is accepted only when the caller names the columns it asked for.
* Units: ``--format=csv`` prints ``143771 MiB``, ``csv,nounits`` prints ``143771``; the header keeps ``[MiB]`` either
  way. Both are accepted, and a unit that is not the one this module knows for the field (say ``[GiB]``) is an error,
  never a silently mis-scaled number.
* Memory is whole MiB. nvidia-smi rounds *up*: on an H200 the driver reserves 644,939,776 B = 615.06 MiB and
  ``memory.reserved`` prints 616; 2,712,076,288 B used (2586.44 MiB) prints 2587. So ``N MiB`` means more than
  ``N-1`` and at most ``N`` MiB, and ``0 MiB`` means exactly 0. Bytes are ``N * MIB`` with
  :attr:`~nvmlcheck.model.Memory.granularity_bytes` = 1 MiB.
* Placeholders (``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``[Insufficient Permissions]``,
  ``[GPU requires reset]``, bare ``N/A``, and any other ``[Words]`` a newer driver may invent) become ``None`` with the
  reason in ``unknown``; they are never read as 0.
* Process names are chosen by the workload and may contain commas and spaces. Driver 580 prints ``?`` for a comma in
  CSV (``/tmp/dir? with space``), older drivers may not; the one free-text column takes whatever lies between the
  fixed columns counted from both ends. ``-q`` text prints the name unaltered.
* Every line of real output ends with a newline; text whose last line does not was cut short (a killed ``ssh``), and a
  cut-short number would still look like a number, so it is refused.
* Anything else not understood raises :class:`~nvmlcheck.SmiParseError` with the line number and the line. Values that
  parse but cannot be true (used > total, PID <= 0) raise :class:`~nvmlcheck.CorruptData`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ..errors import CorruptData, SmiParseError
from ..model import (
    MIB,
    ClockEventReason,
    Clocks,
    ClockSet,
    DeviceState,
    Fields,
    GpuProcess,
    Memory,
    MemoryHealth,
    MigDevice,
    ProcessKind,
    RemappedRows,
    RetiredPage,
    RetirementCause,
    attribute_processes,
)

__all__ = [
    "CANONICAL_UNITS",
    "COMPUTE_APPS_ALIASES",
    "PID_MAX_LIMIT",
    "PLACEHOLDER_MEANINGS",
    "QUERY_GPU_ALIASES",
    "REMAPPED_ROWS_ALIASES",
    "RETIRED_PAGES_ALIASES",
    "Column",
    "GpuRecord",
    "HandleFailure",
    "PidsListing",
    "ProcessListing",
    "ProcessLists",
    "RetiredListing",
    "Row",
    "Table",
    "Unavailable",
    "build_device_state",
    "canonical_name",
    "cuda_version_number",
    "has_handle_failure",
    "normalize_pci_bus_id",
    "parse_compute_apps",
    "parse_list_gpus",
    "parse_pids_query",
    "parse_query_gpu",
    "parse_remapped_rows",
    "parse_retired_pages",
    "parse_table",
    "parse_version_output",
    "strip_deprecation",
]

#: Linux's largest possible PID (``PID_MAX_LIMIT`` on 64-bit); a larger one is corrupt data.
PID_MAX_LIMIT: Final = 4_194_304

#: What each placeholder nvidia-smi prints means; the text goes into ``DeviceState.unknown``.
PLACEHOLDER_MEANINGS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "[N/A]": "not available on this GPU or driver",
        "N/A": "not available on this GPU or driver",
        "[Not Supported]": "not supported by this GPU or driver",
        "[Unknown Error]": "the driver returned an unknown error",
        "[Insufficient Permissions]": "insufficient permissions; run as root or a user allowed to query the GPU",
        "[GPU requires reset]": "the GPU requires a reset (nvidia-smi -r) or a reboot",
        "[GPU is lost]": "the GPU fell off the bus or stopped answering",
    }
)

# A bracketed phrase a newer driver may print in place of a value; read as unknown, never as a value.
_OTHER_PLACEHOLDER = re.compile(r"\[[A-Za-z][A-Za-z0-9 ./'-]*\]")

# The unbracketed placeholders of ``-q`` text, found where a number belongs: Windows (WDDM) and WSL2 print
# ``Used GPU Memory : Not available in WDDM driver model`` (NVIDIA/nvidia-docker#1458), other drivers
# ``Not Supported``/``Not available``. Only consulted for cells that must be numbers, so a process *named*
# "Not available" is never misread.
_BARE_PLACEHOLDER = re.compile(
    r"(?:Not available|Not Available|Not Supported|Unknown Error|Insufficient Permissions|GPU requires reset"
    r"|GPU is lost|Deprecated)\b.*"
)

# A deprecation note beside a value (driver 610 ``-q``: ``CUDA Version : 13.2 [Deprecated; ...]``): the value
# before it still stands; the note is dropped.
_DEPRECATION_NOTE = re.compile(r"\s*\[Deprecated\b[^\]]*\]\s*$", re.IGNORECASE)

# --- canonical field names --------------------------------------------------------------------------------------------
# The canonical name of a field is what driver 580 prints in the header. The alias tables map every other spelling
# (the short query names from --help-query-*, and the names older drivers printed) to it.

_EVENT_REASON_SUFFIXES = (
    "supported",
    "active",
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)

#: ``--query-gpu`` spellings -> canonical header names.
QUERY_GPU_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "gpu_name": "name",
        "gpu_serial": "serial",
        "gpu_uuid": "uuid",
        "gpu_bus_id": "pci.bus_id",
        "clocks.gr": "clocks.current.graphics",
        "clocks.sm": "clocks.current.sm",
        "clocks.mem": "clocks.current.memory",
        "clocks.video": "clocks.current.video",
        "clocks.max.gr": "clocks.max.graphics",
        "clocks.max.mem": "clocks.max.memory",
        "clocks.applications.gr": "clocks.applications.graphics",
        "clocks.applications.mem": "clocks.applications.memory",
        "clocks.default_applications.gr": "clocks.default_applications.graphics",
        "clocks.default_applications.mem": "clocks.default_applications.memory",
        "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
        "retired_pages.dbe": "retired_pages.double_bit.count",
        "remapped_rows.sbe": "remapped_rows.correctable",
        "remapped_rows.dbe": "remapped_rows.uncorrectable",
        **{f"clocks_throttle_reasons.{s}": f"clocks_event_reasons.{s}" for s in _EVENT_REASON_SUFFIXES},
    }
)

#: ``--query-compute-apps`` spellings -> canonical header names.
COMPUTE_APPS_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"name": "process_name", "used_memory": "used_gpu_memory"}
)

#: ``--query-retired-pages`` spellings -> canonical header names (none are renamed on driver 580).
RETIRED_PAGES_ALIASES: Final[Mapping[str, str]] = MappingProxyType({})

#: The unit nvidia-smi prints for a field (in the header as ``[MiB]``, after the value with ``csv``). A header that
#: names another unit for one of these fields is refused rather than mis-scaled.
CANONICAL_UNITS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "memory.total": "MiB",
        "memory.used": "MiB",
        "memory.free": "MiB",
        "memory.reserved": "MiB",
        "used_gpu_memory": "MiB",
        **{
            f"clocks.{group}.{domain}": "MHz"
            for group in ("current", "max", "applications", "default_applications")
            for domain in ("graphics", "sm", "memory", "video")
        },
        "power.draw": "W",
        "fan.speed": "%",
    }
)

# Columns whose text is chosen by a user (may contain commas); at most one per table is resolved.
_FREE_TEXT: Final = frozenset({"name", "process_name", "gpu_name"})


def canonical_name(name: str, aliases: Mapping[str, str]) -> str:
    """The canonical (driver-580 header) name for a requested or printed field name."""
    return aliases.get(name, name)


@functools.lru_cache(maxsize=256)  # the same few bus ids come back every poll
def normalize_pci_bus_id(text: str) -> str | None:
    """``0000:02:00.0`` / ``00000000:02:00.0`` -> ``00000000:02:00.0`` (upper-case hex), ``None`` if not a bus id.

    nvidia-smi prints an 8-digit domain in CSV and ``-q``, a 4-digit one in some error messages.
    """
    m = _PCI.fullmatch(text.strip())
    if m is None:
        return None
    dom, bus, dev, fn = (int(g, 16) for g in m.groups())
    return f"{dom:08X}:{bus:02X}:{dev:02X}.{fn:X}"


_PCI = re.compile(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-9A-Fa-f])")

# --- lines and placeholders -------------------------------------------------------------------------------------------


def _lines(text: str) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers, ``\\r`` removed. Refuses text whose last line has no newline."""
    if text and not text.endswith("\n"):
        last_no = text.count("\n") + 1
        raise SmiParseError("output ends without a newline: it was cut short", last_no, text.rsplit("\n", 1)[-1])
    # Split on "\n" only: str.splitlines() would also break a process name at \x1c, \x85 or \u2028.
    raw_lines = text.split("\n")
    if "\r" in text:
        raw_lines = [raw[:-1] if raw.endswith("\r") else raw for raw in raw_lines]
    return [(no, line) for no, line in enumerate(raw_lines, start=1) if line and not line.isspace()]


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A placeholder nvidia-smi printed instead of a value (``[N/A]``, ``[Not Supported]``, ...)."""

    text: str

    def reason(self, what: str) -> str:
        """A sentence for ``DeviceState.unknown``: the field, what nvidia-smi printed, and what it means."""
        meaning = PLACEHOLDER_MEANINGS.get(self.text)
        if meaning is None:
            low = self.text.lower()
            if "wddm" in low:
                meaning = "the Windows display driver model (WDDM, also under WSL2) does not report it"
            elif "deprecated" in low:
                meaning = "this driver deprecated the field and prints no value"
            else:
                meaning = "nvidia-smi printed no value"
        return f"nvidia-smi printed {self.text} for {what}: {meaning}"


def _placeholder(cell: str) -> Unavailable | None:
    # Hot path (every cell): a value that does not start like a placeholder costs one comparison.
    if not cell or (cell[0] != "[" and cell != "N/A"):
        return None
    if cell in PLACEHOLDER_MEANINGS or _OTHER_PLACEHOLDER.fullmatch(cell):
        return Unavailable(cell)
    return None


def _number_placeholder(cell: str) -> Unavailable | None:
    """A placeholder where a number belongs: the bracketed ones, and the bare phrases of ``-q`` text (``Not
    available in WDDM driver model``). Only called once the cell failed to read as a number."""
    ph = _placeholder(cell)
    if ph is None and cell and _BARE_PLACEHOLDER.fullmatch(cell):
        return Unavailable(cell)
    return ph


def strip_deprecation(value: str) -> tuple[str, str | None]:
    """``"13.2 [Deprecated; see ...]"`` -> ``("13.2", "[Deprecated; see ...]")``: the value without the note newer
    drivers print beside it, and the note (``None`` when there was none)."""
    if "eprecated" not in value:  # cheap test first: almost every value has no note
        return value, None
    m = _DEPRECATION_NOTE.search(value)
    if m is None:
        return value, None
    return value[: m.start()].strip(), m.group(0).strip()


# --- generic CSV table ------------------------------------------------------------------------------------------------

_HEADER_CELL = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?: \[([^\]\[]+)\])?")
_PCI_TEXT = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-9A-Fa-f]"
# "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU",
# and its other spellings in published captures: "GPU0000:07:00.0" without the space, "Unable to detect ...", a
# 3-digit domain ("000:07:00.0"), no message at all; also the short "GPU 0000:02:00.0: GPU is lost".
_DEVICE_HANDLE_ERROR = re.compile(
    rf"Unable to (?:determine|detect) (?:the )?device handle for (?:GPU)? ?({_PCI_TEXT})(?:\s*:\s*(.*))?",
    re.IGNORECASE,
)
_GPU_ERROR_LINE = re.compile(rf"GPU ?({_PCI_TEXT})\s*:\s*(\S.*)")


def _handle_failure(no: int, line: str) -> HandleFailure | None:
    """A device-handle error line as a :class:`HandleFailure`, or ``None`` when ``line`` is not one."""
    stripped = line.strip()
    m = _DEVICE_HANDLE_ERROR.fullmatch(stripped) if stripped[:6].lower() == "unable" else None
    if m is None and stripped.startswith("GPU"):
        m = _GPU_ERROR_LINE.fullmatch(stripped)
    if m is None:
        return None
    pci = normalize_pci_bus_id(m.group(1))
    message = (m.group(2) or "").strip() or "nvidia-smi could not get a handle for it"
    return HandleFailure(no, line, pci, None, f"GPU {pci or m.group(1)}: {message}", _code_for_message(message))


def has_handle_failure(text: str) -> bool:
    """Whether nvidia-smi output names a GPU it could not read (any spelling): the others were still printed."""
    low = text.lower()
    return "device handle for" in low or _GPU_ERROR_LINE.search(text) is not None


@dataclass(frozen=True, slots=True)
class Column:
    """One column: ``name`` is canonical, ``unit`` what the header put in brackets (``None`` without a header)."""

    name: str
    unit: str | None
    header: str


@dataclass(frozen=True, slots=True)
class HandleFailure:
    """A line such as ``Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost...`` (or a row whose
    UUID is a placeholder): nvidia-smi could not read that device at all. ``code`` is the NVML return code the text
    names (15 lost, 16 reset required, 4 no permission, 999 otherwise)."""

    line_no: int
    line: str
    pci_bus_id: str | None
    index: int | None
    message: str
    code: int


def _code_for_message(message: str) -> int:
    low = message.lower()
    if "lost" in low:
        return 15
    if "reset" in low:
        return 16
    if "permission" in low:
        return 4
    if "not found" in low:
        return 6
    return 999


@dataclass(frozen=True, slots=True)
class Row:
    """One data row: the raw cells (stripped) in column order."""

    line_no: int
    line: str
    cells: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Table:
    """A parsed CSV output: columns, data rows, and device-handle failure lines found among them."""

    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    failures: tuple[HandleFailure, ...] = ()
    positions: Mapping[str, int] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        """Whether the canonical field ``name`` is a column."""
        return name in self.positions


def _parse_header(line_no: int, line: str, aliases: Mapping[str, str]) -> tuple[Column, ...]:
    cols: list[Column] = []
    for cell in line.split(","):
        text = cell.strip()
        m = _HEADER_CELL.fullmatch(text)
        if m is None:
            raise SmiParseError(f"header cell {text!r} is not a field name", line_no, line)
        name = canonical_name(m.group(1), aliases)
        unit = m.group(2)
        known = CANONICAL_UNITS.get(name)
        if unit is not None and known is not None and unit != known:
            raise SmiParseError(f"field {name} is in [{unit}], expected [{known}]", line_no, line)
        cols.append(Column(name, unit, text))
    names = [c.name for c in cols]
    if len(set(names)) != len(names):
        raise SmiParseError("header names a field twice", line_no, line)
    return tuple(cols)


def _split_row(line_no: int, line: str, ncols: int, free: int | None) -> tuple[str, ...]:
    parts = line.split(",")
    if len(parts) == ncols:
        return tuple(p.strip() for p in parts)
    if len(parts) > ncols and free is not None:
        # The free-text column keeps every comma: the fixed columns are counted from both ends.
        right = ncols - free - 1
        end = len(parts) - right
        middle = ",".join(parts[free:end])
        return (*(p.strip() for p in parts[:free]), middle.strip(), *(p.strip() for p in parts[end:]))
    raise SmiParseError(f"expected {ncols} columns, found {len(parts)}", line_no, line)


def parse_table(
    text: str,
    aliases: Mapping[str, str],
    requested: Sequence[str] | None = None,
    *,
    header: bool = True,
) -> Table:
    """Split CSV output into columns and rows, validating the header against ``requested`` (any spelling).

    With ``header=False`` (output of ``--format=csv,noheader``) the columns are ``requested``, which is then required.
    Lines ``Unable to determine the device handle for GPU ...`` are collected as :class:`HandleFailure`.
    """
    lines = _lines(text)
    wanted = [canonical_name(r, aliases) for r in requested] if requested is not None else None
    if header:
        if not lines:
            raise SmiParseError("no header: nvidia-smi printed nothing", 1, "")
        head_no, head = lines[0]
        columns = _parse_header(head_no, head, aliases)
        body = lines[1:]
        if wanted is not None and sorted(c.name for c in columns) != sorted(wanted):
            raise SmiParseError(f"header does not match the fields asked for ({', '.join(wanted)})", head_no, head)
    else:
        if wanted is None:
            raise ValueError("parse_table(header=False) needs the requested field names")
        columns = tuple(Column(n, None, n) for n in wanted)
        body = lines
    positions = {c.name: i for i, c in enumerate(columns)}
    frees = [i for i, c in enumerate(columns) if c.name in _FREE_TEXT]
    free = frees[0] if len(frees) == 1 else None
    rows: list[Row] = []
    failures: list[HandleFailure] = []
    for no, line in body:
        first = line.lstrip()[:1]
        hf = _handle_failure(no, line) if first in ("U", "u", "G") and not line.startswith("GPU-") else None
        if hf is not None:
            failures.append(hf)
            continue
        rows.append(Row(no, line, _split_row(no, line, len(columns), free)))
    return Table(columns, tuple(rows), tuple(failures), positions)


# --- typed cells ------------------------------------------------------------------------------------------------------

_HEX = re.compile(r"0x[0-9A-Fa-f]{1,16}")
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]+")


def _is_uint(text: str) -> bool:
    # isdigit() alone accepts "²" and other Unicode digits that int() refuses; isascii() rules them out.
    return text.isdigit() and text.isascii() and len(text) <= 20


class _Cells:
    """Typed access to one row's cells; every failure names the row."""

    __slots__ = ("row", "table")

    def __init__(self, table: Table, row: Row) -> None:
        self.table = table
        self.row = row

    def fail(self, reason: str) -> SmiParseError:
        return SmiParseError(reason, self.row.line_no, self.row.line)

    def raw(self, name: str) -> str:
        return self.row.cells[self.table.positions[name]]

    def uint(self, name: str) -> int | Unavailable:
        cell = self.row.cells[self.table.positions[name]]
        if _is_uint(cell):  # the common case, csv,nounits: "143771"
            return int(cell)
        ph = _placeholder(cell)
        if ph is not None:
            return ph
        unit = CANONICAL_UNITS.get(name)
        number = cell
        if unit is not None and cell.endswith(" " + unit):
            # csv (with units) prints "143771 MiB"; csv,nounits prints "143771": both are fine.
            number = cell[: -len(unit) - 1].rstrip()
        if not _is_uint(number):
            raise self.fail(f"{name}: {cell!r} is not a whole number")
        return int(number)

    def mib_bytes(self, name: str) -> int | Unavailable:
        value = self.uint(name)
        return value if isinstance(value, Unavailable) else value * MIB

    def hex(self, name: str) -> int | Unavailable:
        cell = self.raw(name)
        ph = _placeholder(cell)
        if ph is not None:
            return ph
        if _HEX.fullmatch(cell) is None:
            raise self.fail(f"{name}: {cell!r} is not a hex bitmask")
        return int(cell, 16)

    def flag(self, name: str) -> bool | Unavailable:
        cell = self.raw(name)
        ph = _placeholder(cell)
        if ph is not None:
            return ph
        if cell in ("Yes", "Enabled"):
            return True
        if cell in ("No", "Disabled"):
            return False
        raise self.fail(f"{name}: {cell!r} is not Yes/No or Enabled/Disabled")

    def text(self, name: str) -> str | Unavailable:
        cell = self.raw(name)
        ph = _placeholder(cell)
        return ph if ph is not None else cell

    def uuid(self, name: str) -> str | Unavailable:
        cell = self.text(name)
        if isinstance(cell, str) and _UUID.fullmatch(cell) is None:
            raise self.fail(f"{name}: {cell!r} is not a GPU UUID")
        return cell

    def pci(self, name: str) -> str | Unavailable:
        cell = self.text(name)
        if isinstance(cell, Unavailable):
            return cell
        norm = normalize_pci_bus_id(cell)
        if norm is None:
            raise self.fail(f"{name}: {cell!r} is not a PCI bus id")
        return norm


def _known(value: object, what: str, unknown: dict[str, str], key: str) -> bool:
    """False (and the reason recorded) when ``value`` is a placeholder."""
    if isinstance(value, Unavailable):
        unknown.setdefault(key, value.reason(what))
        return False
    return True


# --- --query-gpu ------------------------------------------------------------------------------------------------------


@dataclass(slots=True)  # not frozen: built for every GPU every poll, and frozen __init__ costs (treat as read-only)
class GpuRecord:
    """One ``--query-gpu`` row, converted. Parts whose columns were not asked for are ``None`` without a reason;
    parts that could not be read are ``None`` with the reason in ``unknown`` (dotted model paths).

    ``retired_sbe``/``retired_dbe`` are ``retired_pages.sbe``/``.dbe`` (page counts, to decide whether the retired
    pages need to be listed at all).
    """

    line_no: int
    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    driver_version: str | None
    memory: Memory | None
    clocks: Clocks | None
    retired_sbe: int | None
    retired_dbe: int | None
    retired_pending: bool | None
    remapped_rows: RemappedRows | None
    unknown: Mapping[str, str]
    #: ``mig.mode.current``: True Enabled, False Disabled or not supported (``[N/A]``), None not asked or unknown.
    mig_mode: bool | None = None


_MEMORY_COLUMNS = ("memory.total", "memory.used", "memory.free")
_CLOCK_DOMAINS = (("graphics", "graphics_mhz"), ("sm", "sm_mhz"), ("memory", "memory_mhz"), ("video", "video_mhz"))
_REMAPPED_COLUMNS = (
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)


def parse_query_gpu(
    text: str, requested: Sequence[str] | None = None, *, header: bool = True
) -> tuple[tuple[GpuRecord, ...], tuple[HandleFailure, ...]]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,nounits]``.

    ``index`` and ``uuid`` must be among the columns. A row whose UUID is a placeholder (``[GPU requires reset]``)
    becomes a :class:`HandleFailure`, as do ``Unable to determine the device handle`` lines.
    """
    table = parse_table(text, QUERY_GPU_ALIASES, requested, header=header)
    for needed in ("index", "uuid"):
        if not table.has(needed):
            raise SmiParseError(f"--query-gpu output lacks the {needed} column", 1, "")
    records: list[GpuRecord] = []
    failures = list(table.failures)
    for row in table.rows:
        cells = _Cells(table, row)
        index = cells.uint("index")
        uuid = cells.uuid("uuid")
        if isinstance(index, Unavailable):
            raise cells.fail(f"index is {index.text}: the row cannot be attributed to a GPU")
        if isinstance(uuid, Unavailable):
            pci = cells.pci("pci.bus_id") if table.has("pci.bus_id") else None
            failures.append(
                HandleFailure(
                    row.line_no,
                    row.line,
                    pci if isinstance(pci, str) else None,
                    index,
                    f"its UUID reads {uuid.text}",
                    _code_for_message(uuid.text),
                )
            )
            continue
        records.append(_gpu_record(table, cells, index, uuid))
    return tuple(records), tuple(failures)


def _optional_text(table: Table, cells: _Cells, name: str, key: str, unknown: dict[str, str]) -> str | None:
    if not table.has(name):
        return None
    value = cells.pci(name) if name == "pci.bus_id" else cells.text(name)
    if isinstance(value, str) and name == "driver_version":
        value = strip_deprecation(value)[0] or value  # driver 610 marks it deprecated in -q; keep the number
    return value if _known(value, name, unknown, key) and isinstance(value, str) else None


def _gpu_record(table: Table, cells: _Cells, index: int, uuid: str) -> GpuRecord:
    unknown: dict[str, str] = {}
    memory = _memory(table, cells, index, unknown) if table.has("memory.used") else None
    clocks = _clocks(table, cells, unknown) if table.has("clocks.current.sm") else None
    sbe = dbe = None
    pending = None
    remapped = None
    if table.has("retired_pages.single_bit_ecc.count"):
        s = cells.uint("retired_pages.single_bit_ecc.count")
        d = cells.uint("retired_pages.double_bit.count")
        ok_s = _known(s, "retired_pages.single_bit_ecc.count", unknown, "health.retired_pages")
        ok_d = _known(d, "retired_pages.double_bit.count", unknown, "health.retired_pages")
        if ok_s and ok_d and isinstance(s, int) and isinstance(d, int):
            sbe, dbe = s, d
    if table.has("retired_pages.pending"):
        p = cells.flag("retired_pages.pending")
        _known(p, "retired_pages.pending", unknown, "health.retired_pages_pending")
        pending = p if isinstance(p, bool) else None
    if table.has("remapped_rows.correctable"):
        remapped = _remapped(cells, unknown)
    mig_mode: bool | None = None
    if table.has("mig.mode.current"):
        mode = cells.flag("mig.mode.current")
        if isinstance(mode, bool):
            mig_mode = mode
        elif mode.text in ("[N/A]", "N/A", "[Not Supported]"):
            mig_mode = False  # a GPU without MIG: nvmlDeviceGetMigMode's NOT_SUPPORTED
        else:
            unknown["mig"] = mode.reason("mig.mode.current")
    return GpuRecord(
        line_no=cells.row.line_no,
        index=index,
        uuid=uuid,
        name=_optional_text(table, cells, "name", "name", unknown),
        pci_bus_id=_optional_text(table, cells, "pci.bus_id", "pci_bus_id", unknown),
        serial=_optional_text(table, cells, "serial", "serial", unknown),
        driver_version=_optional_text(table, cells, "driver_version", "driver_version", unknown),
        memory=memory,
        clocks=clocks,
        retired_sbe=sbe,
        retired_dbe=dbe,
        retired_pending=pending,
        remapped_rows=remapped,
        unknown=MappingProxyType(unknown),
        mig_mode=mig_mode,
    )


def _memory(table: Table, cells: _Cells, index: int, unknown: dict[str, str]) -> Memory | None:
    # Every present cell is converted (and so checked) before any is judged: garbage in one column is refused even
    # when a placeholder in another makes the whole part unknown.
    values = {n: cells.mib_bytes(n) for n in (*_MEMORY_COLUMNS, "memory.reserved") if table.has(n)}
    absent = [name for name in _MEMORY_COLUMNS if name not in values]
    if absent:
        unknown["memory"] = f"{', '.join(absent)} not asked for"
        return None
    for name in _MEMORY_COLUMNS:
        _known(values[name], name, unknown, "memory")
    total, used, free = (values[name] for name in _MEMORY_COLUMNS)
    if not (isinstance(total, int) and isinstance(used, int) and isinstance(free, int)):
        return None
    reserved: int | None = None
    # memory.reserved arrived with the v2 memory semantics (driver 510); when it cannot be asked for, memory.used is
    # the v1 figure that counts the driver's reservation.
    includes_reserved = "memory.reserved" not in values
    if not includes_reserved:
        r = values["memory.reserved"]
        if _known(r, "memory.reserved", unknown, "memory.reserved_bytes") and isinstance(r, int):
            reserved = r
    if used > total or free > total or (reserved is not None and reserved > total):
        raise CorruptData(
            f"memory.used {used // MIB} MiB / memory.free {free // MIB} MiB / memory.reserved "
            f"{'?' if reserved is None else reserved // MIB} MiB exceed memory.total {total // MIB} MiB",
            "nvidia-smi --query-gpu",
            index,
        )
    return Memory(total, used, free, reserved, used_includes_reserved=includes_reserved, granularity_bytes=MIB)


# Clock fields --query-gpu does not offer at all (driver 580's --help-query-gpu); NVML has them.
_SMI_LACKS: Final = frozenset({"clocks.max.video", "clocks.applications.sm", "clocks.applications.video"})


def _clock_set(table: Table, cells: _Cells, group: str, unknown: dict[str, str]) -> ClockSet:
    values: dict[str, int | None] = {}
    for domain, attr in _CLOCK_DOMAINS:
        name = f"clocks.{group}.{domain}"
        key = f"clocks.{group}.{attr}"
        if not table.has(name):
            values[attr] = None
            unknown[key] = (
                f"nvidia-smi --query-gpu has no {name} field" if name in _SMI_LACKS else f"{name} was not asked for"
            )
            continue
        v = cells.uint(name)
        values[attr] = v if _known(v, name, unknown, key) and isinstance(v, int) else None
    return ClockSet(**values)


def _clocks(table: Table, cells: _Cells, unknown: dict[str, str]) -> Clocks:
    current = _clock_set(table, cells, "current", unknown)
    # The current clocks are also read through Clocks.sm_mhz and friends: give those paths the same reasons.
    for _, attr in _CLOCK_DOMAINS:
        if f"clocks.current.{attr}" in unknown:
            unknown[f"clocks.{attr}"] = unknown[f"clocks.current.{attr}"]
    reasons: ClockEventReason | None = None
    if table.has("clocks_event_reasons.active"):
        mask = cells.hex("clocks_event_reasons.active")
        if _known(mask, "clocks_event_reasons.active", unknown, "clocks.event_reasons") and isinstance(mask, int):
            reasons = ClockEventReason(mask)
    else:
        unknown["clocks.event_reasons"] = "clocks_event_reasons.active was not asked for"
    return Clocks(
        current=current,
        max=_clock_set(table, cells, "max", unknown),
        applications=_clock_set(table, cells, "applications", unknown),
        event_reasons=reasons,
    )


def _remapped(cells: _Cells, unknown: dict[str, str]) -> RemappedRows | None:
    corr = cells.uint("remapped_rows.correctable")
    unc = cells.uint("remapped_rows.uncorrectable")
    pending = cells.flag("remapped_rows.pending")
    failure = cells.flag("remapped_rows.failure")
    ok = True
    for name, v in zip(_REMAPPED_COLUMNS, (corr, unc, pending, failure), strict=True):
        ok = _known(v, name, unknown, "health.remapped_rows") and ok
    if not ok:
        return None
    assert isinstance(corr, int) and isinstance(unc, int)
    assert isinstance(pending, bool) and isinstance(failure, bool)
    return RemappedRows(correctable=corr, uncorrectable=unc, pending=pending, failure=failure)


# --- processes --------------------------------------------------------------------------------------------------------


def _check_pid(pid: int, where: str) -> None:
    if pid <= 0 or pid > PID_MAX_LIMIT:
        raise CorruptData(f"process id {pid} is impossible (valid: 1..{PID_MAX_LIMIT})", where)


@dataclass(frozen=True, slots=True)
class ProcessListing:
    """Processes by GPU (UUID for CSV, PCI bus id for ``-q``), in the order nvidia-smi printed them.

    ``unattributed`` is set when a row could not be tied to a GPU (its UUID or PID a placeholder): then no GPU's list
    can be trusted to be complete, and the caller reports every list as unknown with this reason.
    """

    by_gpu: Mapping[str, tuple[GpuProcess, ...]]
    unattributed: str | None = None


_APPS_REQUIRED = ("gpu_uuid", "pid", "used_gpu_memory")


def parse_compute_apps(text: str, requested: Sequence[str] | None = None, *, header: bool = True) -> ProcessListing:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv[,nounits]``.

    ``used_gpu_memory`` ``[N/A]`` (WDDM, some MIG and container setups) becomes ``used_bytes=None``, never 0. A header
    with no rows means "no compute process" (nvidia-smi said so); with ``header=False`` empty output means the same.
    """
    table = parse_table(text, COMPUTE_APPS_ALIASES, requested, header=header)
    for needed in _APPS_REQUIRED:
        if not table.has(needed):
            raise SmiParseError(f"--query-compute-apps output lacks the {needed} column", 1, "")
    by_gpu: dict[str, list[GpuProcess]] = {}
    unattributed: str | None = None
    for row in table.rows:
        cells = _Cells(table, row)
        uuid = cells.uuid("gpu_uuid")
        pid = cells.uint("pid")
        used = cells.mib_bytes("used_gpu_memory")
        name = cells.text("process_name") if table.has("process_name") else None
        if isinstance(uuid, Unavailable) or isinstance(pid, Unavailable):
            bad = uuid if isinstance(uuid, Unavailable) else pid
            assert isinstance(bad, Unavailable)
            unattributed = f"line {row.line_no}: " + bad.reason("a compute process's gpu_uuid or pid")
            continue
        _check_pid(pid, "nvidia-smi --query-compute-apps")
        proc = GpuProcess(
            pid=pid,
            kind=ProcessKind.COMPUTE,
            used_bytes=None if isinstance(used, Unavailable) else used,
            name=name if isinstance(name, str) else None,
        )
        by_gpu.setdefault(uuid, []).append(proc)
    return ProcessListing(MappingProxyType({k: tuple(v) for k, v in by_gpu.items()}), unattributed)


# --- -q -d PIDS -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PidsListing:
    """``nvidia-smi -q -d PIDS``: the three process lists of each GPU (keyed by normalised PCI bus id), the versions
    its header prints, and devices it could not read. ``unknown`` maps a GPU to the reason its lists could not be read
    (``Processes : N/A``); such a GPU has empty entries in the three mappings, which must not be read as "none"."""

    compute: Mapping[str, tuple[GpuProcess, ...]]
    graphics: Mapping[str, tuple[GpuProcess, ...]]
    mps: Mapping[str, tuple[GpuProcess, ...]]
    driver_version: str | None
    cuda_version: str | None
    failures: tuple[HandleFailure, ...] = ()
    unknown: Mapping[str, str] = field(default_factory=dict)
    #: Header values the driver annotated or withheld (``"CUDA Version"`` -> why it is unknown or marked deprecated).
    notes: Mapping[str, str] = field(default_factory=dict)
    #: GPU (PCI bus id) -> why some of its processes' bytes are ``None`` (WDDM, MIG): the lists still stand.
    bytes_unknown: Mapping[str, str] = field(default_factory=dict)
    #: GPU -> ``MIG Mode`` ``Current`` (full ``-q`` only): True/False, or the reason it is unknown.
    mig_mode: Mapping[str, bool | str] = field(default_factory=dict)
    #: GPU -> its ``MIG Device`` blocks (full ``-q`` only; ``uuid`` and ``processes`` not yet filled).
    mig_devices: Mapping[str, tuple[MigDevice, ...]] = field(default_factory=dict)
    #: GPU -> why its ``MIG Device`` blocks could not be read (they are then left out of ``mig_devices``).
    mig_unknown: Mapping[str, str] = field(default_factory=dict)


_Q_GPU = re.compile(rf"GPU ({_PCI_TEXT})")
_Q_TYPE_LETTERS = {"C": ProcessKind.COMPUTE, "G": ProcessKind.GRAPHICS, "M": ProcessKind.MPS}
_Q_MEMORY = re.compile(r"(\d{1,20}) MiB")
_Q_KEY = re.compile(r"[A-Za-z][A-Za-z0-9 ./()+-]*")
_Q_ENTRY_LINE = re.compile(r"( +)(GPU instance ID|Compute instance ID|Process ID|Type|Name|Used GPU Memory) *: (.*)")
# Keys of -q -d PIDS output, accepted without the regular expression (the hot path).
_Q_KNOWN_KEYS: Final = frozenset(
    {"GPU instance ID", "Compute instance ID", "Process ID", "Type", "Name", "Used GPU Memory", "Processes",
     "Timestamp", "Driver Version", "CUDA Version", "Attached GPUs"}
)  # fmt: skip


class _PidsParser:
    """A small state machine over ``nvidia-smi -q`` lines: a header of ``key : value`` lines, then ``GPU <bus id>``
    blocks. Inside a block only the ``Processes`` section is read (its entries start at ``GPU instance ID``, or at
    ``Process ID`` on drivers without MIG fields); other sections (a full ``-q``) are skipped, and the section ends at
    the first line indented no deeper than its own ``Processes`` line."""

    def __init__(self) -> None:
        self.top: dict[str, str] = {}
        self.lists: dict[ProcessKind, dict[str, list[GpuProcess]]] = {k: {} for k in ProcessKind}
        self.unknown: dict[str, str] = {}
        self.failures: list[HandleFailure] = []
        self.gpu: str | None = None
        self.section_indent: int | None = None  # indentation of the open Processes line
        self.seen_section = False  # this GPU block had its Processes line
        self.entry: dict[str, str] = {}
        self.entry_line: tuple[int, str] = (0, "")
        # Where each key of the open entry was read, so an error quotes the offending line, not the entry's first.
        self.entry_lines: dict[str, tuple[int, str]] = {}
        self.notes: dict[str, str] = {}  # header key -> the deprecation note printed beside its value
        self.unknown_bytes: dict[str, Unavailable] = {}  # GPU -> what it printed for a process's bytes
        # MIG (full -q only): "MIG Mode / Current" and the "MIG Device" blocks of each GPU.
        self.mig_mode: dict[str, bool | Unavailable] = {}
        self.mig: dict[str, list[MigDevice]] = {}
        self.mig_bad: dict[str, str] = {}  # GPU -> why its MIG Device blocks could not be read
        self.mig_lines: dict[str, tuple[int, str]] = {}  # where each key of the open MIG Device block was read
        self.title: str | None = None  # the open section title of the GPU block ("MIG Mode", "FB Memory Usage")
        self.title_indent = 0
        self.mig_indent: int | None = None  # indentation of the open "MIG Device" title
        self.mig_entry: dict[str, str] = {}
        self.mig_line: tuple[int, str] = (0, "")

    def feed(self, no: int, line: str) -> None:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if self.section_indent is not None and indent <= self.section_indent:
            self.close_entry()
            self.section_indent = None
        # Cheap first-character tests keep the regular expressions off the common "key : value" line.
        if stripped[0] == "=" and stripped.startswith("=====") and "NVSMI LOG" in stripped:
            return
        if stripped[0] in "Uu" and stripped[:6].lower() == "unable":
            self.handle_failure(no, line)
            return
        if stripped[0] == "G" and (gpu := _Q_GPU.fullmatch(stripped)) is not None:
            self.close_gpu(no, line)
            self.gpu = normalize_pci_bus_id(gpu.group(1))
            for kind in ProcessKind:
                self.lists[kind].setdefault(str(self.gpu), [])
            return
        if stripped[0] == "G" and _GPU_ERROR_LINE.fullmatch(stripped) and indent == 0:
            self.handle_failure(no, line)  # "GPU 0000:02:00.0: GPU is lost" in place of the GPU's block
            return
        left, sep, right = stripped.partition(":")
        key = left.rstrip()
        value: str | None = right
        if not sep:
            key, value = stripped, None  # a bare title: "Processes", "FB Memory Usage"
        elif key not in _Q_KNOWN_KEYS and _Q_KEY.fullmatch(key) is None:
            raise SmiParseError("not a 'key : value' line", no, line)
        if key == "Processes" and self.gpu is not None:
            self.open_section(no, line, indent, (value or "").strip())
            return
        if self.gpu is not None and self.section_indent is None and self.gpu_section(no, line, indent, key, value):
            return
        if value is None:
            if self.gpu is not None and self.section_indent is None and _Q_KEY.fullmatch(stripped):
                return  # a section title of a full -q: not ours
            raise SmiParseError("not a 'key : value' line", no, line)
        if self.gpu is None:
            # Driver 610 prints "[Deprecated; ...]" beside Driver Version and CUDA Version: keep the value.
            plain, note = strip_deprecation(value.strip())
            self.top[key] = plain
            if note is not None:
                self.notes[key] = note
        elif self.section_indent is not None:
            self.entry_value(no, line, key, value.strip())

    def gpu_section(self, no: int, line: str, indent: int, key: str, value: str | None) -> bool:
        """The MIG parts of a full ``-q`` GPU block: ``MIG Mode`` / ``Current`` and each ``MIG Device`` block
        (``Index``, ``GPU Instance ID``, ``Compute Instance ID``, ``FB Memory Usage``). True when the line was used."""
        if self.mig_indent is not None and indent <= self.mig_indent:
            self.close_mig()
        if self.title is not None and indent <= self.title_indent:
            self.title = None
        if value is None:  # a bare title
            if key == "MIG Device":
                self.close_mig()
                self.mig_indent, self.mig_entry, self.mig_line = indent, {}, (no, line)
                self.mig_lines = {}
                self.title = None  # "MIG Devices" (the enclosing title) must not prefix its keys
                return True
            self.title, self.title_indent = key, indent
            return self.mig_indent is not None
        gpu = str(self.gpu)
        if self.mig_indent is not None:
            path = f"{self.title}/{key}" if self.title is not None else key
            self.mig_entry[path] = value.strip()
            self.mig_lines[path] = (no, line)
            return True
        if self.title == "MIG Mode" and key == "Current":
            mode = value.strip()
            ph = _number_placeholder(mode)
            if ph is not None:
                self.mig_mode[gpu] = ph
            elif mode in ("Enabled", "Disabled"):
                self.mig_mode[gpu] = mode == "Enabled"
            else:
                raise SmiParseError(f"MIG Mode Current {mode!r} is not Enabled or Disabled", no, line)
            return True
        return False

    def close_mig(self) -> None:
        if self.mig_indent is None:
            return
        entry, self.mig_entry, self.mig_indent = self.mig_entry, {}, None
        try:
            self.mig_device(entry)
        except SmiParseError as exc:
            # The MIG blocks are not what a wait needs to be correct (the parent is judged without them): a block
            # this parser cannot read makes the GPU's MIG devices unknown, quoting the line, and the snapshot goes on.
            self.mig_bad.setdefault(str(self.gpu), f"{exc.reason} (line {exc.line_no}: {exc.line.strip()!r})")

    def mig_device(self, entry: dict[str, str]) -> None:
        where, self.mig_lines = self.mig_lines, {}
        no, line = self.mig_line
        unknown: dict[str, str] = {}

        def at(key: str) -> tuple[int, str]:
            return where.get(key, (no, line))

        def number(key: str) -> int | None:
            v = entry.get(key)
            if v is None:
                unknown.setdefault(key, f"nvidia-smi -q printed no {key!r} for this MIG device")
                return None
            if _is_uint(v):
                return int(v)
            if _number_placeholder(v) is not None:
                unknown.setdefault(key, Unavailable(v).reason(f"MIG device {key}"))
                return None
            raise SmiParseError(f"MIG device {key} {v!r} is not a number", *at(key))

        index = number("Index")
        if index is None:
            raise SmiParseError("a MIG Device block without an Index", no, line)
        gi = number("GPU Instance ID")
        ci = number("Compute Instance ID")
        memory: Memory | None = None
        fb = {k.split("/", 1)[1]: v for k, v in entry.items() if k.startswith("FB Memory Usage/")}
        values: dict[str, int | None] = {}
        for part in ("Total", "Used", "Free", "Reserved"):
            v = fb.get(part)
            m = _Q_MEMORY.fullmatch(v) if v is not None else None
            values[part] = int(m.group(1)) * MIB if m is not None else None
            if v is not None and m is None and _number_placeholder(v) is None:
                raise SmiParseError(
                    f"MIG device FB Memory Usage {part} {v!r} is not 'N MiB'", *at(f"FB Memory Usage/{part}")
                )
        total, used, free = values["Total"], values["Used"], values["Free"]
        if total is not None and used is not None and free is not None:
            if used > total:
                raise CorruptData(f"MIG device {index} uses {used // MIB} MiB of {total // MIB} MiB", "nvidia-smi -q")
            memory = Memory(total, used, free, values["Reserved"], False, MIB)
        else:
            unknown["memory"] = "nvidia-smi -q printed no FB Memory Usage Total/Used/Free for this MIG device"
        self.mig.setdefault(str(self.gpu), []).append(
            MigDevice(index, None, gi, ci, memory, None, MappingProxyType(unknown))
        )

    def handle_failure(self, no: int, line: str) -> None:
        hf = _handle_failure(no, line)
        if hf is None:
            raise SmiParseError("not a 'key : value' line", no, line)
        self.failures.append(hf)

    def open_section(self, no: int, line: str, indent: int, value: str) -> None:
        gpu = str(self.gpu)
        if self.seen_section:
            raise SmiParseError(f"GPU {gpu} has two Processes sections", no, line)
        self.seen_section = True
        ph = _placeholder(value)
        if ph is not None:
            # The process lists could not be read (not supported here): unknown, not empty.
            self.unknown[gpu] = ph.reason("Processes")
        elif value == "":
            self.section_indent = indent
        elif value != "None":
            raise SmiParseError(f"Processes reads {value!r}", no, line)

    def entry_value(self, no: int, line: str, key: str, value: str) -> None:
        starts_entry = key == "GPU instance ID" or (key == "Process ID" and "Process ID" in self.entry)
        if starts_entry:
            self.close_entry()
        if not self.entry:
            self.entry_line = (no, line)
        # Unknown keys inside an entry are kept but unused: newer drivers add fields (CC protected memory).
        self.entry[key] = value
        self.entry_lines[key] = (no, line)

    def close_entry(self) -> None:
        if not self.entry:
            return
        no, line = self.entry_line
        entry, self.entry = self.entry, {}
        where, self.entry_lines = self.entry_lines, {}

        def at(key: str) -> tuple[int, str]:
            return where.get(key, (no, line))

        for needed in ("Process ID", "Type", "Used GPU Memory"):
            if needed not in entry:
                raise SmiParseError(f"process entry without {needed!r}", no, line)
        if not _is_uint(entry["Process ID"]):
            raise SmiParseError(f"Process ID {entry['Process ID']!r} is not a number", *at("Process ID"))
        pid = int(entry["Process ID"])
        _check_pid(pid, "nvidia-smi -q -d PIDS")
        letters = entry["Type"].split("+")
        if not letters or any(t not in _Q_TYPE_LETTERS for t in letters) or len(set(letters)) != len(letters):
            raise SmiParseError(f"process Type {entry['Type']!r} is not C, G, M or a '+' combination", *at("Type"))
        used = self.memory(entry["Used GPU Memory"], *at("Used GPU Memory"))
        if used is None:
            # "Not available in WDDM driver model", "N/A" on some MIG setups: unknown, never 0 (FACTS.md).
            self.unknown_bytes.setdefault(
                str(self.gpu), _number_placeholder(entry["Used GPU Memory"]) or Unavailable(entry["Used GPU Memory"])
            )
        name = entry.get("Name")
        if name is not None and _placeholder(name) is not None:
            name = None
        gi = self.instance_id(entry.get("GPU instance ID"), *at("GPU instance ID"))
        ci = self.instance_id(entry.get("Compute instance ID"), *at("Compute instance ID"))
        for letter in letters:
            kind = _Q_TYPE_LETTERS[letter]
            self.lists[kind][str(self.gpu)].append(GpuProcess(pid, kind, used, name, gi, ci))

    @staticmethod
    def memory(value: str, no: int, line: str) -> int | None:
        m = _Q_MEMORY.fullmatch(value)
        if m is not None:
            return int(m.group(1)) * MIB
        if _number_placeholder(strip_deprecation(value)[0] or value) is not None:
            return None
        raise SmiParseError(f"Used GPU Memory {value!r} is not 'N MiB'", no, line)

    @staticmethod
    def instance_id(value: str | None, no: int, line: str) -> int | None:
        if value is None or _number_placeholder(value) is not None:
            return None
        if not _is_uint(value):
            raise SmiParseError(f"instance id {value!r} is not a number", no, line)
        return int(value)

    def close_gpu(self, no: int, line: str) -> None:
        self.close_entry()
        self.close_mig()
        self.title = None
        if self.gpu is not None and not self.seen_section:
            # -q -d MEMORY has no Processes section: that is "not asked", never "no process".
            raise SmiParseError(f"GPU {self.gpu} has no Processes section", no, line)
        self.section_indent = None
        self.seen_section = False


def parse_pids_query(text: str) -> PidsListing:
    """Parse ``nvidia-smi -q -d PIDS``: every GPU's compute, graphics and MPS processes (``Type`` ``C``, ``G``,
    ``M``, or combinations such as ``M+C`` and ``C+G``, where the process is listed under each kind), plus the
    ``Driver Version`` and ``CUDA Version`` of the header. ``Processes : None`` is an empty list: nvidia-smi said so.
    """
    parser = _PidsParser()
    lines = _lines(text)
    entry_line = _Q_ENTRY_LINE.fullmatch
    for no, line in lines:
        # Fast lane for the lines of a process entry (most of the output); everything else takes feed().
        m = entry_line(line)
        if m is not None and parser.section_indent is not None and len(m.group(1)) > parser.section_indent:
            key = m.group(2)
            if key == "GPU instance ID" or (key == "Process ID" and "Process ID" in parser.entry):
                parser.close_entry()
            if not parser.entry:
                parser.entry_line = (no, line)
            parser.entry[key] = m.group(3).strip()
            parser.entry_lines[key] = (no, line)
            continue
        parser.feed(no, line)
    last_no, last = lines[-1] if lines else (1, "")
    parser.close_gpu(last_no, last)
    if "Driver Version" not in parser.top and "KMD Version" not in parser.top:
        raise SmiParseError("no 'Driver Version' line: this is not nvidia-smi -q output", 1, text[:80])

    def freeze(kind: ProcessKind) -> Mapping[str, tuple[GpuProcess, ...]]:
        return MappingProxyType({k: tuple(v) for k, v in parser.lists[kind].items()})

    notes: dict[str, str] = {}

    def version(key: str) -> str | None:
        v = parser.top.get(key)
        if v is not None and parser.notes.get(key):
            notes[key] = f"nvidia-smi marks {key} {parser.notes[key]}"
        if v is None:
            return None
        if not v:
            notes[key] = f"nvidia-smi printed only a deprecation note for {key}: {parser.notes.get(key, '')}"
            return None
        ph = _number_placeholder(v)
        if ph is not None:
            notes[key] = ph.reason(key)
            return None
        return v

    return PidsListing(
        compute=freeze(ProcessKind.COMPUTE),
        graphics=freeze(ProcessKind.GRAPHICS),
        mps=freeze(ProcessKind.MPS),
        # Driver 610 deprecated "Driver Version"/"CUDA Version" for "KMD Version"/"CUDA UMD Version" (nvidia-smi
        # docs: "to more accurately reflect the source of the version information"): the new names win.
        driver_version=version("KMD Version") or version("Driver Version"),
        cuda_version=version("CUDA UMD Version") or version("CUDA Version"),
        failures=tuple(parser.failures),
        unknown=MappingProxyType(dict(parser.unknown)),
        notes=MappingProxyType(notes),
        mig_mode=MappingProxyType(
            {k: v if isinstance(v, bool) else v.reason("MIG Mode Current") for k, v in parser.mig_mode.items()}
        ),
        mig_devices=MappingProxyType({k: tuple(v) for k, v in parser.mig.items() if k not in parser.mig_bad}),
        mig_unknown=MappingProxyType(dict(parser.mig_bad)),
        bytes_unknown=MappingProxyType(
            {k: v.reason("a process's Used GPU Memory") for k, v in parser.unknown_bytes.items()}
        ),
    )


# --- --version --------------------------------------------------------------------------------------------------------

_VERSION_LINE = re.compile(r"([A-Za-z][A-Za-z -]*?)\s*:\s*(\S.*)")


def parse_version_output(text: str) -> Mapping[str, str]:
    """Parse ``nvidia-smi --version`` (``NVIDIA-SMI version : 580.159.04``, ``DRIVER version``, ``CUDA Version``,
    ``NVML version``) into a mapping with lower-cased keys (``"cuda version"``).

    A ``[Deprecated; ...]`` note beside a value is dropped; driver 610's ``CUDA Version: Deprecated, see ...`` stays
    as printed (it is not a version: :func:`cuda_version_number` reads it as unknown)."""
    out: dict[str, str] = {}
    for no, line in _lines(text):
        m = _VERSION_LINE.fullmatch(line.strip())
        if m is None:
            raise SmiParseError("not a 'name : version' line", no, line)
        out[m.group(1).strip().lower()] = strip_deprecation(m.group(2).strip())[0] or m.group(2).strip()
    if not out:
        raise SmiParseError("nvidia-smi --version printed nothing", 1, "")
    return MappingProxyType(out)


def cuda_version_number(text: str) -> int | None:
    """``"13.0"`` -> 13000, ``"12.4"`` -> 12040 (the encoding of nvmlSystemGetCudaDriverVersion_v2); ``None`` for
    anything else."""
    m = re.fullmatch(r"(\d{1,3})\.(\d{1,2})", text.strip())
    return None if m is None else int(m.group(1)) * 1000 + int(m.group(2)) * 10


# --- --query-retired-pages --------------------------------------------------------------------------------------------

_CAUSES: Final[Mapping[str, RetirementCause]] = MappingProxyType(
    {"Single Bit ECC": RetirementCause.MULTIPLE_SINGLE_BIT_ECC, "Double Bit ECC": RetirementCause.DOUBLE_BIT_ECC}
)


@dataclass(frozen=True, slots=True)
class RetiredListing:
    """Retired pages by GPU UUID. ``unsupported`` maps a UUID to the reason its pages cannot be listed (nvidia-smi
    prints placeholder rows, one per cause, where retirement is not supported, as on Hopper)."""

    by_gpu: Mapping[str, tuple[RetiredPage, ...]]
    unsupported: Mapping[str, str]


def parse_retired_pages(text: str, requested: Sequence[str] | None = None, *, header: bool = True) -> RetiredListing:
    """Parse ``nvidia-smi --query-retired-pages=gpu_uuid,retired_pages.address,retired_pages.timestamp,
    retired_pages.cause --format=csv``. Addresses are hex or decimal; a timestamp that is not a whole number is kept
    as ``None`` (the model's "not available")."""
    table = parse_table(text, RETIRED_PAGES_ALIASES, requested, header=header)
    for needed in ("gpu_uuid", "retired_pages.address", "retired_pages.cause"):
        if not table.has(needed):
            raise SmiParseError(f"--query-retired-pages output lacks the {needed} column", 1, "")
    pages: dict[str, list[RetiredPage]] = {}
    unsupported: dict[str, str] = {}
    for row in table.rows:
        cells = _Cells(table, row)
        uuid = cells.uuid("gpu_uuid")
        if isinstance(uuid, Unavailable):
            raise cells.fail("a retired page row without a GPU UUID")
        cause_text = cells.text("retired_pages.cause")
        if isinstance(cause_text, Unavailable) or cause_text not in _CAUSES:
            raise cells.fail(f"retired_pages.cause {cells.raw('retired_pages.cause')!r} is not a known cause")
        address = _address(cells)
        if isinstance(address, Unavailable):
            unsupported[uuid] = address.reason("retired_pages.address")
            continue
        stamp: int | None = None
        if table.has("retired_pages.timestamp"):
            # NVML's raw value when nvidia-smi prints a number; a date text (format not documented) stays unknown
            # rather than being converted with a guessed time zone.
            raw_stamp = cells.raw("retired_pages.timestamp")
            stamp = int(raw_stamp) if _is_uint(raw_stamp) else None
        pages.setdefault(uuid, []).append(RetiredPage(address, _CAUSES[cause_text], stamp))
    for uuid in unsupported:
        if uuid in pages:
            raise SmiParseError(f"GPU {uuid} lists retired pages and placeholder rows", 1, "")
    return RetiredListing(
        MappingProxyType({k: tuple(v) for k, v in pages.items()}), MappingProxyType(dict(unsupported))
    )


def _address(cells: _Cells) -> int | Unavailable:
    cell = cells.raw("retired_pages.address")
    ph = _placeholder(cell)
    if ph is not None:
        return ph
    if _HEX.fullmatch(cell):
        return int(cell, 16)
    if _is_uint(cell):
        return int(cell)
    raise cells.fail(f"retired_pages.address {cell!r} is not an address")


# --- --query-remapped-rows ------------------------------------------------------------------------------------------

#: ``--query-remapped-rows`` spellings -> canonical header names.
REMAPPED_ROWS_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"remapped_rows.sbe": "remapped_rows.correctable", "remapped_rows.dbe": "remapped_rows.uncorrectable"}
)


def parse_remapped_rows(
    text: str, requested: Sequence[str] | None = None, *, header: bool = True
) -> Mapping[str, RemappedRows | str]:
    """Parse ``nvidia-smi --query-remapped-rows=gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,
    remapped_rows.pending,remapped_rows.failure --format=csv``, keyed by ``gpu_uuid`` (or ``gpu_bus_id`` when that is
    the identifying column). A GPU whose values are placeholders maps to the reason. The backend reads the same
    fields through ``--query-gpu``; this is for callers that ran the dedicated query."""
    table = parse_table(text, REMAPPED_ROWS_ALIASES, requested, header=header)
    key_column = "gpu_uuid" if table.has("gpu_uuid") else "gpu_bus_id"
    for needed in (key_column, *_REMAPPED_COLUMNS):
        if not table.has(needed):
            raise SmiParseError(f"--query-remapped-rows output lacks the {needed} column", 1, "")
    out: dict[str, RemappedRows | str] = {}
    for row in table.rows:
        cells = _Cells(table, row)
        key = cells.uuid(key_column) if key_column == "gpu_uuid" else cells.pci(key_column)
        if isinstance(key, Unavailable):
            raise cells.fail(f"a remapped rows row without {key_column}")
        unknown: dict[str, str] = {}
        rows = _remapped(cells, unknown)
        out[key] = rows if rows is not None else unknown["health.remapped_rows"]
    return MappingProxyType(out)


# --- assembling a DeviceState -----------------------------------------------------------------------------------------


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
        out.update({f"processes.{kind.value}": "not requested" for kind in ProcessKind})
    return MappingProxyType(out)


def build_device_state(
    record: GpuRecord,
    fields: Fields,
    *,
    processes: ProcessLists | None = None,
    retired_pages: tuple[RetiredPage, ...] | str | None = None,
    identity: Mapping[str, str | None] | None = None,
    extra_unknown: Iterable[tuple[str, str]] = (),
) -> DeviceState:
    """One :class:`DeviceState` from a ``--query-gpu`` row and the other queries' parts.

    ``retired_pages`` is the listed pages, or a reason string when they could not be listed; it is only consulted when
    the row's page counts are non-zero. ``identity`` supplies name/serial/PCI bus id cached from an earlier query when
    this row did not ask for them. Parts not in ``fields`` are ``None`` with the reason "not requested".
    """
    wanted = fields.value  # int tests: Flag's "in" costs ~0.4 µs a time, for every GPU every poll
    unknown = dict(_not_requested(wanted))
    unknown.update(record.unknown)
    unknown.update(extra_unknown)
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
        minor_number=None,
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
) -> MemoryHealth:
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
    return MemoryHealth(pages, record.retired_pending, record.remapped_rows)


# --- -L (MIG UUIDs) ---------------------------------------------------------------------------------------------------

_L_GPU = re.compile(r"GPU (\d+): .*\(UUID: (GPU-[^)]+)\)")
_L_MIG = re.compile(r"MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


def parse_list_gpus(text: str) -> Mapping[int, Mapping[int, str]]:
    """Parse ``nvidia-smi -L``: GPU index -> {MIG device index: ``MIG-...`` UUID}. ``-q`` does not print a MIG
    device's UUID; ``-L`` prints ``  MIG 1g.10gb     Device  0: (UUID: MIG-...)`` under its GPU's line."""
    out: dict[int, dict[int, str]] = {}
    gpu: int | None = None
    for no, line in _lines(text):
        stripped = line.strip()
        g = _L_GPU.fullmatch(stripped)
        if g is not None:
            gpu = int(g.group(1))
            out.setdefault(gpu, {})
            continue
        m = _L_MIG.fullmatch(stripped)
        if m is not None and gpu is not None:
            out[gpu][int(m.group(2))] = m.group(3)
            continue
        raise SmiParseError("not a GPU or MIG device line of nvidia-smi -L", no, line)
    return MappingProxyType({k: MappingProxyType(v) for k, v in out.items()})
