"""Study inputs an adversary (or a slip of the keyboard) gives: empty record files, integers too large for any
measurement, a bootstrap count that would run for days, an empty --out or --plot, a driver that is no version. Each
is an error naming what is wrong (exit 2), never a traceback, a silent empty study, or a hang."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.study import DeviceRun, RecordFormatError, RunRecord, write_records
from nvmlcheck.study.compare import compare_records, format_comparison
from nvmlcheck.study.fit import fit_report

MS = 1_000_000
GIB = 1 << 30


def _records(values_ms: list[float], **run: Any) -> list[RunRecord]:
    out = []
    for n, v in enumerate(values_ms):
        device = DeviceRun(index=0, uuid="GPU-0", name="H200", pid=100 + n, baseline_used_bytes=0, held_bytes=GIB,
                           signal_ns=0, last_held_ns=None, first_clean_ns=round(v * MS), off_list_ns=round(v * MS),
                           memory_back_ns=round(v * MS), waitpid_ns=None, exit_status=-9)
        fields: dict[str, Any] = {"holder": "alloc", "simulated": False, **run}
        out.append(RunRecord(run=n, repeat=n, warmup=False, size_bytes=GIB, ending="KILL", mode="precise",
                             backend="nvml", driver="580.159.04", nvmlcheck="0", wall_time=0.0, timed_out=False,
                             timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1, poll_cost_ns=1,
                             devices=(device,), **fields))
    return out


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
@pytest.mark.parametrize("command", ["compare", "fit"])
def test_an_empty_record_file_is_an_error_not_an_empty_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, command: str
) -> None:
    good = write_records(_records([100.0] * 4), tmp_path / "good.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content, encoding="utf-8")
    argv = ["study", "compare", str(empty), str(good)] if command == "compare" else ["study", "fit", str(empty)]
    assert f"{empty}: no run records" in _error(capsys, *argv)


@pytest.mark.parametrize(("where", "name", "value"), [
    ("run", "holder_count", 10**300), ("run", "size_bytes", 2**63), ("run", "pinned_bytes", 10**40),
    ("run", "importers", 2**64), ("device", "memory_back_ns", 10**30), ("device", "held_bytes", -(2**63)),
])
def test_an_integer_beyond_64_bits_is_refused(where: str, name: str, value: int) -> None:
    doc = _records([100.0])[0].to_json()
    (doc if where == "run" else doc["devices"][0])[name] = value
    field = ("devices\\[0\\]." if where == "device" else "") + name
    with pytest.raises(RecordFormatError, match=rf"'{field}': expected an integer of magnitude below 2\*\*63"):
        RunRecord.from_json(json.loads(json.dumps(doc)))


def test_fit_of_a_huge_count_is_an_error_not_an_overflow(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It was: OverflowError (cannot convert float infinity to integer), a traceback and exit 1."""
    docs = [r.to_json() for r in _records([100.0, 120.0, 140.0], holder="contexts")]
    for n, d in enumerate(docs):
        d["holder_count"] = 10 ** (100 + n)
    path = tmp_path / "huge.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs), encoding="utf-8")
    assert "'holder_count'" in _error(capsys, "study", "fit", str(path))


def test_the_largest_integers_a_record_may_hold_still_fit() -> None:
    runs = [r for n, c in enumerate((2**62, 2**61, 2**60)) for r in _records([100.0 + n, 100.5 + n],
                                                                            holder="contexts", holder_count=c)]
    assert fit_report(runs).n == 6  # 2 coefficients: at least 5 runs for an error


def test_a_bootstrap_count_that_would_run_for_days_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    class Unread(list[RunRecord]):
        """Records that must not be read: the count is refused first (the old code resampled for days)."""

        def __iter__(self) -> Any:
            raise AssertionError("the records were read: the count was not refused first")

    with pytest.raises(ValueError, match=r"resamples must be within 100\.\.1_000_000"):
        compare_records(Unread(_records([100.0] * 4)), _records([100.0] * 4), resamples=10**11)
    path = write_records(_records([100.0]), tmp_path / "a.jsonl")  # one run: no bootstrap, whatever the count
    for count in ("99999999999", "50"):
        assert "--resamples must be within 100..1000000" in _error(capsys, "study", "compare", str(path), str(path),
                                                                   "--resamples", count)


@pytest.mark.parametrize("option", ["--out=", "--plot="])
def test_an_empty_out_or_plot_is_named_as_empty(capsys: pytest.CaptureFixture[str], option: str) -> None:
    err = _error(capsys, "--simulate", "h200", "study", "reclaim", "--sizes", "1MiB", "--repeats", "1",
                 "--no-warmup", option)
    assert f"{option.rstrip('=')} needs a" in err and "got an empty one" in err


@pytest.mark.parametrize("driver", ["", ".", "abc", "580.", "9" * 5000, "580 ; rm"])
def test_fit_refuses_a_driver_that_is_no_version(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 driver: str) -> None:
    path = write_records(_records([100.0, 110.0]), tmp_path / "a.jsonl")
    err = _error(capsys, "study", "fit", str(path), f"--driver={driver}")
    assert "is not a driver version" in err and len(err) < 300
    assert fit_report(_records([100.0, 110.0, 105.0, 95.0]), driver="580.159.04").model.driver == "580"


def test_a_study_of_a_mistyped_number_of_repeats_is_refused_before_any_plan_is_built() -> None:
    from nvmlcheck.study import StudyConfig
    from nvmlcheck.study.config import MAX_RUNS

    with pytest.raises(ValueError, match=r"would plan about 2,000,000,002 runs"):
        StudyConfig(sizes=(1 << 30,), endings=("KILL", "TERM"), repeats=1_000_000_000)
    assert StudyConfig(sizes=(1 << 30,), endings=("KILL",), repeats=MAX_RUNS - 1).repeats == MAX_RUNS - 1


def test_a_cell_without_values_says_why_its_runs_have_none() -> None:
    """A measure the runs did not record (phases not watched, a phase not seen) read "too few values to tell (A 0,
    B 0)": as if the cell had no runs. It now counts the GPU-runs with no value and gives the records' reasons."""
    def unwatched(runs: list[RunRecord]) -> list[RunRecord]:
        return [dataclasses.replace(r, devices=tuple(
            dataclasses.replace(d, unknown={"zombie": "phases not watched (phases=False)"}) for d in r.devices))
            for r in runs]

    a = unwatched(_records([100.0] * 5))
    b = _records([100.0] * 3)
    b = [dataclasses.replace(r, run=10 + n) for n, r in enumerate(b)]
    (cell,) = compare_records(a, b, measure="zombie").cells
    assert cell.n_a == cell.n_b == 0 and cell.differ is None and cell.why is not None
    assert "A: 5 GPU-runs with no zombie time (phases not watched (phases=False))" in cell.why
    assert "B: 3 GPU-runs with no zombie time (not recorded)" in cell.why
    (full,) = compare_records(a, b).cells  # memory_back: every run has it, nothing to explain
    assert full.why == "too few values to tell (A 5, B 3; at least 4 each)"


def test_timed_out_runs_are_counted_not_silently_dropped_from_a_comparison() -> None:
    """Timed-out runs (memory not back within the run timeout: the slowest outcome) were dropped without a word:
    a B whose slow runs all timed out read as fast as A from the runs left, and a side whose runs all timed out
    made the cell "only in" the other side. They are now counted per cell and side, and said."""
    a = _records([100.0] * 5)
    b = [dataclasses.replace(r, run=10 + n, timed_out=n < 3, timeout_reason="x" if n < 3 else None)
         for n, r in enumerate(_records([100.0] * 7))]
    (cell,) = compare_records(a, b).cells
    assert (cell.n_a, cell.n_b, cell.timed_out_a, cell.timed_out_b) == (5, 4, 0, 3)
    assert cell.to_json()["timed_out_b"] == 3
    text = format_comparison(compare_records(a, b))
    assert "timed out: A 0, B 3 GPU-runs, left out" in text
    every = [dataclasses.replace(r, timed_out=True, timeout_reason="x") for r in a]
    c = compare_records(every, b)
    assert c.only_b == () and c.cells[0].n_a == 0 and c.cells[0].timed_out_a == 5 and c.cells[0].differ is None
    assert "timed out" not in (c.cells[0].why or "")  # said once, on its own line


@pytest.mark.parametrize(("change", "said"), [
    ({"timed_out": True, "timeout_reason": "x"}, "5 runs left out: timed out"),
    ({"warmup": True}, "5 warm-up runs (never fitted)"),
])
def test_fit_of_runs_none_of_which_can_be_fitted_says_what_they_were(change: dict[str, Any], said: str) -> None:
    # "no measured run of the kinds alloc, ... to fit" for 5 alloc KILL runs that had all timed out (or were
    # warm-ups): the runs were there, and why none could be fitted was not said.
    runs = [dataclasses.replace(r, **change) for r in _records([100.0] * 5)]
    with pytest.raises(ValueError, match="no measured run") as info:
        fit_report(runs)
    assert said in str(info.value)


def test_a_fit_with_timed_out_runs_says_its_error_understates_them() -> None:
    # 5 runs at ~100 ms and 5 that timed out (memory not back in 30 s): the fit gave error_ns 20 ms and said only
    # "left out: 5 runs (timed out)", as if the error covered the teardowns measured.
    done = _records([100.0, 110.0, 120.0, 130.0, 140.0])
    timed = [dataclasses.replace(r, run=10 + n, timed_out=True, timeout_reason="x") for n, r in enumerate(done)]
    result = fit_report([*done, *timed])
    assert result.excluded == {"timed out": 5}
    assert any("5 runs of the kinds and endings fitted timed out (memory not back within 30 s" in n
               for n in result.notes)
    assert not any("timed out" in n for n in fit_report(done).notes)
