"""``ready --need`` on a GPU in MIG mode selected whole judges the need per instance (a CUDA process runs in one):
the free memory it shows is that instance's, named, not the whole GPU's. Before: "ready (139.8 GiB free, 63.0 GiB
needed)", a figure no job on the GPU could use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nvmlcheck import cli
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30
MIG0 = "MIG-11111111-1111-1111-1111-111111111111"


def mig_gpu(tmp_path: Path) -> str:
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, gi=1, total_bytes=20 * GIB, uuid=MIG0)
    sc.add_mig_device(0, 1, gi=2, total_bytes=71 * GIB)
    return str(sc.write(tmp_path / "mig.txt"))


@pytest.mark.parametrize("backend", ["nvml", "smi"])
def test_ready_shows_the_free_memory_of_the_instance_it_judged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str) -> None:
    path = mig_gpu(tmp_path)
    code = cli.main(["--simulate", path, "--backend", backend, "ready", "--need", "63GiB"])
    out = capsys.readouterr().out
    assert code == 0, out
    line = out.splitlines()[0]
    assert line.startswith("GPU 0: ready (71.0 GiB free in MIG 1 (GI 2, CI 0"), line
    assert "63.0 GiB needed" in line and "139.8" not in line

    code = cli.main(["--simulate", path, "--backend", backend, "--json", "ready", "--need", "63GiB"])
    gpu = json.loads(capsys.readouterr().out)["gpus"][0]
    assert code == 0 and gpu["free_bytes"] == 71 * GIB and gpu["free_in"].startswith("MIG 1 (GI 2, CI 0")
    assert gpu["need_bytes"] == 63 * GIB


def test_short_names_the_instance_with_the_most_free(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--simulate", mig_gpu(tmp_path), "--json", "ready", "--need", "100GiB"])
    gpu = json.loads(capsys.readouterr().out)["gpus"][0]
    assert code == 1 and gpu["class"] == "short"
    assert gpu["free_bytes"] == 71 * GIB and gpu["free_in"].startswith("MIG 1 (GI 2, CI 0")


def test_a_whole_gpu_and_one_instance_show_their_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = Scenario.h200().write(tmp_path / "whole.txt")
    assert cli.main(["--simulate", str(whole), "--json", "ready", "--need", "63GiB"]) == 0
    gpu = json.loads(capsys.readouterr().out)["gpus"][0]
    assert gpu["free_in"] is None and gpu["free_bytes"] > 139 * GIB
    assert cli.main(["--simulate", mig_gpu(tmp_path), "ready", "--need", "10GiB", "--devices", MIG0]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line == f"GPU 0 MIG 0 (GI 1, CI 0, {MIG0}): ready (20.0 GiB free, 10.0 GiB needed)"


def test_a_mig_mode_that_could_not_be_read_is_unknown_with_or_without_a_need(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its MIG mode unread (NO_PERMISSION): in MIG mode with no instance no CUDA job can run there (short), so
    without a need ``ready`` said ready where that could not be told (select passes such a GPU over)."""
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetMigMode", 4)
    path = str(sc.write(tmp_path / "s.txt"))
    for need in ((), ("--need", "0.5")):
        code = cli.main(["--simulate", path, "--json", "ready", *need])
        (gpu,) = json.loads(capsys.readouterr().out)["gpus"]
        assert code == 1 and gpu["class"] == "unknown", gpu["line"]
        assert any(c["kind"] == "capacity" and "MIG mode could not be read" in c["reason"] for c in gpu["culprits"])


def test_an_nvidia_smi_older_than_mig_is_judged_as_before_mig(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An nvidia-smi that does not know ``mig.mode.current`` comes with a driver that has no MIG: its GPUs are
    judged as before MIG. ``ready --need`` said unknown ("its MIG mode could not be read") and ``select`` passed every
    GPU over, on every such host."""
    monkeypatch.setenv("FAKE_SMI_REFUSE_FIELDS", "mig.mode.current")
    path = str(Scenario.h200().write(tmp_path / "s.txt"))
    for need in ((), ("--need", "0.5")):
        assert cli.main(["--simulate", path, "--backend", "smi", "ready", *need]) == 0, capsys.readouterr()
        assert capsys.readouterr().out.startswith("GPU 0: ready")
    assert cli.main(["--simulate", path, "--backend", "smi", "select", "1", "--format", "index"]) == 0
    assert capsys.readouterr().out == "0\n"
    # select's default format (cuda: the CUDA numbering) judges it the same: it refused "a MIG mode that could not
    # be read" (exit 2); a failed reading still stays unknown (tests/unit/test_cudamap*.py).
    assert cli.main(["--simulate", path, "--backend", "smi", "select", "1"]) == 0, capsys.readouterr()
    assert capsys.readouterr().out == "0\n"
