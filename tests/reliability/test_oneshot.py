"""One-shot checks at the floor (issue 22, item 5): the script starts NVML in a thread before it imports the rest, the
session joins that init instead of making its own, and a wait loads neither the clock nor the health classes.
Mechanisms only (counted calls, threads, module lists); the timings are benchmarks/gpu/oneshot.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck._nvml import library
from nvmlcheck.cli import _common
from nvmlcheck.testing import Scenario, read_call_log

from ._support import Stub

pytestmark = pytest.mark.stub

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("argv", "devices"),
    [
        (["wait", "--timeout", "0"], None),
        (["snapshot"], None),
        (["--json", "ready"], None),
        (["--backend", "nvml", "wait", "--devices", "1,3"], [1, 3]),
        (["wait", "--devices=2", "--backend=auto"], [2]),
        (["wait", "--devices", "cuda:0"], []),  # resolved by the session: nothing is read ahead
        (["--devices", "0", "snapshot", "--devices", "GPU-1234"], [0]),
    ],
)
def test_a_one_shot_command_starts_nvml_early(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], devices: list[int] | None
) -> None:
    calls: list[tuple[str | None, object, object]] = []
    monkeypatch.setattr(library, "start_early", lambda path, devs, reads: calls.append((path, devs, reads)))
    assert _common.start_nvml_early(argv) is True
    warmed = {"wait": (), "snapshot": ("current_clocks",), "ready": ("health",)}
    assert calls == [(None, devices, warmed[next(w for w in argv if w in warmed)])]


@pytest.mark.parametrize(
    "argv",
    [
        ["kill", "123"],
        ["holders"],
        ["wait", "--backend", "smi"],
        ["--backend=smi", "snapshot"],
        ["--simulate", "h200", "wait"],
        ["wait", "--smi-prefix", "ssh gpu01"],
        ["wait", "--host", "gpu01"],
        ["snapshot", "--help"],
        ["--version"],
        ["demo"],
        [],
    ],
)
def test_other_commands_do_not(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    monkeypatch.setattr(library, "start_early", lambda *a: pytest.fail(f"started early for {argv}"))
    assert _common.start_nvml_early(argv) is False


def test_the_session_joins_the_early_init_and_its_handles_are_read_ahead(stub: Stub) -> None:
    stub.write(Scenario.h200(devices=3))
    probe = stub.probe
    inits, handles = probe.init_total(), probe.call_count("nvmlDeviceGetHandleByIndex_v2")
    pending = library.start_early(str(stub.library), None)
    assert pending is not None and pending.warmed.wait(30)
    assert probe.init_total() == inits + 1 and probe.init_refcount() == 1  # held for the session to come
    assert probe.call_count("nvmlDeviceGetHandleByIndex_v2") == handles + 3
    with nc.open("nvml", library_path=str(stub.library)) as gpus:
        assert len(gpus.snapshot(fields=nc.Fields.WAIT).devices) == 3
        assert probe.init_total() == inits + 1  # the session's acquire took the early init over: no second one
        # ... and the thread's handles: asking again would make the driver's next page-retirement read cold again.
        assert probe.call_count("nvmlDeviceGetHandleByIndex_v2") == handles + 3
    assert stub.balanced()  # and its close gave it back


def test_handles_read_ahead_belong_to_their_initialisation(stub: Stub) -> None:
    stub.write(Scenario.h200(devices=2))
    probe = stub.probe
    loaded = library.load(str(stub.library))
    pending = library.start_early(str(stub.library), [1])
    assert pending is not None and pending.warmed.wait(30)
    assert loaded.handle_read_ahead(1) is not None and loaded.handle_read_ahead(0) is None  # only those asked for
    with nc.open("nvml", library_path=str(stub.library)) as gpus:
        before = probe.call_count("nvmlDeviceGetHandleByIndex_v2")
        assert len(gpus.snapshot(fields=nc.Fields.WAIT).devices) == 2
        assert probe.call_count("nvmlDeviceGetHandleByIndex_v2") == before + 1  # GPU 0's own; GPU 1's read ahead
        child = os.fork()
        if child == 0:  # a forked child's NVML state is not the parent's: nothing read ahead there
            os._exit(0 if loaded.handle_read_ahead(1) is None else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        loaded.reinit(loaded.init_generation)  # a new initialisation: the old handles are stale
        assert loaded.handle_read_ahead(1) is None
        before = probe.call_count("nvmlDeviceGetHandleByIndex_v2")
        assert len(gpus.snapshot(fields=nc.Fields.WAIT).devices) == 2
        assert probe.call_count("nvmlDeviceGetHandleByIndex_v2") == before + 2
    assert stub.balanced()


def _early_start_with_a_slow(
    stub: Stub, function: str, delay_ms: int, reads: tuple[str, ...] = ()
) -> library._PendingInit:
    """An early start on one GPU whose first ``function`` call takes ``delay_ms``."""
    scenario = Scenario.h200(devices=1)
    scenario.fault(function, delay_ms=delay_ms, count=1)
    stub.write(scenario)
    pending = library.start_early(str(stub.library), [0], reads)
    assert pending is not None
    return pending


def test_the_early_start_returns_once_its_thread_is_calling_nvml_init(stub: Stub) -> None:
    # A new thread needs the GIL to start; an importing main thread would hold it for milliseconds (measured ~3 ms
    # on the H200 before this): start_early lets the thread reach nvmlInit first. Here the init hangs 300 ms.
    pending = _early_start_with_a_slow(stub, "nvmlInit_v2", 300)
    assert pending.calling.wait(0) and not pending.done.wait(0)  # in nvmlInit, not past it
    assert pending.warmed.wait(30) and pending.rc == 0
    with nc.open("nvml", library_path=str(stub.library)) as gpus:
        assert len(gpus.snapshot(fields=nc.Fields.WAIT).devices) == 1
    assert stub.balanced()


def test_the_session_waits_for_the_early_threads_handles(stub: Stub) -> None:
    # On a real driver a handle asked for while the early thread's first one is in flight costs a second attach
    # (docs/driver-facts.md): the session's first calls come after the thread's. Here the thread's handle hangs.
    pending = _early_start_with_a_slow(stub, "nvmlDeviceGetHandleByIndex_v2", 400, ("health",))
    with nc.open("nvml", library_path=str(stub.library)) as gpus:
        assert pending.warmed.wait(0)  # the open returned only once the thread's handle and reads were done
        assert len(gpus.snapshot(fields=nc.Fields.WAIT).devices) == 1
    assert stub.balanced()


def test_a_bounded_open_does_not_wait_past_its_bound_for_the_warm_up(stub: Stub) -> None:
    pending = _early_start_with_a_slow(stub, "nvmlDeviceGetHandleByIndex_v2", 3000)
    assert pending.done.wait(30)
    loaded = library.load(str(stub.library))
    loaded.acquire(timeout_s=0)  # initialised already: the warm-up is not waited for past the bound
    try:
        assert not pending.warmed.wait(0)
    finally:
        loaded.release()
    assert pending.warmed.wait(30)


_EVERY_ONE_SHOT = {"nvmlDeviceGetComputeRunningProcesses_v3"}  # not the MIG mode: 0.4 ms on every call (H200)
# Not the retired-page list: warming it saved the session's call nothing on an H200 (docs/performance.md).
_HEALTH = {"nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetTotalEccErrors",
           "nvmlDeviceGetFieldValues"}


@pytest.mark.parametrize(
    ("reads", "warmed"),
    [
        ((), _EVERY_ONE_SHOT),
        (("current_clocks",), {*_EVERY_ONE_SHOT, "nvmlDeviceGetClockInfo"}),
        (("health",), _EVERY_ONE_SHOT | _HEALTH),
        (("health", "current_clocks", "clock_limits"),
         _EVERY_ONE_SHOT | _HEALTH | {"nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo",
                                      "nvmlDeviceGetApplicationsClock"}),
    ],
)
def test_the_early_thread_makes_each_slow_first_call_once_per_gpu(
    stub: Stub, reads: tuple[str, ...], warmed: set[str]
) -> None:
    stub.write(Scenario.h200(devices=2))
    probe = stub.probe
    names = (*sorted(_EVERY_ONE_SHOT | _HEALTH), "nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo",
             "nvmlDeviceGetApplicationsClock", "nvmlDeviceGetMigMode", "nvmlDeviceGetRetiredPages_v2")
    before = {n: probe.call_count(n) for n in names}
    interval = sys.getswitchinterval()
    pending = library.start_early(str(stub.library), None, reads)
    assert pending is not None and pending.warmed.wait(30)
    assert {n: probe.call_count(n) - before[n] for n in names} == {n: 2 if n in warmed else 0 for n in names}
    assert sys.getswitchinterval() == interval  # the thread's shorter interval is given back when it ends
    with nc.open("nvml", library_path=str(stub.library)) as gpus:
        assert len(gpus.snapshot().devices) == 2  # the session's own reads answer as ever
    assert stub.balanced()


def test_an_early_init_that_failed_is_tried_again_by_the_session(stub: Stub) -> None:
    # No scenario yet: the stub's init fails (as a driver that is not ready would); the session's own init works.
    pending = library.start_early(str(stub.library), [0])
    assert pending is not None and pending.warmed.wait(30) and pending.rc != 0
    stub.write(Scenario.h200())
    with nc.open("nvml", library_path=str(stub.library)) as gpus:
        assert gpus.snapshot(fields=nc.Fields.WAIT).devices[0].index == 0
    assert stub.balanced()


def test_the_script_initialises_nvml_in_another_thread(stub: Stub, tmp_path: Path) -> None:
    stub.write(Scenario.h200(devices=2))
    log = tmp_path / "calls.log"
    env = dict(os.environ, NVMLCHECK_STUB_LOG=str(log))
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "wait", "--timeout", "0"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    entries = read_call_log(log)
    (init,) = [e for e in entries if e.function.startswith("nvmlInit")]
    assert init.tid != init.pid  # not the main thread: it ran while Python imported the rest
    ahead = [e for e in entries if e.tid == init.tid]
    assert {e.function for e in ahead} <= {"nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
                                           *_EVERY_ONE_SHOT}


# Runs the script; when a thread is started (the early init's: nothing starts one before it) prints the modules
# imported so far, and ends.
_BEFORE_INIT = r"""
import json, os, sys, _thread
imported = []
class Noted:
    def find_spec(self, name, path=None, target=None):
        imported.append(name)
sys.meta_path.insert(0, Noted())
start = _thread.start_new_thread
def started(fn, args, *rest):
    os.write(1, json.dumps({"imported": imported}).encode())
    os._exit(0)
_thread.start_new_thread = started
sys.argv = ["nvmlcheck", *sys.argv[1:]]
from nvmlcheck.cli import script
script()
"""


@pytest.mark.parametrize("argv", [["ready"], ["wait", "--timeout", "0"], ["--json", "snapshot"]])
def test_the_script_imports_only_the_loader_before_the_driver_starts(stub: Stub, argv: list[str]) -> None:
    # Everything imported before the init thread starts delays nvmlInit, the start of the driver's critical path
    # (docs/performance.md, "The fourth round"): the package, the command line's shared module (the exit codes) and
    # the loader, nothing of a command. The library is found as libnvidia-ml.so.1, as on a GPU host: the stub's own
    # check ($NVMLCHECK_LIBNVML) imports ctypes, which a real run does not.
    stub.write(Scenario.h200())
    env = {k: v for k, v in os.environ.items() if k != library.ENV_LIBRARY}
    env["LD_LIBRARY_PATH"] = str(stub.library.parent)
    done = subprocess.run([sys.executable, "-c", _BEFORE_INIT, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    ours = [m for m in seen["imported"] if m not in {"encodings", "_distutils_hack"}]  # site's own, when present
    assert set(ours) == {"__future__", "nvmlcheck", "nvmlcheck.cli", "nvmlcheck.cli._common", "nvmlcheck._nvml",
                         "nvmlcheck._nvml.library", "nvmlcheck._nvml._ffi", "_cffi_backend"}, ours  # fmt: skip


def _modules_of(argv: list[str], env: dict[str, str]) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "nvmlcheck", *argv], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    return {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


# Runs the script; at NVML's acquire it notes the modules loaded, at os._exit prints those loaded since.
_AFTER_OPEN = r"""
import os, sys
sys.argv = ["nvmlcheck", *sys.argv[1:]]
from nvmlcheck._nvml import library
seen = {}
acquire = library.LoadedLibrary.acquire
def noted(self, *a, **k):
    acquire(self, *a, **k)
    seen.setdefault("at", set(sys.modules))
library.LoadedLibrary.acquire = noted
exit_ = os._exit
def ended(code):
    sys.stdout.flush()
    os.write(2, ("AFTER-OPEN " + " ".join(sorted(set(sys.modules) - seen["at"])) + "\n").encode())
    exit_(code)
os._exit = ended
from nvmlcheck.cli import script
script()
"""


@pytest.mark.parametrize(
    "argv",
    [["wait", "--timeout", "0"], ["--json", "wait", "--timeout", "0"], ["snapshot"], ["--json", "snapshot"],
     ["snapshot", "procs"], ["ready"], ["--json", "ready"]],
)
def test_a_one_shot_imports_nothing_once_nvml_is_open(stub: Stub, argv: list[str]) -> None:
    # What a one-shot imports after the session opened is on its critical path when the driver is the faster of
    # the two (its imports overlap the early thread's nvmlInit only before): each command imports it first.
    stub.write(Scenario.h200())
    done = subprocess.run([sys.executable, "-c", _AFTER_OPEN, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("AFTER-OPEN")]
    assert line.split()[1:] == []


def test_a_wait_creates_no_clock_or_health_class(stub: Stub) -> None:
    stub.write(Scenario.h200())
    env = dict(os.environ)
    assert not {"nvmlcheck._readings", "nvmlcheck._clocks"} & _modules_of(["wait", "--timeout", "0"], env)
    assert "nvmlcheck._clocks" not in _modules_of(["ready"], env)  # ready reads health, no clocks
    assert {"nvmlcheck._readings", "nvmlcheck._clocks"} <= _modules_of(["snapshot", "--json"], env)  # the control


@pytest.mark.parametrize(
    ("argv", "limits", "health"),
    [(["snapshot"], False, False), (["snapshot", "procs"], False, False), (["--json", "snapshot"], True, True)],
)
def test_a_snapshot_table_reads_what_it_shows_and_the_json_everything(
    stub: Stub, capsys: pytest.CaptureFixture[str], argv: list[str], limits: bool, health: bool
) -> None:
    stub.write(Scenario.h200())
    probe = stub.probe
    names = ("nvmlDeviceGetApplicationsClock", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetRemappedRows",
             "nvmlDeviceGetCurrentClocksEventReasons")  # fmt: skip
    before = {n: probe.call_count(n) for n in names}
    assert cli.main(argv) == 0
    made = {n: probe.call_count(n) - before[n] for n in names}
    assert (made["nvmlDeviceGetApplicationsClock"] > 0, made["nvmlDeviceGetMaxClockInfo"] > 0) == (limits, limits)
    assert (made["nvmlDeviceGetRemappedRows"] > 0) == health
    # The table shows the SM clock, not why the clocks are where they are (the reasons' first call: ~1.4 ms).
    assert (made["nvmlDeviceGetCurrentClocksEventReasons"] > 0) == ("--json" in argv)
    out = capsys.readouterr().out
    if argv == ["snapshot"]:
        assert "345" in out.splitlines()[1]  # the SM clock the table shows is still read (the h200 scenario's)
