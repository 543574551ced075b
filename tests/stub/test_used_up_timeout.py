"""A positive timeout that the setup (opening NVML, a kill's selection) used up is still a bound: what is left is the
least positive timeout, so the answer is the library's for that time (not confirmed in time), never the one-check
judgement that ``timeout=0`` asks for, which ignores ``--stable-polls``.

The slow open is a wrapper around ``session.open`` that takes longer than the whole timeout: whatever the machine's
load, the timeout is used up before the wait starts."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
import nvmlcheck.session as session_module
from nvmlcheck import cli
from nvmlcheck.testing import Scenario, use_stub

pytestmark = pytest.mark.stub
TIMEOUT_S = 0.05


@pytest.fixture
def slow_open(monkeypatch: pytest.MonkeyPatch) -> None:
    real = session_module.open

    def slow(*args: Any, **kwargs: Any) -> nc.Session:
        opened = real(*args, **kwargs)
        time.sleep(2 * TIMEOUT_S)  # the open takes the whole timeout and more
        return opened

    monkeypatch.setattr(session_module, "open", slow)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def scenario(tmp_path: Path) -> str:
    return str(Scenario.h200().write(tmp_path / "scenario.txt"))


def test_left_s_keeps_a_positive_timeout_positive() -> None:
    from nvmlcheck._deadline import USED_UP_S, left_s

    assert left_s(None, 5.0) is None
    assert left_s(0, 5.0) == 0 and left_s(0.0, 5.0) == 0.0  # one check stays one check
    assert left_s(1.0, 0.25) == 0.75
    assert left_s(1e-9, 0.5) == USED_UP_S > 0
    assert left_s(1.0, 1.0) == USED_UP_S
    assert left_s(float("inf"), 1e9) == float("inf")
    assert left_s(10**400, 1.0) == 10**400  # beyond any float: no bound, as inf


@pytest.mark.usefixtures("slow_open")
def test_wait_whose_timeout_the_open_used_up_times_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--simulate", scenario(tmp_path), "--json", "wait", "--timeout", str(TIMEOUT_S),
                         "--stable-polls", "2")
    assert code == 1, out
    doc = json.loads(out)
    assert doc["clean"] is False and doc["timeout_s"] == TIMEOUT_S
    assert doc["elapsed_ns"] >= 2 * TIMEOUT_S * 1e9  # the open counted


@pytest.mark.usefixtures("slow_open")
def test_ready_whose_timeout_the_open_used_up_is_not_ready(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--simulate", scenario(tmp_path), "ready", "--timeout", str(TIMEOUT_S))
    assert code == 1, out
    # Says what happened, not "within the timeout (1e-09 s)": the leftover handed on is no timeout the user gave.
    assert "not ready" in out and "the timeout was used up before it" in out and "1e-09" not in out


@pytest.mark.usefixtures("slow_open")
def test_select_whose_wait_the_open_used_up_finds_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--simulate", scenario(tmp_path), "select", "1", "--format", "index",
                         "--wait", str(TIMEOUT_S), "--stable-polls", "2")
    assert code == 1, (out, err)
    assert out == ""


@pytest.mark.usefixtures("slow_open")
def test_library_wait_whose_timeout_the_open_used_up_times_out() -> None:
    with use_stub(Scenario.h200()), pytest.raises(nc.WaitTimeout):
        nc.wait_until_clean(TIMEOUT_S, stable_polls=2, backend="nvml")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_kill_wait_whose_timeout_is_used_up_times_out(
    child: subprocess.Popen[bytes], gpus: Callable[[Scenario], nc.Session]
) -> None:
    # The kill's timeout counts from the first signal: a plan waited on after it passed gets a bounded check.
    offset = [0]

    def clock() -> int:
        return time.monotonic_ns() + offset[0]

    with gpus(Scenario.h200()) as session, nc.prepare_kill([child.pid]) as plan:
        plan.send_first(signal.SIGKILL, clock=clock)
        child.wait()
        offset[0] += 10**10  # ten seconds after the signal: the 1 s timeout is used up
        with pytest.raises(nc.KillTimeout):
            plan.wait(session, timeout=1.0, stable_polls=2)


def test_holders_handed_a_used_up_timeout_say_so(tmp_path: Path) -> None:
    # A caller's setup that used the timeout up hands on the least positive one (left_s): the reading it cuts said
    # "the GPUs' process lists were still being read", although nothing was.
    from nvmlcheck._deadline import USED_UP_S

    with use_stub(Scenario.h200(), tmp_dir=tmp_path), nc.open("nvml") as gpus:
        with pytest.raises(nc.HoldersIncomplete, match="the timeout was used up before the GPUs' process lists"):
            gpus.holders(timeout=USED_UP_S)
        with pytest.raises(nc.HoldersIncomplete, match="the timeout was used up before the GPUs named by the"):
            gpus.holders(["GPU-00000000-0000-0000-0000-000000000000"], timeout=USED_UP_S)
