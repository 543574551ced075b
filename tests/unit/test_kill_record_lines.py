"""The lines a failed or interrupted kill prints per target: a target sent no signal is said to have exited only
when it was seen to exit ("no signal (had exited), not seen to exit" contradicted itself)."""

from __future__ import annotations

import pytest

from nvmlcheck.cli._main import _print_kill_records
from nvmlcheck.kill import PidTimes, SignalSent


def test_each_target_line_says_what_it_got_without_contradiction(capsys: pytest.CaptureFixture[str]) -> None:
    exc = KeyboardInterrupt("interrupted")
    exc._nvmlcheck_kill_pids = (  # type: ignore[attr-defined]
        PidTimes(101, "named", "server", (SignalSent("SIGTERM", 0),), 5_000_000, None),
        PidTimes(102, "named", "worker", (), 2_000_000, None),  # gone before its turn
        PidTimes(103, "named", "other", (), None, None),  # interrupted before its turn: nothing sent
    )
    _print_kill_records(exc)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "  pid 101 (server): SIGTERM +0.0 ms, exited +5.0 ms",
        "  pid 102 (worker): no signal (it had exited), exited +2.0 ms",
        "  pid 103 (other): no signal sent, not seen to exit",
    ]


def test_an_interrupt_keeps_what_its_raise_carried(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command line reported a fresh KeyboardInterrupt, dropping the records a kill attached to the raised one.
    import json

    from nvmlcheck.cli import _main

    def interrupted(_args: object) -> int:
        exc = KeyboardInterrupt()
        exc._nvmlcheck_kill_pids = (PidTimes(7, "named", "x", (SignalSent("SIGTERM", 0),), None, None),)  # type: ignore[attr-defined]
        raise exc

    monkeypatch.setattr(_main, "_command", lambda _name: interrupted)
    code = _main.run(["--json", "holders"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 130 and [p["pid"] for p in doc["pids"]] == [7], doc
