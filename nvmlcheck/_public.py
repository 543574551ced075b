"""The one list of what ``import nvmlcheck`` offers, and the generator of the two files that repeat it.

:data:`EXPORTS` names, module by module, the top-level public names; each must also be in its module's ``__all__``
(a module may offer more than the top level does). :data:`DEPRECATED` names still resolve at the top level for one
more release, with a ``DeprecationWarning``, but are not in ``__all__``. :data:`TESTING` does the same for
``nvmlcheck.testing``, the public face of the private ``nvmlcheck._sim``.

    python -m nvmlcheck._public [--write] # rewrite the generated parts (__init__.py, __init__.pyi, testing)
    python -m nvmlcheck._public --check   # exit 1 when either is not what this list says (CI runs it)

``__init__.py`` never imports this module: the generated table is a literal, so ``import nvmlcheck`` stays cheap.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

__all__ = [
    "DEPRECATED", "EXPORTS", "NOT_STAR", "TESTING", "TESTING_ALIASES", "check", "render_init", "render_stub",
    "render_testing",
]

EXPORTS: dict[str, tuple[str, ...]] = {
    "cudamap": ("CudaDevice", "CudaMapping", "CudaMappingError", "GpuIdentity", "cuda_mapping"),
    "errors": (
        "AlreadyInitialized", "ArgumentError", "ArgumentTypeError", "ArgumentVersionMismatch", "BackendUnavailable",
        "CorruptData", "CorruptedInforom", "Deprecated", "DriverNotLoaded", "FreqNotSupported", "FunctionNotFound",
        "GpuFault", "GpuLost", "GpuNotFound", "GpuRequiresReset", "InUse", "InsufficientPower", "InsufficientResources",
        "InsufficientSize", "InvalidArgument", "InvalidState", "IrqIssue", "LibraryNotFound", "LibraryVersionMismatch",
        "NoData", "NoPermission", "NoSuchDevice", "NoSuchProcess", "NotFound", "NotReady", "NotSupported",
        "NvmlCheckError", "NvmlError", "NvmlMemoryError", "OperatingSystemError", "ResetTypeNotSupported",
        "SessionClosed", "SmiError", "SmiParseError", "SmiTimeout", "SmiTransportError", "SmiTransportTimeout",
        "StateError", "Timeout", "Uninitialized", "Unknown", "VgpuEccNotSupported", "WaitTimeout",
    ),
    "events": ("EventKind", "EventListener", "GpuEvent"),
    "holders": (
        "GpuUse", "Holder", "HoldersIncomplete", "KillSelection", "explain_unseen_holders", "find_holders",
        "select_kill_holders",
    ),
    "kill": (
        "KillError", "KillPlan", "KillResult", "KillTimeout", "PidTimes", "SignalSent", "kill_and_wait", "prepare_kill",
        "NotPermitted", "ProcessGone",
    ),
    "released": ("not_ours", "targets_released"),
    "locks": ("LockDirError", "LockSet"),
    "model": (
        "ClockEventReason", "ClockSet", "Clocks", "DeviceFailure", "DeviceState", "Fields", "GIB", "GpuProcess",
        "Health", "HealthCause", "MIB", "Memory", "MemoryHealth", "MigDevice", "OperatorAction", "ProcessKind",
        "RecoveryAction", "RemappedRows", "RetiredPage", "RetirementCause", "Snapshot", "SystemInfo",
    ),
    "predicates": (
        "DevicePredicate", "Predicate", "SnapshotPredicate", "Verdict", "always", "default_predicate", "memory_back_to",
        "memory_free_at_least", "memory_used_at_most", "never", "no_processes", "on_devices", "pids_gone",
    ),
    "readiness": ("ready",),
    "selection": ("SelectTimeout", "Selection", "select_clean"),
    "session": ("DeviceSelector", "Session", "open", "wait_until_clean"),
    "verdict": ("Culprit", "GpuVerdict", "ReadyReport"),
    "wait": ("PollPolicy", "TracePoint", "WaitOptions", "WaitResult", "poll_until"),
}

#: Top-level names on their way out: name -> (module that keeps it, the release that drops it from the top level).
DEPRECATED: dict[str, tuple[str, str]] = {
    "BaselineNotClean": ("study", "0.3.0"),
    "HolderError": ("study", "0.3.0"),
    "StudyConfig": ("study", "0.3.0"),
    "StudyError": ("study", "0.3.0"),
    "run_study": ("study", "0.3.0"),
}

#: Top-level names that ``from nvmlcheck import *`` does not bring (they are left out of ``__all__``), because they
#: would shadow a builtin there; ``nvmlcheck.open`` and ``from nvmlcheck import open`` still work.
NOT_STAR: frozenset[str] = frozenset({"open"})

#: What ``nvmlcheck.testing`` offers, by the private module of ``nvmlcheck._sim`` that defines it.
TESTING: dict[str, tuple[str, ...]] = {
    "build": ("StubBuildError", "build_stub", "find_nvml_header", "stub_source_dir"),
    "calllog": ("LogEntry", "read_call_log"),
    "clock": ("StepClock",),
    "fixtures": ("BoundProcessFactory",),
    "probe": ("StubProbe",),
    "scenario": (
        "CLOCK_DOMAINS", "DEVICE_FIELDS", "EVENT_KINDS", "PROCESS_KINDS", "UNSUPPORTED_FIELDS", "ClockDomain",
        "EventKindName", "ProcessKindName", "Scenario", "TimelineStep",
    ),
    "session": ("StubSession", "stub_environment", "use_stub"),
    "symbols": ("NVML_FUNCTIONS", "STUB_VARIANTS"),
}

#: Old names ``nvmlcheck.testing`` still resolves, not in its ``__all__``: old name -> current name.
TESTING_ALIASES: dict[str, str] = {"ProcessKind": "ProcessKindName"}

PACKAGE = Path(__file__).resolve().parent
_BEGIN = "# --- generated by `python -m nvmlcheck._public` from nvmlcheck/_public.py: do not edit ---\n"
_END = "# --- end of generated part ---\n"
_WIDTH = 120


def _member_key(name: str) -> tuple[int, str, str]:
    # The order ruff's isort rule wants: CONSTANTS, then Classes, then functions; case-insensitive within each.
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower(), name


def _import_lines(module: str, names: list[str]) -> list[str]:
    items = sorted(names, key=_member_key)
    one_line = f"from nvmlcheck.{module} import {', '.join(items)}"
    if len(one_line) <= _WIDTH:
        return [one_line]
    return [f"from nvmlcheck.{module} import (", *(f"    {item}," for item in items), ")"]


def _top_level() -> dict[str, str]:
    table = {name: module for module, names in EXPORTS.items() for name in names}
    clash = set(table) & set(DEPRECATED)
    if clash or len(table) != sum(len(names) for names in EXPORTS.values()):
        raise SystemExit(f"a name is listed twice in nvmlcheck/_public.py: {sorted(clash) or 'see EXPORTS'}")
    return table


def render_stub() -> str:
    """The text of ``__init__.pyi``: the imports, module by module, then ``__version__`` and ``__all__``."""
    lines = ['"""Type information for the lazily loaded package namespace; generated from nvmlcheck/_public.py."""', ""]
    deprecated: dict[str, list[str]] = {}
    for name, (module, _) in DEPRECATED.items():
        deprecated.setdefault(module, []).append(name)
    for module in sorted(set(EXPORTS) | set(deprecated)):
        if module in EXPORTS:
            lines += _import_lines(module, [n for n in EXPORTS[module] if n not in NOT_STAR])
        # A deprecated name, or one kept out of `import *`, is re-exported explicitly (`X as X`): not in __all__.
        old = sorted([*deprecated.get(module, ()), *(n for n in EXPORTS.get(module, ()) if n in NOT_STAR)],
                     key=_member_key)
        lines += [f"from nvmlcheck.{module} import {n} as {n}" for n in old]
    lines += ["", "__version__: str", "", "__all__ = ["]
    lines += [f'    "{name}",' for name in sorted([*(set(_top_level()) - NOT_STAR), "__version__"])]
    lines += ["]"]
    return "\n".join(lines) + "\n"


def _generated_block() -> str:
    lazy = "".join(f'    "{name}": "{module}",\n' for name, module in sorted(_top_level().items()))
    old = "".join(f'    "{name}": ("{m}", "{v}"),\n' for name, (m, v) in sorted(DEPRECATED.items()))
    not_star = "".join(f'"{name}", ' for name in sorted(NOT_STAR))
    return (
        f"{_BEGIN}_LAZY: dict[str, str] = {{\n{lazy}}}\n"
        f"_DEPRECATED: dict[str, tuple[str, str]] = {{\n{old}}}\n"
        f"_NOT_STAR = frozenset({{{not_star.rstrip(', ')}}})  # not in __all__: they would shadow a builtin\n{_END}"
    )


def _testing_block() -> str:
    names = sorted(n for names in TESTING.values() for n in names)
    lines = [_BEGIN.rstrip("\n"), "__all__ = ["] + [f'    "{n}",' for n in names] + ["]", "",
             "TYPE_CHECKING = False", "if TYPE_CHECKING:"]
    for module in sorted(TESTING):
        lines += ["    " + line for line in _import_lines(module, list(TESTING[module]))]
    lines = [line.replace("from nvmlcheck.", "from .._sim.", 1) for line in lines]
    lines += [f"    {old} = {new}  # deprecated alias, not in __all__" for old, new in sorted(TESTING_ALIASES.items())]
    lines += ["", "# Each name -> the private module that defines it (resolved on first use)."]
    lines += ["_LAZY: dict[str, str] = {"]
    lines += [f'    "{n}": "{m}",' for n, m in sorted((n, m) for m, ns in TESTING.items() for n in ns)]
    lines += ["}", "_ALIASES: dict[str, str] = {"]
    lines += [f'    "{o}": "{n}",' for o, n in sorted(TESTING_ALIASES.items())]
    lines += ["}", _END.rstrip("\n")]
    return "\n".join(lines) + "\n"


def _replace_marked(current: str, block: str, where: Path) -> str:
    start, end = current.find(_BEGIN), current.find(_END)
    if start < 0 or end < start:
        raise SystemExit(f"{where} has lost the generated-part markers; restore them by hand")
    return current[:start] + block + current[end + len(_END):]


def render_testing(current: str) -> str:
    """``nvmlcheck/testing/__init__.py``'s text with its generated part (``__all__``, typing imports, lazy table)
    made from :data:`TESTING`."""
    return _replace_marked(current, _testing_block(), PACKAGE / "testing" / "__init__.py")


def render_init(current: str) -> str:
    """``__init__.py``'s text with the part between the markers replaced by the tables this list gives."""
    return _replace_marked(current, _generated_block(), PACKAGE / "__init__.py")


def _module_problems() -> list[str]:
    problems = []
    for name, module in {**_top_level(), **{n: m for n, (m, _) in DEPRECATED.items()}}.items():
        offered = getattr(importlib.import_module(f"nvmlcheck.{module}"), "__all__", ())
        if name not in offered:
            problems.append(f"{name} is exported from nvmlcheck.{module}, whose __all__ does not list it")
    for module, names in TESTING.items():
        offered = getattr(importlib.import_module(f"nvmlcheck._sim.{module}"), "__all__", ())
        problems += [f"testing.{n} comes from nvmlcheck._sim.{module}, whose __all__ does not list it"
                     for n in names if n not in offered]
    return problems


def check() -> list[str]:
    """What is out of date or inconsistent; empty when the generated files are what this list says."""
    problems = _module_problems()
    init, stub = PACKAGE / "__init__.py", PACKAGE / "__init__.pyi"
    if render_init(init.read_text()) != init.read_text():
        problems.append(f"{init} is stale: run `python -m nvmlcheck._public`")
    if not stub.exists() or stub.read_text() != render_stub():
        problems.append(f"{stub} is stale: run `python -m nvmlcheck._public`")
    testing = PACKAGE / "testing" / "__init__.py"
    if render_testing(testing.read_text()) != testing.read_text():
        problems.append(f"{testing} is stale: run `python -m nvmlcheck._public`")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvmlcheck._public", description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when a generated file is stale")
    mode.add_argument("--write", action="store_true", help="rewrite the generated files (the default)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for line in problems:
            print(line, file=sys.stderr)
        return 1 if problems else 0
    problems = _module_problems()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    init = PACKAGE / "__init__.py"
    init.write_text(render_init(init.read_text()))
    (PACKAGE / "__init__.pyi").write_text(render_stub())
    testing = PACKAGE / "testing" / "__init__.py"
    testing.write_text(render_testing(testing.read_text()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
