"""Reading the stub's own counters (its ``stub_*`` symbols) through ctypes, in the process that loaded it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["StubProbe"]


class StubProbe:
    """Reads the stub's ``stub_*`` test symbols through ctypes.

    ``dlopen`` of the same path returns the already-loaded library, so a probe sees the same state as nvmlcheck's
    own handle on that library (call counts, init reference count, last scenario error). Raises ``ValueError`` for
    a library that is not the stub.
    """

    def __init__(self, library_path: str | os.PathLike[str]) -> None:
        import ctypes  # here, not at import: nvmlcheck.testing (and the pytest plugin) load this module

        self.library_path = Path(library_path)
        lib = ctypes.CDLL(os.fspath(library_path))
        if not hasattr(lib, "stub_call_count"):  # a real libnvidia-ml, or any other library
            from ..errors import ArgumentError

            raise ArgumentError(f"{library_path} is not nvmlcheck's stub libnvidia-ml (it exports no stub_* "
                                "counters): pass StubSession.library_path or build_stub()'s result")
        lib.stub_call_count.argtypes = [ctypes.c_char_p]
        lib.stub_call_count.restype = ctypes.c_ulonglong
        for name in ("stub_init_refcount", "stub_init_total", "stub_shutdown_total"):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = ctypes.c_int
        lib.stub_last_error.argtypes = []
        lib.stub_last_error.restype = ctypes.c_char_p
        lib.stub_loaded_ns.argtypes = []
        lib.stub_loaded_ns.restype = ctypes.c_ulonglong
        self._lib = lib

    def call_count(self, fn: str | None = None) -> int:
        """Calls to ``fn`` (all NVML calls when ``None``) since the library was loaded into this process."""
        return int(self._lib.stub_call_count(None if fn is None else fn.encode()))

    def init_refcount(self) -> int:
        """The current NVML reference count (0 in a forked child that has not initialised)."""
        return int(self._lib.stub_init_refcount())

    def init_total(self) -> int:
        """Successful ``nvmlInit*`` calls since load."""
        return int(self._lib.stub_init_total())

    def shutdown_total(self) -> int:
        """Successful ``nvmlShutdown`` calls since load."""
        return int(self._lib.stub_shutdown_total())

    def loaded_ns(self) -> int:
        """``time.monotonic_ns()`` reading at which the current scenario was loaded (the origin of ``at_ms``
        changes); 0 when NVML is not initialised."""
        return int(self._lib.stub_loaded_ns())

    def last_error(self) -> str:
        """The last scenario error (file, line and problem), or ``""``."""
        raw: bytes | None = self._lib.stub_last_error()
        return (raw or b"").decode(errors="replace")
