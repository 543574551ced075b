"""The ``nvmlcheck`` command (also ``python -m nvmlcheck``).

Exit codes (stable):

=======  ==================================================================================================
0        clean / ok
1        not clean when the timeout passed (``wait``, ``kill``: also a target that has not exited);
         ``study reclaim``: a run timed out, or the GPUs were not clean at baseline
2        usage error: bad arguments, a PID that is refused, does not exist or cannot be signalled
3        backend unavailable or failed: no driver, no nvidia-smi, a lost GPU, an NVML or nvidia-smi error; the
         simulated GPU cannot be built; ``watch``: events cannot be had
4        a fatal GPU event (XID 79, 48, 95, ...: docs/events.md) stopped ``wait --events`` / ``kill --events``
129/143  ended by SIGHUP / SIGTERM (children ended, temporary files removed); 130 interrupted (SIGINT, Ctrl-C)
=======  ==================================================================================================

``--json`` prints one document with a versioned schema (:mod:`nvmlcheck.jsonout`, docs/cli.md) on stdout; errors,
argument errors and interruptions are documents too (``"schema": "nvmlcheck/error"``). Importing this package
loads nothing but ``sys``: each command imports what it uses, so a launch script pays only for its own command.
"""

from __future__ import annotations

from ._common import EXIT_BACKEND, EXIT_CLEAN, EXIT_FAULT, EXIT_NOT_CLEAN, EXIT_USAGE

TYPE_CHECKING = False  # typing costs ~10 ms of start-up where site has not loaded it
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["EXIT_BACKEND", "EXIT_CLEAN", "EXIT_FAULT", "EXIT_NOT_CLEAN", "EXIT_USAGE", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (argument errors included: it does not raise ``SystemExit``)."""
    from ._main import run

    return run(argv)


def script() -> None:
    """The ``nvmlcheck`` command's entry point: :func:`main`, then exit without the interpreter's teardown."""
    from . import _common

    _common.FAST_EXIT = True
    _common.verdict_printed(main())


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
