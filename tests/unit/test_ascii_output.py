"""Output on a stream that cannot encode nvmlcheck's own characters (``µs``, ``…``, ``·``, ``→``): each is spelled in
ASCII (``us``, ``...``) rather than escaped (``\\xb5s``), in one place (``_text.ASCII_SPELLINGS``, the streams'
error handler set by ``cli/_output.py``); a character of data is escaped; UTF-8 output is unchanged."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvmlcheck._text import ASCII_SPELLINGS, ascii_spelling

PACKAGE = Path(__file__).resolve().parents[2] / "nvmlcheck"


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_every_non_ascii_character_of_the_code_has_an_ascii_spelling() -> None:
    # The class, not the one `µs` seen: a new `≥` in a message must get its spelling here or fail this test.
    missing: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstring_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno not in docs:
                for ch in node.value:
                    # ² and ٣ are is_digits' examples of what int() misreads, and U+FEFF the byte-order mark the
                    # parsers drop from their input: none is text printed
                    if not ch.isascii() and ch not in ASCII_SPELLINGS and ch not in "²٣\ufeff":
                        missing.setdefault(ch, f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not missing, f"non-ASCII characters without an ASCII spelling in _text.ASCII_SPELLINGS: {missing}"


def test_spellings_are_ascii_and_data_is_escaped() -> None:
    assert all(v.isascii() for v in ASCII_SPELLINGS.values())
    assert ascii_spelling("read in 312 µs · 2 GPUs …") == "read in 312 us - 2 GPUs ..."
    assert ascii_spelling("caf\u00e9 \u65e5 \U0001f600") == "caf\\xe9 \\u65e5 \\U0001f600"


@pytest.mark.parametrize("errors", ["strict", "backslashreplace", "surrogateescape"])
def test_the_standard_streams_spell_in_ascii_whatever_their_default_handler(
    errors: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # stderr's default handler is backslashreplace: an error message with `µs` printed `\xb5s` there, after stdout
    # was fixed. A POSIX locale's stdout is surrogateescape, which failed on `µ`.
    from nvmlcheck.cli import _output

    raw_out, raw_err = io.BytesIO(), io.BytesIO()
    out = io.TextIOWrapper(raw_out, encoding="ascii", errors=errors)
    err = io.TextIOWrapper(raw_err, encoding="ascii", errors=errors)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    _output._usable_streams()
    for stream in (out, err):
        stream.write("312 µs → clean … caf\u00e9\n")
        stream.flush()
    assert raw_out.getvalue() == raw_err.getvalue() == b"312 us -> clean ... caf\\xe9\n"


def test_a_latin1_stream_writes_what_it_can() -> None:
    # µ is in Latin-1: written as the terminal's own character; only what Latin-1 lacks is spelled.
    import codecs

    from nvmlcheck.cli import _output

    assert codecs.lookup_error(_output._ERRORS) is not None
    assert "312 µs …".encode("latin-1", _output._ERRORS) == b"312 \xb5s ..."


def test_a_utf8_stream_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck.cli import _output

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    monkeypatch.setattr(sys, "stdout", out)
    _output._usable_streams()
    assert out.errors == "strict"


def test_help_on_an_ascii_terminal_reads_us_not_an_escape() -> None:
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    out = subprocess.run([sys.executable, "-m", "nvmlcheck", "wait", "--help"], capture_output=True, timeout=120,
                         check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert b"100 us resolution" in out.stdout and b"\\x" not in out.stdout
