"""Moved to :mod:`nvmlcheck.study.compare` (``nvmlcheck study compare``); this module re-exports it for one
release."""

from __future__ import annotations

from .study.compare import (
    CELL_PARTS,
    COMPARE_SCHEMA,
    COMPARE_VERSION,
    MIN_N,
    CellComparison,
    Comparison,
    bootstrap_median_difference,
    compare_records,
    format_comparison,
    outliers,
    repeats_to_resolve,
)

__all__ = [
    "COMPARE_SCHEMA",
    "CELL_PARTS",
    "COMPARE_VERSION",
    "MIN_N",
    "CellComparison",
    "Comparison",
    "bootstrap_median_difference",
    "compare_records",
    "format_comparison",
    "outliers",
    "repeats_to_resolve",
]
