"""Text from processes, GPUs and remote hosts made safe to print on a terminal: the one escaping function.

A process can name itself anything (``comm``, ``argv``), a remote host can answer anything, a lock file can say
anything: printed raw, an escape sequence clears the screen or sets the terminal title, a newline forges a line
(``clean: ...``), a bidi override reverses what follows. :func:`printable` writes C0 and C1 control characters, DEL,
the bidi controls and the Unicode line separators as ``\\xNN`` / ``\\uNNNN``; :func:`printable_lines` keeps ``\\n``,
for nvmlcheck's own multi-line messages whose data was escaped where it went in. JSON documents stay exact
(``json.dumps`` escapes them itself). No imports: every layer may use it (docs/architecture.md).
"""

from __future__ import annotations

__all__ = ["is_digits", "printable", "printable_lines"]

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
