"""The value types of the options that the quick parse (:mod:`._quick`) reads too: no argparse here.

Each turns one word into a value or raises argparse's ``ArgumentTypeError`` (argparse, imported only then, prints
its message as the usage error); :mod:`._parser` uses the same functions, so both parses read a word alike.
"""

from __future__ import annotations

import math

from .._text import is_digits

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import argparse


def _bad(message: str) -> argparse.ArgumentTypeError:
    """The error a value type raises for ``message``; argparse is imported only for a word that is bad."""
    import argparse

    return argparse.ArgumentTypeError(message)


#: The longest finite duration an option takes: about 31.7 years. Longer is a typo ('none' says "no bound").
MAX_SECONDS = 1e9


def _number(text: str, what: str | None, unbounded: str | None = None) -> float:
    """``text`` as a float, in ASCII without ``_`` (Python's ``float`` also reads ``1_0`` and Arabic-Indic digits);
    ``what``: its unit for the error (``seconds``: "not a number of seconds"; ``None``: "not a number")."""
    try:
        if not text.isascii() or "_" in text:
            raise ValueError(text)
        return float(text)
    except ValueError:
        of = f" of {what}" if what else ""
        raise _bad(f"not a number{of}: {text!r}" + (f" (or '{unbounded}')" if unbounded else "")) from None


def seconds_or_none(text: str, unbounded: str = "none") -> float | None:
    """``--timeout``: seconds >= 0, or ``none``/``inf``/``forever`` for no bound (``unbounded``: the word the error
    suggests). More than :data:`MAX_SECONDS` is refused: no deadline is that far, and it would not count in ns."""
    if text.strip().lower() in ("none", "inf", "infinity", "forever"):
        return None
    value = _number(text, "seconds", unbounded)
    if math.isnan(value) or value < 0:
        raise _bad(f"must be >= 0 seconds (or '{unbounded}'), got {text!r}")
    if math.isinf(value) and text.strip().lower().lstrip("+") in ("inf", "infinity"):
        return None  # +inf: the word, signed
    if value > MAX_SECONDS:  # 1e400 too: a number (that overflowed), never the word for no bound
        raise _bad(f"at most {MAX_SECONDS:.0e} seconds (about 31 years), got {text!r}; '{unbounded}' has no bound")
    return value + 0.0  # -0 is 0 (printed "timeout -0 s" otherwise)


def grace_seconds(text: str) -> float | None:
    """``--grace``: seconds >= 0 before SIGKILL, or ``never``/``none``/``inf``: never escalate."""
    if text.strip().lower() == "never":
        return None
    return seconds_or_none(text, "never")


def _integer(text: str, what: str) -> int:
    """``text`` as an int: an optional sign and ASCII digits (``int`` also reads ``1_0``, ``٣`` and spaces)."""
    word = text.strip()
    if not is_digits(word.removeprefix("-").removeprefix("+")):
        raise _bad(f"not {what}: {text!r}")
    return int(word)


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _integer(text, "an integer")
    if value < 1:
        raise _bad(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0."""
    value = _integer(text, "an integer")
    if value < 0:
        raise _bad(f"must be at least 0, got {value}")
    return value


def seconds(text: str) -> float:
    """Seconds >= 0, bounded (at most :data:`MAX_SECONDS`; no ``none``: this option always has a value)."""
    value = _number(text, "seconds")
    if not 0 <= value <= MAX_SECONDS:
        raise _bad(f"must be >= 0 seconds and at most {MAX_SECONDS:.0e}, got {text!r}")
    return value + 0.0


def number(text: str) -> float:
    """A finite number, in ASCII without ``_`` (its range is the option's own check)."""
    value = _number(text, None)
    if not math.isfinite(value):
        raise _bad(f"must be a finite number, got {text!r}")
    return value


def integer(text: str) -> int:
    """An integer (sign and ASCII digits)."""
    return _integer(text, "an integer")


def milliseconds(text: str) -> int:
    """Milliseconds >= 0, at most :data:`MAX_SECONDS` of them."""
    value = non_negative_int(text)
    if value > MAX_SECONDS * 1000:
        raise _bad(f"at most {MAX_SECONDS * 1000:.0e} ms (about 31 years), got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """Seconds > 0, bounded (at most :data:`MAX_SECONDS`; ``none`` is no value here)."""
    value = _number(text, "seconds")
    if not 0 < value <= MAX_SECONDS:
        raise _bad(f"must be > 0 seconds and at most {MAX_SECONDS:.0e}, got {text!r}")
    return value


def pid_number(text: str) -> int:
    """A PID as written; its range (1 < pid <= pid_max) is checked with the other refusals, before any signal."""
    return _integer(text, "a PID")


def watched_pid(text: str) -> int:
    """A PID ``wait --pids`` watches for: 1 to Linux's ``PID_MAX_LIMIT``. One that has exited is gone (the wait's
    answer); one beyond any PID a kernel hands out is a typing error, never "gone" (it would make the wait clean)."""
    from .._proc import PID_MAX_LIMIT

    value = _integer(text, "a PID")
    if not 1 <= value <= PID_MAX_LIMIT:
        raise _bad(f"not a process ID: {value} (a PID is 1 to {PID_MAX_LIMIT} on Linux)")
    return value


class SignalWord(str):
    """A signal's name as this system spells it (``"SIGRTMIN+1"``), with the user's own word in :attr:`given`
    (``"35"``): a fleet passes that word to each host (``kill --hosts``), where a real-time signal's number differs
    with the C library (SIGRTMIN is 34 with glibc, 35 with musl): ``35`` is 35 there too, ``RTMIN+1`` that host's
    SIGRTMIN + 1."""

    given: str

    def __new__(cls, name: str, given: str) -> SignalWord:
        word = super().__new__(cls, name)
        word.given = given
        return word


def signal_name(text: str) -> str:
    """``TERM``, ``SIGTERM``, ``int``, ``9``: a signal this system knows, as ``SIGTERM`` (a :class:`SignalWord`
    that keeps ``text`` as given, stripped)."""
    from .._proc import signals  # not the signal module: its enums cost a kill's start-up

    try:
        return SignalWord(signals.name(signals.number(text)), text.strip())
    except ValueError as exc:
        why = str(exc) if str(exc).startswith("unknown signal") else f"unknown signal {text!r}: {exc}"
        raise _bad(f"{why}; give a name with or without SIG, or a number (TERM, SIGINT, KILL, 9, RTMIN+1, "
                   "35)") from None


#: How sizes are written, for every option that takes one (docs/cli.md, "Sizes").
SIZE_UNITS = ("KiB/MiB/GiB/TiB (or K/M/G/T) are powers of 2, KB/MB/GB/TB powers of 10: 16GiB is 17,179,869,184 "
              "bytes, 16GB 16,000,000,000")


def command_words(text: str) -> str:
    """``--smi-prefix``: a command split like a shell would (``ssh gpu01``); refused when it does not split (an
    unclosed quote) or is empty. The text is kept: the backend splits it again, as its own argument."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise _bad(f"{text!r} does not split into words: {exc}") from None
    if not words:
        raise _bad("an empty command: give one (\"ssh gpu01\"), or leave the option out")
    return text


def byte_size(text: str) -> int:
    """``16MiB`` / ``1GiB`` / ``4096`` → bytes (``M``/``G`` mean MiB/GiB; ``MB``/``GB`` are decimal)."""
    from .._units import parse_size

    try:
        return parse_size(text) if text.strip() not in ("0", "0B") else 0
    except ValueError as exc:
        raise _bad(str(exc)) from None


def device_list(text: str) -> list[int | str]:
    """``0,2``, UUIDs (or unique UUID prefixes) or CUDA selectors (``cuda:0``, ``cuda:all``), comma-separated.

    CUDA selectors stay strings: the session resolves them through ``CUDA_VISIBLE_DEVICES``."""
    items: list[int | str] = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            raise _bad(f"empty device in {text!r}")
        if part[:5].lower() == "cuda:" and not (is_digits(part[5:]) or part[5:].lower() == "all"):
            raise _bad(f"bad CUDA device {part!r}: expected cuda:N (N = 0, 1, ...) or cuda:all")
        if not (is_digits(part) or part[:5].lower() == "cuda:" or part[:4].upper() in ("GPU-", "MIG-")):
            # "-1", "1.0", "all": refused here, before anything opens (they would be read as UUID prefixes).
            raise _bad(f"bad device {part!r}: give an index (0, 1, ...), a UUID or its start (GPU-…, MIG-…), or "
                       "cuda:N / cuda:all")
        items.append(int(part) if is_digits(part) else part)
    return items


#: The least need ``--need`` takes as a bare number of bytes (no unit): 1 MiB.
_LEAST_BARE_NEED = 1 << 20


def need_amount(text: str) -> tuple[int | None, float | None]:
    """``ready --need``: ``(bytes, None)`` for a size (``80GiB``, ``4096B``; a bare number of bytes from 1 MiB on:
    ``80`` is refused, as ``1`` is), ``(None, fraction)`` for a fraction of each GPU's total (``0.9``, ``90%``; in
    (0, 1]), as vLLM's ``gpu_memory_utilization``."""
    from .._units import parse_size

    raw = text.strip()
    if raw == "1":
        # 1 byte, or vLLM's gpu_memory_utilization=1 (all of it)? Both readings are plausible: say which.
        raise _bad("--need 1 is ambiguous: write 1.0 (or 100%) for all of each GPU, or 1B for one byte")
    if is_digits(raw) and 1 < int(raw) < _LEAST_BARE_NEED:
        # `--need 80` read as 80 bytes is met by any GPU: "ready" on one with 1 GiB free, where 80 GiB, 80 % or
        # nvidia-smi's 80 MiB was meant. No job needs less than a MiB (its CUDA context alone is hundreds): a bare
        # number below that is refused, naming the readings; a unit says which.
        raise _bad(f"--need {raw} is ambiguous: {raw} bytes is no job's need; write {raw}GiB (or {raw}MiB, as "
                   f"nvidia-smi counts) for a size, {raw}% for a share of each GPU, or {raw}B if bytes are meant")
    try:
        if raw.endswith("%"):
            fraction = _number(raw[:-1], "percent") / 100
        elif is_digits(raw.replace(".", "", 1)) and "." in raw:
            fraction = float(raw)
        else:
            return (0 if raw in ("0", "0B") else parse_size(raw)), None
    except ValueError as exc:
        raise _bad(f"{exc} (or a fraction of the total: 0.9, 90%)") from None
    if not 0.0 < fraction <= 1.0:
        raise _bad(f"a fraction of the total is in (0, 1] (0.9, 90%), got {text!r}; for bytes "
                                         "give a unit (1.5GiB)")
    return None, fraction
