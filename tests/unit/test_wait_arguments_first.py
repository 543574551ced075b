"""The calls that open their own session (``nvmlcheck.wait_until_clean``, ``nvmlcheck.ready``) refuse a bad
predicate or device selection before opening it: the argument's own error, not a backend's ("libnvidia-ml could not
be loaded" on a host without a driver) and not after an ``nvmlInit``."""

from __future__ import annotations

from typing import Any

import pytest

import nvmlcheck as nc
import nvmlcheck.session as session_module
from nvmlcheck.errors import ArgumentError, ArgumentTypeError


@pytest.fixture(autouse=True)
def no_open(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> object:
        raise AssertionError("a session was opened for a call whose arguments are wrong")

    monkeypatch.setattr(session_module, "open", refuse)


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"devices": True}, ArgumentTypeError, "a device is an int index or a UUID string"),
    ({"devices": []}, ArgumentError, "empty device selection"),
    ({"devices": (i for i in range(0))}, ArgumentError, "empty device selection"),
    ({"devices": [0, 1.5]}, ArgumentTypeError, "not 1.5"),
    ({"devices": b"0"}, ArgumentTypeError, "devices is an index"),
]


@pytest.mark.parametrize(("kwargs", "error", "text"), [
    *BAD, ({"predicate": 3}, ArgumentTypeError, "predicate must be a nvmlcheck Predicate"),
    ({"predicate": lambda snap: True}, ArgumentTypeError, "predicate must be"),
])
def test_wait_until_clean_refuses_before_opening(kwargs: dict[str, Any], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        nc.wait_until_clean(backend="nvml", **kwargs)


@pytest.mark.parametrize(("kwargs", "error", "text"), BAD)
def test_ready_refuses_before_opening(kwargs: dict[str, Any], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        nc.ready(backend="nvml", **kwargs)
