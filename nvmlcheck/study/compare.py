"""Do two reclamation studies differ? Per cell, the median difference with a bootstrap confidence interval
(``nvmlcheck study compare``).

>>> from nvmlcheck.study import load_records
>>> from nvmlcheck.study.compare import compare_records, format_comparison
>>> result = compare_records(load_records("a.jsonl"), load_records("b.jsonl"), seed=1)   # doctest: +SKIP
>>> print(format_comparison(result))                                                      # doctest: +SKIP

The method (cells, the percentile bootstrap, outliers, repeats to resolve a difference) is in
docs/study-records.md. Statistics in plain Python (no numpy): :mod:`random` and :mod:`statistics` only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from ..errors import ArgumentError
from .records import each_run_once
from .summary import MEASURES, cell_words, percentile

if TYPE_CHECKING:
    from .records import DeviceRun, RunRecord

__all__ = [
    "COMPARE_SCHEMA",
    "CELL_PARTS",
    "CONDITION_PARTS",
    "COMPARE_VERSION",
    "MAX_RESAMPLES",
    "MIN_N",
    "CellComparison",
    "Comparison",
    "Unmatched",
    "bootstrap_median_difference",
    "compare_records",
    "format_comparison",
    "outliers",
    "repeats_to_resolve",
]

#: The ``schema`` of the ``--json`` document of ``nvmlcheck study compare``.
COMPARE_SCHEMA = "nvmlcheck/study-compare"
#: Its version.
COMPARE_VERSION = 1
#: The bootstrap's resamples: fewer make a coarse interval; more take minutes per cell (a second per 200 000) for
#: no visible change, and a mistyped count would run for days.
MIN_RESAMPLES, MAX_RESAMPLES = 100, 1_000_000
#: Fewer values than this in a group: no verdict (the bootstrap of 2 or 3 values is not an interval to trust).
MIN_N = 4

#: A cell: (size_bytes, ending, holder kind, GPU index, pinned bytes, importers, IPC order ("" for none), holder
#: role); the last four were added by the third edition (issue 26), after the first four.
Cell = tuple[int, str, str, int, int, int, str, str]
#: The largest difference the repeats guidance may aim at (ns): 10**18, about 32 years, beyond any study.
MAX_RESOLVE_NS = 10**18
#: Holders signalled within this of a run's last signal belong to its last stage (``stage="last"``).
STAGE_TOLERANCE_NS = 10_000_000


@dataclass(frozen=True, slots=True)
class CellComparison:
    """One cell compared. Times in ns. ``differ``: ``True``/``False`` at ``level``, ``None`` when there are too few
    values (``why`` says so). ``outliers_a``/``outliers_b``: values beyond Tukey's fences, kept in every statistic.
    ``repeats_needed``: runs per group to resolve ``resolve_ns`` (``None`` when the spread is unknown)."""

    size_bytes: int
    ending: str
    holder: str
    device: int
    n_a: int
    n_b: int
    median_a: float | None
    median_b: float | None
    difference: float | None
    ci_low: float | None
    ci_high: float | None
    differ: bool | None
    why: str | None
    outliers_a: tuple[float, ...]
    outliers_b: tuple[float, ...]
    spread: float | None
    repeats_needed: int | None
    pinned_bytes: int = 0
    importers: int = 0
    first: str | None = None
    role: str = "holder"
    #: What the cell's runs were measured under (:data:`CONDITION_PARTS`: simulated or real, polling mode, backend,
    #: driver, GPU model, ...), the same on both sides; a part compared across is ``"*"``.
    conditions: dict[str, Any] = field(default_factory=dict, hash=False)
    #: The cell's GPU-runs whose run timed out, per side: left out of the values (their time is past the run
    #: timeout, not measured), so a side's median is of the runs that ended in time.
    timed_out_a: int = 0
    timed_out_b: int = 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = asdict(self)
        out["outliers_a"] = list(self.outliers_a)
        out["outliers_b"] = list(self.outliers_b)
        return out


@dataclass(frozen=True, slots=True)
class Comparison:
    """Every cell compared, and the cells only one side has."""

    measure: str
    level: float
    resamples: int
    seed: int
    resolve_ns: int
    cells: tuple[CellComparison, ...]
    only_a: tuple[Cell, ...]
    only_b: tuple[Cell, ...]
    across: tuple[str, ...] = ()
    stage: str = "all"
    #: Cells both sides have, with runs measured under conditions the other side has none of (``differ_in``): those
    #: runs not compared (``across`` those parts pools them).
    unmatched: tuple[Unmatched, ...] = ()
    #: What the reader must know, in words: parts compared across where a side pools several values, simulated runs.
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The ``nvmlcheck/study-compare`` document (version 1)."""
        return {
            "schema": COMPARE_SCHEMA, "version": COMPARE_VERSION, "measure": self.measure, "level": self.level,
            "resamples": self.resamples, "seed": self.seed, "resolve_ns": self.resolve_ns, "across": list(self.across),
            "stage": self.stage,
            "cells": [c.to_json() for c in self.cells],
            "only_a": [list(c) for c in self.only_a], "only_b": [list(c) for c in self.only_b],
            "unmatched": [u.to_json() for u in self.unmatched], "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A cell both sides have, with runs not compared: the conditions of A's runs and of B's that have no counterpart
    on the other side (one dict per group of runs; a side may have none) and the parts in which the cell's runs
    differ."""

    cell: Cell
    a: tuple[dict[str, Any], ...]
    b: tuple[dict[str, Any], ...]
    differ_in: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"cell": list(self.cell), "a": [dict(c) for c in self.a], "b": [dict(c) for c in self.b],
                "differ_in": list(self.differ_in)}


def _median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


def bootstrap_median_difference(
    a: Sequence[float], b: Sequence[float], *, level: float = 0.95, resamples: int = 2000, rng: random.Random
) -> tuple[float, float]:
    """The percentile-bootstrap interval of ``median(b) - median(a)`` at ``level``."""
    if not a or not b:
        raise ArgumentError("both groups need values")
    diffs = []
    for _ in range(resamples):
        ra = rng.choices(a, k=len(a))
        rb = rng.choices(b, k=len(b))
        diffs.append(_median(rb) - _median(ra))
    tail = (1.0 - level) / 2.0
    return percentile(diffs, tail), percentile(diffs, 1.0 - tail)


def outliers(values: Sequence[float]) -> tuple[float, ...]:
    """The values beyond 1.5 IQR below the first or above the third quartile (sorted); none for fewer than 4."""
    if len(values) < 4:
        return ()
    q1, q3 = percentile(values, 0.25), percentile(values, 0.75)
    lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    return tuple(sorted(v for v in values if v < lo or v > hi))


def _iqr_sigma(values: Sequence[float]) -> float | None:
    """The robust spread IQR/1.349; ``None`` for fewer than :data:`MIN_N` values, whose quartiles would be points
    interpolated between the few values there are (with 2: a fixed fraction of their range), not a spread measured."""
    if len(values) < MIN_N:
        return None
    return (percentile(values, 0.75) - percentile(values, 0.25)) / 1.349


def repeats_to_resolve(a: Sequence[float], b: Sequence[float], *, resolve_ns: float, level: float) -> tuple[
        float | None, int | None]:
    """The pooled robust spread sigma (ns) and the runs per group to resolve ``resolve_ns`` at ``level`` (see
    docs/study-records.md); ``(None, None)`` with fewer than :data:`MIN_N` values in a group."""
    sa, sb = _iqr_sigma(a), _iqr_sigma(b)
    if sa is None or sb is None:
        return None, None
    sigma = math.sqrt((sa * sa + sb * sb) / 2.0)
    z = NormalDist().inv_cdf((1.0 + level) / 2.0)
    n = 2.0 * (z * 1.2533 * sigma / resolve_ns) ** 2
    return sigma, max(MIN_N, math.ceil(n))


#: The parts of a cell that ``across`` may leave out of the matching.
CELL_PARTS: tuple[str, ...] = ("size", "ending", "holder", "device", "pinned", "importers", "first", "role")
#: What a run was measured under, beside its cell, that changes its times: whether it was simulated (``real``,
#: ``simulated``, ``unknown``), the polling mode, the backend, the driver version, the GPU model, the holder's count,
#: holders per GPU, concurrency, the pin mode and the gap between stages. Runs that differ in one are never pooled
#: into one cell nor compared with each other unless ``across`` names it (``holder`` takes ``count`` with it: each
#: kind counts something else).
CONDITION_PARTS: tuple[str, ...] = ("simulated", "mode", "backend", "driver", "gpu", "count", "per_gpu",
                                    "concurrent", "pin_mode", "stage_gap")
#: The value shown for a part compared across.
ANY = "*"

_Conditions = tuple[tuple[str, Any], ...]


#: Conditions that only some runs have (``None``: not applicable): a pin mode only with pinned memory, a stage gap
#: only with two stages. A run without one is no other population than a run with one: compared across the part that
#: gives it (``pinned``, ``importers``, ``holder``), 0 pinned GiB against 8 is a comparison, not a mismatch.
NOT_APPLICABLE: tuple[str, ...] = ("pin_mode", "stage_gap")


def conditions_of(r: RunRecord, d: DeviceRun) -> dict[str, Any]:
    """The :data:`CONDITION_PARTS` of one GPU-run. A run with no pinned memory has no pin mode, whatever its record
    says (the third edition's pinned holder of 0 bytes records ``"alloc"``); one of one stage has no stage gap."""
    return {"simulated": r.provenance, "mode": r.mode, "backend": r.backend, "driver": r.driver, "gpu": d.name,
            "count": r.holder_count, "per_gpu": r.per_gpu, "concurrent": r.concurrent,
            "pin_mode": r.pin_mode if r.pinned_bytes else None, "stage_gap": r.stage_gap_s if r.first else None}


def _pairs(ca: dict[tuple[Cell, _Conditions], list[float]], cb: dict[tuple[Cell, _Conditions], list[float]]
           ) -> list[tuple[Cell, _Conditions, _Conditions, _Conditions]]:
    """The groups of runs compared: per cell both sides have, A's and B's groups of the same conditions; then, of
    those left, groups that differ only where one side's condition does not apply (:data:`NOT_APPLICABLE`), with the
    conditions of the side that has them. Each pair: cell, A's and B's conditions, the conditions shown."""
    out: list[tuple[Cell, _Conditions, _Conditions, _Conditions]] = []
    for cell in {k for k, _ in ca} & {k for k, _ in cb}:
        ga = [c for k, c in ca if k == cell]
        gb = [c for k, c in cb if k == cell]
        left_a, left_b = [c for c in ga if c not in gb], [c for c in gb if c not in ga]
        out.extend((cell, c, c, c) for c in ga if c in gb)
        for x in left_a:
            for y in left_b:
                if all(u == v or (k in NOT_APPLICABLE and (u is None or v is None))
                       for (k, u), (_, v) in zip(x, y, strict=True)):
                    shown = tuple((k, v if u is None else u) for (k, u), (_, v) in zip(x, y, strict=True))
                    out.append((cell, x, y, shown))
    return out


def _cells(records: Iterable[RunRecord], measure: str, across: Sequence[str] = (), stage: str = "all",
           missing: dict[tuple[Cell, _Conditions], dict[str, int]] | None = None,
           ) -> dict[tuple[Cell, _Conditions], list[float]]:
    """Each cell's values of ``measure``; ``missing`` (when given) gets, per cell, why GPU-runs had none (the
    record's ``unknown`` reason, or that it recorded none) and how many."""
    out: dict[tuple[Cell, _Conditions], list[float]] = {}
    for r in records:
        if r.warmup:
            continue
        for d, v in _values(r, measure, stage):
            # A part compared across is left out of the key: -1 / "*" stand for "any".
            key = (-1 if "size" in across else r.size_bytes, "*" if "ending" in across else r.ending,
                   "*" if "holder" in across else r.holder, -1 if "device" in across else d.index,
                   -1 if "pinned" in across else r.pinned_bytes, -1 if "importers" in across else r.importers,
                   "*" if "first" in across else r.first or "", "*" if "role" in across else d.role)
            cond = tuple((k, ANY if k in across else x) for k, x in conditions_of(r, d).items())
            out.setdefault((key, cond), [])
            if v is not None and not r.timed_out:
                out[(key, cond)].append(float(v))
            elif missing is not None:
                why = _TIMED_OUT if r.timed_out else (d.unknown or {}).get(measure) or "not recorded"
                reasons = missing.setdefault((key, cond), {})
                reasons[why] = reasons.get(why, 0) + 1
    return out


def _pooled(records: Iterable[RunRecord], side: str, across: Sequence[str]) -> list[str]:
    """Notes for the condition parts compared across that a side pools: several values in one side's runs."""
    seen: dict[str, dict[Any, int]] = {}
    for r in records:
        if r.warmup or r.timed_out:
            continue
        for d in r.devices:
            for k, x in conditions_of(r, d).items():
                if k in across:
                    seen.setdefault(k, {})
                    seen[k][x] = seen[k].get(x, 0) + 1
    return [f"{side} pools runs of several {k} values ({', '.join(f'{_word(x, k)}: {n}' for x, n in values.items())} "
            "GPU-runs): compared across it, as asked" for k, values in seen.items() if len(values) > 1]


def _word(value: Any, part: str = "") -> str:
    """A condition's value in words: ``None`` is "none" where the condition does not apply, else "unknown"."""
    return ("none" if part in NOT_APPLICABLE else "unknown") if value is None else str(value)


def _values(r: RunRecord, measure: str, stage: str) -> list[tuple[DeviceRun, int | None]]:
    """Each GPU-run's value of ``measure``; with ``stage="last"``, one value per GPU: the latest of its last-stage
    holders (the time until all of them got there), so K importers count once, not K times."""
    if stage != "last":
        return [(d, getattr(d, f"{measure}_ns")) for d in r.devices]
    last = max((d.signal_ns for d in r.devices), default=0) - STAGE_TOLERANCE_NS
    by_gpu: dict[int, list[DeviceRun]] = {}
    for d in r.devices:
        if d.signal_ns >= last:
            by_gpu.setdefault(d.index, []).append(d)
    out: list[tuple[DeviceRun, int | None]] = []
    for group in by_gpu.values():
        known = [v for d in group if (v := getattr(d, f"{measure}_ns")) is not None]
        value = max(known) if len(known) == len(group) else None  # one holder unseen: the GPU's time is unknown
        roles = {d.role for d in group}
        first = group[0] if len(roles) == 1 else replace(group[0], role="*")
        out.append((first, value))
    return out


#: Why a GPU-run of a timed-out run has no value (``missing`` of :func:`_cells`).
_TIMED_OUT = "its run timed out"


def _too_few(n_a: int, n_b: int, measure: str, gone_a: dict[str, int], gone_b: dict[str, int]) -> str:
    """Why a cell gets no verdict: too few values, and why the GPU-runs without one have none (a phase not
    watched, not seen: the record's reason), so that 0 values never reads as 0 runs."""
    return f"too few values to tell (A {n_a}, B {n_b}; at least {MIN_N} each)" + "".join(
        f"; {side}: {n} GPU-run{'s' if n != 1 else ''} with no {measure} time ({reason})"
        for side, gone in (("A", gone_a), ("B", gone_b)) for reason, n in gone.items()
        if reason != _TIMED_OUT)  # said on a line of their own (timed_out_a/b), with what it does to the medians


_TWICE = "a run counted twice narrows the interval as if it had been measured twice"


def compare_records(
    a: Iterable[RunRecord],
    b: Iterable[RunRecord],
    *,
    measure: str = "memory_back",
    level: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    resolve_ns: int = 5_000_000,
    across: Sequence[str] = (),
    stage: str = "all",
) -> Comparison:
    """Compare study A with study B cell by cell (the method: docs/study-records.md). ``measure``: one of
    :data:`nvmlcheck.study.MEASURES`. ``across``: parts of the cell (:data:`CELL_PARTS`) left out of the matching,
    to compare conditions that differ in them, for example ``("ending",)`` for a file of ``exit`` runs against one
    of ``free`` runs (the values of every ending left in a side's cell are pooled, so give each side one).
    ``stage``: ``"all"`` holders, or only those of each run's ``"last"`` stage (an IPC group's side ended last:
    with ``across=("first", "role")`` it compares the time from the last signal whichever side that was).

    Runs measured under different conditions (:data:`CONDITION_PARTS`: simulated or real, polling mode, backend,
    driver, GPU model, ...) are kept apart: within a side they make separate cells, and a cell whose conditions differ
    between A and B is not compared but listed in ``unmatched`` with the parts that differ, unless ``across`` names
    them (then ``notes`` says where a side pools several values). Simulated runs are thus never compared with real
    ones, nor with records that do not say (``across=("simulated",)`` does it anyway, with a note).
    ``ValueError`` for a bad measure, level, number of resamples, part or stage."""
    parts = CELL_PARTS + CONDITION_PARTS
    bad = [p for p in across if p not in parts]
    if bad:
        raise ArgumentError(f"cannot compare across {', '.join(bad)}: one of {', '.join(parts)}")
    if measure not in MEASURES:
        raise ArgumentError(f"unknown measure {measure!r}: one of {', '.join(MEASURES)}")
    if not 0.0 < level < 1.0:
        raise ArgumentError(f"level must be within (0, 1), got {level!r}")
    if not MIN_RESAMPLES <= resamples <= MAX_RESAMPLES:
        raise ArgumentError(f"resamples must be within {MIN_RESAMPLES}..{MAX_RESAMPLES:_}, got {resamples}")
    if not (isinstance(resolve_ns, int | float) and math.isfinite(resolve_ns) and 0 < resolve_ns <= MAX_RESOLVE_NS):
        # NaN passed "<= 0" and failed later in math.ceil; infinity gave the least runs whatever the spread
        raise ArgumentError(f"resolve_ns must be a finite number of ns within (0, {MAX_RESOLVE_NS:.0e}], got "
                            f"{resolve_ns!r}")
    if stage not in ("all", "last"):
        raise ArgumentError(f"stage must be 'all' or 'last', got {stage!r}")
    a, b = each_run_once(a, "A holds run", _TWICE), each_run_once(b, "B holds run", _TWICE)
    # A holder's count means something else for each kind: compared across kinds, their counts are part of it.
    pooled = (*across, "count") if "holder" in across and "count" not in across else tuple(across)
    gone: tuple[dict[tuple[Cell, _Conditions], dict[str, int]], ...] = ({}, {})  # per side: why GPU-runs had none
    ca, cb = _cells(a, measure, pooled, stage, gone[0]), _cells(b, measure, pooled, stage, gone[1])
    rng = random.Random(seed)
    cells = []
    pairs = _pairs(ca, cb)
    for cell, cond_a, cond_b, cond in sorted(pairs, key=lambda p: (p[0][2], p[0][0], p[0][4], p[0][5], p[0][6],
                                                                   p[0][1], p[0][3], p[0][7], repr(p[3]))):
        va, vb = ca[(cell, cond_a)], cb[(cell, cond_b)]
        size, ending, holder, device, pinned, importers, first, role = cell
        med_a, med_b = (_median(va) if va else None), (_median(vb) if vb else None)
        diff = None if med_a is None or med_b is None else med_b - med_a
        lo = hi = None
        differ: bool | None = None
        why: str | None = None
        if len(va) < MIN_N or len(vb) < MIN_N:
            why = _too_few(len(va), len(vb), measure, gone[0].get((cell, cond_a), {}), gone[1].get((cell, cond_b), {}))
        else:
            lo, hi = bootstrap_median_difference(va, vb, level=level, resamples=resamples, rng=rng)
            differ = lo > 0 or hi < 0
        sigma, need = repeats_to_resolve(va, vb, resolve_ns=resolve_ns, level=level)
        cells.append(CellComparison(
            size_bytes=size, ending=ending, holder=holder, device=device, n_a=len(va), n_b=len(vb),
            median_a=med_a, median_b=med_b, difference=diff, ci_low=lo, ci_high=hi, differ=differ, why=why,
            outliers_a=outliers(va), outliers_b=outliers(vb), spread=sigma, repeats_needed=need,
            pinned_bytes=pinned, importers=importers, first=first or None, role=role, conditions=dict(cond),
            timed_out_a=gone[0].get((cell, cond_a), {}).get(_TIMED_OUT, 0),
            timed_out_b=gone[1].get((cell, cond_b), {}).get(_TIMED_OUT, 0),
        ))
    base_a, base_b = {k for k, _ in ca}, {k for k, _ in cb}
    paired_a = {(p[0], p[1]) for p in pairs}
    paired_b = {(p[0], p[2]) for p in pairs}
    unmatched = []
    for cell in sorted(base_a & base_b):
        ga = [c for k, c in sorted(ca, key=repr) if k == cell]
        gb = [c for k, c in sorted(cb, key=repr) if k == cell]
        alone_a = [c for c in ga if (cell, c) not in paired_a]
        alone_b = [c for c in gb if (cell, c) not in paired_b]
        if not alone_a and not alone_b:
            continue  # every group of runs of this cell was compared
        every = [dict(c) for c in ga + gb]
        differ_in = tuple(p for p in CONDITION_PARTS if len({repr(g[p]) for g in every}) > 1)
        unmatched.append(Unmatched(cell, tuple(dict(c) for c in alone_a), tuple(dict(c) for c in alone_b),
                                   differ_in))
    notes = (_shared_runs(a, b) + _pooled(a, "A", pooled) + _pooled(b, "B", pooled) + _simulated_notes(a, b, cells)
             + _unknown_notes(a, b, unmatched))
    return Comparison(
        measure=measure, level=level, resamples=resamples, seed=seed, resolve_ns=resolve_ns, cells=tuple(cells),
        across=tuple(across), stage=stage,
        only_a=tuple(sorted(base_a - base_b)), only_b=tuple(sorted(base_b - base_a)),
        unmatched=tuple(unmatched), notes=tuple(notes),
    )


def _shared_runs(a: Sequence[RunRecord], b: Sequence[RunRecord]) -> list[str]:
    shared = {r.to_line() for r in a if not r.warmup} & {r.to_line() for r in b if not r.warmup}
    return [f"A and B share {len(shared)} measured runs: they are not independent samples, which the interval "
            "assumes"] if shared else []


def _simulated_notes(a: Sequence[RunRecord], b: Sequence[RunRecord],
                     cells: Sequence[CellComparison]) -> list[str]:
    """Say so when simulated runs were compared (with each other, or with real ones across ``simulated``)."""
    kinds = {c.conditions.get("simulated") for c in cells}
    if not kinds & {"simulated", ANY}:
        return []
    what = sorted({r.simulation for r in (*a, *b) if r.simulated and r.simulation})
    whence = f" ({'; '.join(what)})" if what else ""
    if kinds == {"simulated"}:
        return [f"SIMULATED: every run compared ran on the stub{whence}: the stub's timings, for testing the "
                "instrument, not a GPU's"]
    return [f"SIMULATED runs{whence} are compared with runs that are not (across simulated, as asked): the stub's "
            "timings are not a GPU's"]


def _unknown_notes(a: Sequence[RunRecord], b: Sequence[RunRecord], unmatched: Sequence[Unmatched]) -> list[str]:
    """Why a side's runs are of unknown provenance, where that kept them from being compared: which nvmlcheck wrote
    them, and the fix."""
    if not any("simulated" in u.differ_in for u in unmatched):
        return []
    out = []
    for side, records in (("A", a), ("B", b)):
        unknown = [r for r in records if r.provenance == "unknown" and not r.warmup]
        if unknown:
            writers = ", ".join(sorted({r.nvmlcheck for r in unknown}))
            out.append(f"{side}'s {len(unknown)} measured runs do not say whether they were simulated (record version "
                       f"1 written by nvmlcheck {writers}, before records said so, by holders that did not report the "
                       "CUDA holder's steps: first-edition records): if they are of a real GPU, --across simulated "
                       "compares them with real runs")
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


def _parts(pinned: int, importers: int, first: str | None) -> str:
    """The third edition's cell parts in words; ``*`` where compared across."""
    out = ", * pinned" if pinned < 0 else ""
    out += ", * importers" if importers < 0 else ""
    out += ", either side first" if first == "*" else ""
    return out + cell_words(max(pinned, 0), max(importers, 0), None if first == "*" else first)


def format_comparison(c: Comparison) -> str:
    """A plain-text report: one block per cell with the verdict in words; the conditions the cells were measured
    under, the cells not compared because their runs' conditions differ, and the notes."""
    pct = f"{c.level * 100:g}%"
    lines = [f"B - A, {c.measure.replace('_', ' ')} (signal -> event), medians in ms; {pct} bootstrap interval "
             f"({c.resamples} resamples, seed {c.seed}); outliers (beyond 1.5 IQR) kept and listed"]
    if c.across:
        lines.append(f"compared across {', '.join(c.across)} (shown as *)")
    if c.stage == "last":
        lines.append("only the holders of each run's last stage (times from the last signal)")
    shared, varying = _shared_conditions(c.cells)
    if shared:
        lines.append(f"measured under: {_condition_words(shared)}")
    for cell in c.cells:
        lines.extend(_cell_lines(c, cell, varying, pct))
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        for key in keys:
            lines.append(f"only in {side}: {_cell_words(key)}")
    for u in c.unmatched:
        sides = [f"{side}'s runs ({_groups_words(groups, u.differ_in)})"
                 for side, groups in (("A", u.a), ("B", u.b)) if groups]
        lines.append(f"not compared: {_cell_words(u.cell)}: {' and '.join(sides)} have no counterpart on the other "
                     f"side (the runs differ in {', '.join(u.differ_in)}); --across {','.join(u.differ_in)} pools them")
    lines.extend(f"note: {n}" for n in c.notes)
    if not c.cells:
        lines.append("no cell in common: nothing to compare")
    return "\n".join(lines)


def _cell_lines(c: Comparison, cell: CellComparison, varying: Sequence[str], pct: str) -> list[str]:
    size = "*" if cell.size_bytes < 0 else format_bytes(cell.size_bytes) if cell.size_bytes else "no allocation"
    gpu = "*" if cell.device < 0 else str(cell.device)
    role = "" if cell.role == "holder" else f" ({'any role' if cell.role == '*' else cell.role + 's'})"
    parts = _parts(cell.pinned_bytes, cell.importers, cell.first)
    head = f"{cell.holder} {size}{parts} {cell.ending}{role} GPU {gpu}"
    if varying:
        head += f" [{_condition_words({k: cell.conditions.get(k) for k in varying})}]"
    lines = [f"{head}: A {_ms(cell.median_a)} (n {cell.n_a}), B {_ms(cell.median_b)} (n {cell.n_b})"]
    if cell.differ is None:
        lines.append(f"  difference {_ms(cell.difference)} ms; {cell.why}")
    else:
        verdict = (f"they DIFFER at {pct}" if cell.differ
                   else f"no difference shown at {pct} (the interval contains 0)")
        lines.append(f"  difference {_ms(cell.difference)} ms, interval [{_ms(cell.ci_low)}, "
                     f"{_ms(cell.ci_high)}]: {verdict}")
    if cell.timed_out_a or cell.timed_out_b:
        lines.append(f"  timed out: A {cell.timed_out_a}, B {cell.timed_out_b} GPU-runs, left out (their time is past "
                     "the run timeout, not measured): each median is of the runs that ended in time, so a side with "
                     "more of them is slower than it reads")
    for side, values in (("A", cell.outliers_a), ("B", cell.outliers_b)):
        if values:
            lines.append(f"  outliers in {side}: {', '.join(_ms(v) for v in values)} ms")
    if cell.repeats_needed is not None and cell.spread is not None:
        lines.append(f"  spread (IQR/1.349) {_ms(cell.spread)} ms: about {cell.repeats_needed} runs per side "
                     f"to resolve {c.resolve_ns / 1e6:g} ms")
    elif min(cell.n_a, cell.n_b) < MIN_N:
        lines.append(f"  spread not estimated: fewer than {MIN_N} values on a side (no quartiles from so few), so no"
                     f" guess of the runs to resolve {c.resolve_ns / 1e6:g} ms")
    return lines


def _shared_conditions(cells: Sequence[CellComparison]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The conditions every cell has alike, and the parts that vary between cells."""
    shared: dict[str, Any] = {}
    varying = []
    for p in CONDITION_PARTS:
        values = {repr(c.conditions.get(p)) for c in cells}
        if len(values) == 1 and cells:
            shared[p] = cells[0].conditions.get(p)
        elif len(values) > 1:
            varying.append(p)
    return shared, tuple(varying)


_PROVENANCE_WORDS = {"real": "real GPUs", "simulated": "SIMULATED: the stub",
                     "unknown": "provenance unknown: records that do not say whether simulated",
                     ANY: "simulated or not (*)"}


def _condition_words(conditions: dict[str, Any]) -> str:
    """Conditions in words; a part that does not apply (no pin mode, one stage) is left out."""
    out = []
    for p, v in conditions.items():
        if p == "simulated":
            out.append(_PROVENANCE_WORDS.get(v, str(v)))
        elif v is not None or p in ("driver", "gpu"):
            out.append(f"{p.replace('_', ' ')} {_word(v)}")
    return ", ".join(out)


def _groups_words(groups: Sequence[dict[str, Any]], parts: Sequence[str]) -> str:
    return " / ".join(dict.fromkeys(_condition_words({p: g.get(p) for p in parts}) for g in groups))


def _cell_words(key: Cell) -> str:
    size_text = "*" if key[0] < 0 else format_bytes(key[0])
    parts = _parts(key[4], key[5], key[6] or None) + ("" if key[7] == "holder" else f" ({key[7]}s)")
    return f"{key[2]} {size_text}{parts} {key[1]} GPU {'*' if key[3] < 0 else key[3]}"
