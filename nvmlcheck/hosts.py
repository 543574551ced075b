"""Many hosts from one call: run nvmlcheck on each host through the system ``ssh`` client, one verdict for all.

>>> from nvmlcheck.hosts import run_on_hosts
>>> results = run_on_hosts(["root@gpu01", "gpu02:2222"], ["wait", "--timeout", "5"], timeout_s=5.0)  # doctest: +SKIP

Each host runs ``[REMOTE_PREFIX...] env NVMLCHECK_END_WITH_STDIN=1 PYTHON -m nvmlcheck --json COMMAND ARGS...`` over
ssh (an argv list, never a local shell; ``BatchMode=yes``, a ControlMaster per host), in parallel up to ``fanout``,
each with its own deadline; the remote command ends when the stdin the fleet holds open through ssh does.
A host without nvmlcheck is read through its nvidia-smi for ``snapshot`` and ``wait``. A failed host never looks
clean: its verdict is ``"failed"`` with a :class:`HostError`. Entry points: :func:`run_on_hosts`,
:func:`wait_on_hosts`, :func:`snapshot_on_hosts`, :class:`Fleet` (connections reused between calls),
:class:`HostResult`, :func:`overall_exit_code`. What runs where, security and the JSON document: docs/hosts.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import re
import secrets
import shlex
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ._deadline import USED_UP_S
from ._deadline import left_s as _left_of
from ._proc.child import Child
from ._proc.signals import ENV_END_WITH_STDIN, STDIN_HELLO
from ._text import is_digits
from .errors import ArgumentError, NvmlCheckError, StateError
from .predicates import DEFAULT_MAX_USED_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._proc.guard import Guard

__all__ = [
    "COMMANDS",
    "DEFAULT_FANOUT",
    "FallbackContext",
    "Fleet",
    "Host",
    "HostAuthError",
    "HostError",
    "HostResult",
    "HostTimeout",
    "HostUnreachable",
    "NoRemoteNvmlcheck",
    "RemoteError",
    "Verdict",
    "overall_exit_code",
    "parse_hosts",
    "SmiFallback",
    "read_hosts_file",
    "run_on_hosts",
    "snapshot_on_hosts",
    "wait_on_hosts",
]

#: Hosts run at once unless told otherwise.
DEFAULT_FANOUT = 32
#: The nvmlcheck commands that can run on hosts.
COMMANDS = ("snapshot", "wait", "kill", "holders", "ready")
#: Seconds ssh may take to connect (``-o ConnectTimeout``; also bounds the banner exchange) unless told otherwise.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
#: Seconds allowed, beyond the command's own timeout and the connect timeout, for the remote Python to start and
#: answer (an interpreter starts in tens of ms: docs/performance.md; this is generous on purpose: a late answer is
#: still an answer, a hang is not).
START_ALLOWANCE_S = 5.0
#: How long a ControlMaster stays after its last use (seconds): long enough for a poll loop's next call.
CONTROL_PERSIST_S = 60
#: The most kept of a host's stdout, and of its stderr: an nvmlcheck document of 8 GPUs is ~30 KiB; a host printing
#: more (broken, or hostile) fails with "output over N bytes" instead of filling this process's memory.
MAX_OUTPUT_BYTES = 4 << 20
#: The largest ``connect_timeout_s`` (seconds): a day. More is a typo, and would overflow the deadlines built on it.
MAX_CONNECT_TIMEOUT_S = 86_400.0
#: The largest hosts file read (bytes): ~40,000 hosts. ``--hosts-file /dev/zero`` must not read forever.
HOSTS_FILE_MAX_BYTES = 1 << 20
# A deadline further away than this (seconds) is no deadline: its nanoseconds would not fit a float.
_FOREVER_S = 1e9

Verdict = Literal["clean", "not-clean", "failed", "unhealthy"]

#: The environment variable that marks the processes a fleet's nvidia-smi fallback starts, so that stop() finds them.
_MARK = "NVMLCHECK_FLEET"


@dataclass(frozen=True, slots=True)
class FallbackContext:
    """What a fallback gets: ``prefix`` (the ssh command to the host, for the smi backend), ``remaining_s`` (of the
    host's deadline; ``None``: none), ``run_timeout_s`` (the most one nvidia-smi run may take), ``env`` (for its
    children: it marks them, so that :meth:`Fleet.stop` can kill them) and ``stopped()`` (true once the fleet was
    stopped: give up)."""

    prefix: tuple[str, ...]
    remaining_s: float | None
    run_timeout_s: float
    env: dict[str, str]
    stopped: Callable[[], bool]
    #: The fleet's guard process: give it to the runs (``SmiBackend(guard=)``) so that a SIGKILLed fleet leaves no ssh.
    guard: Guard | None = None


#: A fallback for hosts without nvmlcheck: (document, exit code) from a :class:`FallbackContext`.
FallbackFn = Callable[[FallbackContext], tuple[dict[str, Any], int]]

# --- host specs ------------------------------------------------------------------------------------------------------

# A host name or address as ssh takes it: letters, digits, dots, dashes, underscores (aliases from ssh_config too),
# never starting with "-" (ssh would read it as an option). Matched with fullmatch: "$" would let a trailing newline
# through ("root\n@gpu01" reached ssh, and the output, as a user name with a line break).
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
# An IPv6 address (with a zone, fe80::1%eth0), as it goes between brackets.
_IPV6 = re.compile(r"[0-9A-Fa-f:.%A-Za-z]+")


@dataclass(frozen=True, slots=True)
class Host:
    """One host as ``[USER@]HOST[:PORT]``; an IPv6 address goes in brackets (``root@[::1]:2222``).

    ``host`` is the name or address handed to ssh (an alias from the user's ssh config works), ``user`` and
    ``port`` are ``None`` when the ssh config (or ssh's default) decides.
    """

    host: str
    user: str | None = None
    port: int | None = None

    def __post_init__(self) -> None:
        # A Host built directly (from an inventory, not parse()) is held to the same rules: its name goes to ssh as
        # the destination and into every line printed about it (a newline, a space, a leading "-" must not).
        shown = f"Host({self.host!r}, {self.user!r}, {self.port!r})"
        if not isinstance(self.host, str) or not (
                _NAME.fullmatch(self.host) or (":" in self.host and _IPV6.fullmatch(self.host))):
            raise ArgumentError(f"bad host {shown}: {self.host!r} is not a host name or address")
        if self.user is not None and not (isinstance(self.user, str) and _USER.fullmatch(self.user)):
            raise ArgumentError(f"bad host {shown}: bad user {self.user!r}")
        if self.port is not None and (isinstance(self.port, bool) or not isinstance(self.port, int)
                                      or not 1 <= self.port <= 65535):
            raise ArgumentError(f"bad host {shown}: port must be an int 1-65535, got {self.port!r}")

    @classmethod
    def parse(cls, spec: str) -> Host:
        """Parse ``[USER@]HOST[:PORT]``; raises ``ValueError`` naming the spec when it is not one."""
        text = spec.strip()
        user: str | None = None
        if "@" in text:
            user, _, text = text.rpartition("@")
            if not _USER.fullmatch(user):
                raise ArgumentError(f"bad host {spec!r}: bad user {user!r}")
        port_text: str | None = None
        if text.startswith("["):
            addr, bracket, rest = text[1:].partition("]")
            if not bracket or not addr or (rest and not rest.startswith(":")):
                raise ArgumentError(f"bad host {spec!r}: an IPv6 address goes in brackets: [ADDR] or [ADDR]:PORT")
            if not _IPV6.fullmatch(addr) or ":" not in addr:
                raise ArgumentError(f"bad host {spec!r}: {addr!r} is not an IPv6 address")
            host = addr
            port_text = rest[1:] if rest else None
        else:
            if text.count(":") > 1:
                raise ArgumentError(f"bad host {spec!r}: put an IPv6 address in brackets: [{text}]")
            host, colon, port = text.partition(":")
            port_text = port if colon else None
            if not _NAME.fullmatch(host):
                raise ArgumentError(f"bad host {spec!r}: {host!r} is not a host name or address")
        port_number: int | None = None
        if port_text is not None:
            if not is_digits(port_text) or not 1 <= int(port_text) <= 65535:
                raise ArgumentError(f"bad host {spec!r}: port must be 1-65535, got {port_text!r}")
            port_number = int(port_text)
        return cls(host, user, port_number)

    @property
    def destination(self) -> str:
        """What ssh is given as its destination: ``user@host`` or ``host`` (the port goes to ``-p``)."""
        return f"{self.user}@{self.host}" if self.user else self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"{user}{host}{port}"


def _same_name(name: str) -> str:
    """A host name or address in the one form that ssh and the resolver treat alike: without case (ssh lowercases
    it before it reads its config or resolves it), without a trailing dot (``gpu01.`` is the absolute form of the
    name), an IPv6 address compressed (``0:0::1`` is ``::1``)."""
    import ipaddress

    name = name.lower()
    if ":" in name:
        with contextlib.suppress(ValueError):
            return ipaddress.IPv6Address(name).compressed
    return name[:-1] if name.endswith(".") and len(name) > 1 else name


def _same_host_key(host: Host) -> tuple[str | None, str, int | None]:
    """What makes two specs the same host for ssh without asking it: the user, the name in one form
    (:func:`_same_name`), the port. A spec without a user (or a port) is not taken for one with ssh's default
    user (or port 22) here: only ``ssh -G`` knows those (:meth:`Fleet.run`)."""
    return host.user, _same_name(host.host), host.port


#: The most ``ssh -G`` may take (also at most the connect timeout): it reads the configuration only.
SSH_CONFIG_TIMEOUT_S = 5.0


def _ssh_g_key(text: str) -> tuple[str | None, str, int | None] | None:
    """``(user, host name, port)`` from ``ssh -G``'s ``key value`` lines, the name in :func:`_same_name`'s form;
    ``None`` unless all three are there and the port is a number (not ``ssh -G``'s answer)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key in ("user", "hostname", "port") and key not in values:
            values[key] = value.strip()
    if set(values) != {"user", "hostname", "port"} or not values["hostname"] or not is_digits(values["port"]):
        return None
    return values["user"] or None, _same_name(values["hostname"]), int(values["port"])


def parse_hosts(specs: Iterable[str | Host]) -> list[Host]:
    """Hosts from specs (``Host`` objects pass through); duplicates dropped (``GPU01`` is ``gpu01``, ``gpu01.`` is
    ``gpu01``, ``[0::1]`` is ``[::1]``: ssh reaches the same host, and a command must not run twice there at once),
    the first spelling and the order kept. ``ValueError`` on a bad one. Spellings that only ssh's configuration can
    tell apart (``root@gpu01`` and ``gpu01`` where ssh logs in as root) are merged by :meth:`Fleet.run`."""
    hosts = [s if isinstance(s, Host) else Host.parse(s) for s in specs]
    seen: dict[tuple[str | None, str, int | None], Host] = {}
    for host in hosts:
        seen.setdefault(_same_host_key(host), host)
    return list(seen.values())


def read_hosts_file(path: str | os.PathLike[str]) -> list[str]:
    """Host specs from a file: one per line; blank lines and ``#`` comments (whole-line or trailing) ignored.

    A regular file or a pipe (``--hosts-file <(...)``), at most :data:`HOSTS_FILE_MAX_BYTES`, in UTF-8. Raises
    ``OSError`` when it cannot be read, ``ValueError`` naming the file when it is a device or directory, too large,
    or not text."""
    return [spec for _, spec in hosts_file_lines(path)]


def hosts_file_lines(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """:func:`read_hosts_file`'s specs, each with its line number (from 1): an error names the line."""
    import stat

    with open(path, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
            kind = "a directory" if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(
                mode) else "not a regular file"
            raise ArgumentError(f"{os.fspath(path)} is {kind}, not a hosts file")
        data = f.read(HOSTS_FILE_MAX_BYTES + 1)
    if len(data) > HOSTS_FILE_MAX_BYTES:
        raise ArgumentError(f"{os.fspath(path)} is larger than {HOSTS_FILE_MAX_BYTES} bytes: not a hosts file")
    try:
        text = data.decode("utf-8-sig")  # a byte order mark (an editor on Windows) is not part of the first host
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ArgumentError(f"{os.fspath(path)}:{line}: not UTF-8 text") from None
    specs = ((no, line.split("#", 1)[0].strip()) for no, line in enumerate(text.splitlines(), 1))
    return [(no, spec) for no, spec in specs if spec]


# --- errors ----------------------------------------------------------------------------------------------------------


class HostError(NvmlCheckError):
    """A host gave no verdict. ``host`` names it, ``returncode`` is ssh's exit status (``None`` when it was killed),
    ``stderr`` what ssh or the remote side printed (trimmed).

    Each class declares :attr:`~nvmlcheck.NvmlCheckError.TRANSIENT` (``nvmlcheck.wait.is_transient``) as the same
    failure is declared where the smi backend reaches a host through ``--smi-prefix "ssh HOST"``: only
    :class:`HostTimeout` is transient (as :class:`~nvmlcheck.SmiTimeout`: the host or its GPU may answer the next
    call); an unreachable host, a refused login (:class:`~nvmlcheck.SmiTransportError`, ssh's exit 255), the remote
    side's own error or no nvmlcheck there are not. One :meth:`Fleet.run` never retries a host: its deadline is
    spent; a caller that polls hosts may run a transient one again, and never counts any failure as clean."""

    kind = "error"
    TRANSIENT = False  # an internal error, or the fleet was stopped: running it again does not change that

    def __init__(self, host: str, message: str, returncode: int | None = None, stderr: str = "") -> None:
        self.host = host
        self.returncode = returncode
        self.stderr = stderr
        self.message = message
        super().__init__(f"{host}: {message}")


class HostUnreachable(HostError):
    """ssh could not connect: refused, no route, unknown name, connection closed."""

    kind = "unreachable"
    TRANSIENT = False  # as SmiTransportError (ssh's exit 255): a wrong name or a closed port stays so


class HostAuthError(HostError):
    """ssh connected but could not log in (``Permission denied``; BatchMode never prompts), or the host key was
    refused by the user's ssh configuration."""

    kind = "auth"
    TRANSIENT = False  # keys and host keys do not change between two polls


class HostTimeout(HostError, TimeoutError):
    """No answer before the deadline (the ssh process group was killed), or ssh's own connect timeout. Transient,
    as :class:`~nvmlcheck.SmiTimeout` (the same failure through ``--smi-prefix "ssh HOST"``): it says nothing about
    the GPUs, and a loaded host, a wedged nvidia-smi or a lost packet may answer the next call. Still a failed host
    (never clean)."""

    kind = "timeout"
    TRANSIENT = True


class RemoteError(HostError):
    """The remote side ran but gave no usable verdict: nvmlcheck's own error document (no driver, lost GPU, usage),
    an unexpected exit, or output that is not an nvmlcheck document. ``document`` holds the remote document if any."""

    kind = "remote"
    TRANSIENT = False  # what the remote side answered: asked again, it answers the same (its own waits retried)

    def __init__(self, host: str, message: str, returncode: int | None = None, stderr: str = "",
                 document: dict[str, Any] | None = None) -> None:
        super().__init__(host, message, returncode, stderr)
        self.document = document


class NoRemoteNvmlcheck(HostError):
    """The remote Python has no nvmlcheck (or the remote Python is missing), and the command cannot fall back to
    nvidia-smi (``kill``, ``holders``), or the fallback was turned off."""

    kind = "no-nvmlcheck"
    TRANSIENT = False  # nothing installs it between two polls


# --- results ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HostResult:
    """One host's answer.

    ``document``: the nvmlcheck JSON document the host produced (``None`` when it failed before one). ``exit_code``:
    the remote nvmlcheck's exit status (the fallback's equivalent; ``None`` when none ran). ``error``: why the host
    gave no verdict. ``via``: ``"nvmlcheck"``, or ``"nvidia-smi"`` when the host had no nvmlcheck and was read
    through its nvidia-smi; ``note`` says so in words. ``elapsed_ns``: from start to answer, on this machine.
    """

    host: Host
    document: dict[str, Any] | None
    exit_code: int | None
    error: HostError | None = None
    via: Literal["nvmlcheck", "nvidia-smi"] = "nvmlcheck"
    note: str | None = None
    elapsed_ns: int = 0

    @property
    def verdict(self) -> Verdict:
        """``"clean"`` (exit 0 with a document: clean, or the command succeeded), ``"not-clean"`` (exit 1 with a
        document: not clean at the timeout), ``"unhealthy"`` (``ready``'s exit 5 with its document: a GPU needs an
        operator) or ``"failed"`` (anything else: a failed host never looks clean)."""
        if self.error is not None or self.document is None:
            return "failed"
        if self.exit_code == 0:
            return "clean"
        if self.exit_code == 1:
            return "not-clean"
        if self.exit_code == _EXIT_UNHEALTHY and self.document.get("schema") == "nvmlcheck/ready":
            return "unhealthy"
        return "failed"


#: The documents each command a fleet runs answers with: any other is no answer to it.
_ANSWERS = {"wait": ("wait",), "ready": ("ready",), "snapshot": ("snapshot",), "holders": ("holders",),
            "kill": ("kill", "kill-plan")}


#: The verdict each document carries, where it has one (``True`` exactly at exit 0), and the lists its lines are read
#: from: a document without them was not read whole (a hand-made or broken one), and never stands for a verdict.
_VERDICT_FIELDS = {"wait": "clean", "kill": "clean", "ready": "ready"}
_LIST_FIELDS = {"snapshot": ("devices",), "holders": ("holders",), "kill-plan": ("targets",)}


def _unreadable_answer(command: Sequence[str], document: dict[str, Any], rc: int | None) -> str | None:
    """Why a host's document cannot stand for its verdict (``None``: it can): a schema that answers another command,
    a version this nvmlcheck does not read (a change of meaning bumps it), a verdict that contradicts the exit
    status (``clean``/``ready`` not ``True`` at exit 0 or ``true`` at another, or another ``exit_code``), or one
    missing (no ``clean``/``ready``, no list of ``devices``/``holders``/``targets``: not a whole answer). The exit
    status alone never makes a host clean: a version-skewed, broken or hostile host is failed."""
    from .jsonout._values import SCHEMA_VERSION, SCHEMA_VERSIONS

    schema = str(document.get("schema"))
    kind = schema.removeprefix("nvmlcheck/")
    expected = _ANSWERS.get(command[0] if command else "")
    if expected is not None and kind not in expected:
        return f"answered {command[0]} with a {schema} document (expected {', '.join(expected)})"
    known = SCHEMA_VERSIONS.get(kind, SCHEMA_VERSION)
    if document.get("version") != known:
        return (f"its {schema} document is version {document.get('version')!r}; this nvmlcheck reads version {known} "
                "(install the same release on both)")
    verdict = _VERDICT_FIELDS.get(kind)
    if verdict is not None:
        # Read whole, the document says its verdict: True exactly at exit 0. Missing (a partial or hand-made
        # document, a release that names it otherwise) or not a boolean, the exit status would decide alone.
        if verdict not in document:
            return f"exit {rc} with no {verdict!r} in its {schema} document: not a whole answer, not trusted"
        if document[verdict] is not (rc == 0):
            return f"exit {rc} with {verdict}: {document[verdict]!r} in its document: contradictory, not trusted"
    for name in _LIST_FIELDS.get(kind, ()):
        if not isinstance(document.get(name), list):
            return (f"its {schema} document has no {name!r} list (got {type(document.get(name)).__name__}): not a "
                    "whole answer, not trusted")
    if "exit_code" in document and document["exit_code"] != rc:
        return f"exit {rc} with exit_code {document['exit_code']!r} in its document: contradictory, not trusted"
    return None


#: ``ready``'s exit status for a GPU that needs an operator (cli/_common.EXIT_UNHEALTHY; docs/ready.md).
_EXIT_UNHEALTHY = 5
#: The exit statuses that are each command's verdicts (docs/cli.md): any other, even with a document, is a failure.
_VERDICT_EXITS = {"wait": (0, 1), "kill": (0, 1), "ready": (0, 1, _EXIT_UNHEALTHY), "snapshot": (0,), "holders": (0,)}


def overall_exit_code(results: Iterable[HostResult]) -> int:
    """One verdict: 3 if any host failed, else 5 if any needs an operator (``ready``), else 1 if any was not clean,
    else 0. No results is no verdict: :class:`~nvmlcheck.ArgumentError` (nothing was checked, so nothing is clean)."""
    verdicts = {r.verdict for r in results}
    if not verdicts:
        raise ArgumentError("overall_exit_code: no host results: nothing was checked, so nothing can be called clean")
    if "failed" in verdicts or not verdicts <= {"clean", "not-clean", "unhealthy"}:
        return 3
    if "unhealthy" in verdicts:
        return _EXIT_UNHEALTHY
    if "not-clean" in verdicts:
        return 1
    return 0


# --- running ---------------------------------------------------------------------------------------------------------

_NO_MODULE = re.compile(r"No module named '?nvmlcheck'?")
_STDERR_KEEP = 2000
#: Seconds to keep reading after the ssh we started exited (a ControlMaster may still hold copies of its pipes).
_PIPE_GRACE_S = 1.0
#: Seconds ``ssh -O exit`` may take to end a ControlMaster before it is killed.
_EXIT_WAIT_S = 5.0


def _trim(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _STDERR_KEEP else "..." + text[-_STDERR_KEEP:]


# Where a document may begin: a line that opens an object whose first key is an nvmlcheck schema (as the remote
# nvmlcheck prints it, indented or on one line).
_DOCUMENT_START = re.compile(r'^[ \t]*(\{)\s*"schema"\s*:\s*"nvmlcheck/', re.MULTILINE)
_MAX_DOCUMENT_STARTS = 16


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0].strip()[:200] if lines else ""


def _documents_in(out: str) -> tuple[list[dict[str, Any]], int, str | None]:
    """The nvmlcheck documents in a host's stdout, each beginning a line (a login banner, a ``.bashrc`` that
    echoes, a logout message may surround the one the remote nvmlcheck printed), how many other characters there
    were (whitespace aside), and the first line of a document begun but cut short (``None``: none was)."""
    decoder = json.JSONDecoder()
    documents: list[dict[str, Any]] = []
    other = 0
    pos = 0
    tried = 0
    cut: str | None = None
    for match in _DOCUMENT_START.finditer(out):
        start = match.start(1)
        if start < pos:
            continue  # inside a document already read
        tried += 1
        if tried > _MAX_DOCUMENT_STARTS:  # a hostile host must not make this quadratic: not an answer
            return [], len(out.strip()), None
        try:
            parsed, end = decoder.raw_decode(out, start)
        except (ValueError, RecursionError):
            cut = cut if cut is not None else _first_line(out[start:])
            continue
        if isinstance(parsed, dict) and str(parsed.get("schema", "")).startswith("nvmlcheck/"):
            other += len(out[pos:start].strip())
            documents.append(parsed)
            pos = end
    other += len(out[pos:].strip())
    return documents, other, cut


def _failed_answer(name: str, command: Sequence[str], document: dict[str, Any], rc: int | None,
                   stderr: str) -> RemoteError | None:
    """Why a document and exit status are no verdict of ``command`` (``None``: they are one): the host's own
    error document, a document that cannot stand for the status (:func:`_unreadable_answer`), or a status that
    is none of the command's verdicts. The same test for the remote nvmlcheck's answer and a fallback's."""
    if document.get("schema") == "nvmlcheck/error":
        error = document.get("error") or {}
        message = f"{error.get('type', 'error')}: {error.get('message', '?')}"
        return RemoteError(name, message, rc, stderr, document)
    problem = _unreadable_answer(command, document, rc)
    if problem is not None:
        return RemoteError(name, problem, rc, stderr, document)
    verdicts = _VERDICT_EXITS.get(command[0] if command else "", (0, 1, _EXIT_UNHEALTHY))
    if rc not in verdicts:
        # Not one of the command's verdicts (snapshot's 3: a GPU it could not read, 4: a fatal XID): failed,
        # with the reason, never a verdict without one (and a snapshot's exit 1 is not "not clean").
        return RemoteError(name, f"exit {rc} with its {document.get('schema')} document"
                           f"{_why_not_answered(document)}", rc, stderr, document)
    return None


def _why_not_answered(document: dict[str, Any]) -> str:
    """``": GPU 1: ..."``: the first failure a document lists, if any."""
    failures = document.get("failures")
    if not isinstance(failures, list):
        failures = document.get("snapshot", {}).get("failures") if isinstance(document.get("snapshot"), dict) else None
    if isinstance(failures, list) and failures and isinstance(failures[0], dict):
        error = failures[0].get("error")
        message = error.get("message") if isinstance(error, dict) else None
        return f": GPU {failures[0].get('index')!s}: {message!s}"[:500]
    inner = document.get("snapshot")
    snapshot: dict[str, Any] = inner if isinstance(inner, dict) else document
    if snapshot.get("devices") == []:  # the nvidia-smi fallback's snapshot of a host where it found no GPU
        return ": no GPU in it"
    return ""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _words(name: str, value: Sequence[str] | str) -> tuple[str, ...]:
    """A string split like a shell (``ValueError`` naming ``name`` when it cannot be), or the words as given."""
    if not isinstance(value, str):
        return tuple(value)
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise ArgumentError(f"{name} {value!r} cannot be split like a shell: {exc}") from None


def _deadline_for(timeout_s: float | None, connect_timeout_s: float) -> float | None:
    return None if timeout_s is None else timeout_s + connect_timeout_s + START_ALLOWANCE_S


def _with_timeout(command: Sequence[str], timeout_s: float, left_s: float) -> list[str] | None:
    """``command`` with its ``--timeout`` (of ``timeout_s``, before any ``--``) made ``left_s``; ``None`` when it has
    none of that value (the call's timeout is then not the command's: left alone)."""
    words = list(command)
    for i, word in enumerate(words):
        if word == "--":
            break
        value, at = (words[i + 1], i + 1) if word == "--timeout" and i + 1 < len(words) else (
            (word.partition("=")[2], i) if word.startswith("--timeout=") else (None, i))
        if value is None:
            continue
        try:
            same = float(value) == float(timeout_s)
        except ValueError:
            return None
        if not same:
            return None
        words[at] = repr(float(left_s)) if at == i + 1 else f"--timeout={float(left_s)!r}"
        return words
    return None


_CONTROL_PREFIX = "nvmlcheck-ssh-"


def _start_ticks(pid: int) -> int | None:
    from ._proc.procfs import read_stat

    st = read_stat(pid)
    return None if st is None else st.start_ticks


def _self_identity() -> str:
    """``PID-START``: names this process for the life of the system (a later fleet's sweep checks it)."""
    return f"{os.getpid()}-{_start_ticks(os.getpid()) or 0}"


def _sweep_stale_control_dirs(ssh: str, ssh_options: Sequence[str]) -> None:
    """Remove the ControlMaster directories of this user's fleets whose process is gone (killed before its close
    and its guard), ending any master still listening there. Directories without an owner in their name (older
    versions) and every other user's are left alone."""
    base = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(base) if n.startswith(_CONTROL_PREFIX)]
    except OSError:
        return
    for name in names:
        owner, _, start = name[len(_CONTROL_PREFIX):].partition("-")
        start = start.partition("-")[0]
        if not (is_digits(owner) and is_digits(start)):
            continue
        path = os.path.join(base, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        import stat as stat_module

        if not stat_module.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if _start_ticks(int(owner)) == int(start):
            continue  # its fleet's process still runs
        from ._proc import guard

        guard.end_masters([ssh, *ssh_options], path)


class _Workers:
    """The worker threads of one :meth:`Fleet.run`: each takes hosts until none is left (or the call is over) and
    answers each with ``answer``; the caller's thread collects the results and waits for the workers' end."""

    def __init__(self, targets: Sequence[Host], answer: Callable[[Host], HostResult]) -> None:
        self.targets = targets
        self.answer = answer
        self.results: dict[int, HostResult] = {}
        self.todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(len(targets)):
            self.todo.put(i)
        self.finished = threading.Condition()
        # Workers running and whether the call is over (a worker that begins after that takes no host), both under
        # ``finished``: the end is waited for with them, never Thread.join (see await_end).
        self.busy = 0
        self.over = False

    def work(self) -> None:
        """A worker thread's body."""
        with self.finished:
            if self.over:
                return
            self.busy += 1
        try:
            while True:
                with self.finished:
                    if self.over:
                        return
                try:
                    i = self.todo.get_nowait()
                except queue.Empty:
                    return
                host = self.targets[i]
                try:
                    result = self.answer(host)
                except BaseException as exc:
                    # A bug must not look like a clean host, nor leave the caller waiting for a result that never
                    # comes: not even a caller's fallback raising SystemExit (no signal's exception reaches a thread).
                    result = HostResult(host, None, None, HostError(str(host), f"internal error: {exc!r}"))
                with self.finished:
                    self.results[i] = result
                    self.finished.notify_all()
        finally:
            with self.finished:
                self.busy -= 1
                self.finished.notify_all()

    def results_when_done(
        self, on_progress: Callable[[Sequence[Host], Sequence[HostResult]], object] | None
    ) -> dict[int, HostResult]:
        """Wait (in the caller's thread) until every host has its result, reporting progress about 10 times a
        second."""
        finished, results, targets = self.finished, self.results, self.targets
        with finished:
            while len(results) < len(targets):
                # A bounded wait, so signals reach the caller's thread promptly and progress is reported.
                finished.wait(0.1)
                if on_progress is not None:
                    done = [results[i] for i in sorted(results)]
                    pending = [targets[i] for i in range(len(targets)) if i not in results]
                    finished.release()
                    try:
                        on_progress(pending, done)
                    finally:
                        finished.acquire()
        return results

    def await_end(self, stop: Callable[[], object] | None) -> None:
        """End the call and wait until no worker runs. Not ``Thread.join``: one cut by an exception can mark a
        running thread stopped (Python 3.11, bpo-45274's handling), and run() would return while a worker still
        runs, free to start an nvidia-smi over ssh after the fleet's last stop. ``stop``: after an interruption,
        called each slice (a fallback may have started a run since the last); a further Ctrl-C or SIGTERM here is
        held until every worker has ended (they do within a slice or a reaping once stopped), then raised."""
        late: BaseException | None = None
        while True:
            try:
                with self.finished:
                    self.over = True
                    if self.busy == 0:
                        break
                    self.finished.wait(0.05)
                if stop is not None:
                    stop()
            except BaseException as exc:  # a second interruption: the workers are still waited for
                late = exc
                if stop is not None:
                    stop()
        if late is not None:
            raise late


class Fleet:
    """Runs nvmlcheck commands on hosts; owns the ssh ControlMaster sockets (a private temporary directory).

    Use it as a context manager (or call :meth:`close`) when calling :meth:`run` repeatedly, so the connections
    are reused between calls and the masters are ended at the end. ``ssh``: the ssh program; ``ssh_options``: extra
    words put right after it (a string is split with shlex; the CLI's ``--ssh-options``; no environment variable is
    read); ``remote_python``: the interpreter on the hosts (default ``python3``); ``remote_prefix``: words the remote
    command runs behind, e.g. ``"pct exec 129 --"`` (a string is split with shlex); ``connect_timeout_s``: ssh's
    ConnectTimeout (at most :data:`MAX_CONNECT_TIMEOUT_S`); ``fanout``: hosts at once; ``control_master``: reuse
    connections (default on); ``max_output_bytes``: the most kept of each host's stdout and stderr (past it the host
    fails: :data:`MAX_OUTPUT_BYTES`).

    Should this process die without :meth:`close` (SIGKILL, the OOM killer), a guard process it started kills the
    ssh clients still running, ends the ControlMasters and removes their directory; a later fleet also removes the
    socket directories of fleets whose process is gone.
    """

    def __init__(
        self,
        *,
        ssh: str = "ssh",
        ssh_options: Sequence[str] | str | None = None,
        remote_python: str = "python3",
        remote_prefix: Sequence[str] | str = (),
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        fanout: int = DEFAULT_FANOUT,
        control_master: bool = True,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> None:
        if fanout < 1:
            raise ArgumentError(f"fanout must be at least 1, got {fanout}")
        if not 0 < connect_timeout_s <= MAX_CONNECT_TIMEOUT_S:
            raise ArgumentError(f"connect_timeout_s must be > 0 and at most {MAX_CONNECT_TIMEOUT_S:g} s, "
                             f"got {connect_timeout_s}")
        if not remote_python.strip():
            raise ArgumentError("remote_python must not be empty")
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) or max_output_bytes < 1:
            raise ArgumentError(f"max_output_bytes must be an int >= 1, got {max_output_bytes!r}")
        self.ssh = ssh
        self.ssh_options = _words("ssh_options", ssh_options or ())
        self.max_output_bytes = max_output_bytes
        self.remote_python = remote_python
        _words("remote_python", remote_python)  # checked here, split where used
        self.remote_prefix = _words("remote_prefix", remote_prefix)
        self.connect_timeout_s = connect_timeout_s
        self.fanout = fanout
        self._control_dir: str | None = None
        self._control_master = control_master
        self._used: set[Host] = set()
        self._lock = threading.Lock()
        self._running: set[Child] = set()
        self._closed = False
        self._token = secrets.token_hex(8)
        from ._proc.guard import Guard

        # Kills the ssh clients, ends the masters and removes their directory should this process die first.
        self._guard = Guard([self.ssh, *self.ssh_options])
        self._guarded_dir: str | None = None

    # -- argv ---------------------------------------------------------------------------------------------------------

    def _control_path(self, host: Host) -> str | None:
        if not self._control_master:
            return None
        with self._lock:
            if self._control_dir is None:
                _sweep_stale_control_dirs(self.ssh, self.ssh_options)
                # mkdtemp makes it 0700: nobody else can reach the sockets (a ControlMaster socket is a logged-in
                # session). Short names: a Unix socket path is limited to ~108 bytes and ssh appends ~17 while
                # creating it. The name says whose it is (PID and start time), for the sweep of a later fleet.
                self._control_dir = tempfile.mkdtemp(prefix=f"{_CONTROL_PREFIX}{_self_identity()}-")
            self._used.add(host)
            directory = self._control_dir
        return os.path.join(directory, hashlib.sha1(str(host).encode()).hexdigest()[:12])

    def ssh_argv(self, host: Host) -> list[str]:
        """The ssh command up to and including the destination (what a remote command is appended to)."""
        argv = [self.ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(self.connect_timeout_s))}"]
        control = self._control_path(host)
        if control is not None:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control}",
                     "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        argv += self.ssh_options
        if host.port is not None:
            argv += ["-p", str(host.port)]
        # "--": the destination can never be read as an option (Host.parse refuses a leading "-" as well).
        return [*argv, "--", host.destination]

    def remote_argv(self, command: Sequence[str]) -> list[str]:
        """The words run on the host: the prefix, ``env NVMLCHECK_END_WITH_STDIN=1`` (the command ends when the
        stdin this fleet holds open through ssh does: :func:`~nvmlcheck._proc.signals.hang_up_at_stdin_eof`), the
        interpreter, ``-m nvmlcheck --json`` and the command."""
        return [*self.remote_prefix, "env", f"{ENV_END_WITH_STDIN}=1", *shlex.split(self.remote_python), "-m",
                "nvmlcheck", "--json", *command]

    def argv(self, host: Host, command: Sequence[str]) -> list[str]:
        """The full local argv for ``command`` on ``host``: ssh's words, then the remote command as one string
        quoted with :func:`shlex.join` (ssh joins its arguments with spaces for the remote shell; one pre-quoted
        word keeps every remote word intact, whatever it contains)."""
        return [*self.ssh_argv(host), shlex.join(self.remote_argv(command))]

    def smi_prefix(self, host: Host) -> list[str]:
        """The prefix for the smi backend's fallback: ssh to ``host`` and the remote prefix, each remote word
        quoted for the remote shell (the smi runner quotes the nvidia-smi words after it)."""
        return [*self.ssh_argv(host), *(shlex.quote(w) for w in self.remote_prefix)]

    # -- one host -----------------------------------------------------------------------------------------------------

    def _spawn(self, argv: Sequence[str]) -> Child:
        # A new session per ssh: the deadline and the caller's interruption kill its whole process group (ssh, a
        # ProxyCommand, ...) with one killpg. A ControlPersist master daemonises into its own session and is ended
        # by close() with "ssh -O exit".
        with self._lock:
            if self._closed:
                raise StateError("this Fleet was stopped")
            if self._control_dir is not None and self._control_dir != self._guarded_dir:
                self._guard.directory(self._control_dir)
                self._guarded_dir = self._control_dir
            # stdin held open: its end (this call giving up, this process dying) ends the remote command too. The
            # guard is told of the child at its start (ssh runs only once it knows it) and forgets it at its reaping.
            child = Child(argv, after_exit_s=_PIPE_GRACE_S, max_output_bytes=self.max_output_bytes,
                          hold_stdin=STDIN_HELLO, guard=self._guard)
            self._running.add(child)
        return child

    def _finish(self, child: Child, deadline: float | None) -> tuple[int | None, str, str]:
        """Read its output until it exits, killing its group at ``deadline`` (monotonic) or when the fleet is
        stopped; returns (returncode, or None when killed or ended by a signal, stdout, stderr).

        Not ``communicate()``: with ControlMaster the master process holds copies of our pipes (the mux client
        passes them over its socket), so the pipes may not reach end-of-file when the ssh we started dies. The
        child (started with ``after_exit_s``) stops reading :data:`_PIPE_GRACE_S` after it exited.
        """
        answered = False
        try:
            # stop() is checked at least every slice (50 ms); it also signals the group itself.
            answered = child.wait(None if deadline is None else round(deadline * 1e9), should_stop=self._stopped)
        finally:
            if not answered:
                # Killed: its answer is dropped anyway, so stop at the exit rather than wait for the master's copies.
                child.kill(read_after_exit=False)
            child.close()
            with self._lock:
                self._running.discard(child)
        rc = child.returncode
        if not answered or rc is None or rc < 0:  # killed here, or by a signal: no answer
            rc = None
        return rc, child.stdout.decode("utf-8", "replace"), child.stderr.decode("utf-8", "replace")

    def _stopped(self) -> bool:
        return self._closed

    @staticmethod
    def _classify(host: Host, rc: int | None, out: str, err: str, waited_s: float, *,
                  command: Sequence[str] = ()) -> HostResult | HostError:
        name = str(host)
        if rc is None:
            return HostTimeout(name, f"no answer within {waited_s:.1f} s (ssh killed)", None, _trim(err))
        documents, noise, cut = _documents_in(out)
        if len(documents) > 1:
            return RemoteError(name, f"{len(documents)} nvmlcheck documents in one answer: not trusted", rc, _trim(err))
        if documents and cut is not None:
            # A whole document beside one cut short (a partial line): the answer was not read whole, whichever of
            # the two was meant; the cut one is not a banner's noise.
            return RemoteError(name, f"an nvmlcheck document cut short beside its answer ({cut[:80]}): not trusted",
                               rc, _trim(err))
        document = documents[0] if documents else None
        if document is None:
            if _NO_MODULE.search(err) or (rc == 127 and "not found" in err.lower()):
                return NoRemoteNvmlcheck(name, f"no nvmlcheck there ({_last_line(err)})", rc, _trim(err))
            if rc == 255 and out.strip():
                from .backends._smi.ssh import ssh_dropped, ssh_said

                if ssh_said(err) is None and not ssh_dropped(err):
                    # Only the remote side writes ssh's stdout: it ran, and exit 255 is its own (ssh is silent
                    # then). It read "unreachable" with the remote's last line, of a host that was reached.
                    return RemoteError(name, "exit 255 (the remote command's own: it printed on stdout) without an "
                                       f"nvmlcheck document: {_last_line(err) or _first_line(out)}", rc, _trim(err))
            if rc == 255:
                # Read as the smi backend reads the same failure through --smi-prefix "ssh HOST" (one reading,
                # so one class: a connect timeout transient, a refused connection or login not).
                from .backends._smi.ssh import ssh_failure

                kind, line = ssh_failure(err)
                if kind == "auth":
                    return HostAuthError(name, line, rc, _trim(err))
                if kind == "timeout":
                    return HostTimeout(name, line, rc, _trim(err))
                return HostUnreachable(name, line, rc, _trim(err))
            return RemoteError(name, f"exit {rc} without an nvmlcheck document: {_last_line(err) or _first_line(out)}",
                               rc, _trim(err))
        failed = _failed_answer(name, command, document, rc, _trim(err))
        if failed is not None:
            return failed
        note = None
        if noise:
            note = (f"{noise} characters besides the document on its stdout (a login banner or shell start-up noise?): "
                    "ignored")
        return HostResult(host, document, rc, note=note)

    def _fallback(self, host: Host, deadline: float | None, fallback: FallbackFn,
                  cause: HostError, command: Sequence[str] = ()) -> HostResult | HostError:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        context = FallbackContext(tuple(self.smi_prefix(host)), remaining,
                                  self.connect_timeout_s + START_ALLOWANCE_S, {**os.environ, _MARK: self._token},
                                  lambda: self._closed, self._guard)
        try:
            document, code = fallback(context)
        except _Stopped:
            return HostError(str(host), "stopped", None, cause.stderr)
        except NvmlCheckError as exc:
            if self._closed:
                return HostError(str(host), "stopped", None, cause.stderr)
            from .errors import SmiTimeout, SmiTransportTimeout

            # Opening the backend wraps a run's timeout in BackendUnavailable, its cause: the same no-answer.
            if isinstance(exc, SmiTimeout | SmiTransportTimeout) or isinstance(exc.__cause__,
                                                                                SmiTimeout | SmiTransportTimeout):
                # The host did not answer in time (or ssh's connect timed out), as a HostTimeout says (transient).
                return HostTimeout(str(host), f"no nvmlcheck there, and its nvidia-smi did not answer in time: {exc}",
                                   None, cause.stderr)
            return RemoteError(str(host), f"no nvmlcheck there, and its nvidia-smi failed: {exc}", None,
                               cause.stderr)
        why = _last_line(cause.stderr) or cause.message
        note = f"no nvmlcheck on the host ({why}): read through its nvidia-smi over ssh"
        if not isinstance(document, dict):
            return RemoteError(str(host), "no nvmlcheck there, and its nvidia-smi fallback gave no document "
                               f"({document!r:.80})", code, cause.stderr)
        # Held to the remote nvmlcheck's rules: snapshot's 3 through nvidia-smi (a GPU it could not read) was a
        # failed host with no error at all ("error": null, "FAILED: exit 3"), where the same answer from nvmlcheck
        # on the host names why.
        failed = _failed_answer(str(host), command, document, code, cause.stderr)
        if failed is not None:
            return RemoteError(str(host), f"read through its nvidia-smi (no nvmlcheck there): {failed.message}",
                               code, cause.stderr, document)
        return HostResult(host, document, code, via="nvidia-smi", note=note)

    def _one(self, host: Host, command: Sequence[str], deadline_s: float | None,
             fallback: FallbackFn | None) -> HostResult:
        started = time.monotonic()
        deadline = None if deadline_s is None else started + deadline_s
        try:
            child = self._spawn(self.argv(host, command))
        except OSError as exc:
            return HostResult(host, None, None, HostUnreachable(str(host), f"cannot start {self.ssh!r}: {exc}"))
        except RuntimeError:
            return HostResult(host, None, None, HostError(str(host), "stopped before it started"))
        rc, out, err = self._finish(child, deadline)
        if rc is None and not self._closed:
            # Killed at the deadline: the host's ControlMaster still carries the session (and the remote command);
            # end it, so a fleet used again does not pile up sessions. The next call starts a new master.
            directory = self._control_dir
            if directory is not None:
                self._wait_exits([self._exit_master(host, directory)])
        if child.overflow is not None:
            answer: HostResult | HostError = RemoteError(
                str(host), f"output over {self.max_output_bytes} bytes on its {child.overflow} (ssh killed): not an "
                "nvmlcheck answer (a broken or hostile host?)", None, _trim(err))
        else:
            answer = self._classify(host, rc, out, err, time.monotonic() - started, command=command)
        if isinstance(answer, NoRemoteNvmlcheck):
            if fallback is not None:
                answer = self._fallback(host, deadline, fallback, answer, command)
            elif command[0] in ("kill", "holders"):
                answer = NoRemoteNvmlcheck(
                    answer.host, f"{answer.message}: {command[0]} needs nvmlcheck on the host (nvidia-smi can neither "
                    "signal processes nor see device files); install it there (pip install nvmlcheck) or point "
                    "--remote-python at an interpreter that has it", answer.returncode, answer.stderr)
        elapsed = round((time.monotonic() - started) * 1e9)
        if isinstance(answer, HostError):
            document = answer.document if isinstance(answer, RemoteError) else None
            return HostResult(host, document, answer.returncode, answer, elapsed_ns=elapsed)
        return HostResult(answer.host, answer.document, answer.exit_code, answer.error, answer.via, answer.note,
                          elapsed)

    # -- many hosts ---------------------------------------------------------------------------------------------------

    def run(
        self,
        hosts: Iterable[str | Host],
        command: Sequence[str],
        *,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        fallback: FallbackFn | None = None,
        on_progress: Callable[[Sequence[Host], Sequence[HostResult]], object] | None = None,
    ) -> list[HostResult]:
        """Run ``nvmlcheck --json COMMAND...`` on every host; results in the hosts' order.

        ``timeout_s``: the command's own timeout (``wait --timeout``), used for the default deadline; it is the
        call's: a host started late (queued behind ``fanout`` others) has the ``--timeout`` of ``timeout_s`` in
        ``command`` and its deadline shrunk by how late it started. ``deadline_s``: seconds each host may take from
        its start (default: ``timeout_s`` + the connect timeout + 5 s; ``None`` with no ``timeout_s``: no
        deadline; given, the command is left as it is). Either may be ``math.inf`` (no deadline); NaN or a negative
        one raises ``ValueError``. ``fallback(context) -> (document, exit_code)``: how to
        answer for a host without nvmlcheck (see :func:`run_on_hosts`); ``None``: such a host fails with
        :class:`NoRemoteNvmlcheck`. ``on_progress(pending, done)`` is called in the caller's thread about 10 times a
        second while hosts are pending, and once at the end. Any exception in the caller's thread while waiting
        (KeyboardInterrupt, the CLI's Terminated) kills every ssh child before it propagates, and every worker thread
        has ended when it does (a further interruption meanwhile is held until then, then raised).
        """
        # The call's timeout runs from here: asking ssh -G which spellings are one host (up to
        # SSH_CONFIG_TIMEOUT_S) is part of the call, not a delay before its timeout starts.
        began = time.monotonic()
        targets, also = self.same_hosts(parse_hosts(hosts))
        if not command or command[0] not in COMMANDS:
            raise ArgumentError(f"command must start with one of {', '.join(COMMANDS)}, got {list(command)[:1]}")
        for name, value in (("timeout_s", timeout_s), ("deadline_s", deadline_s)):
            # NaN passes every comparison as false: it would have meant no deadline at all, a hung host hanging the
            # call; a negative one is a bug too. inf (and None) are no deadline, on purpose.
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not value >= 0):
                raise ArgumentError(f"{name} must be a number of seconds >= 0 (or None), got {value!r}")
        shared = deadline_s is None and timeout_s is not None and 0 < timeout_s < _FOREVER_S
        if deadline_s is None:
            deadline_s = _deadline_for(timeout_s, self.connect_timeout_s)
        if deadline_s is not None and not deadline_s < _FOREVER_S:  # inf, 1e308: no deadline
            deadline_s = None

        def answer(host: Host) -> HostResult:
            # The command's timeout is the call's, not each host's: a host that starts late (queued behind
            # ``fanout`` others) gets what is left of it, so the whole call ends by about the timeout plus the
            # connect and start allowances, not by a multiple of it (64 hosts, a fanout of 32: twice).
            if shared and timeout_s is not None:
                # A host queued past the timeout gets the least positive one, never 0 (one whole check judged
                # alone, ignoring --stable-polls): its wait answers "not confirmed in time", as the library's does.
                late_s = time.monotonic() - began
                left = _left_of(timeout_s, late_s) or USED_UP_S
                shifted = _with_timeout(command, timeout_s, left)
                if shifted is not None:
                    # The nvidia-smi fallback's wait is the same wait: it gets what is left too (it had the whole
                    # --timeout again, however late its host started).
                    late_fallback = fallback
                    if isinstance(fallback, SmiFallback) and fallback.timeout_s == timeout_s:
                        late_fallback = dataclasses.replace(fallback, timeout_s=left)
                    result = self._one(host, shifted, _deadline_for(left, self.connect_timeout_s), late_fallback)
                    if left > USED_UP_S or result.verdict != "not-clean":
                        return result
                    # Not read in time because of its turn, not its GPUs: say so beside the host's own words
                    # (which blame opening the GPUs for the timeout).
                    note = (f"its turn came {late_s:.1f} s into the call (--fanout {self.fanout}): the --timeout "
                            "was used up before it started, so it could not be confirmed clean")
                    return HostResult(result.host, result.document, result.exit_code, result.error, result.via,
                                      f"{result.note}; {note}" if result.note else note, result.elapsed_ns)
            return self._one(host, command, deadline_s, fallback)

        pool = _Workers(targets, answer)
        threads = [threading.Thread(target=pool.work, name=f"nvmlcheck-host-{n}", daemon=True)
                   for n in range(min(self.fanout, len(targets)))]
        interrupted = False
        try:
            for t in threads:
                t.start()
            results = pool.results_when_done(on_progress)
        except BaseException:
            interrupted = True
            self.stop()
            raise
        finally:
            pool.await_end(self.stop if interrupted else None)
        ordered = [results[i] for i in range(len(targets))]
        for i, others in also.items():
            spelled = ", ".join(map(str, others))
            note = f"also given as {spelled}: the same host for ssh (ssh -G), run once"
            r = ordered[i]
            ordered[i] = HostResult(r.host, r.document, r.exit_code, r.error, r.via,
                                    f"{r.note}; {note}" if r.note else note, r.elapsed_ns)
        if on_progress is not None:
            on_progress([], ordered)
        return ordered

    def same_hosts(self, hosts: Sequence[Host]) -> tuple[list[Host], dict[int, list[Host]]]:
        """``hosts`` (already without the duplicates :func:`parse_hosts` drops) without those that ssh reaches as
        one: where two or more share a name (:func:`_same_name`) but differ in the user or port given, each is
        asked of ``ssh -G`` (which prints the configuration it would use, without connecting), and those with the
        same user, host name and port are one host, run once under its first spelling. Returns the hosts kept and,
        by index among them, the spellings dropped for each. A spelling ``ssh -G`` cannot answer for (an ssh
        without ``-G``, a wrapper, a timeout) keeps its own key: never merged on a guess. Names that only the
        configuration makes one (an alias whose ``HostName`` is another name given) are not asked about: that
        would cost one ``ssh -G`` per host on every call."""
        groups: dict[str, list[int]] = {}
        for i, host in enumerate(hosts):
            groups.setdefault(_same_name(host.host), []).append(i)
        ask = [i for members in groups.values() if len(members) > 1 for i in members]
        if not ask:
            return list(hosts), {}
        resolved = self._ssh_config([hosts[i] for i in ask])
        keys: dict[int, tuple[str | None, str, int | None]] = {i: _same_host_key(h) for i, h in enumerate(hosts)}
        for i, found in zip(ask, resolved, strict=True):
            if found is not None:
                keys[i] = found
        kept: list[Host] = []
        where: dict[tuple[str | None, str, int | None], int] = {}
        also: dict[int, list[Host]] = {}
        for i, host in enumerate(hosts):
            first = where.get(keys[i])
            if first is None:
                where[keys[i]] = len(kept)
                kept.append(host)
            else:
                also.setdefault(first, []).append(host)
        return kept, also

    def _ssh_config(self, hosts: Sequence[Host]) -> list[tuple[str | None, str, int | None] | None]:
        """``(user, host name, port)`` as ``ssh -G`` prints them for each of ``hosts`` (with this fleet's ssh
        options), ``None`` where it gave no such answer. ``fanout`` at once, each in a session of its own, killed
        with its group at the deadline (the connect timeout, at most :data:`SSH_CONFIG_TIMEOUT_S`, for all of them:
        ``ssh -G`` does not connect, but ``Match exec`` runs commands and ``CanonicalizeHostname`` resolves names)
        or when this call is interrupted."""
        deadline = time.monotonic() + min(self.connect_timeout_s, SSH_CONFIG_TIMEOUT_S)
        out: list[tuple[str | None, str, int | None] | None] = []
        for start in range(0, len(hosts), self.fanout):
            out += self._ssh_config_batch(hosts[start:start + self.fanout], deadline)
        return out

    def _ssh_config_batch(self, hosts: Sequence[Host],
                          deadline: float) -> list[tuple[str | None, str, int | None] | None]:
        import subprocess

        procs: list[subprocess.Popen[bytes] | None] = []
        out: list[tuple[str | None, str, int | None] | None] = []
        try:
            for host in hosts:
                argv = [self.ssh, *self.ssh_options, "-G", *(["-p", str(host.port)] if host.port else []), "--",
                        host.destination]
                try:
                    procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                  stderr=subprocess.DEVNULL, start_new_session=True))
                except OSError:
                    procs.append(None)
            for proc in procs:
                if proc is None:
                    out.append(None)
                    continue
                try:
                    text, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    out.append(None)
                    continue
                out.append(_ssh_g_key(text.decode("utf-8", "replace")) if proc.returncode == 0 else None)
        finally:
            for proc in procs:
                if proc is None:
                    continue
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()  # SIGKILLed: it ends (ssh -G reads no device that could hold it)
                if proc.stdout is not None:
                    proc.stdout.close()
        return out

    def stop(self) -> None:
        """Kill every running ssh child (its process group); later starts are refused. Safe from any thread."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for child in running:
            child.signal_group()
        # The nvidia-smi fallback's ssh runs are started by the smi backend, not here: find them among this
        # process's children by the mark in their environment (each leads its own process group).
        for pid in self._marked_children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def _marked_children(self) -> list[int]:
        mark = f"{_MARK}={self._token}".encode()
        pids: list[int] = []
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:  # not Linux: the smi runner's own timeout bounds those runs
            return pids
        for task in tasks:
            try:
                with open(f"/proc/self/task/{task}/children", encoding="ascii") as f:
                    children = [int(p) for p in f.read().split()]
            except OSError:
                continue
            for pid in children:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        marked = mark in f.read().split(b"\0")
                    # Only a group leader: killpg must not reach a group this fleet did not create.
                    if marked and os.getpgid(pid) == pid:
                        pids.append(pid)
                except OSError:
                    continue
        return pids

    def _exit_master(self, host: Host, directory: str) -> Child | None:
        """Start ``ssh -O exit`` for ``host``'s ControlMaster (ending it and the sessions it carries), if any."""
        path = os.path.join(directory, hashlib.sha1(str(host).encode()).hexdigest()[:12])
        if not os.path.exists(path):
            return None
        argv = [self.ssh, "-o", f"ControlPath={path}", *self.ssh_options, "-O", "exit"]
        if host.port is not None:
            argv += ["-p", str(host.port)]
        argv += ["--", host.destination]
        try:
            return Child(argv, after_exit_s=0.0)  # its output is not used: stop reading at its exit
        except OSError:
            return None

    @staticmethod
    def _wait_exits(exits: Iterable[Child | None]) -> None:
        for child in exits:
            if child is None:
                continue
            if not child.wait(time.monotonic_ns() + int(_EXIT_WAIT_S * 1e9)):
                child.kill(read_after_exit=False)
            child.close()

    def close(self) -> None:
        """Stop, end the ControlMaster processes this fleet started (``ssh -O exit``) and remove their directory."""
        self.stop()
        with self._lock:
            directory, used = self._control_dir, list(self._used)
            self._control_dir = None
            self._used.clear()
        try:
            if directory is not None:
                try:
                    self._wait_exits([self._exit_master(host, directory) for host in used])
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
        finally:
            self._guard.dismiss()  # everything it would have done is done

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- commands --------------------------------------------------------------------------------------------------------

class _Stopped(Exception):
    """The fleet was stopped while a fallback was waiting."""


@dataclass(frozen=True, slots=True)
class SmiFallback:
    """How to answer ``snapshot`` or ``wait`` for a host without nvmlcheck: through its nvidia-smi (the smi
    backend, behind the ssh command as its prefix), with the same document the remote CLI would print.

    ``command``: ``"snapshot"`` or ``"wait"``; the other fields mean what the CLI options of the same names mean
    (``timeout_s`` ``None``: wait until the host's deadline).
    """

    command: Literal["snapshot", "wait"]
    devices: tuple[int | str, ...] | None = None
    timeout_s: float | None = 30.0
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES
    stable_polls: int = 2
    pids: tuple[int, ...] = field(default=())

    def __call__(self, context: FallbackContext) -> tuple[dict[str, Any], int]:
        """Read the host through ``context.prefix`` within ``context.remaining_s``; returns (document, exit code)."""
        from . import predicates as p
        from .backends.smi import SmiBackend
        from .errors import WaitTimeout
        from .jsonout import snapshot_document, wait_document, wait_timeout_document
        from .session import Session

        remaining_s = context.remaining_s
        # Each nvidia-smi run over ssh is bounded by what is left of the host's deadline, and by the time one run
        # may take (a hung one must not outlive a stop() by more than that).
        smi_timeout = context.run_timeout_s if remaining_s is None else max(0.5, min(remaining_s,
                                                                                  context.run_timeout_s))
        backend = SmiBackend(prefix=list(context.prefix), timeout_s=smi_timeout, env=context.env, guard=context.guard)

        def on_poll(point: object) -> None:
            if context.stopped():
                raise _Stopped

        with Session(backend) as gpus:
            devices = list(self.devices) if self.devices else None
            if self.command == "snapshot":
                snap = gpus.snapshot(devices)
                return snapshot_document(snap), 3 if snap.failures or not snap.devices else 0
            predicate = p.no_processes() & p.memory_used_at_most(self.max_used_bytes)
            if self.pids:
                predicate = predicate & p.pids_gone(self.pids)
            timeout = self.timeout_s
            if remaining_s is not None:
                timeout = remaining_s if timeout is None else min(timeout, remaining_s)
            try:
                res = gpus.wait_until_clean(timeout, predicate, devices=devices, stable_polls=self.stable_polls,
                                            on_poll=on_poll)
            except WaitTimeout as exc:
                return wait_timeout_document(exc), 1
            return wait_document(res), 0


def run_on_hosts(
    hosts: Iterable[str | Host],
    command: Sequence[str],
    *,
    timeout_s: float | None = None,
    deadline_s: float | None = None,
    fallback: SmiFallback | FallbackFn | None = None,
    on_progress: Callable[[Sequence[Host], Sequence[HostResult]], object] | None = None,
    **fleet_options: Any,
) -> list[HostResult]:
    """Run ``nvmlcheck --json COMMAND...`` (``command`` as CLI words: ``["wait", "--timeout", "5"]``) on every
    host through ssh, in parallel; results in the hosts' order. One call, one :class:`Fleet` (closed at the end).

    ``timeout_s``: the command's timeout, for the default deadline (:meth:`Fleet.run`). ``fallback``: how to
    answer for hosts without nvmlcheck (an :class:`SmiFallback` for ``snapshot``/``wait``; ``None``: they fail
    with :class:`NoRemoteNvmlcheck`). ``fleet_options``: :class:`Fleet`'s keyword arguments (``remote_prefix``,
    ``remote_python``, ``fanout``, ``ssh_options``, ``connect_timeout_s``). Bad host specs raise ``ValueError``
    before anything runs. :func:`overall_exit_code` turns the results into one verdict.
    """
    targets = parse_hosts(hosts)
    with Fleet(**fleet_options) as fleet:
        return fleet.run(targets, command, timeout_s=timeout_s, deadline_s=deadline_s, fallback=fallback,
                         on_progress=on_progress)


def wait_on_hosts(
    hosts: Iterable[str | Host],
    timeout_s: float | None = 30.0,
    *,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    stable_polls: int = 2,
    pids: Sequence[int] = (),
    devices: Sequence[int | str] | None = None,
    **options: Any,
) -> list[HostResult]:
    """``nvmlcheck wait`` on every host (hosts without nvmlcheck through their nvidia-smi); see
    :func:`run_on_hosts` for ``options``."""
    command = ["wait", "--timeout", "none" if timeout_s is None else repr(float(timeout_s)),
               "--max-used", str(max_used_bytes), "--stable-polls", str(stable_polls)]
    if pids:
        command += ["--pids", *map(str, pids)]
    if devices:
        command += ["--devices", ",".join(map(str, devices))]
    fallback = SmiFallback("wait", tuple(devices) if devices else None, timeout_s, max_used_bytes, stable_polls,
                           tuple(pids))
    return run_on_hosts(hosts, command, timeout_s=timeout_s, fallback=fallback, **options)


def snapshot_on_hosts(hosts: Iterable[str | Host], *, devices: Sequence[int | str] | None = None,
                      timeout_s: float | None = 30.0, **options: Any) -> list[HostResult]:
    """``nvmlcheck snapshot`` on every host (hosts without nvmlcheck through their nvidia-smi); ``timeout_s``
    bounds each host's answer beyond its connect time."""
    command = ["snapshot"] + (["--devices", ",".join(map(str, devices))] if devices else [])
    fallback = SmiFallback("snapshot", tuple(devices) if devices else None)
    return run_on_hosts(hosts, command, timeout_s=timeout_s, fallback=fallback, **options)
