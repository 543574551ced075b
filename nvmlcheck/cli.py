"""The ``nvmlcheck`` command (also ``python -m nvmlcheck``).

Exit codes (stable):

====  =====================================================================================================
0     clean / ok
1     not clean when the timeout passed (``wait``, ``kill``); ``study reclaim``: a run timed out, or the GPUs were
      not clean at baseline
2     usage error: bad arguments, a PID that is refused, does not exist or cannot be signalled
3     backend unavailable or failed: no driver, no nvidia-smi, a lost GPU, an NVML or nvidia-smi error
====  =====================================================================================================

``--json`` prints one document with a versioned schema (:mod:`nvmlcheck.jsonout`, docs/cli.md) on stdout; errors
are documents too (``"schema": "nvmlcheck/error"``). Without ``--json`` output is a compact table, and on a
terminal a long wait shows a live status line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from . import __version__
from .errors import BackendUnavailable, NvmlCheckError, WaitTimeout
from .jsonout import document, error_json, snapshot_json
from .model import MIB, DeviceState, Fields, Snapshot

__all__ = ["EXIT_BACKEND", "EXIT_CLEAN", "EXIT_NOT_CLEAN", "EXIT_USAGE", "main"]

EXIT_CLEAN = 0
EXIT_NOT_CLEAN = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


# --- formatting -----------------------------------------------------------------------------------------------------


def human_bytes(n: int | None) -> str:
    """``16.0 GiB``, ``615.1 MiB``, ``512 B``; ``?`` for unknown."""
    if n is None:
        return "?"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.1f} KiB"
    return f"{n} B"


def parse_bytes(text: str) -> int:
    """``16MiB`` / ``1GiB`` / ``4096`` → bytes (binary units; ``M``/``G`` mean MiB/GiB)."""
    from .holder import parse_size

    try:
        return parse_size(text) if text.strip() not in ("0", "0B") else 0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _timeout(text: str) -> float | None:
    if text.lower() in ("none", "inf", "forever"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"timeout must be >= 0 seconds (or 'none'), got {text!r}")
    return value


def _devices(text: str) -> list[int | str]:
    items: list[int | str] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            raise argparse.ArgumentTypeError(f"empty device in {text!r}")
        items.append(int(part) if part.isdigit() else part)
    return items


def _procs_text(d: DeviceState) -> str:
    procs = d.processes
    if procs is None:
        known = [p for kind in ("compute", "graphics", "mps") for p in (getattr(d, f"{kind}_processes") or ())]
        return f"{len(known)}+?" if known else "?"
    return str(len(procs))


def device_table(snap: Snapshot, out: TextIO) -> None:
    """The ``snapshot devices`` view."""
    print(f"{'GPU':<4}{'name':<22}{'used':>11}{'total':>11}{'reserved':>11}{'procs':>7}{'SM MHz':>8}  uuid", file=out)
    for d in snap.devices:
        m = d.memory
        sm = d.clocks.sm_mhz if d.clocks else None
        print(
            f"{d.index:<4}{(d.name or '?')[:21]:<22}{human_bytes(m.used_bytes if m else None):>11}"
            f"{human_bytes(m.total_bytes if m else None):>11}{human_bytes(m.reserved_bytes if m else None):>11}"
            f"{_procs_text(d):>7}{sm if sm is not None else '?':>8}  {d.uuid}",
            file=out,
        )
        if m is not None and m.used_includes_reserved:
            print("    (v1 driver: used includes the driver's reserved memory)", file=out)
    for f in snap.failures:
        print(f"{f.index:<4}UNREADABLE: {f.error}", file=out)
    driver = snap.system.driver_version or "?"
    print(f"backend {snap.backend}, driver {driver}, read in {snap.duration_ns / 1e3:.0f} µs", file=out)


def process_table(snap: Snapshot, out: TextIO) -> None:
    """The ``snapshot procs`` view."""
    print(f"{'GPU':<4}{'pid':>8}  {'kind':<9}{'used':>11}  name", file=out)
    for d in snap.devices:
        for kind in ("compute", "graphics", "mps"):
            procs = getattr(d, f"{kind}_processes")
            if procs is None:
                print(f"{d.index:<4}{'?':>8}  {kind:<9}{'':>11}  ({d.why_unknown('processes.' + kind)})", file=out)
                continue
            for p in procs:
                print(f"{d.index:<4}{p.pid:>8}  {kind:<9}{human_bytes(p.used_bytes):>11}  {p.name or '?'}", file=out)
    for f in snap.failures:
        print(f"{f.index:<4}UNREADABLE: {f.error}", file=out)


class StatusLine:
    """A live one-line status on a terminal (stderr), at most 10 updates a second; nothing when not a TTY."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled and stream.isatty()
        self._last = 0.0
        self._width = 0

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):  # a TTY-like stream without a real terminal behind it
            columns = 80
        text = text[: max(20, columns - 1)]
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0  # cleared: a second clear() writes nothing


# --- commands -------------------------------------------------------------------------------------------------------


def _open(args: argparse.Namespace) -> Any:
    from .session import open as open_session

    backend = args.backend
    if args.simulate is not None and backend == "auto":
        backend = "nvml"
    smi_command = None
    if args.simulate is not None and backend == "smi":
        from .testing import stub_source_dir

        smi_command = [sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py")]
    # nvmlInit can hang on a wedged driver: bound it by the command's own timeout (half of it, so "auto" still has
    # time to fall back to nvidia-smi), between 1 s and the library's default of 10 s.
    timeout = getattr(args, "timeout", None)
    init_timeout_s = 10.0 if timeout is None else min(10.0, max(1.0, timeout / 2))
    return open_session(
        backend, smi_prefix=args.smi_prefix, smi_command=smi_command, init_timeout_s=init_timeout_s
    )


def _print_json(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")


def cmd_snapshot(args: argparse.Namespace) -> int:
    with _open(args) as gpus:
        snap = gpus.snapshot(args.devices)
    if not snap.devices and not snap.failures:
        raise BackendUnavailable(f"the {snap.backend} backend sees no GPU", [f"{snap.backend}: device count 0"])
    if args.json:
        _print_json(document("snapshot", **snapshot_json(snap)))
    elif args.view == "procs":
        process_table(snap, sys.stdout)
    else:
        device_table(snap, sys.stdout)
    return EXIT_BACKEND if snap.failures else EXIT_CLEAN


def _predicate(args: argparse.Namespace) -> Any:
    from . import predicates as p

    pred = p.no_processes() & p.memory_used_at_most(args.max_used)
    if getattr(args, "pids", None):
        pred = pred & p.pids_gone(args.pids)
    return pred


def _status_updater(status: StatusLine, predicate: Any, start: float) -> Any:
    def on_poll(point: Any) -> None:
        if not status.enabled or point.snapshot is None:
            return
        reasons = predicate.evaluate(point.snapshot).reasons
        first = reasons[0] if reasons else "clean, confirming"
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        held = human_bytes(point.total_used_bytes)
        status.update(f"waiting {time.monotonic() - start:5.1f} s · {held} used · {first}{more}")

    return on_poll


def cmd_wait(args: argparse.Namespace) -> int:
    predicate = _predicate(args)
    status = StatusLine(sys.stderr, not args.json)
    with _open(args) as gpus:
        try:
            result = gpus.wait_until_clean(
                args.timeout,
                predicate,
                devices=args.devices,
                policy="precise" if args.precise else None,
                stable_polls=args.stable_polls,
                on_poll=_status_updater(status, predicate, time.monotonic()),
            )
        except WaitTimeout as exc:
            status.clear()
            if args.json:
                _print_json(_wait_timeout_json(exc))
            else:
                print(str(exc), file=sys.stderr)
            return EXIT_NOT_CLEAN
        finally:
            status.clear()
    if args.json:
        _print_json(
            document(
                "wait",
                clean=True,
                elapsed_ns=result.elapsed_ns,
                first_clean_ns=result.first_clean_ns,
                last_dirty_ns=result.last_dirty_ns,
                polls=result.polls,
                poll_cost_ns=result.poll_cost_ns,
                interval_ns=result.interval_ns,
                culprits=[],
                snapshot=snapshot_json(result.snapshot),
            )
        )
    else:
        n = len(result.snapshot.devices)
        print(
            f"clean: {n} GPU{'s' if n != 1 else ''} after {result.first_clean_ns / 1e6:.1f} ms "
            f"(confirmed at {result.elapsed_ns / 1e6:.1f} ms, {result.polls} polls, "
            f"{result.poll_cost_ns / 1e3:.0f} µs per poll)"
        )
    return EXIT_CLEAN


def _wait_timeout_json(exc: WaitTimeout) -> dict[str, Any]:
    return document(
        "wait",
        clean=False,
        elapsed_ns=exc.elapsed_ns,
        timeout_s=exc.timeout_s,
        polls=exc.polls,
        culprits=list(exc.culprits),
        snapshot=None if exc.snapshot is None else snapshot_json(exc.snapshot),
    )


def _confirm(pids: Sequence[int], snap: Snapshot, assume_yes: bool) -> None:
    lines = [
        f"  GPU {d.index}: pid {p.pid} ({p.name or '?'}) {human_bytes(p.used_bytes)} {p.kind.value}"
        for d in snap.devices
        for p in (d.processes or ())
    ]
    print("processes on the selected GPUs:\n" + "\n".join(lines), file=sys.stderr)
    if assume_yes:
        return
    if not sys.stdin.isatty():
        what = "1 process" if len(pids) == 1 else f"{len(pids)} processes"
        raise UsageError(f"refusing to kill {what} without --yes (stdin is not a terminal)")
    answer = input("kill this process? [y/N] " if len(pids) == 1 else f"kill these {len(pids)} processes? [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was signalled")


def cmd_kill(args: argparse.Namespace) -> int:
    from .kill import kill_and_wait

    first = signal.Signals[f"SIG{args.signal.upper().removeprefix('SIG')}"]
    status = StatusLine(sys.stderr, not args.json)
    with _open(args) as gpus:
        pids: list[int] = list(args.pids)
        if args.all_on_gpu:
            snap = gpus.snapshot(args.devices, fields=Fields.PROCESSES)
            snap.raise_for_failures()
            found = sorted({p.pid for d in snap.devices for p in (d.processes or ())} - {os.getpid(), os.getppid()})
            if not found:
                print("no process on the selected GPUs", file=sys.stderr)
            else:
                _confirm(found, snap, args.yes)
            pids.extend(pid for pid in found if pid not in pids)
        if not pids:
            raise UsageError("name at least one PID (or --all-on-gpu)")
        predicate = _predicate(args)
        try:
            result = kill_and_wait(
                gpus,
                pids,
                timeout=args.timeout,
                grace_s=args.grace,
                first_signal=first,
                devices=args.devices,
                predicate=predicate,
                on_poll=_status_updater(status, predicate, time.monotonic()),
            )
        except WaitTimeout as exc:
            status.clear()
            if args.json:
                timeout_doc = _wait_timeout_json(exc) | {"schema": "nvmlcheck/kill", "signal": first.name}
                _print_json(timeout_doc | {"pids": [{"pid": pid} for pid in pids]})
            else:
                print(str(exc), file=sys.stderr)
            return EXIT_NOT_CLEAN
        finally:
            status.clear()
    if args.json:
        _print_json(
            document(
                "kill",
                clean=True,
                signal=result.signal_name,
                pids=[
                    {"pid": t.pid, "killed_ns": t.killed_ns, "exited_ns": t.exited_ns, "off_gpu_ns": t.off_gpu_ns}
                    for t in result.pids
                ],
                clean_ns=result.clean_ns,
                confirmed_ns=result.confirmed_ns,
                resolution_ns=result.resolution_ns,
                snapshot=snapshot_json(result.snapshot),
            )
        )
        return EXIT_CLEAN

    def ms(v: int | None) -> str:
        return "not seen" if v is None else f"+{v / 1e6:.1f} ms"

    for t in result.pids:
        killed = f", SIGKILL {ms(t.killed_ns)}" if t.killed_ns is not None else ""
        print(f"pid {t.pid}: {result.signal_name} +0.0 ms{killed}, exited {ms(t.exited_ns)}, "
              f"off the GPU process list {ms(t.off_gpu_ns)}")
    print(f"clean: memory back {ms(result.clean_ns)} (confirmed {ms(result.confirmed_ns)}, "
          f"resolution {result.resolution_ns / 1e6:.2f} ms)")
    return EXIT_CLEAN


def _sizes(text: str) -> list[int]:
    from .holder import parse_size

    try:
        return [parse_size(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _endings(text: str) -> list[str]:
    from .study import parse_ending

    try:
        return [parse_ending(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size_label(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def _study_holders(args: argparse.Namespace) -> Any:
    from .study import CudaHolderFactory

    if args.simulate is None:
        return CudaHolderFactory(chunks=args.chunks)
    from .simulate import StubHolderFactory

    # _simulation() pointed the stub at this scenario file; the factory adds the holders' pids to it per run.
    return StubHolderFactory(os.environ["NVMLCHECK_STUB_SCENARIO"])


def _study_plots(records: Sequence[Any], directory: str) -> list[str]:
    from .study import median_run, plot_run_trace, plot_time_to_clean

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [str(plot_time_to_clean(records, out / "time-to-clean.png"))]
    for size, ending in dict.fromkeys((r.size_bytes, r.ending) for r in records if not r.warmup):
        run = median_run(records, size, ending)
        if run is not None and run.trace:
            paths.append(str(plot_run_trace(run, out / f"trace-{_size_label(size)}-{ending}.png")))
    return paths


def cmd_study_reclaim(args: argparse.Namespace) -> int:
    from . import study as st

    config = st.StudyConfig(
        sizes=tuple(args.sizes), repeats=args.repeats, endings=tuple(args.endings),
        devices=None if args.devices is None else tuple(args.devices), mode=args.mode, trace=args.trace,
        warmup="per_cell" if args.warmup else "none", run_timeout_s=args.run_timeout,
    )
    if args.plot is not None:  # fail before a long study, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'nvmlcheck[plot]'") from None
    if args.out is not None and not Path(args.out).resolve().parent.is_dir():
        raise UsageError(f"--out {args.out}: its directory does not exist")
    status = StatusLine(sys.stderr, not args.json)

    def progress(p: st.StudyProgress) -> None:
        r = p.record
        clean = r.devices[0].first_clean_ns if r.devices else None
        last = "timed out" if r.timed_out else f"clean after {clean / 1e6:.1f} ms" if clean is not None else "?"
        kind = " warm-up" if r.warmup else ""
        status.update(f"study run {p.done}/{p.total} · {human_bytes(r.size_bytes)} {r.ending}{kind} · {last}")

    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(st.record_writer(args.out)) if args.out is not None else None
        try:
            result = st.run_study(config, session_factory=lambda: _open(args), holder_factory=_study_holders(args),
                                  on_record=sink, progress=progress)
        except st.BaselineNotClean as exc:
            status.clear()
            return _fail(args, exc, EXIT_NOT_CLEAN)
        finally:
            status.clear()
    plots = _study_plots(result.records, args.plot) if args.plot is not None else []
    rows = st.summarize(result.records)
    timed_out = [r for r in result.records if r.timed_out]
    if args.json:
        _print_json(document(
            "study-reclaim",
            complete=not timed_out,
            runs=len(result.records),
            measured_runs=len(result.measured),
            timed_out_runs=[r.run for r in timed_out],
            record_schema={"schema": st.RECORD_SCHEMA, "version": st.RECORD_VERSION},
            out=args.out,
            plots=plots,
            summary=[row.to_json() for row in rows],
            records=[{**r.to_json(), "trace": None} for r in result.records],
        ))
    else:
        first = result.records[0]
        gpus = ", ".join(f"{d.index} ({d.name or '?'})" for d in first.devices)
        simulated = " — SIMULATED (stub libnvidia-ml)" if args.simulate is not None else ""
        print(f"{len(result.measured)} measured runs + {len(result.records) - len(result.measured)} warm-ups on "
              f"GPU {gpus}; backend {first.backend}, driver {first.driver}, {first.mode} polling{simulated}")
        print(st.format_summary(rows))
        for r in timed_out:
            print(f"run {r.run} ({human_bytes(r.size_bytes)} {r.ending}) timed out: {r.timeout_reason}",
                  file=sys.stderr)
        for written in ([args.out] if args.out else []) + plots:
            print(f"wrote {written}")
    return EXIT_NOT_CLEAN if timed_out else EXIT_CLEAN


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(json_output=args.json)


# --- parser ---------------------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    def global_options(p: argparse.ArgumentParser, *, suppress: bool) -> None:
        # Accepted before and after the subcommand; the subcommand's copies default to SUPPRESS so they do not
        # overwrite a value given before it.
        def d(value: object) -> object:
            return argparse.SUPPRESS if suppress else value

        g = p.add_argument_group("global options")
        g.add_argument("--backend", choices=("auto", "nvml", "smi"), default=d("auto"),
                       help="where to read GPUs from (default auto: NVML, else nvidia-smi)")
        g.add_argument("--smi-prefix", metavar="CMD", default=d(None),
                       help='run nvidia-smi behind a command, e.g. "ssh gpu01"')
        g.add_argument("--simulate", metavar="SCENARIO", default=d(None),
                       help="use the bundled stub libnvidia-ml with a named scenario (h200, h200x8, h200-busy) or "
                            "a scenario file: explicit simulation, never chosen automatically")
        g.add_argument("--devices", type=_devices, metavar="LIST", default=d(None),
                       help="GPU indices or UUIDs, comma-separated")
        g.add_argument("--json", action="store_true", default=d(False),
                       help="print one JSON document (versioned schema, docs/cli.md)")

    parser = _Parser(prog="nvmlcheck", description="Tell precisely and fast whether NVIDIA GPUs are clean.",
                     epilog="exit codes: 0 clean/ok, 1 not clean at timeout, 2 usage, "
                                              "3 backend unavailable or failed")
    parser.add_argument("--version", action="version", version=f"nvmlcheck {__version__}")
    global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    snap = sub.add_parser("snapshot", help="show devices (default) or processes")
    global_options(snap, suppress=True)
    snap.add_argument("view", nargs="?", choices=("devices", "procs"), default="devices")
    snap.set_defaults(func=cmd_snapshot)

    def wait_options(p: argparse.ArgumentParser, default_timeout: float) -> None:
        p.add_argument("--timeout", type=_timeout, default=default_timeout,
                       help=f"seconds (default {default_timeout:g}; 0: check once; 'none': forever)")
        p.add_argument("--max-used", type=parse_bytes, default=16 * MIB, metavar="BYTES",
                       help="clean means at most this much used per GPU (default 16MiB)")
        p.add_argument("--stable-polls", type=int, default=2, help="consecutive clean polls required (default 2)")

    wait = sub.add_parser("wait", help="wait until the GPUs are clean (exit 0) or time out (1)")
    global_options(wait, suppress=True)
    wait_options(wait, 30.0)
    wait.add_argument("--pids", type=int, nargs="+", default=[], help="also require these PIDs off every GPU")
    wait.add_argument("--precise", action="store_true", help="tight polling loop (~100 µs resolution, one core)")
    wait.set_defaults(func=cmd_wait)

    kill = sub.add_parser("kill", help="signal PIDs, escalate to SIGKILL, wait until clean")
    global_options(kill, suppress=True)
    kill.add_argument("pids", type=int, nargs="*", metavar="PID")
    wait_options(kill, 30.0)
    kill.add_argument("--grace", type=float, default=5.0, help="seconds before SIGKILL (default 5)")
    kill.add_argument("--signal", default="TERM", help="first signal (default TERM)")
    kill.add_argument("--all-on-gpu", action="store_true",
                      help="also kill every process on the selected GPUs (lists them; needs --yes when not a TTY)")
    kill.add_argument("--yes", action="store_true", help="do not ask for confirmation with --all-on-gpu")
    kill.set_defaults(func=cmd_kill)

    demo = sub.add_parser("demo",
                          help="a simulated H200: a real child holds memory, is killed, and the wait sees the reclaim")
    global_options(demo, suppress=True)
    demo.set_defaults(func=cmd_demo)

    study = sub.add_parser("study", help="measurement studies (reclaim: how fast the driver gives memory back)")
    global_options(study, suppress=True)
    studies = study.add_subparsers(dest="study", required=True, parser_class=_Parser)
    reclaim = studies.add_parser(
        "reclaim", help="time the driver's reclamation of GPU memory after a holder process ends",
        description="Start a process holding memory on each selected GPU, end it, and time when its PID leaves the "
                    "NVML list, when the memory is back, and when waitpid returns. Refuses to start unless the GPUs "
                    "are clean.",
        epilog="exit codes: 0 every run completed, 1 a run timed out or the GPUs were not clean at baseline, "
               "2 usage, 3 backend or holder failure",
    )
    global_options(reclaim, suppress=True)
    reclaim.add_argument("--sizes", type=_sizes, default=[1 << 30, 4 << 30, 16 << 30], metavar="LIST",
                         help="bytes held per GPU, comma-separated (default 1GiB,4GiB,16GiB)")
    reclaim.add_argument("--repeats", type=int, default=5, help="measured runs per size and ending (default 5)")
    reclaim.add_argument("--endings", type=_endings, default=["KILL", "TERM"], metavar="LIST",
                         help="how the holder ends: KILL, TERM, exit, free (comma-separated; default KILL,TERM)")
    reclaim.add_argument("--mode", choices=("precise", "default"), default="precise",
                         help="polling: precise (tight loop, one busy core; default) or default (~1.5 ms)")
    reclaim.add_argument("--out", metavar="FILE.jsonl", default=None,
                         help="write one JSON Lines record per run (schema nvmlcheck/reclaim-run, version 1)")
    reclaim.add_argument("--trace", action="store_true", help="keep the per-poll trace in each record")
    reclaim.add_argument("--plot", metavar="DIR", default=None,
                         help="write PNG plots to DIR (needs matplotlib: pip install 'nvmlcheck[plot]')")
    reclaim.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                         help="one discarded warm-up run before each size and ending (default on)")
    reclaim.add_argument("--run-timeout", type=float, default=30.0, metavar="S",
                         help="seconds from the signal until clean and reaped, else the run times out (default 30)")
    reclaim.add_argument("--chunks", type=int, default=1,
                         help="allocations per holder (python -m nvmlcheck.holder --chunks; default 1)")
    reclaim.set_defaults(func=cmd_study_reclaim)
    return parser


@contextlib.contextmanager
def _simulation(args: argparse.Namespace) -> Iterator[None]:
    if args.simulate is None:
        yield
        return
    from .simulate import scenario_named, simulated

    try:
        scenario = scenario_named(args.simulate)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    with simulated(scenario):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "kill":
        try:
            signal.Signals[f"SIG{args.signal.upper().removeprefix('SIG')}"]
        except KeyError:
            parser.error(f"unknown signal {args.signal!r}")
    if getattr(args, "stable_polls", 1) < 1:
        parser.error("--stable-polls must be at least 1")
    if getattr(args, "repeats", 1) < 1 or getattr(args, "chunks", 1) < 1:
        parser.error("--repeats and --chunks must be at least 1")
    try:
        with _simulation(args):
            code: int = args.func(args)
            return code
    except UsageError as exc:
        return _fail(args, exc, EXIT_USAGE)
    except (ValueError, TypeError) as exc:
        # Bad device selections and the like, raised by the library with a specific message.
        return _fail(args, exc, EXIT_USAGE)
    except NvmlCheckError as exc:
        from .kill import KillError

        return _fail(args, exc, EXIT_USAGE if isinstance(exc, KillError) else EXIT_BACKEND)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, and keep Python from complaining at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLEAN


def _fail(args: argparse.Namespace, exc: BaseException, code: int) -> int:
    if getattr(args, "json", False):
        _print_json(document("error", error=error_json(exc), exit_code=code))
    else:
        label = "unavailable" if isinstance(exc, BackendUnavailable) else "error"
        print(f"nvmlcheck: {label}: {exc}", file=sys.stderr)
    return code
