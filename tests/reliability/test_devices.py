"""Faults while reading devices through NVML, judged end to end by ``Session.snapshot`` and
``Session.wait_until_clean``: one device denied or lost (the others keep reporting, the wait fails fast naming it),
older drivers, struct-layout mismatches, process lists that grow, flap or hide their memory, and memory that comes
back long after its process. Sources: FACTS.md (driver and NVML behaviour)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

import nvmlcheck as nc
from nvmlcheck._nvml import library
from nvmlcheck._nvml.calls import MAX_LIST_ATTEMPTS
from nvmlcheck.testing import Scenario, StepClock, build_stub
from nvmlcheck.wait import PollPolicy, TracePoint

from ._support import GIB, MIB, Stub

pytestmark = pytest.mark.stub


class _Enough(Exception):
    """Stops a wait from its on_poll callback once enough polls were seen."""


def _poll_boundaries(stub: Stub, scenario: Scenario, polls: int, *, stable_polls: int = 2) -> list[int]:
    """Dry run: the stub's call numbers (counted from the loading init, as ``at call=`` counts them) at which each of
    the first ``polls`` polls of a wait ended; element 0 is where the wait started. The wait's NVML calls are
    deterministic, so a scenario of the same shape can put timeline changes exactly between polls."""
    base = stub.probe.call_count()
    marks: list[int] = []

    def mark() -> None:
        marks.append(stub.probe.call_count() - base - 1)  # -1: the loading init is not counted by the timeline

    def on_poll(_: TracePoint) -> None:
        mark()
        if len(marks) > polls:
            raise _Enough

    with stub.open(scenario) as gpus:
        gpus.snapshot(fields=nc.Fields.WAIT)  # warm: identity and versions are read once
        mark()
        with pytest.raises(_Enough):
            gpus.wait_until_clean(timeout=None, on_poll=on_poll, policy=FULL_POLLS, stable_polls=stable_polls)
    return marks


#: Every poll reads memory and the three process lists (no memory-only probe polls, whose use depends on time), so
#: the NVML calls of a wait are the same in every run.
FULL_POLLS = PollPolicy(interval_s=0, full_every_s=0)


def _holder(devices: int = 1) -> Scenario:
    sc = Scenario.h200(devices)
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    return sc


# --- permission denied on a single call ----------------------------------------------------------------------------


def test_permission_denied_on_one_call_fails_that_gpu_only(stub: Stub) -> None:
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", code=4, device=1)
    with stub.open(sc) as gpus:
        snap = gpus.snapshot()
        assert [d.index for d in snap.devices] == [0]
        (failure,) = snap.failures
        assert failure.index == 1 and isinstance(failure.error, nc.NoPermission)
        assert failure.uuid == "GPU-00000000-0000-0000-0000-000000000001"
        assert gpus.wait_until_clean(timeout=30, devices=[0]).clean  # the readable GPU can still be waited on
        polls: list[TracePoint] = []
        with pytest.raises(nc.NoPermission) as info:
            gpus.wait_until_clean(timeout=10, on_poll=polls.append)
        assert polls == []  # fails fast: the first poll raised (no poll completed), not the deadline
        assert info.value.device_index == 1 and "GPU 1" in str(info.value)


def test_permission_denied_on_the_serial_number_is_an_unknown_not_a_failure(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetSerial", code=4)  # serials are often restricted on consumer boards
    with stub.open(sc) as gpus:
        (d,) = gpus.snapshot().devices
        assert d.serial is None and "NO_PERMISSION" in (d.why_unknown("serial") or "")
        assert gpus.wait_until_clean(timeout=30).clean


# --- lost GPUs -------------------------------------------------------------------------------------------------------


def test_gpu_lost_at_handle_time(stub: Stub) -> None:
    sc = Scenario.h200(devices=3)
    sc.set_device(1, lost=True)  # nvmlDeviceGetHandleByIndex_v2 answers GPU_IS_LOST
    with stub.open(sc) as gpus:
        snap = gpus.snapshot()
        assert [d.index for d in snap.devices] == [0, 2]
        (failure,) = snap.failures
        assert failure.index == 1 and failure.uuid is None and isinstance(failure.error, nc.GpuLost)
        assert gpus.wait_until_clean(timeout=30, devices=[0, 2]).clean
        with pytest.raises(nc.GpuLost) as info:
            gpus.wait_until_clean(timeout=10)
        assert "GPU 1" in str(info.value) and "reset" in str(info.value)


def test_gpu_lost_mid_wait_fails_the_wait_fast_naming_it(stub: Stub) -> None:
    sc = _holder(devices=3)  # GPU 0 stays busy: the wait cannot end clean before the loss
    sc.at_call(120).set_device(2, lost=True)
    polls: list[TracePoint] = []
    with stub.open(sc) as gpus:
        gpus.snapshot()
        with pytest.raises(nc.GpuLost) as info:
            gpus.wait_until_clean(timeout=30, on_poll=polls.append)
        assert info.value.device_index == 2 and "GPU 2" in str(info.value)
        # Polls before the loss saw three readable GPUs; the poll that saw it raised at once (no poll after it).
        assert len(polls) >= 3 and all(p.failures == 0 and len(p.devices) == 3 for p in polls)
        after = gpus.snapshot()  # the others keep reporting
        assert [d.index for d in after.devices] == [0, 1] and [f.index for f in after.failures] == [2]
        assert after.devices[0].memory is not None and after.devices[0].memory.used_bytes == GIB


# --- older driver: missing versioned symbols -----------------------------------------------------------------------


@pytest.fixture
def old_driver(stub: Stub) -> Iterator[Stub]:
    """A build with none of the _v2/_v3 process lists and no nvmlDeviceGetMemoryInfo_v2 (a driver before 470)."""
    old = Stub(build_stub(("STUB_NO_PROC_V3", "STUB_NO_PROC_V2", "STUB_NO_MEMORY_V2")), stub.scenario_path)
    yield old
    assert old.probe.init_refcount() == 0
    assert library._loaded[str(old.library)].refcount == 0


def test_older_driver_without_versioned_symbols(old_driver: Stub) -> None:
    with old_driver.open(Scenario.h200()) as gpus:
        backend = gpus.backend
        assert isinstance(backend, nc.backends.nvml.NvmlBackend)
        assert backend.symbols.memory == "nvmlDeviceGetMemoryInfo"
        assert backend.symbols.compute_processes == "nvmlDeviceGetComputeRunningProcesses"
        baseline = gpus.snapshot()
        (d,) = baseline.devices
        assert d.memory is not None and d.memory.used_includes_reserved and d.memory.reserved_bytes is None
        # v1 "used" counts the driver's reservation (615 MiB at idle on an H200, FACTS): a fixed limit cannot
        # tell idle from busy, so the default predicate never calls it clean; it says what to do instead.
        t = StepClock(2.0)  # a fake clock: the timeout comes after a completed poll, however loaded the machine
        with pytest.raises(nc.WaitTimeout, match="memory_back_to"):
            gpus.wait_until_clean(timeout=30, clock=t.clock, sleep=t.sleep)
        assert gpus.wait_until_clean(timeout=30, predicate=nc.no_processes() & nc.memory_back_to(baseline)).clean


def test_older_driver_reports_processes_through_the_legacy_call(old_driver: Stub) -> None:
    with old_driver.open(_holder()) as gpus:
        (p,) = gpus.snapshot().devices[0].compute_processes or ()
        assert (p.pid, p.used_bytes, p.gpu_instance_id) == (4_000_001, GIB, None)  # the v1 struct has no MIG ids
        assert old_driver.probe.call_count("nvmlDeviceGetComputeRunningProcesses") > 0


# --- struct layout mismatch, growing and shrinking lists -------------------------------------------------------------


def test_struct_layout_mismatch_fails_the_wait_with_corrupt_data(stub: Stub) -> None:
    sc = Scenario.h200(devices=2)
    for i in range(3):
        sc.add_process(1, 4_000_010 + i, used_bytes=GIB)
    sc.quirk(proc_struct="535.43")  # _v3 calls write 32-byte entries into 24-byte slots
    with stub.open(sc) as gpus:
        snap = gpus.snapshot()
        assert [d.index for d in snap.devices] == [0]  # GPU 0 has no process: nothing shifted to misread
        assert isinstance(snap.failures[0].error, nc.CorruptData) and snap.failures[0].index == 1
        with pytest.raises(nc.CorruptData) as info:
            gpus.wait_until_clean(timeout=10)
        assert "GPU 1" in str(info.value) and "impossible PID" in str(info.value)


def test_list_that_keeps_growing_is_never_truncated_and_never_clean(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", code=7)  # INSUFFICIENT_SIZE on every attempt
    before = stub.probe.call_count("nvmlDeviceGetComputeRunningProcesses_v3")
    with stub.open(sc) as gpus:
        t = StepClock(2.0)  # a fake clock: the timeout comes after a completed poll, however loaded the machine
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=30, policy=0.01, clock=t.clock, sleep=t.sleep)
        assert "kept growing" in str(info.value) and "truncated" in str(info.value)
    calls = stub.probe.call_count("nvmlDeviceGetComputeRunningProcesses_v3") - before
    assert calls > 0 and calls % MAX_LIST_ATTEMPTS == 0  # bounded: exactly the retry bound per read


def test_list_growing_between_the_two_calls_is_read_whole_in_a_wait(stub: Stub) -> None:
    sc = Scenario.h200()
    for i in range(70):  # more than the first buffer holds: the size query and the fill are separate calls
        sc.add_process(0, 3_000_000 + i, used_bytes=MIB)
    sc.race(0, "compute", grow=100, count=0)  # +100 entries after every answer
    points: list[TracePoint] = []
    t = StepClock(2.0)  # a fake clock: the timeout comes after a completed poll, however loaded the machine
    with stub.open(sc) as gpus, pytest.raises(nc.WaitTimeout):
        gpus.wait_until_clean(timeout=30, policy=0.01, on_poll=points.append, clock=t.clock, sleep=t.sleep)
    seen = [n for p in points if not p.partial for n in p.process_counts]
    assert seen and all(n is not None and (n - 70) % 100 == 0 for n in seen)  # whole lists as of one answer


# --- processes whose memory is unknown or invisible ------------------------------------------------------------


def test_process_memory_not_available_is_unknown_and_not_clean(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, kind="graphics", used_bytes=None, holds_bytes=2 * GIB)
    with stub.open(sc) as gpus:
        (p,) = gpus.snapshot().devices[0].processes or ()
        assert p.used_bytes is None  # NVML's "not available" sentinel: unknown, never 0
        t = StepClock(2.0)  # a fake clock: the timeout comes after a completed poll, however loaded the machine
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=30, clock=t.clock, sleep=t.sleep)
        assert "pid 4000001" in str(info.value) and "unknown amount" in str(info.value)


def test_memory_used_with_no_visible_process_is_not_clean_and_says_so(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)  # another PID namespace's process: NVML lists host PIDs we cannot see
    t = StepClock(2.0)  # a fake clock: the timeout comes after a completed poll, however loaded the machine
    with stub.open(sc) as gpus, pytest.raises(nc.WaitTimeout) as info:
        gpus.wait_until_clean(timeout=30, clock=t.clock, sleep=t.sleep)
    assert "no visible process" in str(info.value) and "4.0 GiB" in str(info.value)


# --- a process list that flaps between polls -------------------------------------------------------------------------


def test_flapping_process_list_needs_stable_polls(stub: Stub) -> None:
    marks = _poll_boundaries(stub, _holder(), 12)
    sc = _holder()
    for k in (3, 5, 7):  # polls 3, 5 and 7 see the GPU clean, the polls between see the holder back
        sc.at_call(marks[k - 1] + 1).remove_process(0, 4_000_001)
        sc.at_call(marks[k] + 1).add_process(0, 4_000_001, used_bytes=GIB)
    sc.at_call(marks[8] + 1).remove_process(0, 4_000_001)  # gone for good from poll 9 on
    flags: list[bool] = []
    with stub.open(sc) as gpus:
        gpus.snapshot(fields=nc.Fields.WAIT)
        result = gpus.wait_until_clean(timeout=10, policy=FULL_POLLS, on_poll=lambda p: flags.append(p.clean))
    assert flags == [False, False, True, False, True, False, True, False, True, True]
    assert result.polls == 10 and result.last_dirty_ns is not None

    flags.clear()
    with stub.open(sc) as gpus:  # the same flapping with stable_polls=1 is fooled at poll 3
        gpus.snapshot(fields=nc.Fields.WAIT)
        assert gpus.wait_until_clean(
            timeout=10, policy=FULL_POLLS, stable_polls=1, on_poll=lambda p: flags.append(p.clean)
        )
    assert flags == [False, False, True]


# --- memory that comes back long after the process is gone -----------------------------------------------------------


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


def test_memory_back_long_after_the_process_is_gone(stub: Stub, sleeper: subprocess.Popen[bytes]) -> None:
    sc = Scenario.h200()
    # Off the process list as soon as it exits, memory released 400 ms later (FACTS: the list can empty before the
    # memory is back; a zombie or D-state process can hold it much longer).
    sc.add_process(0, sleeper.pid, used_bytes=8 * GIB, bound=True, list_ms=0, release_ms=400)
    points: list[TracePoint] = []
    with stub.open(sc) as gpus:
        result = nc.kill_and_wait(gpus, [sleeper.pid], timeout=10, on_poll=points.append)
    (pid,) = result.pids
    assert pid.off_gpu_ns is not None and pid.exited_ns is not None
    assert result.clean_ns >= 400e6  # never clean before the memory is back, though the list emptied long before
    assert pid.off_gpu_ns < result.clean_ns  # off the list first; the polls in between saw the memory held:
    listless_but_held = [p for p in points if p.process_counts == (0,) and (p.used_bytes[0] or 0) >= 8 * GIB]
    assert listless_but_held and not any(p.clean for p in listless_but_held)



def test_off_the_list_is_never_stamped_after_clean(stub: Stub, sleeper: subprocess.Popen[bytes]) -> None:
    # Off the list and memory back on the same poll. Every clock reading moves the fake clock on, as load would
    # move the real one between the poll's query and the callback that looks at its lists: a reading taken there
    # fell after the poll's clean stamp (issue 24: off_gpu 139.821522 ms, clean 139.810393 ms under load).
    sc = Scenario.h200()
    sc.add_process(0, sleeper.pid, used_bytes=8 * GIB, bound=True, list_ms=0, release_ms=0)
    t = StepClock(1e-5)
    with stub.open(sc) as gpus:
        result = nc.kill_and_wait(gpus, [sleeper.pid], timeout=1e5, clock=t.clock, sleep=t.sleep)
    (pid,) = result.pids
    assert pid.off_gpu_ns is not None
    assert pid.off_gpu_ns <= result.clean_ns <= result.confirmed_ns
