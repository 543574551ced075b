"""The stub's call log: one ``FUNCTION PID TID`` line per NVML call, written by every process that has
``$NVMLCHECK_STUB_LOG`` set."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LogEntry", "read_call_log"]


@dataclass(frozen=True)
class LogEntry:
    """One line of the stub's call log."""

    function: str
    pid: int
    tid: int


def read_call_log(log_path: str | os.PathLike[str]) -> list[LogEntry]:
    """Parse a stub call log (``FUNCTION PID TID`` per line); a missing file is an empty log."""
    try:
        text = Path(log_path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    entries = []
    for line in text.splitlines():
        function, pid, tid = line.split()
        entries.append(LogEntry(function, int(pid), int(tid)))
    return entries
