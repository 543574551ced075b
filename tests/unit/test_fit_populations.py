"""``study fit`` never fits runs of different populations as one without saying so: runs that differ in a condition
the model has no term for (GPU model, backend, polling mode, ending, pin mode, a teardown of its own such as MPS) are
refused unless ``across`` names it, and even then each condition is its own cell (never one median of two)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.cli import main
from nvmlcheck.study import DeviceRun, RunRecord, write_records
from nvmlcheck.study.fit import FIT_ENDINGS, MixedConditions, fit_conditions, fit_report, format_fit

GIB = 1 << 30
MS = 1_000_000


def _runs(y_ms: float, n: int = 5, *, size: int = GIB, name: str = "NVIDIA H200", holder: str = "alloc",
          ending: str = "KILL", **run: Any) -> list[RunRecord]:
    out = []
    for i in range(n):
        v = round((y_ms + i) * MS)  # a spread of a few ms around y_ms
        device = DeviceRun(index=0, uuid="GPU-0", name=name, pid=100 + i, baseline_used_bytes=0, held_bytes=size,
                           signal_ns=0, last_held_ns=None, first_clean_ns=v, off_list_ns=v, memory_back_ns=v,
                           waitpid_ns=v, exit_status=-9)
        fields: dict[str, Any] = {"mode": "precise", "backend": "nvml", "driver": "580.159.04", "simulated": False,
                                  **run}
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=size, ending=ending,  # type: ignore[arg-type]
                             nvmlcheck="0", wall_time=float(i), timed_out=False, timeout_s=30.0, timeout_reason=None,
                             polls=10, poll_interval_ns=1, poll_cost_ns=1, devices=(device,), holder=holder,
                             **fields))
    return out


@pytest.mark.parametrize(("part", "a", "b"), [
    ("ending", {"ending": "KILL"}, {"ending": "TERM"}),
    ("gpu", {"name": "NVIDIA H200"}, {"name": "NVIDIA A100-SXM4-80GB"}),
    ("backend", {"backend": "nvml"}, {"backend": "smi"}),
    ("mode", {"mode": "precise"}, {"mode": "default"}),
    ("pin_mode", {"holder": "pinned", "pinned_bytes": 8 * GIB, "pin_mode": "alloc"},
     {"holder": "pinned", "pinned_bytes": 8 * GIB, "pin_mode": "register"}),
])
def test_runs_of_different_conditions_are_refused_naming_what_differs(part: str, a: dict[str, Any],
                                                                      b: dict[str, Any]) -> None:
    records = _runs(100.0, **a) + _runs(300.0, **b)
    with pytest.raises(MixedConditions, match=f"--across {part}") as caught:
        fit_report(records, endings=FIT_ENDINGS)  # endings named: several are refused as any other condition
    (counts,) = caught.value.groups.values()
    assert list(caught.value.groups) == [part] and sorted(counts.values()) == [5, 5]
    assert isinstance(caught.value, ValueError)  # the CLI's "cannot fit" (exit 2)


def test_pooled_with_across_each_condition_is_its_own_cell_and_the_fit_says_what_it_pooled() -> None:
    records = _runs(100.0, ending="KILL") + _runs(300.0, ending="TERM")
    result = fit_report(records, across=("ending",))
    assert result.pooled == {"ending": {"KILL": 5, "TERM": 5}} and result.conditions["ending"] == "*"
    assert result.conditions["gpu"] == "NVIDIA H200" and result.conditions["backend"] == "nvml"
    cells = sorted((c.cell, c.n, c.measured_ns) for c in result.cells)
    assert [(n, m) for _, n, m in cells] == [(5, 102 * MS), (5, 302 * MS)]  # never one median of the two
    text = format_fit(result)
    assert "pooled (--across ending): ending KILL (5 runs), TERM (5 runs)" in text
    assert "measured under: NVIDIA H200, backend nvml, mode precise" in text
    assert "pooled ending KILL (5 runs), TERM (5 runs)" in result.model.source
    assert result.to_json()["pooled"] == {"ending": {"KILL": 5, "TERM": 5}}


def test_by_default_one_ending_is_fitted_and_the_others_shown_against_the_model() -> None:
    # The study's default output (KILL and TERM) fits as it is: KILL first, TERM shown, the choice said.
    result = fit_report(_runs(100.0, ending="TERM") + _runs(300.0, ending="KILL"))
    assert result.n == 5 and result.conditions["ending"] == "KILL" and result.pooled == {}
    assert {(c.in_fit, round(c.measured_ns / MS)) for c in result.cells} == {(True, 302), (False, 102)}
    (note,) = result.notes
    assert "fitted the KILL runs (5) alone" in note and "TERM (5 runs)" in note and "--across ending" in note
    assert result.to_json()["notes"] == [note] and f"note: {note}" in format_fit(result)
    # One ending, whichever: fitted, nothing to say; all of them pooled with --across ending.
    assert fit_report(_runs(100.0, ending="exit")).notes == ()
    assert fit_report(_runs(100.0, ending="exit")).conditions["ending"] == "exit"
    pooled = fit_report(_runs(100.0, ending="TERM") + _runs(300.0, ending="KILL"), across=("ending",))
    assert pooled.n == 10 and pooled.notes == ()


def test_pin_modes_pooled_across_stay_apart_in_their_cells() -> None:
    pinned: dict[str, Any] = {"holder": "pinned", "pinned_bytes": 8 * GIB}
    records = _runs(1370.0, pin_mode="alloc", **pinned) + _runs(730.0, pin_mode="register", **pinned)
    result = fit_report(records + _runs(110.0, holder="pinned", pin_mode="alloc"), across=("pin_mode",))
    medians = sorted(c.measured_ns for c in result.cells)
    assert medians == [112 * MS, 732 * MS, 1372 * MS]  # not 979 ms: the median of two populations
    assert any("[pin mode register]" in c.cell for c in result.cells)


def test_a_run_without_pinned_memory_has_no_pin_mode() -> None:
    # The third edition's pinned holder of 0 bytes records pin_mode "alloc": it pins nothing, so it is no other
    # population than a plain allocation, nor than pinned runs of either mode.
    zero = _runs(110.0, holder="pinned", pin_mode="alloc")
    assert fit_conditions(zero[0])["pin_mode"] is None
    result = fit_report(zero + _runs(115.0, size=8 * GIB)
                        + _runs(1370.0, holder="pinned", pinned_bytes=8 * GIB, pin_mode="register"))
    assert result.n == 15 and result.pooled == {} and result.conditions["pin_mode"] == "register"


def test_a_kind_with_a_teardown_of_its_own_is_not_fitted_with_the_models_kinds() -> None:
    records = _runs(110.0) + _runs(60.0, holder="mps")
    assert fit_report(records).n == 5  # mps is shown against the model by default, not fitted
    with pytest.raises(MixedConditions, match=r"holder .*mps"):
        fit_report(records, kinds=("alloc", "mps"))
    assert fit_report(records, kinds=("alloc", "mps"), across=("holder",)).n == 10
    with pytest.raises(ValueError, match="cannot fit across size"):
        fit_report(records, across=("size",))


def test_cli_fits_the_studys_default_output_and_pools_with_across(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # `study reclaim` ends its holders by KILL and TERM by default: its own output fits with the defaults, one
    # ending at a time (KILL first), the other shown against the model and the output saying so.
    path = write_records(_runs(100.0) + _runs(120.0, ending="TERM"), tmp_path / "runs.jsonl")
    assert main(["study", "fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "5 runs fitted" in out and "ending KILL" in out
    assert "note: fitted the KILL runs (5) alone" in out and "TERM (5 runs)" in out and "--across ending" in out
    assert main(["study", "fit", str(path), "--endings", "TERM"]) == 0
    assert "5 runs fitted" in capsys.readouterr().out
    assert main(["study", "fit", str(path), "--endings", "KILL,TERM"]) == 2  # named together: still refused
    err = capsys.readouterr().err
    assert "ending KILL (5 runs), TERM (5 runs)" in err and "--endings" in err and "--across ending" in err
    assert main(["--json", "study", "fit", str(path), "--across", "ending"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pooled"] == {"ending": {"KILL": 5, "TERM": 5}} and doc["conditions"]["ending"] == "*"


def test_a_driver_named_for_the_fit_says_which_drivers_the_runs_were_measured_on() -> None:
    records = _runs(100.0) + _runs(300.0, driver="590.48.01")
    with pytest.raises(ValueError, match="several driver branches"):
        fit_report(records)
    result = fit_report(records, driver="590.48.01")
    assert result.model.driver == "590" and result.pooled["driver"] == {"580.159.04": 5, "590.48.01": 5}
    assert "records of driver 580.159.04, 590.48.01" in result.model.source  # not "driver 590.48.01" alone
    assert sorted(c.measured_ns for c in result.cells) == [102 * MS, 302 * MS]  # one cell per driver
    assert "pooled (--driver 590): driver 580.159.04 (5 runs), 590.48.01 (5 runs)" in format_fit(result)
    one = fit_report(_runs(100.0))
    assert one.conditions["driver"] == "580.159.04" and "driver" not in one.pooled


def test_simulated_runs_fitted_on_request_are_never_one_cell_with_real_ones() -> None:
    result = fit_report(_runs(100.0) + _runs(300.0, simulated=True), include_simulated=True)
    assert result.provenance == {"real": 5, "simulated": 5, "unknown": 0}
    assert sorted((c.measured_ns, c.cell.endswith("[SIMULATED]")) for c in result.cells) == [(102 * MS, False),
                                                                                            (302 * MS, True)]


def test_text_from_the_records_is_printed_safe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_records(_runs(100.0, name="NVIDIA\x1b[2J\x1b]0;owned\x07 H200"), tmp_path / "runs.jsonl")
    assert main(["study", "fit", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "NVIDIA\\x1b[2J" in out


def test_a_fit_of_simulated_runs_says_so_on_its_first_lines() -> None:
    text = format_fit(fit_report(_runs(100.0, simulated=True), include_simulated=True))
    assert "; runs 5 SIMULATED" in text.splitlines()[1]
    assert "SIMULATED" not in format_fit(fit_report(_runs(100.0))).splitlines()[1]
