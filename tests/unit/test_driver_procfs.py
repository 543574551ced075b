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
    assert gpus == () and problem == f"{tmp_path} lists no GPU with a device minor number of its own"
    gpus, problem = read_driver_gpus(str(tmp_path / "absent"))
    assert gpus == () and problem == f"{tmp_path / 'absent'}: No such file or directory"


@pytest.mark.parametrize("minor", ["\u00b2", "\u0663", "-1", "0x1", "1 2", "9" * 40])
def test_a_minor_that_is_not_plain_digits_is_left_out_not_an_exception(tmp_path: Path, minor: str) -> None:
    # "²".isdigit() is True and int("²") raises: that ValueError escaped opening the smi backend.
    write(tmp_path, "0000:18:00.0", H200.format(uuid="GPU-aaaa", bus="0000:18:00.0", minor=minor))
    write(tmp_path, "0000:19:00.0", H200.format(uuid="GPU-bbbb", bus="0000:19:00.0", minor=1))
    gpus, problem = read_driver_gpus(str(tmp_path))
    assert gpus == (DriverGpu("GPU-bbbb", "0000:19:00.0", 1),) and problem is None


def test_non_utf8_bytes_do_not_stop_the_reading(tmp_path: Path) -> None:
    (tmp_path / "0000:18:00.0").mkdir()
    text = H200.format(uuid="GPU-aaaa", bus="0000:18:00.0", minor=3).replace("NVIDIA H200", "\udcff")
    (tmp_path / "0000:18:00.0" / "information").write_bytes(text.encode("utf-8", "surrogateescape"))
    assert read_driver_gpus(str(tmp_path))[0] == (DriverGpu("GPU-aaaa", "0000:18:00.0", 3),)


@pytest.mark.parametrize("clash", ["minor", "uuid", "bus"])
def test_what_two_files_claim_names_neither_gpu(tmp_path: Path, clash: str) -> None:
    write(tmp_path, "0000:18:00.0", H200.format(uuid="GPU-aaaa", bus="0000:18:00.0", minor=0))
    write(tmp_path, "0000:19:00.0", H200.format(uuid="GPU-aaaa" if clash == "uuid" else "GPU-bbbb",
                                               bus="0000:18:00.0" if clash == "bus" else "0000:19:00.0",
                                               minor=0 if clash == "minor" else 1))
    write(tmp_path, "0000:20:00.0", H200.format(uuid="GPU-cccc", bus="0000:20:00.0", minor=2))
    gpus, problem = read_driver_gpus(str(tmp_path))
    assert gpus == (DriverGpu("GPU-cccc", "0000:20:00.0", 2),) and problem is None
