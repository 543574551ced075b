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
    assert (seen["init_timeout_s"], seen["smi_timeout_s"]) == session.open_timeouts(timeout)
