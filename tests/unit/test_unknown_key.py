"""``model.unknown_key`` writes the keys of ``DeviceState.unknown`` that ``DeviceState.why_unknown`` reads."""

from __future__ import annotations

import dataclasses

import pytest
from snapshots import dev

from nvmlcheck.model import ProcessKind, unknown_key


@pytest.mark.parametrize("kind", list(ProcessKind))
def test_a_process_kind_key_is_read_back_by_why_unknown(kind: ProcessKind) -> None:
    key = unknown_key("processes", kind)
    assert key == f"processes.{kind.value}" == unknown_key("processes", kind.value)
    d = dataclasses.replace(dev(0), unknown={key: "because"})
    assert d.why_unknown(key) == "because"
    assert all(d.why_unknown(unknown_key("processes", k)) is None for k in ProcessKind if k is not kind)


def test_a_part_reason_answers_for_every_key_of_the_part() -> None:
    d = dataclasses.replace(dev(0), unknown={"processes": "not requested"})
    assert d.why_unknown(unknown_key("processes", "used_bytes")) == "not requested"
