"""The reclaim-time model fitted to study records (``nvmlcheck study fit``): :func:`fit` returns a
:class:`~nvmlcheck.reclaim_model.ReclaimModel`, :func:`fit_report` also what was fitted, what was kept and how well
it fits each cell; :func:`format_fit` prints it with the ``register(...)`` call that puts it in the per-driver table.

Each run becomes one point: the time from its *last* signal until every GPU's memory is back, against what was torn
down after that signal (contexts, device GiB, pinned host GiB, IPC importers: the terms of
:func:`nvmlcheck.reclaim_model.terms`). Each cell's median is fitted by weighted least squares (weight: its runs), in
plain Python; a coefficient the data cannot tell apart (no run varies it) keeps the prior model's value, and one fitted
below 0 is set to 0. The error is the largest absolute residual of any run of a fitted cell. One fit is one
population: runs that differ in what the model has no term for (:data:`FIT_CONDITIONS`: GPU model, backend, polling
mode, ending, pin mode, a teardown of its own) are refused unless ``across`` names the part, and are never one cell.
The method: docs/reclaim-study.md ("The model").
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .._units import format_bytes
from ..errors import ArgumentError
from ..reclaim_model import COEFFICIENTS, ReclaimModel, model_for, terms
from .records import RunRecord, each_run_once
from .summary import cell_words, percentile

__all__ = ["FIT_CONDITIONS", "FIT_ENDINGS", "FIT_KINDS", "CellFit", "FitPoint", "FitResult", "MixedConditions",
           "fit", "fit_conditions", "fit_point", "fit_report", "format_fit", "model_code"]

#: Holder kinds fitted by default: those whose teardown the model's terms describe. The others (``streams``: work in
#: flight; ``destroy``: the holder tears down itself; ``managed``, ``mps``, ``nccl``: their own teardown) are shown
#: against the fitted model, not fitted.
FIT_KINDS: tuple[str, ...] = ("alloc", "chunks", "context", "contexts", "pinned", "ipc")
#: Endings a fit takes (``free`` frees in the holder first: not the driver's teardown alone), in the order of
#: preference when the records have several and none is named: each ending is its own population, so by default the
#: first of these the records have is fitted and the others are shown against the model (``study reclaim`` ends its
#: holders by KILL and TERM unless told otherwise: its own output fits as it is).
FIT_ENDINGS: tuple[str, ...] = ("KILL", "TERM", "exit")
#: What a run was measured under that the model has no term for, and that changes its times: the GPU model, the
#: backend, the polling mode, the ending (SIGKILL, SIGTERM, exit), the pin mode of pinned host memory, and the holder's
#: teardown (``model``: a kind the model's terms count, :data:`FIT_KINDS`; else the kind: ``mps``, ``managed``, ...).
#: Runs that differ in one are different populations: :func:`fit_report` refuses to fit them as one unless ``across``
#: names the part, and never pools them into one cell.
FIT_CONDITIONS: tuple[str, ...] = ("gpu", "backend", "mode", "ending", "pin_mode", "holder")
#: Conditions that do not apply to every run (``None``: no pinned memory, no pin mode): such a run is no other
#: population than one that has a value.
_NOT_APPLICABLE = ("pin_mode",)
#: The value of a condition pooled with ``across``.
ANY = "*"
#: Holders signalled within this of the last signal belong to the last stage.
STAGE_TOLERANCE_NS = 10_000_000
_ZEROED = "fitted below 0"
#: A driver version named for a fit: a branch, then up to three dotted numbers of up to 6 digits.
_VERSION = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}")


@dataclass(frozen=True, slots=True)
class FitPoint:
    """One run as the model sees it: what was torn down after its last signal, and how long until every GPU's
    memory was back (``memory_back_ns``, from that signal). ``cell`` labels its condition."""

    contexts: int
    device_bytes: int
    pinned_bytes: int
    importers: int
    memory_back_ns: int
    cell: str
    kind: str
    ending: str
    #: The run's :data:`FIT_CONDITIONS` (:func:`fit_conditions`).
    conditions: tuple[tuple[str, str | None], ...] = ()

    @property
    def features(self) -> tuple[int, int, int, int]:
        """``(contexts, device_bytes, pinned_bytes, importers)``."""
        return (self.contexts, self.device_bytes, self.pinned_bytes, self.importers)


@dataclass(frozen=True, slots=True)
class CellFit:
    """One cell against the fitted model: runs ``n``, median measured and predicted time (ns), the median and the
    largest absolute residual, and whether the cell was fitted (``in_fit``)."""

    cell: str
    kind: str
    n: int
    measured_ns: float
    predicted_ns: float
    residual_ns: float
    residual_max_ns: float
    in_fit: bool


@dataclass(frozen=True, slots=True)
class FitResult:
    """The fitted ``model``; the coefficients ``fitted``; those ``kept`` from ``prior`` (coefficient → why); the runs
    fitted (``n``) and the residuals of those runs (largest and 95th percentile of the absolute values, ns); every
    cell against the model; the runs left out, by reason."""

    model: ReclaimModel
    prior: ReclaimModel
    fitted: tuple[str, ...]
    kept: dict[str, str]
    n: int
    residual_max_ns: float
    residual_p95_ns: float
    cells: tuple[CellFit, ...]
    excluded: dict[str, int] = field(default_factory=dict)
    #: The runs fitted, by whether they were simulated: ``real``, ``simulated`` (with ``include_simulated``),
    #: ``unknown`` (records that do not say: never counted as real).
    provenance: dict[str, int] = field(default_factory=dict)
    #: What the fit chose for the caller, in words (an ending picked from several when none was named).
    notes: tuple[str, ...] = ()
    #: What every run fitted was measured under (:data:`FIT_CONDITIONS` and ``driver``, the records' version; ``None``:
    #: unknown or, for ``pin_mode``, no pinned memory; ``"*"``: pooled), and the parts pooled: part → value → runs
    #: (``"none"`` for no value), with ``across``, and ``driver`` when a driver named for the fit pools several.
    conditions: dict[str, str | None] = field(default_factory=dict)
    pooled: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``nvmlcheck/study-fit`` document's body)."""
        from dataclasses import asdict

        return {"model": asdict(self.model), "prior": asdict(self.prior), "fitted": list(self.fitted),
                "kept": dict(self.kept), "n": self.n, "residual_max_ns": self.residual_max_ns,
                "residual_p95_ns": self.residual_p95_ns, "cells": [asdict(c) for c in self.cells],
                "excluded": dict(self.excluded), "provenance": dict(self.provenance),
                "conditions": dict(self.conditions), "pooled": {k: dict(v) for k, v in self.pooled.items()},
                "notes": list(self.notes)}


class MixedConditions(ArgumentError):
    """The runs to fit were measured under different conditions (:data:`FIT_CONDITIONS`) that ``across`` does not
    name: ``groups`` maps each part that differs to its values and their runs."""

    def __init__(self, message: str, groups: dict[str, dict[str, int]]) -> None:
        super().__init__(message)
        self.groups = groups


def _label(r: RunRecord, contexts: int) -> str:
    size = format_bytes(r.size_bytes) if r.size_bytes else "no allocation"
    gpus = len({d.index for d in r.devices})
    many = f" x{r.per_gpu} per GPU" if r.per_gpu > 1 else ""
    count = f" x{r.holder_count}" if r.holder == "contexts" else ""
    where = f" on {gpus} GPUs" if gpus > 1 else ""
    return f"{r.holder}{count} {size}{cell_words(r.pinned_bytes, r.importers, r.first)}{many} {r.ending}{where}"


def fit_point(r: RunRecord) -> FitPoint | None:
    """The point of one measured run (``None`` for a warm-up, a timed-out run, or one whose memory was not seen
    back on every GPU)."""
    devs = r.devices
    if r.warmup or r.timed_out or not devs:
        return None
    backs: dict[int, int] = {}
    for d in devs:
        if d.memory_back_ns is None:
            return None
        backs[d.index] = max(backs.get(d.index, 0), d.signal_ns + d.memory_back_ns)
    last_signal = max(d.signal_ns for d in devs)
    last = [d for d in devs if d.signal_ns >= last_signal - STAGE_TOLERANCE_NS]
    own = [d for d in devs if d.role != "importer"]
    per_holder = r.holder_count if r.holder == "contexts" else 1
    contexts = per_holder * sum(1 for d in last if d.role != "importer")
    importers = sum(1 for d in last if d.role == "importer")
    device = r.size_bytes * len(own)
    if len(last) < len(devs):  # two stages: is the allocation still held when the last one begins?
        still = [d.held_at_signal_bytes for d in last]
        if not all(h is not None and h >= r.size_bytes // 2 for h in still):
            device = 0
    pinned = r.pinned_bytes * sum(1 for d in last if d.role != "importer")
    return FitPoint(contexts, device, pinned, importers, max(backs.values()) - last_signal, _label(r, contexts),
                    r.holder, r.ending, tuple(fit_conditions(r).items()))


def fit_conditions(r: RunRecord) -> dict[str, str | None]:
    """The :data:`FIT_CONDITIONS` of one run: the GPU models of its GPUs (``" + "``-joined; ``None`` when no name
    was read), backend, polling mode, ending, pin mode (``None`` without pinned memory: a pinned holder of 0 bytes
    pins nothing, whatever its mode) and teardown (``"model"`` for :data:`FIT_KINDS`, else the kind); and the driver
    version (its branch is checked apart) and provenance (``real``, ``simulated``, ``unknown``: counted apart, in
    ``provenance``): runs of two versions or provenances are never one cell."""
    names = sorted({d.name for d in r.devices if d.name})
    return {"gpu": " + ".join(names) or None, "backend": r.backend, "mode": r.mode, "ending": r.ending,
            "pin_mode": r.pin_mode if r.pinned_bytes else None,
            "holder": "model" if r.holder in FIT_KINDS else r.holder, "driver": r.driver, "simulated": r.provenance}


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``a x = b`` by Gaussian elimination with partial pivoting; ``None`` when ``a`` is (numerically) singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    scale = max((abs(v) for row in a for v in row), default=0.0) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-9 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _least_squares(rows: Sequence[Sequence[float]], y: Sequence[float], w: Sequence[float],
                   cols: Sequence[int]) -> list[float] | None:
    """Weighted least squares of ``y`` on the columns ``cols`` of ``rows`` (normal equations)."""
    k = len(cols)
    ata = [[sum(wi * row[cols[i]] * row[cols[j]] for row, wi in zip(rows, w, strict=True)) for j in range(k)]
           for i in range(k)]
    aty = [sum(wi * row[cols[i]] * yi for row, yi, wi in zip(rows, y, w, strict=True)) for i in range(k)]
    return _solve(ata, aty)


def _branch(records: Sequence[RunRecord], driver: str | None) -> tuple[str, str]:
    if driver is not None:
        return driver.split(".", 1)[0], driver
    if not records:
        raise ArgumentError("no records to fit")
    versions = sorted({r.driver for r in records if r.driver})
    branches = sorted({v.split(".", 1)[0] for v in versions})
    if len(branches) != 1:
        raise ArgumentError(f"the records come from {'no known driver' if not branches else 'several driver branches'}"
                         f" ({', '.join(versions) or 'none recorded'}): fit one branch at a time, or name it")
    return branches[0], ", ".join(versions)


#: Runs fitted beyond the coefficients fitted, the fewest the error is measured from (with one coefficient: 4 runs,
#: the least count ``study compare`` and the summary judge a spread on).
MIN_SPARE_RUNS = 3


def fit_report(
    records: Iterable[RunRecord],
    *,
    prior: ReclaimModel | None = None,
    kinds: Sequence[str] = FIT_KINDS,
    endings: Sequence[str] | None = None,
    driver: str | None = None,
    include_simulated: bool = False,
    across: Sequence[str] = (),
) -> FitResult:
    """Fit the model to ``records`` (see the module). ``prior``: where the coefficients the data cannot tell come
    from (default: the table's model of the records' driver); ``kinds``/``endings``: the runs fitted (the others are
    shown against the model); ``endings=None`` (the default): one ending of :data:`FIT_ENDINGS`, the first the
    records have (the others shown against the model, and ``notes`` says so), or all of them with
    ``across=("ending",)``; ``driver``: the driver version to fit for (default: the records', which must be of one
    branch). Simulated runs (``RunRecord.simulated``: the stub's timings, not a driver's) are left out unless
    ``include_simulated``; runs that do not say are fitted and counted as ``unknown`` in ``provenance``.

    The runs fitted must share their :data:`FIT_CONDITIONS` (GPU model, backend, polling mode, ending, pin mode,
    teardown): the model has no term for them, so runs that differ in one are another population.
    :class:`MixedConditions` (a ``ValueError``) names the parts that differ and their runs, unless ``across`` names
    those parts: then they are fitted together (``pooled`` says what was pooled), each condition still its own cell.
    ``ValueError`` when no run can be fitted."""
    bad = [p for p in across if p not in FIT_CONDITIONS]
    if bad:
        raise ArgumentError(f"cannot fit across {', '.join(bad)}: one of {', '.join(FIT_CONDITIONS)}")
    if driver is not None and not _VERSION.fullmatch(driver):
        shown = driver if len(driver) <= 40 else driver[:37] + "..."
        raise ArgumentError(f"driver {shown!r} is not a driver version (digits and dots, such as 580 or 580.159.04)")
    every = each_run_once(records, "the records hold run", "a run fitted twice would weigh double")
    excluded: dict[str, int] = {}
    if not include_simulated:
        every = _without_simulated(every, excluded)
    branch, versions = _branch(every, driver)
    base = prior if prior is not None else model_for(versions.split(", ")[0] if driver is None else driver)
    fitted_pts: list[FitPoint] = []
    other_pts: list[FitPoint] = []
    fitted_runs: list[RunRecord] = []
    points = _points(every, excluded)
    notes: list[str] = []
    if endings is None:
        endings = _default_endings([p for _, p in points if p.kind in kinds], across, notes)
    for r, p in points:
        if p.kind in kinds and p.ending in endings:
            fitted_pts.append(p)
            fitted_runs.append(r)
        else:
            other_pts.append(p)
    if not fitted_pts:
        raise ArgumentError(f"no measured run of the kinds {', '.join(kinds)} with the endings {', '.join(endings)} "
                            f"to fit{_left_out(every, excluded)}")
    conditions, pooled = _shared_conditions(fitted_pts, across)
    recorded = _drivers(fitted_runs, conditions, pooled)
    # The parts a cell's label names: those that differ between cells (its kind and ending are named already).
    varying = tuple(_varying([*fitted_pts, *other_pts]) - {"ending", "holder"})
    groups = _groups(fitted_pts, varying)
    rows = [terms(*g[0].features) for g in groups]
    y = [percentile([p.memory_back_ns for p in g], 0.5) for g in groups]
    w = [float(len(g)) for g in groups]
    coef, kept = _fit_columns(rows, y, w, base)
    fitted_coefs: dict[str, Any] = {name: round(coef[j]) for j, name in enumerate(COEFFICIENTS)}
    model = replace(base, driver=branch, **fitted_coefs, source="")
    fitted = tuple(c for c in COEFFICIENTS if c not in kept)
    spare = len(fitted_pts) - len(fitted)
    if spare < MIN_SPARE_RUNS:
        # With as many runs as coefficients the residuals are 0 by construction (1 run: its own median), and with
        # 1 or 2 more they are a fixed fraction of their range: error_ns (the stuck bound's margin) would be a
        # figure no spread measured.
        raise ArgumentError(
            f"{len(fitted_pts)} run{'s' if len(fitted_pts) != 1 else ''} fitted for {len(fitted)} coefficient"
            f"{'s' if len(fitted) != 1 else ''} ({', '.join(fitted)}): the error (error_ns) needs at least "
            f"{MIN_SPARE_RUNS} runs more than the coefficients fitted, {len(fitted) + MIN_SPARE_RUNS} here, else the "
            "residuals are 0 or near it by construction, not measured: run more repeats (--repeats)")
    residuals = [abs(p.memory_back_ns - model.expected_ns(*p.features)) for p in fitted_pts]
    err = max(residuals)
    zeroed = [c for c, why in kept.items() if why.startswith(_ZEROED)]
    prior_kept = [c for c in kept if c not in zeroed]
    provenance = _provenance(fitted_runs)
    gpu = conditions.get("gpu")
    model = replace(model, error_ns=math.ceil(err), gpu=", ".join(sorted(pooled["gpu"])) if "gpu" in pooled else gpu,
                    max_contexts=max(p.contexts for p in fitted_pts),
                    max_device_bytes=max(p.device_bytes for p in fitted_pts),
                    max_pinned_bytes=max(p.pinned_bytes for p in fitted_pts),
                    max_importers=max(p.importers for p in fitted_pts), source=(
        f"nvmlcheck study fit of {len(fitted_pts)} runs ({len(groups)} cells), driver {versions}"
        + (f" (records of driver {recorded})" if recorded != versions else "")
        + f" ({_conditions_words({k: v for k, v in conditions.items() if k != 'driver'})})"
        + "".join(f"; pooled {k.replace('_', ' ')} {_counts_words(v)}" for k, v in pooled.items())
        + "".join(f"; {n} runs {_PROVENANCE_WORDS[k]}" for k, n in provenance.items() if k != "real" and n)
        + f"; fitted {', '.join(fitted) or 'nothing'}"
        + (f"; kept from the {base.driver} entry: {', '.join(prior_kept)}" if prior_kept else "")
        + (f"; set to 0 (fitted below 0): {', '.join(zeroed)}" if zeroed else "")))
    cells = tuple(_cell_fit(g, model, True) for g in groups) + tuple(
        _cell_fit(g, model, False) for g in _groups(other_pts, varying))
    return FitResult(model=model, prior=base, fitted=fitted, kept=kept, n=len(fitted_pts), residual_max_ns=err,
                     residual_p95_ns=percentile(residuals, 0.95), cells=cells, excluded=excluded,
                     provenance=provenance, conditions=conditions, pooled=pooled,
                     notes=(*notes, *_timed_out_note(every, kinds, endings)))


def _points(records: Sequence[RunRecord], excluded: dict[str, int]) -> list[tuple[RunRecord, FitPoint]]:
    """Each measured run with its point; the runs that have none counted in ``excluded`` by why."""
    points: list[tuple[RunRecord, FitPoint]] = []
    for r in records:
        p = fit_point(r)
        if p is None:
            if not r.warmup:
                why = "timed out" if r.timed_out else "memory not seen back"
                excluded[why] = excluded.get(why, 0) + 1
            continue
        points.append((r, p))
    return points


def _timed_out_note(records: Sequence[RunRecord], kinds: Sequence[str], endings: Sequence[str]) -> list[str]:
    """A note when runs of the kinds and endings fitted timed out: censored, their time past the run timeout, so
    the fit and its error are of the runs that ended in time and understate how long a teardown can take."""
    timed = [r for r in records if r.timed_out and not r.warmup and r.holder in kinds and r.ending in endings]
    if not timed:
        return []
    limit = max(r.timeout_s for r in timed)
    return [f"{len(timed)} run{'s' if len(timed) != 1 else ''} of the kinds and endings fitted timed out (memory "
            f"not back within {limit:g} s, left out): the coefficients and the error are of the runs that ended in "
            "time, and understate the slowest teardowns"]


def _left_out(records: Sequence[RunRecord], excluded: dict[str, int]) -> str:
    """The runs that could not be fitted (timed out, never seen back, warm-ups), for the error that none can: the
    runs were there, and why none was fitted is said, not "no run"."""
    left = "".join(f"; {n} run{'s' if n != 1 else ''} left out: {why}" for why, n in excluded.items())
    warm = sum(1 for r in records if r.warmup)
    return left + (f"; {warm} warm-up run{'s' if warm != 1 else ''} (never fitted)" if warm else "")


def _default_endings(points: Sequence[FitPoint], across: Sequence[str], notes: list[str]) -> tuple[str, ...]:
    """The endings fitted when none is named: every one of :data:`FIT_ENDINGS` when ``across`` pools the ending or
    the runs have one at most; else the first the runs have (the others are another population), said in
    ``notes``."""
    present = [e for e in FIT_ENDINGS if any(p.ending == e for p in points)]
    if "ending" in across or len(present) <= 1:
        return FIT_ENDINGS
    runs = {e: sum(1 for p in points if p.ending == e) for e in present}
    others = ", ".join(f"{e} ({runs[e]} runs)" for e in present[1:])
    notes.append(f"fitted the {present[0]} runs ({runs[present[0]]}) alone: each ending is its own population, and "
                 f"none was named; the {others} are shown against the model (--endings {present[1]} fits another, "
                 "--across ending fits them as one model)")
    return (present[0],)


def _drivers(runs: Sequence[RunRecord], conditions: dict[str, str | None], pooled: dict[str, dict[str, int]]) -> str:
    """The driver versions the runs fitted were measured on, into ``conditions`` (and ``pooled`` when several: a
    driver named for the fit may differ from them, and the fit says so)."""
    drivers: dict[str, int] = {}
    for r in runs:
        drivers[r.driver or "unknown"] = drivers.get(r.driver or "unknown", 0) + 1
    conditions["driver"] = next(iter(drivers)) if len(drivers) == 1 else ANY
    if len(drivers) > 1:
        pooled["driver"] = dict(sorted(drivers.items()))
    return ", ".join(sorted(drivers))


#: How a fit's source and text name runs that are not known to be real.
_PROVENANCE_WORDS = {"simulated": "SIMULATED (the stub's timings, not a driver's)",
                     "unknown": "of unknown provenance (records that do not say whether they were simulated)"}
#: Why simulated runs are left out of a fit (``excluded``).
SIMULATED_LEFT_OUT = "simulated: the stub's timings, not a driver's (include_simulated / --include-simulated fits them)"


def _provenance(records: Sequence[RunRecord]) -> dict[str, int]:
    out = {"real": 0, "simulated": 0, "unknown": 0}
    for r in records:
        out[r.provenance] += 1
    return out


def _without_simulated(records: list[RunRecord], excluded: dict[str, int]) -> list[RunRecord]:
    """``records`` without the simulated runs, counted in ``excluded``; ``ValueError`` when every run is simulated."""
    kept = [r for r in records if r.simulated is not True]
    left_out = [r for r in records if r.simulated is True and not r.warmup]
    if records and not kept:
        what = sorted({r.simulation or "simulated" for r in records})
        raise ArgumentError(f"every run is simulated ({len(left_out)} measured runs; {'; '.join(what)}): the stub's "
                            "timings are not a driver's, so no model is fitted from them by default "
                            "(include_simulated=True, --include-simulated, fits them anyway)")
    if left_out:
        excluded[SIMULATED_LEFT_OUT] = len(left_out)
    return kept


def _groups(points: Sequence[FitPoint], varying: Sequence[str]) -> list[list[FitPoint]]:
    """The cells: points of one label, the same terms and the same conditions (runs of another GPU model, ending or
    pin mode are never pooled into one cell's median); a condition in ``varying`` is named in the cell's label."""
    by: dict[tuple[str, tuple[int, int, int, int], tuple[tuple[str, str | None], ...]], list[FitPoint]] = {}
    for p in points:
        by.setdefault((p.cell, p.features, p.conditions), []).append(p)
    out = []
    for (cell, _, cond), group in by.items():
        shown = _conditions_words({k: v for k, v in cond if k in varying})
        out.append([replace(p, cell=f"{cell} [{shown}]") for p in group] if shown else group)
    return out


def _varying(points: Sequence[FitPoint]) -> set[str]:
    return {k for k in (*FIT_CONDITIONS, "driver", "simulated") if len({dict(p.conditions).get(k) for p in points}) > 1}


def _shared_conditions(points: Sequence[FitPoint], across: Sequence[str]) -> tuple[
        dict[str, str | None], dict[str, dict[str, int]]]:
    """The conditions every point shares, and those pooled across (part → value → runs); :class:`MixedConditions`
    for a part that differs and ``across`` does not name (a run without a pin mode differs from none)."""
    seen: dict[str, dict[str | None, int]] = {k: {} for k in FIT_CONDITIONS}
    for p in points:
        for k, v in p.conditions:
            if k in seen:
                seen[k][v] = seen[k].get(v, 0) + 1
    shared: dict[str, str | None] = {}
    pooled: dict[str, dict[str, int]] = {}
    mixed: dict[str, dict[str, int]] = {}
    for k, values in seen.items():
        applied = {v: n for v, n in values.items() if v is not None or k not in _NOT_APPLICABLE}
        if len(applied) <= 1:
            shared[k] = next(iter(applied), None)
            continue
        counts = {_value_word(k, v): n for v, n in applied.items()}
        if k in across:
            shared[k] = ANY
            pooled[k] = counts
        else:
            mixed[k] = counts
    if mixed:
        parts = "; ".join(f"{k.replace('_', ' ')} {_counts_words(v)}" for k, v in mixed.items())
        picks = [_PICK[k] for k in mixed if k in _PICK]
        raise MixedConditions(
            f"the runs to fit were measured under different conditions, which the model has no term for: {parts}. "
            f"Fit one at a time ({'; '.join(picks)}), or fit them as one model with --across {','.join(mixed)} "
            f"(across={tuple(mixed)!r}): each condition stays its own cell", mixed)
    return shared, pooled


#: How to keep one value of a condition for a fit.
_PICK = {"ending": "--endings with one of them", "holder": "--kinds of the model alone",
         "gpu": "the records of one GPU model", "backend": "the records of one backend",
         "mode": "the records of one polling mode", "pin_mode": "the records of one pin mode"}


def _value_word(part: str, value: str | None) -> str:
    if value is None:
        return "none" if part in _NOT_APPLICABLE else "unknown"
    if part == "holder" and value == "model":
        return "the kinds the model counts"  # FIT_KINDS
    return value


def _counts_words(counts: dict[str, int]) -> str:
    return ", ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in counts.items())


def _conditions_words(conditions: dict[str, str | None]) -> str:
    words = []
    for k, v in conditions.items():
        if v is None and k in _NOT_APPLICABLE:
            continue
        if k == "simulated":
            words.append({"simulated": "SIMULATED", "real": "real GPU"}.get(v or "", "provenance unknown"))
        elif k == "holder":
            words.append("holders of pooled kinds" if v == ANY else f"holders of {_value_word(k, v)}")
        elif k == "gpu":
            words.append("several GPU models" if v == ANY else v or "GPU model unknown")
        else:
            words.append(f"{k.replace('_', ' ')} {'pooled' if v == ANY else _value_word(k, v)}")
    return ", ".join(words)


def _fit_columns(rows: Sequence[Sequence[float]], y: Sequence[float], w: Sequence[float],
                 prior: ReclaimModel) -> tuple[list[float], dict[str, str]]:
    """The coefficients, and the ones kept from ``prior`` with why. Columns the data never varies, or that are
    collinear with those before them, keep the prior; a coefficient fitted below 0 (base excepted) is set to 0."""
    coef = [float(getattr(prior, name)) for name in COEFFICIENTS]
    kept: dict[str, str] = {}
    free: list[int] = []
    # Base first, then the terms in the order a user's question varies them: device, pinned, importers, contexts.
    for j in (0, 2, 3, 4, 1):
        if not any(row[j] for row in rows):
            kept[COEFFICIENTS[j]] = "no run has this term"
            continue
        if _least_squares(rows, y, w, [*free, j]) is None:
            kept[COEFFICIENTS[j]] = "not told apart from the terms before it (no run varies it alone)"
            continue
        free.append(j)
    while free:
        fixed = [j for j in range(len(COEFFICIENTS)) if j not in free]
        target = [yi - sum(coef[j] * row[j] for j in fixed) for row, yi in zip(rows, y, strict=True)]
        solution = _least_squares(rows, target, w, free)
        if solution is None:  # cannot happen after the checks above; keep the prior rather than guess
            for j in free:
                kept[COEFFICIENTS[j]] = "the fit was singular"
            break
        negative = [(v, j) for v, j in zip(solution, free, strict=True) if v < 0 and j != 0]
        if not negative:
            for v, j in zip(solution, free, strict=True):
                coef[j] = v
            break
        v, j = min(negative)
        coef[j] = 0.0
        kept[COEFFICIENTS[j]] = f"{_ZEROED} ({v / 1e6:.2f} ms): set to 0"
        free.remove(j)
    return coef, kept


def _cell_fit(group: Sequence[FitPoint], model: ReclaimModel, in_fit: bool) -> CellFit:
    measured = [p.memory_back_ns for p in group]
    predicted = model.expected_ns(*group[0].features)
    return CellFit(cell=group[0].cell, kind=group[0].kind, n=len(group), measured_ns=percentile(measured, 0.5),
                   predicted_ns=float(predicted), residual_ns=percentile(measured, 0.5) - predicted,
                   residual_max_ns=max(abs(m - predicted) for m in measured), in_fit=in_fit)


def fit(records: Iterable[RunRecord], **options: Any) -> ReclaimModel:
    """The fitted model (:func:`fit_report`'s ``model``; the same options)."""
    return fit_report(records, **options).model


def model_code(model: ReclaimModel) -> str:
    """The ``register(ReclaimModel(...))`` call that puts ``model`` in :mod:`nvmlcheck.reclaim_model`'s table."""
    nums = "".join(f"    {name}={getattr(model, name):_},\n" for name in (*COEFFICIENTS, "error_ns"))
    ranges = "".join(f"    {name}={_number(getattr(model, name))},\n" for name in _RANGE_FIELDS)
    return (f"register(ReclaimModel(\n    driver={model.driver!r},\n{nums}    stuck_factor={model.stuck_factor!r},"
            f"\n    source={model.source!r},\n    gpu={model.gpu!r},\n{ranges}))")


#: The fields of :class:`ReclaimModel` that say what it was measured on (after ``gpu``).
_RANGE_FIELDS = ("max_contexts", "max_device_bytes", "max_pinned_bytes", "max_importers")


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 30):.1f} GiB"


def _number(value: int | None) -> str:
    return "None" if value is None else f"{value:_}"


def format_fit(result: FitResult) -> str:
    """The fit in words: each coefficient (fitted or kept, and why), the error, each cell against the model, and
    the code to register it."""
    m, lines = result.model, []
    lines.append(f"reclaim-time model for driver branch {m.driver}: {result.n} runs fitted")
    if result.conditions:
        # Runs not known to be real are said on this line too, not only in a note at the end.
        sources = [f"{n} {'SIMULATED' if k == 'simulated' else k}" for k, n in result.provenance.items() if n]
        doubt = any(result.provenance.get(k) for k in ("simulated", "unknown"))
        lines.append(f"measured under: {_conditions_words(result.conditions)}"
                     + (f"; runs {', '.join(sources)}" if doubt else ""))
    for part, counts in result.pooled.items():
        how = f"--driver {m.driver}" if part == "driver" else f"--across {part}"
        lines.append(f"pooled ({how}): {part.replace('_', ' ')} {_counts_words(counts)}; each its own cell")
    for name in COEFFICIENTS:
        why = result.kept.get(name, "")
        how = ("fitted" if name in result.fitted else why if why.startswith(_ZEROED)
               else f"kept from the {result.prior.driver} entry ({why})")
        lines.append(f"  {name:<18} {getattr(m, name) / 1e6:>10.3f} ms   {how}")
    lines.append(f"  error: largest residual {result.residual_max_ns / 1e6:.1f} ms, 95th percentile "
                 f"{result.residual_p95_ns / 1e6:.1f} ms (error_ns = the largest)")
    lines.append(f"  measured: up to {m.max_contexts} context(s), {_gib(m.max_device_bytes)} device memory, "
                 f"{_gib(m.max_pinned_bytes)} pinned, {m.max_importers} importer(s) in one teardown, on "
                 f"{m.gpu or 'a GPU model not recorded'}: an ETA beyond these is extrapolated")
    lines.append("cells (median measured vs model, ms; * = not fitted, shown against the model):")
    for c in result.cells:
        mark = " " if c.in_fit else "*"
        lines.append(f" {mark} {c.cell:<58} n {c.n:>3}  measured {c.measured_ns / 1e6:>9.1f}  model "
                     f"{c.predicted_ns / 1e6:>9.1f}  residual {c.residual_ns / 1e6:>+8.1f} "
                     f"(max {c.residual_max_ns / 1e6:.1f})")
    for why, n in sorted(result.excluded.items()):
        lines.append(f"  left out: {n} run{'s' if n > 1 else ''} ({why})")
    for note in result.notes:
        lines.append(f"  note: {note}")
    for kind, n in result.provenance.items():
        if kind != "real" and n:
            lines.append(f"  note: {n} of the runs fitted {'are' if n > 1 else 'is'} {_PROVENANCE_WORDS[kind]}")
    lines.append("to register it (nvmlcheck/reclaim_model.py):")
    lines.append(model_code(m))
    return "\n".join(lines)
