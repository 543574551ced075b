"""Records of earlier editions read back properly: second- and third-edition records of real GPUs (no ``simulated``
field, but the CUDA holder's steps) are real and compare with new records without ``--across``; a first-edition
record stays unknown and ``study compare`` says which nvmlcheck wrote it and what to do; a condition that does not
apply to a run (a pin mode without pinned memory, a stage gap with one stage) does not keep its cell from a
comparison. The published comparisons reproduce from the published records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.study import DeviceRun, RunRecord, load_records
from nvmlcheck.study.compare import compare_records, format_comparison

GIB = 1 << 30
MS = 1_000_000
DATA = Path(__file__).resolve().parents[2] / "docs" / "data"
CUDA_STEPS = {"init": 400 * MS, "ctx": 120 * MS, "alloc": 2 * MS, "touch": 4 * MS}


def _runs(centre_ms: float, n: int = 6, *, steps: dict[str, int] | None = None, **run: Any) -> list[RunRecord]:
    out = []
    for i in range(n):
        v = round((centre_ms + i) * MS)
        device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + i, baseline_used_bytes=0,
                           held_bytes=8 * GIB, signal_ns=0, last_held_ns=None, first_clean_ns=v, off_list_ns=v,
                           memory_back_ns=v, waitpid_ns=v, exit_status=-9, holder_steps=steps)
        fields: dict[str, Any] = {"mode": "precise", "backend": "nvml", "driver": "580.159.04", "simulated": False,
                                  **run}
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=8 * GIB, ending="KILL", nvmlcheck="0.1.0",
                             wall_time=0.0, timed_out=False, timeout_s=30.0, timeout_reason=None, polls=10,
                             poll_interval_ns=1, poll_cost_ns=1, devices=(device,), **fields))
    return out


def _older(records: list[RunRecord], path: Path) -> list[RunRecord]:
    """The records as nvmlcheck wrote them before the ``simulated`` field, read back."""
    drop = ("simulated", "simulation", "simulated_reason")
    lines = [json.dumps({k: v for k, v in r.to_json().items() if k not in drop}) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_records(path)


def test_an_older_record_of_the_cuda_holder_reads_as_real_and_compares_with_new_ones(tmp_path: Path) -> None:
    old = _older(_runs(150.0, steps=CUDA_STEPS), tmp_path / "second-edition.jsonl")
    assert {r.provenance for r in old} == {"real"} and old[0].simulated_reason is None
    c = compare_records(old, _runs(110.0), seed=1)
    (cell,) = c.cells
    assert cell.differ is True and c.unmatched == () and cell.conditions["simulated"] == "real"


@pytest.mark.parametrize("steps", [None, {"init": 5}, {"init": 5, "ctx": 6, "sim": 1}])
def test_an_older_record_without_the_cuda_holders_steps_is_never_real(tmp_path: Path,
                                                                     steps: dict[str, int] | None) -> None:
    (r,) = _older(_runs(150.0, n=1, steps=steps), tmp_path / "old.jsonl")
    assert r.provenance == ("simulated" if steps and "sim" in steps else "unknown")


def test_compare_names_the_writer_and_the_fix_for_first_edition_records(tmp_path: Path) -> None:
    first = _older(_runs(150.0), tmp_path / "first-edition.jsonl")
    c = compare_records(first, _runs(110.0), seed=1)
    assert c.cells == () and c.unmatched[0].differ_in == ("simulated",)
    text = format_comparison(c)
    assert "A's 6 measured runs do not say whether they were simulated" in text
    assert "nvmlcheck 0.1.0" in text and "--across simulated" in text
    assert compare_records(first, _runs(110.0), seed=1, across=("simulated",)).cells[0].differ is True


def test_a_condition_that_does_not_apply_does_not_keep_a_cell_from_its_comparison() -> None:
    # The third edition's plain allocation was the pinned holder with 0 bytes pinned (its record says pin_mode
    # "alloc"); managed memory has no pin mode: compared across holder, they are one cell.
    plain = _runs(113.0, holder="pinned", pin_mode="alloc")
    c = compare_records(plain, _runs(180.0, holder="managed"), seed=1, across=("holder",))
    (cell,) = c.cells
    assert cell.differ is True and cell.conditions["pin_mode"] is None and c.unmatched == ()
    # 0 pinned GiB against 8 GiB pinned (by either mode), across pinned: compared, each mode its own cell
    pinned: dict[str, Any] = {"holder": "pinned", "pinned_bytes": 8 * GIB}
    b = _runs(1370.0, pin_mode="alloc", **pinned) + _runs(730.0, pin_mode="register", **pinned)
    c = compare_records(plain, b, seed=1, across=("pinned",))
    assert sorted(x.conditions["pin_mode"] for x in c.cells) == ["alloc", "register"] and c.unmatched == ()
    # ... but two pin modes of the same pinned memory are still two conditions
    c = compare_records(_runs(1370.0, pin_mode="alloc", **pinned), _runs(730.0, pin_mode="register", **pinned),
                        seed=1)
    assert c.cells == () and c.unmatched[0].differ_in == ("pin_mode",)
    # one stage (no importers) against two stages with a gap, across importers
    one = _runs(114.0, holder="ipc")
    two = _runs(116.0, holder="ipc", importers=1, first="exporter", stage_gap_s=0.3)
    c = compare_records(one, two, seed=1, across=("importers", "first"))
    assert len(c.cells) == 1 and c.unmatched == () and c.cells[0].conditions["stage_gap"] == 0.3


@pytest.mark.parametrize(("a", "b", "across"), [
    ("pinned-0-dev8", "managed-dev8", ("holder",)),
    ("pinned-0-dev8", "mps-dev8", ("holder", "role")),
    ("pinned-0-dev8", "pinned-8-dev8", ("pinned",)),
])
def test_the_third_editions_comparisons_reproduce_from_its_records(tmp_path: Path, a: str, b: str,
                                                                   across: tuple[str, ...]) -> None:
    by_file: dict[str, list[dict[str, Any]]] = {}
    for line in (DATA / "h200-2026-12-01-study3" / "records.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        kind = doc["holder"]
        name = (f"{kind}-dev8" if kind in ("managed", "mps")
                else f"pinned-{doc['pinned_bytes'] >> 30}-dev{doc['size_bytes'] >> 30}" if kind == "pinned" else "")
        if doc.get("pin_mode") != "register":
            by_file.setdefault(name, []).append(doc)
    sides = [[RunRecord.from_json(d) for d in by_file[n]] for n in (a, b)]
    assert {r.provenance for side in sides for r in side} == {"real"}
    c = compare_records(*sides, seed=26, resamples=200, across=across)
    assert len(c.cells) == 1 and c.unmatched == () and c.cells[0].n_a >= 10 and c.cells[0].n_b >= 10
