"""A timeout the caller's setup used up (``_deadline.left_s``: the least positive timeout) is said as such, not as a
reading still running at the deadline: nothing was running."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._deadline import USED_UP_S
from nvmlcheck.testing import Scenario, build_stub

pytestmark = pytest.mark.stub
GIB = 1 << 30


def _mig(scenario_path: Path) -> str:
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, total_bytes=18 * GIB)
    sc.write(scenario_path)
    return "MIG-00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize("selector", ["mig", "index"])
def test_a_used_up_wait_says_the_timeout_was_used_up(scenario_path: Path, selector: str) -> None:
    mig = _mig(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus, pytest.raises(nc.WaitTimeout) as info:
        gpus.wait_until_clean(USED_UP_S, devices=[mig] if selector == "mig" else [0])
    (line,) = info.value.culprits
    assert "timeout was used up before" in line and "still" not in line, line


def test_a_used_up_select_says_the_timeout_was_used_up(scenario_path: Path) -> None:
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus, pytest.raises(nc.WaitTimeout) as info:
        gpus.select_clean(1, timeout=USED_UP_S, health=False)
    assert any("timeout was used up before the first poll" in line for line in info.value.culprits), info.value
    assert not any("still running" in line for line in info.value.culprits)


def test_a_used_up_ready_on_a_mig_selection_says_the_timeout_was_used_up(scenario_path: Path) -> None:
    mig = _mig(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        report = gpus.ready(devices=[mig], timeout=USED_UP_S)
    (v,) = report.verdicts
    assert not v.ready and any("timeout was used up before" in c.reason for c in v.culprits), v.line()
    assert not any("still being read" in c.reason for c in v.culprits)
