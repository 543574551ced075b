"""The summary gives no spread it did not measure: with 1, 2 or 3 values a p10 and p90 would be points interpolated
between the min, the median and the max (no value lies between them and the median), so they are ``None`` with a
reason, ``-`` in the table and ``null`` in JSON; from 4 values (the least ``study compare`` judges a spread on) they
are given."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvmlcheck.study import DeviceRun, RunRecord, Stats, format_summary, summarize
from nvmlcheck.study.summary import SPREAD_MIN_N

GIB = 1 << 30
MS = 1_000_000


def _runs(values_ms: list[float]) -> list[RunRecord]:
    out = []
    for i, y in enumerate(values_ms):
        v = round(y * MS)
        device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + i, baseline_used_bytes=0,
                           held_bytes=GIB, signal_ns=0, last_held_ns=None, first_clean_ns=v, off_list_ns=v,
                           memory_back_ns=v, waitpid_ns=v, exit_status=-9)
        fields: dict[str, Any] = {"simulated": False}
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=GIB, ending="KILL", mode="precise",
                             backend="nvml", driver="580.159.04", nvmlcheck="0", wall_time=0.0, timed_out=False,
                             timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=40_000,
                             poll_cost_ns=1, devices=(device,), **fields))
    return out


@pytest.mark.parametrize("values", [[100.0], [100.0, 200.0], [100.0, 150.0, 200.0]])
def test_too_few_values_give_no_p10_or_p90(values: list[float]) -> None:
    (row,) = summarize(_runs(values))
    mb = row.memory_back
    assert mb is not None and mb.n == len(values) < SPREAD_MIN_N
    assert mb.p10 is None and mb.p90 is None and set(mb.unknown) == {"p10", "p90"}
    assert "fewer than 4" in mb.unknown["p10"]
    assert (mb.min, mb.max) == (min(values) * MS, max(values) * MS)
    doc = json.loads(json.dumps(row.to_json()))["memory_back"]
    assert doc["p10"] is None and doc["p90"] is None and doc["unknown"]["p90"]
    text = format_summary([row])
    # No interpolated figure (with 2 values it used to print 110.0 and 190.0, no run's time):
    assert "110.0" not in text and "190.0" not in text
    line = next(ln for ln in text.splitlines() if "memory back" in ln)
    assert line.split()[-5:] == [f"{min(values):.1f}", "-", f"{mb.median / MS:.1f}", "-",
                                 f"{max(values):.1f}"]
    assert "p10/p90 '-': fewer than 4 values" in text


def test_four_values_give_p10_and_p90() -> None:
    (row,) = summarize(_runs([100.0, 110.0, 120.0, 130.0]))
    mb = row.memory_back
    assert mb is not None and mb.unknown == {}
    assert mb.p10 == pytest.approx(103 * MS) and mb.p90 == pytest.approx(127 * MS)
    assert "p10/p90 '-'" not in format_summary([row])


def test_stats_of_one_value() -> None:
    s = Stats.of([5])
    assert s is not None and (s.n, s.min, s.median, s.max, s.p10, s.p90) == (1, 5.0, 5.0, 5.0, None, None)
    assert Stats.of([]) is None



def test_a_study_of_warm_ups_only_prints_no_empty_table(capsys: pytest.CaptureFixture[str]) -> None:
    # A budget spent after the first warm-up: no measured run. It printed the table's head with no row under it.
    import argparse
    from dataclasses import replace

    from nvmlcheck.cli._study import _print_study
    from nvmlcheck.study import StudyConfig, StudyResult

    warm = replace(_runs([100.0])[0], warmup=True)
    result = StudyResult(StudyConfig(sizes=(GIB,), repeats=3, endings=("KILL",)), (warm,), "time budget spent")
    args = argparse.Namespace(out=None, simulate=None)
    _print_study(args, result, summarize(result.records), [])
    out = capsys.readouterr().out
    assert "0 measured runs + 1 warm-ups" in out
    assert "no measured run: only warm-ups" in out and "signal ->" not in out
