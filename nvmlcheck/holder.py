"""``python -m nvmlcheck.holder``: the GPU-holding child process, kept under this name for scripts and docs.

The code lives in :mod:`nvmlcheck.study.child`; this module re-exports it and runs its ``main``.
"""

from __future__ import annotations

from .study.child import (
    HOLDER_KINDS,
    CudaError,
    HeldState,
    format_steps,
    hold,
    main,
    parse_size,
    parse_steps,
    release,
)

__all__ = ["HOLDER_KINDS", "CudaError", "HeldState", "format_steps", "hold", "main", "parse_size", "parse_steps",
           "release"]

if __name__ == "__main__":
    raise SystemExit(main())
