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
        ("max_contexts", -1),  # a measured range below 0: every ETA called an extrapolation, or none
        ("max_pinned_bytes", 2.5),
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


GIB = 1 << 30


@pytest.mark.parametrize("driver", ["580.159.04", "550.54", None])
def test_the_eta_is_never_negative_and_0_only_when_nothing_is_torn_down(driver: str | None) -> None:
    for contexts, device, pinned, importers in [(0, 0, 0, 0), (1, 0, 0, 0), (1, 10**18, 0, 0), (10**6, 0, 0, 0),
                                                (1, 0, 10**15, 0), (0, 0, 0, 3)]:
        eta = rm.expected_ns(driver, contexts, device, pinned, importers)
        assert eta >= 0 and (eta == 0) == (contexts == 0 and importers == 0)
        assert rm.stuck_after_ns(driver, contexts, device, pinned, importers) >= max(eta, 1_000_000_000)


def test_an_eta_within_the_measured_data_is_not_called_an_extrapolation() -> None:
    assert GOOD.beyond() is None and GOOD.beyond(contexts=0) is None
    assert GOOD.beyond(4, 64 * GIB, 32 * GIB, 4, gpu="NVIDIA H200") is None
    assert GOOD.beyond(2, 8 * GIB, gpu=None) is None  # GPU model not known: not judged
    pooled = replace(GOOD, gpu="NVIDIA H100 80GB HBM3, NVIDIA H200 + NVIDIA H20")
    assert all(pooled.beyond(gpu=g) is None for g in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H20"))
    assert "GPU model NVIDIA A100" in (pooled.beyond(gpu="NVIDIA A100") or "")


@pytest.mark.parametrize(("inputs", "said"), [
    ({"contexts": 64}, "64 contexts (measured up to 4)"),
    ({"device_bytes": 80 * GIB}, "80.0 GiB device memory (measured up to 64.0 GiB)"),
    ({"pinned_host_bytes": 226 * GIB}, "226.0 GiB pinned host memory (measured up to 32.0 GiB)"),
    ({"importers": 9}, "9 IPC importers (measured up to 4)"),
    ({"gpu": "NVIDIA A100-SXM4-80GB"}, "GPU model NVIDIA A100-SXM4-80GB (measured on NVIDIA H200)"),
])
def test_an_eta_outside_the_measured_data_says_so(inputs: dict[str, int | str], said: str) -> None:
    # Before: expected_ns extrapolated linearly (64 contexts: 5.4 s; 226 GiB pinned: 34 s) and nothing said that no
    # run had measured anything like it; the ETA looked as backed as one within the data.
    why = GOOD.beyond(**inputs)  # type: ignore[arg-type]
    assert why is not None and why.startswith("beyond the measured data") and said in why


def test_the_fallback_of_an_unknown_driver_is_never_called_measured() -> None:
    fallback = rm.model_for("470.1")
    assert fallback.driver == "default" and fallback.max_contexts is None
    assert fallback.beyond() == "a driver not measured: the conservative fallback's figures, not a fit"
    assert fallback.beyond(contexts=0) is None  # nothing torn down: 0 is no guess
    unranged = replace(GOOD, driver="9997", max_contexts=None)
    assert "records no measured range" in (unranged.beyond() or "")


def test_beyond_refuses_bad_counts() -> None:
    with pytest.raises(ValueError, match="contexts"):
        GOOD.beyond(contexts=-1)
