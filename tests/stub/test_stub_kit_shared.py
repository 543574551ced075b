"""An nvml_scenario override of a wider scope (here the module's): the bound process of one test was listed, dead,
in the next one, until list_ms after its nvmlInit (or for good, were its PID reused)."""

from __future__ import annotations

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import BoundProcessFactory, Scenario, StubSession

pytestmark = pytest.mark.stub


@pytest.fixture(scope="module")
def nvml_scenario() -> Scenario:
    return Scenario.h200()


def test_a_bound_process(nvml_stub: StubSession, nvml_bound_process: BoundProcessFactory) -> None:
    child = nvml_bound_process(device=0)
    with nc.open("nvml") as gpus:
        assert [p.pid for p in gpus.snapshot().device(0).processes or ()] == [child.pid]


def test_the_next_one_sees_an_idle_gpu(nvml_scenario: Scenario, nvml_stub: StubSession) -> None:
    with nc.open("nvml") as gpus:
        device = gpus.snapshot().device(0)
    assert device.processes == ()
    assert device.memory is not None and device.memory.used_bytes == 0
    assert "remove=1" in nvml_scenario.render()
