"""Plots say where their times come from: a plot of simulated runs is marked across the figure (and in the PNG's
metadata), one of runs that do not say under it; and a plot never draws two cells (pinned memory, pin modes,
importers, roles) as one line, nor one trace for a sweep of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.cli._study import _study_plots
from nvmlcheck.study import DeviceRun, RunRecord, plots

pytest.importorskip("matplotlib")
Image = pytest.importorskip("PIL.Image")

GIB = 1 << 30
MS = 1_000_000


def _runs(y_ms: float, n: int = 3, *, simulated: bool | None = False, **run: Any) -> list[RunRecord]:
    out = []
    for i in range(n):
        v = round((y_ms + i) * MS)
        device = DeviceRun(index=0, uuid="GPU-0", name="NVIDIA H200", pid=100 + i, baseline_used_bytes=0,
                           held_bytes=GIB, signal_ns=0, last_held_ns=v - MS, first_clean_ns=v, off_list_ns=v,
                           memory_back_ns=v, waitpid_ns=v, exit_status=-9)
        fields: dict[str, Any] = {"size_bytes": GIB, "mode": "precise", "backend": "nvml", "driver": "580.159.04",
                                  **run}
        out.append(RunRecord(run=i, repeat=i, warmup=False, ending="KILL", nvmlcheck="0", wall_time=0.0,
                             timed_out=False, timeout_s=30.0, timeout_reason=None, polls=10, poll_interval_ns=1,
                             poll_cost_ns=1, devices=(device,), simulated=simulated,
                             simulation="nvmlcheck --simulate h200" if simulated else None,
                             trace_columns=("offset_ns", "used_bytes[0]", "process_count[0]"),
                             trace=((0, GIB, 1), (v, 0, 0)), **fields))
    return out


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure the plots draw, to read what is written on it."""
    drawn: list[Any] = []
    make = plots._figure

    def keep(width: float, height: float) -> Any:
        drawn.append(make(width, height))
        return drawn[-1]

    monkeypatch.setattr(plots, "_figure", keep)
    return drawn


def _words(fig: Any) -> str:
    return " ".join(t.get_text() for t in fig.texts)


def test_provenance_mark() -> None:
    assert plots.provenance_mark(_runs(100.0)) is None
    sim = plots.provenance_mark(_runs(100.0, simulated=True))
    assert sim is not None and sim.startswith("SIMULATED: the stub's timings") and "--simulate h200" in sim
    mixed = plots.provenance_mark(_runs(100.0) + _runs(100.0, simulated=True))
    assert mixed is not None and mixed.startswith("SIMULATED: some runs")
    assert "provenance unknown" in (plots.provenance_mark(_runs(100.0, simulated=None)) or "")


@pytest.mark.parametrize("simulated", [True, None, False])
def test_plots_of_simulated_runs_are_marked(tmp_path: Path, figures: list[Any], simulated: bool | None) -> None:
    runs = _runs(100.0, simulated=simulated)
    clean = plots.plot_time_to_clean(runs, tmp_path / "clean.png")
    trace = plots.plot_run_trace(runs[0], tmp_path / "trace.png")
    for fig, path in zip(figures, (clean, trace), strict=True):
        words, meta = _words(fig), Image.open(path).text
        if simulated:
            assert "SIMULATED" in words.split() and "the stub's timings" in words
            assert meta["Description"].startswith("SIMULATED")
        elif simulated is None:
            assert "provenance unknown" in words and "SIMULATED" not in words
        else:
            assert words == "" and "Description" not in meta
        assert "NVIDIA H200" in fig.axes[0].get_title()


def test_cells_are_never_one_line(tmp_path: Path, figures: list[Any]) -> None:
    pinned: dict[str, Any] = {"holder": "pinned", "size_bytes": 8 * GIB}
    runs = (_runs(113.0, pin_mode="alloc", **pinned)
            + _runs(1370.0, pinned_bytes=8 * GIB, pin_mode="alloc", **pinned)
            + _runs(736.0, pinned_bytes=8 * GIB, pin_mode="register", **pinned))
    plots.plot_time_to_clean(runs, tmp_path / "clean.png")
    labels = sorted(line.get_label() for line in figures[0].axes[0].get_lines())
    assert labels == ["KILL 8.0 GiB pinned by alloc: runs and median",
                      "KILL 8.0 GiB pinned by register: runs and median", "KILL: runs and median"]


def test_the_cli_draws_a_trace_per_cell_of_a_sweep(tmp_path: Path) -> None:
    runs = (_runs(113.0, holder="pinned", pin_mode="alloc")
            + _runs(1370.0, holder="pinned", pinned_bytes=8 * GIB, pin_mode="alloc")
            + _runs(736.0, holder="pinned", pinned_bytes=8 * GIB, pin_mode="register"))
    written = sorted(Path(p).name for p in _study_plots(runs, str(tmp_path)))
    assert written == ["time-to-clean.png", "trace-pinned-1GiB-KILL.png", "trace-pinned-1GiB-pinned8GiB-KILL.png",
                       "trace-pinned-1GiB-pinned8GiB-register-KILL.png"]


def test_a_plot_that_cannot_be_written_is_an_error_naming_plot(tmp_path: Path) -> None:
    from nvmlcheck.study import StudyError

    (tmp_path / "time-to-clean.png").mkdir()  # the file cannot be written: a directory has its name
    with pytest.raises(StudyError, match=r"--plot .*: cannot write a plot"):
        _study_plots(_runs(100.0), str(tmp_path))


def test_runs_left_out_of_the_time_plot_are_said_on_it(tmp_path: Path, figures: list[Any]) -> None:
    # Timed-out runs (the slowest: memory not back within the run timeout) and GPUs whose memory was not seen back
    # were left out without a word: a study whose runs all timed out drew an empty plot.
    from dataclasses import replace

    done = _runs(100.0)
    timed = [replace(r, run=10 + i, timed_out=True, timeout_reason="x") for i, r in enumerate(_runs(100.0, 2))]
    unseen = [replace(done[0], run=20, devices=(replace(done[0].devices[0], memory_back_ns=None),))]
    plots.plot_time_to_clean([*done, *timed, *unseen], tmp_path / "some.png")
    assert "not plotted: 2 runs timed out (memory not back within 30 s); 1 GPU-run with the memory not seen back" \
        in _words(figures[-1])
    plots.plot_time_to_clean(timed, tmp_path / "none.png")
    axes_words = " ".join(t.get_text() for t in figures[-1].axes[0].texts)
    assert "nothing to plot:\n2 runs timed out (memory not back within 30 s)" in axes_words
    plots.plot_time_to_clean(done, tmp_path / "all.png")
    assert "not plotted" not in _words(figures[-1])
