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


def test_ready_gives_the_close_what_it_gave_the_init_and_keeps_its_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    # nc.ready closed its session with close()'s own bound (10 s) and raised its Timeout over a verdict already
    # made; as nc.wait_until_clean, it now gives the close the init's bound and keeps the report.
    from nvmlcheck.errors import Timeout

    bounds: list[float | None] = []
    real_close = nc.Session.close

    def hung_close(self: nc.Session, timeout: float | None = 10.0) -> None:
        bounds.append(timeout)
        real_close(self)  # released (the stub's NVML is not left open), then reported as hung
        raise Timeout(10, "nvmlShutdown", detail="did not return within the bound (simulated)")

    with use_stub(Scenario.h200()):
        monkeypatch.setattr(nc.Session, "close", hung_close)
        report = nc.ready(timeout=0, backend="nvml")
    assert report.ready and bounds == [0.25]


def test_an_open_while_a_shutdown_hangs_keeps_its_bound() -> None:
    # The last session's nvmlShutdown ran under the library's lock: an open meanwhile blocked until it returned,
    # whatever its init_timeout_s. Now it waits for the shutdown within its bound and says why it gave up.
    scenario = Scenario.h200()
    scenario.fault("nvmlShutdown", delay_ms=3000, count=1)
    with use_stub(scenario) as stub:
        probe = StubProbe(stub.library_path)
        shutdowns = probe.shutdown_total()
        gpus = nc.open("nvml")
        loaded = gpus.backend._loaded  # type: ignore[attr-defined]
        with pytest.raises(nc.Timeout):
            gpus.close(timeout=0)
        # The release runs in a thread: an open before it began would simply join the session still open.
        poll_until(lambda: loaded._shutting is not None)
        try:
            opened = nc.open("nvml", init_timeout_s=0.2)
        except nc.Timeout as exc:
            assert "still shutting down" in str(exc)
        else:  # never leave NVML initialised for the tests after this one
            opened.close()
            pytest.fail("an open while the shutdown hung did not give up at its bound")
        poll_until(lambda: probe.shutdown_total() > shutdowns and loaded._shutting is None)
        with nc.open("nvml", init_timeout_s=5) as again:  # once it has returned, NVML opens again
            assert again.device_count() == 1
