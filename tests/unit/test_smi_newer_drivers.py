"""Issue 11, part 1: WDDM/WSL2 placeholders, driver 610's deprecation notes and every spelling of the device-handle
error, read by the pure parsers and by SmiBackend end to end (tests/data/nvidia-smi/constructed-*, replayed by
tests/data/nvidia-smi/replay/smi_replay.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.backends import smi_csv
from nvmlcheck.backends.smi import SmiBackend
from nvmlcheck.errors import GpuLost, SmiParseError
from nvmlcheck.model import MIB, Fields

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
REPLAY = DATA / "replay" / "smi_replay.py"


def replay(name: str) -> SmiBackend:
    return SmiBackend(command=[sys.executable, "-S", str(REPLAY), str(DATA / name)])


def read(name: str, file: str) -> str:
    return (DATA / name / file).read_text(encoding="utf-8")


# --- WDDM / WSL2 ------------------------------------------------------------------------------------------------------


def test_wddm_bytes_are_unknown_not_zero_and_the_listing_goes_on() -> None:
    listing = smi_csv.parse_pids_query(read("constructed-wddm", "q_pids.stdout"))
    procs = listing.compute["00000000:01:00.0"]
    assert [p.pid for p in procs] == [4212, 9876]
    assert all(p.used_bytes is None for p in procs)
    assert [p.pid for p in listing.graphics["00000000:01:00.0"]] == [4212]  # C+G: listed under both kinds
    assert "WDDM" in listing.bytes_unknown["00000000:01:00.0"]


def test_wddm_snapshot_through_the_backend() -> None:
    with replay("constructed-wddm") as b:
        d = b.snapshot(fields=Fields.MEMORY | Fields.PROCESSES).device(0)
    assert d.memory is not None and d.memory.used_bytes == 1873 * MIB
    assert d.processes is not None and {p.used_bytes for p in d.processes} == {None}
    assert "WDDM" in (d.why_unknown("processes.used_bytes") or "")


def test_wddm_verdict_names_holders_with_unknown_amounts() -> None:
    with replay("constructed-wddm") as b:
        verdict = nc.default_predicate().evaluate(b.snapshot(fields=Fields.WAIT))
    assert verdict.satisfied is False
    assert any("pid 9876" in r and "unknown amount" in r for r in verdict.reasons)


@pytest.mark.parametrize(
    "value",
    ["Not available in WDDM driver model", "Not Supported", "Not available", "[N/A]", "N/A", "[Unknown Error]"],
)
def test_used_gpu_memory_placeholders(value: str) -> None:
    text = read("constructed-wddm", "q_pids.stdout").replace("Not available in WDDM driver model", value)
    listing = smi_csv.parse_pids_query(text)
    assert [p.used_bytes for p in listing.compute["00000000:01:00.0"]] == [None, None]


def test_garbage_in_an_entry_quotes_its_own_line_and_number() -> None:
    text = read("constructed-wddm", "q_pids.stdout").replace("Not available in WDDM driver model", "12 GiB", 1)
    (error,) = smi_csv.parse_pids_query(text).failed.values()
    assert isinstance(error, SmiParseError)
    lines = text.split("\n")
    assert "Used GPU Memory" in error.line and "12 GiB" in error.line
    assert lines[error.line_no - 1] == error.line  # the number is that line's, not the entry's first


def test_a_bad_type_quotes_the_type_line() -> None:
    text = read("constructed-wddm", "q_pids.stdout").replace(": C+G", ": X")
    (error,) = smi_csv.parse_pids_query(text).failed.values()
    assert isinstance(error, SmiParseError)
    assert error.line.strip().startswith("Type")
    assert text.split("\n")[error.line_no - 1] == error.line


# --- driver 610 -------------------------------------------------------------------------------------------------------


def test_610_q_header_versions_lose_their_notes() -> None:
    listing = smi_csv.parse_pids_query(read("constructed-driver-610", "q_pids.stdout"))
    assert listing.driver_version == "610.47"
    assert listing.cuda_version == "13.3"
    assert listing.compute["00000000:18:00.0"] == ()


def test_610_q_old_names_only_with_notes() -> None:
    text = "\n".join(
        line
        for line in read("constructed-driver-610", "q_pids.stdout").split("\n")
        if not line.startswith(("KMD", "CUDA UMD"))
    )
    listing = smi_csv.parse_pids_query(text)
    assert (listing.driver_version, listing.cuda_version) == ("610.47", "13.3")
    assert "Deprecated" in listing.notes["CUDA Version"]


def test_a_note_with_no_value_is_unknown_with_a_reason() -> None:
    text = read("constructed-driver-610", "q_pids.stdout").replace("13.3 [Deprecated", "[Deprecated")
    text = "\n".join(line for line in text.split("\n") if not line.startswith("CUDA UMD"))
    listing = smi_csv.parse_pids_query(text)
    assert listing.cuda_version is None
    assert "deprecation note" in listing.notes["CUDA Version"]


def test_610_version_output_parses_and_cuda_is_not_a_number() -> None:
    versions = smi_csv.parse_version_output(read("constructed-driver-610", "version.stdout"))
    assert versions["cuda version"].startswith("Deprecated")
    assert smi_csv.cuda_version_number(versions["cuda version"]) is None
    assert smi_csv.parse_version_output("CUDA Version : 13.3 [Deprecated; use CUDA UMD Version]\n") == {
        "cuda version": "13.3"
    }


def test_610_backend_snapshot_and_cuda_version() -> None:
    with replay("constructed-driver-610") as b:
        before = b.system()
        assert before.cuda_driver_version is None
        assert "deprecated" in (before.unknown.get("cuda_driver_version") or "")
        snap = b.snapshot(fields=Fields.WAIT)
        assert nc.default_predicate().evaluate(snap).clean
        # -q's "CUDA UMD Version" answers what --version no longer does.
        assert b.system().cuda_driver_version == 13030
        assert b.system().driver_version == "610.47"


# --- device-handle errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "bus", "code"),
    [
        ("Unable to determine the device handle for GPU0000:07:00.0: Unknown Error", "00000000:07:00.0", 999),
        ("Unable to determine the device handle for GPU 0000:07:00.0: Unknown Error", "00000000:07:00.0", 999),
        ("Unable to detect the device handle for GPU 000:0A:00.0: GPU is lost. Reboot", "00000000:0A:00.0", 15),
        ("unable to determine the device handle for gpu 00000000:0b:00.0: GPU requires reset", "00000000:0B:00.0", 16),
        ("Unable to determine the device handle for GPU0000:07:00.0", "00000000:07:00.0", 999),
        ("GPU 0000:0C:00.0: GPU is lost", "00000000:0C:00.0", 15),
    ],
)
def test_handle_error_spellings(line: str, bus: str, code: int) -> None:
    head = "index, uuid, pci.bus_id\n0, GPU-1, 00000000:02:00.0\n"
    records, failures = smi_csv.parse_query_gpu(f"{head}{line}\n")
    assert [r.index for r in records] == [0]
    assert [(f.pci_bus_id, f.code) for f in failures] == [(bus, code)]
    assert bus in failures[0].message
    listing = smi_csv.parse_pids_query(
        f"Driver Version : 590.48.01\n\nGPU 00000000:02:00.0\n    Processes : None\n{line}\n"
    )
    assert [(f.pci_bus_id, f.code) for f in listing.failures] == [(bus, code)]


def test_handle_errors_are_per_gpu_failures_in_a_snapshot() -> None:
    with replay("constructed-handle-errors") as b:
        assert b.device_count() == 4
        snap = b.snapshot(fields=Fields.WAIT)
    assert [d.index for d in snap.devices] == [0]
    assert [f.index for f in snap.failures] == [1, 2, 3]
    errors = {f.index: f.error for f in snap.failures}
    assert "00000000:07:00.0" in str(errors[1]) and getattr(errors[1], "code", None) == 999
    assert isinstance(errors[2], GpuLost) and "00000000:0A:00.0" in str(errors[2])
    assert isinstance(errors[3], GpuLost) and "00000000:0C:00.0" in str(errors[3])
    assert snap.device(0).processes == ()
    assert not nc.default_predicate().evaluate(snap).clean  # unreadable GPUs are never clean
