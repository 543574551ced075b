"""``study compare`` never pools, nor compares, runs measured under different conditions (simulated or real, polling
mode, backend, driver, GPU model, ...) without saying so: they are kept apart, and a cell whose runs differ is named
with what differs, unless ``across`` pools them (then a note says where a side holds several values)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.study import DeviceRun, RunRecord, write_records
from nvmlcheck.study.compare import compare_records, format_comparison

MS = 1_000_000
GIB = 1 << 30


def _runs(centre_ms: float, n: int = 6, *, name: str = "NVIDIA H200", simulated: bool | None = False,
          **run: Any) -> list[RunRecord]:
    rng = random.Random(int(centre_ms))
    out = []
    for i in range(n):
        v = round(rng.gauss(centre_ms, 2.0) * MS)
        device = DeviceRun(index=0, uuid="GPU-0", name=name, pid=100 + i, baseline_used_bytes=0, held_bytes=GIB,
                           signal_ns=0, last_held_ns=None, first_clean_ns=v, off_list_ns=v, memory_back_ns=v,
                           waitpid_ns=None, exit_status=-9)
        fields: dict[str, Any] = {"mode": "precise", "backend": "nvml", "driver": "580.159.04", **run}
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=GIB, ending="KILL", nvmlcheck="0",
                             wall_time=0.0, timed_out=False, timeout_s=30.0, timeout_reason=None, polls=10,
                             poll_interval_ns=1, poll_cost_ns=1, devices=(device,), simulated=simulated,
                             simulation="the stub" if simulated else None, **fields))
    return out


@pytest.mark.parametrize(("part", "a", "b"), [
    ("simulated", {"simulated": False}, {"simulated": True}),
    ("simulated", {"simulated": None}, {"simulated": True}),  # records that do not say are not taken for real
    ("simulated", {"simulated": None}, {"simulated": False}),
    ("mode", {"mode": "precise"}, {"mode": "default"}),
    ("backend", {"backend": "nvml"}, {"backend": "smi"}),
    ("driver", {"driver": "570.86.15"}, {"driver": "580.159.04"}),
    ("gpu", {"name": "NVIDIA H100"}, {"name": "NVIDIA H200"}),
    ("count", {"holder_count": 1}, {"holder_count": 4}),
    ("per_gpu", {"per_gpu": 1}, {"per_gpu": 4}),
])
def test_runs_of_different_conditions_are_not_compared_and_what_differs_is_named(
    part: str, a: dict[str, Any], b: dict[str, Any]
) -> None:
    c = compare_records(_runs(100.0, **a), _runs(300.0, **b), seed=1)
    assert c.cells == () and c.only_a == () and c.only_b == ()
    (u,) = c.unmatched
    assert u.differ_in == (part,) and len(u.a) == 1 and len(u.b) == 1
    text = format_comparison(c)
    assert f"the runs differ in {part}" in text and f"--across {part}" in text
    pooled = compare_records(_runs(100.0, **a), _runs(300.0, **b), seed=1, across=(part,))
    (cell,) = pooled.cells
    assert cell.differ is True and cell.conditions[part] == "*" and pooled.unmatched == ()


def test_a_side_mixing_two_modes_is_grouped_not_pooled() -> None:
    mixed = _runs(100.0) + _runs(300.0, mode="default")
    c = compare_records(mixed, _runs(100.0), seed=1)
    (cell,) = c.cells
    assert cell.n_a == 6 and cell.conditions["mode"] == "precise"  # the default-mode runs are not in it
    assert cell.differ is False  # pooled, the 300 ms runs would have moved A's median
    (u,) = c.unmatched
    assert [g["mode"] for g in u.a] == ["default"] and u.b == () and u.differ_in == ("mode",)
    assert "A's runs (mode default) have no counterpart" in format_comparison(c)


def test_pooling_across_a_condition_is_said() -> None:
    mixed = _runs(100.0, driver="570.86.15") + _runs(100.0)
    c = compare_records(mixed, _runs(100.0), seed=1, across=("driver",))
    (cell,) = c.cells
    assert cell.n_a == 12
    assert any(n.startswith("A pools runs of several driver values") for n in c.notes)


def test_simulated_runs_compared_with_each_other_or_across_are_flagged() -> None:
    both = compare_records(_runs(100.0, simulated=True), _runs(100.0, simulated=True), seed=1)
    assert len(both.cells) == 1 and any(n.startswith("SIMULATED: every run compared") for n in both.notes)
    assert "measured under: SIMULATED" in format_comparison(both)
    forced = compare_records(_runs(100.0, simulated=True), _runs(100.0), seed=1, across=("simulated",))
    assert len(forced.cells) == 1 and any("compared with runs that are not" in n for n in forced.notes)


def test_the_cli_names_what_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_records(_runs(100.0, simulated=True), tmp_path / "stub.jsonl")
    b = write_records(_runs(100.0), tmp_path / "h200.jsonl")
    assert cli.main(["study", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "SIMULATED: the stub" in out and "real GPUs" in out and "--across simulated" in out
    assert "no cell in common" in out


def test_across_holder_takes_the_count_with_it() -> None:
    """alloc (count 1: one allocation) against streams (count 4: four streams): the counts are the kinds'."""
    c = compare_records(_runs(100.0), _runs(150.0, holder="streams", holder_count=4), seed=1, across=("holder",))
    (cell,) = c.cells
    assert cell.conditions["count"] == "*" and c.across == ("holder",)
