"""_text.printable escapes every character that is not printable, not only control and bidi characters: a zero-width
space made two process names look one, and a lone surrogate (a file name or command line whose bytes are not UTF-8)
failed the write on a strict UTF-8 stream or wrote the raw byte on a surrogate-escaping one."""

from __future__ import annotations

import sys

import pytest

from nvmlcheck._text import printable, printable_lines


@pytest.mark.parametrize(("text", "shown"), [
    ("python\u200b3", "python\\u200b3"),  # zero-width space (Cf)
    ("\ufeffname", "\\ufeffname"),  # BOM / zero-width no-break space
    ("soft\u00adhyphen", "soft\\xadhyphen"),
    ("tag\U000e0041", "tag\\U000e0041"),
    ("no\u00a0break", "no\\xa0break"),  # a no-break space reads as a space
    ("r\udcff.jsonl", "r\\udcff.jsonl"),  # os.fsdecode of b"r\xff.jsonl"
    ("private\ue000", "private\\ue000"),
    ("a\tb\x7f\x9b\u202e\u2066\u2028z", "a\\x09b\\x7f\\x9b\\u202e\\u2066\\u2028z"),  # as before
])
def test_every_character_that_is_not_printable_is_escaped(text: str, shown: str) -> None:
    assert printable(text) == shown
    assert printable(shown) == shown  # what is shown is printable as it is


def test_printable_text_is_left_alone_and_lines_keep_their_newlines() -> None:
    kept = "python3 train.py --lr 1e-3 µs é 漢字 训练 🚀"
    assert printable(kept) == kept
    assert printable_lines("one\ntwo\u200b") == "one\ntwo\\u200b"


def test_an_escaped_surrogate_writes_on_a_strict_utf8_stream() -> None:
    import io

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")
    out.write(printable(b"r\xff.jsonl".decode(sys.getfilesystemencoding(), "surrogateescape")))
    out.flush()
