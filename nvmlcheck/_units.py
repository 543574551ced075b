"""Byte counts for people, both ways: the one formatter and the one parser of sizes (``16GiB``) the CLI, the
predicates' reasons and the study share.

Nothing is imported at load (re only when a size is parsed), so the CLI can use it without giving up its lean
start.
"""

from __future__ import annotations

__all__ = ["MAX_BYTES", "format_bytes", "parse_size"]

#: The largest byte count a size may name (2**64: what NVML's counters hold); more is a typo.
MAX_BYTES = 1 << 64

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40, "p": 1 << 50, "pib": 1 << 50, "e": 1 << 60, "eib": 1 << 60,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15, "eb": 10**18}


def format_bytes(n: int) -> str:
    """``n`` bytes for a person: ``"16.0 GiB"``, ``"615.0 MiB"``, ``"4.0 KiB"``, ``"512 B"``, up to ``"15.0 EiB"``."""
    sign = "-" if n < 0 else ""
    a = abs(n)
    if a < 1 << 10:
        return f"{sign}{a} B"
    for unit, shift in (("KiB", 10), ("MiB", 20), ("GiB", 30), ("TiB", 40), ("PiB", 50)):
        # The unit is chosen on the figure as printed: a byte short of 1 GiB rounds to "1024.0 MiB", which is
        # "1.0 GiB".
        figure = f"{a / (1 << shift):.1f}"
        if float(figure) < 1024:
            return f"{sign}{figure} {unit}"
    return f"{sign}{a / (1 << 60):.1f} EiB"


def parse_size(text: str) -> int:
    """``"16GiB"`` → 17179869184. Accepts B, KiB, MiB, GiB, TiB, PiB, EiB (K/M/G/T/P/E mean the binary units, powers
    of 2) and KB/MB/GB/TB/PB/EB (decimal, powers of 10: ``"16GB"`` is 16,000,000,000); any case. Exact: the digits are
    read as a fraction, never through a float (``9007199254740993`` is that many bytes, not one less)."""
    import re  # only when a size is given: the CLI parses --max-used with this

    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*([a-zA-Z]*)\s*", text, re.ASCII)  # 0-9 only, not "٣"
    if not m or m[3].lower() not in _UNITS:
        from .errors import ArgumentError

        raise ArgumentError(f"not a size: {text!r} (examples: 1GiB, 512MiB, 1073741824)")
    digits: str = m[2] or ""
    if len(m[1]) + len(digits) > 64:  # a digit string this long is a paste error, and would cost big-int work
        from .errors import ArgumentError

        raise ArgumentError(f"size too large: {text!r} (at most 16 EiB, 2**64 bytes)")
    scale: int = 10 ** len(digits)  # (int ** int is Any to mypy: a negative power is a float)
    value: int = int(m[1] + digits) * _UNITS[m[3].lower()]  # the size is value / scale bytes, exactly
    if value >= MAX_BYTES * scale:
        from .errors import ArgumentError

        raise ArgumentError(f"size too large: {text!r} (at most 16 EiB, 2**64 bytes)")
    if value == 0:
        from .errors import ArgumentError

        raise ArgumentError(f"size must be positive: {text!r}")
    whole, rest = value // scale, value % scale
    if rest:
        nearest = whole + (2 * rest >= scale)
        if abs(value - nearest * scale) * 10**6 < value:  # 0.9GiB: a byte less is nothing; 0.1KiB (102.4 B) is
            return nearest
        from .errors import ArgumentError  # 1.5B (or 1.5) is no size

        raise ArgumentError(f"not a whole number of bytes: {text!r}")
    return whole
