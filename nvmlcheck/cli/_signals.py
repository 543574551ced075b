"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

systemd, ``timeout(1)``, Kubernetes and a closed terminal send SIGTERM or SIGHUP; Python's default for both is to
die on the spot, leaving an nvidia-smi run and its process group alive and the simulation's temporary files behind.
While a command runs, both raise :class:`Terminated` in the main thread instead, so every ``finally`` and context
manager on the way out runs (the smi runner kills its process group, the stub's directory is removed), and the
command exits with 128 + the signal's number. A second signal during that cleanup is ignored.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """The command was asked to end by ``signum`` (a BaseException, like KeyboardInterrupt: nothing swallows it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"ended by {signal.Signals(signum).name}")


@contextlib.contextmanager
def ending_on_signals() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM/SIGHUP raise :class:`Terminated`; restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal raised
        if raised:  # already unwinding: let the cleanup finish
            return
        raised = True
        raise Terminated(signum)

    previous = {sig: signal.signal(sig, handler) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
