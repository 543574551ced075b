"""The option value types' messages read as English whatever the unit (cli/_values.py)."""

from __future__ import annotations

import argparse

import pytest

from nvmlcheck.cli._values import number, seconds


def test_a_bare_number_that_is_not_one_says_so_plainly() -> None:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        number("5s")
    assert str(info.value) == "not a number: '5s'"  # was "not a number of a number: '5s'"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^not a number of seconds: '5s'$"):
        seconds("5s")
