"""The snapshot tables: an unreadable GPU in its place, every ``?`` with its reason, an empty process view said."""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable
from types import MappingProxyType

import pytest
from snapshots import GIB, dev, failure, proc, snap

from nvmlcheck.cli._output import StatusLine, device_table, process_table
from nvmlcheck.errors import GpuLost


def _table(fn: object, s: object) -> list[str]:
    out = io.StringIO()
    fn(s, out)  # type: ignore[operator]
    return out.getvalue().splitlines()


def test_an_unreadable_gpu_is_printed_in_its_place_not_after_the_others() -> None:
    lost = failure(1, GpuLost(15, "nvmlDeviceGetHandleByIndex_v2", 1))
    s = snap(dev(0), dev(2, procs=[proc(7, GIB)]), failures=[lost])
    for fn in (device_table, process_table):
        lines = [line for line in _table(fn, s) if line[:1].isdigit()]
        assert [line.split()[0] for line in lines] == sorted(line.split()[0] for line in lines), fn
        assert any(line.startswith("1   UNREADABLE") for line in lines)


def test_every_unknown_cell_of_a_device_row_has_its_reason() -> None:
    d = dev(0, memory=None, procs=None, unknown=MappingProxyType({
        "memory": "not supported: nvmlDeviceGetMemoryInfo_v2", "processes.compute": "no permission"}))
    lines = _table(device_table, snap(d))
    row, note = lines[1], lines[2]
    assert "?" in row
    assert "memory: not supported: nvmlDeviceGetMemoryInfo_v2" in note and "compute processes: no permission" in note
    assert "SM clock" in note  # not read at all (no clocks): said, not a bare "?"


def test_values_unknown_for_one_reason_share_it() -> None:
    why = "nvidia-smi printed N/A for Processes"
    d = dev(0, procs=None, graphics=None, mps=None, unknown=MappingProxyType({
        f"processes.{k}": why for k in ("compute", "graphics", "mps")}))
    (note,) = (line for line in _table(device_table, snap(d)) if "unknown" in line)
    assert note.count(why) == 1 and "compute processes, graphics processes, mps processes: " + why in note


def test_an_unknown_reserve_is_explained_unless_the_v1_line_does() -> None:
    from nvmlcheck.model import Memory

    d = dev(0, memory=Memory(80 * GIB, GIB, 79 * GIB, None))
    (note,) = (line for line in _table(device_table, snap(d)) if "unknown" in line)
    assert "reserved: not reported" in note
    v1 = dev(0, used=GIB, v1=True)
    assert not any("reserved:" in line for line in _table(device_table, snap(v1)))


def test_only_the_unknown_cells_are_explained() -> None:
    lines = _table(device_table, snap(dev(0, used=GIB)))  # memory and lists read, clocks not
    (note,) = (line for line in lines if "unknown" in line)
    assert "SM clock" in note and "memory" not in note and "processes" not in note


def test_a_process_view_with_no_process_says_so_and_not_that_the_gpus_are_clean() -> None:
    lines = _table(process_table, snap(dev(0), dev(1)))
    assert len(lines) == 2 and "no process listed" in lines[1] and "may still be held" in lines[1]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return 2  # its size comes from the patched os.get_terminal_size


def _size(columns: int) -> Callable[..., os.terminal_size]:
    return lambda fd=0: os.terminal_size((columns, 24))


def _status(monkeypatch: pytest.MonkeyPatch, columns: int) -> tuple[_Tty, StatusLine]:
    monkeypatch.setattr(os, "get_terminal_size", _size(columns))
    monkeypatch.delenv("TERM", raising=False)  # TERM=dumb (a CI's) has no status line
    monkeypatch.setattr(time, "monotonic", iter(range(1_000, 100_000, 10)).__next__)  # each update 10 s apart
    stream = _Tty()
    return stream, StatusLine(stream, True)


def _drawn(stream: _Tty) -> list[str]:
    """Each line as drawn: what follows each carriage return."""
    return stream.getvalue().split("\r")[1:]


def test_the_status_line_never_wraps_on_a_narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    # It was cut at 20 columns at least: on a 12-column terminal it wrapped, and "\r" rewrote only the last line.
    stream, status = _status(monkeypatch, 12)
    status.update("waiting   1.0 s · 16.0 GiB used · held by pid 4242")
    (line,) = _drawn(stream)
    assert line == "waiting   1"


def test_the_status_line_pads_within_a_terminal_narrowed_since(monkeypatch: pytest.MonkeyPatch) -> None:
    stream, status = _status(monkeypatch, 80)
    status.update("x" * 70)
    monkeypatch.setattr(os, "get_terminal_size", _size(30))
    status.update("short")
    status.clear()
    drawn = _drawn(stream)
    assert len(drawn) == 4 and drawn[1] == "short" + " " * 24 and all(len(line) <= 29 for line in drawn[1:])


def test_the_status_line_counts_wide_characters_as_two_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    stream, status = _status(monkeypatch, 11)
    status.update("训练" * 10)
    (line,) = _drawn(stream)
    assert line == "训练" * 2 + "训"  # 10 columns of the 10 it may take


@pytest.mark.parametrize(("program", "exc", "said"), [
    ("nosuch", FileNotFoundError(2, "No such file or directory"), "cannot start 'nosuch': not found on PATH"),
    ("./nosuch", FileNotFoundError(2, "No such file or directory"), "cannot start './nosuch': not found"),
    ("/", PermissionError(13, "Permission denied"), "cannot start '/': it is a directory"),
])
def test_simulate_says_why_its_command_did_not_start(program: str, exc: OSError, said: str) -> None:
    # `simulate run -- /tmp` said "Permission denied", a missing command "No such file or directory".
    from nvmlcheck.cli._simulate import _cannot_start

    assert _cannot_start(program, exc) == said


def test_the_status_line_is_measured_as_an_ascii_terminal_draws_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # On an ASCII terminal a name's 日 is written \u65e5 (six columns, not two): measured before the spelling, the
    # line wrapped and each update left a line behind.
    import codecs

    from nvmlcheck._text import ascii_fallback

    codecs.register_error("nvmlcheck-ascii", ascii_fallback)
    stream, status = _status(monkeypatch, 13)
    monkeypatch.setattr(_Tty, "encoding", "ascii", raising=False)
    status.update("held by 日本 …")
    (line,) = _drawn(stream)
    assert line == "held by \\u65"  # the 12 columns it may take, as drawn


def test_no_status_line_on_a_dumb_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "dumb")
    assert not StatusLine(_Tty(), True).enabled
    monkeypatch.setenv("TERM", "xterm-256color")
    assert StatusLine(_Tty(), True).enabled
