"""The reclamation timing instrument: how long after a process ends does the driver give its GPU memory back?

>>> import nvmlcheck
>>> from nvmlcheck.study import StudyConfig, run_study, summarize, format_summary
>>> config = StudyConfig(sizes=(2**30, 16 * 2**30), repeats=5, endings=("KILL", "TERM"))
>>> result = run_study(config, session_factory=lambda: nvmlcheck.open("nvml"))      # doctest: +SKIP
>>> print(format_summary(summarize(result.records)))                                # doctest: +SKIP

Modules: ``config`` (what to measure), ``holders``, ``child`` and ``holdkinds`` (the processes that hold memory;
``mps``: the study's MPS daemon; ``stub_holder`` on the stub), ``runner`` with ``observer`` and ``phases`` (one run,
timed), ``records`` (JSON Lines), ``summary``, ``plots``, ``compare``, ``fit`` (the reclaim-time model). How a run
is timed and every record field: docs/study-records.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import ENDINGS, Cell, Concurrency, Ending, PlannedRun, StudyConfig, WarmUp, parse_ending
    from .errors import BaselineNotClean, HolderError, PlotUnavailable, RecordFormatError, StudyError, StudySkipped
    from .fit import FitResult, fit_report, format_fit
    from .holders import CudaHolderFactory, Holder, HolderFactory, HolderSpec
    from .plots import plot_run_trace, plot_time_to_clean
    from .records import RECORD_SCHEMA, RECORD_VERSION, DeviceRun, RunRecord, load_records, record_writer, write_records
    from .runner import StudyProgress, StudyResult, run_study
    from .summary import (
        MEASURES,
        SLEEP_REFERENCE_NS,
        Stats,
        SummaryRow,
        cell_words,
        format_summary,
        median_run,
        percentile,
        summarize,
    )

__all__ = [
    "ENDINGS",
    "MEASURES",
    "RECORD_SCHEMA",
    "RECORD_VERSION",
    "SLEEP_REFERENCE_NS",
    "BaselineNotClean",
    "Cell",
    "Concurrency",
    "CudaHolderFactory",
    "DeviceRun",
    "Ending",
    "FitResult",
    "Holder",
    "HolderError",
    "HolderFactory",
    "HolderSpec",
    "PlannedRun",
    "PlotUnavailable",
    "RecordFormatError",
    "RunRecord",
    "Stats",
    "StudyConfig",
    "StudyError",
    "StudyProgress",
    "StudyResult",
    "StudySkipped",
    "SummaryRow",
    "WarmUp",
    "cell_words",
    "fit_report",
    "format_fit",
    "format_summary",
    "load_records",
    "median_run",
    "parse_ending",
    "percentile",
    "plot_run_trace",
    "plot_time_to_clean",
    "record_writer",
    "run_study",
    "summarize",
    "write_records",
]

# Names resolve on first use (PEP 562), as in the top-level package: `python -m nvmlcheck.holder` (the holder
# child, nvmlcheck.study.child) passes through this file and must not load the runner, predicates and model.
_LAZY: dict[str, str] = {
    "ENDINGS": "config", "Concurrency": "config", "Ending": "config", "StudyConfig": "config", "WarmUp": "config",
    "parse_ending": "config", "Cell": "config", "PlannedRun": "config",
    "BaselineNotClean": "errors", "HolderError": "errors", "PlotUnavailable": "errors",
    "RecordFormatError": "errors", "StudyError": "errors", "StudySkipped": "errors",
    "FitResult": "fit", "fit_report": "fit", "format_fit": "fit",  # fit() itself: nvmlcheck.study.fit.fit
    "CudaHolderFactory": "holders", "Holder": "holders", "HolderFactory": "holders", "HolderSpec": "holders",
    "plot_run_trace": "plots", "plot_time_to_clean": "plots",
    "RECORD_SCHEMA": "records", "RECORD_VERSION": "records", "DeviceRun": "records", "RunRecord": "records",
    "load_records": "records", "record_writer": "records", "write_records": "records",
    "StudyProgress": "runner", "StudyResult": "runner", "run_study": "runner",
    "MEASURES": "summary", "SLEEP_REFERENCE_NS": "summary", "Stats": "summary", "SummaryRow": "summary",
    "format_summary": "summary", "cell_words": "summary", "median_run": "summary", "percentile": "summary",
    "summarize": "summary",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once resolved, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
