"""Why ssh failed, read from its stderr: one reading for both ways nvmlcheck reaches a host over ssh.

A fleet (:mod:`nvmlcheck.hosts`) runs ``ssh HOST nvmlcheck ...``; the smi backend runs ``--smi-prefix "ssh HOST"
nvidia-smi ...``. ssh exits 255 on its own failures, and the same failure must be the same class of error either
way: a connect timeout transient (the host may answer the next call), a refused connection, an unknown name or a
refused login not (asking again gives the same answer). Text in, a word out; no I/O.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from typing import Literal, TypeAlias

    #: ``"auth"``: connected, login refused (or the host key); ``"timeout"``: ssh's connect (or banner exchange)
    #: timed out; ``"unreachable"``: anything else ssh reports (refused, no route, unknown name, connection closed).
    SshFailure: TypeAlias = Literal["auth", "timeout", "unreachable"]

AUTH = ("permission denied", "host key verification failed", "too many authentication failures",
        "no matching host key", "remote host identification has changed")
#: ``Connection timed out`` (Linux), ``Operation timed out`` (BSD, macOS), ``... during banner exchange``; and
#: ``Timeout, server HOST not responding.`` (``ServerAliveInterval``'s keepalives unanswered: a host gone quiet).
TIMEOUT = ("timed out", "timeout, server")
#: What ssh says when it cannot reach the host (or the connection drops): read so that the scan stops at it.
UNREACHABLE = ("connection refused", "no route to host", "could not resolve hostname", "name or service not known",
               "connection closed", "connection reset", "network is unreachable", "kex_exchange_identification")


def ssh_said(err: str) -> tuple[SshFailure, str] | None:
    """:func:`ssh_failure` where a line of ``err`` names a failure ssh reports; ``None`` where none does (a remote
    command's own exit 255 leaves ssh silent; so does ``ssh -q``)."""
    for line in reversed([line.strip() for line in err.splitlines() if line.strip()]):
        low = line.lower()
        if any(k in low for k in AUTH):
            return "auth", line[:200]
        if any(k in low for k in TIMEOUT):
            return "timeout", line[:200]
        if any(k in low for k in UNREACHABLE):
            return "unreachable", line[:200]
    return None


#: How ssh ends a session whose remote command had started: the connection dropped under it.
DROPPED = ("closed by remote host", "connection reset", "broken pipe", "connection closed")


def ssh_dropped(err: str) -> bool:
    """Whether ssh's last line on stderr says the connection dropped (``Connection to gpu01 closed by remote host``,
    ``client_loop: send disconnect: Broken pipe``): the only failure of ssh's own once the remote command has run.
    The last line only: a login banner above it is anyone's text."""
    lines = [line.strip().lower() for line in err.splitlines() if line.strip()]
    return bool(lines) and any(k in lines[-1] for k in DROPPED)


def ssh_failure(err: str) -> tuple[SshFailure, str]:
    """Why ssh failed (its exit 255), and the line that says so (at most 200 characters). ssh's own lines come
    last, so the lines are read from the end and the first that names a failure decides: a login banner (sshd's
    ``Banner``, printed on stderr before the login) or a remote command's output that happens to say "permission
    denied" or "timed out" is above them, and turns neither a dropped connection into a refused login nor a
    refused one into a timeout. Nothing recognised: ``"unreachable"`` with the last line."""
    said = ssh_said(err)
    if said is not None:
        return said
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    return "unreachable", (lines[-1][:200] if lines else "ssh failed")
