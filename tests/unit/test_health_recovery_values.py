"""Round 6: a recovery action whose value cannot be trusted is unknown, never ``NONE`` (healthy).

NVML answers the field as a tagged union (``nvmlFieldValue_t``): its bits read through the wrong member, or a value
beyond the enum's 32 bits masked down, could name any action, ``NONE`` included. nvidia-smi prints it as words or a
number; a number beyond 32 bits was masked the same way (4294967296 read as ``NONE``).
"""

from __future__ import annotations

from typing import Any

import pytest

from nvmlcheck._nvml._ffi import ffi
from nvmlcheck._nvml.calls import recovery_action_of
from nvmlcheck.backends._smi.queries import parse_recovery_action
from nvmlcheck.backends.smi_csv import parse_query_gpu
from nvmlcheck.model import RecoveryAction

UUID = "GPU-1c0f6a52-93e4-4d7b-8a21-5b0c3e9d7f10"


def _field(kind: int, member: str, value: float) -> Any:
    v: Any = ffi.new("nvmlFieldValue_t *")
    v.valueType = kind
    setattr(v.value, member, value)
    return v


@pytest.mark.parametrize(
    ("kind", "member", "value", "expected"),
    [
        (1, "uiVal", 0, RecoveryAction.NONE),  # what driver 580 answers on an H200 (docs/health.md)
        (1, "uiVal", 1, RecoveryAction.GPU_RESET),
        (2, "ulVal", 4, RecoveryAction.DRAIN_AND_RESET),
        (3, "ullVal", 2, RecoveryAction.NODE_REBOOT),
        (4, "sllVal", 3, RecoveryAction.DRAIN_P2P),
        (5, "siVal", 6, RecoveryAction.BUS_RESET),
        (6, "usVal", 7, RecoveryAction.SYSTEM_REBOOT),
        (3, "ullVal", 0xFFFFFFFF, 0xFFFFFFFF),  # the largest code: a new action, kept as ACTION_<n>
    ],
)
def test_each_integer_type_reads_its_own_member(kind: int, member: str, value: int, expected: int) -> None:
    action = recovery_action_of(_field(kind, member, value))
    assert isinstance(action, RecoveryAction) and action == expected


@pytest.mark.parametrize(
    ("kind", "member", "value"),
    [
        (0, "dVal", 1.0),  # a double: its low 32 bits are 0, which read as NONE
        (0, "dVal", 0.0),
        (7, "ullVal", 0),  # a value type a newer header adds
        (3, "ullVal", 1 << 32),  # masked to 32 bits: NONE
        (3, "ullVal", (1 << 32) + 1),  # masked: GPU_RESET, an action the driver never named
        (4, "sllVal", -1),
        (5, "siVal", -2),
    ],
)
def test_a_value_that_cannot_be_trusted_is_unknown_with_its_reason(kind: int, member: str, value: float) -> None:
    why = recovery_action_of(_field(kind, member, value))
    assert isinstance(why, str), why
    assert why.startswith("unreadable: nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)")
    assert "not supported" not in why  # the GPU has the value: ready refuses it as unknown, never notes it


@pytest.mark.parametrize("text", ["4294967296", "4294967297", "18446744073709551616"])
def test_an_smi_number_beyond_32_bits_is_unknown(text: str) -> None:
    assert parse_recovery_action(text) is None
    (record,), failures = parse_query_gpu(f"index, uuid, gpu_recovery_action\n0, {UUID}, {text}\n")
    assert failures == () and record.recovery_action is None
    assert text in record.unknown["health.recovery_action"]


def test_an_smi_number_within_32_bits_is_kept() -> None:
    assert parse_recovery_action("4294967295") == 0xFFFFFFFF
    assert parse_recovery_action("0") is RecoveryAction.NONE
