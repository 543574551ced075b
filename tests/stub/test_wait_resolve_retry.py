"""A wait's selection is read within the wait (a UUID, ``cuda:N`` or ``MIG-…`` reads the GPUs' identities), and a
transient error there is asked again until the deadline, as one of the wait's polls would be: before, "Unknown
Error" from the device count (or a failed nvidia-smi run) while resolving ended the wait at once with that error,
seconds before its timeout. Time is a StepClock: the outcome depends on the code path alone."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock, build_stub
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub


def _open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scenario: Scenario) -> nc.Session:
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario.write(tmp_path / "s.txt")))
    return nc.open("nvml", library_path=str(build_stub()))


@pytest.mark.parametrize("count", [1, 3])
def test_a_transient_error_while_resolving_is_asked_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetCount_v2", 17, count=count)  # "Operating System": transient, no re-init
    steps = StepClock(0.01)
    with _open(tmp_path, monkeypatch, Scenario.h200(devices=2)) as plain:
        uuid = plain.snapshot(fields=nc.Fields(0)).devices[1].uuid
    with _open(tmp_path, monkeypatch, sc) as gpus:
        result = gpus.wait_until_clean(5, devices=[uuid], options=WaitOptions(clock=steps.clock, sleep=steps.sleep))
        assert result.snapshot.devices[0].uuid == uuid


def test_a_lasting_transient_error_while_resolving_ends_at_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _open(tmp_path, monkeypatch, Scenario.h200(devices=2)) as plain:
        uuid = plain.snapshot(fields=nc.Fields(0)).devices[1].uuid
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetCount_v2", 17)
    steps = StepClock(0.05)
    with _open(tmp_path, monkeypatch, sc) as gpus:
        with pytest.raises(nc.WaitTimeout) as caught:
            gpus.wait_until_clean(1, devices=[uuid], options=WaitOptions(clock=steps.clock, sleep=steps.sleep))
        assert "could not be read" in str(caught.value) and "OperatingSystem" in str(caught.value)
        assert caught.value.elapsed_ns <= 1.2e9  # within one pause of the deadline on the step clock, not past it
        # One check (timeout 0) is not retried: its error, as before.
        with pytest.raises(nc.NvmlError):
            gpus.wait_until_clean(0, devices=[uuid])
        # A lasting error (no permission) is not retried either.
    sc2 = Scenario.h200(devices=2)
    sc2.fault("nvmlDeviceGetCount_v2", 4)
    with _open(tmp_path, monkeypatch, sc2) as gpus, pytest.raises(nc.NvmlError) as lasting:
        gpus.wait_until_clean(1, devices=[uuid], options=WaitOptions(clock=StepClock(0.05).clock,
                                                                     sleep=StepClock(0.05).sleep))
    assert not lasting.value.TRANSIENT
