"""Backends: where the facts come from.

A backend reads devices and returns :mod:`nvmlcheck.model` objects. Two exist:

* ``"nvml"`` (:mod:`nvmlcheck.backends.nvml`): libnvidia-ml through cffi, microseconds per query.
* ``"smi"`` (:mod:`nvmlcheck.backends.smi`): runs ``nvidia-smi`` (optionally behind a prefix such as ``ssh host``)
  and parses its CSV, tens of milliseconds per poll.

:func:`open_backend` picks one; ``"auto"`` tries NVML first, then nvidia-smi, and never silently a simulator.
Every field from each backend, what nvidia-smi cannot give, and the measured costs: docs/backends.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..errors import ArgumentError

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from ._protocol import Backend as Backend
else:

    def __getattr__(name: str) -> object:
        # The Backend protocol (a typing.Protocol) is made on first use: a one-shot check never needs it.
        if name == "Backend":
            from ._protocol import Backend

            globals()["Backend"] = Backend
            return Backend
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKEND_NAMES", "DEFAULT_INIT_TIMEOUT_S", "MIN_INIT_TIMEOUT_S", "SMI_RUN_TIMEOUT_S", "Backend", "init_timeout_for",
    "open_backend",
]

#: The names :func:`open_backend` accepts.
BACKEND_NAMES = ("auto", "nvml", "smi")

#: The deadline of one nvidia-smi run unless told otherwise (here, not in smi.py, so that the rule that bounds
#: opening by a timeout, session.open_timeouts, reads it without loading the nvidia-smi parsers).
SMI_RUN_TIMEOUT_S = 10.0

# The init's bounds live here too (not in nvml.py, which needs cffi): opening reads them before any backend loads.
#: Seconds ``nvmlInit`` may take before opening gives up with :class:`~nvmlcheck.Timeout` (it can hang on a wedged
#: driver: go-nvml #152); ``"auto"`` then falls back to nvidia-smi. A cold init takes milliseconds
#: (docs/driver-facts.md).
DEFAULT_INIT_TIMEOUT_S = 10.0
#: The least time ``nvmlInit`` gets when a caller's timeout bounds it (:func:`init_timeout_for`): many times a cold
#: init (docs/driver-facts.md), while ``timeout=0`` ("check once") still returns within a fraction of a second.
MIN_INIT_TIMEOUT_S = 0.25


def init_timeout_for(timeout: float | None) -> float:
    """How long ``nvmlInit`` may take in a call that ``timeout`` seconds bound, opening included: half of it (so
    ``"auto"`` still has time to try nvidia-smi when the init hangs), at least :data:`MIN_INIT_TIMEOUT_S` (0.25 s,
    so that ``timeout=0``, "check once", can still open NVML) and at most :data:`DEFAULT_INIT_TIMEOUT_S` (10 s).
    ``None`` gets the default; every finite timeout, 0 included, bounds the init."""
    if timeout is None or isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout):
        return DEFAULT_INIT_TIMEOUT_S  # None, NaN, or a bad value the wait itself refuses
    return min(DEFAULT_INIT_TIMEOUT_S, max(MIN_INIT_TIMEOUT_S, float(timeout) / 2))


def open_backend(
    backend: str = "auto",
    *,
    smi_command: Sequence[str] | str | None = None,
    smi_prefix: Sequence[str] | str | None = None,
    smi_timeout_s: float | None = None,
    library_path: str | None = None,
    init_timeout_s: float | None = None,
) -> Backend:
    """Open a backend by name.

    ``"nvml"`` loads libnvidia-ml (``library_path``, else ``libnvidia-ml.so.1``, then ``libnvidia-ml.so``;
    ``$NVMLCHECK_LIBNVML`` only for nvmlcheck's stub) and initialises it, waiting at most ``init_timeout_s`` for
    ``nvmlInit`` (default :data:`~nvmlcheck.backends.nvml.DEFAULT_INIT_TIMEOUT_S`). ``"smi"`` checks that nvidia-smi
    answers. ``"auto"`` tries NVML, then nvidia-smi (also when NVML's init failed or hung past its timeout), and raises
    :class:`~nvmlcheck.BackendUnavailable` listing why each failed.
    """
    from ..errors import ArgumentTypeError, BackendUnavailable, NvmlCheckError

    if backend not in BACKEND_NAMES:
        raise ArgumentError(f"unknown backend {backend!r}; choose one of {', '.join(BACKEND_NAMES)}")
    attempts: list[str] = []

    def record(name: str, exc: NvmlCheckError) -> None:
        # Keep nested attempts readable: "nvml: <what>" then its own attempts, indented under it.
        if isinstance(exc, BackendUnavailable) and exc.attempts:
            attempts.append(f"{name}: {getattr(exc, 'message', exc)}")
            attempts.extend(f"{name}: {a}" for a in exc.attempts)
        else:
            attempts.append(f"{name}: {exc}")

    if backend in ("auto", "nvml"):
        try:
            return _nvml_backend(library_path, DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s)
        except (ArgumentError, ArgumentTypeError):
            raise  # the caller's mistake: "auto" must not fall back past it to nvidia-smi
        except NvmlCheckError as exc:
            if backend == "nvml":
                raise
            record("nvml", exc)
    if backend in ("auto", "smi"):
        try:
            from .smi import SmiBackend
        except ImportError as exc:  # pragma: no cover - the smi backend ships with the package
            attempts.append(f"smi: not available in this installation ({exc})")
        else:
            try:
                return SmiBackend(command=smi_command, prefix=smi_prefix, timeout_s=smi_timeout_s)
            except (ArgumentError, ArgumentTypeError):
                raise  # the caller's mistake, never a backend that "could not be opened"
            except NvmlCheckError as exc:
                if backend == "smi":
                    raise
                record("smi", exc)
    raise BackendUnavailable("no GPU backend could be opened", attempts)


def _nvml_backend(library_path: str | None, init_timeout_s: float) -> Backend:
    """The NVML backend; :class:`~nvmlcheck.BackendUnavailable` where this Python has no cffi (``"auto"`` then
    tries nvidia-smi), rather than an ImportError from deep inside."""
    from ..errors import BackendUnavailable

    try:
        from .nvml import NvmlBackend
    except ImportError as missing:
        if missing.name not in ("_cffi_backend", "cffi"):
            raise
        raise BackendUnavailable("the NVML backend needs cffi, which this Python cannot import: install it (pip "
                                 "install cffi) or use --backend smi", [f"cffi: {missing}"]) from None
    return NvmlBackend(library_path=library_path, init_timeout_s=init_timeout_s)
