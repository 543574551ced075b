"""The reclaim model's table: a model registered for a driver is checked when registered, not when ``ready``
later judges a GPU with it."""

from __future__ import annotations

import math

import pytest

from nvmlcheck import reclaim_model as rm
from nvmlcheck._record import replace

GOOD = rm.model_for("580")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("stuck_factor", math.nan),  # stuck_after_ns raised ValueError in every ready on that driver
        ("stuck_factor", math.inf),
        ("stuck_factor", 0.5),  # a bound below the expected time: a teardown in progress called stuck
        ("stuck_factor", True),
        ("base_ns", -1),
        ("error_ns", -5),
        ("per_context_ns", 1.5),
    ],
)
def test_a_bad_model_is_refused_when_registered(field: str, value: object) -> None:
    bad = replace(GOOD, driver="9999", **{field: value})
    with pytest.raises(ValueError, match=field):
        rm.register(bad)
    assert rm.model_for("9999.1").driver == "default"  # not in the table


def test_a_good_model_registers_and_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rm, "_MODELS", dict(rm._MODELS))  # the table as it was, after the test
    rm.register(replace(GOOD, driver="9998", stuck_factor=2))
    assert rm.model_for("9998.10").stuck_factor == 2 and rm.stuck_after_ns("9998.1") >= 1_000_000_000


def test_ready_md_quotes_the_580_entry() -> None:
    """docs/ready.md gave the model's first version (118 ms a context, 53 ms each further) after the fit changed it."""
    from pathlib import Path

    text = Path(__file__).resolve().parents[2].joinpath("docs", "ready.md").read_text(encoding="utf-8")
    m = rm.model_for("580")
    assert f"one context ≈ {m.base_ns / 1e6:.0f} ms on driver 580" in text
    assert f"one ≈ {m.per_context_ns / 1e6:.0f} ms, teardowns being serialised" in text
