"""What ``watch`` says when its --for ends before the GPUs are registered, and of GPUs it does not listen to."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nvmlcheck.cli._watch import _CUT, _gpus, _left_out
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
HANG_MS = 600


def test_for_ending_before_the_registration_says_so_not_what_waits_do(
    scenario_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nvmlcheck import cli

    sc = Scenario.h200(2)
    sc.fault("nvmlEventSetCreate", count=1, delay_ms=HANG_MS)
    sc.write(scenario_path)
    before = {t for t in threading.enumerate() if t.name == "nvmlcheck events"}
    code = cli.main(["--simulate", str(scenario_path), "watch", "--for", "0.05"])
    err = capsys.readouterr().err
    for thread in {t for t in threading.enumerate() if t.name == "nvmlcheck events"} - before:
        thread.join(30.0)
    # It said "registration had not finished by the deadline of the call that started the listener ...; waits poll
    # without events until it returns": watch polls nothing, and its deadline is --for.
    assert code == 3
    assert "--for 0.05 s ended before the GPUs were registered" in err and "nothing was watched" in err
    assert "nvmlEventSetCreate has not returned" in err and "waits poll" not in err


def test_gpus_left_out_are_grouped_by_reason_and_a_cut_is_said_as_for() -> None:
    reasons = {i: f"not registered: {_CUT}" for i in range(1, 64)} | {0: "not supported"}
    text = _left_out(reasons, 0.5)
    assert text == "GPU 0: not supported; GPUs 1-63: not registered: --for 0.5 s ended first"
    assert _left_out({}, None) is None


def test_gpu_lists_use_ranges() -> None:
    assert _gpus([3]) == "GPU 3"
    assert _gpus([0, 1]) == "GPUs 0, 1"
    assert _gpus([0, 1, 3, 4, 5, 7]) == "GPUs 0, 1, 3-5, 7"
    assert _gpus(list(range(64))) == "GPUs 0-63"
