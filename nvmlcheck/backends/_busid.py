"""One spelling of a PCI bus id for both backends: NVML's ``busId`` (``00000000:0A:00.0``).

Drivers and tools print the same address in several ways: an 8-digit domain (NVML, nvidia-smi's CSV and ``-q``), a
4-digit one (procfs, some nvidia-smi error lines, a stub or driver that fills ``busId`` with the legacy form), lower-
or upper-case hex. ``DeviceState.pci_bus_id`` is always :func:`canonical_bus_id`'s form, whichever backend read it,
so two snapshots of one GPU compare equal. Imports nothing: the NVML backend's one-shot path loads it.
"""

from __future__ import annotations

__all__ = ["canonical_bus_id"]

_HEX = frozenset("0123456789abcdefABCDEF")


def _hex(text: str, most: int) -> int | None:
    return int(text, 16) if 0 < len(text) <= most and all(c in _HEX for c in text) else None


def canonical_bus_id(text: str) -> str | None:
    """``0000:0a:00.0`` / ``00000000:0A:00.0`` -> ``00000000:0A:00.0`` (8-digit domain, upper-case hex): the form
    NVML's ``busId`` and nvidia-smi's ``pci.bus_id`` print. ``None`` when ``text`` is not ``domain:bus:device.function``
    in hex (at most 8, 2, 2 and 1 digits)."""
    domain, _, rest = text.strip().partition(":")
    bus, _, rest = rest.partition(":")
    device, _, function = rest.partition(".")
    parts = (_hex(domain, 8), _hex(bus, 2), _hex(device, 2), _hex(function, 1))
    if parts[0] is None or parts[1] is None or parts[2] is None or parts[3] is None:
        return None
    return f"{parts[0]:08X}:{parts[1]:02X}:{parts[2]:02X}.{parts[3]:X}"
