"""``--match`` pins what it matched: a PID reused between the command-line read and the start-time read is not taken.

``by_match`` read the command line, then the start time it pins by. Had the matched process exited and its PID been
handed to another in between, the newcomer's start time was pinned as if it had matched, and it would be signalled.
The reads are faked here (a /proc of one PID whose process changes between them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nvmlcheck._proc import procfs, selectors
from nvmlcheck._proc.procfs import ProcStat

PID = 4242


@pytest.fixture
def fake_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """A /proc listing one PID; the command lines it shows, read by read (the last one repeats)."""
    (tmp_path / str(PID)).mkdir()
    shown: list[tuple[str, ...]] = []

    def cmdline(pid: int, proc: str = "/proc") -> tuple[str, ...]:
        return shown.pop(0) if len(shown) > 1 else shown[0]

    def read_stat(pid: int, proc: str = "/proc", **kwargs: object) -> ProcStat:
        return ProcStat(pid=pid, comm="python3", state="S", ppid=7, start_ticks=99)

    monkeypatch.setattr(procfs, "cmdline", cmdline)
    monkeypatch.setattr(procfs, "read_stat", read_stat)
    monkeypatch.setattr(selectors, "_me", lambda: (1_000_000, ()))
    return shown


def test_a_pid_reused_between_the_reads_is_not_chosen(fake_proc: list[tuple[str, ...]], tmp_path: Path) -> None:
    fake_proc += [("python3", "server.py"), ("bash", "backup.sh")]  # server.py exits; its PID goes to backup.sh
    chosen, skipped = selectors.by_match("server", str(tmp_path))
    assert chosen == [] and skipped == []


def test_a_process_that_stays_is_chosen(fake_proc: list[tuple[str, ...]], tmp_path: Path) -> None:
    fake_proc += [("python3", "server.py")]
    chosen, _ = selectors.by_match("server", str(tmp_path))
    assert chosen == [(PID, 99, "match")]
