"""Statistics of a study: order statistics per cell (size, ending, holder kind, pinned bytes, importers, IPC order:
:func:`summarize`), the table
``nvmlcheck study reclaim`` prints (:func:`format_summary`), and the run to plot (:func:`median_run`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from ..errors import ArgumentError

if TYPE_CHECKING:
    from .records import RunRecord

__all__ = ["MEASURES", "SLEEP_REFERENCE_NS", "SPREAD_MIN_N", "Stats", "SummaryRow", "cell_words", "format_summary",
           "median_run", "percentile", "summarize"]

#: The ritual this instrument replaces: ``sleep 3 && nvidia-smi``.
SLEEP_REFERENCE_NS = 3_000_000_000

#: The fewest values a p10 and p90 are given for (the least count ``study compare`` judges a spread on, too). With
#: fewer, no value lies between a p10 and the median: the p10 would be a point interpolated between the min and the
#: median (with 1 value: the value itself), a spread no run measured, so p10 and p90 are ``None`` with a reason.
SPREAD_MIN_N = 4


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the closest ranks (numpy's default, "inclusive"):
    position ``(n - 1) * q`` in the sorted values. ``ValueError`` for no values or ``q`` outside 0..1."""
    ordered = sorted(values)
    if not ordered:
        raise ArgumentError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ArgumentError(f"q must be within 0..1, got {q!r}")
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Stats:
    """Order statistics of one measure, in ns: ``n`` values, min, p10, median, p90, max (see :func:`percentile`).

    ``p10`` and ``p90`` are ``None`` for fewer than :data:`SPREAD_MIN_N` values, with the reason in ``unknown``."""

    n: int
    min: float
    p10: float | None
    median: float
    p90: float | None
    max: float
    #: Why a statistic is ``None`` (``{"p10": ..., "p90": ...}``); empty when every one is given.
    unknown: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Sequence[int]) -> Stats | None:
        """The statistics of ``values`` (``None`` when there are none; p10 and p90 ``None`` for fewer than
        :data:`SPREAD_MIN_N`)."""
        if not values:
            return None
        n = len(values)
        if n < SPREAD_MIN_N:
            why = (f"{n} value{'s' if n > 1 else ''}: fewer than {SPREAD_MIN_N}, a p10/p90 would be interpolated "
                   "between the min, the median and the max, not a spread measured")
            return cls(n, float(min(values)), None, percentile(values, 0.5), None, float(max(values)),
                       {"p10": why, "p90": why})
        return cls(n, float(min(values)), percentile(values, 0.1), percentile(values, 0.5),
                   percentile(values, 0.9), float(max(values)))


#: The measures a :class:`SummaryRow` reports, with their :class:`DeviceRun` fields and labels.
_MEASURES: tuple[tuple[str, str], ...] = (
    ("memory_back", "memory back"),
    ("off_list", "off the list"),
    ("waitpid", "pid reaped"),
    ("first_clean", "clean"),
)
#: The OS-side phases (added later): printed after the others, and only where a cell has data for them.
_PHASE_MEASURES: tuple[tuple[str, str], ...] = (
    ("zombie", "leader zombie"),
    ("exited", "exited (pidfd)"),
    ("files_closed", "files closed"),
)
#: Every measure a record can be compared on (``nvmlcheck study compare --measure``), in phase order.
MEASURES: tuple[str, ...] = ("zombie", "exited", "files_closed", "off_list", "memory_back", "first_clean", "waitpid")


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One (size, ending) cell: signal → event times over every measured GPU-run that did not time out.

    ``n`` counts GPU-runs (a run on 8 GPUs adds 8); ``runs`` counts measured runs and ``timeouts`` those that timed
    out (left out of the statistics). ``resolution_ns``: the median sampling period of the cell's runs.
    ``sleep_ratio``: how many times longer ``sleep 3`` waits than the median time to clean (``None`` without data).
    """

    size_bytes: int
    ending: str
    n: int
    runs: int
    timeouts: int
    memory_back: Stats | None
    off_list: Stats | None
    waitpid: Stats | None
    first_clean: Stats | None
    resolution_ns: int
    sleep_ratio: float | None
    holder: str = "alloc"
    zombie: Stats | None = None
    exited: Stats | None = None
    files_closed: Stats | None = None
    pinned_bytes: int = 0
    importers: int = 0
    first: str | None = None
    role: str = "holder"
    #: What the cell's runs were measured under, kept apart like the cell's parts: the pin mode of pinned memory
    #: (``None`` without), the GPU model (``None``: not read) and the provenance (``real``, ``simulated``,
    #: ``unknown``: :attr:`RunRecord.provenance`).
    pin_mode: str | None = None
    gpu: str | None = None
    provenance: str = "unknown"

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (statistics in ns)."""
        return asdict(self)


#: A cell: size, ending, holder kind, pinned bytes, importers, IPC order, role, pin mode, GPU model, provenance.
_Key = tuple[int, str, str, int, int, str, str, str | None, str | None, str]


def summarize(records: Iterable[RunRecord]) -> list[SummaryRow]:
    """Statistics per cell (size, ending, holder kind, pinned bytes, importers, IPC order) and holder role (an IPC
    group's exporter and importers apart), in order of holder kind, size, pinned bytes, importers, order, ending and
    role, kinds, orders, endings and roles in order of first appearance; warm-ups left out. Runs of another pin mode,
    GPU model or provenance (simulated, real, unknown) are another row, never pooled into one."""
    cells: dict[_Key, list[RunRecord]] = {}
    for r in records:
        if not r.warmup:
            pin_mode = r.pin_mode if r.pinned_bytes else None
            for role, gpu in dict.fromkeys((d.role, d.name) for d in r.devices):
                cells.setdefault((r.size_bytes, r.ending, r.holder, r.pinned_bytes, r.importers, r.first or "", role,
                                  pin_mode, gpu, r.provenance), []).append(r)
    endings = list(dict.fromkeys(k[1] for k in cells))
    kinds = list(dict.fromkeys(k[2] for k in cells))
    orders = list(dict.fromkeys(k[5] for k in cells))
    roles = list(dict.fromkeys(k[6] for k in cells))
    every = _MEASURES + _PHASE_MEASURES
    rows = []
    for key in sorted(cells, key=lambda k: (kinds.index(k[2]), k[0], k[3], k[4], orders.index(k[5]),
                                            endings.index(k[1]), roles.index(k[6]), repr(k[7:]))):
        size, ending, kind, pinned, importers, first, role, pin_mode, gpu, provenance = key
        runs = cells[key]
        good = [r for r in runs if not r.timed_out]
        values: dict[str, list[int]] = {m: [] for m, _ in every}
        for r in good:
            for d in r.devices:
                if (d.role, d.name) != (role, gpu):
                    continue
                for m, _ in every:
                    v = getattr(d, f"{m}_ns")
                    if v is not None:
                        values[m].append(v)
        stats = {m: Stats.of(values[m]) for m, _ in every}
        clean = stats["first_clean"]
        rows.append(SummaryRow(
            size_bytes=size, ending=ending, runs=len(runs),
            n=sum(1 for r in good for d in r.devices if (d.role, d.name) == (role, gpu)),
            timeouts=len(runs) - len(good), memory_back=stats["memory_back"], off_list=stats["off_list"],
            waitpid=stats["waitpid"], first_clean=clean,
            resolution_ns=median_int([r.resolution_ns for r in runs]),
            sleep_ratio=SLEEP_REFERENCE_NS / clean.median if clean is not None and clean.median > 0 else None,
            holder=kind, zombie=stats["zombie"], exited=stats["exited"], files_closed=stats["files_closed"],
            pinned_bytes=pinned, importers=importers, first=first or None, role=role, pin_mode=pin_mode, gpu=gpu,
            provenance=provenance,
        ))
    return rows


def format_summary(rows: Sequence[SummaryRow]) -> str:
    """A compact table: per cell, signal → memory back / off the list / pid reaped / clean in ms (n, min, p10,
    median, p90, max), the sampling period, and how much longer ``sleep 3`` waits."""
    head = f"{'size':<10}{'ending':<7}{'signal ->':<14}{'n':>4}{'min':>9}{'p10':>9}{'median':>9}{'p90':>9}{'max':>9}"
    lines = ["times in ms from the signal; n = GPU-runs", head]
    kinds = {row.holder for row in rows}
    # Conditions that differ between rows are named on each row's head line (never two rows that look the same).
    varying = [k for k in ("pin_mode", "gpu", "provenance") if len({getattr(row, k) for row in rows}) > 1]
    few = False  # a p10/p90 left out ('-') for too few values: said once, below the table
    for row in rows:
        if kinds != {"alloc"} or varying:  # several holder kinds (or not the default one), or conditions: say which
            role = "" if row.role == "holder" else f": the {row.role}s"
            mode = f" by {row.pin_mode}" if "pin_mode" in varying and row.pin_mode else ""
            extra = "".join(f" [{_condition_words(k, getattr(row, k))}]" for k in varying if k != "pin_mode")
            lines.append(f"holder {row.holder}{cell_words(row.pinned_bytes, row.importers, row.first)}{mode}{role}"
                         f"{extra}")
        shown = _MEASURES + tuple(m for m in _PHASE_MEASURES if getattr(row, m[0]) is not None)
        for i, (m, label) in enumerate(shown):
            s: Stats | None = getattr(row, m)
            left = f"{format_bytes(row.size_bytes):<10}{row.ending:<7}" if i == 0 else " " * 17
            if s is None:
                lines.append(f"{left}{label:<14}{0:>4}{'-':>9}{'-':>9}{'-':>9}{'-':>9}{'-':>9}")
                continue
            nums = "".join(f"{'-':>9}" if v is None else f"{v / 1e6:>9.1f}"
                           for v in (s.min, s.p10, s.median, s.p90, s.max))
            lines.append(f"{left}{label:<14}{s.n:>4}{nums}")
            few = few or s.p10 is None
        ratio = f"sleep 3 waits {row.sleep_ratio:.1f}x the median time to clean" if row.sleep_ratio else "no clean run"
        timeouts = f"; {row.timeouts} of {row.runs} runs timed out" if row.timeouts else ""
        lines.append(f"{' ' * 17}{ratio} (sampling period {row.resolution_ns / 1e6:.3f} ms){timeouts}")
    if few:
        lines.append(f"p10/p90 '-': fewer than {SPREAD_MIN_N} values (not interpolated from so few)")
    return "\n".join(lines)


def _condition_words(part: str, value: str | None) -> str:
    """A row's condition in words, on its head line."""
    if part == "gpu":
        return value or "GPU model unknown"
    return {"simulated": "SIMULATED", "real": "real GPU"}.get(value or "", "provenance unknown")


def cell_words(pinned_bytes: int, importers: int, first: str | None) -> str:
    """The third edition's parts of a cell in words (empty for the others): ``", 8.0 GiB pinned"``,
    ``", 2 importers, exporter ended first"``."""
    out = ""
    if pinned_bytes:
        out += f", {format_bytes(pinned_bytes)} pinned"
    if importers:
        out += f", {importers} importer{'s' if importers > 1 else ''}"
    if first:
        out += f", {first} ended first"
    return out


def median_run(records: Iterable[RunRecord], size_bytes: int, ending: str) -> RunRecord | None:
    """The measured run of a cell whose first GPU's time to clean is the median (the one to plot), or ``None``."""
    runs = [r for r in records if not r.warmup and not r.timed_out and r.size_bytes == size_bytes
            and r.ending == ending and r.devices and r.devices[0].first_clean_ns is not None]
    if not runs:
        return None
    runs.sort(key=lambda r: r.devices[0].first_clean_ns or 0)
    return runs[(len(runs) - 1) // 2]


def median_int(values: Sequence[int]) -> int:
    """The median rounded to an int (0 for no values): poll intervals and costs."""
    return 0 if not values else round(percentile(values, 0.5))
