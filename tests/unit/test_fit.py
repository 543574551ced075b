"""The reclaim-time model (``nvmlcheck.reclaim_model``) and its fit to study records (``nvmlcheck.study.fit``,
``nvmlcheck study fit``): synthetic records with known coefficients are recovered; coefficients the data cannot tell
keep the prior's value; the error is the largest residual; staged IPC runs are read from their last signal."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import reclaim_model as rm
from nvmlcheck.cli import main
from nvmlcheck.study import DeviceRun, RunRecord, write_records
from nvmlcheck.study.fit import fit, fit_point, fit_report, format_fit, model_code

GIB = 1 << 30
MS = 1_000_000
TRUE = rm.ReclaimModel(driver="580", base_ns=120 * MS, per_context_ns=50 * MS, per_device_gib_ns=MS // 2,
                       per_pinned_gib_ns=100 * MS, per_importer_ns=30 * MS, error_ns=0, stuck_factor=4.0,
                       source="the truth")


def device(*, signal_ns: int = 0, back_ns: int | None, role: str = "holder", held_at_signal: int | None = None,
           index: int = 0) -> DeviceRun:
    return DeviceRun(index=index, uuid=f"GPU-{index}", name="NVIDIA H200", pid=1000, baseline_used_bytes=0,
                     held_bytes=GIB, signal_ns=signal_ns, last_held_ns=None, first_clean_ns=back_ns,
                     off_list_ns=back_ns, memory_back_ns=back_ns, waitpid_ns=back_ns, exit_status=-9, role=role,
                     held_at_signal_bytes=held_at_signal)


def record(run: int, *, y_ns: float, size: int = GIB, holder: str = "alloc", per_gpu: int = 1, pinned: int = 0,
           importers: int = 0, ending: str = "KILL", driver: str = "580.159.04", **kw: Any) -> RunRecord:
    devices = tuple(device(back_ns=round(y_ns)) for _ in range(per_gpu))
    return RunRecord(run=run, repeat=run, warmup=False, size_bytes=size, ending=ending, mode="precise",  # type: ignore[arg-type]
                     backend="nvml", driver=driver, nvmlcheck="0", wall_time=0.0, timed_out=False, timeout_s=30.0,
                     timeout_reason=None, polls=10, poll_interval_ns=100_000, poll_cost_ns=50_000, devices=devices,
                     holder=holder, per_gpu=per_gpu, pinned_bytes=pinned, importers=importers, **kw)


def staged_ipc(run: int, *, importers: int, first: str, y_ns: float, size: int = 8 * GIB,
               held: int | None = None) -> RunRecord:
    """An IPC run ended in two stages: the first side at 0, the other at 400 ms; memory back y_ns after that."""
    later = 400 * MS
    exp_signal, imp_signal = (0, later) if first == "exporter" else (later, 0)
    back = later + round(y_ns)
    devs: tuple[DeviceRun, ...] = (device(signal_ns=exp_signal, back_ns=back - exp_signal, role="exporter",
                                          held_at_signal=held if first == "importers" else size),)
    devs += tuple(device(signal_ns=imp_signal, back_ns=back - imp_signal, role="importer",
                         held_at_signal=held if first == "exporter" else size) for _ in range(importers))
    return RunRecord(run=run, repeat=run, warmup=False, size_bytes=size, ending="KILL", mode="precise",
                     backend="nvml", driver="580.159.04", nvmlcheck="0", wall_time=0.0, timed_out=False,
                     timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=100_000, poll_cost_ns=50_000,
                     devices=devs, holder="ipc", importers=importers, first=first, stage_gap_s=0.3)


def synthetic(model: rm.ReclaimModel, noise_ms: float = 2.0, seed: int = 7) -> list[RunRecord]:
    """Runs of every term, each ``model``'s time plus uniform noise: contexts (per_gpu), device GiB, pinned GiB and
    importers (exporter ended first: the importers are the last stage, the allocation still held)."""
    rng = random.Random(seed)
    out: list[RunRecord] = []

    def noisy(expected: int) -> float:
        return expected + rng.uniform(-noise_ms, noise_ms) * MS

    for per_gpu in (1, 2, 4):
        for size in (GIB, 8 * GIB, 64 * GIB):
            for pinned in (0, 8 * GIB, 32 * GIB):
                for _ in range(5):
                    y = noisy(model.expected_ns(per_gpu, size * per_gpu, pinned * per_gpu))
                    out.append(record(len(out), y_ns=y, size=size, holder="pinned", per_gpu=per_gpu, pinned=pinned))
    for k in (1, 2, 4):
        for _ in range(5):
            y = noisy(model.expected_ns(0, 8 * GIB, 0, k))
            out.append(staged_ipc(len(out), importers=k, first="exporter", y_ns=y, held=9 * GIB))
    return out


# --- the model -------------------------------------------------------------------------------------------------------


def test_model_terms_and_expected_times() -> None:
    assert rm.terms(1, 2 * GIB, 4 * GIB, 3) == (1.0, 0.0, 2.0, 4.0, 3.0)
    assert rm.terms(4) == (1.0, 3.0, 0.0, 0.0, 0.0)
    assert rm.terms(0, 8 * GIB) == (0.0,) * 5  # nothing torn down
    assert TRUE.expected_ns(0) == 0
    assert TRUE.expected_ns(0, 0, 0, 2) == 120 * MS + 60 * MS  # importers alone still tear down
    assert TRUE.expected_ns(2, 2 * GIB, 8 * GIB) == 120 * MS + 50 * MS + MS + 800 * MS
    assert TRUE.stuck_after_ns() == 1_000_000_000  # never below 1 s
    assert TRUE.stuck_after_ns(1, 0, 32 * GIB) == math.ceil(3320 * MS * 4.0)
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="contexts"):
            rm.terms(bad)  # type: ignore[arg-type]


def test_model_table() -> None:
    assert rm.model_for("580.159.04").driver == "580" and rm.model_for(None).driver == "default"
    assert rm.model_for("999.1").driver == "default"
    assert rm.expected_ns("580.1", 1) == rm.model_for("580").base_ns
    with pytest.raises(TypeError, match="ReclaimModel"):
        rm.register("580")  # type: ignore[arg-type]


# The H200's maxima, signal -> memory back (ms), per cell of the reclaim study's third edition
# (docs/data/h200-2026-12-01-study3/summary.txt; IPC: from the last stage's signal), with the cell's terms:
# (contexts, device bytes, pinned host bytes, importers).
H200_MAX_MS = [
    ((1, 8 * GIB, 0, 0), 127.3),            # pinned-0-dev8
    ((1, 8 * GIB, 8 * GIB, 0), 1626.9),     # pinned-8-dev8 (cuMemHostAlloc)
    ((1, 8 * GIB, 32 * GIB, 0), 6359.9),    # pinned-32-dev8, 8 runs
    ((1, 64 * GIB, 0, 0), 170.6),           # pinned-0-dev64
    ((1, 64 * GIB, 8 * GIB, 0), 1643.1),    # pinned-8-dev64
    ((0, 8 * GIB, 0, 4), 295.4),            # ipc-4-exporter-first: the importers, last
    ((1, 8 * GIB, 0, 0), 568.3),            # ipc-2-importers-first: the exporter, last (ipc's largest)
    ((1, 8 * GIB, 0, 0), 201.1),            # managed-dev8
]


@pytest.mark.parametrize(("cell", "max_ms"), H200_MAX_MS)
def test_the_580_stuck_bound_exceeds_every_h200_teardown(cell: tuple[int, int, int, int], max_ms: float) -> None:
    # never "stuck" while still being reclaimed: with the cell's terms, and with the pinned host memory unknown (ready
    # cannot read it from a process that has exited, so it passes 0)
    m = rm.model_for("580.159.04")
    contexts, device_bytes, pinned, importers = cell
    assert m.stuck_after_ns(contexts, device_bytes, pinned, importers) > max_ms * MS
    assert m.stuck_after_ns(max(contexts, 1), device_bytes, 0, 0) > max_ms * MS


def test_the_fallback_is_at_least_as_patient_as_the_580_entry() -> None:
    old, other = rm.model_for("580.159.04"), rm.model_for(None)
    for cell, _ in H200_MAX_MS:
        assert other.stuck_after_ns(*cell) >= old.stuck_after_ns(*cell)
        assert other.expected_ns(*cell) >= old.expected_ns(*cell)


# --- the fit ---------------------------------------------------------------------------------------------------------


def test_fit_recovers_known_coefficients() -> None:
    result = fit_report(synthetic(TRUE))
    m = result.model
    assert result.fitted == rm.COEFFICIENTS and not result.kept
    assert m.base_ns == pytest.approx(TRUE.base_ns, abs=2 * MS)
    assert m.per_context_ns == pytest.approx(TRUE.per_context_ns, abs=1 * MS)
    assert m.per_device_gib_ns == pytest.approx(TRUE.per_device_gib_ns, abs=0.05 * MS)
    assert m.per_pinned_gib_ns == pytest.approx(TRUE.per_pinned_gib_ns, abs=0.2 * MS)
    assert m.per_importer_ns == pytest.approx(TRUE.per_importer_ns, abs=1 * MS)
    # The error is the largest absolute residual of any fitted run (noise of +-2 ms, plus the fit's own error).
    assert m.error_ns == math.ceil(result.residual_max_ns) and 0 < m.error_ns < 5 * MS
    assert m.driver == "580" and m.stuck_factor == rm.model_for("580").stuck_factor
    assert "fitted base_ns, per_context_ns" in m.source and "kept" not in m.source
    assert fit(synthetic(TRUE)) == m


def test_coefficients_the_data_cannot_tell_keep_the_prior() -> None:
    records = [r for r in synthetic(TRUE) if r.holder == "pinned" and r.per_gpu == 1 and r.size_bytes == GIB]
    result = fit_report(records, prior=TRUE)
    assert result.fitted == ("base_ns", "per_pinned_gib_ns")
    assert set(result.kept) == {"per_context_ns", "per_device_gib_ns", "per_importer_ns"}
    assert "no run has this term" in result.kept["per_context_ns"]
    assert "not told apart" in result.kept["per_device_gib_ns"]  # 1 GiB in every run: the base's column
    assert result.model.per_context_ns == TRUE.per_context_ns and result.model.per_importer_ns == TRUE.per_importer_ns
    assert result.model.per_pinned_gib_ns == pytest.approx(TRUE.per_pinned_gib_ns, abs=0.2 * MS)
    text = format_fit(result)
    assert "kept from the 580 entry (no run has this term)" in text and "register(ReclaimModel(" in text


def test_a_coefficient_fitted_below_zero_is_set_to_zero() -> None:
    falling = [record(n, y_ns=(150 - 2 * gib) * MS, size=gib * GIB) for n, gib in enumerate((1, 4, 16, 32) * 3)]
    result = fit_report(falling)
    assert result.model.per_device_gib_ns == 0 and "fitted below 0" in result.kept["per_device_gib_ns"]
    assert "set to 0 (fitted below 0): per_device_gib_ns" in result.model.source
    assert result.model.base_ns == pytest.approx(150 * MS - 2 * 13.25 * MS, abs=MS)  # the mean, with no slope


def test_points_of_staged_runs_and_what_is_left_out() -> None:
    kept = fit_point(staged_ipc(0, importers=2, first="exporter", y_ns=200 * MS, held=9 * GIB))
    assert kept is not None and kept.features == (0, 8 * GIB, 0, 2) and kept.memory_back_ns == 200 * MS
    freed = fit_point(staged_ipc(0, importers=2, first="exporter", y_ns=200 * MS, held=GIB))
    assert freed is not None and freed.device_bytes == 0  # the exporter's allocation went with it
    last = fit_point(staged_ipc(0, importers=2, first="importers", y_ns=150 * MS, held=8 * GIB))
    assert last is not None and last.features == (1, 8 * GIB, 0, 0)
    contexts = fit_point(record(0, y_ns=300 * MS, holder="contexts", holder_count=4))
    assert contexts is not None and contexts.contexts == 4
    warm = record(0, y_ns=MS)
    assert fit_point(RunRecord(**{**_fields(warm), "warmup": True})) is None
    late = RunRecord(**{**_fields(warm), "timed_out": True})
    unseen = RunRecord(**{**_fields(warm), "devices": (device(back_ns=None),)})
    result = fit_report([*synthetic(TRUE)[:45], late, unseen, record(99, y_ns=80 * MS, holder="destroy")])
    assert result.excluded == {"timed out": 1, "memory not seen back": 1}
    (destroy,) = [c for c in result.cells if not c.in_fit]
    assert destroy.kind == "destroy" and destroy.n == 1 and destroy.residual_ns < 0  # shown, not fitted


def _fields(r: RunRecord) -> dict[str, Any]:
    return {name: getattr(r, name) for name in RunRecord.__dataclass_fields__}


def test_fit_refuses_mixed_drivers_and_nothing_to_fit() -> None:
    mixed = [record(0, y_ns=MS), record(1, y_ns=MS, driver="590.48.01")]
    with pytest.raises(ValueError, match="several driver branches"):
        fit_report(mixed)
    four = [*mixed, record(2, y_ns=MS), record(3, y_ns=MS, driver="590.48.01")]  # enough runs for an error
    assert fit_report(four, driver="590.48.01").model.driver == "590"
    with pytest.raises(ValueError, match="no measured run"):
        fit_report([record(0, y_ns=MS, ending="free")])


def test_model_code_registers_the_same_model() -> None:
    model = fit_report(synthetic(TRUE)).model
    seen: list[rm.ReclaimModel] = []
    exec(model_code(model), {"register": seen.append, "ReclaimModel": rm.ReclaimModel})
    assert seen == [model]


def test_a_fit_records_what_it_measured_so_an_eta_beyond_it_says_so() -> None:
    # Before: the fitted model kept no trace of its data's range, so ready's ETA for 64 contexts or 200 GiB pinned was
    # a linear extrapolation given as if measured.
    runs = synthetic(TRUE)
    model = fit_report(runs).model
    assert (model.max_contexts, model.max_device_bytes, model.max_pinned_bytes, model.max_importers) == (
        4, 4 * 64 * GIB, 4 * 32 * GIB, 4)
    assert model.gpu == "NVIDIA H200" and model.beyond(4, 64 * GIB, 32 * GIB, 4, gpu="NVIDIA H200") is None
    assert "5 contexts (measured up to 4)" in (model.beyond(5) or "")
    text = format_fit(fit_report(runs))
    assert "measured: up to 4 context(s), 256.0 GiB device memory, 128.0 GiB pinned, 4 importer(s)" in text
    only_one = fit_report([r for r in runs if r.holder == "pinned" and r.per_gpu == 1 and not r.pinned_bytes]).model
    assert only_one.max_pinned_bytes == 0 and only_one.max_importers == 0  # kept from the prior: not this data's
    assert "pinned host memory (measured up to 0.0 GiB)" in (only_one.beyond(1, 0, GIB) or "")


def test_cli_study_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_records(synthetic(TRUE), tmp_path / "runs.jsonl")
    assert main(["study", "fit", str(path)]) == 0
    text = capsys.readouterr().out
    assert "reclaim-time model for driver branch 580" in text and "per_pinned_gib_ns" in text
    assert main(["--json", "study", "fit", str(path), "--kinds", "pinned"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "nvmlcheck/study-fit" and doc["records"] == [str(path)]
    assert doc["model"]["driver"] == "580" and "per_importer_ns" in doc["kept"]  # no ipc run fitted
    assert {c["kind"] for c in doc["cells"] if c["in_fit"]} == {"pinned"}
    assert main(["study", "fit", str(tmp_path / "missing.jsonl")]) == 2
    assert main(["study", "fit", str(path), "--kinds", "streams"]) == 2
    assert "cannot fit" in capsys.readouterr().err


def test_the_580_entry_is_the_fit_of_the_committed_h200_records() -> None:
    """The registered 580 figures are what `study fit --across ending,pin_mode` gives on the study's records in the
    repository (each pin mode its own cell), with their driver and GPU: not a fit that pooled the pin modes into one
    cell's median, nor figures no data here gives."""
    from pathlib import Path

    from nvmlcheck.study import load_records
    from nvmlcheck.study.fit import fit_report

    data = Path(__file__).resolve().parents[2] / "docs" / "data"
    paths = [data / "h200-2026-12-01-study3" / "records.jsonl",
             *sorted((data / "h200x2-2026-11-30" / "study2").glob("*.jsonl"))]
    records = [r for p in paths for r in load_records(p)]
    result = fit_report(records, across=("ending", "pin_mode"))
    entry = rm.model_for("580.159.04")
    assert result.n == 238 and len([c for c in result.cells if c.in_fit]) == 22
    assert result.conditions["gpu"] == "NVIDIA H200" and result.conditions["driver"] == "580.159.04"
    for name in (*rm.COEFFICIENTS, "error_ns", "gpu", "max_contexts", "max_device_bytes", "max_pinned_bytes",
                 "max_importers"):
        assert getattr(entry, name) == getattr(result.model, name), name
    assert "driver 580.159.04" in entry.source and "NVIDIA H200" in entry.source and "pin_mode" in entry.source


@pytest.mark.parametrize("runs", [1, 2, 3])
def test_fit_refuses_an_error_from_too_few_runs(runs: int) -> None:
    # One cell, one coefficient (base_ns): 1 run fitted its own time (error 0 by construction, registered as
    # error_ns=0), 2 gave half their range; the error needs 3 runs more than the coefficients fitted.
    few = [record(i, y_ns=(100 + 10 * i) * MS) for i in range(runs)]
    with pytest.raises(ValueError, match=rf"{runs} runs? fitted for 1 coefficient \(base_ns\).*4 here"):
        fit_report(few)
    result = fit_report([*few, *(record(runs + i, y_ns=(100 + 10 * i) * MS) for i in range(4 - runs))])
    assert result.n == 4 and result.fitted == ("base_ns",) and result.model.error_ns > 0
