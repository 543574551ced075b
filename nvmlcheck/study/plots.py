"""PNG plots of a study: time to memory back against size (:func:`plot_time_to_clean`) and one run's trace with
its phases marked (:func:`plot_run_trace`). matplotlib is imported only when a plot is drawn (``nvmlcheck[plot]``);
without it they raise :class:`~nvmlcheck.study.PlotUnavailable`."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from ..errors import ArgumentError
from .errors import PlotUnavailable
from .summary import cell_words, percentile

if TYPE_CHECKING:
    from .records import RunRecord

__all__ = ["plot_run_trace", "plot_time_to_clean", "provenance_mark"]

#: The mark of a plot drawn from simulated runs: across the figure, so that no crop of it passes for a GPU's figure.
SIMULATED_MARK = "SIMULATED"


def provenance_mark(records: Iterable[RunRecord]) -> str | None:
    """What a plot of ``records`` must say about where its times come from: ``None`` when every run is real; else
    the words (simulated runs: the stub's timings; runs whose records do not say whether they were simulated)."""
    kinds = {r.provenance for r in records}
    if "simulated" in kinds:
        what = sorted({r.simulation for r in records if r.simulated and r.simulation})
        some = "" if kinds == {"simulated"} else "some runs "
        return (f"{SIMULATED_MARK}: {some}the stub's timings, not a GPU's measurement"
                + (f" ({'; '.join(what)})" if what else ""))
    if "unknown" in kinds:
        return "provenance unknown: the records do not say whether they were simulated"
    return None


def _mark(fig: Any, records: Iterable[RunRecord]) -> str | None:
    """Mark the figure drawn from ``records`` as simulated (a large diagonal word and a red line under the axes) or
    of unknown provenance (the line); the words, also kept in the PNG's metadata (``Description``)."""
    words = provenance_mark(list(records))
    if words is None:
        return None
    simulated = words.startswith(SIMULATED_MARK)
    if simulated:
        fig.text(0.5, 0.5, SIMULATED_MARK, transform=fig.transFigure, fontsize=56,
                 color="tab:red", alpha=0.18, rotation=25, ha="center", va="center", weight="bold", zorder=10)
    fig.text(0.5, -0.02, words, ha="center", va="top", fontsize=9, color="tab:red" if simulated else "dimgray",
             weight="bold" if simulated else "normal", wrap=True)
    return words


def _save(fig: Any, path: str | os.PathLike[str], mark: str | None) -> Path:
    out = Path(path)
    metadata = {"Software": "nvmlcheck study"} | ({"Description": mark} if mark else {})
    fig.savefig(out, bbox_inches="tight", metadata=metadata)
    return out


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
    """PNG: signal → memory back (ms) against size (log x), one colour per ending (and per holder kind, pinned
    memory and its pin mode, importers, IPC order and role where the records have several: never two in one line):
    every GPU-run as a point, the median as a line. Warm-ups and timed-out runs left out
    (those timed out, and GPU-runs whose memory was not seen back, are counted on the figure). Runs that were simulated
    are marked across the figure, runs of unknown provenance under it (:func:`provenance_mark`). Raises
    :class:`PlotUnavailable` without matplotlib."""
    records = list(records)
    kept = [r for r in records if not r.warmup and not r.timed_out]
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    series: dict[tuple[str, str, int, int, str, str, str], dict[int, list[float]]] = {}
    for r in kept:
        for d in r.devices:
            if d.memory_back_ns is not None:
                pin_mode = (r.pin_mode or "") if r.pinned_bytes else ""
                key = (str(r.ending), r.holder, r.pinned_bytes, r.importers, r.first or "", d.role, pin_mode)
                series.setdefault(key, {}).setdefault(r.size_bytes, []).append(d.memory_back_ns / 1e6)
    parts = [len({k[i] for k in series}) > 1 for i in range(6)]  # which parts tell the series apart
    parts.append(len({k[6] for k in series if k[6]}) > 1)  # a pin mode, where there are two
    for key, by_size in series.items():
        xs = [size / 2**30 for size, vals in sorted(by_size.items()) for _ in vals]
        ys = [v for _, vals in sorted(by_size.items()) for v in vals]
        medians = [(size / 2**30, percentile(vals, 0.5)) for size, vals in sorted(by_size.items())]
        (line,) = ax.plot([m[0] for m in medians], [m[1] for m in medians],
                          label=f"{_series_label(key, parts)}: runs and median")
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
    if series:
        ax.legend(fontsize=8 if len(series) > 3 else 10)
    ax.set_title(_title("Time until the driver gives the memory back", kept), fontsize=10)
    missing = _not_plotted(records)
    if missing is not None:  # said on the figure: an empty or thin plot never reads as "nothing was slow"
        if series:
            fig.text(0.5, -0.08, f"not plotted: {missing}", ha="center", va="top", fontsize=9, color="dimgray",
                     wrap=True)
        else:
            ax.text(0.5, 0.5, f"nothing to plot:\n{missing}", transform=ax.transAxes, ha="center", va="center",
                    fontsize=10, wrap=True)
    return _save(fig, path, _mark(fig, records))


def _not_plotted(records: Sequence[RunRecord]) -> str | None:
    """The measured runs a time-to-clean plot leaves out, in words: timed out (their time past the run timeout),
    or a GPU whose memory was not seen back; ``None`` when every measured GPU-run is plotted."""
    timed = [r for r in records if not r.warmup and r.timed_out]
    unseen = sum(1 for r in records if not r.warmup and not r.timed_out
                 for d in r.devices if d.memory_back_ns is None)
    words = []
    if timed:
        words.append(f"{len(timed)} run{'s' if len(timed) != 1 else ''} timed out (memory not back within "
                     f"{max(r.timeout_s for r in timed):g} s)")
    if unseen:
        words.append(f"{unseen} GPU-run{'s' if unseen != 1 else ''} with the memory not seen back")
    return "; ".join(words) if words else None


def _series_label(key: tuple[str, str, int, int, str, str, str], parts: list[bool]) -> str:
    ending, holder, pinned, importers, first, role, pin_mode = key
    words = f"{holder} " if parts[1] else ""
    words += cell_words(pinned if parts[2] else 0, importers if parts[3] else 0, first if parts[4] else None)
    words += f" by {pin_mode}" if parts[6] and pin_mode else ""
    words += f" ({role}s)" if parts[5] else ""
    return f"{ending}{' ' + words.strip(' ,') if words.strip(' ,') else ''}"


def _title(what: str, records: Iterable[RunRecord]) -> str:
    """``what``, over the machine: the GPU models, backends and drivers of the records."""
    records = list(records)
    gpus = sorted({d.name or "GPU model unknown" for r in records for d in r.devices})
    backends = sorted({f"{r.backend}, driver {r.driver}" for r in records})
    machine = "; ".join([*gpus, *backends])
    return what + (f"\n{machine}" if machine else "")


def plot_run_trace(record: RunRecord, path: str | os.PathLike[str], *, device: int | None = None) -> Path:
    """PNG: used memory (GiB) against time from the signal (ms) for one run, one line per GPU, with the phases of
    ``device`` (default: the run's first GPU) marked: signal, leader zombie, exited (pidfd), device files closed,
    off the list, memory back, pid reaped; each phase's sampling window shaded where the record has one. A simulated
    run is marked across the figure, one of unknown provenance under it (:func:`provenance_mark`).

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
    ax.set_xlabel("time from the run's first signal (ms)")
    ax.set_ylabel("used memory (GiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    words = cell_words(record.pinned_bytes, record.importers, record.first)
    ax.set_title(_title(f"{record.holder} {format_bytes(record.size_bytes)}{words}, {record.ending}, run {record.run} "
                        f"(sampling period {record.resolution_ns / 1e6:.3f} ms)", [record]), fontsize=10)
    return _save(fig, path, _mark(fig, [record]))
