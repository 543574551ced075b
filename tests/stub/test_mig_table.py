"""The human snapshot views of a GPU in MIG mode: each MIG instance is a row of its own under its GPU (its own
memory, processes and MIG- UUID), and what cannot be shown says why; the procs view gives each process's GPU and
compute instance, as nvidia-smi's process table does. Both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmlcheck import cli
from nvmlcheck.testing import Scenario

from .conftest import GIB, MIB, MIG0, MIG1
from .conftest import two_instances as _two_instances

pytestmark = pytest.mark.stub


def two_instances() -> Scenario:
    sc = _two_instances(in1=4242)
    sc.add_process(1, 4243, used_bytes=GIB)
    return sc


def run(sc: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str], *words: str) -> list[str]:
    path = str(sc.write(tmp_path / "s.txt"))
    cli.main(["--simulate", path, *words])
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("backend", ["nvml", "smi"])
def test_the_devices_view_shows_each_instance_under_its_gpu(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = run(two_instances(), tmp_path, capsys, "--backend", backend, "snapshot")
    gpu0 = next(i for i, line in enumerate(lines) if line.startswith("0 "))
    inst0, inst1, gpu1 = lines[gpu0 + 1:gpu0 + 4]
    assert "MIG 0 GI 1 CI 0" in inst0 and inst0.endswith(MIG0) and "16.0 GiB" in inst0
    assert "MIG 1 GI 2 CI 0" in inst1 and inst1.endswith(MIG1) and "1.0 GiB" in inst1 and "32.0 GiB" in inst1
    assert inst1.split()[-2] == "1"  # its process
    assert gpu1.startswith("1 ") and not any("MIG" in line for line in lines[gpu0 + 3:])


def test_unknown_mig_state_is_said_never_shown_as_a_gpu_without_instances(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = two_instances()
    sc.fault("nvmlDeviceGetMaxMigDeviceCount", 999, device=0)  # NVML_ERROR_UNKNOWN
    lines = run(sc, tmp_path, capsys, "snapshot")
    assert any("MIG mode: its MIG devices are unknown" in line for line in lines), lines
    sc = two_instances()
    sc.fault("nvmlDeviceGetMigMode", 999, device=1)
    lines = run(sc, tmp_path, capsys, "snapshot")
    assert any(line.startswith("    (MIG mode unknown:") for line in lines), lines
    sc = Scenario.h200(1)
    sc.set_device(0, mig=True, used_bytes=55 * MIB)
    lines = run(sc, tmp_path, capsys, "snapshot")
    assert any("no MIG instance created" in line for line in lines), lines


def test_the_procs_view_gives_each_processs_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = run(two_instances(), tmp_path, capsys, "snapshot", "procs")
    assert lines[0].split()[:4] == ["GPU", "GI", "CI", "pid"]
    assert lines[1].split()[:4] == ["0", "2", "0", "4242"]
    assert lines[2].split()[:4] == ["1", "-", "-", "4243"]
