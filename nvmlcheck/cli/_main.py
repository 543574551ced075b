"""Parse, dispatch to the command's module (imported on demand), and turn every way out into one exit code.

:func:`run` is what :func:`nvmlcheck.cli.main` calls: it builds the parser for the one command named (``kill``
signals before anything of the GPU side is imported), installs the SIGTERM/SIGHUP handlers (:mod:`._signals`),
runs the command's function from :data:`COMMANDS`, and maps exceptions to exit codes and, under ``--json``, to
``nvmlcheck/error`` documents (:func:`fail`). The path of one ``wait`` through these modules:
docs/architecture.md, "The path of one value"; exit codes: docs/cli.md, "Exit codes".
"""

from __future__ import annotations

import sys

from . import _common
from ._common import (
    EXIT_BACKEND,
    EXIT_FAULT,
    EXIT_SIGNAL_BASE,
    EXIT_USAGE,
    SimulationUnavailable,
    UsageError,
    output_failed,
    reset_verdict,
    simulation,
    verdict,
    verdict_decided,
)
from ._signals import Terminated, ending_on_signals

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

#: command → "module:function" in this package, imported only when that command runs.
COMMANDS = {
    "snapshot": "_snapshot:cmd_snapshot",
    "wait": "_wait:cmd_wait",
    "kill": "_kill:cmd_kill",
    "holders": "_kill:cmd_holders",
    "select": "_select:cmd_select",
    "demo": "_demo:cmd_demo",
    "study": "_study:cmd_study_reclaim",
    "watch": "_watch:cmd_watch",
    "slurm": "_slurm:cmd_slurm",
    "simulate": "_simulate:cmd_simulate",
    "ready": "_ready:cmd_ready",
}


#: command → "module:function" that runs before the simulation and the backend (kill signals first; select checks
#: how many GPUs it was asked for).
EARLY = {"kill": "_kill:signal_first", "select": "_select:count_first"}


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    module, function = COMMANDS[name].split(":")
    handler: Callable[[argparse.Namespace], int] = getattr(_module(module), function)
    return handler


def _module(name: str) -> object:
    """This package's module ``name``, imported now (``__import__``: importlib and its warnings cost start-up)."""
    __import__(f"{__package__}.{name}")
    return sys.modules[f"{__package__}.{name}"]


def _parse(argv: Sequence[str], json_errors: bool) -> argparse.Namespace | int:
    from ._quick import quick_parse

    quick = quick_parse(argv)  # a launch script's plain kill/wait/snapshot/ready: no argparse (docs/performance.md)
    if quick is not None:
        return quick  # type: ignore[return-value]
    from ._parser import GLOBAL_OPTIONS, build_parser, command_in

    only = command_in(argv)
    if json_errors and only == "watch":  # its stdout is JSON Lines: an argument error's document is one line too
        _module("_output").JSON_LINES = True  # type: ignore[attr-defined]
    parser = build_parser(json_errors=json_errors, only=only)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or an argument error (already printed)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if args.command in ("demo", "simulate"):
        # simulate's own scenario may come as --simulate FILE: what the `nvmlcheck` of `simulate run` passes.
        given = [f"--{name.replace('_', '-')}" for name in GLOBAL_OPTIONS
                 if getattr(args, name, None) not in (None, "auto")
                 and not (args.command == "simulate" and name == "simulate")]
        if args.command == "simulate" and args.json:
            # Its output is a scenario file or COMMAND's own: no document (docs/cli.md: one document per --json).
            given.append("--json (give it to the nvmlcheck commands that COMMAND runs)")
        if given:
            what = ("demo runs on the bundled simulated H200 only" if args.command == "demo"
                    else "simulate gives its command the simulation itself (--scenario)")
            try:
                parser.error(f"{what} and takes no {', '.join(given)}")
            except SystemExit as exc:
                return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    return args


def _mark_simulated(argv: Sequence[str], json_mode: bool) -> None:
    """``_output.SIMULATED`` for this run: not an earlier in-process run's, and set at once with ``--simulate``, so
    that a usage error found before the simulation is set up says ``"simulated": true`` too (docs/cli.md)."""
    from ._quick import wants_simulation

    if json_mode and wants_simulation(argv):
        _module("_output").SIMULATED = True  # type: ignore[attr-defined]
        return
    output = sys.modules.get(f"{__package__}._output")
    if output is not None:
        output.SIMULATED = False  # type: ignore[attr-defined]


def run(argv: Sequence[str] | None) -> int:
    """The CLI: parse ``argv``, run the command, return its exit code."""
    from ._quick import wants_json

    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = wants_json(argv)
    reset_verdict()
    _mark_simulated(argv, json_mode)
    parsed: Any = None
    with ending_on_signals():
        try:
            parsed = _parse(argv, json_mode)
            if isinstance(parsed, int):
                return parsed
            early = EARLY.get(parsed.command)
            if early is not None:
                module, function = early.split(":")
                getattr(_module(module), function)(parsed)
            with simulation(parsed):
                return _command(parsed.command)(parsed)
        except UsageError as exc:
            return fail(json_mode, exc, EXIT_USAGE)
        except SimulationUnavailable as exc:
            return fail(json_mode, exc, EXIT_BACKEND)
        except (ValueError, TypeError) as exc:
            # Bad device selections and the like, raised by the library with a specific message.
            return fail(json_mode, exc, EXIT_USAGE)
        except KeyboardInterrupt as exc:
            worded = KeyboardInterrupt("interrupted")
            vars(worded).update(vars(exc))  # what the raise carried (a kill's records of what each target got)
            _signalled_records(parsed, worded, json_mode)
            return fail(json_mode, worded, EXIT_SIGNAL_BASE + 2, label="interrupted")
        except Terminated as exc:
            _signalled_records(parsed, exc, json_mode)
            return fail(json_mode, exc, EXIT_SIGNAL_BASE + exc.signum, label="terminated")
        except BrokenPipeError as exc:
            # Output piped into `head` and the like: the verdict decided before printing stands (never a false 0).
            return output_failed(exc)
        except Exception as exc:
            from ..errors import NvmlCheckError

            if not isinstance(exc, NvmlCheckError):
                if isinstance(exc, OSError) and (verdict_decided() or _disk_full(exc)):
                    # Disk full, EIO on a terminal: as a broken pipe. A full disk before any verdict is the output's
                    # too (a command that prints as it goes, with PYTHONUNBUFFERED=1 as container images set it).
                    return output_failed(exc)
                raise
            from ..errors import GpuFault

            if isinstance(exc, GpuFault):
                return fail(json_mode, exc, EXIT_FAULT, label="fault")
            from ..kill import KillError

            return fail(json_mode, exc, EXIT_USAGE if isinstance(exc, KillError) else EXIT_BACKEND)


def _signalled_records(parsed: Any, exc: BaseException, json_mode: bool) -> None:
    """An interrupt after a kill's first signal that came outside the kill's own report of it (while the stub was
    set up or the GPU side loaded, before the kill's wait began): ``exc`` gets what each target got, as that report
    gives it, so the error document has its ``pids`` (docs/cli.md) and the text says what was sent."""
    found = getattr(parsed, "signalled", None)
    if found is None or hasattr(exc, "_nvmlcheck_kill_pids"):
        return
    from ..kill import KillPlan

    plan = KillPlan(found)
    if plan.started_ns is None:
        return
    try:
        exc._nvmlcheck_kill_pids = plan.targets  # type: ignore[attr-defined]
    except AttributeError:
        return
    if not json_mode:
        print("nvmlcheck: interrupted after the first signal; the targets are left as they are:", file=sys.stderr)
        _print_kill_records(exc)


def _disk_full(exc: OSError) -> bool:
    import errno

    return exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def fail(json_mode: bool, exc: BaseException, code: int, *, label: str | None = None) -> int:
    """Report ``exc`` (a document under ``--json``, a line on stderr otherwise) and return ``code``.

    The error is the command's verdict: a report that cannot be written (stdout or stderr a full disk, a closed pipe)
    is said if it can be and ``code`` stands (docs/cli.md, "Exit codes"), never a traceback and Python's exit 1,
    which would read as "not clean"."""
    verdict(code)
    try:
        _report(json_mode, exc, code, label)
    except OSError as output_error:
        return output_failed(output_error, code)
    return code


def _report(json_mode: bool, exc: BaseException, code: int, label: str | None) -> None:
    if json_mode:
        from ..jsonout import error_document
        from ._output import print_json

        print_json(error_document(exc, code))
    from ..errors import BackendUnavailable

    if label is None:
        label = "unavailable" if isinstance(exc, BackendUnavailable | SimulationUnavailable) else "error"
    if label in ("interrupted", "terminated"):
        print(f"nvmlcheck: {exc}" if label == "terminated" else "interrupted", file=sys.stderr)
    elif not json_mode:
        from ._output import safe_lines  # messages carry names of processes, GPUs and files: escaped

        print(f"nvmlcheck: {label}: {safe_lines(exc)}", file=sys.stderr)
        _print_kill_records(exc)
        # Not on simulated GPUs, which the hint would offer again (the simulation has ended by now: _output's mark
        # stays for the run).
        simulated = _common._simulating or getattr(sys.modules.get(f"{__package__}._output"), "SIMULATED", False)
        if label == "unavailable" and isinstance(exc, BackendUnavailable) and not simulated:
            print("nvmlcheck: no GPU here? `nvmlcheck --simulate h200 COMMAND` runs a command on a simulated H200 "
                  "(the bundled stub libnvidia-ml)", file=sys.stderr)
    sys.stderr.flush()  # a full stderr fails here, where fail() sees it, not in the interpreter's flush at exit


def _print_kill_records(exc: BaseException) -> None:
    """A kill that failed after its first signal: what each target got, and whether it exited."""
    if not hasattr(exc, "_nvmlcheck_kill_pids"):
        return
    from .._text import printable
    from ..kill import kill_records
    from ._output import no_signal_words

    for r in kill_records(exc) or ():
        sent = ", ".join(f"{s.name} +{s.sent_ns / 1e6:.1f} ms" for s in r.signals) or no_signal_words(r.exited_ns)
        exited = "not seen to exit" if r.exited_ns is None else f"exited +{r.exited_ns / 1e6:.1f} ms"
        print(f"  pid {r.pid} ({printable(r.name)}): {sent}, {exited}", file=sys.stderr)
