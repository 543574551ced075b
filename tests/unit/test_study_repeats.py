"""A run given twice (a file named twice, or a file and the one its records were appended to) is refused by ``study
fit`` (it would weigh double) and within a side of ``study compare`` (it would narrow the interval); two sides that
share runs are compared with a note that they are not independent."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmlcheck.cli import main
from nvmlcheck.study import DeviceRun, RunRecord, write_records
from nvmlcheck.study.compare import compare_records
from nvmlcheck.study.fit import fit_report
from nvmlcheck.study.records import repeated_run

GIB = 1 << 30
MS = 1_000_000


def _runs(y_ms: float, n: int = 5, start: int = 0) -> list[RunRecord]:
    out = []
    for i in range(start, start + n):
        v = round((y_ms + i) * MS)
        device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + i, baseline_used_bytes=0,
                           held_bytes=GIB, signal_ns=0, last_held_ns=None, first_clean_ns=v, off_list_ns=v,
                           memory_back_ns=v, waitpid_ns=v, exit_status=-9)
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=GIB, ending="KILL", mode="precise",
                             backend="nvml", driver="580.159.04", nvmlcheck="0", wall_time=1e9 + i, timed_out=False,
                             timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1, poll_cost_ns=1,
                             devices=(device,), simulated=False))
    return out


def test_a_run_found_twice() -> None:
    runs = _runs(100.0)
    assert repeated_run(runs) is None and repeated_run([*runs, runs[2]]) == (2, 5)


def test_fit_refuses_a_run_given_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = _runs(100.0)
    with pytest.raises(ValueError, match=r"run 0 .* twice \(records 1 and 6\).*weigh double"):
        fit_report(runs + runs)
    path = write_records(runs, tmp_path / "runs.jsonl")
    assert main(["study", "fit", str(path), str(path)]) == 2
    assert "twice" in capsys.readouterr().err
    assert main(["study", "fit", str(path)]) == 0


def test_compare_refuses_a_side_with_a_run_twice_and_notes_shared_runs() -> None:
    a, b = _runs(100.0), _runs(130.0, start=10)
    with pytest.raises(ValueError, match=r"B holds run 10 .* twice"):
        compare_records(a, b + b[:1], seed=1)
    c = compare_records(a, a + b, seed=1, across=())
    assert any("share 5 measured runs" in note for note in c.notes)
    assert not any("share" in note for note in compare_records(a, b, seed=1).notes)
