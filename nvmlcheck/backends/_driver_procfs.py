"""The driver's list of its GPUs in procfs: each GPU's minor number (the N of ``/dev/nvidiaN``).

``/proc/driver/nvidia/gpus/<PCI bus id>/information`` has, for every GPU the driver probed, lines such as
``GPU UUID:  GPU-…``, ``Bus Location:  0000:18:00.0`` and ``Device Minor:  0``. nvidia-smi's ``--query-gpu`` has no
minor-number field, so the nvidia-smi backend reads it here when nvidia-smi runs on this host (behind a prefix it runs
elsewhere, whose numbers are not in this ``/proc``). The minor number is what Slurm's GPU IDs name (docs/slurm.md);
NVML's index is PCI order, and the two differ on some hosts. Only :mod:`nvmlcheck.backends.smi` calls this.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

from .._text import is_digits

__all__ = ["GPUS_DIR", "DriverGpu", "normal_bus_id", "read_driver_gpus"]

#: Where the driver lists its GPUs, one directory per GPU named by its PCI bus id.
GPUS_DIR = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True, slots=True)
class DriverGpu:
    """One GPU as the driver lists it: ``uuid`` (``None`` when the file has none, or ``??`` before the GPU was
    initialised), ``bus_id`` (:func:`normal_bus_id`'s form), ``minor_number``."""

    uuid: str | None
    bus_id: str
    minor_number: int


def normal_bus_id(bus_id: str) -> str:
    """``00000000:18:00.0`` (NVML, nvidia-smi) and ``0000:18:00.0`` (procfs) as one form: ``0000:18:00.0``, lower
    case. A text that is not a bus id comes back lower-cased, so it matches nothing but itself."""
    domain, sep, rest = bus_id.strip().partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest.lower()}" if sep else bus_id.strip().lower()
    except ValueError:
        return bus_id.strip().lower()


def read_driver_gpus(gpus_dir: str | None = None) -> tuple[tuple[DriverGpu, ...], str | None]:
    """Every GPU ``gpus_dir`` (default :data:`GPUS_DIR`) lists, and why none could be read (``None`` when at least
    one was). A GPU whose file has no readable ``Device Minor`` (ASCII digits) is left out, and so are GPUs whose
    minor number, UUID or bus id another file claims too: a minor number that may be another GPU's is no answer."""
    root = GPUS_DIR if gpus_dir is None else gpus_dir
    try:
        names = sorted(os.listdir(root))
    except OSError as exc:
        return (), f"{root}: {exc.strerror or exc}"
    out: list[DriverGpu] = []
    for name in names:
        fields: dict[str, str] = {}
        try:
            with open(os.path.join(root, name, "information"), encoding="utf-8", errors="replace") as f:
                for line in f:
                    key, colon, value = line.partition(":")
                    if colon:
                        fields[key.strip()] = value.strip()
        except OSError:
            continue
        minor = fields.get("Device Minor", "")
        if not is_digits(minor) or len(minor) > 9:  # str.isdigit takes "²", which int() refuses
            continue
        uuid = fields.get("GPU UUID")
        out.append(DriverGpu(uuid if uuid and uuid.startswith("GPU-") else None,
                             normal_bus_id(fields.get("Bus Location") or name), int(minor)))
    # A minor number, UUID or bus id that two files claim names neither GPU for sure: both are left out.
    claims = Counter(k for g in out for k in {("minor", g.minor_number), ("uuid", g.uuid), ("bus", g.bus_id)})
    out = [g for g in out if all(claims[k] == 1 for k in (("minor", g.minor_number), ("bus", g.bus_id)))
           and (g.uuid is None or claims["uuid", g.uuid] == 1)]
    return tuple(out), None if out else f"{root} lists no GPU with a device minor number of its own"
