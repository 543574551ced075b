"""The reclamation study on the stub: real child processes stand in for GPU memory holders (pid-bound processes), a
real observer polls the stub through nvmlcheck's NVML backend, and the records, summary, plots and CLI are checked."""

from __future__ import annotations

import functools
import json
import os
import pickle
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck
from nvmlcheck.cli import main
from nvmlcheck.study import (
    SLEEP_REFERENCE_NS,
    BaselineNotClean,
    CudaHolderFactory,
    DeviceRun,
    HolderError,
    PlotUnavailable,
    RecordFormatError,
    RunRecord,
    StudyConfig,
    StudyResult,
    format_summary,
    load_records,
    median_run,
    parse_ending,
    percentile,
    plot_run_trace,
    plot_time_to_clean,
    record_writer,
    run_study,
    stub_holder,
    summarize,
    write_records,
)
from nvmlcheck.study.stub_holder import StubHolderFactory
from nvmlcheck.testing import Scenario, use_stub

pytestmark = [pytest.mark.stub, pytest.mark.usefixtures("nvml_released")]

GIB = 1 << 30
MS = 1_000_000
# What the stub's list_ms/release_ms imply is a lower bound (it starts counting when it first sees the pid gone,
# after the death, after the signal). Above it: the child's death, one sampling period and scheduling on a loaded
# 2-core CI box. Generous, yet far below a stub that ignored list_ms/release_ms or an observer that missed events.
EXIT_STATUS = {"KILL": -int(signal.SIGKILL), "TERM": -int(signal.SIGTERM), "exit": 0, "free": 0}


def _open() -> nvmlcheck.Session:
    return nvmlcheck.open("nvml")


def study(
    scenario: Scenario, config: StudyConfig, *, list_ms: int, release_ms: int
) -> tuple[StudyResult, StubHolderFactory, list[RunRecord]]:
    """Run a study on the stub; also return the factory and what on_record received."""
    seen: list[RunRecord] = []
    with use_stub(scenario) as stub:
        factory = StubHolderFactory(stub.scenario_path, list_ms=list_ms, release_ms=release_ms)
        result = run_study(config, session_factory=_open, holder_factory=factory, on_record=seen.append)
        assert stub.scenario_path.read_text() == scenario.render()  # finish() took every holder out again
    return result, factory, seen


def check_device_times(d: DeviceRun, ending: str, *, list_ms: int, release_ms: int) -> None:
    """Everything one GPU of a completed run must say."""
    assert d.signal_ns >= 0
    assert d.off_list_ns is not None and d.memory_back_ns is not None and d.first_clean_ns is not None
    assert d.waitpid_ns is not None and d.waitpid_ns >= 0
    # Lower bounds only: the stub never drops or frees early; how late a loaded machine sees it is not a mechanism.
    assert list_ms * MS <= d.off_list_ns
    assert release_ms * MS <= d.memory_back_ns
    assert d.off_list_ns <= d.memory_back_ns  # signal <= off the list <= memory back, as the scenario orders them
    assert d.first_clean_ns == max(d.off_list_ns, d.memory_back_ns)  # clean = both, seen by the same poll
    # The last poll that saw it held comes after the signal when the observer polled in the window, but may come
    # before it (a negative offset, never before the run's origin) when a loaded machine stalled the observer from
    # before the signal until the memory was back: both are valid records.
    assert d.last_held_ns is not None and -d.signal_ns <= d.last_held_ns < d.first_clean_ns
    assert d.exit_status == EXIT_STATUS[ending]


# --- the whole pipeline ---------------------------------------------------------------------------------------------


def test_records_are_complete_and_ordered() -> None:
    config = StudyConfig(sizes=(GIB, 4 * GIB), repeats=1, endings=("KILL", "TERM", "exit", "free"), trace=True)
    # 150 ms before the stub drops the holder, 250 more before it frees the memory: the trace below needs a poll in
    # each window, and on a loaded 2-core CI machine the observer went 137 ms without a poll (40 ms windows failed).
    result, factory, seen = study(Scenario.h200(), config, list_ms=150, release_ms=400)

    assert factory.live == []
    assert list(result.records) == seen  # on_record got every record, in order
    assert [r.run for r in result.records] == list(range(16))  # 2 sizes x 4 endings x (warm-up + 1)
    assert [(r.size_bytes, r.ending, r.warmup) for r in result.records[:4]] == [
        (GIB, "KILL", True), (GIB, "KILL", False), (GIB, "TERM", True), (GIB, "TERM", False)
    ]
    assert len(result.measured) == 8 and not result.timed_out
    for r in result.records:
        assert not r.timed_out and r.timeout_reason is None
        assert r.backend == "nvml" and r.driver == "580.159.04" and r.mode == "precise"
        assert r.polls >= 2 and r.poll_interval_ns > 0 and r.poll_cost_ns > 0
        assert r.resolution_ns >= r.poll_interval_ns and r.poll_cost_max_ns >= r.poll_cost_ns
        (d,) = r.devices
        assert d.index == 0 and d.uuid.startswith("GPU-") and d.name == "NVIDIA H200"
        assert d.baseline_used_bytes == 0 and d.held_bytes == r.size_bytes
        assert d.signal_ns >= 0  # signalled after the run's origin was taken (and before every poll: below)
        check_device_times(d, r.ending, list_ms=150, release_ms=400)
        # the trace: offsets from the run origin, used memory and process count per poll
        assert r.trace_columns == ("offset_ns", "used_bytes[0]", "process_count[0]")
        assert r.trace is not None and len(r.trace) >= 3
        offsets = [row[0] for row in r.trace]
        assert None not in offsets and offsets == sorted(int(t or 0) for t in offsets)
        assert int(offsets[0] or 0) > d.signal_ns
        assert r.trace[0][1:] == (r.size_bytes, 1)
        assert r.trace[-1][1:] == (0, 0)
        # the step from held to free is at the recorded times (trace offsets are from the run origin)
        assert d.memory_back_ns is not None and d.last_held_ns is not None
        assert (d.signal_ns + d.memory_back_ns, 0, 0) in r.trace
        # The last held poll is the trace's last row with the memory held. Whether the holder was still listed then
        # depends on whether a poll landed between the list's end and the release (250 ms): a loaded machine may
        # skip it, so its process count is not asserted (it was: `(t, size, 0) in trace` failed on a long gap).
        held = [row for row in r.trace if row[1] == r.size_bytes]
        assert held and held[-1][0] == d.signal_ns + d.last_held_ns
        assert all(row[1:] != (0, 1) for row in r.trace)  # never listed with the memory back: the stub's order


def test_a_size_no_gpu_can_hold_is_refused_before_any_holder_starts() -> None:
    # 200 GiB on a 140 GiB H200: the holders would never show their memory, and each run would fail only after its
    # ready timeout (60 s by default) with "holders not visible in NVML".
    config = StudyConfig(sizes=(GIB, 200 * GIB), repeats=1, endings=("KILL",), warmup="none", per_gpu=1)
    with use_stub(Scenario.h200()) as stub:
        factory = StubHolderFactory(stub.scenario_path, list_ms=10, release_ms=10)
        with pytest.raises(ValueError, match=r"200\.0 GiB per GPU .* more than GPU 0 can hold .*139\.8 GiB"):
            run_study(config, session_factory=_open, holder_factory=factory)
        assert factory.live == [] and stub.scenario_path.read_text() == Scenario.h200().render()


def test_eight_gpus_one_holder_each_one_observer() -> None:
    config = StudyConfig(sizes=(2 * GIB,), repeats=2, endings=("KILL",), warmup="none")
    with use_stub(Scenario.h200(devices=8)) as stub:
        # A poll of all eight GPUs must land before each frees its memory (last_held_ns): windows a loaded machine
        # meets.
        factory = StubHolderFactory(stub.scenario_path, list_ms=100, release_ms=200)
        result = run_study(config, session_factory=_open, holder_factory=factory)
        callers = {entry.pid for entry in stub.calls()}
    assert callers == {os.getpid()}  # the holders never touch NVML: one observer reads all eight GPUs
    assert len(result.records) == 2
    pids: set[int] = set()
    for r in result.records:
        assert [d.index for d in r.devices] == list(range(8))
        assert len({d.uuid for d in r.devices}) == 8
        signals = [d.signal_ns for d in r.devices]
        assert signals == sorted(signals) and signals[0] >= 0
        for d in r.devices:
            assert d.held_bytes == 2 * GIB
            check_device_times(d, "KILL", list_ms=100, release_ms=200)
        pids |= {d.pid for d in r.devices}
    assert len(pids) == 16  # a fresh holder per GPU per run
    (row,) = summarize(result.records)
    assert row.n == 16 and row.runs == 2 and row.timeouts == 0


def test_polls_that_fail_on_one_gpu_leave_gaps_in_its_trace_columns_only() -> None:
    scenario = Scenario.h200(devices=2)
    # NVML_ERROR_TIMEOUT (transient) on GPU 1's memory for a few polls right after the signal. Not "Unknown Error":
    # the backend re-initialises NVML after one, which makes the stub reload its scenario and restart its clocks.
    scenario.fault("nvmlDeviceGetMemoryInfo_v2", 10, device=1, after=3, count=5)
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none", trace=True)
    result, _, _ = study(scenario, config, list_ms=100, release_ms=200)  # windows a loaded machine polls in
    (r,) = result.records
    assert not r.timed_out and r.trace is not None
    assert all(len(row) == 5 for row in r.trace)
    gaps = [row for row in r.trace if row[2] is None]
    assert gaps and all(row[4] is None and row[1] is not None for row in gaps)  # GPU 0's columns stay filled
    for d in r.devices:
        check_device_times(d, "KILL", list_ms=100, release_ms=200)


def test_default_mode_polls_less_often_but_sees_the_same_events() -> None:
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none", mode="default")
    result, _, _ = study(Scenario.h200(), config, list_ms=100, release_ms=200)  # windows a loaded machine polls in
    (r,) = result.records
    assert r.mode == "default"
    assert r.poll_interval_ns >= 200_000  # DEFAULT sleeps ~1 ms between polls (0.25 ms while confirming)
    check_device_times(r.devices[0], "KILL", list_ms=100, release_ms=200)


def test_refuses_to_start_on_a_dirty_gpu() -> None:
    scenario = Scenario.h200(devices=2)
    scenario.add_process(1, 4_000_001, used_bytes=GIB)  # someone else's job on GPU 1
    config = StudyConfig(sizes=(GIB,), repeats=1)
    with use_stub(scenario) as stub:
        factory = StubHolderFactory(stub.scenario_path)
        with pytest.raises(BaselineNotClean) as info:
            run_study(config, session_factory=_open, holder_factory=factory)
    assert factory.live == []  # nothing was started
    assert info.value.records == ()
    assert "4000001" in str(info.value) and "GPU 1" in str(info.value)
    # the baseline judges only the selected GPUs: GPU 0 alone is clean
    only_gpu0 = StudyConfig(sizes=(GIB,), repeats=1, devices=(0,), warmup="none")
    result, _, _ = study(scenario, only_gpu0, list_ms=0, release_ms=10)
    assert [d.index for d in result.records[0].devices] == [0]


class LeakyStubHolders(StubHolderFactory):
    """Forgets to take finished holders out of the scenario: at the next load the stub lists each dead one again for
    list_ms, as a real driver still tearing down the previous run's process would."""

    def finish(self, holders: object) -> None:
        pass


def test_later_baselines_wait_for_the_previous_run_to_settle() -> None:
    config = StudyConfig(sizes=(GIB,), repeats=2, endings=("KILL",), warmup="none")
    with use_stub(Scenario.h200()) as stub:
        factory = LeakyStubHolders(stub.scenario_path, list_ms=50, release_ms=100)
        result = run_study(config, session_factory=_open, holder_factory=factory)
    assert len(result.records) == 2 and not result.timed_out


def test_a_previous_run_that_does_not_settle_stops_the_study_with_its_records() -> None:
    config = StudyConfig(sizes=(GIB,), repeats=2, endings=("KILL",), warmup="none", settle_timeout_s=0.1)
    seen: list[RunRecord] = []
    with use_stub(Scenario.h200()) as stub:
        factory = LeakyStubHolders(stub.scenario_path, list_ms=1000, release_ms=1000)
        with pytest.raises(BaselineNotClean) as info:
            run_study(config, session_factory=_open, holder_factory=factory, on_record=seen.append)
    (first,) = info.value.records
    assert seen == [first] and not first.timed_out
    assert first.devices[0].memory_back_ns is not None and first.devices[0].memory_back_ns >= 1000 * MS
    assert "after waiting 0.1 s" in str(info.value) and str(first.devices[0].pid) in str(info.value)


def test_a_run_whose_memory_never_comes_back_times_out_and_the_study_goes_on() -> None:
    config = StudyConfig(sizes=(GIB,), repeats=2, endings=("KILL",), warmup="none", run_timeout_s=0.4)
    result, factory, _ = study(Scenario.h200(), config, list_ms=20, release_ms=60_000)
    assert result.timed_out and len(result.records) == 2  # the second run's baseline was clean again
    for r in result.records:
        (d,) = r.devices
        assert r.timed_out and r.timeout_s == 0.4
        assert r.timeout_reason is not None and "GPU 0" in r.timeout_reason
        assert d.memory_back_ns is None and d.first_clean_ns is None
        assert d.off_list_ns is not None and d.off_list_ns >= 20 * MS  # the list emptied; the memory stayed
        assert d.last_held_ns is not None and d.last_held_ns >= d.off_list_ns  # still held after the list emptied
        assert d.waitpid_ns is not None and d.exit_status == -int(signal.SIGKILL)
    assert factory.live == []
    (row,) = summarize(result.records)
    assert row.runs == 2 and row.timeouts == 2 and row.n == 0 and row.memory_back is None
    assert row.sleep_ratio is None
    assert "2 of 2 runs timed out" in format_summary([row])


class ScriptedHolders(CudaHolderFactory):
    """CudaHolderFactory's start-up protocol (ready line, timeout, stderr on failure) with a scripted holder."""

    def __init__(self, script: str, **kwargs: float) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.script = script

    def command(self, device: int, nbytes: int) -> list[str]:
        return [sys.executable, "-S", "-c", self.script, str(nbytes), str(device)]


_READY = "import os, sys; print('ready', os.getpid(), sys.argv[1], sys.argv[2], flush=True); "


def test_cuda_holder_factory_waits_for_ready_and_reports_failures() -> None:
    holder = ScriptedHolders(_READY + "sys.exit(7 if sys.stdin.readline() == 'exit\\n' else 5)").start(3, 1234)
    assert (holder.device, holder.nbytes) == (3, 1234)
    holder.exit()
    assert holder.process.wait(10) == 7
    holder.close()

    def failure(script: str, **kwargs: float) -> str:
        with pytest.raises(HolderError) as info:
            ScriptedHolders(script, **kwargs).start(0, GIB)
        return str(info.value)

    text = failure("import sys; sys.stderr.write('libcuda.so.1 could not be loaded\\n'); sys.exit(3)")
    assert "1.0 GiB on GPU 0" in text and "exited before saying 'ready'" in text
    assert "exit status 3" in text and "libcuda.so.1 could not be loaded" in text
    assert "no 'ready' line within 0.3 s" in failure("import time; time.sleep(30)", start_timeout_s=0.3)
    assert "unexpected first line b'hello'" in failure("print('hello', flush=True); input()")


def test_study_errors_pickle() -> None:
    exc = BaselineNotClean(["GPU 0: pid 1 holds 1.0 GiB"], 5.0, (record(0, GIB, "KILL", [100.0]),))
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is BaselineNotClean and str(back) == str(exc) and back.records == exc.records
    with pytest.warns(DeprecationWarning, match="nvmlcheck.study"):  # the top-level names, kept for one release
        assert nvmlcheck.BaselineNotClean is BaselineNotClean and isinstance(exc, nvmlcheck.StudyError)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="at least one size"):
        StudyConfig(sizes=())
    with pytest.raises(ValueError, match="positive"):
        StudyConfig(sizes=(0,))
    with pytest.raises(ValueError, match="unknown ending"):
        StudyConfig(sizes=(GIB,), endings=("HUP",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeats"):
        StudyConfig(sizes=(GIB,), repeats=0)
    with pytest.raises(ValueError, match="run_timeout_s"):
        StudyConfig(sizes=(GIB,), run_timeout_s=math_nan())
    cfg = StudyConfig(sizes=[GIB], endings=["sigkill", "15", "EXIT"], warmup="once", repeats=2)  # type: ignore[arg-type]
    assert cfg.sizes == (GIB,) and cfg.endings == ("KILL", "TERM", "exit")
    assert [(e, rep, w) for _, e, rep, w in cfg.plan()] == [
        ("KILL", 0, True), ("KILL", 0, False), ("KILL", 1, False),
        ("TERM", 0, False), ("TERM", 1, False), ("exit", 0, False), ("exit", 1, False),
    ]
    assert parse_ending("9") == "KILL" and parse_ending("free") == "free"


def math_nan() -> float:
    return float("nan")


# --- records on disk ------------------------------------------------------------------------------------------------


def test_jsonl_round_trip_and_schema(tmp_path: Path) -> None:
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), trace=True)
    result, _, _ = study(Scenario.h200(devices=2), config, list_ms=10, release_ms=20)
    path = tmp_path / "runs.jsonl"
    with record_writer(path) as write:
        for r in result.records:
            write(r)
    assert load_records(path) == list(result.records)
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    doc = json.loads(lines[1])
    assert doc["schema"] == "nvmlcheck/reclaim-run" and doc["version"] == 1
    assert set(doc) >= {"run", "repeat", "warmup", "size_bytes", "ending", "mode", "driver", "timed_out", "polls",
                        "poll_interval_ns", "poll_cost_ns", "poll_cost_max_ns", "devices", "trace_columns", "trace"}
    assert set(doc["devices"][0]) == {"index", "uuid", "name", "pid", "baseline_used_bytes", "held_bytes", "signal_ns",
                                      "last_held_ns", "first_clean_ns", "off_list_ns", "memory_back_ns", "waitpid_ns",
                                      "exit_status", "zombie_ns", "exited_ns", "files_closed_ns",
                                      "phase_resolution_ns", "unknown", "holder_steps",  # added within version 1
                                      "role", "held_at_signal_bytes"}  # and in the third edition
    assert {"pinned_bytes", "pin_mode", "importers", "first", "stage_gap_s"} <= set(doc)
    assert all(len(row) == 5 for row in doc["trace"])  # offset, used x2, count x2

    # fields added later within version 1 are ignored; blank lines skipped
    doc["added_later"] = 1
    doc["devices"][0]["also_added"] = 2
    (tmp_path / "newer.jsonl").write_text("\n" + json.dumps(doc) + "\n\n")
    assert load_records(tmp_path / "newer.jsonl") == [result.records[1]]
    assert write_records(result.records, tmp_path / "again.jsonl").read_text() == path.read_text()

    def refused(text: str, match: str) -> None:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(lines[0] + "\n" + text + "\n")
        with pytest.raises(RecordFormatError, match=match):
            load_records(bad)

    refused(json.dumps({**doc, "version": 2}), r"bad\.jsonl:2: .*newer")
    refused(json.dumps({**doc, "schema": "nvmlcheck/wait"}), r":2: not a reclamation run record")
    refused(json.dumps({k: v for k, v in doc.items() if k != "devices"}), r":2: missing field 'devices'")
    refused("[1, 2]", r":2: a record is a JSON object")
    refused("{not json", r"bad\.jsonl:2:")


# --- summary --------------------------------------------------------------------------------------------------------


def record(run: int, size: int, ending: str, clean_ms: list[float], *, warmup: bool = False,
           timed_out: bool = False, interval_ns: int = 40_000) -> RunRecord:
    """A hand-made record: one GPU per value; off the list 30 ms before clean, reaped 20 ms after."""
    devices = tuple(
        DeviceRun(index=i, uuid=f"GPU-{i}", name="NVIDIA H200", pid=1000 + run * 10 + i, baseline_used_bytes=0,
                  held_bytes=size, signal_ns=i * 1000, last_held_ns=round(v * MS) - 40_000,
                  first_clean_ns=round(v * MS), off_list_ns=round((v - 30) * MS), memory_back_ns=round(v * MS),
                  waitpid_ns=round((v + 20) * MS), exit_status=-9)
        for i, v in enumerate(clean_ms)
    )
    return RunRecord(run=run, repeat=run, warmup=warmup, size_bytes=size, ending=parse_ending(ending), mode="precise",
                     backend="nvml", driver="580.159.04", nvmlcheck="0.1.0", wall_time=0.0, timed_out=timed_out,
                     timeout_s=30.0, timeout_reason="x" if timed_out else None, polls=100,
                     poll_interval_ns=interval_ns, poll_cost_ns=30_000, devices=devices)


def test_percentile_is_linear_between_closest_ranks() -> None:
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    assert percentile([10, 20, 30, 40, 50], 0.1) == pytest.approx(14.0, rel=1e-12)
    assert percentile([10, 20, 30, 40, 50], 0.9) == pytest.approx(46.0, rel=1e-12)
    assert percentile([7], 0.9) == 7
    assert percentile([3, 1, 2], 0.0) == 1 and percentile([3, 1, 2], 1.0) == 3
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        percentile([1], 1.5)


def test_summary_numbers_on_hand_made_records() -> None:
    records = [
        record(0, GIB, "KILL", [500.0], warmup=True),  # left out
        record(1, GIB, "KILL", [100.0, 110.0]),  # two GPUs: two values
        record(2, GIB, "KILL", [120.0]),
        record(3, GIB, "KILL", [130.0, 140.0], interval_ns=60_000),
        record(4, GIB, "KILL", [900.0], timed_out=True),  # counted as a timeout, not in the statistics
        record(5, 16 * GIB, "TERM", [150.0]),
        record(6, GIB, "TERM", [200.0, 100.0]),
    ]
    rows = summarize(records)
    assert [(r.size_bytes, r.ending) for r in rows] == [(GIB, "KILL"), (GIB, "TERM"), (16 * GIB, "TERM")]
    kill = rows[0]
    assert (kill.n, kill.runs, kill.timeouts) == (5, 4, 1)
    mb = kill.memory_back
    assert mb is not None and mb.n == 5
    assert (mb.min, mb.median, mb.max) == (100 * MS, 120 * MS, 140 * MS)
    assert mb.p10 == pytest.approx(104 * MS, rel=1e-12)  # position 0.4 between 100 and 110
    assert mb.p90 == pytest.approx(136 * MS, rel=1e-12)  # position 3.6 between 130 and 140
    assert kill.off_list is not None and kill.off_list.median == 90 * MS
    assert kill.waitpid is not None and kill.waitpid.median == 140 * MS
    assert kill.first_clean is not None and kill.first_clean.median == 120 * MS
    assert kill.sleep_ratio == pytest.approx(SLEEP_REFERENCE_NS / (120 * MS)) == pytest.approx(25.0)
    assert kill.resolution_ns == 40_000  # median over the cell's runs (40, 40, 60, 40 µs)
    term = rows[1]
    assert term.n == 2 and term.memory_back is not None and term.memory_back.median == 150 * MS
    assert json.loads(json.dumps(kill.to_json()))["memory_back"]["p90"] == pytest.approx(136 * MS)

    text = format_summary(rows)
    assert "1.0 GiB   KILL" in text and "16.0 GiB" in text
    assert "memory back      5    100.0    104.0    120.0    136.0    140.0" in text
    assert "sleep 3 waits 25.0x the median time to clean" in text
    assert "1 of 4 runs timed out" in text
    assert median_run(records, GIB, "KILL") is records[2]  # first GPUs: 100, 120, 130 -> 120


# --- plots ----------------------------------------------------------------------------------------------------------


def test_plots_are_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    config = StudyConfig(sizes=(GIB, 4 * GIB), repeats=2, endings=("KILL",), warmup="none", trace=True)
    result, _, _ = study(Scenario.h200(devices=2), config, list_ms=10, release_ms=30)
    clean = plot_time_to_clean(result.records, tmp_path / "clean.png")
    trace = plot_run_trace(result.records[0], tmp_path / "trace.png", device=1)
    for png in (clean, trace):
        data = png.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 5000
    no_trace = record(0, GIB, "KILL", [100.0])
    with pytest.raises(ValueError, match="no trace"):
        plot_run_trace(no_trace, tmp_path / "x.png")
    with pytest.raises(ValueError, match="GPU 5"):
        plot_run_trace(result.records[0], tmp_path / "x.png", device=5)


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib now fails
    monkeypatch.setitem(__import__("sys").modules, "matplotlib.figure", None)
    with pytest.raises(PlotUnavailable, match=r"pip install 'nvmlcheck\[plot\]'"):
        plot_time_to_clean([record(0, GIB, "KILL", [100.0])], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- CLI ------------------------------------------------------------------------------------------------------------


def test_cli_json_on_eight_simulated_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs.jsonl"
    plots = tmp_path / "plots"
    code = main(["--simulate", "h200x8", "--json", "study", "reclaim", "--sizes", "1GiB", "--repeats", "2",
                 "--endings", "KILL", "--out", str(out), "--trace", "--plot", str(plots)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["schema"] == "nvmlcheck/study-reclaim" and doc["version"] == 1
    assert doc["complete"] is True and doc["timed_out_runs"] == []
    assert doc["runs"] == 3 and doc["measured_runs"] == 2  # one warm-up per (size, ending)
    assert doc["record_schema"] == {"schema": "nvmlcheck/reclaim-run", "version": 1}
    (row,) = doc["summary"]
    assert (row["size_bytes"], row["ending"], row["n"], row["runs"]) == (GIB, "KILL", 16, 2)
    # the CLI's stub holders resemble an H200: off the list 90 ms, memory back 120 ms after the death
    assert 120 * MS <= row["memory_back"]["min"] <= row["memory_back"]["max"]
    # <=: a poll gap over the 30 ms between the two (a loaded machine's) sees both in one poll; the order is the
    # stub's, the strict gap a scheduling outcome.
    assert 90 * MS <= row["off_list"]["median"] <= row["memory_back"]["median"]
    assert row["sleep_ratio"] > 3
    assert [r["trace"] for r in doc["records"]] == [None] * 3  # traces live in --out only
    saved = load_records(out)
    assert [r.run for r in saved] == [0, 1, 2] and all(r.trace for r in saved)
    assert sorted(doc["plots"]) == sorted(str(plots / n) for n in ("time-to-clean.png", "trace-1GiB-KILL.png"))
    assert all(Path(p).is_file() for p in doc["plots"])


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--simulate", "h200", "study", "reclaim", "--sizes", "1GiB,2GiB", "--repeats", "1",
                 "--endings", "KILL,exit", "--no-warmup", "--mode", "default"])
    out = capsys.readouterr().out
    assert code == 0
    assert "4 measured runs + 0 warm-ups on GPU 0 (NVIDIA H200)" in out and "SIMULATED" in out
    assert out.count("sleep 3 waits") == 4
    assert "2.0 GiB   exit" in out


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # a run that is not clean within --run-timeout: exit 1. The stub holders give the memory back a minute after
    # their death, not the default 120 ms: with 120 ms, an observer that a loaded machine stalled from before the
    # 50 ms deadline to past 120 ms took its one poll past the deadline on clean GPUs (a race, not the mechanism).
    monkeypatch.setattr(stub_holder, "StubHolderFactory", functools.partial(StubHolderFactory, release_ms=60_000))
    code = main(["--simulate", "h200", "study", "reclaim", "--sizes", "1GiB", "--repeats", "1", "--no-warmup",
                 "--run-timeout", "0.05"])
    err = capsys.readouterr().err
    assert code == 1 and "timed out" in err
    # GPUs not clean at baseline: exit 1, its own message, nothing started
    code = main(["--simulate", "h200-busy", "--json", "study", "reclaim", "--sizes", "1GiB"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert doc["schema"] == "nvmlcheck/error" and doc["error"]["type"] == "BaselineNotClean"
    assert "not clean at baseline" in doc["error"]["message"] and "4123456" in doc["error"]["message"]
    # usage: exit 2
    for argv in (["--sizes", "1XB"], ["--endings", "HUP"], ["--repeats", "0"], ["--mode", "fast"],
                 ["--out", str(tmp_path / "missing" / "x.jsonl")]):
        assert exit_code(["--simulate", "h200", "study", "reclaim", *argv]) == 2, argv
        assert "error" in capsys.readouterr().err


def exit_code(argv: list[str]) -> int:
    """main()'s exit code, also when argparse exits (it raises SystemExit for bad arguments)."""
    try:
        return main(argv)
    except SystemExit as exc:
        assert isinstance(exc.code, int)
        return exc.code


# --- phases, holder kinds, concurrency (second edition) -------------------------------------------------------------


def test_phases_in_order_with_a_lingering_teardown(tmp_path: Path) -> None:
    """A child whose leader exits first while another thread keeps its 'device file' open (as a CUDA process tearing
    down): the leader is a zombie before the whole process has exited, and the files close with the process."""
    dev = tmp_path / "nvidia0"
    dev.write_text("")
    config = StudyConfig(sizes=(GIB,), repeats=2, endings=("exit",), warmup="none",
                         device_files=(str(tmp_path / "nvidia*"),))
    with use_stub(Scenario.h200()) as stub:
        factory = StubHolderFactory(stub.scenario_path, list_ms=40, release_ms=60, device_files=[str(dev)],
                                    linger_ms=200)
        result = run_study(config, session_factory=_open, holder_factory=factory)
    for r in result.records:
        (d,) = r.devices
        assert d.zombie_ns is not None and d.exited_ns is not None and d.files_closed_ns is not None
        # The leader's exit is not the process's: the other thread lingered with the file open, so the leader was
        # seen a zombie before the process had exited and its files closed. Each time is when the watcher saw it,
        # within its resolution window: a watcher starved by a loaded machine widens the windows (it once saw a
        # 200 ms linger as a negative gap), so the order is checked within them, not a duration.
        windows = d.phase_resolution_ns or {}
        seen_zombie_from = d.zombie_ns - (windows.get("zombie") or 0)
        assert seen_zombie_from <= d.exited_ns and seen_zombie_from <= d.files_closed_ns
        # Exit precedes the reap; the watcher may see it after waitpid returned, but its window starts before.
        exited_res = (d.phase_resolution_ns or {}).get("exited")
        assert d.waitpid_ns is not None and exited_res is not None and d.exited_ns - exited_res <= d.waitpid_ns
        res = d.phase_resolution_ns
        assert res is not None
        for phase in ("zombie", "exited", "files_closed", "off_list", "memory_back"):
            value = res[phase]
            assert value is not None and value > 0, phase
        assert res["waitpid"] is None and d.unknown is not None and "waitpid_resolution" in d.unknown
        assert "zombie" not in d.unknown and "exited" not in d.unknown
        assert d.holder_steps is not None and d.holder_steps["sim"] == 1 and "init" in d.holder_steps


def test_phases_without_device_files_are_seen_closed_and_reasons_kept() -> None:
    """No matching file ever open: files_closed is seen at the first check; phases=False records reasons."""
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none", phases=False)
    result, _, _ = study(Scenario.h200(), config, list_ms=10, release_ms=20)
    (d,) = result.records[0].devices
    assert d.zombie_ns is None and d.exited_ns is None and d.files_closed_ns is None
    assert d.unknown is not None and d.unknown["zombie"].startswith("phases not watched")
    assert len({result.records[0], result.records[0]}) == 1  # records stay hashable with the dict fields


def test_proc_watcher_resolution_with_an_injected_clock() -> None:
    """Times and windows come from the clock: an event first seen by check k lies between the start of check k-1
    and the end of check k."""
    from nvmlcheck.study.phases import PhaseWatch, ProcWatcher

    ticks = iter(range(1000, 10_000, 10))
    answers = {"zombie": iter([False, True]), "exited": iter([False, False, True]), "files_closed": iter([None, True])}
    w = PhaseWatch(pid=1)
    def answer(phase: str) -> Callable[[PhaseWatch], bool | None]:
        return lambda _w: next(answers[phase])

    watcher = ProcWatcher([w], ("/dev/nvidia*",), clock=lambda: next(ticks), checks={p: answer(p) for p in answers})
    watcher.start_at(w, 900)
    # Each round checks the latest phase first: files_closed, exited, zombie.
    assert watcher.sample()  # round 1: files 1000-1010 unknown, exited 1020-1030 no, zombie 1040-1050 no
    assert watcher.sample()  # round 2: files 1060-1070 yes, exited 1080-1090 no, zombie 1100-1110 yes
    assert not watcher.sample()  # round 3: exited 1120-1130 yes
    assert w.at == {"files_closed": 1070, "zombie": 1110, "exited": 1130}
    assert w.resolution == {"files_closed": 1070 - 1000, "zombie": 1110 - 1040, "exited": 1130 - 1080}
    assert w.pending() == []


def test_holder_kinds_and_their_steps_on_the_stub() -> None:
    """free and destroy report their own in-process cost on the done line (as end.*); a context holds size 0."""
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("free",), warmup="none", holder="destroy")
    with use_stub(Scenario.h200()) as stub:
        factory = StubHolderFactory(stub.scenario_path, list_ms=10, release_ms=20, kind="destroy", free_ms=30,
                                    destroy_ms=40)
        result = run_study(config, session_factory=_open, holder_factory=factory)
        (d,) = result.records[0].devices
        assert result.records[0].holder == "destroy"
        steps = d.holder_steps or {}
        assert steps["end.free"] >= 30 * MS and steps["end.destroy"] >= 40 * MS  # sleeps: lower bounds only
        # The signal -> memory back time includes the holder's own steps: it cannot be shorter than them.
        assert d.memory_back_ns is not None and d.memory_back_ns >= steps["end.free"] + steps["end.destroy"]

        ctx = StudyConfig(sizes=(0,), repeats=1, endings=("KILL",), warmup="none", holder="context")
        factory = StubHolderFactory(stub.scenario_path, list_ms=10, release_ms=20, kind="context")
        (r,) = run_study(ctx, session_factory=_open, holder_factory=factory).records
        assert r.size_bytes == 0 and r.holder == "context" and not r.timed_out
        assert r.devices[0].held_bytes == 518 << 20 and r.devices[0].exit_status == -9
    with pytest.raises(ValueError, match="context holder takes size 0"):
        StudyConfig(sizes=(GIB,), holder="context")
    with pytest.raises(ValueError, match="context holder takes size 0"):
        StudyConfig(sizes=(0,))
    with pytest.raises(ValueError, match="unknown holder kind"):
        StudyConfig(sizes=(GIB,), holder="vgpu")


def test_concurrency_per_gpu_and_one_gpu_at_a_time(tmp_path: Path) -> None:
    two = Scenario.h200(devices=2)
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none", per_gpu=3, trace=True)
    result, _, _ = study(two, config, list_ms=10, release_ms=20)
    (r,) = result.records
    assert r.per_gpu == 3 and r.concurrent == "gpus"
    assert [d.index for d in r.devices] == [0, 0, 0, 1, 1, 1] and len({d.pid for d in r.devices}) == 6
    for d in r.devices:
        assert d.held_bytes == 3 * GIB  # the GPU's increase, shared by its three holders
        assert d.memory_back_ns is not None and d.off_list_ns is not None and d.exited_ns is not None

    pytest.importorskip("matplotlib")
    assert plot_run_trace(r, tmp_path / "per-gpu.png").stat().st_size > 0  # one line per GPU, not per holder

    alone = StudyConfig(sizes=(GIB,), repeats=2, endings=("KILL",), warmup="none", concurrent="none")
    result, _, _ = study(two, alone, list_ms=10, release_ms=20)
    assert [[d.index for d in r.devices] for r in result.records] == [[0], [1], [0], [1]]
    assert [r.run for r in result.records] == [0, 1, 2, 3] and {r.concurrent for r in result.records} == {"none"}


def test_cli_holder_kinds_concurrency_and_phases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ctx.jsonl"
    code = main(["--simulate", "h200x8", "--devices", "0,1", "study", "reclaim", "--holder", "context", "--repeats",
                 "1", "--no-warmup", "--endings", "KILL", "--concurrent", "none", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "holder context" in text and "leader zombie" in text
    saved = load_records(out)
    assert [(r.holder, r.size_bytes, r.concurrent, [d.index for d in r.devices]) for r in saved] == [
        ("context", 0, "none", [0]), ("context", 0, "none", [1])]
    code = main(["--simulate", "h200", "--json", "study", "reclaim", "--sizes", "1GiB", "--repeats", "1",
                 "--no-warmup", "--endings", "KILL", "--per-gpu", "2", "--holder", "streams", "--no-phases"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    (rec,) = doc["records"]
    assert (rec["holder"], rec["holder_count"], rec["per_gpu"]) == ("streams", 4, 2)  # count 4 by default for streams
    assert [d["zombie_ns"] for d in rec["devices"]] == [None, None]
    assert doc["summary"][0]["holder"] == "streams" and doc["summary"][0]["zombie"] is None
    # a context allocates nothing: sizes are refused with it
    assert exit_code(["--simulate", "h200", "study", "reclaim", "--holder", "context", "--sizes", "1GiB"]) == 2
    assert exit_code(["--simulate", "h200", "study", "reclaim", "--holder", "vgpu"]) == 2


def test_files_closed_reads_every_thread(tmp_path: Path) -> None:
    """A fake /proc: the leader's fd directory is empty (a zombie leader's is), another thread still holds the file."""
    from nvmlcheck.study.phases import files_closed

    proc = tmp_path / "proc"
    for tid, files in ((42, []), (43, ["/dev/null", "/dev/nvidia0"])):
        fd = proc / "42" / "task" / str(tid) / "fd"
        fd.mkdir(parents=True)
        for n, target in enumerate(files):
            (fd / str(n)).symlink_to(target)
    assert files_closed(42, ["/dev/nvidia[0-9]*"], proc=str(proc)) is False
    (proc / "42" / "task" / "43" / "fd" / "1").unlink()
    assert files_closed(42, ["/dev/nvidia[0-9]*"], proc=str(proc)) is True
    assert files_closed(7, ["/dev/nvidia[0-9]*"], proc=str(proc)) is True  # gone: nothing open


def test_first_edition_records_still_load(tmp_path: Path) -> None:
    """A record written before the phases and holder kinds (no such fields) reads back with the defaults."""
    doc = record(0, GIB, "KILL", [100.0]).to_json()
    for key in ("holder", "holder_count", "per_gpu", "concurrent"):
        del doc[key]
    for key in ("zombie_ns", "exited_ns", "files_closed_ns", "phase_resolution_ns", "unknown", "holder_steps"):
        del doc["devices"][0][key]
    (tmp_path / "old.jsonl").write_text(json.dumps(doc) + "\n")
    (r,) = load_records(tmp_path / "old.jsonl")
    assert (r.holder, r.holder_count, r.per_gpu, r.concurrent) == ("alloc", 1, 1, "gpus")
    assert r.devices[0].zombie_ns is None and r.devices[0].holder_steps is None
    (row,) = summarize([r])
    assert row.holder == "alloc" and row.zombie is None and "leader zombie" not in format_summary([row])


def test_events_seen_during_a_run_are_in_its_record() -> None:
    # issue 15: with StudyConfig.events every NVML event of the run is kept in its record (schema version unchanged).
    sc = Scenario.h200()
    sc.at_ms(0).raise_event(0, "xid", xid=13)
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none", events=True)
    # The record keeps what the listener thread has received when the run ends: a run of 300 ms or more gives that
    # thread time to be scheduled on a loaded machine (with release_ms=0 the run could end before it ran).
    result, _factory, _seen = study(sc, config, list_ms=0, release_ms=300)
    (record,) = result.records
    assert record.events is not None and record.events_reason is None
    assert [(e["schema"], e["index"], e["kind"], e["xid"], e["fatal"]) for e in record.events] == [
        ("nvmlcheck/event", 0, "xid", 13, False)
    ]
    doc = record.to_json()
    assert doc["version"] == 1 and doc["events"][0]["xid"] == 13
    assert RunRecord.from_json(json.loads(record.to_line())) == record
    # without the option nothing is listened for
    plain, _, _ = study(sc, StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none"),
                        list_ms=0, release_ms=0)
    assert plain.records[0].events is None


def test_a_plot_directory_that_cannot_be_made_is_refused_before_any_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    a_file = tmp_path / "afile"
    a_file.write_text("")
    # It was found after every run (a NotADirectoryError traceback, exit 1, no document).
    code = main(["--simulate", "h200", "--json", "study", "reclaim", "--sizes", "1GiB", "--repeats", "1",
                 "--endings", "KILL", "--plot", str(a_file / "plots")])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and "--plot" in doc["error"]["message"] and "cannot make the directory" in doc["error"]["message"]
