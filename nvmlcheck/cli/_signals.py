"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

systemd, ``timeout(1)``, Kubernetes and a closed terminal send SIGTERM or SIGHUP; Python's default for both is to
die on the spot, leaving an nvidia-smi run and its process group alive and the simulation's temporary files behind.
While a command runs, both raise :class:`Terminated` in the main thread instead, so every ``finally`` and context
manager on the way out runs (the smi runner kills its process group, the stub's directory is removed), and the
command exits with 128 + the signal's number. A second signal during that cleanup is ignored.
"""

from __future__ import annotations

from .._proc import signals

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from types import FrameType, TracebackType

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

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._raised:  # already unwinding: let the cleanup finish
            return
        self._raised = True
        raise Terminated(signum)

    def __enter__(self) -> None:
        try:
            for sig in HANDLED:
                self._previous[sig] = signals.set_handler(sig, self._handler)
        except ValueError:  # not the main thread
            self.__exit__(None, None, None)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, old in self._previous.items():
            signals.set_handler(sig, old)
        self._previous.clear()
