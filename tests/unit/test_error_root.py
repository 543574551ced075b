"""One error root: every exception nvmlcheck raises on purpose is an ``NvmlCheckError``.

Two walks prove it. The first imports every module of the package and checks every exception class defined there
(a short list of internal control-flow classes is named, each with why it never reaches a caller). The second calls
the public callables with the bad input their docs describe and checks that what comes out is an ``NvmlCheckError``
and, where a caller expects one, still the built-in kind (``ValueError``, ``TypeError``, ``KeyError``, ...). The
calls that need a session are in ``tests/stub/test_error_root_stub.py``.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
import re
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import testing
from nvmlcheck.errors import DeadlinePassed

#: Exception classes that are deliberately not NvmlCheckErrors, and why none reaches a caller of the public API.
INTERNAL: dict[str, str] = {
    "nvmlcheck.errors.DeadlinePassed": "a backend's signal to the poller, turned into WaitTimeout; never escapes",
    "nvmlcheck.cli._signals.Terminated": "SIGTERM/SIGHUP as an exception (a BaseException, like KeyboardInterrupt)",
    "nvmlcheck.cli._common.UsageError": "the CLI's own: turned into exit 2 by cli._main.run, never raised to a caller",
    "nvmlcheck.cli._common.SimulationUnavailable": "the CLI's own: turned into exit 3 by cli._main.run",
    "nvmlcheck.cli._common.HungReading": "the CLI's own: reported by the hung-reading watchdog, which exits 3",
    "nvmlcheck.cli._kill.DryRun": "the CLI's own: --dry-run printed the plan; turned into exit 0 by the kill command",
    "nvmlcheck.hosts._Stopped": "a fleet worker's stop signal inside Fleet; never escapes",
    "nvmlcheck.events._GivenUp": "the listener thread's own: a call stop() gave up on; caught in the thread, never "
    "escapes",
    "nvmlcheck.readiness._Unhealthy": "ready's on_poll ending its own wait (the health found a cause); caught by "
    "readiness._wait, never escapes",
    "nvmlcheck.readiness._Stuck": "ready's on_poll ending its own wait (a GPU is stuck past its bound); caught by "
    "readiness._wait, never escapes",
    "nvmlcheck.holders._StillStuck": "a holders worker's own, at a process an earlier worker is blocked on; turned "
    "into HoldersIncomplete in that worker",
    "nvmlcheck.holders._LeftBehind": "ends a holders worker its caller left behind; nobody reads it (the caller has "
    "raised HoldersIncomplete)",
    "nvmlcheck._proc.targets.Refused": "turned into KillError by nvmlcheck.kill and the CLI",
    "nvmlcheck._proc.pin.StaleIdentity": "turned into Refused (so KillError) by _proc.targets",
    "nvmlcheck._proc.procfs.ProcUnreadable": "a /proc read that failed; turned into Refused (so KillError) by "
    "_proc.targets",
}

# Modules that need an optional package to import (they are checked where it is installed).
OPTIONAL = frozenset({"nvmlcheck.study.plots"})


def _modules() -> list[str]:
    names = ["nvmlcheck"]
    for info in pkgutil.walk_packages(nc.__path__, "nvmlcheck."):
        if info.name.endswith(("__main__", "._ffi")):
            continue
        names.append(info.name)
    return names


def _exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in nvmlcheck, by ``module.Class`` of the module whose source defines it (many
    set ``__module__ = "nvmlcheck"``, so ``__module__`` does not say where)."""
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:
            if name in OPTIONAL:
                continue
            raise
        source = Path(module.__file__ or "").read_text(encoding="utf-8")
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__name__ == attr
                    and re.search(rf"^\s*class {attr}\b", source, re.MULTILINE)):
                found[f"{name}.{attr}"] = value
    return found


def test_every_exception_class_is_an_nvmlcheck_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 60, sorted(classes)  # the walk found the modules (errors.py alone has ~50)
    stray = sorted(name for name, cls in classes.items()
                   if not issubclass(cls, nc.NvmlCheckError) and name not in INTERNAL)
    assert not stray, f"exception classes that are not NvmlCheckErrors (and not named as internal): {stray}"
    # The internal list names only classes that still exist and still are not NvmlCheckErrors.
    for name in INTERNAL:
        assert name in classes, f"{name} is listed as internal but no longer exists"
        assert not issubclass(classes[name], nc.NvmlCheckError), f"{name} became an NvmlCheckError: unlist it"


def test_internal_classes_are_not_public() -> None:
    public = [getattr(nc, n) for n in nc.__all__] + [getattr(testing, n) for n in testing.__all__]
    for name in INTERNAL:
        module, _, cls = name.rpartition(".")
        assert getattr(importlib.import_module(module), cls) not in public, name
    assert DeadlinePassed not in public


def test_builtin_second_bases() -> None:
    assert issubclass(nc.ArgumentError, ValueError)
    assert issubclass(nc.ArgumentTypeError, TypeError)
    assert issubclass(nc.NoSuchDevice, KeyError) and issubclass(nc.NoSuchDevice, ValueError)
    assert issubclass(nc.NoSuchProcess, ProcessLookupError) and issubclass(nc.NoSuchProcess, ValueError)
    assert issubclass(nc.StateError, RuntimeError)
    assert issubclass(nc.SessionClosed, ValueError) and issubclass(nc.SessionClosed, nc.StateError)
    assert issubclass(nc.CudaMappingError, nc.ArgumentError)
    assert issubclass(testing.StubBuildError, RuntimeError) and issubclass(testing.StubBuildError, nc.NvmlCheckError)


@pytest.mark.parametrize("cls", [nc.ArgumentError, nc.ArgumentTypeError, nc.NoSuchDevice, nc.NoSuchProcess,
                                 nc.StateError, nc.SessionClosed])
def test_new_classes_read_and_pickle(cls: type[nc.NvmlCheckError]) -> None:
    exc = cls("no GPU with index 9: this host has 1")
    assert str(exc) == "no GPU with index 9: this host has 1"  # not KeyError's quoted key, not OSError's pair
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is cls and str(again) == str(exc)


def _scenario_bad_device() -> None:
    testing.Scenario.h200().add_process(3, 4_123_456)


def _bad_record_file(tmp: Path) -> Callable[[], object]:
    from nvmlcheck.study import load_records

    path = tmp / "records.jsonl"
    path.write_text('{"schema": "something/else", "version": 1}\n')
    return lambda: load_records(path)


#: (what, the call, the built-in kind a caller may expect of it)
BAD_CALLS: list[tuple[str, Callable[[], object], type[BaseException]]] = [
    ("open(backend=...)", lambda: nc.open("cuda"), ValueError),
    ("WaitOptions(timeout=-1)", lambda: nc.WaitOptions(timeout=-1), ValueError),
    ("WaitOptions(timeout='x')", lambda: nc.WaitOptions(timeout="x"), TypeError),  # type: ignore[arg-type]
    ("WaitOptions(stable_polls=0)", lambda: nc.WaitOptions(stable_polls=0), ValueError),
    ("WaitOptions(options=...)", lambda: nc.WaitOptions(policy="sometimes"), ValueError),
    ("PollPolicy(max_duty=2)", lambda: nc.PollPolicy(max_duty=2.0), ValueError),
    ("PollPolicy.every(-1)", lambda: nc.PollPolicy.every(-1.0), ValueError),
    ("no_processes(kinds=())", lambda: nc.no_processes(()), ValueError),
    ("pids_gone([0])", lambda: nc.pids_gone([0]), ValueError),
    ("on_devices([])", lambda: nc.on_devices([], nc.no_processes()), ValueError),
    ("on_devices(['cuda:0'])", lambda: nc.on_devices(["cuda:0"], nc.no_processes()), ValueError),
    ("memory_used_at_most(-1)", lambda: nc.memory_used_at_most(-1), ValueError),
    ("memory_used_at_most('1G')", lambda: nc.memory_used_at_most("1G"), TypeError),  # type: ignore[arg-type]
    ("bool(predicate)", lambda: bool(nc.no_processes()), TypeError),
    ("cuda_mapping selector", lambda: nc.cuda_mapping([], env={"CUDA_VISIBLE_DEVICES": "0"}).resolve("cuda:x"),
     ValueError),
    ("prepare_kill([])", lambda: nc.prepare_kill([]), ValueError),
    ("prepare_kill(['1'])", lambda: nc.prepare_kill(["1"]), TypeError),  # type: ignore[list-item]
    ("prepare_kill([0])", lambda: nc.prepare_kill([0]), nc.KillError),
    ("prepare_kill(pinning=...)", lambda: nc.prepare_kill([1], pinning="pin"), ValueError),  # type: ignore[arg-type]
    ("Host.parse", lambda: __import__("nvmlcheck.hosts").hosts.Host.parse("a b"), ValueError),
    ("Scenario.h200(devices=-1)", lambda: testing.Scenario.h200(devices=-1), ValueError),
    ("Scenario.add_process(device 3)", _scenario_bad_device, ValueError),
    ("Scenario.add_device(bad field)", lambda: testing.Scenario().add_device(colour="red"), TypeError),
    ("Scenario(driver=1)", lambda: testing.Scenario(driver=1), TypeError),  # type: ignore[arg-type]
    ("StepClock(step_s=0)", lambda: testing.StepClock(step_s=0), ValueError),
    ("build_stub(variant='X')", lambda: testing.build_stub("STUB_NO_PROC_V3"), TypeError),
    ("build_stub(variant=['X'])", lambda: testing.build_stub(["STUB_NOTHING"]), ValueError),
    ("build_stub(variant=None)", lambda: testing.build_stub(None), TypeError),  # type: ignore[arg-type]
    ("build_stub(variant=[1])", lambda: testing.build_stub([1]), TypeError),  # type: ignore[list-item]
    ("LockSet().hold_until", lambda: nc.LockSet([], Path("/nonexistent")).hold_until(1), ValueError),
    ("StudyConfig(sizes=())", lambda: __import__("nvmlcheck.study").study.StudyConfig(sizes=()), ValueError),
    ("simulate.scenario_named", lambda: __import__("nvmlcheck.simulate").simulate.scenario_named("/nope"),
     ValueError),
]


@pytest.mark.parametrize(("what", "call", "kind"), BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_raises_an_nvmlcheck_error(what: str, call: Callable[[], object], kind: type[BaseException]) -> None:
    with pytest.raises(nc.NvmlCheckError) as info:
        call()
    assert isinstance(info.value, kind), f"{what}: {type(info.value).__name__} is not a {kind.__name__}"
    assert str(info.value), f"{what}: an empty message"


def test_snapshot_device_names_no_gpu() -> None:
    from nvmlcheck.model import SystemInfo

    snap = nc.Snapshot(taken_ns=0, duration_ns=0, wall_time=0.0, backend="nvml",
                       system=SystemInfo(driver_version=None, nvml_version=None, cuda_driver_version=None),
                       devices=())
    with pytest.raises(nc.NoSuchDevice) as info:
        snap.device(3)
    assert isinstance(info.value, KeyError) and "GPU 3" in str(info.value)


def test_bad_record_file(tmp_path: Path) -> None:
    with pytest.raises(nc.NvmlCheckError) as info:
        _bad_record_file(tmp_path)()
    assert isinstance(info.value, ValueError)
