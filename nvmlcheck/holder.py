"""``python -m nvmlcheck.holder``: the GPU-holding child process, kept under this name for scripts and docs.

The code lives in :mod:`nvmlcheck.study.child`; this module re-exports it and runs its ``main``.
"""

from __future__ import annotations

from .study import child as _moved
from .study.child import *  # noqa: F403 - every public name of the moved module

__all__ = list(_moved.__all__)

if __name__ == "__main__":
    raise SystemExit(_moved.main())
