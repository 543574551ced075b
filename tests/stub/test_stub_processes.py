"""Process lists in the stub: kinds, struct versions, `na`, the two-call pattern, the race, the 535.43 quirk, and
pid-bound processes tied to real child processes."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nvmlcheck._nvml._ffi import ffi
from nvmlcheck.testing import Scenario

from .conftest import INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_AVAILABLE, NOT_MIG, SUCCESS, Nvml, poll_until

pytestmark = pytest.mark.stub

MIB = 2**20


def test_kinds_versions_and_mig_ids(nvml: Nvml) -> None:
    scenario = Scenario.h200(devices=2)
    scenario.add_process(0, 4_000_001, "compute", used_bytes=10 * MIB)
    scenario.add_process(0, 4_000_002, "compute", used_bytes=None)
    scenario.add_process(0, 4_000_001, "graphics", used_bytes=3 * MIB, gi=1, ci=2)
    scenario.add_process(0, 4_000_003, "mps", used_bytes=5 * MIB)
    scenario.add_process(1, 4_000_004, "compute", used_bytes=7 * MIB)
    nvml.start(scenario)
    h0, h1 = nvml.handle(0), nvml.handle(1)
    for version in (2, 3):
        assert nvml.processes(h0, "compute", version) == [
            (4_000_001, 10 * MIB, NOT_MIG, NOT_MIG),
            (4_000_002, NOT_AVAILABLE, NOT_MIG, NOT_MIG),
        ]
        assert nvml.processes(h0, "graphics", version) == [(4_000_001, 3 * MIB, 1, 2)]
        assert nvml.processes(h0, "mps", version) == [(4_000_003, 5 * MIB, NOT_MIG, NOT_MIG)]
        assert nvml.processes(h1, "compute", version) == [(4_000_004, 7 * MIB, NOT_MIG, NOT_MIG)]
        assert nvml.processes(h1, "graphics", version) == []
    assert nvml.processes(h0, "compute", 1) == [(4_000_001, 10 * MIB), (4_000_002, NOT_AVAILABLE)]
    assert nvml.processes(h0, "graphics", 1) == [(4_000_001, 3 * MIB)]
    # used = held by all entries of all kinds; `na` holds nothing by default
    assert nvml.used_v2(0) == 18 * MIB
    assert nvml.used_v2(1) == 7 * MIB


def test_two_call_pattern(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    for i in range(3):
        scenario.add_process(0, 4_000_010 + i, used_bytes=i)
    nvml.start(scenario)
    h = nvml.handle(0)
    fn = nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ffi.new("unsigned int *", 0)
    assert fn(h, count, ffi.NULL) == INSUFFICIENT_SIZE and count[0] == 3
    infos: Any = ffi.new("nvmlProcessInfo_v2_t[8]")
    count[0] = 2
    assert fn(h, count, infos) == INSUFFICIENT_SIZE and count[0] == 3
    assert infos[0].pid == 0  # nothing written on INSUFFICIENT_SIZE
    count[0] = 8
    assert fn(h, count, infos) == SUCCESS and count[0] == 3
    assert [infos[i].pid for i in range(3)] == [4_000_010, 4_000_011, 4_000_012]
    assert infos[3].pid == 0  # nothing past the listed entries
    count[0] = 3
    assert fn(h, count, ffi.NULL) == INVALID_ARGUMENT
    count[0] = 3
    assert fn(h, count, infos) == SUCCESS and count[0] == 3
    # an empty list: SUCCESS and 0, infos may be NULL
    count[0] = 0
    assert nvml.lib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, count, ffi.NULL) == SUCCESS and count[0] == 0
    count[0] = 5
    assert nvml.lib.nvmlDeviceGetGraphicsRunningProcesses_v3(h, count, ffi.NULL) == SUCCESS and count[0] == 0


def test_remove_and_update_in_the_timeline(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, 4_000_001, used_bytes=MIB)
    scenario.add_process(0, 4_000_002, used_bytes=2 * MIB)
    step = scenario.at_call(4)
    step.remove_process(0, 4_000_001)
    step.add_process(0, 4_000_002, used_bytes=5 * MIB)  # the same entry: updated in place
    step.add_process(0, 4_000_003, "mps", used_bytes=MIB)
    nvml.start(scenario)
    h = nvml.handle(0)  # call 1
    assert nvml.used_v2(0) == 3 * MIB  # calls 2 (handle) and 3 (memory)
    assert nvml.processes(h) == [(4_000_002, 5 * MIB, NOT_MIG, NOT_MIG)]  # calls 4 and 5
    assert nvml.processes(h, "mps") == [(4_000_003, MIB, NOT_MIG, NOT_MIG)]
    assert nvml.used_v2(0) == 6 * MIB


def test_race_grows_the_list_between_the_two_calls(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, 4_000_001, used_bytes=MIB)
    scenario.race(0, "compute", grow=2, count=2)
    scenario.race(0, "graphics", grow=-1, count=0)
    scenario.add_process(0, 4_000_005, "graphics", used_bytes=MIB)
    scenario.add_process(0, 4_000_006, "graphics", used_bytes=MIB)
    nvml.start(scenario)
    h = nvml.handle(0)
    fn = nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ffi.new("unsigned int *", 0)
    assert fn(h, count, ffi.NULL) == INSUFFICIENT_SIZE and count[0] == 1  # answered, then grew to 3
    infos: Any = ffi.new("nvmlProcessInfo_v2_t[]", 1)
    assert fn(h, count, infos) == INSUFFICIENT_SIZE and count[0] == 3  # the race; grew to 5 afterwards
    big: Any = ffi.new("nvmlProcessInfo_v2_t[]", 16)
    count[0] = 16
    assert fn(h, count, big) == SUCCESS and count[0] == 5  # count=2 races are over
    assert [big[i].pid for i in range(5)] == [4_000_001, 4_100_000, 4_100_001, 4_100_002, 4_100_003]
    assert [big[i].usedGpuMemory for i in range(1, 5)] == [MIB] * 4
    expected = [4_000_001, 4_100_000, 4_100_001, 4_100_002, 4_100_003]
    assert nvml.processes(h) == [(pid, MIB, NOT_MIG, NOT_MIG) for pid in expected]
    assert nvml.used_v2(0) == 7 * MIB  # 5 compute + 2 graphics, before the graphics list is read
    # graphics: every answered call removes the last entry
    assert nvml.pids(0, "graphics") == [4_000_005]  # size query saw 2, fill saw 1 (after one removal)
    assert nvml.pids(0, "graphics") == []


def test_quirk_535_43_writes_32_byte_entries(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, 4_000_001, used_bytes=0x1111, gi=3, ci=4)
    scenario.add_process(0, 4_000_002, used_bytes=0x2222)
    scenario.add_process(0, 4_000_003, used_bytes=0x3333)
    scenario.quirk("535.43")
    nvml.start(scenario)
    h = nvml.handle(0)
    capacity = 4
    raw: Any = ffi.new("unsigned char[]", capacity * 24 + 64)
    for i in range(len(raw)):
        raw[i] = 0xEE
    count = ffi.new("unsigned int *", capacity)
    infos = ffi.cast("nvmlProcessInfo_v2_t *", raw)
    assert nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, count, infos) == SUCCESS
    assert count[0] == 3
    data = bytes(ffi.buffer(raw))
    entries = [data[32 * i : 32 * i + 32] for i in range(3)]
    expected = [(4_000_001, 0x1111, 3, 4), (4_000_002, 0x2222, NOT_MIG, NOT_MIG), (4_000_003, 0x3333, NOT_MIG, NOT_MIG)]
    for entry, (pid, used, gi, ci) in zip(entries, expected, strict=True):
        assert struct.unpack_from("<I", entry, 0)[0] == pid
        assert struct.unpack_from("<Q", entry, 8)[0] == used
        assert struct.unpack_from("<II", entry, 16) == (gi, ci)
        assert struct.unpack_from("<Q", entry, 24)[0] == 0  # usedGpuCcProtectedMemory
    assert data[96:] == b"\xee" * (len(data) - 96)  # nothing past the 32-byte entries, within capacity*24
    # read with the 24-byte struct, the second entry is shifted garbage: its pid is the first's cc-memory low word
    assert infos[1].pid != 4_000_002
    # the v2 call keeps the 24-byte layout
    assert nvml.processes(h, "compute", 2)[1] == (4_000_002, 0x2222, NOT_MIG, NOT_MIG)


def test_quirk_535_43_never_writes_past_the_callers_buffer(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    for i in range(4):
        scenario.add_process(0, 4_000_001 + i, used_bytes=i)
    scenario.quirk()
    nvml.start(scenario)
    raw: Any = ffi.new("unsigned char[]", 4 * 24 + 32)
    for i in range(len(raw)):
        raw[i] = 0xEE
    count = ffi.new("unsigned int *", 4)
    h = nvml.handle(0)
    assert nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, count, ffi.cast("nvmlProcessInfo_v2_t *", raw)) == 0
    data = bytes(ffi.buffer(raw))
    assert data[96:] == b"\xee" * 32  # 4 entries of 32 bytes would need 128: cut at 96
    assert struct.unpack_from("<I", data, 64)[0] == 4_000_003  # the third entry starts at 64


# ---------------------------------------------------------------------------------------------------------------
# pid-bound processes


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def proc_state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_bound_process_is_released_after_its_exit(nvml: Nvml, child: subprocess.Popen[bytes]) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, child.pid, used_bytes=16 * 2**30, bound=True, list_ms=50, release_ms=300)
    nvml.start(scenario)
    assert nvml.pids() == [child.pid]
    assert nvml.used_v2() == 16 * 2**30
    killed = time.monotonic()
    child.kill()
    child.wait()
    gone_from_list = poll_until(lambda: nvml.pids() == [])
    released = poll_until(lambda: nvml.used_v2() == 0)
    # T is the first call after the exit, so both happen at least list_ms / release_ms after the kill
    assert gone_from_list - killed >= 0.050
    assert released - killed >= 0.300
    assert released >= gone_from_list
    assert nvml.pids() == []  # and it stays gone


def test_bound_process_with_zero_delays_goes_at_once(nvml: Nvml, child: subprocess.Popen[bytes]) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, child.pid, used_bytes=MIB, bound=True)
    scenario.add_process(0, 4_000_001, used_bytes=MIB)  # not bound: stays
    nvml.start(scenario)
    assert nvml.pids() == [child.pid, 4_000_001]
    child.kill()
    child.wait()
    assert nvml.pids() == [4_000_001]
    assert nvml.used_v2() == MIB


@pytest.mark.parametrize("zombie_holds", [True, False])
def test_zombie(nvml: Nvml, child: subprocess.Popen[bytes], zombie_holds: bool) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, child.pid, used_bytes=MIB, bound=True, zombie_holds=zombie_holds)
    nvml.start(scenario)
    os.kill(child.pid, signal.SIGKILL)  # not reaped: a zombie
    poll_until(lambda: proc_state(child.pid) == "Z")
    if zombie_holds:
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:  # a zombie keeps holding, however often we ask
            assert nvml.pids() == [child.pid]
            assert nvml.used_v2() == MIB
        child.wait()  # reaped: now it is gone
        assert nvml.pids() == []
        assert nvml.used_v2() == 0
    else:
        assert nvml.pids() == []
        assert nvml.used_v2() == 0
        assert proc_state(child.pid) == "Z"  # it was the zombie state, not the reaping, that counted
