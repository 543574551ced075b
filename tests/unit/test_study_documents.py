"""A file given to ``study compare``/``study fit`` that is a ``--json`` document rather than JSON Lines records: the
document of ``study reclaim --json`` is read (its records); another (``study compare --json``'s ``compare-*.json``,
``study fit --json``'s) is refused naming its schema, its version and what to give instead, not with a JSON parse
error at line 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvmlcheck.cli import main
from nvmlcheck.jsonout import compare_document, study_reclaim_document
from nvmlcheck.study import DeviceRun, RecordFormatError, RunRecord, StudyConfig, load_records, summarize
from nvmlcheck.study.compare import compare_records
from nvmlcheck.study.runner import StudyResult

GIB = 1 << 30
MS = 1_000_000


def _runs(y_ms: float, n: int = 4) -> list[RunRecord]:
    out = []
    for i in range(n):
        v = round((y_ms + i) * MS)
        device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + i, baseline_used_bytes=0,
                           held_bytes=GIB, signal_ns=0, last_held_ns=None, first_clean_ns=v, off_list_ns=v,
                           memory_back_ns=v, waitpid_ns=v, exit_status=-9)
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=GIB, ending="KILL", mode="precise",
                             backend="nvml", driver="580.159.04", nvmlcheck="0", wall_time=float(i), timed_out=False,
                             timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1, poll_cost_ns=1,
                             devices=(device,), simulated=False))
    return out


def _reclaim_document(runs: list[RunRecord]) -> dict[str, object]:
    result = StudyResult(StudyConfig(sizes=(GIB,), repeats=len(runs), endings=("KILL",)), tuple(runs), None)
    return study_reclaim_document(result, summarize(runs), out=None, plots=[])


@pytest.mark.parametrize("indent", [1, None])
def test_the_document_of_study_reclaim_json_is_read_as_its_records(tmp_path: Path, indent: int | None) -> None:
    runs = _runs(100.0)
    path = tmp_path / "study.json"
    path.write_text(json.dumps(_reclaim_document(runs), indent=indent) + "\n", encoding="utf-8")
    assert load_records(path) == runs


def test_a_compare_document_is_refused_naming_its_schema_version_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "compare-a-vs-b.json"
    doc = compare_document(compare_records(_runs(100.0), _runs(120.0), seed=1), "a.jsonl", "b.jsonl")
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    with pytest.raises(RecordFormatError, match=r"an nvmlcheck/study-compare document \(version 1: the output of "
                                                r"study compare --json\), not run records: give the JSON Lines file"):
        load_records(path)
    records = tmp_path / "b.jsonl"
    records.write_text("\n".join(r.to_line() for r in _runs(100.0)) + "\n", encoding="utf-8")
    assert main(["study", "compare", str(path), str(records)]) == 2
    assert "study-compare document" in capsys.readouterr().err


def test_a_newer_reclaim_document_or_a_broken_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "study.json"
    path.write_text(json.dumps({**_reclaim_document(_runs(100.0)), "version": 2}, indent=1), encoding="utf-8")
    with pytest.raises(RecordFormatError, match="version 2: this nvmlcheck reads version 1"):
        load_records(path)
    path.write_text(json.dumps({**_reclaim_document(_runs(100.0)), "records": [{"schema": "x"}]}), encoding="utf-8")
    with pytest.raises(RecordFormatError, match=r"records\[0\]: not a reclamation run record"):
        load_records(path)
    path.write_text('{\n "schema": "nvmlcheck/reclaim-run",\n "version": \n', encoding="utf-8")  # no document
    with pytest.raises(RecordFormatError, match=r"study.json:1: Expecting"):
        load_records(path)


def test_the_studys_table_given_as_records_says_what_to_give(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # `study reclaim > out.txt`, then `study fit out.txt`: json's "Extra data: line 1 column 3" said nothing of why.
    path = tmp_path / "out.txt"
    path.write_text("2 measured runs + 0 warm-ups on GPU 0 (NVIDIA H200); backend nvml\n"
                    "size      ending signal ->        n      min\n", encoding="utf-8")
    with pytest.raises(RecordFormatError, match=r"out.txt:1: not JSON .*study reclaim --out FILE.jsonl.*--json"):
        load_records(path)
    assert main(["study", "fit", str(path)]) == 2
    assert "study reclaim --out FILE.jsonl" in capsys.readouterr().err
