"""Signal numbers and names from the C module alone, for the code that runs before a kill's first signal; and
:func:`hang_up_at_stdin_eof`, how a command run by a fleet over ssh ends with its caller.

``import signal`` builds three enums at import (and imports ``enum``, ``functools`` and ``collections`` for them):
measured, about 5 ms of a kill's launch → signal on an H200 host (docs/performance.md, "Start-up"). Everything
before the first signal (the CLI's handlers, the pinned targets, a signal's fate) works on numbers and names from
``_signal``, the built-in module ``signal`` wraps; the public API (:class:`nvmlcheck.KillPlan`) keeps
``signal.Signals``, which it builds from these numbers after the signal.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # the same functions and constants, as typeshed declares them
else:
    import _signal

__all__ = [
    "ENV_END_WITH_STDIN", "RT_SIGNALS", "SIGCHLD", "SIGCONT", "SIGHUP", "SIGINT", "SIGKILL", "SIGSTOP", "SIGTERM",
    "SIGURG",
    "SIGWINCH", "STDIN_HELLO", "STOP_SIGNALS", "get_handler", "hang_up_at_stdin_eof", "has_pidfd_send", "name",
    "number", "pidfd_send", "raise_signal", "set_handler", "stop_refusal",
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
#: The signals that stop a process instead of ending it: never a kill's first signal (the target would stay,
#: stopped, holding its GPU; with ``--grace never`` or an interrupt, for good).
STOP_SIGNALS: frozenset[int] = frozenset((_signal.SIGSTOP, _signal.SIGTSTP, _signal.SIGTTIN, _signal.SIGTTOU))

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


def get_handler(sig: int) -> object:
    """``signal.getsignal``: the handler of ``sig`` (``None`` for one not installed from Python)."""
    return _signal.getsignal(sig)


def raise_signal(sig: int) -> None:
    """``signal.raise_signal``: deliver ``sig`` to this process now (its Python handler runs at once)."""
    _signal.raise_signal(sig)


#: The real-time signals a process may be sent, as the C library numbers them (``SIGRTMIN`` .. ``SIGRTMAX``: 34 .. 64
#: with glibc, which keeps the kernel's first two, 32 and 33, for its threads); empty where the system has none.
RT_SIGNALS: range = (range(_signal.SIGRTMIN, _signal.SIGRTMAX + 1) if hasattr(_signal, "SIGRTMIN")
                     and hasattr(_signal, "SIGRTMAX") else range(0))


def name(number: int) -> str:
    """``signal.Signals(number).name`` (``"SIGTERM"`` for 15), and for a real-time signal between ``SIGRTMIN`` and
    ``SIGRTMAX`` (which ``signal.Signals`` leaves out) ``"SIGRTMIN+N"`` (35: ``"SIGRTMIN+1"`` with glibc);
    ValueError for a number this system has no signal for (0, one the C library keeps for itself)."""
    if isinstance(number, bool) or not isinstance(number, int):
        raise ValueError(f"a signal is a number, not {number!r}")
    found = _table().get(number)
    if found is None and number in RT_SIGNALS:
        return f"SIGRTMIN+{number - RT_SIGNALS.start}"
    if found is None:
        why = (" (reserved by the C library for its threads: not one a process may be sent)"
               if 32 <= number < RT_SIGNALS.start else "")
        raise ValueError(f"{number} is not a valid signal number{why}")
    return found


def number(word: str) -> int:
    """``TERM``, ``SIGTERM``, ``term`` or ``15`` → 15; a real-time signal by number (35), or as ``RTMIN+N``,
    ``SIGRTMIN+N``, ``RTMAX-N``, ``SIGRTMAX-N`` within ``SIGRTMIN`` .. ``SIGRTMAX``; ValueError for a signal this
    system does not know."""
    text = word.strip().upper()
    if text.isascii() and text.isdigit():  # not "²" or "٣"
        value = int(text)
        name(value)  # raises for an unknown number
        return value
    wanted = f"SIG{text.removeprefix('SIG')}"
    for base, sign in (("SIGRTMIN+", 1), ("SIGRTMAX-", -1)):
        offset = wanted.removeprefix(base)
        if offset != wanted and RT_SIGNALS:
            if not (offset.isascii() and offset.isdigit()):
                raise ValueError(f"unknown signal {word!r}: {base}N takes a number N")
            value = (RT_SIGNALS.start if sign > 0 else RT_SIGNALS[-1]) + sign * int(offset)
            if value not in RT_SIGNALS:
                raise ValueError(f"unknown signal {word!r}: the real-time signals here are SIGRTMIN+0 .. "
                                 f"SIGRTMIN+{len(RT_SIGNALS) - 1} ({RT_SIGNALS.start} .. {RT_SIGNALS[-1]})")
            return value
    found: object = getattr(_signal, wanted, None)
    if not isinstance(found, int) or wanted.startswith("SIG_"):
        raise ValueError(f"unknown signal {word!r}")
    return int(found)


def stop_refusal(sig: int) -> str:
    """Why a stop signal is never a kill's first signal."""
    return (f"{name(sig)} stops a process instead of ending it: the target would stay, stopped, holding its GPU "
            "(give TERM, INT, KILL, ...)")


#: Set to ``1`` by a fleet (:mod:`nvmlcheck.hosts`) in the environment of each command it runs over ssh: the command
#: then ends as on SIGHUP when its stdin, which the fleet holds open through ssh, reaches end of file (the fleet was
#: interrupted, killed or gave up on the host, or the connection was cut). Without a terminal sshd sends no SIGHUP.
ENV_END_WITH_STDIN = "NVMLCHECK_END_WITH_STDIN"
#: What the fleet writes first on that stdin: only a stdin that said it is watched to its end (a remote prefix that
#: gives the command an empty stdin of its own must not end it).
STDIN_HELLO = b"nvmlcheck fleet: this command ends with this stream\n"


def hang_up_at_stdin_eof() -> bool:
    """Under ``$NVMLCHECK_END_WITH_STDIN=1`` (removed from the environment: children do not inherit it) with a pipe
    or socket on stdin, read stdin in a daemon thread and, once it began with :data:`STDIN_HELLO`, send this process
    SIGHUP at its end (the CLI ends on it with exit 129, its cleanup done). Anything else on stdin (``/dev/null``, a
    terminal, a file, a stream that ends or says something else first: a remote prefix that does not forward
    stdin) is not watched to its end. Returns whether it reads stdin."""
    if os.environ.pop(ENV_END_WITH_STDIN, None) != "1":
        return False
    import _thread
    import stat

    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False
    _thread.start_new_thread(_hang_up_at_eof, ())
    return True


def _hang_up_at_eof() -> None:
    seen = b""
    try:
        while len(seen) < len(STDIN_HELLO):
            chunk = os.read(0, len(STDIN_HELLO) - len(seen))
            if not chunk:
                return  # ended before it said who holds it: not the fleet's stream
            seen += chunk
        if seen != STDIN_HELLO:
            return
        while os.read(0, 1 << 16):
            pass  # nothing more is written; whatever comes is not ours to read
    except OSError:
        pass  # a reset connection ends it as surely as end of file
    os.kill(os.getpid(), SIGHUP)
