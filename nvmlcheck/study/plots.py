"""PNG plots of a study: time to memory back against size (:func:`plot_time_to_clean`) and one run's trace with
its phases marked (:func:`plot_run_trace`). matplotlib is imported only when a plot is drawn (``nvmlcheck[plot]``);
without it they raise :class:`~nvmlcheck.study.PlotUnavailable`."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from ..errors import ArgumentError
from .errors import PlotUnavailable
from .summary import percentile

if TYPE_CHECKING:
    from .records import RunRecord

__all__ = ["plot_run_trace", "plot_time_to_clean"]

def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on an Agg canvas (no pyplot, no global backend change)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable(
            f"plots need matplotlib, which is not installed ({exc}): pip install 'nvmlcheck[plot]'"
        ) from None
    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def plot_time_to_clean(records: Iterable[RunRecord], path: str | os.PathLike[str]) -> Path:
    """PNG: signal → memory back (ms) against size (log x), one colour per ending: every GPU-run as a point, the
    median as a line. Warm-ups and timed-out runs left out. Raises :class:`PlotUnavailable` without matplotlib."""
    kept = [r for r in records if not r.warmup and not r.timed_out]
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    for ending in dict.fromkeys(r.ending for r in kept):
        xs: list[float] = []
        ys: list[float] = []
        medians: list[tuple[float, float]] = []
        for size in sorted({r.size_bytes for r in kept if r.ending == ending}):
            vals = [d.memory_back_ns / 1e6 for r in kept if r.ending == ending and r.size_bytes == size
                    for d in r.devices if d.memory_back_ns is not None]
            xs.extend([size / 2**30] * len(vals))
            ys.extend(vals)
            if vals:
                medians.append((size / 2**30, percentile(vals, 0.5)))
        (line,) = ax.plot([m[0] for m in medians], [m[1] for m in medians], label=f"{ending}: runs and median")
        ax.scatter(xs, ys, s=12, alpha=0.6, color=line.get_color())
    sizes = sorted({r.size_bytes for r in kept})
    if sizes and sizes[0] > 0:  # a context holder's size 0 has no place on a log axis
        ax.set_xscale("log")
    if sizes:  # label the measured sizes themselves, not powers of ten
        ax.set_xticks([s / 2**30 for s in sizes], labels=[f"{s / 2**30:g}" for s in sizes])
        ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    ax.set_xlabel("memory held per GPU (GiB)")
    ax.set_ylabel("signal → memory back (ms)")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.0) * 1.15)  # room above the highest point for the legend
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    backends = sorted({f"{r.backend}, driver {r.driver}" for r in kept})
    ax.set_title("Time until the driver gives the memory back" + (f"\n{'; '.join(backends)}" if backends else ""),
                 fontsize=10)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out


def plot_run_trace(record: RunRecord, path: str | os.PathLike[str], *, device: int | None = None) -> Path:
    """PNG: used memory (GiB) against time from the signal (ms) for one run, one line per GPU, with the phases of
    ``device`` (default: the run's first GPU) marked: signal, leader zombie, exited (pidfd), device files closed,
    off the list, memory back, pid reaped; each phase's sampling window shaded where the record has one.

    ``ValueError`` when the record has no trace (run with ``trace=True`` / ``--trace``); :class:`PlotUnavailable`
    without matplotlib."""
    if record.trace is None or not record.trace:
        raise ArgumentError(f"run {record.run} has no trace: run the study with trace=True (--trace)")
    gpus = list(dict.fromkeys(d.index for d in record.devices))  # the trace's columns: one per GPU, not per holder
    n = len(gpus)
    marked = record.devices[0] if device is None else next((d for d in record.devices if d.index == device), None)
    if marked is None:
        raise ArgumentError(f"GPU {device} is not in run {record.run}")
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    times = [(row[0] or 0) / 1e6 for row in record.trace]
    for i, index in enumerate(gpus):
        used = [math.nan if row[1 + i] is None else (row[1 + i] or 0) / 2**30 for row in record.trace]
        ax.step(times, used, where="post", label=f"GPU {index}" if n > 1 else "used memory")
    sig = marked.signal_ns / 1e6
    marks = (("signal", 0, "black", "-"), ("leader zombie", marked.zombie_ns, "tab:purple", ":"),
             ("exited (pidfd)", marked.exited_ns, "tab:brown", ":"),
             ("device files closed", marked.files_closed_ns, "tab:gray", ":"),
             ("off the list", marked.off_list_ns, "tab:orange", "--"),
             ("memory back", marked.memory_back_ns, "tab:green", "--"),
             ("pid reaped", marked.waitpid_ns, "tab:red", "--"))
    res = marked.phase_resolution_ns or {}
    keys = {"leader zombie": "zombie", "exited (pidfd)": "exited", "device files closed": "files_closed",
            "off the list": "off_list", "memory back": "memory_back"}
    for label, t, colour, style in marks:
        if t is None:
            continue
        x = sig + t / 1e6
        window = res.get(keys.get(label, ""))
        if window:  # the phase lies in (t - window, t]: shade it, so a wide window cannot pass for a precise time
            ax.axvspan(x - window / 1e6, x, color=colour, alpha=0.12, linewidth=0)
        ax.axvline(x, color=colour, linestyle=style, linewidth=1, label=f"{label} ({t / 1e6:.1f} ms)")
    ax.set_xlabel("time from the signal (ms)")
    ax.set_ylabel("used memory (GiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{format_bytes(record.size_bytes)}, {record.ending}, run {record.run} "
                 f"(sampling period {record.resolution_ns / 1e6:.3f} ms)", fontsize=10)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out
