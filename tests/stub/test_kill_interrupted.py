"""A kill interrupted after its first signal (Ctrl-C, SIGTERM or SIGHUP to nvmlcheck) says what each target got.

It used to print a bare ``interrupted`` (``--json``: an error document without ``pids``), though the targets had been
signalled and left running: the operator could not tell what was sent. The interrupt is injected where a wait spends
its time (``Session.wait_until_clean``), after the signal, so nothing here depends on timing.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from nvmlcheck import cli
from nvmlcheck.cli._signals import Terminated
from nvmlcheck.session import Session
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

# Survives SIGTERM with a handler that does nothing (SIG_IGN would get SIGKILL at once: the kernel discards it).
IGNORE_TERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda n, f: None); "
               "print('ready', flush=True); time.sleep(60)")


@pytest.fixture
def interrupt(monkeypatch: pytest.MonkeyPatch) -> Callable[[BaseException], list[int]]:
    """``interrupt(exc)``: the kill's wait raises ``exc`` when it begins; returns the calls made (one, once it ran)."""

    def arrange(exc: BaseException) -> list[int]:
        calls: list[int] = []

        def wait_until_clean(*args: object, **kwargs: object) -> object:
            calls.append(1)
            raise exc

        monkeypatch.setattr(Session, "wait_until_clean", wait_until_clean)
        return calls

    return arrange


@pytest.fixture
def scenario(tmp_path: Path) -> str:
    return str(Scenario.h200().write(tmp_path / "scenario.txt"))


@pytest.mark.parametrize("case", [
    (KeyboardInterrupt(), 130, False), (KeyboardInterrupt(), 130, True),
    (Terminated(signal.SIGTERM), 143, False), (Terminated(signal.SIGTERM), 143, True),
])
def test_an_interrupt_after_the_signal_reports_what_each_target_got(
    capsys: pytest.CaptureFixture[str],
    scenario: str,
    python_child: Callable[..., subprocess.Popen[bytes]],
    interrupt: Callable[[BaseException], list[int]],
    case: tuple[BaseException, int, bool],
) -> None:
    exc, code, json_mode = case
    target = python_child(IGNORE_TERM)
    calls = interrupt(exc)
    argv = ["kill", "--simulate", scenario, "--grace", "10", str(target.pid)]
    got = cli.main(["--json", *argv] if json_mode else argv)
    out, err = capsys.readouterr()
    assert got == code and calls == [1]
    assert target.poll() is None  # signalled, not killed: an interrupt stops at once, as asked
    if json_mode:
        doc = json.loads(out)
        assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == code
        (record,) = doc["pids"]
        assert record["pid"] == target.pid and [s["signal"] for s in record["signals"]] == ["SIGTERM"]
        assert record["exited_ns"] is None
    else:
        assert out == ""
        assert f"  pid {target.pid} (" in err and "): SIGTERM +" in err and "not seen to exit" in err
        assert "interrupted after the first signal" in err


def test_an_interrupt_before_the_signal_has_no_records(
    capsys: pytest.CaptureFixture[str],
    scenario: str,
    python_child: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    target = python_child(IGNORE_TERM)

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("nvmlcheck.kill.KillPlan.send_first", interrupted)
    got = cli.main(["--json", "kill", "--simulate", scenario, str(target.pid)])
    doc = json.loads(capsys.readouterr().out)
    assert got == 130 and "pids" not in doc and target.poll() is None
