"""``ready``'s health verdicts: each cause's action and what the line tells the operator to do."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub


@pytest.mark.parametrize("code", [99, 4294967295])
def test_an_unknown_recovery_action_claims_nothing_it_does_not_know(gpus: Callable[[Scenario], nc.Session],
                                                                    code: int) -> None:
    """A recovery action code newer than this version (a driver's new action) asks for the strongest action,
    CONTACT_SUPPORT, but its hint said "service the GPU (RMA): a reset does not help": nothing is known of it, and
    the action it names may well be a reset."""
    sc = Scenario.h200()
    sc.set_device(0, recovery_action=code)
    with gpus(sc) as session:
        (v,) = session.ready().verdicts
    assert v.class_ == "unhealthy" and v.actions == ("CONTACT_SUPPORT",)
    line = v.line()
    assert f"ACTION_{code} ({code})" in line and "does not know" in line and "nvidia-smi -q -i 0" in line
    assert "a reset does not help" not in line


def test_a_known_recovery_action_keeps_its_hint(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, recovery_action=1)
    with gpus(sc) as session:
        (v,) = session.ready().verdicts
    assert v.actions == ("RESET_GPU",) and "nvidia-smi -r -i 0" in v.line()
