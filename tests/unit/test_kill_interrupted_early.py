"""An interrupt after a kill's first signal is reported with what each target got, wherever it lands.

Named targets are signalled before the GPU side loads, and with ``--simulate`` (or ``--all-*``) right after NVML
opened: an interrupt before the kill held its plan (while its modules loaded, or between the signal and the plan's
return) came outside the kill's own report, and the error document had no ``pids`` although the target had its
SIGTERM (seen as a race: Ctrl-C once the target said it had its SIGTERM). Here the interrupt is raised at such
points, in-process: nothing depends on when a signal lands.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.cli import _kill
from nvmlcheck.cli._signals import Terminated
from nvmlcheck.kill import KillPlan
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub


@pytest.fixture
def target() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", "import signal, time\nsignal.signal(signal.SIGTERM, lambda n, f: None)\n"
         "print('ready', flush=True)\ntime.sleep(600)"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    yield child
    child.kill()
    child.wait()


#: A fresh exception each run (an instance raised once carries the records attached to it).
CASES = [(KeyboardInterrupt, 130), (lambda: Terminated(signal.SIGTERM), 143)]


def _check(got: int, out: str, err: str, *, target: subprocess.Popen[bytes], code: int, json_mode: bool) -> None:
    assert got == code
    assert target.poll() is None  # it ignores SIGTERM, and nothing more was sent
    if json_mode:
        doc = json.loads(out)
        assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == code
        (record,) = doc["pids"]
        assert record["pid"] == target.pid and [s["signal"] for s in record["signals"]] == ["SIGTERM"]
    else:
        assert "interrupted after the first signal" in err and f"  pid {target.pid} (" in err and "SIGTERM +" in err


@pytest.mark.parametrize(("exc", "code"), CASES)
@pytest.mark.parametrize("json_mode", [True, False])
def test_an_interrupt_before_the_kills_wait_reports_the_signal_sent(
    *, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    target: subprocess.Popen[bytes], exc: Callable[[], BaseException], code: int, json_mode: bool,
) -> None:
    """A named PID is signalled before the GPU side loads (no GPU is opened here: the interrupt comes first)."""
    def interrupted(args: Any) -> Any:  # called after the early signal, before the kill's wait and its report
        raise exc()

    monkeypatch.setattr(_kill, "wait_predicate", interrupted)
    argv = ["kill", "--grace", "600", str(target.pid)]
    got = cli.main(["--json", *argv] if json_mode else argv)
    out, err = capsys.readouterr()
    _check(got, out, err, target=target, code=code, json_mode=json_mode)


@pytest.mark.parametrize(("exc", "code"), CASES)
@pytest.mark.parametrize("json_mode", [True, False])
def test_an_interrupt_as_the_signal_goes_reports_it(
    *, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    target: subprocess.Popen[bytes], exc: Callable[[], BaseException], code: int, json_mode: bool,
) -> None:
    """With --simulate the signal goes after NVML opened; an interrupt right after it, before the plan is returned."""
    send_first = KillPlan.send_first

    def interrupted(self: KillPlan, *args: Any, **kwargs: Any) -> int:
        send_first(self, *args, **kwargs)
        raise exc()

    monkeypatch.setattr(KillPlan, "send_first", interrupted)
    scenario = str(Scenario.h200().write(tmp_path / "scenario.txt"))
    argv = ["--simulate", scenario, "kill", "--grace", "600", str(target.pid)]
    got = cli.main(["--json", *argv] if json_mode else argv)
    out, err = capsys.readouterr()
    _check(got, out, err, target=target, code=code, json_mode=json_mode)
