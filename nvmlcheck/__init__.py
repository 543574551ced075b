"""nvmlcheck: tell precisely and fast whether NVIDIA GPUs are clean, and when they became clean.

>>> import nvmlcheck as nc
>>> with nc.open() as gpus:                                   # doctest: +SKIP
...     snap = gpus.snapshot()
...     used = snap.devices[0].memory.used_bytes
...     res = gpus.wait_until_clean(timeout=30.0)

The NVML backend reads libnvidia-ml through cffi; the nvidia-smi backend is the fallback. See ``docs/`` for the
full reference.
"""

from __future__ import annotations

import importlib

# Names resolve on first use (PEP 562): `import nvmlcheck` stays cheap for launch scripts and for tools that import
# it without calling it; dataclass and enum creation alone cost ~20 ms, and even `typing` costs ~10 ms where site
# has not loaded it, so this file imports neither (types: __init__.pyi). docs/performance.md has the figures.
_LAZY: dict[str, str] = {
    "AlreadyInitialized": "errors",
    "ArgumentVersionMismatch": "errors",
    "BackendUnavailable": "errors",
    "BaselineNotClean": "study",
    "ClockEventReason": "model",
    "ClockSet": "model",
    "Clocks": "model",
    "CorruptData": "errors",
    "CorruptedInforom": "errors",
    "CudaDevice": "cudamap",
    "CudaMapping": "cudamap",
    "CudaMappingError": "cudamap",
    "Deprecated": "errors",
    "DeviceFailure": "model",
    "DeviceSelector": "session",
    "DeviceState": "model",
    "DriverNotLoaded": "errors",
    "EventKind": "events",
    "EventListener": "events",
    "Fields": "model",
    "FreqNotSupported": "errors",
    "FunctionNotFound": "errors",
    "GpuEvent": "events",
    "GpuFault": "errors",
    "GpuIdentity": "cudamap",
    "GpuLost": "errors",
    "GpuNotFound": "errors",
    "GpuProcess": "model",
    "GpuRequiresReset": "errors",
    "GpuUse": "holders",
    "Holder": "holders",
    "HolderError": "study",
    "InUse": "errors",
    "InsufficientPower": "errors",
    "InsufficientResources": "errors",
    "InsufficientSize": "errors",
    "InvalidArgument": "errors",
    "InvalidState": "errors",
    "IrqIssue": "errors",
    "KillError": "kill",
    "KillPlan": "kill",
    "KillResult": "kill",
    "KillSelection": "holders",
    "KillTimeout": "kill",
    "LibraryNotFound": "errors",
    "LibraryVersionMismatch": "errors",
    "LockSet": "locks",
    "MIB": "model",
    "Memory": "model",
    "MemoryHealth": "model",
    "MigDevice": "model",
    "NoData": "errors",
    "NoPermission": "errors",
    "NotFound": "errors",
    "NotReady": "errors",
    "NotSupported": "errors",
    "NvmlCheckError": "errors",
    "NvmlError": "errors",
    "NvmlMemoryError": "errors",
    "OperatingSystemError": "errors",
    "PidTimes": "kill",
    "PollPolicy": "wait",
    "Predicate": "predicates",
    "ProcessKind": "model",
    "RemappedRows": "model",
    "ResetTypeNotSupported": "errors",
    "RetiredPage": "model",
    "RetirementCause": "model",
    "SelectTimeout": "selection",
    "Selection": "selection",
    "Session": "session",
    "SignalSent": "kill",
    "SmiError": "errors",
    "SmiParseError": "errors",
    "SmiTimeout": "errors",
    "SmiTransportError": "errors",
    "Snapshot": "model",
    "StudyConfig": "study",
    "StudyError": "study",
    "SystemInfo": "model",
    "Timeout": "errors",
    "TracePoint": "wait",
    "Uninitialized": "errors",
    "Unknown": "errors",
    "Verdict": "predicates",
    "VgpuEccNotSupported": "errors",
    "WaitResult": "wait",
    "WaitTimeout": "errors",
    "always": "predicates",
    "cuda_mapping": "cudamap",
    "default_predicate": "predicates",
    "explain_unseen_holders": "holders",
    "find_holders": "holders",
    "kill_and_wait": "kill",
    "memory_back_to": "predicates",
    "memory_used_at_most": "predicates",
    "never": "predicates",
    "no_processes": "predicates",
    "on_devices": "predicates",
    "open": "session",
    "pids_gone": "predicates",
    "poll_until": "wait",
    "prepare_kill": "kill",
    "run_study": "study",
    "select_clean": "selection",
    "select_kill_holders": "holders",
    "wait_until_clean": "session",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nvmlcheck' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

# The public names are exactly the lazy ones (plus the version); __init__.pyi lists them for type checkers, and
# tests/unit/test_public_api.py checks that the two agree.
__all__ = [*sorted(_LAZY), "__version__"]  # noqa: PLE0604 - built from the table above, all str
