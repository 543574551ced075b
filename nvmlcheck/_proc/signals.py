"""Signal numbers and names from the C module alone, for the code that runs before a kill's first signal.

``import signal`` builds three enums at import (and imports ``enum``, ``functools`` and ``collections`` for them):
measured, about 5 ms of a kill's launch → signal on an H200 host (docs/performance.md, "Start-up"). Everything
before the first signal (the CLI's handlers, the pinned targets, a signal's fate) works on numbers and names from
``_signal``, the built-in module ``signal`` wraps; the public API (:class:`nvmlcheck.KillPlan`) keeps
``signal.Signals``, which it builds from these numbers after the signal.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # the same functions and constants, as typeshed declares them
else:
    import _signal

__all__ = [
    "SIGCHLD", "SIGCONT", "SIGHUP", "SIGINT", "SIGKILL", "SIGSTOP", "SIGTERM", "SIGURG", "SIGWINCH", "has_pidfd_send",
    "name", "number", "pidfd_send", "set_handler",
]  # fmt: skip

SIGCHLD: int = _signal.SIGCHLD
SIGCONT: int = _signal.SIGCONT
SIGHUP: int = _signal.SIGHUP
SIGINT: int = _signal.SIGINT
SIGKILL: int = _signal.SIGKILL
SIGSTOP: int = _signal.SIGSTOP
SIGTERM: int = _signal.SIGTERM
SIGURG: int = _signal.SIGURG
SIGWINCH: int = _signal.SIGWINCH

_names: dict[int, str] = {}


def _table() -> dict[int, str]:
    # signal.Signals' own rule: every SIG* name of _signal (SIG_DFL/SIG_IGN are not signals), and of aliases
    # (SIGIOT and SIGABRT, SIGPOLL and SIGIO, SIGCLD and SIGCHLD) the alphabetically first is the member's name.
    if not _names:
        for key, value in vars(_signal).items():
            signal_name = key.startswith("SIG") and not key.startswith("SIG_") and isinstance(value, int)
            if signal_name and (value not in _names or key < _names[value]):
                _names[value] = key
    return _names


def has_pidfd_send() -> bool:
    """Whether this Python offers ``pidfd_send_signal`` (Linux 5.1+, Python 3.9+)."""
    return hasattr(_signal, "pidfd_send_signal")


def pidfd_send(fd: int, sig: int) -> None:
    """``signal.pidfd_send_signal(fd, sig)`` (looked up at each call: tests replace it)."""
    _signal.pidfd_send_signal(fd, sig)


def set_handler(sig: int, handler: object) -> object:
    """``signal.signal``: install ``handler`` for ``sig``, return the previous one (ValueError off the main thread)."""
    return _signal.signal(sig, handler)  # type: ignore[arg-type]


def name(number: int) -> str:
    """``signal.Signals(number).name`` (``"SIGTERM"`` for 15); ValueError for a number this system has no signal
    for."""
    found = _table().get(number)
    if found is None:
        raise ValueError(f"{number} is not a valid signal number")
    return found


def number(word: str) -> int:
    """``TERM``, ``SIGTERM``, ``term`` or ``15`` → 15; ValueError for a signal this system does not know."""
    text = word.strip().upper()
    if text.isdigit():
        value = int(text)
        name(value)  # raises for an unknown number
        return value
    wanted = f"SIG{text.removeprefix('SIG')}"
    found: object = getattr(_signal, wanted, None)
    if not isinstance(found, int) or wanted.startswith("SIG_"):
        raise ValueError(f"unknown signal {word!r}")
    return int(found)
