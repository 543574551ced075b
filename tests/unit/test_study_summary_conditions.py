"""``summarize`` keeps apart what ``study compare`` and ``study fit`` keep apart: runs of another pin mode, GPU model
or provenance (simulated, real, unknown) are another row, named on its head line, never pooled into one."""

from __future__ import annotations

from typing import Any

from nvmlcheck.study import DeviceRun, RunRecord, format_summary, summarize

GIB = 1 << 30
MS = 1_000_000


def _runs(y_ms: float, n: int = 3, *, names: tuple[str, ...] = ("NVIDIA H200",), **run: Any) -> list[RunRecord]:
    out = []
    for i in range(n):
        v = round((y_ms + i) * MS)
        devices = tuple(DeviceRun(index=k, uuid=f"GPU-{k}", name=name, pid=100 + i, baseline_used_bytes=0,
                                  held_bytes=GIB, signal_ns=0, last_held_ns=None, first_clean_ns=v + k * 100 * MS,
                                  off_list_ns=v, memory_back_ns=v + k * 100 * MS, waitpid_ns=v, exit_status=-9)
                        for k, name in enumerate(names))
        fields: dict[str, Any] = {"holder": "pinned", "simulated": False, **run}
        out.append(RunRecord(run=i, repeat=i, warmup=False, size_bytes=8 * GIB, ending="KILL", mode="precise",
                             backend="nvml", driver="580.159.04", nvmlcheck="0", wall_time=0.0, timed_out=False,
                             timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1, poll_cost_ns=1,
                             devices=devices, **fields))
    return out


def _medians(rows: Any) -> list[float]:
    return sorted(row.memory_back.median / MS for row in rows)


def test_pin_modes_are_rows_of_their_own() -> None:
    pinned: dict[str, Any] = {"pinned_bytes": 8 * GIB}
    rows = summarize(_runs(1370.0, pin_mode="alloc", **pinned) + _runs(736.0, pin_mode="register", **pinned))
    assert _medians(rows) == [737.0, 1371.0] and {r.pin_mode for r in rows} == {"alloc", "register"}
    text = format_summary(rows)
    assert "8.0 GiB pinned by alloc" in text and "8.0 GiB pinned by register" in text
    (plain,) = summarize(_runs(113.0, pin_mode="alloc"))  # nothing pinned: no pin mode
    assert plain.pin_mode is None


def test_gpu_models_and_simulated_runs_are_rows_of_their_own() -> None:
    rows = summarize(_runs(100.0, names=("NVIDIA H200", "NVIDIA A100-SXM4-80GB")))
    assert _medians(rows) == [101.0, 201.0] and {r.gpu for r in rows} == {"NVIDIA H200", "NVIDIA A100-SXM4-80GB"}
    assert "[NVIDIA A100-SXM4-80GB]" in format_summary(rows)
    rows = summarize(_runs(100.0) + _runs(300.0, simulated=True))
    assert _medians(rows) == [101.0, 301.0] and {r.provenance for r in rows} == {"real", "simulated"}
    assert "[SIMULATED]" in format_summary(rows) and "[real GPU]" in format_summary(rows)
