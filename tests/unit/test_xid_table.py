"""Issue 22: the XID table's class and operator action, checked against NVIDIA's XID catalogue ("Analyzing Xid Errors
with the Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read 2026-12-01)."""

from __future__ import annotations

from nvmlcheck.events import XID_TABLE, XidInfo, xid_info
from nvmlcheck.model import OperatorAction

# The catalogue's "Resolution Bucket (Immediate Action)" for each XID in the table, as read on that date.
CATALOGUE_BUCKETS = {
    13: "RESTART_APP", 31: "RESTART_APP", 43: "IGNORE", 45: "WORKFLOW_XID_45", 46: "RESET_GPU",
    48: "WORKFLOW_XID_48", 62: "RESET_GPU", 63: "IGNORE", 64: "RESET_GPU", 74: "WORKFLOW_NVLINK_ERR",
    79: "RESTART_BM", 92: "IGNORE", 94: "RESTART_APP", 95: "RESET_GPU", 109: "RESET_GPU", 119: "RESET_GPU",
    120: "RESET_GPU", 140: "RESET_GPU", 143: "RESET_GPU", 154: "XID_154", 156: "RESET_GPU", 158: "RESET_GPU",
    110: "RESET_GPU", 136: "RESET_GPU", 151: "RESTART_VM", 155: "RESET_GPU", 157: "IGNORE",
}  # fmt: skip
# Buckets whose action is the operator's (the GPU cannot be used again without them). WORKFLOW_XID_48 and
# WORKFLOW_NVLINK_ERR: the catalogue's text for 48 and 74 says "A GPU reset or node reboot is needed"; RESTART_VM:
# the VM's reboot, the node's for its guest.
OPERATOR_BUCKETS = {"RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR"}
# Every XID of the catalogue (read 2026-12-02) whose immediate action is a GPU reset, a bare-metal or VM restart, or
# whose workflow says a reset or reboot is needed, whichever GPUs it applies to. 144-150 (WORKFLOW_NVLINK5_ERR) are
# not: their action depends on a subcode the event does not carry.
CATALOGUE_OPERATOR_XIDS = (
    46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158,
)  # fmt: skip


def test_every_entry_has_its_fields() -> None:
    for code, info in XID_TABLE.items():
        assert isinstance(info, XidInfo) and info.code == code
        assert info.meaning and isinstance(info.action, OperatorAction)
        assert info.fatal is (not info.action.waiting_helps), code
        assert info.bucket or code == 999, code  # 999 is NVML's "could not identify", not a catalogue entry


def test_the_table_matches_the_catalogue() -> None:
    assert {c: x.bucket for c, x in XID_TABLE.items() if c != 999} == CATALOGUE_BUCKETS
    for code, bucket in CATALOGUE_BUCKETS.items():
        assert XID_TABLE[code].fatal is (bucket in OPERATOR_BUCKETS), code


def test_92_and_94_are_recorded_as_the_catalogue_says() -> None:
    # Classed from memory before issue 22; the catalogue: 92 IGNORE (high single-bit rate), 94 RESTART_APP (the error
    # was contained to one application; the GPU keeps running and a reset can wait).
    assert (XID_TABLE[92].fatal, XID_TABLE[92].action) == (False, OperatorAction.IGNORE)
    assert (XID_TABLE[94].fatal, XID_TABLE[94].action) == (False, OperatorAction.RESTART_APP)
    assert XID_TABLE[79].action is OperatorAction.NODE_REBOOT  # RESTART_BM: restart the bare-metal node


def test_an_unknown_code_is_recorded_with_no_action() -> None:
    info = xid_info(12345)
    assert (info.fatal, info.bucket, info.action) == (False, "", None)


def test_every_xid_the_catalogue_resets_for_is_fatal() -> None:
    # 110 (security fault), 136 (link training failed, H100) and 155 (NVLink SW-defined error) were missing: their
    # event was "not in the table", recorded, and a wait ended clean on a GPU that needs a reset.
    missing = [code for code in CATALOGUE_OPERATOR_XIDS if not xid_info(code).fatal]
    assert missing == []
