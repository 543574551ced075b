"""Study inputs that are not what they claim (issue 27, item 7): records of the wrong shape or type, absurd option
values, an ``--out`` that is not a file. Every one is an error naming the file and line (or the option), exit 2, the
same in human and ``--json`` modes; never a traceback, never a value silently taken for another."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvmlcheck import cli
from nvmlcheck.study import DeviceRun, RecordFormatError, RunRecord, StudyError, load_records, write_records

MS = 1_000_000
GIB = 1 << 30


def _records(values_ms: list[float], gpus: int = 1) -> list[RunRecord]:
    out = []
    for n, v in enumerate(values_ms):
        devices = tuple(
            DeviceRun(index=i, uuid=f"GPU-{i}", name="H200", pid=100 + n, baseline_used_bytes=0, held_bytes=GIB,
                      signal_ns=0, last_held_ns=None, first_clean_ns=round(v * MS), off_list_ns=round(v * MS),
                      memory_back_ns=round(v * MS), waitpid_ns=None, exit_status=-9)
            for i in range(gpus))
        out.append(RunRecord(run=n, repeat=n, warmup=False, size_bytes=GIB, ending="KILL", mode="precise",
                             backend="nvml", driver="580", nvmlcheck="0", wall_time=0.0, timed_out=False,
                             timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1, poll_cost_ns=1,
                             devices=devices))
    return out


GOOD = _records([100.0])[0].to_json()


def _write(tmp_path: Path, docs: list[Any], name: str = "runs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((d if isinstance(d, str) else json.dumps(d)) + "\n" for d in docs), encoding="utf-8")
    return path


def _device(**changes: Any) -> dict[str, Any]:
    return {**GOOD, "devices": [{**GOOD["devices"][0], **changes}]}


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({**GOOD, "devices": ["GPU-0", "GPU-1"]}, r"'devices\[0\]': expected an object, got \"GPU-0\""),
        ({**GOOD, "devices": {"index": 0}}, r"'devices': expected a non-empty list of objects"),
        ({**GOOD, "devices": []}, r"'devices': expected a non-empty list"),
        (_device(memory_back_ns=True), r"'devices\[0\]\.memory_back_ns': expected an integer >= 0 or null, got true"),
        (_device(first_clean_ns=-5), r"'devices\[0\]\.first_clean_ns': expected an integer >= 0"),
        (_device(off_list_ns=1.5), r"'devices\[0\]\.off_list_ns': expected an integer"),
        (_device(last_held_ns=-1), r"last_held_ns': -1 is before the run's origin"),
        (_device(index="0"), r"'devices\[0\]\.index': expected an integer >= 0, got \"0\""),
        (_device(unknown={"waitpid": 3}), r"'devices\[0\]\.unknown': expected an object of strings"),
        ({**GOOD, "warmup": "no"}, r"'warmup': expected true or false, got \"no\""),
        ({**GOOD, "timed_out": 0}, r"'timed_out': expected true or false, got 0"),
        ({**GOOD, "polls": False}, r"'polls': expected an integer >= 0, got false"),
        ({**GOOD, "size_bytes": -1}, r"'size_bytes': expected an integer >= 0"),
        ({**GOOD, "timeout_s": "30"}, r"'timeout_s': expected a finite number >= 0"),
        ({**GOOD, "ending": "HUP"}, r"'ending': unknown ending 'HUP'"),
        ({**GOOD, "ending": 9}, r"'ending': expected a string"),
        ({**GOOD, "concurrent": "all"}, r"'concurrent': expected 'gpus' or 'none'"),
        ({**GOOD, "trace_columns": ["offset_ns", "used"], "trace": [[0, 1, 2]]}, r"'trace\[0\]': 3 values for 2"),
        ({**GOOD, "trace": [[0, -4]]}, r"'trace\[0\]': expected integers >= 0 or null"),
        ({**GOOD, "events": [1]}, r"'events': expected a list of objects or null"),
        ({k: v for k, v in GOOD.items() if k != "polls"}, r"missing field 'polls'"),
        # A device's field was named with its quote inside the path: "missing field devices[0].'pid'"
        (_device(pid=None), r"'devices\[0\]\.pid': expected an integer >= 1"),
        ({**GOOD, "devices": [{k: v for k, v in GOOD["devices"][0].items() if k != "pid"}]},
         r"missing field 'devices\[0\]\.pid'"),
        ('{"schema": "nvmlcheck/reclaim-run", "version": 1, "wall_time": NaN}', r"NaN is not a number"),
        (json.dumps(GOOD).replace('"wall_time": 0.0', '"wall_time": Infinity'), r"Infinity is not a number"),
    ],
)
def test_a_bad_record_names_its_file_line_and_field(tmp_path: Path, doc: Any, match: str) -> None:
    path = _write(tmp_path, [GOOD, doc])
    with pytest.raises(RecordFormatError, match=rf"runs\.jsonl:2: .*{match}"):
        load_records(path)


def test_bytes_that_are_not_utf8_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\n" + b'{"schema": "\xff"}\n')
    with pytest.raises(RecordFormatError, match=r"runs\.jsonl:3: not UTF-8"):
        load_records(path)


def test_a_good_record_still_round_trips(tmp_path: Path) -> None:
    records = _records([100.0, 120.0], gpus=2)
    assert load_records(write_records(records, tmp_path / "ok.jsonl")) == records


# --- the CLI: exit 2, the same in both modes ---------------------------------------------------------------------


def _both_modes(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run in human and JSON modes; the exit codes must agree; returns it and the error message (both modes')."""
    code = cli.main(list(argv))
    _, err = capsys.readouterr()
    json_code = cli.main(["--json", *argv])
    out, _ = capsys.readouterr()
    assert json_code == code, (code, json_code, err, out)
    doc = json.loads(out)
    if code == 0:
        return code, ""
    assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == code
    assert doc["error"]["message"] in err, (doc["error"]["message"], err)
    assert "Traceback" not in err
    return code, doc["error"]["message"]


@pytest.mark.parametrize("bad", [{**GOOD, "devices": ["a"]}, {**GOOD, "warmup": "no"}, _device(memory_back_ns=True)])
def test_compare_refuses_a_bad_record_in_both_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: dict[str, Any]
) -> None:
    a = write_records(_records([100.0] * 5), tmp_path / "a.jsonl")
    b = _write(tmp_path, [GOOD, bad], "b.jsonl")
    code, message = _both_modes(capsys, "study", "compare", str(a), str(b))
    assert code == 2 and f"{b}:2: field" in message


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-3", "1e-9", "1e308", "1e13"])  # 1e308: OverflowError
def test_compare_refuses_a_resolve_ms_that_is_not_a_finite_positive_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    a = write_records(_records([100.0] * 5), tmp_path / "a.jsonl")
    code, message = _both_modes(capsys, "study", "compare", str(a), str(a), f"--resolve-ms={value}")
    assert code == 2 and "--resolve-ms" in message and "must be a finite" in message


def test_compare_gives_the_same_verdict_in_both_modes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_records(_records([100.0, 101.0, 99.0, 100.5, 100.2, 99.7]), tmp_path / "a.jsonl")
    b = write_records(_records([130.0, 131.0, 129.0, 130.5, 130.2, 129.7]), tmp_path / "b.jsonl")
    assert cli.main(["study", "compare", str(a), str(b)]) == 0
    human, _ = capsys.readouterr()
    assert cli.main(["--json", "study", "compare", str(a), str(b)]) == 0
    (cell,) = json.loads(capsys.readouterr()[0])["cells"]
    assert cell["differ"] is True and "they DIFFER" in human


@pytest.mark.parametrize("out", ["DIR", "/proc/self/mem", "/dev/full", "MISSING/runs.jsonl"])
def test_study_reclaim_refuses_an_out_that_is_not_a_file_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str
) -> None:
    target = out.replace("DIR", str(tmp_path)).replace("MISSING", str(tmp_path / "missing"))
    code, message = _both_modes(capsys, "--simulate", "h200", "study", "reclaim", "--sizes", "1MiB", "--repeats",
                                "1", "--no-warmup", "--out", target)
    assert code == 2 and message.startswith(f"--out {target}:")


def test_a_record_that_cannot_be_written_stops_the_study_with_an_error_naming_out() -> None:
    from nvmlcheck.cli._study import _sink

    def full_disk(record: object) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(StudyError, match=r"--out runs\.jsonl: cannot write record 1: No space left on device"):
        _sink(full_disk, "runs.jsonl")(object())


# --- fuzzing the reader --------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)


def _fields_are_typed(r: RunRecord) -> None:
    assert isinstance(r.warmup, bool) and isinstance(r.timed_out, bool)
    for name in ("run", "repeat", "size_bytes", "polls", "poll_interval_ns", "poll_cost_ns", "poll_cost_max_ns"):
        value = getattr(r, name)
        assert isinstance(value, int) and not isinstance(value, bool) and value >= 0, name
    assert math.isfinite(r.wall_time) and math.isfinite(r.timeout_s)
    for d in r.devices:
        for name in ("first_clean_ns", "off_list_ns", "memory_back_ns", "waitpid_ns", "zombie_ns", "exited_ns"):
            value = getattr(d, name)
            assert value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0), name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    top=st.sampled_from(sorted(GOOD)), top_value=JSON_VALUES,
    field=st.sampled_from(sorted(GOOD["devices"][0])), value=JSON_VALUES, where=st.sampled_from(["run", "device"]),
)
def test_fuzz_one_field_changed_is_read_typed_or_refused(
    top: str, top_value: Any, field: str, value: Any, where: str
) -> None:
    doc = json.loads(json.dumps(GOOD))
    if where == "run":
        doc[top] = top_value
    else:
        doc["devices"][0][field] = value
    try:
        record = RunRecord.from_json(doc)
    except RecordFormatError:
        return
    _fields_are_typed(record)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=40) | JSON_VALUES.map(json.dumps), max_size=4))
def test_fuzz_any_file_is_records_or_a_record_format_error(tmp_path_factory: pytest.TempPathFactory,
                                                           lines: list[Any]) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "runs.jsonl"
    path.write_bytes(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines))
    try:
        records = load_records(path)
    except RecordFormatError as exc:
        assert "runs.jsonl:" in str(exc)
        return
    for r in records:
        _fields_are_typed(r)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0, -1, 10**19])
def test_compare_records_refuses_a_resolve_ns_that_is_not_a_finite_positive_time(value: float) -> None:
    from nvmlcheck.study.compare import compare_records

    runs = _records([100.0] * 5)
    with pytest.raises(ValueError, match="resolve_ns must be a finite number of ns"):  # NaN failed in math.ceil
        compare_records(runs, runs, resolve_ns=value)  # type: ignore[arg-type]


# --- errors name what the user typed: the options in the CLI, the fields in the library ------------------------------


def test_every_study_field_the_cli_sets_has_its_option_and_each_option_exists() -> None:
    import argparse
    import dataclasses

    from nvmlcheck.cli._parser import build_parser
    from nvmlcheck.cli._study import OPTION_OF_FIELD
    from nvmlcheck.study import StudyConfig

    not_options = {"settle_timeout_s", "tolerance_bytes", "stable_polls"}  # library-only: no option sets them
    assert set(OPTION_OF_FIELD) == {f.name for f in dataclasses.fields(StudyConfig)} - not_options
    parser = build_parser(only="study")
    study = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["study"]
    reclaim = next(a for a in study._actions if isinstance(a, argparse._SubParsersAction)).choices["reclaim"]
    options = {o for a in reclaim._actions for o in a.option_strings}
    assert set(OPTION_OF_FIELD.values()) <= options


@pytest.mark.parametrize(("argv", "said"), [
    (["--pinned", "8GiB"], "--pinned (pinned host memory) needs the pinned holder (--holder pinned)"),
    (["--importers", "1"], "--importers needs the ipc holder (--holder ipc)"),
    (["--kind", "ipc", "--importers", "17"], "--importers: at most 16"),
    (["--kind", "ipc", "--importers", "1", "--stage-gap", "40"], "--stage-gap (40 s) must be shorter than "
                                                                  "--run-timeout (30 s)"),
    (["--kind", "ipc", "--importers", "1", "--stage-gap", "5", "--run-timeout", "2"], "--run-timeout (2 s)"),
    (["--kind", "ipc", "--per-gpu", "2"], "--per-gpu must be 1"),
    (["--kind", "nccl", "--concurrent", "none"], "--concurrent must be 'gpus'"),
    (["--repeats", "100000000"], "(--repeats 100,000,000 of each condition)"),
    (["--device-files", "dev/nvidia*"], "--device-files: a device-file pattern is an absolute path glob"),
])
def test_study_reclaim_errors_name_the_options_typed(argv: list[str], said: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # "stage_gap_s (40 s) must be shorter than run_timeout_s" named fields the user never saw for --stage-gap 40.
    import re

    for json_mode in (False, True):
        code = cli.main([*(["--json"] if json_mode else []), "study", "reclaim", *argv])
        out, err = capsys.readouterr()
        message = json.loads(out)["error"]["message"] if json_mode else err
        assert code == 2, (out, err)
        assert said in message
        assert not re.search(r"\b[a-z]+_[a-z_]+\b", message.replace("nvidia*", "")), message  # no field name


def test_the_library_still_names_its_fields_after_the_cli_ran(capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck import ArgumentError
    from nvmlcheck.study import StudyConfig

    cli.main(["study", "reclaim", "--kind", "ipc", "--per-gpu", "2"])
    capsys.readouterr()
    with pytest.raises(ArgumentError, match=r"^stage_gap_s \(40 s\) must be shorter than run_timeout_s \(30 s\)"):
        StudyConfig(sizes=(GIB,), holder="ipc", importers=(1,), stage_gap_s=40.0)
    with pytest.raises(ArgumentError, match=r"^per_gpu must be"):
        StudyConfig(sizes=(GIB,), per_gpu=0)


@pytest.mark.parametrize(("argv", "sizes"), [
    (["--kind", "pinned", "--sizes", "0,1GiB", "--pinned", "1GiB"], (0, GIB)),
    (["--kind", "nccl", "--sizes", "0"], (0,)),
    (["--kind", "context", "--sizes", "0"], (0,)),
    (["--kind", "context"], (0,)),
])
def test_study_reclaim_takes_size_0_where_the_holder_does(argv: list[str], sizes: tuple[int, ...]) -> None:
    # The library takes size 0 for pinned (host memory only) and nccl; --sizes refused 0 for every kind.
    from nvmlcheck.cli._parser import build_parser
    from nvmlcheck.cli._study import _config

    args = build_parser(only="study").parse_args(["study", "reclaim", *argv])
    assert _config(args).sizes == sizes


def test_study_reclaim_refuses_size_0_for_a_holder_that_allocates(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["study", "reclaim", "--sizes", "0"]) == 2
    assert "--sizes 0: the alloc holder takes positive sizes" in capsys.readouterr().err
    assert cli.main(["study", "reclaim", "--kind", "context", "--sizes", "0,1GiB"]) == 2
    assert "--kind context allocates nothing" in capsys.readouterr().err


def test_a_refused_out_leaves_no_plot_directory_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # --plot's directory was made before --out was checked: a refused study left it behind (nothing half-done).
    import sys
    import types

    monkeypatch.setitem(sys.modules, "matplotlib", types.ModuleType("matplotlib"))
    plots = tmp_path / "plots"
    code = cli.main(["study", "reclaim", "--sizes", "1GiB", "--plot", str(plots),
                     "--out", str(tmp_path / "missing" / "runs.jsonl")])
    assert code == 2 and "--out" in capsys.readouterr().err
    assert not plots.exists()


def test_a_records_file_named_in_bytes_that_are_not_utf8_is_shown_escaped(tmp_path: Path) -> None:
    # "A = r\udcff.jsonl" on a strict UTF-8 stdout (a UTF-8 locale) ended the comparison with exit 2, "'utf-8' codec
    # can't encode character '\udcff'"; on a surrogate-escaping one it wrote the raw byte.
    import os
    import subprocess
    import sys

    name = os.path.join(os.fsencode(tmp_path), b"r\xff.jsonl")
    write_records(_records([100.0, 101.0, 102.0, 103.0]), os.fsdecode(name))
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    out = subprocess.run([os.fsencode(sys.executable), b"-m", b"nvmlcheck", b"study", b"compare", name, name],
                         capture_output=True, timeout=120, check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert b"r\\udcff.jsonl" in out.stdout and b"\xff" not in out.stdout


def _traced(n: int, polls: int) -> dict[str, Any]:
    return {**GOOD, "run": n, "repeat": n, "trace_columns": ["offset_ns", "used_bytes[0]", "process_count[0]"],
            "trace": [[i * 1000, 1 << 30, 1] for i in range(polls)]}


def test_compare_and_fit_hold_no_trace_of_the_records_they_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """compare and fit read no trace, but every record was kept with its trace, a Python object per poll and value
    (~8 times the line): a 64 MB file of 10 traced runs took 493 MB to fit. They now read records without them."""
    path = _write(tmp_path, [_traced(n, 50) for n in range(6)])
    assert all(r.trace is not None and len(r.trace) == 50 for r in load_records(path))  # the default keeps them
    bare = load_records(path, traces=False)
    assert len(bare) == 6 and all(r.trace is None and r.trace_columns is None for r in bare)
    assert bare == [dataclasses.replace(r, trace=None, trace_columns=None) for r in load_records(path)]
    # A trace is still checked when it is left out: a bad one is the same error.
    bad = _write(tmp_path, [GOOD, {**_traced(9, 2), "trace": [[0, -4, 1]]}], "bad.jsonl")
    with pytest.raises(RecordFormatError, match=r"bad\.jsonl:2: .*'trace\[0\]'"):
        load_records(bad, traces=False)
    from nvmlcheck import study

    asked: list[bool] = []
    real = study.load_records

    def spy(p: Any, *, traces: bool = True) -> list[RunRecord]:
        asked.append(traces)
        return real(p, traces=traces)

    monkeypatch.setattr(study, "load_records", spy)
    assert cli.main(["study", "fit", str(path)]) == 0
    assert cli.main(["study", "compare", str(path), str(path)]) == 0
    capsys.readouterr()
    assert asked == [False, False, False]


def test_a_byte_order_mark_before_the_first_record_is_read_past(tmp_path: Path) -> None:
    # A file saved by an editor that writes a UTF-8 BOM was refused as "not JSON (Unexpected UTF-8 BOM ...): run
    # records are JSON Lines", though every line was a record.
    plain = _write(tmp_path, [GOOD, {**GOOD, "run": 1}])
    marked = tmp_path / "bom.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    assert load_records(marked) == load_records(plain) and len(load_records(marked)) == 2
    later = tmp_path / "later.jsonl"  # a BOM inside the file is no record: still refused, with its line
    later.write_bytes(plain.read_bytes() + b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    with pytest.raises(RecordFormatError, match=r"later\.jsonl:3: "):
        load_records(later)
