"""Moved to :mod:`nvmlcheck.study.compare` (``nvmlcheck study compare``); this module re-exports it for one
release."""

from __future__ import annotations

from .study import compare as _moved
from .study.compare import *  # noqa: F403 - every public name of the moved module, for one release

__all__ = list(_moved.__all__)
