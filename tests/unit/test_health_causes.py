"""Every combination of the health values, each known, NONE-like or unknown (``None``), against the rules of
docs/health.md: unknown is never a cause, every cause needs an operator, ``action`` is the strongest, and volatile
uncorrectable ECC errors are a cause unless the driver's recovery action reads ``NONE`` (round 6: NVIDIA, GPU Memory
Error Management, "Error Recovery and Response Flags": NONE is "no recovery action is needed")."""

from __future__ import annotations

import itertools

import pytest

from nvmlcheck.model import Health, OperatorAction, RecoveryAction, RemappedRows

ROWS = [None, RemappedRows(0, 0, False, False), RemappedRows(0, 1, True, False), RemappedRows(2, 512, False, True),
        RemappedRows(0, 3, True, True)]
PENDING = [None, False, True]
ECC = [None, 0, 1]
RECOVERY = [None, *RecoveryAction, RecoveryAction(99)]


def _expected(rows: RemappedRows | None, pending: bool | None, ecc: int | None,
              recovery: RecoveryAction | None) -> set[str]:
    out = set()
    if rows is not None and rows.failure:
        out.add("row-remap-failure")
    if rows is not None and rows.pending:
        out.add("row-remap-pending")
    if pending:
        out.add("retired-pages-pending")
    if ecc and recovery is not RecoveryAction.NONE:
        out.add("ecc-uncorrected-volatile")
    if recovery is not None and recovery is not RecoveryAction.NONE:
        out.add("recovery-action")
    return out


@pytest.mark.parametrize("recovery", RECOVERY, ids=lambda r: "unknown" if r is None else r.name)
def test_every_combination(recovery: RecoveryAction | None) -> None:
    for rows, pending, ecc, aggregate in itertools.product(ROWS, PENDING, ECC, ECC):
        h = Health(None, pending, rows, ecc, aggregate, recovery)
        causes = h.causes()
        assert {c.code for c in causes} == _expected(rows, pending, ecc, recovery), h
        assert len({c.code for c in causes}) == len(causes)
        assert all(not c.action.waiting_helps for c in causes), h  # each needs an operator: ready's exit 5
        severities = [c.action.severity for c in causes]
        assert severities == sorted(severities, reverse=True)
        assert h.action == (causes[0].action if causes else None)


def test_nothing_known_is_no_cause() -> None:
    assert Health(None, None, None, None, None, None).causes() == ()


def test_contained_errors_with_recovery_none_are_no_cause_but_with_an_action_are() -> None:
    contained = Health(None, None, RemappedRows(0, 0, False, False), 3, 3, RecoveryAction.NONE)
    assert contained.causes() == () and contained.action is None
    reset = Health(None, None, RemappedRows(0, 0, False, False), 3, 3, RecoveryAction.GPU_RESET)
    assert {c.code for c in reset.causes()} == {"ecc-uncorrected-volatile", "recovery-action"}
    assert reset.action is OperatorAction.RESET_GPU
    old_driver = Health(None, None, RemappedRows(0, 0, False, False), 3, 3, None)
    assert [c.code for c in old_driver.causes()] == ["ecc-uncorrected-volatile"]
