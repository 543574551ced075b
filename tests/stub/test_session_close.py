"""Session.close against the stub's nvmlShutdown: a hung shutdown is given up after the bound and never repeated."""

from __future__ import annotations

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StubProbe, use_stub

from .conftest import poll_until

pytestmark = pytest.mark.stub


def test_a_hung_nvml_shutdown_is_given_up_and_made_once() -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlShutdown", delay_ms=1500, count=1)  # a wedged driver, for a while
    with use_stub(scenario) as stub:
        probe = StubProbe(stub.library_path)
        gpus = nc.open("nvml")
        shutdowns = probe.shutdown_total()
        with pytest.raises(nc.Timeout, match="nvmlShutdown") as caught:
            gpus.close(timeout=0)
        assert "left to finish in a daemon thread" in str(caught.value)
        assert gpus.closed
        gpus.close()  # at once: no second release
        poll_until(lambda: probe.shutdown_total() > shutdowns)  # the thread got its answer in the end
        assert probe.shutdown_total() == shutdowns + 1
        assert probe.init_refcount() == 0
        with nc.open("nvml") as again:  # NVML opens again once the shutdown has returned
            assert again.device_count() == 1
