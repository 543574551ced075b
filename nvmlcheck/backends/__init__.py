"""Backends: where the facts come from.

A backend reads devices and returns :mod:`nvmlcheck.model` objects. Two exist:

* ``"nvml"`` (:mod:`nvmlcheck.backends.nvml`): libnvidia-ml through cffi, microseconds per query.
* ``"smi"`` (:mod:`nvmlcheck.backends.smi`): runs ``nvidia-smi`` (optionally behind a prefix such as ``ssh host``)
  and parses its CSV, tens of milliseconds per poll.

:func:`open_backend` picks one; ``"auto"`` tries NVML first, then nvidia-smi, and never silently a simulator.
Every field from each backend, what nvidia-smi cannot give, and the measured costs: docs/backends.md.
"""

from __future__ import annotations

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


__all__ = ["BACKEND_NAMES", "Backend", "open_backend"]

#: The names :func:`open_backend` accepts.
BACKEND_NAMES = ("auto", "nvml", "smi")

#: The deadline of one nvidia-smi run unless told otherwise (here, not in smi.py, so that the rule that bounds
#: opening by a timeout, session.open_timeouts, reads it without loading the nvidia-smi parsers).
SMI_RUN_TIMEOUT_S = 10.0


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
    from ..errors import BackendUnavailable, NvmlCheckError

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
        from .nvml import DEFAULT_INIT_TIMEOUT_S, NvmlBackend

        try:
            return NvmlBackend(
                library_path=library_path,
                init_timeout_s=DEFAULT_INIT_TIMEOUT_S if init_timeout_s is None else init_timeout_s,
            )
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
            except NvmlCheckError as exc:
                if backend == "smi":
                    raise
                record("smi", exc)
    raise BackendUnavailable("no GPU backend could be opened", attempts)
