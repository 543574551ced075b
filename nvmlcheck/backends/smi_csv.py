"""Compatibility: the nvidia-smi parsers' public names, re-exported from where they now live.

The parsers were split into the private package :mod:`nvmlcheck.backends._smi` (one module per job: shared text
rules, field aliases, the CSV engine, the CSV queries, the ``-q`` text parser, ``--version``/``-L``) and the model
assembly moved beside the backend (:mod:`nvmlcheck.backends._smi_state`). Every name this module had stays
importable from here, as the same object.
"""

from __future__ import annotations

from ._smi.aliases import (
    CANONICAL_UNITS,
    COMPUTE_APPS_ALIASES,
    QUERY_GPU_ALIASES,
    REMAPPED_ROWS_ALIASES,
    RETIRED_PAGES_ALIASES,
    canonical_name,
)
from ._smi.pids import PidsListing, parse_pids_query
from ._smi.queries import (
    GpuRecord,
    ProcessListing,
    RetiredListing,
    parse_compute_apps,
    parse_query_gpu,
    parse_remapped_rows,
    parse_retired_pages,
)
from ._smi.small import cuda_version_number, parse_list_gpus, parse_version_output
from ._smi.table import Column, Row, Table, parse_table
from ._smi.text import (
    PID_MAX_LIMIT,
    PLACEHOLDER_MEANINGS,
    HandleFailure,
    Unavailable,
    has_handle_failure,
    normalize_pci_bus_id,
    strip_deprecation,
)
from ._smi_state import ProcessLists, build_device_state

__all__ = [
    "CANONICAL_UNITS",
    "COMPUTE_APPS_ALIASES",
    "PID_MAX_LIMIT",
    "PLACEHOLDER_MEANINGS",
    "QUERY_GPU_ALIASES",
    "REMAPPED_ROWS_ALIASES",
    "RETIRED_PAGES_ALIASES",
    "Column",
    "GpuRecord",
    "HandleFailure",
    "PidsListing",
    "ProcessListing",
    "ProcessLists",
    "RetiredListing",
    "Row",
    "Table",
    "Unavailable",
    "build_device_state",
    "canonical_name",
    "cuda_version_number",
    "has_handle_failure",
    "normalize_pci_bus_id",
    "parse_compute_apps",
    "parse_list_gpus",
    "parse_pids_query",
    "parse_query_gpu",
    "parse_remapped_rows",
    "parse_retired_pages",
    "parse_table",
    "parse_version_output",
    "strip_deprecation",
]
