"""``model.fast_constructor``: the backends' keyword-only constructor builds the same objects as the classes'."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import pytest

from nvmlcheck.model import DeviceState, Memory, Snapshot, SystemInfo, fast_constructor


def _device_fields() -> dict[str, object]:
    return {
        "index": 3,
        "uuid": "GPU-3",
        "name": "NVIDIA H200",
        "pci_bus_id": "00000000:03:00.0",
        "serial": None,
        "minor_number": 3,
        "memory": Memory(100, 10, 90, 5, False, 1),
        "compute_processes": (),
        "graphics_processes": (),
        "mps_processes": None,
        "clocks": None,
        "health": None,
        "unknown": MappingProxyType({"processes.mps": "not supported"}),
        "mig_mode": False,
        "mig_devices": (),
    }


def test_builds_what_the_dataclass_builds() -> None:
    values = _device_fields()
    built = fast_constructor(DeviceState)(**values)
    assert type(built) is DeviceState
    assert built == DeviceState(**values)  # type: ignore[arg-type]
    assert {f.name: getattr(built, f.name) for f in dataclasses.fields(DeviceState)} == values
    snap = fast_constructor(Snapshot)(
        backend="nvml",
        taken_ns=1,
        duration_ns=2,
        wall_time=3.0,
        system=SystemInfo(None, None, None),
        devices=(built,),
        failures=(),
    )
    assert snap == Snapshot("nvml", 1, 2, 3.0, SystemInfo(None, None, None), (built,), ())


def test_objects_stay_frozen() -> None:
    built = fast_constructor(DeviceState)(**_device_fields())
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.index = 4  # type: ignore[misc]


def test_every_field_is_a_required_keyword() -> None:
    make = fast_constructor(DeviceState)
    values = _device_fields()
    with pytest.raises(TypeError):
        make(*values.values())  # positional calls would break silently when fields move
    del values["mig_devices"]
    with pytest.raises(TypeError):
        make(**values)
    with pytest.raises(TypeError):
        make(**values, mig_device=())
