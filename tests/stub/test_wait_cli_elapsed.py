"""The time a timed-out ``wait`` / ``select`` reports ends at the wait's deadline: the work done after it (building
the message, explaining the holders: module imports, /proc reads, slow on a loaded machine) is no overrun of the
deadline and must not read as one ("not clean after 2.055 s" for ``--timeout 2``). Driven on a scripted clock."""

from __future__ import annotations

import time
import types
from typing import Any

import pytest

import nvmlcheck.cli._select as cli_select
import nvmlcheck.cli._wait as cli_wait
from nvmlcheck import cli
from nvmlcheck.errors import WaitTimeout
from nvmlcheck.selection import SelectTimeout
from nvmlcheck.session import Session


class FakeTime:
    """``time`` as the CLI modules see it: ``monotonic`` on a clock the test moves. It starts at the real clock's
    reading: the command's watchdog (``hung_after`` around the event registration) takes its deadline from it on the
    real clock, and one long past would fire it at once."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> FakeTime:
    ft = FakeTime()
    shim = types.SimpleNamespace(monotonic=ft.monotonic, monotonic_ns=lambda: round(ft.now * 1e9))
    monkeypatch.setattr(cli_wait, "time", shim)
    monkeypatch.setattr(cli_select, "time", shim)
    return ft


def test_wait_timeout_reports_the_deadline_not_the_work_after_it(
    fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wait_until_clean(self: Session, timeout: float | None, *a: Any, **k: Any) -> object:
        assert timeout == 2.0  # the open took no time on this clock
        fake_time.now += 2.0  # the wait, up to its deadline
        fake_time.now += 7.0  # then the message and the holders' explanation (slow: a loaded machine)
        raise WaitTimeout(2.0, 2_000_000_000, ("GPU 0: 16.0 GiB used",), polls=5, held=True)

    monkeypatch.setattr(Session, "wait_until_clean", wait_until_clean)
    code = cli.main(["--simulate", "h200-busy", "wait", "--timeout", "2", "--precise"])
    err = capsys.readouterr().err
    assert code == 1
    assert "not clean after 2.000 s (timeout 2 s, 5 polls)" in err


def test_select_timeout_reports_the_deadline_not_the_work_after_it(
    fake_time: FakeTime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def select_clean(self: Session, count: int, *, timeout: float | None = 0.0, **k: Any) -> object:
        assert timeout == 3.0
        fake_time.now += 3.0 + 5.0  # the search up to its deadline, then the message
        raise SelectTimeout(3.0, 3_000_000_000, ("GPU 0: 16.0 GiB used",), polls=4, count=count)

    monkeypatch.setattr(Session, "select_clean", select_clean)
    code = cli.main(["--simulate", "h200-busy", "select", "1", "--wait", "3", "--format", "index"])
    err = capsys.readouterr().err
    assert code == 1
    assert "after 3.000 s" in err and "8.000" not in err


def test_ready_reports_the_time_to_its_verdict_not_the_printing_after_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ready``'s "(X s, N polls)" is the open plus the library's own elapsed time (to its verdict): it was read
    after the call returned, so whatever ran between (here 7 s of a loaded machine) read as waiting."""
    import nvmlcheck.cli._ready as cli_ready
    from nvmlcheck.verdict import ReadyReport

    ft = FakeTime()
    monkeypatch.setattr(cli_ready, "time", types.SimpleNamespace(monotonic=ft.monotonic,
                                                                 monotonic_ns=lambda: round(ft.now * 1e9)))
    real_ready = Session.ready

    def ready(self: Session, *a: Any, **k: Any) -> ReadyReport:
        report = real_ready(self, *a, **{**k, "timeout": 0})
        ft.now += 2.0 + 7.0  # its reading (2 s on this clock), then the rest of a loaded machine's time
        return type(report)(report.verdicts, report.snapshot, 2_000_000_000, report.polls, report.timeout_s,
                            report.notes, report.listening_gaps)

    monkeypatch.setattr(Session, "ready", ready)
    code = cli.main(["--simulate", "h200-busy", "ready", "--timeout", "2"])
    out = capsys.readouterr().out
    assert code == 1 and "(2000.0 ms, 1 poll)" in out, out
