"""The ``nvmlcheck`` command (also ``python -m nvmlcheck``).

Entry points: :func:`main` (returns the exit code; in-process callers keep the full cleanup) and :func:`script`
(the console script: starts NVML before it imports the rest, exits with ``os._exit`` as soon as the verdict is
printed). Exit codes are stable: ``EXIT_CLEAN`` 0, ``EXIT_NOT_CLEAN`` 1, ``EXIT_USAGE`` 2, ``EXIT_BACKEND`` 3,
``EXIT_FAULT`` 4 (a fatal GPU event), 128 + the signal's number when ended by SIGHUP, SIGINT or SIGTERM; their
meaning per command is in docs/cli.md, "Exit codes". ``--json`` prints one versioned document on stdout, errors
included (docs/cli.md, "JSON documents"). Importing this package loads nothing: each command imports what it uses,
so a launch script pays only for its own command (docs/performance.md, "The command line in a launch script").
"""

# No `from __future__ import annotations` here, nor in nvmlcheck/__init__.py or _nvml/library.py: the script's
# first imports come before the driver's start, and the __future__ module is one more (~0.2 ms on an H200).
TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ._common import EXIT_BACKEND, EXIT_CLEAN, EXIT_FAULT, EXIT_NOT_CLEAN, EXIT_USAGE

__all__ = ["EXIT_BACKEND", "EXIT_CLEAN", "EXIT_FAULT", "EXIT_NOT_CLEAN", "EXIT_USAGE", "main"]


def main(argv: "Sequence[str] | None" = None) -> int:
    """Run the CLI; returns the exit code (argument errors included: it does not raise ``SystemExit``)."""
    from ._main import run

    return run(argv)


def script() -> None:
    """The ``nvmlcheck`` command's entry point: :func:`main`, then exit without the interpreter's teardown. A one-shot
    command starts NVML first, in a thread, while the rest is imported (:func:`start_nvml_early`)."""
    import sys

    start_nvml_early(sys.argv[1:])
    from . import _common

    _common.FAST_EXIT = True
    _common.verdict_printed(main())


#: The commands that read GPUs once and exit: worth starting NVML before the rest is imported (start_nvml_early).
ONE_SHOT_COMMANDS = ("wait", "snapshot", "ready")
_VALUED = ("--backend", "--smi-prefix", "--simulate", "--devices")
_NOT_EARLY = ("-h", "--help", "--version", "--simulate", "--smi-prefix", "--host", "--hosts", "--hosts-file")


def start_nvml_early(argv: list[str]) -> bool:
    """For the ``nvmlcheck`` script: when ``argv`` is a one-shot command that will read this host's GPUs through
    NVML (``wait``, ``snapshot``, ``ready``; backend ``auto`` or ``nvml``; no ``--simulate``, ``--smi-prefix`` or
    hosts), start loading libnvidia-ml and ``nvmlInit`` in a thread now, and read the handles of the GPUs that
    ``--devices`` names by index (all when it is absent), so the driver's start overlaps Python's imports
    (docs/performance.md, "One-shot checks"). Judged on the words alone, without the parser: a command that turns out
    not to need NVML only leaves an idle thread behind. Here, not in ``_common``, so that nothing but this package
    and the library's loader is imported before the driver starts. Returns whether it started.
    """
    command: str | None = None
    backend = "auto"
    devices: list[int] | None = None
    value_of: str | None = None
    for arg in argv:
        if value_of is not None:
            backend, devices = _note(value_of, arg, backend, devices)
            value_of = None
            continue
        name, eq, value = arg.partition("=")
        if name in _NOT_EARLY or arg == "--":
            return False
        if name in _VALUED:
            if eq:
                backend, devices = _note(name, value, backend, devices)
            else:
                value_of = name
        elif command is None and not arg.startswith("-"):
            command = arg
    if command not in ONE_SHOT_COMMANDS or backend not in ("auto", "nvml"):
        return False
    from .._nvml.library import start_early

    start_early(None, devices, _slow_first_reads(command, argv))
    return True


def _slow_first_reads(command: str, argv: list[str]) -> tuple[str, ...]:
    """What the one-shot will read whose first call is slow on a real driver (the early thread makes it first):
    ready's health; snapshot's table, its current clocks; snapshot's JSON, every reading (cli/_snapshot.py)."""
    if command == "ready":
        return ("health",)
    if command != "snapshot" or "procs" in argv:
        return ()
    return ("health", "current_clocks", "clock_limits") if "--json" in argv else ("current_clocks",)


def _note(name: str, value: str, backend: str, devices: list[int] | None) -> tuple[str, list[int] | None]:
    if name == "--backend":
        return value, devices
    if name == "--devices":
        # Indices only: a UUID or cuda:N needs the session's resolution first, so nothing is read ahead for it.
        return backend, (devices or []) + [int(w) for w in value.split(",") if w.strip().isdigit()]
    return backend, devices


# Resolved on first use (PEP 562): the exit codes' home is _common, which the script imports after the early start.
_LAZY = {
    "EXIT_BACKEND": "_common",
    "EXIT_CLEAN": "_common",
    "EXIT_FAULT": "_common",
    "EXIT_NOT_CLEAN": "_common",
    "EXIT_USAGE": "_common",
    "StatusLine": "_output",
    "human_bytes": "_output",
    "device_table": "_output",
    "process_table": "_output",
    "build_parser": "_parser",
    "UsageError": "_common",
}


def __getattr__(name: str) -> "Any":
    # Formatting helpers and the parser stay importable as nvmlcheck.cli.X without loading them at start-up.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nvmlcheck.cli' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
