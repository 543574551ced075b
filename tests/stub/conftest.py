"""Fixtures for the stub libnvidia-ml tests: the library is built once per session and driven through nvmlcheck's own
cffi module (``nvmlcheck._nvml._ffi``), the same declarations the NVML backend uses."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck._nvml._ffi import ffi
from nvmlcheck.testing import STUB_VARIANTS, Scenario, StubProbe, build_stub

SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
GPU_IS_LOST = 15
ARGUMENT_VERSION_MISMATCH = 25
UNKNOWN = 999

NOT_AVAILABLE = 2**64 - 1
NOT_MIG = 0xFFFFFFFF
MIB = 1 << 20
GIB = 1 << 30
MEMORY_V2_VERSION = ffi.sizeof("nvmlMemory_v2_t") | 2 << 24

PROCESS_CALLS = {
    "compute": "nvmlDeviceGetComputeRunningProcesses",
    "graphics": "nvmlDeviceGetGraphicsRunningProcesses",
    "mps": "nvmlDeviceGetMPSComputeRunningProcesses",
}

_libs: dict[Path, Any] = {}


def open_lib(path: Path) -> Any:
    """``ffi.dlopen`` of the stub, once per path (dlopen of one path is one library anyway)."""
    if path not in _libs:
        _libs[path] = ffi.dlopen(str(path))
    return _libs[path]


def poll_until(predicate: Callable[[], bool], timeout: float = 10.0) -> float:
    """Call ``predicate`` until it is true; return the monotonic time it first was. Fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            pytest.fail(f"condition not reached within {timeout} s")
        time.sleep(0.002)


class Nvml:
    """Raw NVML calls on the stub through cffi, with small helpers for the common shapes."""

    def __init__(self, lib: Any, probe: StubProbe, scenario_path: Path) -> None:
        self.lib = lib
        self.probe = probe
        self.scenario_path = scenario_path

    # scenario
    def load(self, scenario: Scenario | str) -> Path:
        """Write the scenario (read by the next init that takes the refcount from 0 to 1)."""
        text = scenario.render() if isinstance(scenario, Scenario) else scenario
        self.scenario_path.write_text(text, encoding="utf-8")
        return self.scenario_path

    def start(self, scenario: Scenario | str) -> None:
        """Load the scenario and initialise."""
        self.load(scenario)
        self.init()

    def init(self) -> None:
        rc = self.lib.nvmlInit_v2()
        assert rc == SUCCESS, f"nvmlInit_v2 returned {rc}: {self.probe.last_error()}"

    def shutdown_all(self) -> None:
        while self.probe.init_refcount() > 0:
            assert self.lib.nvmlShutdown() == SUCCESS

    # calls
    def handle(self, index: int) -> Any:
        out = ffi.new("nvmlDevice_t *")
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(index, out)
        assert rc == SUCCESS, f"handle {index}: {rc}"
        return out[0]

    def string(self, fn: str, handle: Any, size: int = 96) -> tuple[int, str]:
        buf = ffi.new("char[]", size)
        rc = getattr(self.lib, fn)(handle, buf, size)
        raw = ffi.string(buf)
        assert isinstance(raw, bytes)
        return rc, raw.decode() if rc == SUCCESS else ""

    def count(self) -> int:
        out = ffi.new("unsigned int *")
        assert self.lib.nvmlDeviceGetCount_v2(out) == SUCCESS
        return int(out[0])

    def memory_v2(self, handle: Any) -> tuple[int, tuple[int, int, int, int]]:
        """(rc, (total, reserved, free, used))."""
        mem: Any = ffi.new("nvmlMemory_v2_t *")
        mem.version = MEMORY_V2_VERSION
        rc = self.lib.nvmlDeviceGetMemoryInfo_v2(handle, mem)
        return rc, (int(mem.total), int(mem.reserved), int(mem.free), int(mem.used))

    def used_v2(self, index: int = 0) -> int:
        rc, (_, _, _, used) = self.memory_v2(self.handle(index))
        assert rc == SUCCESS
        return used

    def memory_v1(self, handle: Any) -> tuple[int, tuple[int, int, int]]:
        """(rc, (total, free, used))."""
        mem: Any = ffi.new("nvmlMemory_t *")
        rc = self.lib.nvmlDeviceGetMemoryInfo(handle, mem)
        return rc, (int(mem.total), int(mem.free), int(mem.used))

    def processes(self, handle: Any, kind: str = "compute", version: int = 3) -> list[tuple[int, ...]]:
        """The two-call pattern: (pid, used) for v1, (pid, used, gi, ci) for v2/v3."""
        name = PROCESS_CALLS[kind] + ("" if version == 1 else f"_v{version}")
        struct = "nvmlProcessInfo_v1_t" if version == 1 else "nvmlProcessInfo_v2_t"
        fn = getattr(self.lib, name)
        count = ffi.new("unsigned int *", 0)
        rc = fn(handle, count, ffi.NULL)
        if rc == SUCCESS:
            assert count[0] == 0
            return []
        assert rc == INSUFFICIENT_SIZE, f"{name} size query returned {rc}"
        infos: Any = ffi.new(f"{struct}[]", count[0])
        rc = fn(handle, count, infos)
        assert rc == SUCCESS, f"{name} returned {rc}"
        if version == 1:
            return [(int(infos[i].pid), int(infos[i].usedGpuMemory)) for i in range(count[0])]
        return [
            (int(e.pid), int(e.usedGpuMemory), int(e.gpuInstanceId), int(e.computeInstanceId))
            for e in (infos[i] for i in range(count[0]))
        ]

    def pids(self, index: int = 0, kind: str = "compute") -> list[int]:
        return [entry[0] for entry in self.processes(self.handle(index), kind)]

    def clock(self, fn: str, handle: Any, domain: int) -> tuple[int, int]:
        out = ffi.new("unsigned int *")
        rc = getattr(self.lib, fn)(handle, domain, out)
        return rc, int(out[0])


@pytest.fixture(scope="session")
def stub_library() -> Path:
    """The full build of the stub (compiled once, cached across sessions by build_stub)."""
    return build_stub()


@pytest.fixture(scope="session")
def stub_variants() -> dict[str, Path]:
    """Every single-macro build variant, compiled in parallel."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {macro: pool.submit(build_stub, (macro,)) for macro in STUB_VARIANTS}
        return {macro: future.result() for macro, future in futures.items()}


@pytest.fixture
def nvml(stub_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Nvml]:
    """The stub with a fresh scenario file in NVMLCHECK_STUB_SCENARIO and the reference count at 0 before and
    after the test (the library's state lives as long as the process)."""
    scenario_path = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario_path))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    harness = Nvml(open_lib(stub_library), StubProbe(stub_library), scenario_path)
    harness.shutdown_all()
    yield harness
    harness.shutdown_all()


@pytest.fixture
def scenario_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The scenario file ``$NVMLCHECK_STUB_SCENARIO`` names (write it before opening); NVML balanced around the test."""
    path = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(path))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    probe = StubProbe(build_stub())
    assert probe.init_refcount() == 0, "an earlier test left NVML initialised"
    yield path
    assert probe.init_refcount() == 0, "this test left NVML initialised"


@pytest.fixture
def owner() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing for the launch script whose life GPU locks last."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(120)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[Scenario], nc.Session]:
    """A function that opens an NVML session on the stub with the scenario it is given."""
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    lib = build_stub()

    def open_(sc: Scenario) -> nc.Session:
        monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "scenario.txt")))
        return nc.open("nvml", library_path=str(lib))

    return open_


def gone_within(pid: int, cap_s: float = 30.0) -> bool:
    """Wait for ``pid`` to exit (reaping it when it is our child: a zombie still answers kill 0). The cap only
    guards against a hang."""
    end = time.monotonic() + cap_s
    while time.monotonic() < end:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass  # not our child (a holder started by an nvmlcheck process that has exited)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def device_file(tmp_path: Path) -> str:
    """The simulation's stand-in /dev/nvidia0: dev/ next to the scenario the tests write in ``tmp_path``."""
    d = tmp_path / "dev"
    d.mkdir()
    (d / "nvidia0").write_text("")
    return str(d / "nvidia0")


@pytest.fixture
def nvml_released() -> Iterator[None]:
    """The stub reloads its scenario only when NVML's reference count goes 0 → 1: no test may leave it held (the
    study's tests use it for every test: ``pytestmark = pytest.mark.usefixtures("nvml_released")``)."""
    probe = StubProbe(build_stub())
    assert probe.init_refcount() == 0, "an earlier test left NVML initialised"
    yield
    assert probe.init_refcount() == 0, "this test left NVML initialised"


# --- a GPU in MIG mode with two instances: the shape the MIG tests share --------------------------------------------

GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
MIG0 = "MIG-00000000-0000-0000-0000-000000000000"
MIG1 = "MIG-00000000-0000-0000-0000-000000000001"
#: A process that holds the file it is given open (a stand-in /dev/nvidia0), then prints ``ready``.
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"


def two_instances(devices: int = 2, *, in0: int | None = None, in1: int | None = None, in1_bytes: int = GIB,
                  unplaced: int | None = None) -> Scenario:
    """``devices`` idle H200s, GPU 0 in MIG mode (55 MiB used, as an idle one reads) with MIG 0 (GI 1, 16 GiB,
    :data:`MIG0`) and MIG 1 (GI 2, 32 GiB, :data:`MIG1`); ``in0``/``in1``: a process running in each (1 GiB;
    ``in1_bytes`` for MIG 1's), ``unplaced``: one on GPU 0 with no instance id."""
    sc = Scenario.h200(devices)
    sc.set_device(0, mig=True, used_bytes=55 * MIB)
    sc.add_mig_device(0, 0, gi=1, total_bytes=16 * GIB)
    sc.add_mig_device(0, 1, gi=2, total_bytes=32 * GIB)
    if in0 is not None:
        sc.add_process(0, in0, used_bytes=GIB, gi=1, ci=0)
    if in1 is not None:
        sc.add_process(0, in1, used_bytes=in1_bytes, gi=2, ci=0)
    if unplaced is not None:
        sc.add_process(0, unplaced, used_bytes=GIB)
    return sc


@pytest.fixture
def dev(tmp_path: Path) -> tuple[Path, str]:
    """dev/ beside the scenarios the tests write in ``tmp_path`` (the simulation's stand-ins for /dev/nvidia0,
    /dev/nvidia1 and /dev/nvidiactl), and its ``device_files`` pattern."""
    d = tmp_path / "dev"
    d.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (d / name).write_text("")
    return d, f"{d}/nvidia[0-9]*:{d}/nvidiactl"


@pytest.fixture
def hold(dev: tuple[Path, str]) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """``start()``: a process holding the stand-in /dev/nvidia0 open (:data:`HOLD`), returned once it is ready;
    each is killed and reaped at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-S", "-c", HOLD, str(dev[0] / "nvidia0")], stdout=subprocess.PIPE)
        started.append(p)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


class ScriptedEvents:
    """NVML's event calls for an ``EventListener`` (tests/stub/test_events_gaps.py, test_watch_gaps.py): every GPU
    supports every event, nothing is ever delivered, and the next wait raises ``fail_next`` once when it is set."""

    missing = None

    def __init__(self) -> None:
        self.fail_next: BaseException | None = None
        self._idle = threading.Event()

    def create(self) -> object:
        return object()

    def supported(self, handle: object, index: int) -> int:
        return 0xF

    def register(self, handle: object, index: int, mask: int, event_set: object) -> None:
        return None

    def wait(self, event_set: object, timeout_ms: int) -> None:
        exc, self.fail_next = self.fail_next, None
        if exc is not None:
            raise exc
        self._idle.wait(timeout_ms / 1000)

    def free(self, event_set: object) -> int:
        return 0
