"""Byte counts for people: the one formatter the CLI's tables, the predicates' reasons and the study share.

No imports, so the CLI's output module can use it without giving up its lean start.
"""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: int) -> str:
    """``n`` bytes for a person: ``"16.0 GiB"``, ``"615.0 MiB"``, ``"4.0 KiB"``, ``"512 B"``."""
    sign = "-" if n < 0 else ""
    a = abs(n)
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if a >= 1 << shift:
            return f"{sign}{a / (1 << shift):.1f} {unit}"
    return f"{sign}{a} B"
