"""Records say whether they were simulated (``--simulate``: the stub libnvidia-ml and stub holders), older records
read as unknown with a reason (never as real), and ``study fit`` leaves simulated runs out unless asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.study import DeviceRun, RecordFormatError, RunRecord, load_records, write_records
from nvmlcheck.study.fit import fit_report
from nvmlcheck.study.records import UNRECORDED
from nvmlcheck.study.runner import simulated_by

MS = 1_000_000
GIB = 1 << 30


def _records(values_ms: list[float], *, simulated: bool | None = None, steps: dict[str, int] | None = None,
             **run: Any) -> list[RunRecord]:
    out = []
    for n, v in enumerate(values_ms):
        device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + n, baseline_used_bytes=0,
                           held_bytes=GIB, signal_ns=0, last_held_ns=None, first_clean_ns=round(v * MS),
                           off_list_ns=round(v * MS), memory_back_ns=round(v * MS), waitpid_ns=None, exit_status=-9,
                           holder_steps=steps)
        fields: dict[str, Any] = {"mode": "precise", "backend": "nvml", "driver": "580.159.04", **run}
        out.append(RunRecord(run=n, repeat=n, warmup=False, size_bytes=GIB, ending="KILL", nvmlcheck="0",
                             wall_time=0.0, timed_out=False, timeout_s=30.0, timeout_reason=None, polls=10,
                             poll_interval_ns=1, poll_cost_ns=1, devices=(device,), simulated=simulated,
                             simulation="the stub" if simulated else None, **fields))
    return out


def _older(doc: dict[str, Any]) -> dict[str, Any]:
    """The record as nvmlcheck wrote it before the field existed."""
    return {k: v for k, v in doc.items() if k not in ("simulated", "simulation", "simulated_reason")}


def test_a_record_says_whether_it_was_simulated_and_reads_back_the_same(tmp_path: Path) -> None:
    real, sim = _records([100.0], simulated=False)[0], _records([100.0], simulated=True)[0]
    assert real.to_json()["simulated"] is False and sim.to_json()["simulated"] is True
    assert sim.to_json()["simulation"] == "the stub" and real.provenance == "real" and sim.provenance == "simulated"
    assert load_records(write_records([real, sim], tmp_path / "r.jsonl")) == [real, sim]


def test_an_older_record_is_unknown_with_a_reason_never_real(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(_older(_records([100.0], simulated=False)[0].to_json())) + "\n", encoding="utf-8")
    (r,) = load_records(path)
    assert r.simulated is None and r.provenance == "unknown" and r.simulated_reason == UNRECORDED


def test_an_older_stub_record_is_known_by_the_stub_holders_mark(tmp_path: Path) -> None:
    path = tmp_path / "old-stub.jsonl"
    doc = _older(_records([100.0], steps={"init": 5, "sim": 1})[0].to_json())
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    (r,) = load_records(path)
    assert r.simulated is True and r.simulation is not None and "sim=1" in r.simulation


@pytest.mark.parametrize(("name", "value"), [("simulated", "yes"), ("simulated", 1), ("simulation", 5)])
def test_a_simulated_field_of_the_wrong_type_is_refused(name: str, value: Any) -> None:
    doc = {**_records([100.0], simulated=True)[0].to_json(), name: value}
    with pytest.raises(RecordFormatError, match=f"field '{name}'"):
        RunRecord.from_json(doc)


def test_the_holder_factory_says_whether_the_runs_are_simulated() -> None:
    from nvmlcheck.study import CudaHolderFactory
    from nvmlcheck.study.stub_holder import StubHolderFactory

    assert simulated_by(CudaHolderFactory()) == {"simulated": False, "simulation": None, "simulated_reason": None}
    stub = StubHolderFactory.__new__(StubHolderFactory)  # the class's word, without a scenario file
    stub.simulation = "the stub, scenario x"
    assert simulated_by(stub) == {"simulated": True, "simulation": "the stub, scenario x", "simulated_reason": None}
    unknown = simulated_by(object())
    assert unknown["simulated"] is None and "object" in unknown["simulated_reason"]


def test_a_simulated_study_writes_records_that_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "runs.jsonl"
    assert cli.main(["--simulate", "h200", "study", "reclaim", "--sizes", "1MiB", "--repeats", "1", "--endings",
                     "KILL", "--no-warmup", "--no-phases", "--out", str(out)]) == 0
    capsys.readouterr()
    (r,) = load_records(out)
    assert r.simulated is True and r.simulation is not None and "--simulate h200" in r.simulation


# --- study fit: simulated runs are left out unless asked ------------------------------------------------------------


def test_fit_refuses_a_study_that_is_all_simulated_unless_asked(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_records(_records([100.0, 101.0, 99.0, 102.0], simulated=True), tmp_path / "sim.jsonl")
    assert cli.main(["study", "fit", str(path)]) == 2
    err = capsys.readouterr().err
    assert "every run is simulated" in err and "--include-simulated" in err
    assert cli.main(["study", "fit", str(path), "--include-simulated"]) == 0
    assert "4 of the runs fitted are SIMULATED" in capsys.readouterr().out


def test_fit_leaves_simulated_runs_out_of_a_real_fit_and_counts_the_unknown() -> None:
    real = _records([100.0, 101.0, 103.0], simulated=False)
    unknown = _records([102.0])
    sim = _records([5000.0, 5000.0], simulated=True)
    result = fit_report([*real, *unknown, *sim])
    assert result.n == 4 and result.provenance == {"real": 3, "simulated": 0, "unknown": 1}
    assert [n for why, n in result.excluded.items() if why.startswith("simulated")] == [2]
    assert result.model.base_ns < 200 * MS  # the stub's 5 s runs did not pull the model
    assert "of unknown provenance" in result.model.source
    everything = fit_report([*real, *sim], include_simulated=True)
    assert everything.n == 5 and everything.provenance["simulated"] == 2 and "SIMULATED" in everything.model.source
