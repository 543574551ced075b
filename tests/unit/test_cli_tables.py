"""The snapshot tables: an unreadable GPU in its place, every ``?`` with its reason, an empty process view said."""

from __future__ import annotations

import io
from types import MappingProxyType

from snapshots import GIB, dev, failure, proc, snap

from nvmlcheck.cli._output import device_table, process_table
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


def test_only_the_unknown_cells_are_explained() -> None:
    lines = _table(device_table, snap(dev(0, used=GIB)))  # memory and lists read, clocks not
    (note,) = (line for line in lines if "unknown" in line)
    assert "SM clock" in note and "memory" not in note and "processes" not in note


def test_a_process_view_with_no_process_says_so_and_not_that_the_gpus_are_clean() -> None:
    lines = _table(process_table, snap(dev(0), dev(1)))
    assert len(lines) == 2 and "no process listed" in lines[1] and "may still be held" in lines[1]
