"""Each NVML return code's ``SCOPE`` (errors.py) decides, through the real cffi path, whether a failed read leaves one
value unknown or fails the GPU: the same answer from the raw-code path (clocks, in ``_nvml/calls.py``) and the
exception path (memory, in the backend)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import errors
from nvmlcheck.testing import Scenario, StubProbe, build_stub

pytestmark = pytest.mark.stub

CODES = [*errors.KNOWN_CODES, 4242]  # 4242: a code this version does not know (Unknown's scope)
Take = Callable[[Scenario, nc.Fields], nc.Snapshot]


@pytest.fixture
def snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Take]:
    library = build_stub()
    scenario_path = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario_path))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    probe = StubProbe(library)

    def take(scenario: Scenario, fields: nc.Fields) -> nc.Snapshot:
        scenario.write(scenario_path)
        with nc.open("nvml", library_path=str(library)) as session:
            return session.snapshot(fields=fields)

    yield take
    assert probe.init_refcount() == 0, "this test left NVML initialised"


def _device(snap: nc.Snapshot, index: int) -> nc.DeviceState | None:
    return next((d for d in snap.devices if d.index == index), None)


@pytest.mark.parametrize("code", CODES)
def test_an_optional_value_is_unknown_unless_the_code_fails_the_device(snapshot: Take, code: int) -> None:
    cls = errors.error_class_for_code(code)
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetClockInfo", code=code, device=1)
    snap = snapshot(sc, nc.Fields.CLOCKS)
    assert _device(snap, 0) is not None  # the other device still reports
    d = _device(snap, 1)
    if cls.SCOPE == "device":
        assert d is None
        (failure,) = snap.failures
        assert failure.index == 1 and type(failure.error) is cls
    else:
        assert d is not None and not snap.failures
        assert d.clocks is not None and d.clocks.graphics_mhz is None
        why = d.why_unknown("clocks.current.graphics_mhz") or ""
        if cls.WHY_UNKNOWN:
            assert why == cls.WHY_UNKNOWN.format(function="nvmlDeviceGetClockInfo")
        else:
            assert why.startswith("unreadable: nvmlDeviceGetClockInfo") and f"({code})" in why


@pytest.mark.parametrize("code", CODES)
def test_a_judged_value_is_unknown_only_when_the_code_says_it_does_not_exist(snapshot: Take, code: int) -> None:
    cls = errors.error_class_for_code(code)
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", code=code, device=1)
    snap = snapshot(sc, nc.Fields.MEMORY)
    d = _device(snap, 1)
    if cls.SCOPE == "value":
        assert d is not None and not snap.failures
        assert d.memory is None
        assert d.why_unknown("memory") == cls.WHY_UNKNOWN.format(function="nvmlDeviceGetMemoryInfo_v2")
    else:
        assert d is None
        (failure,) = snap.failures
        assert failure.index == 1 and type(failure.error) is cls



def test_open_takes_the_library_as_a_path_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``library_path=stub.library_path`` (a ``Path``, as nvmlcheck.simulate's docs show) was refused: "must be a
    str"; a path object names the library as its ``str`` does."""
    scenario_path = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario_path))
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=build_stub()) as gpus:
        assert [d.index for d in gpus.snapshot().devices] == [0]
