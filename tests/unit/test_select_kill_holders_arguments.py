"""``select_kill_holders`` checks its arguments whatever its source. Given holders already found, it ignored
``timeout`` unchecked (``-1``, ``"x"``), took a truthy ``"yes"`` as ``all_holders`` (a wider selection than asked),
and failed with an AttributeError deep inside on an item that is no Holder (a PID), or silently took a str."""

from __future__ import annotations

from typing import Any

import pytest

import nvmlcheck as nc


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"timeout": -1}, ValueError), ({"timeout": float("nan")}, ValueError), ({"timeout": "5"}, TypeError),
    ({"all_holders": "yes"}, TypeError), ({"all_holders": 1}, TypeError), ({"include_daemons": "no"}, TypeError),
])
def test_bad_arguments_are_refused_for_holders_already_found(kwargs: dict[str, Any], error: type[Exception]) -> None:
    args: dict[str, Any] = {"all_holders": True, **kwargs}
    with pytest.raises(error):
        nc.select_kill_holders([], **args)


@pytest.mark.parametrize("source", ["1234", b"1234", 1234, [1234], [None]])
def test_a_source_that_is_no_session_nor_holders_is_refused(source: Any) -> None:
    with pytest.raises(TypeError, match="source is an open Session or a sequence of Holder"):
        nc.select_kill_holders(source, all_holders=True)


def test_no_holders_is_an_empty_selection() -> None:
    assert nc.select_kill_holders((), all_holders=False, timeout=0) == nc.KillSelection((), ())
