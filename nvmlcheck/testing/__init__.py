"""Test helpers: a stub libnvidia-ml that answers from a scenario, for test suites on machines without a GPU.

nvmlcheck ships the C source of a stub ``libnvidia-ml.so.1`` (``stubs/stub_nvml.c``; its contract is
``stubs/README.md``). Compiled against the real ``nvml.h`` from the ``nvidia-nvml-dev`` package, it exports the NVML
symbols nvmlcheck uses and behaves like a driver whose state comes from a small text *scenario* file: devices,
processes (optionally bound to real PIDs, so killing a child process "frees" its GPU memory), a timeline of changes,
injected faults and older-driver build variants. nvmlcheck's real NVML path (cffi) runs against it unchanged.

>>> from nvmlcheck.testing import Scenario, use_stub
>>> scenario = Scenario.h200()
>>> scenario.add_process(0, pid=4123456, used_bytes=2**30)
>>> scenario.at_call(10).remove_process(0, pid=4123456)
>>> with use_stub(scenario) as stub:                                    # doctest: +SKIP
...     import nvmlcheck
...     with nvmlcheck.open(backend="nvml") as gpus:
...         ...
...     stub.call_counts()["nvmlInit_v2"]

For pytest, :mod:`nvmlcheck.testing.pytest_plugin` (registered as a ``pytest11`` entry point) provides fixtures:
``nvml_scenario``, ``nvml_stub``, ``nvml_bound_process``, ``fake_nvidia_smi`` (docs/testing.md).

Building needs a C compiler (``cc`` argument, else ``$CC``, else ``cc`` or ``gcc``) and ``nvidia-nvml-dev``
(``pip install nvidia-nvml-dev``). Builds are cached (``$NVMLCHECK_STUB_CACHE``, default
``~/.cache/nvmlcheck/stub``), keyed by source, header, variant macros and compiler.

Environment variables: ``NVMLCHECK_LIBNVML`` (the library nvmlcheck's NVML backend loads),
``NVMLCHECK_STUB_SCENARIO`` (the scenario the stub reads at ``nvmlInit``), ``NVMLCHECK_STUB_LOG`` (the stub's call
log), ``NVMLCHECK_NVML_H`` (overrides the ``nvml.h`` the build uses).

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
