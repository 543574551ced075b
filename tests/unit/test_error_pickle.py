"""Every exception of the package pickles to an equal, equally informative object.

The walk finds every ``NvmlCheckError`` subclass nvmlcheck defines (a new class without a sample here fails the
test); each sample is pickled with every protocol and must come back the same class with the same ``args``,
message and attributes, including those the built-in base keeps outside ``__dict__`` (``OSError.errno``,
``ImportError.name``), notes added after it was raised, and a ``WaitTimeout``'s holders, which it judges on first
read: the copy must hold what the original holds, never judge again where the holders' ``/proc`` is not the same.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from snapshots import GIB, dev, proc, snap

import nvmlcheck as nc
from nvmlcheck import verdict
from nvmlcheck.verdict import Culprit

PACKAGE = Path(nc.__file__).parent
BUSY = snap(dev(0, used=8 * GIB, procs=[proc(4_000_123, 8 * GIB)]))


def _classes() -> dict[str, type[nc.NvmlCheckError]]:
    for info in pkgutil.walk_packages(nc.__path__, "nvmlcheck."):
        if not info.name.endswith(("__main__", "._ffi", ".plots")):
            importlib.import_module(info.name)
    found: dict[str, type[nc.NvmlCheckError]] = {}
    todo: list[type[nc.NvmlCheckError]] = [nc.NvmlCheckError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        source = inspect.getsourcefile(cls) or ""
        if Path(source).is_relative_to(PACKAGE):  # not a test's own subclass
            found[cls.__name__] = cls
    return found


def _sample(cls: type[nc.NvmlCheckError]) -> list[nc.NvmlCheckError]:
    """Instances of ``cls`` as nvmlcheck raises them, with every optional part given."""
    if issubclass(cls, nc.NvmlError):
        code = cls.CODE if cls.CODE is not None else 4242
        return [cls(code, "nvmlDeviceGetMemoryInfo_v2", 1, "detail"), cls(code, "nvmlInit_v2")]
    if cls.__name__ in SAMPLES:
        return [make() for make in SAMPLES[cls.__name__]]
    if not any("__init__" in vars(k) for k in cls.__mro__ if issubclass(k, nc.NvmlCheckError)):
        return [cls("no GPU with index 9: this host has 1")]  # a class that takes its message alone
    raise AssertionError(f"{cls.__name__} takes arguments of its own: add a sample to SAMPLES")


def _mixed() -> nc.NvmlCheckError:
    from nvmlcheck.study.fit import MixedConditions

    return MixedConditions("the runs differ in their ending", {"ending": {"KILL": 5, "TERM": 5}})


def _mapping() -> nc.NvmlCheckError:
    mapping = nc.cuda_mapping([], env={"CUDA_VISIBLE_DEVICES": "0"})
    return nc.CudaMappingError("cuda:3 names no GPU", mapping)


def _host(name: str) -> Callable[[], nc.NvmlCheckError]:
    def make() -> nc.NvmlCheckError:
        from nvmlcheck import hosts

        cls = getattr(hosts, name)
        if name == "RemoteError":
            return cls("gpu01", "no driver", 3, "ssh: warning", {"schema": "nvmlcheck/error", "version": 1})  # type: ignore[no-any-return]
        return cls("gpu01", "connection refused", 255, "ssh: connect to host gpu01 port 22")  # type: ignore[no-any-return]
    return make


def _study(name: str, *args: Any) -> Callable[[], nc.NvmlCheckError]:
    def make() -> nc.NvmlCheckError:
        from nvmlcheck import study

        return getattr(study, name)(*args)  # type: ignore[no-any-return]
    return make


SAMPLES: dict[str, list[Callable[[], nc.NvmlCheckError]]] = {
    "HoldersIncomplete": [lambda: nc.HoldersIncomplete(1.5, "the GPUs' process lists were still being read"),
                          lambda: nc.HoldersIncomplete(0.5, "the /proc scan was cut", (), 12)],
    "BackendUnavailable": [lambda: nc.BackendUnavailable("no backend", ["nvml: missing", "smi: missing"]),
                           lambda: nc.BackendUnavailable("no backend")],
    "SmiError": [lambda: nc.SmiError(["nvidia-smi", "-q"], 9, "NVIDIA-SMI has failed\n", "no driver")],
    "SmiTransportError": [lambda: nc.SmiTransportError(["ssh", "h", "nvidia-smi"], 255, "refused")],
    "SmiTransportTimeout": [lambda: nc.SmiTransportTimeout(["ssh", "h", "nvidia-smi"], 255, "Connection timed out")],
    "SmiTimeout": [lambda: nc.SmiTimeout(["ssh", "h", "nvidia-smi"], 2.5, "slow")],
    "SmiParseError": [lambda: nc.SmiParseError("wrong column count", 3, "a, b", ["nvidia-smi"])],
    "CorruptData": [lambda: nc.CorruptData("PID 0", "nvmlDeviceGetComputeRunningProcesses_v3", 0)],
    "GpuFault": [lambda: nc.GpuFault(1, "GPU-1", "xid", 79, "fallen off the bus", time_ns=5, wall_time=1.5),
                 lambda: nc.GpuFault(0, None, "double_bit_ecc", None, "uncorrectable ECC")],
    "WaitTimeout": [lambda: nc.WaitTimeout(3.0, 3_000_000_000, ["GPU 0: pid 4000123 holds 8 GiB"], BUSY, 7),
                    lambda: nc.WaitTimeout(1.0, 10, ["x"], None, 1, holders=[Culprit(0, "held", "compute", "pid 1")],
                                           held=False)],
    "KillTimeout": [lambda: nc.KillTimeout(3.0, 3_000_000_000, ["pid 4000123 still runs"], BUSY, 4,
                                           tree_hint=[(4_000_124, 4_000_123)], signal_name="SIGKILL",
                                           missing=[77], only_targets=True)],
    "SelectTimeout": [lambda: nc.SelectTimeout(3.0, 3_000_000_000, ["GPU 0: held"], BUSY, 4, count=2, clean=[1])],
    "KillError": [lambda: nc.KillError(1, "PID 1 is init")],
    "ProcessGone": [lambda: nc.ProcessGone(4_000_123, "no such process")],
    "NotPermitted": [lambda: nc.NotPermitted(4_000_123, "another user's process")],
    "CudaMappingError": [_mapping, lambda: nc.CudaMappingError("cuda:x is not a selector")],
    "LockDirError": [lambda: nc.LockDirError("/run/gpu-locks", "not a directory", "/run/gpu-locks/0.lock")],
    "HostError": [_host("HostError")],
    "HostUnreachable": [_host("HostUnreachable")],
    "HostAuthError": [_host("HostAuthError")],
    "HostTimeout": [_host("HostTimeout")],
    "RemoteError": [_host("RemoteError")],
    "NoRemoteNvmlcheck": [_host("NoRemoteNvmlcheck")],
    "MixedConditions": [_mixed],
    "BaselineNotClean": [_study("BaselineNotClean", ["GPU 0: pid 5 holds 1 GiB"], 2.0)],
    "StudySkipped": [_study("StudySkipped", "no nvidia-cuda-mps-control")],
}


def _state(exc: BaseException) -> dict[str, Any]:
    """What an exception says: its class, args, message, attributes and the built-in bases' own."""
    if isinstance(exc, nc.WaitTimeout):
        exc.holders  # noqa: B018 - judged now on the original (the copy must not judge again)
    out: dict[str, Any] = {"type": type(exc), "args": exc.args, "str": str(exc), "repr": repr(exc), **vars(exc)}
    if isinstance(exc, OSError):
        out.update(errno=exc.errno, strerror=exc.strerror, filename=exc.filename, filename2=exc.filename2)
    if isinstance(exc, ImportError):
        out.update(msg=exc.msg, name=exc.name, path=exc.path)
    return out


CLASSES = _classes()


def test_the_walk_found_every_kind() -> None:
    for name in ("NvmlCheckError", "GpuLost", "WaitTimeout", "KillTimeout", "SelectTimeout", "HostTimeout",
                 "MixedConditions", "LockDirError", "StubCacheError", "CudaError", "PlotUnavailable"):
        assert name in CLASSES
    assert len(CLASSES) > 60


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_exception_pickles_to_an_equal_one(name: str) -> None:
    for exc in _sample(CLASSES[name]):
        vars(exc)["__notes__"] = ["while judging GPU 1"]  # add_note (3.11+) after it was raised, as a caller may
        exc.extra = "a caller's attribute"  # type: ignore[attr-defined]
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(exc, protocol))
            assert _state(back) == _state(exc), f"{name} (protocol {protocol})"


def test_the_built_in_bases_attributes_survive() -> None:
    from nvmlcheck.study import PlotUnavailable

    exc = PlotUnavailable("plotting needs matplotlib", name="matplotlib", path="/nowhere")
    back = pickle.loads(pickle.dumps(exc))
    assert (back.name, back.path, back.msg) == ("matplotlib", "/nowhere", "plotting needs matplotlib")


def test_holders_judged_before_pickling_are_the_copys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Holders not read before pickling are judged once, when pickled: the copy never judges them again (in another
    process the holders' /proc state and containers are another's, or gone), and holds what the original holds."""
    calls: list[object] = []

    def judged(snapshot: object, **_: object) -> tuple[Culprit, ...]:
        calls.append(snapshot)
        return (Culprit(0, "held", "compute", f"judgement {len(calls)}", pid=4_000_123),)

    monkeypatch.setattr(verdict, "holders_of", judged)
    for exc in (nc.WaitTimeout(1.0, 10, ["GPU 0: pid 4000123 holds 8 GiB"], BUSY, 3),
                nc.KillTimeout(1.0, 10, ["pid 4000123 still runs"], BUSY, 3),
                nc.SelectTimeout(1.0, 10, ["GPU 0: held"], BUSY, 3, count=1)):
        calls.clear()
        back = pickle.loads(pickle.dumps(exc))
        assert back.holders == exc.holders and len(calls) == 1, type(exc).__name__
        assert back.holders[0].pid == 4_000_123


def test_holders_that_cannot_be_judged_do_not_stop_the_pickle(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(snapshot: object, **_: object) -> tuple[Culprit, ...]:
        raise RuntimeError("cannot judge")

    monkeypatch.setattr(verdict, "holders_of", broken)
    exc = nc.WaitTimeout(1.0, 10, ["GPU 0: pid 4000123 holds 8 GiB"], BUSY, 3)
    back = pickle.loads(pickle.dumps(exc))  # the timeout still travels, message and snapshot with it
    assert str(back) == str(exc) and back.snapshot == exc.snapshot
    with pytest.raises(RuntimeError, match="cannot judge"):
        back.holders  # noqa: B018 - as the original would


# --- pickles made by nvmlcheck 0.1.0 ----------------------------------------------------------------------------------
# 0.1.0 pickled these three through helpers of their modules (kill._rebuild_timeout, selection._rebuild,
# cudamap._rebuild_error) that the single NvmlCheckError.__reduce__ replaced, and their pickles stopped loading
# ("Can't get attribute '_rebuild_timeout'"). Made with the 0.1.0 code, protocol 4, base64.
OLD_PICKLES = {
    "KillTimeout": (
        "gASVJgEAAAAAAACMDm52bWxjaGVjay5raWxslIwQX3JlYnVpbGRfdGltZW91dJSTlChHQAgAAAAAAACKBQBe0LIAjBZwaWQgNDAw"
        "MDEyMyBzdGlsbCBydW5zlIWUTksEdJR9lCiMBHBpZHOUaACMCFBpZFRpbWVzlJOUKYGUXZQoSnsJPQCMBW5hbWVklIwGcHl0aG9u"
        "lGgAjApTaWduYWxTZW50lJOUKYGUXZQojAdTSUdURVJNlEsKZWKFlEsUSx5OjAVwaWRmZJROZWKFlIwJdHJlZV9oaW50lEp8CT0A"
        "SnsJPQCGlIWUjAtzaWduYWxfbmFtZZSMB1NJR0tJTEyUjAdtaXNzaW5nlEtNhZSMDG9ubHlfdGFyZ2V0c5SIjAdob2xkZXJzlCl1"
        "hpRSlC4="
    ),
    "SelectTimeout": (
        "gASVcwAAAAAAAACME252bWxjaGVjay5zZWxlY3Rpb26UjAhfcmVidWlsZJSTlChHQAgAAAAAAACKBQBe0LIAjAtHUFUgMDogaGVs"
        "ZJSFlE5LBHSUfZQojAVjb3VudJRLAowFY2xlYW6USwGFlIwHaG9sZGVyc5QpdYaUUpQu"
    ),
    "CudaMappingError": (
        "gASViwEAAAAAAACMEW52bWxjaGVjay5jdWRhbWFwlIwOX3JlYnVpbGRfZXJyb3KUk5SM9WN1ZGE6MyBuYW1lcyBubyBHUFUKbWFw"
        "cGluZyBzZWVuOiBDVURBX1ZJU0lCTEVfREVWSUNFUz0nMCcsIENVREFfREVWSUNFX09SREVSPXVuc2V0IChGQVNURVNUX0ZJUlNU"
        "KQogIENVREEgbnVtYmVyaW5nIG9mIGFsbCBHUFVzIChOVk1MIGluZGljZXMpOiAKICB2aXNpYmxlIENVREEgZGV2aWNlczogbm9u"
        "ZQogIG5vdGU6IGVudHJ5ICcwJyBuYW1lcyBubyBHUFU6IENVREEgaWdub3JlcyBpdCBhbmQgd2hhdCBmb2xsb3dzICgnMCcplGgA"
        "jAtDdWRhTWFwcGluZ5STlCmBlF2UKIwBMJROKSlOKU6MPmVudHJ5ICcwJyBuYW1lcyBubyBHUFU6IENVREEgaWdub3JlcyBpdCBh"
        "bmQgd2hhdCBmb2xsb3dzICgnMCcplIWUZWKGlFKULg=="
    ),
}


def _now(name: str) -> nc.NvmlCheckError:
    """What this version makes of the arguments the old pickles were made from."""
    from nvmlcheck.kill import PidTimes, SignalSent

    if name == "KillTimeout":
        pid = PidTimes(4_000_123, "named", "python", (SignalSent("SIGTERM", 10),), 20, 30, None, "pidfd", None)
        return nc.KillTimeout(3.0, 3_000_000_000, ["pid 4000123 still runs"], None, 4, pids=[pid],
                              tree_hint=[(4_000_124, 4_000_123)], signal_name="SIGKILL", missing=[77],
                              only_targets=True, holders=())
    if name == "SelectTimeout":
        return nc.SelectTimeout(3.0, 3_000_000_000, ["GPU 0: held"], None, 4, count=2, clean=[1], holders=())
    return nc.CudaMappingError("cuda:3 names no GPU", nc.cuda_mapping([], env={"CUDA_VISIBLE_DEVICES": "0"}))


@pytest.mark.parametrize("name", sorted(OLD_PICKLES))
def test_a_pickle_of_the_previous_release_loads(name: str) -> None:
    import base64

    old = pickle.loads(base64.b64decode(OLD_PICKLES[name]))
    assert _state(old) == _state(_now(name))
