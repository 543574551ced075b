"""Test helpers: a stub libnvidia-ml that answers from a scenario, for test suites on machines without a GPU.

nvmlcheck ships the C source of a stub ``libnvidia-ml.so.1``. Built against the real ``nvml.h`` (it needs a C
compiler and ``nvidia-nvml-dev``; builds are cached), it behaves like a driver whose state comes from a *scenario*:
devices, processes (optionally bound to real PIDs, so killing a child process "frees" its GPU memory), a timeline
of changes, injected faults and older-driver variants. nvmlcheck's real NVML path runs against it unchanged, and
:mod:`nvmlcheck.testing.pytest_plugin` provides pytest fixtures. docs/testing.md shows both at work, with the build
and the environment variables; ``stubs/README.md`` is the scenario format.

>>> from nvmlcheck.testing import Scenario, use_stub
>>> scenario = Scenario.h200()
>>> scenario.add_process(0, pid=4123456, used_bytes=2**30)
>>> with use_stub(scenario) as stub:                                    # doctest: +SKIP
...     import nvmlcheck
...     with nvmlcheck.open(backend="nvml") as gpus:
...         ...

The implementation is the private package ``nvmlcheck._sim``; this module is its public face.
"""

from __future__ import annotations

__all__ = [
    "CLOCK_DOMAINS",
    "ClockDomain",
    "DEVICE_FIELDS",
    "NVML_FUNCTIONS",
    "PROCESS_KINDS",
    "ProcessKindName",
    "STUB_VARIANTS",
    "UNSUPPORTED_FIELDS",
    "LogEntry",
    "Scenario",
    "StubBuildError",
    "StubProbe",
    "StepClock",
    "StubSession",
    "TimelineStep",
    "build_stub",
    "find_nvml_header",
    "read_call_log",
    "stub_environment",
    "stub_source_dir",
    "use_stub",
]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._sim.build import StubBuildError, build_stub, find_nvml_header, stub_source_dir
    from .._sim.calllog import LogEntry, read_call_log
    from .._sim.clock import StepClock
    from .._sim.probe import StubProbe
    from .._sim.scenario import (
        CLOCK_DOMAINS,
        DEVICE_FIELDS,
        PROCESS_KINDS,
        UNSUPPORTED_FIELDS,
        ClockDomain,
        ProcessKindName,
        Scenario,
        TimelineStep,
    )
    from .._sim.session import StubSession, stub_environment, use_stub
    from .._sim.symbols import NVML_FUNCTIONS, STUB_VARIANTS

    # Deprecated: the earlier name of ProcessKindName, left out of __all__ so that ``from nvmlcheck.testing
    # import *`` no longer shadows nvmlcheck.ProcessKind (the model's enum). It still imports.
    ProcessKind = ProcessKindName

# Each name -> the private module that defines it. Resolved on first use: the pytest plugin lives in this package,
# so every pytest run where nvmlcheck is installed imports this module, and it must cost next to nothing.
_LAZY: dict[str, str] = {
    **dict.fromkeys(("StubBuildError", "build_stub", "find_nvml_header", "stub_source_dir"), "build"),
    **dict.fromkeys(("LogEntry", "read_call_log"), "calllog"),
    "StubProbe": "probe",
    "StepClock": "clock",
    **dict.fromkeys(("CLOCK_DOMAINS", "DEVICE_FIELDS", "PROCESS_KINDS", "UNSUPPORTED_FIELDS", "ClockDomain",
                     "ProcessKindName", "Scenario", "TimelineStep"), "scenario"),
    **dict.fromkeys(("StubSession", "stub_environment", "use_stub"), "session"),
    **dict.fromkeys(("NVML_FUNCTIONS", "STUB_VARIANTS"), "symbols"),
}
_ALIASES = {"ProcessKind": "ProcessKindName"}

if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        import importlib

        target = _ALIASES.get(name, name)
        module = _LAZY.get(target)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"nvmlcheck._sim.{module}"), target)
        globals()[name] = value  # once: later lookups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
