"""One rule for how much of a timeout opening may take, used by nc.wait_until_clean and by the CLI."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest

from nvmlcheck import session
from nvmlcheck.cli._common import open_session


def test_the_rule() -> None:
    assert session.open_timeouts(None) == (10.0, None)
    assert session.open_timeouts(math.inf) == (10.0, None)
    assert session.open_timeouts(0) == (0.25, 1.0)  # a check: the init still gets its floor, nvidia-smi 1 s
    assert session.open_timeouts(3.0) == (1.5, 1.5)
    assert session.open_timeouts(60.0) == (10.0, 10.0)  # capped at nvidia-smi's own default


@pytest.mark.parametrize("timeout", [1.0, 0, None])
def test_the_cli_bounds_opening_by_its_timeout_on_both_backends(monkeypatch: pytest.MonkeyPatch,
                                                                   timeout: float | None) -> None:
    seen: dict[str, Any] = {}

    def fake_open(backend: str, **kwargs: Any) -> str:
        seen.update(kwargs, backend=backend)
        return "session"

    monkeypatch.setattr(session, "open", fake_open)
    args = argparse.Namespace(backend="smi", simulate=None, smi_prefix=None, timeout=timeout)
    assert open_session(args) == "session"  # type: ignore[comparison-overlap]
    assert (seen["init_timeout_s"], seen["smi_timeout_s"]) == session.open_timeouts(timeout, backend="smi")


def test_nvidia_smi_behind_a_prefix_gets_its_own_bound_whatever_the_timeout() -> None:
    """``--smi-prefix "ssh gpu01"`` with ``--timeout 0`` (ready's default): each run was cut at 1 s, so an ssh
    that takes a second to connect failed the one-shot (exit 3). A transport's connection is not the GPU's time:
    a prefixed run gets nvidia-smi's default bound (the wait's polls still stop at its deadline)."""
    for timeout in (0, 0.5, 3.0, 60.0):
        assert session.open_timeouts(timeout, prefixed=True) == (session.open_timeouts(timeout)[0], None)
    assert session.open_timeouts(None, prefixed=True) == (10.0, None)


def test_nvidia_smi_chosen_by_name_gets_the_whole_timeout() -> None:
    """``--backend smi`` tries no nvmlInit: half the timeout was kept for one all the same."""
    assert session.open_timeouts(3.0, backend="smi") == (1.5, 3.0)
    assert session.open_timeouts(0, backend="smi") == (0.25, 1.0)  # the local floor: a local run takes tens of ms
    assert session.open_timeouts(60.0, backend="smi") == (10.0, 10.0)


@pytest.mark.parametrize(("prefix", "backend", "expected"), [(None, "smi", 3.0), ("ssh gpu01", "smi", None),
                                                             (None, "auto", 1.5)])
def test_the_cli_gives_the_rule_its_backend_and_prefix(monkeypatch: pytest.MonkeyPatch, prefix: str | None,
                                                        backend: str, expected: float | None) -> None:
    seen: dict[str, Any] = {}

    def fake_open(backend: str, **kwargs: Any) -> str:
        seen.update(kwargs, backend=backend)
        return "session"

    monkeypatch.setattr(session, "open", fake_open)
    args = argparse.Namespace(backend=backend, simulate=None, smi_prefix=prefix, timeout=3.0)
    assert open_session(args) == "session"  # type: ignore[comparison-overlap]
    assert seen["smi_timeout_s"] == expected
