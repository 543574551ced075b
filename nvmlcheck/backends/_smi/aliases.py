"""The field names nvidia-smi answers to: every spelling mapped to one canonical name, and each field's unit.

The canonical name of a field is what driver 580 prints in the CSV header. The alias tables map every other
spelling (the short query names of ``--help-query-*``, and the names older drivers printed, such as
``clocks_throttle_reasons.*``) to it, so the parsers are keyed on meaning, never on spelling or column position.
:data:`CANONICAL_UNITS` is the unit nvidia-smi prints for a field: a header naming another unit is refused rather
than mis-scaled. Data only; :mod:`.table` reads it.
Rules and reasons: docs/backends.md, "How nvidia-smi output is read".
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "CANONICAL_UNITS",
    "COMPUTE_APPS_ALIASES",
    "FREE_TEXT",
    "QUERY_GPU_ALIASES",
    "REMAPPED_ROWS_ALIASES",
    "RETIRED_PAGES_ALIASES",
    "canonical_name",
]

_EVENT_REASON_SUFFIXES = (
    "supported",
    "active",
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
    "sync_boost",
)

#: ``--query-gpu`` spellings -> canonical header names.
QUERY_GPU_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "gpu_name": "name",
        "gpu_serial": "serial",
        "gpu_uuid": "uuid",
        "gpu_bus_id": "pci.bus_id",
        "clocks.gr": "clocks.current.graphics",
        "clocks.sm": "clocks.current.sm",
        "clocks.mem": "clocks.current.memory",
        "clocks.video": "clocks.current.video",
        "clocks.max.gr": "clocks.max.graphics",
        "clocks.max.mem": "clocks.max.memory",
        "clocks.applications.gr": "clocks.applications.graphics",
        "clocks.applications.mem": "clocks.applications.memory",
        "clocks.default_applications.gr": "clocks.default_applications.graphics",
        "clocks.default_applications.mem": "clocks.default_applications.memory",
        "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
        "retired_pages.dbe": "retired_pages.double_bit.count",
        "remapped_rows.sbe": "remapped_rows.correctable",
        "remapped_rows.dbe": "remapped_rows.uncorrectable",
        **{f"clocks_throttle_reasons.{s}": f"clocks_event_reasons.{s}" for s in _EVENT_REASON_SUFFIXES},
    }
)

#: ``--query-compute-apps`` spellings -> canonical header names.
COMPUTE_APPS_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"name": "process_name", "used_memory": "used_gpu_memory"}
)

#: ``--query-retired-pages`` spellings -> canonical header names (none are renamed on driver 580).
RETIRED_PAGES_ALIASES: Final[Mapping[str, str]] = MappingProxyType({})

#: ``--query-remapped-rows`` spellings -> canonical header names.
REMAPPED_ROWS_ALIASES: Final[Mapping[str, str]] = MappingProxyType(
    {"remapped_rows.sbe": "remapped_rows.correctable", "remapped_rows.dbe": "remapped_rows.uncorrectable"}
)

#: The unit nvidia-smi prints for a field (in the header as ``[MiB]``, after the value with ``csv``). A header that
#: names another unit for one of these fields is refused rather than mis-scaled.
CANONICAL_UNITS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "memory.total": "MiB",
        "memory.used": "MiB",
        "memory.free": "MiB",
        "memory.reserved": "MiB",
        "used_gpu_memory": "MiB",
        **{
            f"clocks.{group}.{domain}": "MHz"
            for group in ("current", "max", "applications", "default_applications")
            for domain in ("graphics", "sm", "memory", "video")
        },
        "power.draw": "W",
        "fan.speed": "%",
    }
)

# Columns whose text is chosen by a user (may contain commas); at most one per table is resolved.
FREE_TEXT: Final = frozenset({"name", "process_name", "gpu_name"})


def canonical_name(name: str, aliases: Mapping[str, str]) -> str:
    """The canonical (driver-580 header) name for a requested or printed field name."""
    return aliases.get(name, name)
