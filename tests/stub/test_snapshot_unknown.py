"""``nvmlcheck --json snapshot`` of a GPU whose every reading failed: each ``null`` value of the device carries its
reason in the device's ``unknown``, keyed by its own dotted path (docs/cli.md, ``devices[].unknown``), the fields
derived from another one (``event_reason_names``, ``recovery_action_code``) included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli

_FAILING = [
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
]


def _nulls(value: Any, path: str = "") -> list[str]:
    """The dotted paths of the ``null`` leaves of a device's document (lists of processes are leaves)."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _nulls(v, f"{path}.{k}" if path else k)]
    return []


def _scenario(tmp_path: Path) -> str:
    scenario = tmp_path / "unknown.txt"
    scenario.write_text(
        "nvmlcheck-stub-scenario 1\n"
        "system driver=580.159.04 nvml=13.580.159.04 cuda=13000\n"
        "device index=0\n" + "".join(f"fault fn={fn} code=3\n" for fn in _FAILING)
    )
    return str(scenario)


def test_every_unknown_value_of_a_snapshot_document_has_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["--simulate", _scenario(tmp_path), "--json", "snapshot"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    (device,) = doc["devices"]
    unknown = device["unknown"]
    nulls = [p for p in _nulls({k: v for k, v in device.items() if k not in ("unknown", "mig_devices")})]
    assert "clocks.event_reason_names" in nulls and "health.recovery_action_code" in nulls
    missing = [p for p in nulls if p not in unknown]
    assert missing == []
    assert all(unknown[p] for p in nulls)  # a reason, never an empty text
    assert set(_nulls({k: v for k, v in doc["system"].items() if k != "unknown"})) <= set(doc["system"]["unknown"])


def test_every_question_mark_of_the_table_has_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The name's "?" stood alone: the line under the row said why memory, the process lists and the clock were
    # unknown, not the name.
    code = cli.main(["--simulate", _scenario(tmp_path), "snapshot"])
    out = capsys.readouterr().out
    assert code == 0
    row, why = out.splitlines()[1:3]
    assert row.split()[1] == "?"  # the name
    assert why.strip().startswith("(unknown: ")
    for what in ("name", "memory", "compute processes", "SM clock"):
        assert what in why


def test_a_process_whose_name_and_memory_are_unknown_says_why_in_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenario = tmp_path / "na.txt"
    scenario.write_text(
        "nvmlcheck-stub-scenario 1\n"
        "device index=0\n"
        "process device=0 kind=compute pid=4100001 used=na holds=1073741824\n"  # a PID no process here has
    )
    code = cli.main(["--simulate", str(scenario), "snapshot", "procs"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[1].split()[-2:] == ["?", "?"]  # used, name
    assert any(line.startswith("(used ?:") for line in out)
    assert any(line.startswith("(name ?:") for line in out)
