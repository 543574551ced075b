"""The test kit as a downstream suite uses it: the fixtures follow changes a test makes to its scenario, and a stub
that cannot be built (its cache unwritable) is the kit's build error, which the fixtures turn into a skip."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StubBuildError, StubSession, build_stub

pytestmark = pytest.mark.stub


def test_a_change_the_test_makes_to_its_scenario_reaches_the_stub(
    nvml_scenario: Scenario, nvml_stub: StubSession
) -> None:
    # nvml_stub had already written the scenario: the process added here was never seen by the stub.
    nvml_scenario.add_process(0, pid=4_123_456, used_bytes=8 << 30)
    nvml_scenario.at_call(1).set_device(0, used_bytes=1 << 20)
    nvml_scenario.driver = "535.43.02"
    with nc.open("nvml") as gpus:
        snap = gpus.snapshot()
    assert [p.pid for p in snap.device(0).processes or ()] == [4_123_456]
    assert snap.system.driver_version == "535.43.02"
    assert nvml_stub.scenario_path.read_text(encoding="utf-8") == nvml_scenario.render()


def test_after_its_test_a_scenario_writes_to_no_file(tmp_path: Path) -> None:
    scenario = Scenario.h200()
    path = tmp_path / "scenario.txt"
    scenario._keep_in(path)
    assert path.read_text(encoding="utf-8") == scenario.render()
    scenario._keep_in(None)
    scenario.add_process(0, pid=4_123_456)
    assert "4123456" not in path.read_text(encoding="utf-8")


def test_an_unwritable_build_cache_is_a_build_error_naming_it(tmp_path: Path) -> None:
    # A cache path that cannot be a directory (as a read-only one, but also for root) raised NotADirectoryError,
    # which the fixtures did not turn into a skip (nor --nvmlcheck-require-sim into a failure saying why).
    blocked = tmp_path / "cache"
    blocked.write_text("not a directory", encoding="utf-8")
    with pytest.raises(StubBuildError, match=r"cannot write the stub's build cache .*NVMLCHECK_STUB_CACHE"):
        build_stub(cache_dir=blocked)
