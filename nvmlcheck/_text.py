"""Text from processes, GPUs and remote hosts made safe to print on a terminal: the one escaping function.

A process can name itself anything (``comm``, ``argv``), a remote host can answer anything, a lock file can say
anything: printed raw, an escape sequence clears the screen or sets the terminal title, a newline forges a line
(``clean: ...``), a bidi override reverses what follows, a zero-width space makes two names look one, a byte that is
not UTF-8 fails the write. :func:`printable` writes every character that is not printable as ``\\xNN`` /
``\\uNNNN`` / ``\\UNNNNNNNN``; :func:`printable_lines` keeps ``\\n``,
for nvmlcheck's own multi-line messages whose data was escaped where it went in. JSON documents stay exact
(``json.dumps`` escapes them itself). No imports: every layer may use it (docs/architecture.md).
"""

from __future__ import annotations

__all__ = ["ASCII_SPELLINGS", "ascii_fallback", "ascii_spelling", "is_digits", "printable", "printable_lines"]


def _escape(ch: str) -> str:
    c = ord(ch)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" if c < 0x10000 else f"\\U{c:08x}"


def _escaped(s: str, keep_newline: bool) -> str:
    return "".join(ch if ch.isprintable() or (keep_newline and ch == "\n") else _escape(ch) for ch in s)


def printable(text: object) -> str:
    """``str(text)`` with every character that is not printable written as an escape: one line, shown as it is,
    whatever it contains. Not printable (``str.isprintable``): control characters (C0, DEL, C1), format characters
    (the bidi controls, zero-width spaces, the soft hyphen, tag characters), separators other than the space (line
    and paragraph separators, no-break spaces), private-use and unassigned code points, and lone surrogates (the
    bytes of a file name or command line that are not UTF-8: a strict UTF-8 stream cannot write them, and a
    surrogate-escaping one writes the raw byte)."""
    s = text if isinstance(text, str) else str(text)
    return s if s.isprintable() else _escaped(s, False)


def printable_lines(text: object) -> str:
    """As :func:`printable`, but ``\\n`` is kept: for a message of several lines built by nvmlcheck."""
    s = text if isinstance(text, str) else str(text)
    return s if s.isprintable() else _escaped(s, True)


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
        out.append(ASCII_SPELLINGS.get(ch) or _escape(ch))
    return "".join(out)


def ascii_fallback(exc: UnicodeError) -> tuple[str, int]:
    """An encoding error handler (``codecs.register_error``; the CLI's streams use it: ``cli/_output.py``) that
    writes what the stream's encoding cannot as :func:`ascii_spelling` does."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return ascii_spelling(exc.object[exc.start:exc.end]), exc.end
