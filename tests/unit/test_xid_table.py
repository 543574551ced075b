"""Issue 22: the XID table's class and operator action, checked against NVIDIA's XID catalogue ("Analyzing Xid Errors
with the Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read 2026-12-01; read
again 2026-12-02 with its "XID 144-150 Decode" table for 54, 142, 144-150 and 159)."""

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
    54: "CHECK_MECHANICALS", 142: "CONTACT_SUPPORT", 159: "CHECK_UVM",
    144: "WORKFLOW_NVLINK5_ERR", 145: "WORKFLOW_NVLINK5_ERR", 146: "WORKFLOW_NVLINK5_ERR", 147: "WORKFLOW_NVLINK5_ERR",
    148: "WORKFLOW_NVLINK5_ERR", 149: "WORKFLOW_NVLINK5_ERR", 150: "WORKFLOW_NVLINK5_ERR",
}  # fmt: skip
# Buckets whose action is the operator's (the GPU cannot be used again without them). WORKFLOW_XID_48 and
# WORKFLOW_NVLINK_ERR: the catalogue's text for 48 and 74 says "A GPU reset or node reboot is needed"; RESTART_VM:
# the VM's reboot, the node's for its guest.
# CHECK_MECHANICALS (XID 54): hands on the board; CONTACT_SUPPORT (142): a service call; CHECK_UVM (159): "with UVM
# in use, RESET_GPU", and CUDA uses UVM.
OPERATOR_BUCKETS = {"RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48", "WORKFLOW_NVLINK_ERR",
                    "CHECK_MECHANICALS", "CONTACT_SUPPORT", "CHECK_UVM"}
# The decode table's immediate action for every subcode of each of XIDs 144-150, as read on 2026-12-02.
NVLINK5_SUBCODE_ACTIONS = {
    144: {"IGNORE", "RESET_GPU"}, 145: {"IGNORE", "XID_154_EVAL", "RESET_GPU"}, 146: {"IGNORE", "RESET_GPU"},
    147: {"IGNORE"}, 148: {"IGNORE"}, 149: {"IGNORE", "RESET_GPU"}, 150: {"RESET_GPU"},
}  # fmt: skip
# Every XID of the catalogue (read 2026-12-02) whose immediate action is an operator's (a GPU reset, a bare-metal or
# VM restart, a workflow that says a reset or reboot is needed, the board's connections, a service call), whichever
# GPUs it applies to, and 150, whose every subcode resets. 144-146 and 149 are not: their action depends on a
# subcode the event does not carry.
CATALOGUE_OPERATOR_XIDS = (
    46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 150, 151, 155, 156, 158, 159,
)  # fmt: skip


def test_every_entry_has_its_fields() -> None:
    for code, info in XID_TABLE.items():
        assert isinstance(info, XidInfo) and info.code == code and info.meaning
        if info.depends_on_subcode:  # no action to give: never fatal by itself
            assert (info.action, info.fatal) == (None, False), code
            continue
        assert isinstance(info.action, OperatorAction)
        assert info.fatal is (not info.action.waiting_helps), code
        assert info.bucket or code == 999, code  # 999 is NVML's "could not identify", not a catalogue entry


def test_the_table_matches_the_catalogue() -> None:
    assert {c: x.bucket for c, x in XID_TABLE.items() if c != 999} == CATALOGUE_BUCKETS
    for code, bucket in CATALOGUE_BUCKETS.items():
        if bucket == "WORKFLOW_NVLINK5_ERR":
            continue  # by subcode: below
        assert XID_TABLE[code].fatal is (bucket in OPERATOR_BUCKETS), code


def test_the_nvlink5_xids_follow_their_decode_table() -> None:
    # 144-150 were left out: an XID 150 (every subcode a GPU reset) was "not in the table" and a wait ended clean.
    for code, actions in NVLINK5_SUBCODE_ACTIONS.items():
        info = xid_info(code)
        assert info.bucket == "WORKFLOW_NVLINK5_ERR", code
        if actions == {"RESET_GPU"}:
            assert (info.fatal, info.action) == (True, OperatorAction.RESET_GPU), code
        elif actions == {"IGNORE"}:
            assert (info.fatal, info.action) == (False, OperatorAction.IGNORE), code
        else:  # the event does not say which subcode: no action guessed, recorded, ready reads the recovery action
            assert (info.fatal, info.action, info.depends_on_subcode) == (False, None, True), code
            assert "recovery action" in info.meaning, code


def test_54_and_159_need_an_operator() -> None:
    # XID 54 (auxiliary power not connected: CHECK_MECHANICALS) and 159 (CHI non-data error: CHECK_UVM, a reset
    # with UVM in use) were "not in the table": recorded, and a wait ended clean on a GPU needing hands or a reset.
    assert (XID_TABLE[54].fatal, XID_TABLE[54].action) == (True, OperatorAction.CHECK_MECHANICALS)
    assert (XID_TABLE[159].fatal, XID_TABLE[159].action) == (True, OperatorAction.RESET_GPU)
    assert OperatorAction.NODE_REBOOT.severity < OperatorAction.CHECK_MECHANICALS.severity
    assert OperatorAction.CHECK_MECHANICALS.severity < OperatorAction.CONTACT_SUPPORT.severity


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
