"""``nvmlcheck.study.compare``: the bootstrap comparison of two studies, on generated records with known differences."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from nvmlcheck.study import DeviceRun, RunRecord, write_records
from nvmlcheck.study.compare import (
    COMPARE_SCHEMA,
    MIN_N,
    bootstrap_median_difference,
    compare_records,
    format_comparison,
    outliers,
    repeats_to_resolve,
)

MS = 1_000_000
GIB = 1 << 30


def records(values_ms: list[float], *, size: int = GIB, ending: str = "KILL", holder: str = "alloc",
            gpus: int = 1, warmup_first: bool = True) -> list[RunRecord]:
    """One run per value (the same value on each GPU), preceded by a warm-up whose value is absurd (left out)."""
    out = []
    vals = ([10_000.0] if warmup_first else []) + values_ms
    for n, v in enumerate(vals):
        devices = tuple(
            DeviceRun(index=i, uuid=f"GPU-{i}", name="H200", pid=100 + n, baseline_used_bytes=0, held_bytes=size,
                      signal_ns=0, last_held_ns=None, first_clean_ns=round(v * MS), off_list_ns=round(v * MS),
                      memory_back_ns=round(v * MS), waitpid_ns=None, exit_status=-9, zombie_ns=2 * MS)
            for i in range(gpus))
        out.append(RunRecord(run=n, repeat=n, warmup=warmup_first and n == 0, size_bytes=size, ending=ending,  # type: ignore[arg-type]
                             mode="precise", backend="nvml", driver="580", nvmlcheck="0", wall_time=0.0,
                             timed_out=False, timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1,
                             poll_cost_ns=1, devices=devices, holder=holder))
    return out


def sample(rng: random.Random, n: int, centre_ms: float, sd_ms: float = 8.0) -> list[float]:
    return [rng.gauss(centre_ms, sd_ms) for _ in range(n)]


def test_a_20_ms_shift_is_found_and_a_null_shift_is_not() -> None:
    rng = random.Random(18)
    base = sample(rng, 12, 100.0)
    shifted = sample(rng, 12, 120.0)
    same = sample(rng, 12, 100.0)

    found = compare_records(records(base), records(shifted), seed=7)
    (cell,) = found.cells
    assert cell.differ is True and cell.why is None
    assert cell.ci_low is not None and cell.ci_high is not None and 0 < cell.ci_low < cell.ci_high
    assert cell.difference is not None and cell.ci_low <= cell.difference <= cell.ci_high
    assert 10 * MS < cell.difference < 30 * MS  # near the 20 ms put in
    assert (cell.n_a, cell.n_b) == (12, 12)  # the warm-ups (10 s) are left out

    null = compare_records(records(base), records(same), seed=7)
    (cell,) = null.cells
    assert cell.differ is False
    assert cell.ci_low is not None and cell.ci_high is not None and cell.ci_low <= 0 <= cell.ci_high

    assert compare_records(records(base), records(shifted), seed=7) == found  # the seed makes it reproducible
    text = format_comparison(found)
    assert "they DIFFER at 95%" in text and "no difference shown" in format_comparison(null)


def test_outliers_are_listed_and_kept() -> None:
    rng = random.Random(3)
    a = sample(rng, 10, 100.0, 2.0)
    b = [*sample(rng, 9, 100.0, 2.0), 400.0]
    c = compare_records(records(a), records(b), seed=1)
    (cell,) = c.cells
    assert cell.outliers_b == (400 * MS,) and cell.outliers_a == ()
    assert cell.n_b == 10  # kept in the statistics
    assert "outliers in B: 400.0 ms" in format_comparison(c)
    assert outliers([1, 2, 3, 4, 100]) == (100,) and outliers([1, 2, 100]) == ()


def test_too_few_values_give_no_verdict_and_cells_match_by_kind_size_ending_gpu() -> None:
    a = records([100.0] * (MIN_N - 1)) + records([100.0] * 5, holder="context", size=0)
    b = records([150.0] * 5) + records([100.0] * 5, ending="exit")
    c = compare_records(a, b)
    (cell,) = c.cells
    assert cell.differ is None and cell.why is not None and "too few" in cell.why
    assert cell.ci_low is None and cell.difference == 50 * MS
    assert c.only_a == ((0, "KILL", "context", 0, 0, 0, "", "holder"),)
    assert c.only_b == ((GIB, "exit", "alloc", 0, 0, 0, "", "holder"),)
    two = compare_records(records([100.0] * 5, gpus=2), records([100.0] * 5))
    assert [x.device for x in two.cells] == [0] and two.only_a == ((GIB, "KILL", "alloc", 1, 0, 0, "", "holder"),)
    with pytest.raises(ValueError, match="unknown measure"):
        compare_records(a, b, measure="sleep")
    with pytest.raises(ValueError, match="level"):
        compare_records(a, b, level=1.0)


def test_repeats_guidance_follows_the_formula() -> None:
    a = [90.0, 95.0, 100.0, 105.0, 110.0]  # IQR 10 -> sigma 10/1.349
    sigma, need = repeats_to_resolve([v * MS for v in a], [v * MS for v in a], resolve_ns=5 * MS, level=0.95)
    assert sigma == pytest.approx(10 * MS / 1.349)
    assert need == math.ceil(2 * (1.959964 * 1.2533 * (10 / 1.349) / 5) ** 2)  # 27 runs per side
    assert repeats_to_resolve([1.0], [1.0, 2.0], resolve_ns=1, level=0.95) == (None, None)
    # Quartiles of 2 or 3 values are interpolated (with 2: the IQR is half their range, whatever the spread): no
    # spread, and no runs-needed guidance built on one, from fewer than 4 values a side.
    assert repeats_to_resolve([1.0, 2.0], [1.0, 2.0], resolve_ns=1, level=0.95) == (None, None)
    assert repeats_to_resolve([1.0, 2.0, 3.0], [v * MS for v in a], resolve_ns=1, level=0.95) == (None, None)
    assert repeats_to_resolve([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], resolve_ns=1, level=0.95)[0] is not None
    lo, hi = bootstrap_median_difference([1.0] * 5, [3.0] * 5, resamples=200, rng=random.Random(0))
    assert lo == hi == 2.0  # no spread: the interval is the difference


def test_compare_cli_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck.cli import main

    rng = random.Random(5)
    pa = write_records(records(sample(rng, 8, 100.0)), tmp_path / "a.jsonl")
    pb = write_records(records(sample(rng, 8, 125.0)), tmp_path / "b.jsonl")
    assert main(["study", "compare", str(pa), str(pb), "--seed", "3", "--resamples", "500"]) == 0
    out = capsys.readouterr().out
    assert "they DIFFER at 95%" in out and "runs per side to resolve 5 ms" in out
    assert main(["--json", "study", "compare", str(pa), str(pb), "--level", "0.9", "--measure", "zombie"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == COMPARE_SCHEMA and doc["version"] == 1 and doc["level"] == 0.9
    assert doc["measure"] == "zombie" and doc["cells"][0]["differ"] is False  # zombie is 2 ms in both
    assert main(["study", "compare", str(pa), str(tmp_path / "missing.jsonl")]) == 2


def test_across_compares_conditions_that_differ_in_a_cell_part() -> None:
    rng = random.Random(9)
    exits = records(sample(rng, 10, 100.0), ending="exit")
    frees = records(sample(rng, 10, 130.0), ending="free")
    assert compare_records(exits, frees).cells == ()  # different endings: nothing matches
    c = compare_records(exits, frees, across=("ending",), seed=2)
    (cell,) = c.cells
    assert cell.ending == "*" and cell.differ is True and c.across == ("ending",)
    assert "compared across ending" in format_comparison(c) and "alloc 1.0 GiB * GPU 0" in format_comparison(c)
    with pytest.raises(ValueError, match="cannot compare across"):
        compare_records(exits, frees, across=("colour",))
