"""Init/shutdown, fork, threads, the call log, the extra symbols, faults and the timeline."""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from pathlib import Path

import pytest

from nvmlcheck._nvml._ffi import ffi
from nvmlcheck.testing import Scenario, read_call_log

from .conftest import (
    DRIVER_NOT_LOADED,
    INVALID_ARGUMENT,
    SUCCESS,
    UNINITIALIZED,
    UNKNOWN,
    Nvml,
    poll_until,
)

pytestmark = pytest.mark.stub


def test_reference_counted_init(nvml: Nvml) -> None:
    lib, probe = nvml.lib, nvml.probe
    nvml.load(Scenario.h200())
    inits, shutdowns = probe.init_total(), probe.shutdown_total()
    out = ffi.new("unsigned int *")
    assert lib.nvmlDeviceGetCount_v2(out) == UNINITIALIZED
    assert lib.nvmlShutdown() == UNINITIALIZED
    assert lib.nvmlInit_v2() == SUCCESS
    assert lib.nvmlInit() == SUCCESS
    assert lib.nvmlInit_v2() == SUCCESS
    assert probe.init_refcount() == 3
    assert lib.nvmlShutdown() == SUCCESS
    assert lib.nvmlShutdown() == SUCCESS
    assert probe.init_refcount() == 1
    assert lib.nvmlDeviceGetCount_v2(out) == SUCCESS and out[0] == 1
    assert lib.nvmlShutdown() == SUCCESS
    assert probe.init_refcount() == 0
    assert lib.nvmlDeviceGetCount_v2(out) == UNINITIALIZED
    assert lib.nvmlDeviceGetCount(out) == UNINITIALIZED
    assert lib.nvmlShutdown() == UNINITIALIZED
    assert (probe.init_total() - inits, probe.shutdown_total() - shutdowns) == (3, 3)


def test_scenario_is_read_when_the_count_goes_from_0_to_1(nvml: Nvml) -> None:
    nvml.start(Scenario.h200(devices=1))
    nvml.load(Scenario.h200(devices=3))
    assert nvml.lib.nvmlInit_v2() == SUCCESS  # nested: not re-read
    assert nvml.count() == 1
    nvml.shutdown_all()
    nvml.init()
    assert nvml.count() == 3


def test_no_scenario_means_no_driver(nvml: Nvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVMLCHECK_STUB_SCENARIO")
    assert nvml.lib.nvmlInit_v2() == DRIVER_NOT_LOADED
    assert nvml.probe.init_refcount() == 0
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(nvml.scenario_path.with_name("missing.txt")))
    assert nvml.lib.nvmlInit_v2() == UNKNOWN
    assert "missing.txt" in nvml.probe.last_error() and "cannot open" in nvml.probe.last_error()


def test_error_string_and_init_with_flags(nvml: Nvml) -> None:
    raw = ctypes.CDLL(str(nvml.probe.library_path))
    raw.nvmlErrorString.restype = ctypes.c_char_p
    raw.nvmlErrorString.argtypes = [ctypes.c_int]
    assert raw.nvmlErrorString(15) == b"GPU is lost"
    assert raw.nvmlErrorString(999) == b"Unknown Error"
    assert raw.nvmlErrorString(12345) == b"Unknown Error"
    nvml.load(Scenario.h200())
    assert raw.nvmlInitWithFlags(0) == SUCCESS
    assert nvml.probe.init_refcount() == 1


def test_call_counts(nvml: Nvml) -> None:
    probe = nvml.probe
    nvml.start(Scenario.h200())
    before_all, before_count = probe.call_count(), probe.call_count("nvmlDeviceGetCount_v2")
    for _ in range(5):
        nvml.count()
    nvml.handle(0)
    assert probe.call_count("nvmlDeviceGetCount_v2") - before_count == 5
    assert probe.call_count() - before_all == 6
    assert probe.call_count("no_such_function") == 0


def test_fork_child_is_uninitialised_until_it_inits(nvml: Nvml) -> None:
    nvml.start(Scenario.h200(devices=2))
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report through the pipe, never return into pytest
        status = 1
        try:
            os.close(read_end)
            out = ffi.new("unsigned int *")
            result = {
                "count_before": nvml.lib.nvmlDeviceGetCount_v2(out),
                "refcount_before": nvml.probe.init_refcount(),
                "shutdown_before": nvml.lib.nvmlShutdown(),
                "init": nvml.lib.nvmlInit_v2(),
            }
            result["count_after"] = nvml.lib.nvmlDeviceGetCount_v2(out)
            result["devices"] = out[0]
            result["refcount_after"] = nvml.probe.init_refcount()
            result["shutdown"] = nvml.lib.nvmlShutdown()
            os.write(write_end, json.dumps(result).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert json.loads(data) == {
        "count_before": UNINITIALIZED,
        "refcount_before": 0,
        "shutdown_before": UNINITIALIZED,
        "init": SUCCESS,
        "count_after": SUCCESS,
        "devices": 2,
        "refcount_after": 1,
        "shutdown": SUCCESS,
    }
    # the parent is untouched
    assert nvml.probe.init_refcount() == 1
    assert nvml.count() == 2


def test_threads_are_serialised_and_counted(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, 4_000_001, used_bytes=1)
    scenario.race(0, "compute", grow=1, count=0)  # every list call mutates the list
    nvml.start(scenario)
    before = nvml.probe.call_count("nvmlDeviceGetComputeRunningProcesses_v3")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            h = nvml.handle(0)
            count = ffi.new("unsigned int *")
            for _ in range(200):
                count[0] = 0
                nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3(h, count, ffi.NULL)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert nvml.probe.call_count("nvmlDeviceGetComputeRunningProcesses_v3") - before == 800
    count = ffi.new("unsigned int *", 0)
    nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3(nvml.handle(0), count, ffi.NULL)
    assert count[0] == 1 + 800  # every call grew the list by one: no update was lost


def test_call_log(nvml: Nvml, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("NVMLCHECK_STUB_LOG", str(log))
    nvml.start(Scenario.h200())
    nvml.count()
    thread_tid: list[int] = []

    def in_thread() -> None:
        nvml.handle(0)
        thread_tid.append(threading.get_native_id())

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    nvml.shutdown_all()
    entries = read_call_log(log)
    assert [e.function for e in entries] == [
        "nvmlInit_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlShutdown",
    ]
    assert {e.pid for e in entries} == {os.getpid()}
    assert entries[0].tid == threading.get_native_id()
    assert entries[2].tid == thread_tid[0] != entries[0].tid
    monkeypatch.delenv("NVMLCHECK_STUB_LOG")
    nvml.start(Scenario.h200())
    assert len(read_call_log(log)) == 4  # not logging any more


# ---------------------------------------------------------------------------------------------------------------
# faults


def count_rc(nvml: Nvml) -> int:
    return int(nvml.lib.nvmlDeviceGetCount_v2(ffi.new("unsigned int *")))


def test_fault_after_and_count(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlDeviceGetCount_v2", 17, after=2, count=3)
    nvml.start(scenario)
    assert [count_rc(nvml) for _ in range(7)] == [SUCCESS, SUCCESS, 17, 17, 17, SUCCESS, SUCCESS]


def test_sticky_fault(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlDeviceGetCount_v2", 999, after=1)
    nvml.start(scenario)
    assert [count_rc(nvml) for _ in range(6)] == [SUCCESS] + [UNKNOWN] * 5


def test_fault_restricted_to_a_device(nvml: Nvml) -> None:
    scenario = Scenario.h200(devices=2)
    scenario.fault("nvmlDeviceGetMemoryInfo_v2", 15, device=1, count=1)
    scenario.fault("nvmlDeviceGetHandleByIndex_v2", 2, device=0, after=1)
    nvml.start(scenario)
    h0, h1 = nvml.handle(0), nvml.handle(1)
    assert [nvml.memory_v2(h)[0] for h in (h0, h0, h1, h0, h1)] == [SUCCESS, SUCCESS, 15, SUCCESS, SUCCESS]
    out = ffi.new("nvmlDevice_t *")
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(0, out) == INVALID_ARGUMENT
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(1, out) == SUCCESS


def test_fault_delay(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlDeviceGetCount_v2", delay_ms=150, count=1)  # slow but answers
    scenario.fault("nvmlDeviceGetCount", 10, delay_ms=100, count=1)  # slow and fails
    nvml.start(scenario)
    start = time.monotonic()
    assert nvml.count() == 1
    assert time.monotonic() - start >= 0.150
    start = time.monotonic()
    assert nvml.lib.nvmlDeviceGetCount(ffi.new("unsigned int *")) == 10
    assert time.monotonic() - start >= 0.100
    assert nvml.lib.nvmlDeviceGetCount(ffi.new("unsigned int *")) == SUCCESS


def test_init_failure(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlInit_v2", 18)
    nvml.load(scenario)
    inits = nvml.probe.init_total()
    assert nvml.lib.nvmlInit_v2() == 18
    assert nvml.probe.init_refcount() == 0
    assert nvml.probe.init_total() == inits
    assert count_rc(nvml) == UNINITIALIZED
    assert nvml.lib.nvmlInit() == SUCCESS  # a fault names one function
    assert nvml.lib.nvmlInit_v2() == 18  # nested inits count too


def test_nested_init_fault_after(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlInit_v2", 999, after=1, count=1)
    nvml.load(scenario)
    assert [nvml.lib.nvmlInit_v2() for _ in range(3)] == [SUCCESS, UNKNOWN, SUCCESS]
    assert nvml.probe.init_refcount() == 2


def test_hung_init_does_not_block_other_threads(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlInit_v2", delay_ms=400)
    nvml.load(scenario)
    results: list[int] = []
    t = threading.Thread(target=lambda: results.append(nvml.lib.nvmlInit_v2()))
    inits = nvml.probe.call_count("nvmlInit_v2")
    started = time.monotonic()
    t.start()
    poll_until(lambda: nvml.probe.call_count("nvmlInit_v2") > inits)  # the init is in its delay now
    assert count_rc(nvml) == UNINITIALIZED  # answered at once, not blocked behind the hanging init
    assert results == []
    t.join()
    assert results == [SUCCESS]
    assert time.monotonic() - started >= 0.400
    assert nvml.probe.init_refcount() == 1


# ---------------------------------------------------------------------------------------------------------------
# timeline


def test_timeline_by_call(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.at_call(3).set_device(0, used_bytes=4096)
    scenario.at_call(5).fault("nvmlDeviceGetCount_v2", 999, count=1)
    nvml.start(scenario)
    h = nvml.handle(0)  # 1
    assert nvml.memory_v2(h)[1][3] == 0  # 2
    assert nvml.memory_v2(h)[1][3] == 4096  # 3
    assert count_rc(nvml) == SUCCESS  # 4
    assert count_rc(nvml) == UNKNOWN  # 5
    assert count_rc(nvml) == SUCCESS  # 6


def test_timeline_counts_every_exported_function(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.at_call(2).set_device(0, used_bytes=1)
    nvml.start(scenario)
    assert nvml.lib.nvmlInit() == SUCCESS  # call 1 (nested init)
    assert nvml.used_v2() == 1  # handle is call 2


def test_timeline_by_ms(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.at_ms(150).set_device(0, used_bytes=8192)
    started = time.monotonic()
    nvml.start(scenario)
    changed = poll_until(lambda: nvml.used_v2() == 8192, timeout=10)
    assert changed - started >= 0.150
    assert nvml.used_v2() == 8192


def test_timeline_restarts_with_each_load(nvml: Nvml) -> None:
    scenario = Scenario.h200()
    scenario.at_call(2).set_device(0, used_bytes=1)
    nvml.start(scenario)
    h = nvml.handle(0)  # call 1
    assert nvml.memory_v2(h)[1][3] == 1  # call 2
    nvml.shutdown_all()
    nvml.init()  # re-read: used is 0 again until call 2
    assert [nvml.memory_v2(h)[1][3] for _ in range(3)] == [0, 1, 1]
