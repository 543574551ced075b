"""The stub's call log: one ``FUNCTION PID TID`` line per NVML call, written by every process that has
``$NVMLCHECK_STUB_LOG`` set."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["LogEntry", "read_call_log"]

_LINE = re.compile(r"(\w+) ([0-9]+) ([0-9]+)", re.ASCII)


@dataclass(frozen=True)
class LogEntry:
    """One line of the stub's call log."""

    function: str
    pid: int
    tid: int


def read_call_log(log_path: str | os.PathLike[str]) -> list[LogEntry]:
    """Parse a stub call log (``FUNCTION PID TID`` per line); a missing file is an empty log.

    A last line without its newline is a call being logged while the log is read (a child process still runs),
    and is left for the next read. Raises ``ValueError`` naming the line for a file that is no call log."""
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    lines = text.split("\n")[:-1]  # the part after the last newline: not written in full yet
    entries = []
    for number, line in enumerate(lines, 1):
        match = _LINE.fullmatch(line)
        if match is None:
            raise ValueError(f"{os.fspath(log_path)} line {number} is not a stub call log line (FUNCTION PID TID): "
                             f"{line!r}")
        entries.append(LogEntry(match[1], int(match[2]), int(match[3])))
    return entries
