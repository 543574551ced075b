"""The ``nvmlcheck`` command (also ``python -m nvmlcheck``).

Entry points: :func:`main` (returns the exit code; in-process callers keep the full cleanup) and :func:`script`
(the console script: exits with ``os._exit`` as soon as the verdict is printed). Exit codes are stable:
``EXIT_CLEAN`` 0, ``EXIT_NOT_CLEAN`` 1, ``EXIT_USAGE`` 2, ``EXIT_BACKEND`` 3, ``EXIT_FAULT`` 4 (a fatal GPU event),
128 + the signal's number when ended by SIGHUP, SIGINT or SIGTERM; their meaning per command is in docs/cli.md,
"Exit codes". ``--json`` prints one versioned document on stdout, errors included (docs/cli.md, "JSON documents").
Importing this package loads nothing but ``sys``: each command imports what it uses, so a launch script pays only
for its own command (docs/performance.md, "The command line in a launch script").
"""

from __future__ import annotations

from ._common import EXIT_BACKEND, EXIT_CLEAN, EXIT_FAULT, EXIT_NOT_CLEAN, EXIT_USAGE

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["EXIT_BACKEND", "EXIT_CLEAN", "EXIT_FAULT", "EXIT_NOT_CLEAN", "EXIT_USAGE", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (argument errors included: it does not raise ``SystemExit``)."""
    from ._main import run

    return run(argv)


def script() -> None:
    """The ``nvmlcheck`` command's entry point: :func:`main`, then exit without the interpreter's teardown. A one-shot
    command starts NVML first, in a thread, while the rest is imported (``_common.start_nvml_early``). A command a
    fleet runs over ssh ends when its stdin does (``_proc.signals.hang_up_at_stdin_eof``)."""
    import sys

    from . import _common

    _common.FAST_EXIT = True
    if sys.stdout is None or sys.stderr is None:  # started with >&- or 2>&-: _output makes both usable on import
        from . import _output  # noqa: F401
    _common.start_nvml_early(sys.argv[1:])
    from .._proc.signals import hang_up_at_stdin_eof

    hang_up_at_stdin_eof()  # run by a fleet over ssh (nvmlcheck.hosts): end with it
    code = main()
    _common.verdict_printed(code)
    sys.exit(code)  # where the fast exit is not taken (--simulate cleans up): the same status, never 0 by default


_LAZY = {
    "StatusLine": "_output",
    "human_bytes": "_output",
    "device_table": "_output",
    "process_table": "_output",
    "build_parser": "_parser",
    "UsageError": "_common",
}


def __getattr__(name: str) -> Any:
    # Formatting helpers and the parser stay importable as nvmlcheck.cli.X without loading them at start-up.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nvmlcheck.cli' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
