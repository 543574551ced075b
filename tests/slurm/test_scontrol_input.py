"""What scontrol and slurmd give the gate, and what scontrol does with what the gate gives it (each seen on Slurm
22.05.8): a NodeSet's name reads like a node's, yet ``scontrol update NodeName=SET State=DRAIN`` drains every node of
the set while ``scontrol show node SET`` answers "Node SET not found" (the gate reads the node before every change,
and then changes nothing); a drain reason loses its last double quote; Slurm's GPU IDs count what gres.conf says
(``--gpu-ids``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import slurm
from nvmlcheck.cli import main
from nvmlcheck.testing import Scenario

GIB = 1 << 30


def fake_scontrol(directory: Path, show: str, status: int = 0) -> tuple[Path, Path]:
    """An scontrol that logs each call and answers ``-o show node`` with ``show`` and ``status``."""
    path, log = directory / "scontrol", directory / "scontrol.log"
    path.write_text("#!/bin/sh\n"
                    f"printf '%s\\037' \"$@\" >> {log}; echo >> {log}\n"
                    f"if [ \"$1\" = -o ]; then printf '%b\\n' {show!r}; exit {status}; fi\n", encoding="utf-8")
    path.chmod(0o755)
    return path, log


def updates(log: Path) -> list[list[str]]:
    calls = [line.split("\x1f")[:-1] for line in log.read_text().splitlines()] if log.exists() else []
    return [c for c in calls if c[:1] == ["update"]]


def deadline() -> int:
    return time.monotonic_ns() + 20_000_000_000  # a hang guard, never reached


NOT_FOUND = ("Node gpuset not found", 1)
OTHER = ("NodeName=gpu01 State=IDLE ThreadsPerCore=1", 0)
SEVERAL = ("NodeName=gpuset State=IDLE ThreadsPerCore=1\nNodeName=gpu02 State=IDLE ThreadsPerCore=1", 0)


@pytest.mark.parametrize(("show", "status"), [NOT_FOUND, OTHER, SEVERAL], ids=["not-found", "another", "several"])
def test_no_change_for_a_name_scontrol_shows_as_no_single_node(show: str, status: int, tmp_path: Path) -> None:
    path, log = fake_scontrol(tmp_path, show, status)
    scontrol = slurm.Scontrol(str(path))
    with pytest.raises(slurm.NodeNotFound, match="'gpuset' is not one node's name"):
        scontrol.node("gpuset", deadline_ns=deadline())
    drain = scontrol.drain("gpuset", "nvmlcheck: GPU 0 held", deadline_ns=deadline())
    resume = scontrol.resume("gpuset", deadline_ns=deadline())
    assert updates(log) == []
    for run in (drain, resume):
        assert not run.ran and not run.ok and run.output.startswith("not run: ") and "NodeSet" in run.output


def test_a_node_scontrol_shows_is_drained_as_before(tmp_path: Path) -> None:
    path, log = fake_scontrol(tmp_path, "NodeName=gpu01 State=IDLE ThreadsPerCore=1")
    scontrol = slurm.Scontrol(str(path))
    assert scontrol.node("gpu01", deadline_ns=deadline()).state == "IDLE"
    assert scontrol.drain("gpu01", "nvmlcheck: x", deadline_ns=deadline()).ok
    assert updates(log) == [["update", "NodeName=gpu01", "State=DRAIN", "Reason=nvmlcheck: x"]]


WARNING = "scontrol: warning: TaskPluginParam=autobind=threads is deprecated"


@pytest.mark.parametrize("where", ["stderr", "stdout"])
def test_a_warning_beside_the_node_line_is_no_other_node(tmp_path: Path, where: str) -> None:
    # scontrol prints warnings (a deprecated slurm.conf option, a plugin's message) with its answer: the warning was
    # read as a second node's line ("answered for 'gpu01', '?'"), the node as a NodeSet's, and nothing was drained
    # or resumed.
    path, log = fake_scontrol(tmp_path, "NodeName=gpu01 State=IDLE+DRAIN ThreadsPerCore=1 Reason=nvmlcheck: x")
    redirect = " >&2" if where == "stderr" else ""
    path.write_text(path.read_text().replace("#!/bin/sh\n", f"#!/bin/sh\necho '{WARNING}'{redirect}\n", 1))
    scontrol = slurm.Scontrol(str(path))
    state = scontrol.node("gpu01", deadline_ns=deadline())
    assert (state.state, state.reason) == ("IDLE+DRAIN", "nvmlcheck: x")
    assert scontrol.resume("gpu01", deadline_ns=deadline()).ok
    assert updates(log) == [["update", "NodeName=gpu01", "State=RESUME"]]


def test_a_warning_that_says_not_found_is_no_missing_node(tmp_path: Path) -> None:
    # Slurm says "Node X not found" of a name it does not know; any failing output with "not found" in it (a plugin
    # that is not, slurmctld unreachable) was taken for that, and the drain refused.
    path, log = fake_scontrol(tmp_path, "scontrol: error: auth plugin not found\nUnable to contact slurm controller", 1)
    scontrol = slurm.Scontrol(str(path))
    with pytest.raises(slurm.ScontrolError) as raised:
        scontrol.node("gpu01", deadline_ns=deadline())
    assert not isinstance(raised.value, slurm.NodeNotFound)
    assert scontrol.drain("gpu01", "nvmlcheck: x", deadline_ns=deadline()).ok and len(updates(log)) == 1


def test_a_failing_show_alone_does_not_stop_the_drain(tmp_path: Path) -> None:
    # scontrol that cannot reach slurmctld (exit 1, no "not found"): the drain is still tried, as before.
    path, log = fake_scontrol(tmp_path, "slurm_load_node error: Unable to contact slurm controller", 1)
    scontrol = slurm.Scontrol(str(path))
    with pytest.raises(slurm.ScontrolError) as raised:
        scontrol.node("gpu01", deadline_ns=deadline())
    assert not isinstance(raised.value, slurm.NodeNotFound)
    scontrol.drain("gpu01", "nvmlcheck: x", deadline_ns=deadline())
    assert len(updates(log)) == 1


def test_an_epilog_given_a_nodeset_drains_nothing_and_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    for key in list(os.environ):
        if key.startswith("SLURM"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_123_456, used_bytes=8 * GIB)
    path, log = fake_scontrol(tmp_path, *NOT_FOUND)
    code = main(["--simulate", str(sc.write(tmp_path / "busy.txt")), "slurm", "epilog", "--scontrol", str(path),
                 "--node", "gpuset", "--timeout", "1", "--json"])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    # Exit 1: slurmd drains the node the Epilog ran on ("Epilog error"), and only that one.
    assert code == 1 and updates(log) == []
    assert "is not one node's name" in doc["node_state_error"]
    (refused,) = [r for r in doc["scontrol"] if r["argv"][1:2] == ["update"]]
    assert refused["ran"] is False and refused["exit_code"] is None and refused["output"].startswith("not run: ")


# --- what Slurm's GPU IDs count: --gpu-ids ---------------------------------------------------------------------------


def swapped(tmp_path: Path) -> Path:
    """NVML's GPU 1 is ``/dev/nvidia0`` and holds 8 GiB; NVML's GPU 0 is ``/dev/nvidia1`` and idle."""
    sc = Scenario.h200(devices=2)
    sc.set_device(0, minor=1)
    sc.set_device(1, minor=0)
    sc.add_process(1, 4_123_456, used_bytes=8 * GIB)
    return sc.write(tmp_path / "swapped.txt")


def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: str,
         gpus: str, *args: str) -> tuple[int, dict[str, Any]]:
    for key in list(os.environ):
        if key.startswith("SLURM"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_GPUS", gpus)
    path, _ = fake_scontrol(tmp_path, "NodeName=n1 State=IDLE ThreadsPerCore=1")
    code = main(["--simulate", str(swapped(tmp_path)), "slurm", command, "--scontrol", str(path), "--node", "n1",
                 "--timeout", "1", "--no-drain", "--json", *args])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("command", ["prolog", "epilog"])
def test_with_autodetect_the_ids_are_nvml_indices(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # AutoDetect=nvml numbers GPUs in PCI order: Slurm's GPU 1 is NVML's GPU 1 (here /dev/nvidia0, held).
    code, doc = gate(tmp_path, monkeypatch, capsys, command, "1", "--gpu-ids", "index")
    assert code == 1 and doc["devices"] == [1] and [c["gpu"] for c in doc["causes"]] == [1]
    # Read as a minor number, the same ID is the idle GPU 0 (/dev/nvidia1): the default, for File=/dev/nvidia[0-N].
    code, doc = gate(tmp_path, monkeypatch, capsys, command, "1")
    assert code == 0 and doc["devices"] == [0]


def test_an_index_that_is_no_gpu_here_is_a_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = gate(tmp_path, monkeypatch, capsys, "prolog", "0,7", "--gpu-ids", "index")
    assert code == 1 and doc["devices"] == [0]
    assert [(c["kind"], c["text"]) for c in doc["causes"]] == [
        ("unknown", "the job's GPU 7 is none of this host's GPUs (NVML indices 0-1)")]


def test_gpu_ids_is_checked_in_the_api(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="gpu_ids must be one of minor, index"):
        slurm.job_gpu_indices(None, ("0",), gpu_ids="pci")  # type: ignore[arg-type]


# --- the drain reason as Slurm keeps it ------------------------------------------------------------------------------


def test_a_reason_never_ends_with_the_double_quote_scontrol_would_drop() -> None:
    cause = slurm.Cause("unknown", 'GPU 2: could not be read: NVML says "Unknown Error"')
    reason = slurm.drain_reason([cause])
    assert reason == "nvmlcheck: GPU 2: could not be read: NVML says \"Unknown Error'"
    # The node found drained with it is drained with this reason already: no drain again (health is idempotent).
    assert slurm.parse_node_line(f"NodeName=n1 State=IDLE+DRAIN Reason={reason} [root@2026-12-02T07:00:00]").reason \
        == reason
    assert slurm.drain_reason([slurm.Cause("held", 'a "quoted" word inside')]).endswith('"quoted" word inside')


# --- MIG: the UUIDs slurmd gives, not the numbers --------------------------------------------------------------------

MIG = "MIG-5f0a0000-0000-5000-8000-000000000001"


def test_uuids_in_cuda_visible_devices_name_the_jobs_gpus() -> None:
    # slurmd's Prolog/Epilog environment for a MIG instance: its place in Slurm's list, and its UUID.
    job = slurm.job_from_env({"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": MIG})
    assert (job.gpus, job.gpus_from) == ((MIG,), "CUDA_VISIBLE_DEVICES")
    # Numbers (or some numbers) there say no more than SLURM_JOB_GPUS; a malformed value there is not read.
    for cvd in ("0", f"1,{MIG}", "garbage"):
        job = slurm.job_from_env({"SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": cvd})
        assert (job.gpus, job.gpus_from) == (("0",), "SLURM_JOB_GPUS")


def test_a_jobs_mig_instance_is_judged_on_its_gpu_not_on_the_gpu_its_number_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, mig=True)
    sc.add_mig_device(1, 0, uuid=MIG, total_bytes=16 * GIB)
    sc.add_process(1, 4_123_456, used_bytes=8 * GIB, gi=1)  # in the job's MIG instance
    for key in list(os.environ):
        if key.startswith("SLURM") or key == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG)
    path, _ = fake_scontrol(tmp_path, "NodeName=n1 State=IDLE ThreadsPerCore=1")
    code = main(["--simulate", str(sc.write(tmp_path / "mig.txt")), "slurm", "prolog", "--scontrol", str(path),
                 "--node", "n1", "--timeout", "1", "--no-drain", "--json"])
    doc = json.loads(capsys.readouterr().out)
    # Before, "0" was read as /dev/nvidia0, the idle GPU 0: ready, with the job's GPU held.
    assert code == 1 and doc["devices"] == [1] and doc["job"]["gpus_from"] == "CUDA_VISIBLE_DEVICES"
