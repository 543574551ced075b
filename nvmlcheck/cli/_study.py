"""``nvmlcheck study reclaim`` (how fast the driver gives memory back), ``study compare``, ``study fit`` (the
reclaim-time model) and ``nvmlcheck demo``."""

from __future__ import annotations

import contextlib
import math
import os
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._common import EXIT_BACKEND, EXIT_CLEAN, EXIT_NOT_CLEAN, UsageError, open_session
from ._output import StatusLine, human_bytes, print_json, safe, safe_lines

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence


def _size_label(n: int) -> str:
    if n == 0:
        return "0B"  # a context holder's: no allocation
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def _holder_count(args: argparse.Namespace) -> int:
    """``--count``, else ``--chunks`` (the older spelling), else 4 for the kinds whose point is a count."""
    if args.count is not None:
        return int(args.count)
    if args.chunks != 1 or args.holder not in ("chunks", "contexts", "streams"):
        return int(args.chunks)
    return 4


def _study_holders(args: argparse.Namespace) -> Any:
    from ..study import CudaHolderFactory

    if args.simulate is None:
        return CudaHolderFactory(chunks=_holder_count(args), kind=args.holder)
    from ..study.stub_holder import StubHolderFactory

    # simulation() wrote this scenario file for the stub; the factory adds the holders' pids to it per run.
    return StubHolderFactory(args.simulation.scenario_path, kind=args.holder,
                             simulation=f"nvmlcheck --simulate {args.simulate}: the stub libnvidia-ml and stub holders")


def _study_plots(records: Sequence[Any], directory: str) -> list[str]:
    """The plots of ``--plot``; a plot that cannot be written (a full disk) is a :class:`StudyError` naming it, not a
    traceback after a study of hours (its records are in ``--out`` already)."""
    from ..study import StudyError

    try:
        return _draw_plots(records, directory)
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        raise StudyError(f"--plot {directory}: cannot write a plot{where}: {exc.strerror or exc}") from None


def _draw_plots(records: Sequence[Any], directory: str) -> list[str]:
    from ..study import median_run, plot_run_trace, plot_time_to_clean

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [str(plot_time_to_clean(records, out / "time-to-clean.png"))]
    # One trace per cell: a sweep of pinned memory or importers at one size has a trace for each, not one of them.
    cells: dict[tuple[Any, ...], list[Any]] = {}
    for r in records:
        if not r.warmup:
            cells.setdefault((r.size_bytes, r.ending, r.holder, r.pinned_bytes, r.pin_mode if r.pinned_bytes else None,
                              r.importers, r.first), []).append(r)
    for (size, ending, holder, pinned, pin_mode, importers, first), runs in cells.items():
        run = median_run(runs, size, ending)
        if run is not None and run.trace:
            kind = "" if holder == "alloc" else f"{holder}-"  # the default kind keeps the older names
            extra = f"-pinned{_size_label(pinned)}" if pinned else ""
            extra += f"-{pin_mode}" if pin_mode and pin_mode != "alloc" else ""
            extra += f"-{importers}importers" if importers else ""
            extra += f"-{first}-first" if first else ""
            paths.append(str(plot_run_trace(run, out / f"trace-{kind}{_size_label(size)}{extra}-{ending}.png")))
    return paths


def _check_out(path: str) -> None:
    """``--out``: a regular file on disk (new or replaced), before a study that may last hours, not after its first
    run: never a directory, a device or a kernel file (``/proc/self/mem`` is "regular" to stat)."""
    if not path:
        raise UsageError("--out needs a file name, got an empty one")
    real = os.path.realpath(path)
    if real == "/dev" or real.startswith(("/proc/", "/sys/", "/dev/")):
        raise UsageError(f"--out {path}: not a file on disk ({real})")
    if not os.path.isdir(os.path.dirname(real) or "."):
        raise UsageError(f"--out {path}: its directory does not exist")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"--out {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"--out {path}: is a directory (name a file in it, e.g. {os.path.join(path, 'runs.jsonl')})")
    if not stat.S_ISREG(mode):
        raise UsageError(f"--out {path}: not a regular file")


class _Sink:
    """The record writer, its failure (a full disk) an error naming ``--out`` and the records it keeps (the study
    stops, its holders ended); ``written`` counts the records written whole."""

    def __init__(self, write: Any, path: str) -> None:
        self.write, self.path, self.written = write, path, 0

    def kept(self) -> str:
        """What ``--out`` holds now, in words."""
        n = self.written
        if not n:
            return f"{safe(self.path)} left as it was (no run finished)"
        return f"{safe(self.path)} keeps the {n} record{'s' if n != 1 else ''} of the runs finished, each whole"

    def __call__(self, record: Any) -> None:
        from ..study import StudyError

        try:
            self.write(record)
        except OSError as exc:
            raise StudyError(f"--out {self.path}: cannot write record {self.written + 1}: {exc.strerror or exc}"
                             ) from None
        self.written += 1


def _sink(write: Any, path: str) -> _Sink:
    """The record writer of ``--out`` (:class:`_Sink`)."""
    return _Sink(write, path)


def _records_of(path: str) -> list[Any]:
    """The run records of ``path``; a file that cannot be read, is not records, or holds none is a usage error (an
    empty file is not an empty study: compared or fitted, it would read as cells only the other side has)."""
    from ..study import RecordFormatError, load_records

    try:
        records = load_records(path, traces=False)  # compare and fit read no trace: never all of them in memory
    except OSError as exc:  # "[Errno 2] No such file or directory: 'a'" said the file twice, with Python's codes
        raise UsageError(f"cannot read the records of {path}: {exc.strerror or exc}") from None
    except RecordFormatError as exc:
        raise UsageError(f"cannot read the records of {path}: {exc}") from None
    if not records:
        raise UsageError(f"{path}: no run records (the file is empty or blank)")
    return records


def cmd_study_compare(args: argparse.Namespace) -> int:
    """``study compare A.jsonl B.jsonl``: per cell, the median difference with a bootstrap interval; exit 0."""
    from ..study.compare import MAX_RESAMPLES, MAX_RESOLVE_NS, MIN_RESAMPLES, compare_records, format_comparison

    if not MIN_RESAMPLES <= args.resamples <= MAX_RESAMPLES:  # before reading: a huge count would run for days
        raise UsageError(f"--resamples must be within {MIN_RESAMPLES}..{MAX_RESAMPLES}, got {args.resamples}")
    if not 0.0 < args.level < 1.0:
        raise UsageError(f"--level must be within (0, 1), got {args.level}")
    ns = args.resolve_ms * 1e6  # 1e308 ms is a finite number of ms but no finite number of ns
    resolve_ns = round(ns) if math.isfinite(ns) and ns <= MAX_RESOLVE_NS else 0
    if not resolve_ns >= 1:  # NaN, inf, <= 0, below a nanosecond, or beyond MAX_RESOLVE_NS
        raise UsageError(f"--resolve-ms must be a finite number of ms within 1e-6..{MAX_RESOLVE_NS / 1e6:.0e}, got "
                         f"{args.resolve_ms}")
    loaded = [_records_of(path) for path in (args.a, args.b)]
    across = tuple(p.strip() for p in args.across.split(",") if p.strip())
    result = compare_records(loaded[0], loaded[1], measure=args.measure, level=args.level,
                             resamples=args.resamples, seed=args.seed, resolve_ns=resolve_ns,
                             across=across, stage=args.stage)
    if args.json:
        from ..jsonout import compare_document

        print_json(compare_document(result, args.a, args.b))
    else:
        print(f"A = {safe(args.a)}\nB = {safe(args.b)}")
        print(safe_lines(format_comparison(result)))  # holder kinds and endings come from the records files
    return EXIT_CLEAN


def cmd_study_fit(args: argparse.Namespace) -> int:
    """``study fit RECORDS.jsonl...``: the reclaim-time model fitted to the records; exit 0."""
    from ..study.fit import FIT_KINDS, fit_report, format_fit

    kinds = FIT_KINDS if args.kinds is None else tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    from ..study.child import HOLDER_KINDS

    unknown = [k for k in kinds if k not in HOLDER_KINDS]
    if not kinds or unknown:  # a typo fitted nothing, or "--kinds ," named none, with no word on why
        raise UsageError(f"--kinds: {'unknown holder kind ' + ', '.join(map(repr, unknown)) if unknown else 'no kind'}"
                         f" (the kinds: {', '.join(HOLDER_KINDS)})")
    records = [r for path in args.records for r in _records_of(path)]
    endings = None if args.endings is None else tuple(args.endings)  # None: fit_report picks one
    try:
        result = fit_report(records, kinds=kinds, endings=endings, driver=args.driver,
                            include_simulated=args.include_simulated,
                            across=tuple(p.strip() for p in args.across.split(",") if p.strip()))
    except ValueError as exc:
        raise UsageError(f"cannot fit: {exc}") from None
    if args.json:
        from ..jsonout import study_fit_document

        print_json(study_fit_document(result, args.records))
    else:
        print(safe_lines(format_fit(result)))  # GPU names, kinds and drivers come from the records files
    return EXIT_CLEAN


#: ``study reclaim``'s option of each :class:`~nvmlcheck.study.StudyConfig` field: its errors name what the user
#: typed (``--run-timeout``), not the library's field (``run_timeout_s``). tests/unit/test_study_inputs.py checks
#: that every field :func:`_config` sets has one and that each is an option of the parser.
OPTION_OF_FIELD = {
    "sizes": "--sizes", "repeats": "--repeats", "endings": "--endings", "devices": "--devices", "mode": "--mode",
    "trace": "--trace", "warmup": "--warmup", "run_timeout_s": "--run-timeout", "holder": "--holder",
    "holder_count": "--count", "per_gpu": "--per-gpu", "concurrent": "--concurrent", "phases": "--phases",
    "device_files": "--device-files", "events": "--events", "pinned": "--pinned", "pin_mode": "--pin-mode",
    "importers": "--importers", "first": "--first", "stage_gap_s": "--stage-gap", "budget_s": "--budget",
    "ready_timeout_s": "--ready-timeout",
}


def _config(args: argparse.Namespace) -> Any:
    """The :class:`~nvmlcheck.study.StudyConfig` of ``study reclaim``'s options (``ValueError``: exit 2), its errors
    naming the options (:data:`OPTION_OF_FIELD`)."""
    from .. import study as st
    from ..study.config import spelled_as
    from ._parser import typed

    sizes = args.sizes
    if sizes is None:
        sizes = [0] if args.holder == "context" else [1 << 30, 4 << 30, 16 << 30]
    elif args.holder == "context" and any(sizes):
        raise UsageError(f"{typed(args, 'holder', '--holder')} context allocates nothing: leave out --sizes "
                         "(or give --sizes 0)")
    with spelled_as(_option_names(args)):
        return _study_config(st, args, sizes)


def _option_names(args: argparse.Namespace) -> dict[str, str]:
    """Each :class:`~nvmlcheck.study.StudyConfig` field's option as the user typed it (``--kind`` is ``--holder``'s
    alias), for the study's errors (:func:`nvmlcheck.study.config.spelled_as`)."""
    from ._parser import typed

    names = {field: typed(args, option.lstrip("-").replace("-", "_"), option)
             for field, option in OPTION_OF_FIELD.items()}
    if args.count is None:
        names["holder_count"] = "--chunks"  # the count came from --chunks (or the kind's default of 4)
    return names


def _study_config(st: Any, args: argparse.Namespace, sizes: Sequence[int]) -> Any:
    return st.StudyConfig(
        sizes=tuple(sizes), repeats=args.repeats, endings=tuple(args.endings),
        devices=None if args.devices is None else tuple(args.devices), mode=args.mode, trace=args.trace,
        warmup="per_cell" if args.warmup else "none", run_timeout_s=args.run_timeout,
        holder=args.holder, holder_count=_holder_count(args), per_gpu=args.per_gpu, concurrent=args.concurrent,
        phases=args.phases, device_files=None if args.device_files is None else tuple(args.device_files.split(":")),
        events=args.events, pinned=tuple(args.pinned or (0,)), pin_mode=args.pin_mode,
        importers=tuple(args.importers or (0,)), first=tuple(args.first or ("exporter",)),
        stage_gap_s=args.stage_gap, budget_s=args.budget, ready_timeout_s=args.ready_timeout,
    )


def _check_outputs(args: argparse.Namespace) -> None:
    """``--out`` and ``--plot``, before any run; ``--out`` first: a refused ``--out`` left the directory of
    ``--plot`` made, for a study that never ran."""
    if args.out is not None:
        _check_out(args.out)
    if args.plot is not None:
        if not args.plot:
            raise UsageError("--plot needs a directory name, got an empty one")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'nvmlcheck[plot]'") from None
        if os.path.exists(args.plot) and not os.path.isdir(args.plot):
            raise UsageError(f"--plot {args.plot}: not a directory")
        try:  # made now, as the plots will make it: a path that cannot be a directory is refused before any run
            os.makedirs(args.plot, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--plot {args.plot}: cannot make the directory: {exc.strerror or exc}") from None
        if not os.access(args.plot, os.W_OK | os.X_OK):
            raise UsageError(f"--plot {args.plot}: not writable")


def _print_study(args: argparse.Namespace, result: Any, rows: Any, plots: Sequence[str]) -> None:
    """The text output of ``study reclaim``: the machine, the summary, timeouts, an early stop, the files written."""
    from .. import study as st

    if not result.records:
        print("no run: the time budget was spent before the first one"
              + (f" ({safe(args.out)} left as it was)" if args.out else ""))
        return
    first = result.records[0]
    # Every record's GPUs (with --concurrent none each run is on one of them, in turn).
    named = list(dict.fromkeys(f"{d.index} ({safe(d.name or '?')})" for r in result.records for d in r.devices))
    gpus = ("GPUs " if len(named) > 1 else "GPU ") + ", ".join(named)
    simulated = " — SIMULATED (stub libnvidia-ml)" if args.simulate is not None else ""
    print(f"{len(result.measured)} measured runs + {len(result.records) - len(result.measured)} warm-ups on "
          f"{gpus}; backend {first.backend}, driver {safe(first.driver)}, {first.mode} polling{simulated}")
    if rows:
        print(safe_lines(st.format_summary(rows)))
    else:  # warm-ups only (a budget spent after them): no table of nothing
        print("no measured run: only warm-ups, which are left out of the statistics")
    for r in result.records:
        if r.timed_out:
            print(f"run {r.run} ({human_bytes(r.size_bytes)} {r.ending}) timed out: {safe(r.timeout_reason)}",
                  file=sys.stderr)
    if result.stopped is not None:
        print(f"study stopped early: {result.stopped}", file=sys.stderr)
    for written in ([args.out] if args.out else []) + list(plots):
        print(f"wrote {safe(written)}")


def cmd_study_reclaim(args: argparse.Namespace) -> int:
    """Run the reclamation study (or, for ``study compare`` and ``study fit``, :func:`cmd_study_compare` and
    :func:`cmd_study_fit`); exit 1 if a run timed out or the GPUs were not clean at baseline, 3 when the study is
    skipped (it cannot run here: the reason is printed)."""
    from .. import study as st
    from ..study.config import spelled_as
    from ._main import fail

    if args.study == "compare":
        return cmd_study_compare(args)
    if args.study == "fit":
        return cmd_study_fit(args)
    config = _config(args)
    _check_outputs(args)  # before a study that may last hours, not after it
    status = StatusLine(sys.stderr, not args.json)

    def progress(p: st.StudyProgress) -> None:
        r = p.record
        clean = r.devices[0].first_clean_ns if r.devices else None
        last = "timed out" if r.timed_out else f"clean after {clean / 1e6:.1f} ms" if clean is not None else "?"
        kind = " warm-up" if r.warmup else ""
        words = st.cell_words(r.pinned_bytes, r.importers, r.first)
        status.update(f"study run {p.done}/{p.total} · {r.holder} {human_bytes(r.size_bytes)}{words} {r.ending}{kind}"
                      f" · {last}")

    with contextlib.ExitStack() as stack:
        sink = None
        if args.out is not None:
            try:
                sink = _sink(stack.enter_context(st.record_writer(args.out)), args.out)
            except OSError as exc:
                raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
        stack.enter_context(spelled_as(_option_names(args)))  # the run's checks (room on the GPUs) name options too
        try:
            result = st.run_study(config, session_factory=lambda: open_session(args),
                                  holder_factory=_study_holders(args), on_record=sink, progress=progress)
        except BaseException as exc:  # Ctrl-C, a signal, a failure: say what --out keeps (the error comes after)
            status.clear()
            if sink is not None and (sink.written or not isinstance(exc, st.BaselineNotClean | st.StudySkipped)):
                print(f"nvmlcheck: study stopped; {sink.kept()}", file=sys.stderr)
            if isinstance(exc, st.BaselineNotClean):
                return fail(args.json, exc, EXIT_NOT_CLEAN)
            if isinstance(exc, st.StudySkipped):
                return fail(args.json, exc, EXIT_BACKEND, label="skipped")
            raise
        finally:
            status.clear()
    plots = _study_plots(result.records, args.plot) if args.plot is not None else []
    rows = st.summarize(result.records)
    timed_out = [r for r in result.records if r.timed_out]
    if args.json:
        from ..jsonout import study_reclaim_document

        # --out is written from the first record on: without one it was left as it was
        print_json(study_reclaim_document(result, rows, out=args.out if result.records else None, plots=plots))
    else:
        _print_study(args, result, rows, plots)
    return EXIT_NOT_CLEAN if timed_out else EXIT_CLEAN
