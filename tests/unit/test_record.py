"""``nvmlcheck._record``: each record class behaves as ``@dataclass(frozen=True, slots=True)`` of the same body would
(fields, defaults, ==, hash, repr, pickling, replace, frozen), and a one-shot command loads no ``dataclasses``."""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from nvmlcheck import _record, model, predicates, wait
from nvmlcheck._clocks import Clocks, ClockSet
from nvmlcheck._readings import Health, RemappedRows, RetiredPage, RetirementCause

ROOT = Path(__file__).resolve().parents[2]
RECORDS = [
    model.SystemInfo, model.MigDevice, model.DeviceState, model.DeviceFailure, model.Snapshot, ClockSet, Clocks,
    RetiredPage, RemappedRows, Health, predicates.Verdict, wait.PollPolicy, wait.TracePoint, wait.WaitResult,
]  # fmt: skip


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.__name__)
def test_a_record_is_a_dataclass_to_callers(cls: type) -> None:
    assert dataclasses.is_dataclass(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    assert names == list(cls.__record_fields__) == list(cls.__slots__) == list(cls.__match_args__)  # type: ignore[attr-defined]
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen and params.eq
    assert not hasattr(cls, "__dict__") or "__dict__" not in cls.__dict__


def _sample() -> model.DeviceState:
    return model.DeviceState(
        index=0, uuid="GPU-0", name="NVIDIA H200", pci_bus_id=None, serial=None, minor_number=0,
        memory=model.Memory(10, 1, 9, 2), compute_processes=(), graphics_processes=(), mps_processes=(),
        clocks=None, health=None, unknown=MappingProxyType({"serial": "no permission"}),
    )  # fmt: skip


def test_equality_hash_and_repr_as_a_dataclass() -> None:
    d = _sample()
    twin = dataclasses.replace(d, unknown=MappingProxyType({}))  # compare=False: reasons do not count
    assert d == twin and hash(d) == hash(twin)
    assert d != dataclasses.replace(d, index=1)
    assert repr(d).startswith("DeviceState(index=0, uuid='GPU-0', ") and "unknown=mappingproxy(" in repr(d)
    point = wait.TracePoint(1, 2, True, (), snapshot=None, stamp_ns=5)
    assert "stamp_ns" not in repr(point) and point == wait.TracePoint(1, 2, True, (), snapshot=None, stamp_ns=6)
    assert (d == object()) is False


def test_defaults_factories_and_keyword_only() -> None:
    s = model.SystemInfo("580", None, 13000)
    assert s.unknown == {} and isinstance(s.unknown, MappingProxyType)
    with pytest.raises(TypeError):
        wait.PollPolicy(0.01)  # type: ignore[call-arg]  # keyword-only, as the dataclass was
    assert Health(None, None, None).recovery_action is None
    with pytest.raises(TypeError, match="follows a field with a default"):

        @_record.record
        class _Bad:
            a: int = 0
            b: int  # type: ignore[misc]


def test_frozen_and_pickled() -> None:
    d = _sample()
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.index = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del d.index
    back = pickle.loads(pickle.dumps(d))
    assert back == d and isinstance(back.unknown, MappingProxyType) and back.unknown == d.unknown
    page = RetiredPage(0x1000, RetirementCause.DOUBLE_BIT_ECC, 5)
    assert pickle.loads(pickle.dumps(page)) == page
    assert type(pickle.loads(pickle.dumps(page))).__module__ == "nvmlcheck.model"


def test_replace_without_dataclasses_and_with() -> None:
    d = _sample()
    ours: Any = _record.replace(d, index=7)
    assert ours == dataclasses.replace(d, index=7) and ours.index == 7
    with pytest.raises(TypeError, match="no field"):
        _record.replace(d, colour="red")


def test_a_one_shot_wait_imports_no_dataclasses(tmp_path: Path) -> None:
    def loaded_by(imports: str) -> set[str]:
        code = f"import sys\n{imports}\nprint(' '.join(sorted(sys.modules)))"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        return set(out.stdout.split())

    # What the wait and snapshot commands import (the CLI modules, the NVML backend, the poller, the predicates and
    # the clock and health classes), over what the interpreter had loaded anyway.
    added = loaded_by(
        "import nvmlcheck.cli._wait, nvmlcheck.cli._snapshot, nvmlcheck.session, nvmlcheck.backends.nvml\n"
        "import nvmlcheck.wait, nvmlcheck.predicates, nvmlcheck._readings"
    ) - loaded_by("pass")
    assert "nvmlcheck.backends.nvml" in added
    assert not added & {"dataclasses", "inspect", "ast", "dis"}, sorted(added & {"dataclasses", "inspect"})
