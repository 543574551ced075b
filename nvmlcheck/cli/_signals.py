"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

systemd, ``timeout(1)``, Kubernetes and a closed terminal send SIGTERM or SIGHUP; Python's default for both is to
die on the spot, leaving an nvidia-smi run and its process group alive and the simulation's temporary files behind.
While a command runs, both raise :class:`Terminated` in the main thread instead, so every ``finally`` and context
manager on the way out runs (the smi runner kills its process group, the stub's directory is removed), and the
command exits with 128 + the signal's number. A second signal during that cleanup is ignored.

Python runs a signal handler at the next bytecode of the main thread, which may be a finaliser or a weakref callback
(the import system's module-lock callbacks run during every import): there an exception is only reported to
``sys.unraisablehook``, and the signal would be lost (a SIGTERM to a ``wait --timeout 600`` as it imported a module left
it running for ten minutes). While the block runs, such a lost ``Terminated`` or ``KeyboardInterrupt`` is delivered
again, so it lands in the command's own code.
"""

from __future__ import annotations

import sys

from .._proc import signals

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from types import FrameType, TracebackType
    from typing import Any

HANDLED = (signals.SIGTERM, signals.SIGHUP)  # numbers: the signal module's enums cost start-up


class Terminated(BaseException):
    """The command was asked to end by ``signum`` (a BaseException, like KeyboardInterrupt: nothing swallows it)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"ended by {signals.name(signum)}")


class ending_on_signals:
    """While the block runs, SIGTERM/SIGHUP raise :class:`Terminated`; the previous handlers are restored after.

    Outside the main thread (where Python cannot install handlers) it does nothing.
    """

    def __init__(self) -> None:
        self._previous: dict[int, object] = {}
        self._raised = False
        self._hook: Any = None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._raised:  # already unwinding: let the cleanup finish
            return
        self._raised = True
        raise Terminated(signum)

    def _unraisable(self, unraisable: Any) -> None:
        """An exception Python could only report (raised in a finaliser or a callback): a signal's is delivered
        again, from another thread, so that it is raised once this callback has returned; the rest as before."""
        exc = unraisable.exc_value
        if isinstance(exc, (Terminated, KeyboardInterrupt)):
            import _thread
            import os

            signum = exc.signum if isinstance(exc, Terminated) else signals.SIGINT
            self._raised = False  # it was lost: nothing is unwinding
            _thread.start_new_thread(os.kill, (os.getpid(), signum))
            return
        self._hook(unraisable)

    def __enter__(self) -> None:
        try:
            for sig in HANDLED:
                self._previous[sig] = signals.set_handler(sig, self._handler)
        except ValueError:  # not the main thread
            self.__exit__(None, None, None)
            return
        self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, old in self._previous.items():
            signals.set_handler(sig, old)
        self._previous.clear()
        if self._hook is not None:
            sys.unraisablehook, self._hook = self._hook, None
