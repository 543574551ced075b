"""Text from processes, GPUs and remote hosts made safe to print on a terminal: the one escaping function.

A process can name itself anything (``comm``, ``argv``), a remote host can answer anything, a lock file can say
anything: printed raw, an escape sequence clears the screen or sets the terminal title, a newline forges a line
(``clean: ...``), a bidi override reverses what follows. :func:`printable` writes C0 and C1 control characters, DEL,
the bidi controls and the Unicode line separators as ``\\xNN`` / ``\\uNNNN``; :func:`printable_lines` keeps ``\\n``,
for nvmlcheck's own multi-line messages whose data was escaped where it went in. JSON documents stay exact
(``json.dumps`` escapes them itself). No imports: every layer may use it (docs/architecture.md).
"""

from __future__ import annotations

__all__ = ["ASCII_SPELLINGS", "ascii_fallback", "ascii_spelling", "is_digits", "printable", "printable_lines"]

_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_ESCAPED: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))},
    **{c: f"\\u{c:04x}" for c in (*_BIDI, 0x2028, 0x2029)},
}
_KEEP_NEWLINE = {c: r for c, r in _ESCAPED.items() if c != 0x0A}


def printable(text: object) -> str:
    """``str(text)`` with every control character, DEL, bidi control and line separator written as an escape: one
    line, shown as it is, whatever it contains."""
    s = text if isinstance(text, str) else str(text)
    return s if s.isprintable() else s.translate(_ESCAPED)


def printable_lines(text: object) -> str:
    """As :func:`printable`, but ``\\n`` is kept: for a message of several lines built by nvmlcheck."""
    s = text if isinstance(text, str) else str(text)
    return s if s.isprintable() else s.translate(_KEEP_NEWLINE)


def is_digits(text: str) -> bool:
    """Whether ``text`` is ASCII decimal digits (at least one). ``str.isdigit`` also says yes to ``²`` and ``٣``,
    which ``int`` then refuses or reads as 3: a PID, GPU index or job ID, typed or from the environment, is 0-9."""
    return text.isascii() and text.isdigit()


#: How each non-ASCII character of nvmlcheck's own text (units, ellipses, separators, arrows, the tree of
#: ``--help``) is written to a stream whose encoding cannot write it (``PYTHONIOENCODING=ascii``, a POSIX locale
#: without UTF-8, a Latin-1 terminal): ``428 us per poll``, not ``428 \\xb5s``. Any other character (a process's
#: or a GPU's name) is escaped as Python's ``backslashreplace`` writes it. A stream that can write the character
#: (UTF-8) is not touched. tests/unit/test_ascii_output.py checks that every non-ASCII character in nvmlcheck's
#: code (docstrings and comments aside) is in this table.
ASCII_SPELLINGS: dict[str, str] = {
    "\u00b5": "u",  # MICRO SIGN (µs)
    "\u03bc": "u",  # GREEK SMALL LETTER MU
    "\u2026": "...",  # HORIZONTAL ELLIPSIS
    "\u00b7": "-",  # MIDDLE DOT, the status line's separator
    "\u2022": "-",  # BULLET
    "\u2013": "-",  # EN DASH
    "\u2014": "--",  # EM DASH
    "\u2212": "-",  # MINUS SIGN
    "\u00d7": "x",  # MULTIPLICATION SIGN
    "\u00b1": "+/-",
    "\u2192": "->",
    "\u2190": "<-",
    "\u2265": ">=",
    "\u2264": "<=",
    "\u2260": "!=",
    "\u2248": "~",
    "\u00b0": " deg",
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u00a0": " ",  # NO-BREAK SPACE
    "\u2500": "-",  # box drawing: the exception tree
    "\u2502": "|",
    "\u251c": "|",
    "\u2514": "`",
}


def ascii_spelling(text: str) -> str:
    """``text`` in ASCII: each character of :data:`ASCII_SPELLINGS` as it says, any other non-ASCII one escaped
    (``\\xe9``, ``\\u65e5``, ``\\U0001f600``)."""
    out = []
    for ch in text:
        if ch.isascii():
            out.append(ch)
            continue
        spelled = ASCII_SPELLINGS.get(ch)
        if spelled is None:
            c = ord(ch)
            spelled = f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"
        out.append(spelled)
    return "".join(out)


def ascii_fallback(exc: UnicodeError) -> tuple[str, int]:
    """An encoding error handler (``codecs.register_error``; the CLI's streams use it: ``cli/_output.py``) that
    writes what the stream's encoding cannot as :func:`ascii_spelling` does."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return ascii_spelling(exc.object[exc.start:exc.end]), exc.end
