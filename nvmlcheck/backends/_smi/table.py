"""The CSV engine: ``--format=csv[,nounits]`` output as a header-keyed :class:`Table`, and typed access to its cells.

Columns are found by their canonical name (:mod:`.aliases`), never by position; without a header (``noheader``)
the caller names the columns it asked for. Units may be printed or not (``143771 MiB`` or ``143771``); one that is
not the field's known unit is refused. The one free-text column (a process or GPU name, which may hold commas)
takes whatever lies between the fixed columns counted from both ends. Device-handle error lines among the rows are
collected as failures. :class:`Cells` reads one row as numbers, bitmasks, flags, UUIDs and bus ids: a placeholder
is an :class:`~.text.Unavailable`, anything else not understood an :class:`~nvmlcheck.SmiParseError` naming the line.
Rules and reasons: docs/backends.md, "How nvidia-smi output is read".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...errors import ArgumentError, SmiParseError
from ...model import MIB
from .aliases import CANONICAL_UNITS, FREE_TEXT, canonical_name
from .text import (
    HandleFailure,
    Unavailable,
    handle_failure_line,
    is_uint,
    normalize_pci_bus_id,
    numbered_lines,
    placeholder,
)

__all__ = ["HEX", "UUID_TEXT", "Cells", "Column", "Row", "Table", "known", "parse_table"]

_HEADER_CELL = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?: \[([^\]\[]+)\])?")


@dataclass(frozen=True, slots=True)
class Column:
    """One column: ``name`` is canonical, ``unit`` what the header put in brackets (``None`` without a header)."""

    name: str
    unit: str | None
    header: str


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
    #: Rows that could not be split into the header's columns (only with ``keep_bad_rows``): each with its cells as
    #: split (their count is wrong) and the error. The caller decides whose row it was, or refuses the output.
    bad_rows: tuple[tuple[Row, SmiParseError], ...] = ()
    #: The free-text column's position (``None`` when there is none): a bad row's cells after it may be shifted.
    free: int | None = None

    def leading_cell(self, row: Row, name: str) -> str | None:
        """Row ``row``'s cell of column ``name`` where it can be trusted in a row of the wrong length: only left of
        the free-text column, whose commas are the only ones a row may hold (``None`` otherwise)."""
        pos = self.positions.get(name)
        if pos is None or pos >= len(row.cells) or (self.free is not None and pos >= self.free):
            return None
        return row.cells[pos]

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
        known_unit = CANONICAL_UNITS.get(name)
        if unit is not None and known_unit is not None and unit != known_unit:
            raise SmiParseError(f"field {name} is in [{unit}], expected [{known_unit}]", line_no, line)
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
    keep_bad_rows: bool = False,
) -> Table:
    """Split CSV output into columns and rows, validating the header against ``requested`` (any spelling).

    With ``header=False`` (output of ``--format=csv,noheader``) the columns are ``requested``, which is then required.
    Lines ``Unable to determine the device handle for GPU ...`` are collected as :class:`HandleFailure`. A row with
    the wrong number of columns raises :class:`~nvmlcheck.SmiParseError`, or with ``keep_bad_rows`` goes to
    ``Table.bad_rows`` (one GPU's damaged row need not cost the others theirs).
    """
    lines = numbered_lines(text)
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
            raise ArgumentError("parse_table(header=False) needs the requested field names")
        columns = tuple(Column(n, None, n) for n in wanted)
        body = lines
    positions = {c.name: i for i, c in enumerate(columns)}
    frees = [i for i, c in enumerate(columns) if c.name in FREE_TEXT]
    free = frees[0] if len(frees) == 1 else None
    rows: list[Row] = []
    failures: list[HandleFailure] = []
    bad: list[tuple[Row, SmiParseError]] = []
    for no, line in body:
        first = line.lstrip()[:1]
        hf = handle_failure_line(no, line) if first in ("U", "u", "G") and not line.startswith("GPU-") else None
        if hf is not None:
            failures.append(hf)
            continue
        try:
            rows.append(Row(no, line, _split_row(no, line, len(columns), free)))
        except SmiParseError as exc:
            if not keep_bad_rows:
                raise
            bad.append((Row(no, line, tuple(p.strip() for p in line.split(","))), exc))
    return Table(columns, tuple(rows), tuple(failures), positions, tuple(bad), free)


HEX = re.compile(r"0x[0-9A-Fa-f]{1,16}")
#: A GPU or MIG UUID as nvidia-smi prints it.
UUID_TEXT = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z/-]+")


class Cells:
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
        if is_uint(cell):  # the common case, csv,nounits: "143771"
            return int(cell)
        ph = placeholder(cell)
        if ph is not None:
            return ph
        unit = CANONICAL_UNITS.get(name)
        number = cell
        if unit is not None and cell.endswith(" " + unit):
            # csv (with units) prints "143771 MiB"; csv,nounits prints "143771": both are fine.
            number = cell[: -len(unit) - 1].rstrip()
        if not is_uint(number):
            raise self.fail(f"{name}: {cell!r} is not a whole number")
        return int(number)

    def mib_bytes(self, name: str) -> int | Unavailable:
        value = self.uint(name)
        return value if isinstance(value, Unavailable) else value * MIB

    def hex(self, name: str) -> int | Unavailable:
        cell = self.raw(name)
        ph = placeholder(cell)
        if ph is not None:
            return ph
        if HEX.fullmatch(cell) is None:
            raise self.fail(f"{name}: {cell!r} is not a hex bitmask")
        return int(cell, 16)

    def flag(self, name: str) -> bool | Unavailable:
        cell = self.raw(name)
        ph = placeholder(cell)
        if ph is not None:
            return ph
        if cell in ("Yes", "Enabled"):
            return True
        if cell in ("No", "Disabled"):
            return False
        raise self.fail(f"{name}: {cell!r} is not Yes/No or Enabled/Disabled")

    def text(self, name: str) -> str | Unavailable:
        cell = self.raw(name)
        ph = placeholder(cell)
        return ph if ph is not None else cell

    def uuid(self, name: str) -> str | Unavailable:
        cell = self.text(name)
        if isinstance(cell, str) and UUID_TEXT.fullmatch(cell) is None:
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


def known(value: object, what: str, unknown: dict[str, str], key: str) -> bool:
    """False (and the reason recorded) when ``value`` is a placeholder."""
    if isinstance(value, Unavailable):
        unknown.setdefault(key, value.reason(what))
        return False
    return True
