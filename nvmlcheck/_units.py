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
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40, "tb": 10**12}


def format_bytes(n: int) -> str:
    """``n`` bytes for a person: ``"16.0 GiB"``, ``"615.0 MiB"``, ``"4.0 KiB"``, ``"512 B"``."""
    sign = "-" if n < 0 else ""
    a = abs(n)
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if a >= 1 << shift:
            return f"{sign}{a / (1 << shift):.1f} {unit}"
    return f"{sign}{a} B"


def parse_size(text: str) -> int:
    """``"16GiB"`` → 17179869184. Accepts B, KiB, MiB, GiB, TiB (K/M/G/T mean the binary units, powers of 2) and
    KB/MB/GB/TB (decimal, powers of 10: ``"16GB"`` is 16,000,000,000); any case."""
    import re  # only when a size is given: the CLI parses --max-used with this

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text, re.ASCII)  # 0-9 only, not "٣"
    if not m or m[2].lower() not in _UNITS:
        from .errors import ArgumentError

        raise ArgumentError(f"not a size: {text!r} (examples: 1GiB, 512MiB, 1073741824)")
    value = float(m[1]) * _UNITS[m[2].lower()]
    if not value < MAX_BYTES:  # inf too: 400 digits overflow a float
        from .errors import ArgumentError

        raise ArgumentError(f"size too large: {text!r} (at most 16 EiB)")
    if value <= 0:
        from .errors import ArgumentError

        raise ArgumentError(f"size must be positive: {text!r}")
    if value != int(value):
        if abs(value - round(value)) < value * 1e-6:  # 0.9GiB: a byte less is nothing; 0.1KiB (102.4 B) is
            return round(value)
        from .errors import ArgumentError  # 1.5B (or 1.5) is no size

        raise ArgumentError(f"not a whole number of bytes: {text!r}")
    return int(value)
