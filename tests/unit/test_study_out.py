"""``--out`` (``record_writer``, ``write_records``) leaves complete records or none: a study that ends before its first
record leaves the file as it was; a line interrupted by a signal or a full disk is cut back, so the file never holds
half a record; and a file whose last line was cut short by a kill is named as such when read."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.study import DeviceRun, RecordFormatError, RunRecord, load_records, record_writer, write_records
from nvmlcheck.study import records as records_module

GIB = 1 << 30


def _record(n: int, trace_rows: int = 0) -> RunRecord:
    device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + n, baseline_used_bytes=0,
                       held_bytes=GIB, signal_ns=0, last_held_ns=None, first_clean_ns=10, off_list_ns=10,
                       memory_back_ns=10, waitpid_ns=10, exit_status=-9)
    trace = tuple((i, GIB, 1) for i in range(trace_rows)) or None
    return RunRecord(run=n, repeat=n, warmup=False, size_bytes=GIB, ending="KILL", mode="precise", backend="nvml",
                     driver="580.159.04", nvmlcheck="0", wall_time=0.0, timed_out=False, timeout_s=30.0,
                     timeout_reason=None, polls=10, poll_interval_ns=1, poll_cost_ns=1, devices=(device,),
                     trace_columns=("offset_ns", "used_bytes[0]", "process_count[0]") if trace else None,
                     trace=trace, simulated=False)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial"))


def test_a_study_that_ends_before_its_first_record_leaves_out_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    out.write_text("yesterday's study\n", encoding="utf-8")
    with pytest.raises(KeyboardInterrupt), record_writer(out):
        raise KeyboardInterrupt  # refused at the baseline, skipped, interrupted: no record
    assert out.read_text(encoding="utf-8") == "yesterday's study\n" and _leftovers(tmp_path) == []


class _Flaky:
    """``os.write`` that, on its ``fail_on``-th call for the record file, writes a part of the data and then
    raises ``error`` (the exception a signal's handler raises, or a full disk)."""

    def __init__(self, fail_on: int, error: BaseException) -> None:
        self.calls, self.fail_on, self.error = 0, fail_on, error
        self.real = os.write

    def __call__(self, fd: int, data: Any) -> int:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            self.calls += 1
            if self.calls == self.fail_on:
                self.real(fd, bytes(data[: len(data) // 2]))
                raise self.error
        return self.real(fd, data)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(errno.ENOSPC, "No space left on device")])
def test_a_line_interrupted_midway_is_cut_back_to_the_complete_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    out = tmp_path / "runs.jsonl"
    flaky = _Flaky(fail_on=3, error=error)
    monkeypatch.setattr(os, "write", flaky)
    with record_writer(out) as write:
        write(_record(0, trace_rows=500))
        write(_record(1, trace_rows=500))
        with pytest.raises(type(error)):
            write(_record(2, trace_rows=500))
        assert [r.run for r in load_records(out)] == [0, 1]  # never half a record, even while it runs
        write(_record(3))  # written on from the last complete line: no hole, no remnant
    monkeypatch.undo()
    assert [r.run for r in load_records(out)] == [0, 1, 3] and _leftovers(tmp_path) == []


def test_write_records_replaces_the_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = write_records([_record(0)], tmp_path / "runs.jsonl")
    os.chmod(out, 0o640)
    monkeypatch.setattr(os, "write", _Flaky(fail_on=2, error=KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_records([_record(1), _record(2)], out)
    monkeypatch.undo()
    assert [r.run for r in load_records(out)] == [0] and _leftovers(tmp_path) == []
    write_records([_record(1), _record(2)], out)
    assert [r.run for r in load_records(out)] == [1, 2] and stat.S_IMODE(out.stat().st_mode) == 0o640
    link = tmp_path / "link.jsonl"
    link.symlink_to(out)
    write_records([_record(5)], link)  # through the link, as opening it would
    assert link.is_symlink() and [r.run for r in load_records(out)] == [5]


def test_a_last_line_cut_short_by_a_kill_is_named_with_the_fix(tmp_path: Path) -> None:
    out = write_records([_record(0), _record(1)], tmp_path / "runs.jsonl")
    whole = out.read_bytes()
    out.write_bytes(whole + _record(2).to_line().encode()[:40])
    with pytest.raises(RecordFormatError, match=r"runs.jsonl:3: the last line is cut short .*the 2 lines before it"):
        load_records(out)
    out.write_bytes(whole + _record(2).to_line().encode())  # a whole last record without its newline is read
    assert [r.run for r in load_records(out)] == [0, 1, 2]
    out.write_bytes(whole[:-1] + b"}\n")  # a corrupt line that is not the last: the usual error
    with pytest.raises(RecordFormatError, match=r"runs.jsonl:2: (?!the last line)"):
        load_records(out)


def test_a_study_refused_at_its_baseline_leaves_out_as_it_was(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck import cli

    out = tmp_path / "runs.jsonl"
    kept = write_records([_record(0)], out).read_bytes()
    # h200-busy: a process holds GPU 0, so the study refuses to start (exit 1) before its first record
    assert cli.main(["--simulate", "h200-busy", "study", "reclaim", "--devices", "0", "--sizes", "1MiB", "--repeats",
                     "1", "--endings", "KILL", "--no-warmup", "--no-phases", "--out", str(out)]) == 1
    assert "not clean" in capsys.readouterr().err
    assert out.read_bytes() == kept and _leftovers(tmp_path) == []


def test_a_line_too_long_to_be_a_record_is_refused_before_it_fills_the_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(records_module, "MAX_LINE_BYTES", 4096)
    with pytest.raises(RecordFormatError, match=r"/dev/zero:1: a line longer than"):
        load_records("/dev/zero")  # no newline, ever: read up to the limit, not forever
    big = write_records([_record(0), _record(1, trace_rows=400)], tmp_path / "runs.jsonl")
    with pytest.raises(RecordFormatError, match=r"runs.jsonl:2: a line longer than"):
        load_records(big)
    monkeypatch.undo()
    assert len(load_records(big)) == 2


@pytest.mark.parametrize(("kinds", "match"), [("aloc", "unknown holder kind 'aloc'"), (",", "--kinds: no kind")])
def test_fit_kinds_that_name_no_kind_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], kinds: str,
                                                 match: str) -> None:
    from nvmlcheck import cli

    path = write_records([_record(0)], tmp_path / "runs.jsonl")
    assert cli.main(["study", "fit", str(path), "--kinds", kinds]) == 2
    assert match in capsys.readouterr().err


def test_a_writable_file_in_a_directory_that_takes_no_new_file_is_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = write_records([_record(0)], tmp_path / "runs.jsonl")

    def no_new_file(**_: Any) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", no_new_file)
    with pytest.raises(KeyboardInterrupt), record_writer(out):
        raise KeyboardInterrupt  # no record: the file is left as it was
    assert [r.run for r in load_records(out)] == [0]
    with record_writer(out) as write:
        write(_record(1))
        write(_record(2))
    assert [r.run for r in load_records(out)] == [1, 2]
    with pytest.raises(PermissionError):
        write_records([_record(3)], tmp_path / "new.jsonl")  # a new file cannot be made there at all


def test_an_out_replaced_by_another_writer_stops_the_writing_and_keeps_the_records(tmp_path: Path) -> None:
    out = tmp_path / "runs.jsonl"
    with record_writer(out) as write:
        write(_record(0))
        write(_record(1))
        write_records([_record(7)], out)  # another study with the same --out renamed its file over ours
        with pytest.raises(OSError, match=r"replaced or removed by another process .*records written so far are in"):
            write(_record(2))
    kept = Path(f"{out}.{os.getpid()}")
    assert [r.run for r in load_records(kept)] == [0, 1] and [r.run for r in load_records(out)] == [7]


@pytest.mark.parametrize("case", [
    (3, KeyboardInterrupt(), 130, "interrupted"),
    (2, OSError(errno.ENOSPC, "No space left on device"), 3, "cannot write record 3: No space left on device"),
])
def test_a_study_stopped_midway_says_what_out_keeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str],
                                                   case: tuple[int, BaseException, int, str]) -> None:
    """Ctrl-C or a full disk after some runs: the error says how many whole records ``--out`` keeps (it said only
    ``interrupted``, leaving the researcher to guess whether the file was kept, cut or lost)."""
    from nvmlcheck import cli

    fail_at, error, code, says = case
    out = tmp_path / "runs.jsonl"
    writes = {"n": 0}
    real = os.write

    def flaky(fd: int, data: Any) -> int:
        if stat.S_ISREG(os.fstat(fd).st_mode) and fd > 2:
            writes["n"] += 1
            if writes["n"] == fail_at + 1:
                raise error
        return real(fd, data)

    monkeypatch.setattr(os, "write", flaky)
    argv = ["--simulate", "h200", "study", "reclaim", "--sizes", "1MiB", "--repeats", "5", "--endings", "KILL",
            "--no-warmup", "--no-phases", "--out", str(out)]
    assert cli.main(argv) == code
    err = capsys.readouterr().err
    monkeypatch.undo()
    assert says in err
    assert f"{out} keeps the {fail_at} records of the runs finished, each whole" in err
    assert [r.run for r in load_records(out)] == list(range(fail_at))
