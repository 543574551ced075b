"""The ``--hosts`` tables: a host's GPUs in index order (an unreadable one in its place) and every ``?`` with the
host's reason, as the local tables have them (tests/unit/test_cli_tables.py)."""

from __future__ import annotations

import argparse
from types import MappingProxyType
from typing import Any

import pytest
from snapshots import GIB, dev, failure, proc, snap

from nvmlcheck.cli._hosts import _print
from nvmlcheck.errors import GpuLost
from nvmlcheck.hosts import Host, HostResult
from nvmlcheck.jsonout import snapshot_document


def _doc(s: Any) -> dict[str, Any]:
    doc: dict[str, Any] = snapshot_document(s)
    return doc


def _lines(capsys: pytest.CaptureFixture[str], command: str, doc: dict[str, Any], view: str | None = None,
           code: int = 0) -> list[str]:
    if command != "snapshot":
        doc = {"schema": f"nvmlcheck/{command}", "snapshot": doc, "polls": 2, "elapsed_ns": 10**6}
    _print(argparse.Namespace(command=command, view=view), [HostResult(Host("gpu01"), doc, code)])
    return capsys.readouterr().out.splitlines()


LOST = failure(1, GpuLost(15, "nvmlDeviceGetHandleByIndex_v2", 1))


@pytest.mark.parametrize(("command", "view"), [("snapshot", None), ("snapshot", "procs"), ("wait", None)])
def test_an_unreadable_gpu_is_in_its_place_not_after_the_others(capsys: pytest.CaptureFixture[str], command: str,
                                                                view: str | None) -> None:
    # GPU 1 lost on a host of GPUs 0 and 2: its UNREADABLE line came after GPU 2's.
    s = snap(dev(0, procs=[proc(7, GIB)]), dev(2, procs=[proc(8, GIB)]), failures=[LOST])
    gpus = [line.split()[2] for line in _lines(capsys, command, _doc(s), view) if line.split()[1:2] == ["GPU"]]
    assert gpus == ["0", "1", "2"]


def test_every_unknown_value_of_a_gpu_line_has_the_hosts_reason(capsys: pytest.CaptureFixture[str]) -> None:
    # "used ? of ?  procs ?" said nothing of why: the document carries the reason of each.
    d = dev(0, memory=None, procs=None, unknown=MappingProxyType({
        "memory": "not supported: nvmlDeviceGetMemoryInfo_v2", "processes.compute": "no permission"}))
    lines = _lines(capsys, "wait", _doc(snap(d, dev(1))))
    row = next(i for i, line in enumerate(lines) if "GPU 0" in line)
    assert "used          ? of          ?" in lines[row] and "procs 0+?" not in lines[row]
    note = lines[row + 1]
    assert note.startswith("gpu01    (unknown: ")
    assert "memory: not supported: nvmlDeviceGetMemoryInfo_v2" in note and "compute processes: no permission" in note
    assert not any("unknown" in line for line in lines if "GPU 1" in line)  # a GPU read whole: no note
    assert sum("(unknown" in line for line in lines) == 1


def test_values_unknown_for_one_reason_share_it_and_a_missing_reason_is_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    why = "nvidia-smi printed N/A for Processes"
    d = dev(0, procs=None, graphics=None, mps=None, unknown=MappingProxyType({
        f"processes.{k}": why for k in ("compute", "graphics", "mps")}))
    (note,) = (line for line in _lines(capsys, "snapshot", _doc(snap(d))) if "(unknown" in line)
    assert note.count(why) == 1 and "compute processes, graphics processes, mps processes: " + why in note
    doc = _doc(snap(dev(0)))
    doc["devices"][0]["memory"] = None  # an older or broken host: no reason in its document
    (note,) = (line for line in _lines(capsys, "snapshot", doc) if "(unknown" in line)
    assert "memory: no reason given by the host" in note


def test_an_unknown_process_size_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck.cli._output import UNKNOWN_PROCESS_USED

    lines = _lines(capsys, "snapshot", _doc(snap(dev(0, procs=[proc(7, None)]))), view="procs")
    assert any(" 7  compute" in line and line.rstrip().endswith("?  python3") for line in lines)
    assert f"gpu01  {UNKNOWN_PROCESS_USED}" in lines
    lines = _lines(capsys, "snapshot", _doc(snap(dev(0, procs=[proc(7, GIB)]))), view="procs")
    assert not any(UNKNOWN_PROCESS_USED in line for line in lines)


def test_a_hostile_index_keeps_its_place_after_the_numbered_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _doc(snap(dev(2), dev(0)))
    doc["devices"].insert(0, {"index": "x", "memory": "lots", "processes": "many"})
    gpus = [line.split()[2] for line in _lines(capsys, "snapshot", doc) if line.split()[1:2] == ["GPU"]]
    assert gpus == ["0", "2", "x"]


def test_the_local_process_table_explains_an_unknown_size_too() -> None:
    import io

    from nvmlcheck.cli._output import UNKNOWN_PROCESS_USED, process_table

    out = io.StringIO()
    process_table(snap(dev(0, procs=[proc(7, None)])), out)
    assert UNKNOWN_PROCESS_USED in out.getvalue().splitlines()


def test_every_unknown_value_of_a_remote_holder_has_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    # "4123456  ?  ?  nvml  GPU 0 ?  ?": a holder in another PID namespace, said without why.
    why = "not visible here: no /proc entry (another PID namespace)"
    holder = {"pid": 4123456, "found_by": ["nvml"], "name": None, "state": None, "user": None, "cmdline": None,
              "unknown": {"name": why, "state": why, "uid": why, "cmdline": why},
              "gpus": [{"index": 0, "used_bytes": None, "why_unknown": "NVML reports not available"}]}
    known = {"pid": 7, "found_by": ["nvml"], "name": "python3", "state": "sleeping", "user": "alice",
             "cmdline": ["python3"], "unknown": {}, "gpus": [{"index": 0, "used_bytes": GIB}]}
    doc = {"schema": "nvmlcheck/holders", "holders": [holder, known]}
    _print(argparse.Namespace(command="holders", view=None), [HostResult(Host("gpu01"), doc, 0)])
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if "4123456" in line)
    assert lines[row + 1] == (f"gpu01    (unknown: user, state, command: {why}; GPU 0 used: NVML reports not "
                              "available)")
    assert sum("(unknown" in line for line in lines) == 1  # the holder read whole has none


def test_a_kill_dry_run_on_hosts_is_never_summed_up_as_clean(capsys: pytest.CaptureFixture[str]) -> None:
    # The plan of a host whose GPU is held (one target) was summed up "1 host: 1 clean": a dry run judges nothing.
    plan = {"schema": "nvmlcheck/kill-plan", "version": 1, "targets": [{"pid": 7, "found_by": "nvml",
                                                                        "cmdline": ["python3", "train.py"]}],
            "left_alone": [], "missing": []}
    _print(argparse.Namespace(command="kill", view=None, dry_run=True), [HostResult(Host("gpu01"), plan, 0)])
    out = capsys.readouterr().out.splitlines()
    assert "gpu01  would signal pid 7 (nvml): python3 train.py" in out
    assert "gpu01  dry run: nothing was signalled" in out
    assert out[-1] == "1 host: 1 ok" and "clean" not in "\n".join(out), out
