"""Issue 22: the health fields read from nvidia-smi text, by the pure parser and by SmiBackend end to end over
constructed captures in the real driver-580 format (tests/data/nvidia-smi/constructed-health, README there)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nvmlcheck.backends._smi.queries import GpuRecord, parse_recovery_action
from nvmlcheck.backends._smi.text import HandleFailure
from nvmlcheck.backends.smi import SmiBackend
from nvmlcheck.backends.smi_csv import parse_query_gpu
from nvmlcheck.model import Fields, OperatorAction, RecoveryAction, RemappedRows, RetirementCause

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
REPLAY = DATA / "replay" / "smi_replay.py"
HEALTH = DATA / "constructed-health"
UUID = "GPU-1c0f6a52-93e4-4d7b-8a21-5b0c3e9d7f10"


def test_recovery_action_spellings() -> None:
    # "None" as captured on driver 580; the others as nvidia-smi -q prints them on faulted GPUs in public reports.
    assert parse_recovery_action("None") is RecoveryAction.NONE
    assert parse_recovery_action("Reset") is RecoveryAction.GPU_RESET
    assert parse_recovery_action("GPU_RESET") is RecoveryAction.GPU_RESET
    assert parse_recovery_action("Reboot") is RecoveryAction.NODE_REBOOT
    assert parse_recovery_action("Node Reboot Required") is RecoveryAction.NODE_REBOOT
    assert parse_recovery_action("Drain P2P") is RecoveryAction.DRAIN_P2P
    assert parse_recovery_action("Drain and Reset") is RecoveryAction.DRAIN_AND_RESET
    assert int(parse_recovery_action("9") or 0) == 9
    assert parse_recovery_action("Something new") is None


def test_the_real_h200_capture_reads_as_healthy() -> None:
    text = (DATA / "h200-driver-580.159.04" / "query_gpu_units.stdout").read_text(encoding="utf-8")
    (record,), failures = parse_query_gpu(text)
    assert failures == ()
    assert record.recovery_action is RecoveryAction.NONE


def test_an_unknown_recovery_text_is_unknown_with_the_text() -> None:
    text = "index, uuid, gpu_recovery_action\n0, GPU-1c0f6a52-93e4-4d7b-8a21-5b0c3e9d7f10, Ask Again Later\n"
    (record,), _ = parse_query_gpu(text)
    assert record.recovery_action is None
    assert "'Ask Again Later'" in record.unknown["health.recovery_action"]


def test_constructed_health_states_end_to_end() -> None:
    with SmiBackend(command=[sys.executable, "-S", str(REPLAY), str(HEALTH)]) as b:
        snap = b.snapshot(fields=Fields.HEALTH)
    h = [d.health for d in snap.devices if d.health is not None]
    assert len(h) == 4
    h0, h1, h2, h3 = h
    assert h0.causes() == () and h0.recovery_action is RecoveryAction.NONE
    assert h1.remapped_rows == RemappedRows(0, 1, True, False)
    assert (h1.ecc_uncorrected_volatile, h1.ecc_uncorrected_aggregate) == (1, 1)
    assert [c.code for c in h1.causes()] == ["row-remap-pending", "ecc-uncorrected-volatile", "recovery-action"]
    assert h1.action is OperatorAction.RESET_GPU
    assert [c.code for c in h2.causes()] == ["row-remap-failure"]
    assert h2.action is OperatorAction.CONTACT_SUPPORT and h2.ecc_uncorrected_aggregate == 37
    assert h3.retired_pages_pending is True and h3.remapped_rows is None
    assert h3.retired_pages is not None and [p.cause for p in h3.retired_pages] == [RetirementCause.DOUBLE_BIT_ECC]
    assert {c.code for c in h3.causes()} == {"retired-pages-pending", "ecc-uncorrected-volatile"}
    d3 = snap.devices[3]
    assert h3.recovery_action is None and "[N/A]" in (d3.why_unknown("health.recovery_action") or "")


def test_health_is_not_asked_for_on_the_wait_path() -> None:
    with SmiBackend(command=[sys.executable, "-S", str(REPLAY), str(HEALTH)]) as b:
        d = b.snapshot([1], fields=Fields.MEMORY).devices[0]
    assert d.health is None and d.why_unknown("health") == "not requested"


@pytest.mark.parametrize(("column", "value"), [
    ("ecc.errors.uncorrected.volatile.total", str(1 << 64)),
    ("ecc.errors.uncorrected.aggregate.total", str(1 << 64)),
    ("remapped_rows.correctable", str(1 << 32)),
    ("remapped_rows.uncorrectable", str(1 << 32)),
    ("retired_pages.single_bit_ecc.count", str(1 << 32)),
    ("retired_pages.double_bit.count", str(1 << 32)),
])
def test_a_health_count_beyond_nvmls_counter_is_refused_as_a_misread(column: str, value: str) -> None:
    """Round 6: a count no NVML counter holds was taken as read (a volatile ECC total of 2**64 raised a cause);
    refused now, the GPU failed with the column named, as a negative count is."""
    columns = ["remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
               "remapped_rows.failure", "ecc.errors.uncorrected.volatile.total",
               "ecc.errors.uncorrected.aggregate.total", "retired_pages.single_bit_ecc.count",
               "retired_pages.double_bit.count"]
    cells = {c: "0" for c in columns} | {"remapped_rows.pending": "No", "remapped_rows.failure": "No"}
    header = "index, uuid, " + ", ".join(columns)
    def parse(cell: str) -> tuple[tuple[GpuRecord, ...], tuple[HandleFailure, ...]]:
        row = ", ".join(cell if c == column else cells[c] for c in columns)
        return parse_query_gpu(f"{header}\n0, {UUID}, {row}\n")

    (record,), failures = parse(str(int(value) - 1))  # the largest the counter holds is read
    assert failures == () and record is not None
    records, failures = parse(value)
    assert len(records) == 0
    assert len(failures) == 1 and column in str(failures[0].error) and "bit counter" in str(failures[0].error)
