"""The driver's procfs list of GPUs (``/proc/driver/nvidia/gpus``): what the nvidia-smi backend reads minor numbers
from. Files as driver 580 writes them (tabs and spaces after the colon), and the ways they are incomplete."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmlcheck.backends._driver_procfs import DriverGpu, normal_bus_id, read_driver_gpus

H200 = ("Model: \t\t NVIDIA H200\nIRQ:   \t\t 151\nGPU UUID: \t {uuid}\nVideo BIOS: \t 96.00.af.00.01\n"
        "Bus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
        "Device Minor: \t {minor}\nGPU Excluded:\t No\n")


def write(root: Path, bus: str, text: str) -> None:
    (root / bus).mkdir(parents=True)
    (root / bus / "information").write_text(text)


@pytest.mark.parametrize(("given", "normal"), [
    ("00000000:18:00.0", "0000:18:00.0"), ("0000:18:00.0", "0000:18:00.0"), ("00000001:AB:00.0", "0001:ab:00.0"),
    ("junk", "junk"), ("zz:18:00.0", "zz:18:00.0"),
])
def test_nvml_and_procfs_bus_ids_meet_in_one_form(given: str, normal: str) -> None:
    assert normal_bus_id(given) == normal


def test_every_gpu_with_its_uuid_bus_and_minor(tmp_path: Path) -> None:
    write(tmp_path, "0000:18:00.0", H200.format(uuid="GPU-aaaa", bus="0000:18:00.0", minor=6))
    write(tmp_path, "0000:2A:00.0", H200.format(uuid="??", bus="0000:2A:00.0", minor=0))
    gpus, problem = read_driver_gpus(str(tmp_path))
    assert problem is None
    # A UUID the driver has not read yet ("??") is no UUID: the bus id is what matches then.
    assert gpus == (DriverGpu("GPU-aaaa", "0000:18:00.0", 6), DriverGpu(None, "0000:2a:00.0", 0))


def test_a_gpu_without_a_readable_minor_is_left_out_and_none_is_a_reason(tmp_path: Path) -> None:
    write(tmp_path, "0000:18:00.0", "Model: \t\t NVIDIA H200\nDevice Minor: \t ?\n")
    (tmp_path / "0000:19:00.0").mkdir()  # no information file
    gpus, problem = read_driver_gpus(str(tmp_path))
    assert gpus == () and problem == f"{tmp_path} lists no GPU with a device minor number"
    gpus, problem = read_driver_gpus(str(tmp_path / "absent"))
    assert gpus == () and problem == f"{tmp_path / 'absent'}: No such file or directory"
