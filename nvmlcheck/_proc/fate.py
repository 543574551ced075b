"""A signal's fate, known before it is sent: whether the kernel will discard it, from ``/proc/PID/status``.

The kernel drops a signal whose disposition is ``SIG_IGN`` (``SigIgn``), a default-ignore signal with no handler
(SIGCHLD, SIGURG, SIGWINCH, SIGCONT), and, for the init of a PID namespace sent from outside it (``NSpid`` has more
than one entry and ends in 1), any signal it has no handler for (``SigCgt``), SIGKILL and SIGSTOP excepted. A kill
whose first signal would be dropped sends SIGKILL at once instead of sitting out the grace period. A blocked signal
(``SigBlk``) is never dropped when sent, whatever else holds: it stays pending (the process may take it with
``sigwait`` or a signalfd, as systemd does as a container's init). A process that sleeps in ``sigtimedwait`` (tini)
is never judged to discard anything: while it waits, the signals it takes are unblocked, and which they are cannot be
read. Rationale and the measurement behind it: docs/killing.md ("A signal's fate").
"""

from __future__ import annotations

from . import procfs, signals

__all__ = ["discarded", "fate_of", "takes_signals_synchronously"]

#: Signals whose default action is to ignore them (signal(7)).
_DEFAULT_IGNORE = frozenset({signals.SIGCHLD, signals.SIGURG, signals.SIGWINCH, signals.SIGCONT})


def _has(mask: int | None, sig: int) -> bool:
    return mask is not None and bool(mask >> (sig - 1) & 1)


def discarded(status: procfs.ProcStatus | None, sig: int) -> str | None:
    """Why the kernel will discard ``sig`` sent to the process whose status is ``status`` from this PID namespace,
    or ``None`` when it will be delivered (or when the status is unknown: then nothing is assumed)."""
    if status is None or sig in (signals.SIGKILL, signals.SIGSTOP) or sig == 0:
        return None
    if _has(status.sig_blk, sig):
        # The kernel never discards a blocked signal when it is sent: it stays pending, and sigwait or a signalfd
        # may take it. tini (docker run --init) runs so: every signal blocked, no handler, sigtimedwait.
        return None
    name = signals.name(sig)
    if _has(status.sig_ign, sig):
        return f"it ignores {name} (SIG_IGN)"
    caught = _has(status.sig_cgt, sig)
    if caught:
        return None
    nspid = status.nspid
    if nspid is not None and len(nspid) > 1 and nspid[-1] == 1:
        return (f"it is PID 1 of its own PID namespace and has no {name} handler: the kernel discards such a signal "
                "sent from outside that namespace")
    if sig in _DEFAULT_IGNORE:
        return f"{name}'s default action is to ignore it and it has no handler"
    return None


def fate_of(pid: int, sig: int) -> str | None:
    """:func:`discarded` for a live process (``None`` as well when its status cannot be read, or when it takes
    signals with ``sigtimedwait``: see :func:`takes_signals_synchronously`)."""
    why = discarded(procfs.read_status(pid), sig)
    if why is not None and takes_signals_synchronously(pid):
        return None
    return why


def takes_signals_synchronously(pid: int) -> bool:
    """Whether ``pid`` (its main thread: the kernel judges a process's signal by it) sleeps in ``sigtimedwait`` or
    ``sigwaitinfo`` (its ``wchan``). Such a process takes its signals without a handler, and while it waits the
    kernel unblocks the ones it waits for, so ``SigBlk`` does not show them: tini (``docker run --init``) runs so, as
    PID 1 of a container. Which signals it waits for cannot be read, so none is taken for discarded: it keeps the
    grace period, at worst, instead of SIGKILL at once for it and its whole container. ``False`` where ``wchan``
    cannot be read."""
    try:
        with open(f"/proc/{pid}/wchan", "rb") as f:
            return f.read().startswith(b"do_sigtimedwait")
    except OSError:
        return False
