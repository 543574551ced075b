"""Device state in the stub: defaults, every device key, unsupported fields, lost devices, string buffers, memory."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nvmlcheck._nvml._ffi import ffi
from nvmlcheck.testing import UNSUPPORTED_FIELDS, Scenario

from .conftest import (
    ARGUMENT_VERSION_MISMATCH,
    GPU_IS_LOST,
    INSUFFICIENT_SIZE,
    INVALID_ARGUMENT,
    MEMORY_V2_VERSION,
    NOT_SUPPORTED,
    PROCESS_CALLS,
    SUCCESS,
    Nvml,
)

pytestmark = pytest.mark.stub

H200_TOTAL = 150_754_820_096
H200_RESERVED = 644_939_776
CLOCK_FNS = ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetApplicationsClock")


def pci(nvml: Nvml, handle: Any, fn: str = "nvmlDeviceGetPciInfo_v3") -> tuple[int, Any]:
    info: Any = ffi.new("nvmlPciInfo_t *")
    return getattr(nvml.lib, fn)(handle, info), info


def retired(nvml: Nvml, handle: Any, cause: int) -> tuple[int, list[tuple[int, int]]]:
    count = ffi.new("unsigned int *", 0)
    rc = nvml.lib.nvmlDeviceGetRetiredPages_v2(handle, cause, count, ffi.NULL, ffi.NULL)
    if rc != INSUFFICIENT_SIZE:
        return rc, []
    addresses: Any = ffi.new("unsigned long long[]", count[0])
    timestamps: Any = ffi.new("unsigned long long[]", count[0])
    rc = nvml.lib.nvmlDeviceGetRetiredPages_v2(handle, cause, count, addresses, timestamps)
    return rc, [(int(addresses[i]), int(timestamps[i])) for i in range(count[0])]


def test_defaults_are_an_idle_h200(nvml: Nvml) -> None:
    nvml.start("nvmlcheck-stub-scenario 1\ndevice index=0\ndevice index=1\n")
    lib = nvml.lib
    assert nvml.count() == 2
    h0, h1 = nvml.handle(0), nvml.handle(1)

    assert nvml.string("nvmlDeviceGetName", h0) == (SUCCESS, "NVIDIA H200")
    assert nvml.string("nvmlDeviceGetUUID", h0) == (SUCCESS, "GPU-00000000-0000-0000-0000-000000000000")
    assert nvml.string("nvmlDeviceGetUUID", h1) == (SUCCESS, "GPU-00000000-0000-0000-0000-000000000001")
    assert nvml.string("nvmlDeviceGetSerial", h0) == (SUCCESS, "1650924060042")
    minor = ffi.new("unsigned int *")
    assert lib.nvmlDeviceGetMinorNumber(h1, minor) == SUCCESS and minor[0] == 1

    rc, info = pci(nvml, h1)
    assert rc == SUCCESS
    assert ffi.string(info.busId) == b"00000000:02:00.0"
    assert ffi.string(info.busIdLegacy) == b"0000:02:00.0"
    assert (info.domain, info.bus, info.device, info.pciDeviceId) == (0, 2, 0, 0x233510DE)

    assert nvml.memory_v2(h0) == (SUCCESS, (H200_TOTAL, H200_RESERVED, H200_TOTAL - H200_RESERVED, 0))
    assert nvml.memory_v1(h0) == (SUCCESS, (H200_TOTAL, H200_TOTAL - H200_RESERVED, H200_RESERVED))

    expected = ((345, 345, 3201, 765), (1980, 1980, 3201, 1545), (1980, 1980, 3201, 1545))
    for fn, values in zip(CLOCK_FNS, expected, strict=True):
        assert tuple(nvml.clock(fn, h0, domain) for domain in range(4)) == tuple((SUCCESS, v) for v in values)

    reasons = ffi.new("unsigned long long *")
    assert lib.nvmlDeviceGetCurrentClocksEventReasons(h0, reasons) == SUCCESS and reasons[0] == 1
    assert lib.nvmlDeviceGetCurrentClocksThrottleReasons(h0, reasons) == SUCCESS and reasons[0] == 1

    # as measured on Hopper: retired pages are not supported, remapped rows are
    count = ffi.new("unsigned int *", 0)
    assert lib.nvmlDeviceGetRetiredPages(h0, 0, count, ffi.NULL) == NOT_SUPPORTED
    pending = ffi.new("nvmlEnableState_t *")
    assert lib.nvmlDeviceGetRetiredPagesPendingStatus(h0, pending) == NOT_SUPPORTED
    rows = [ffi.new("unsigned int *", 7) for _ in range(4)]
    assert lib.nvmlDeviceGetRemappedRows(h0, *rows) == SUCCESS
    assert [r[0] for r in rows] == [0, 0, 0, 0]

    for kind in ("compute", "graphics", "mps"):
        for version in (1, 2, 3):
            assert nvml.processes(h0, kind, version) == []

    buf = ffi.new("char[80]")
    assert lib.nvmlSystemGetDriverVersion(buf, 80) == SUCCESS and ffi.string(buf) == b"580.159.04"
    assert lib.nvmlSystemGetNVMLVersion(buf, 80) == SUCCESS and ffi.string(buf) == b"13.580.159.04"
    cuda = ffi.new("int *")
    assert lib.nvmlSystemGetCudaDriverVersion_v2(cuda) == SUCCESS and cuda[0] == 13000
    assert lib.nvmlSystemGetCudaDriverVersion(cuda) == SUCCESS and cuda[0] == 13000


def test_every_device_key_reads_back(nvml: Nvml) -> None:
    scenario = Scenario(driver="535.43.02", nvml="12.535.43.02", cuda=12020)
    scenario.add_device()
    scenario.add_device(
        name='Odd "GPU" #1',
        uuid="GPU-acdc9db5-97f7-57e3-53d2-3061aececeec",
        serial="0123456789",
        pci_bus_id="0000000A:1b:1F.3",
        pci_device_id=0x12345678,
        pci_subsystem_id=0x9ABCDEF0,
        minor=7,
        total_bytes=1000,
        reserved_bytes=100,
        used_bytes=50,
        clocks_mhz={"graphics": 1, "sm": 2, "mem": 3, "video": 4},
        max_clocks_mhz={"graphics": 11, "sm": 12, "mem": 13, "video": 14},
        app_clocks_mhz={"graphics": 21, "sm": 22, "mem": 23, "video": 24},
        clock_event_reasons=0x88,
        retired_pages=[("sbe", 0x1000, 1_700_000_000), ("dbe", 0x2000, 1_700_000_100), ("sbe", 0x3000, 5)],
        retired_pending=True,
        remapped_rows=(1, 2, True, False),
        unsupported=(),
    )
    nvml.start(scenario)
    lib = nvml.lib
    h = nvml.handle(1)
    assert nvml.string("nvmlDeviceGetName", h) == (SUCCESS, 'Odd "GPU" #1')
    assert nvml.string("nvmlDeviceGetUUID", h) == (SUCCESS, "GPU-acdc9db5-97f7-57e3-53d2-3061aececeec")
    assert nvml.string("nvmlDeviceGetSerial", h) == (SUCCESS, "0123456789")
    minor = ffi.new("unsigned int *")
    assert lib.nvmlDeviceGetMinorNumber(h, minor) == SUCCESS and minor[0] == 7
    for fn in ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"):
        rc, info = pci(nvml, h, fn)
        assert rc == SUCCESS
        assert ffi.string(info.busId) == b"0000000A:1b:1F.3"
        assert ffi.string(info.busIdLegacy) == b"000A:1B:1F.0"
        assert (info.domain, info.bus, info.device) == (0xA, 0x1B, 0x1F)
        assert (info.pciDeviceId, info.pciSubSystemId) == (0x12345678, 0x9ABCDEF0)
    assert nvml.memory_v2(h) == (SUCCESS, (1000, 100, 850, 50))
    assert nvml.memory_v1(h) == (SUCCESS, (1000, 850, 150))
    for base, fn in zip((1, 11, 21), CLOCK_FNS, strict=True):
        assert [nvml.clock(fn, h, d) for d in range(4)] == [(SUCCESS, base + d) for d in range(4)]
    reasons = ffi.new("unsigned long long *")
    assert lib.nvmlDeviceGetCurrentClocksEventReasons(h, reasons) == SUCCESS and reasons[0] == 0x88
    assert retired(nvml, h, 0) == (SUCCESS, [(0x1000, 1_700_000_000), (0x3000, 5)])
    assert retired(nvml, h, 1) == (SUCCESS, [(0x2000, 1_700_000_100)])
    pending: Any = ffi.new("nvmlEnableState_t *")
    assert lib.nvmlDeviceGetRetiredPagesPendingStatus(h, pending) == SUCCESS and pending[0] == 1
    rows = [ffi.new("unsigned int *") for _ in range(4)]
    assert lib.nvmlDeviceGetRemappedRows(h, *rows) == SUCCESS
    assert [r[0] for r in rows] == [1, 2, 1, 0]
    buf = ffi.new("char[80]")
    assert lib.nvmlSystemGetDriverVersion(buf, 80) == SUCCESS and ffi.string(buf) == b"535.43.02"
    assert lib.nvmlSystemGetNVMLVersion(buf, 80) == SUCCESS and ffi.string(buf) == b"12.535.43.02"
    cuda = ffi.new("int *")
    assert lib.nvmlSystemGetCudaDriverVersion_v2(cuda) == SUCCESS and cuda[0] == 12020
    # device 0 kept its defaults
    assert nvml.memory_v2(nvml.handle(0))[1][0] == H200_TOTAL


def test_retired_pages_two_call_pattern(nvml: Nvml) -> None:
    scenario = Scenario()
    scenario.add_device(unsupported=(), retired_pages=[("dbe", 0x10, 1), ("dbe", 0x20, 2)])
    nvml.start(scenario)
    lib, h = nvml.lib, nvml.handle(0)
    count = ffi.new("unsigned int *", 1)
    addresses: Any = ffi.new("unsigned long long[4]")
    timestamps: Any = ffi.new("unsigned long long[4]")
    assert lib.nvmlDeviceGetRetiredPages(h, 1, count, addresses) == INSUFFICIENT_SIZE
    assert count[0] == 2
    count[0] = 4
    assert lib.nvmlDeviceGetRetiredPages(h, 1, count, addresses) == SUCCESS
    assert count[0] == 2 and list(addresses[0:2]) == [0x10, 0x20]
    count[0] = 4
    assert lib.nvmlDeviceGetRetiredPages_v2(h, 1, count, addresses, timestamps) == SUCCESS
    assert list(timestamps[0:2]) == [1, 2]
    count[0] = 0
    assert lib.nvmlDeviceGetRetiredPages_v2(h, 0, count, ffi.NULL, ffi.NULL) == SUCCESS  # no sbe pages
    assert count[0] == 0
    assert lib.nvmlDeviceGetRetiredPages(h, 2, count, addresses) == INVALID_ARGUMENT  # no such cause
    assert lib.nvmlDeviceGetRetiredPages(h, 0, ffi.NULL, addresses) == INVALID_ARGUMENT


def recovery_action(nvml: Nvml, h: Any) -> tuple[int, int]:
    """nvmlDeviceGetFieldValues for NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230): (the field's return code, value)."""
    values = ffi.new("nvmlFieldValue_t[2]")
    values[0].fieldId = 230
    values[1].fieldId = 9999  # a field the stub does not know: NOT_SUPPORTED in its own return code
    assert nvml.lib.nvmlDeviceGetFieldValues(h, 2, values) == SUCCESS
    assert values[1].nvmlReturn == NOT_SUPPORTED
    if values[0].nvmlReturn == SUCCESS:
        assert values[0].valueType == 1  # NVML_VALUE_TYPE_UNSIGNED_INT, as driver 580 answers
    return int(values[0].nvmlReturn), int(values[0].value.uiVal)


def test_health_values(nvml: Nvml) -> None:
    scenario = Scenario()
    scenario.add_device()
    scenario.add_device(remapped_rows=(3, 1, True, False), ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=9,
                        recovery_action=4)  # fmt: skip
    nvml.start(scenario)
    u64 = ffi.new("unsigned long long *")

    def ecc(h: Any, error_type: int, counter: int) -> int:
        assert nvml.lib.nvmlDeviceGetTotalEccErrors(h, error_type, counter, u64) == SUCCESS
        return int(u64[0])

    h0, h1 = nvml.handle(0), nvml.handle(1)
    assert [ecc(h0, 1, 0), ecc(h0, 1, 1), recovery_action(nvml, h0)] == [0, 0, (SUCCESS, 0)]  # the defaults
    assert [ecc(h1, 1, 0), ecc(h1, 1, 1), ecc(h1, 0, 0), recovery_action(nvml, h1)] == [2, 9, 0, (SUCCESS, 4)]
    assert nvml.lib.nvmlDeviceGetTotalEccErrors(h1, 2, 0, u64) == INVALID_ARGUMENT
    assert nvml.lib.nvmlDeviceGetTotalEccErrors(h1, 1, 0, ffi.NULL) == INVALID_ARGUMENT


def _unsupported_probe(field: str) -> Callable[[Nvml, Any], int]:
    """A call that answers NOT_SUPPORTED exactly when ``field`` is unsupported."""
    u32 = ffi.new("unsigned int *", 0)
    u64 = ffi.new("unsigned long long *")
    if field in ("name", "uuid", "serial"):
        fn = {"name": "nvmlDeviceGetName", "uuid": "nvmlDeviceGetUUID", "serial": "nvmlDeviceGetSerial"}[field]
        return lambda nvml, h: nvml.string(fn, h)[0]
    if field == "minor":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetMinorNumber(h, u32))
    if field == "pci":
        return lambda nvml, h: pci(nvml, h)[0]
    if field == "memory":
        return lambda nvml, h: nvml.memory_v2(h)[0]
    if field == "reasons":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetCurrentClocksEventReasons(h, u64))
    if field == "retired_pages":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetRetiredPages(h, 0, u32, ffi.NULL))
    if field == "retired_pending":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetRetiredPagesPendingStatus(h, ffi.new("nvmlEnableState_t *")))
    if field == "remapped":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetRemappedRows(h, u32, u32, u32, u32))
    if field == "mig":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetMigMode(h, u32, ffi.new("unsigned int *")))
    if field == "events":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetSupportedEventTypes(h, ffi.new("unsigned long long *")))
    if field == "ecc":
        return lambda nvml, h: int(nvml.lib.nvmlDeviceGetTotalEccErrors(h, 1, 0, u64))
    if field == "recovery":
        return lambda nvml, h: recovery_action(nvml, h)[0]
    group, name = field.split(".")
    if group == "processes":
        fn = PROCESS_CALLS[name] + "_v3"
        return lambda nvml, h: int(getattr(nvml.lib, fn)(h, ffi.new("unsigned int *", 0), ffi.NULL))
    fn = dict(zip(("clock", "max", "app"), CLOCK_FNS, strict=True))[group]
    domain = ("graphics", "sm", "mem", "video").index(name)
    return lambda nvml, h: nvml.clock(fn, h, domain)[0]


@pytest.mark.parametrize("field", sorted(UNSUPPORTED_FIELDS))
def test_unsupported_field(nvml: Nvml, field: str) -> None:
    scenario = Scenario()
    scenario.add_device(unsupported=())
    scenario.add_device(unsupported=[field])
    nvml.start(scenario)
    probe = _unsupported_probe(field)
    assert probe(nvml, nvml.handle(0)) == SUCCESS
    assert probe(nvml, nvml.handle(1)) == NOT_SUPPORTED
    others = [_unsupported_probe(f) for f in sorted(UNSUPPORTED_FIELDS - {field})]
    assert [p(nvml, nvml.handle(1)) for p in others] == [SUCCESS] * len(others)


def test_lost_device(nvml: Nvml) -> None:
    scenario = Scenario.h200(devices=2)
    scenario.at_call(6).set_device(1, lost=True)
    nvml.start(scenario)
    h0, h1 = nvml.handle(0), nvml.handle(1)  # calls 1, 2
    assert nvml.memory_v2(h1)[0] == SUCCESS  # 3
    assert nvml.string("nvmlDeviceGetName", h1)[0] == SUCCESS  # 4
    assert nvml.count() == 2  # 5
    assert nvml.memory_v2(h1)[0] == GPU_IS_LOST  # 6: lost from here on
    assert nvml.string("nvmlDeviceGetName", h1)[0] == GPU_IS_LOST
    assert nvml.processes(h0) == []
    out = ffi.new("nvmlDevice_t *")
    assert nvml.lib.nvmlDeviceGetHandleByIndex_v2(1, out) == GPU_IS_LOST
    assert nvml.lib.nvmlDeviceGetHandleByIndex(1, out) == GPU_IS_LOST
    assert nvml.memory_v2(h0)[0] == SUCCESS  # the other GPU keeps working
    assert nvml.count() == 2


def test_string_buffers(nvml: Nvml) -> None:
    scenario = Scenario()
    scenario.add_device(name="ABCDEFGH", serial="12345")
    nvml.start(scenario)
    h = nvml.handle(0)
    assert nvml.string("nvmlDeviceGetName", h, size=9) == (SUCCESS, "ABCDEFGH")  # exactly fits with the NUL
    assert nvml.string("nvmlDeviceGetName", h, size=8)[0] == INSUFFICIENT_SIZE
    assert nvml.string("nvmlDeviceGetSerial", h, size=5)[0] == INSUFFICIENT_SIZE
    assert nvml.lib.nvmlDeviceGetName(h, ffi.NULL, 64) == INVALID_ARGUMENT
    buf = ffi.new("char[10]")
    assert nvml.lib.nvmlSystemGetDriverVersion(buf, 10) == INSUFFICIENT_SIZE
    assert nvml.lib.nvmlSystemGetDriverVersion(buf, 11) == SUCCESS  # the caller claims 11 bytes: "580.159.04\0"


def test_memory_v2_version_check(nvml: Nvml) -> None:
    nvml.start(Scenario.h200())
    h = nvml.handle(0)
    mem: Any = ffi.new("nvmlMemory_v2_t *")
    for bad in (2, ffi.sizeof("nvmlMemory_v2_t") | 1 << 24, ffi.sizeof("nvmlMemory_t") | 2 << 24, 0):
        mem.version = bad
        assert nvml.lib.nvmlDeviceGetMemoryInfo_v2(h, mem) == ARGUMENT_VERSION_MISMATCH
        assert mem.total == 0  # nothing written
    mem.version = MEMORY_V2_VERSION
    assert MEMORY_V2_VERSION == 0x02000028
    assert nvml.lib.nvmlDeviceGetMemoryInfo_v2(h, mem) == SUCCESS
    assert nvml.lib.nvmlDeviceGetMemoryInfo_v2(h, ffi.NULL) == INVALID_ARGUMENT
    assert nvml.lib.nvmlDeviceGetMemoryInfo(h, ffi.NULL) == INVALID_ARGUMENT


def test_memory_arithmetic_v1_and_v2(nvml: Nvml) -> None:
    scenario = Scenario()
    scenario.add_device(total_bytes=10_000, reserved_bytes=1_000, used_bytes=500)
    scenario.add_process(0, 4_100_001, used_bytes=2_000)
    scenario.add_process(0, 4_100_002, "graphics", used_bytes=300, holds_bytes=100)
    scenario.add_process(0, 4_100_003, "mps", used_bytes=None)  # na: holds 0
    scenario.add_process(0, 4_100_004, used_bytes=None, holds_bytes=50)
    scenario.at_call(4).set_device(0, used_bytes=9_000)  # more than fits: free clamps to 0
    nvml.start(scenario)
    h = nvml.handle(0)  # call 1
    used_v2 = 500 + 2_000 + 100 + 0 + 50
    assert nvml.memory_v2(h) == (SUCCESS, (10_000, 1_000, 10_000 - 1_000 - used_v2, used_v2))  # 2
    assert nvml.memory_v1(h) == (SUCCESS, (10_000, 10_000 - 1_000 - used_v2, used_v2 + 1_000))  # 3
    used_v2 = 9_000 + 2_150
    assert nvml.memory_v2(h) == (SUCCESS, (10_000, 1_000, 0, used_v2))  # 4
    assert nvml.memory_v1(h) == (SUCCESS, (10_000, 0, used_v2 + 1_000))


def test_bad_handles_and_arguments(nvml: Nvml) -> None:
    nvml.start(Scenario.h200())
    lib = nvml.lib
    out = ffi.new("nvmlDevice_t *")
    assert lib.nvmlDeviceGetHandleByIndex_v2(1, out) == INVALID_ARGUMENT  # one device only
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ffi.NULL) == INVALID_ARGUMENT
    assert nvml.memory_v2(ffi.NULL)[0] == INVALID_ARGUMENT
    assert nvml.memory_v2(ffi.cast("nvmlDevice_t", 12345))[0] == INVALID_ARGUMENT
    h = nvml.handle(0)
    for fn in CLOCK_FNS:
        assert nvml.clock(fn, h, 4)[0] == INVALID_ARGUMENT
        assert nvml.clock(fn, h, -1)[0] == INVALID_ARGUMENT
        assert getattr(lib, fn)(h, 0, ffi.NULL) == INVALID_ARGUMENT
    assert lib.nvmlDeviceGetCount_v2(ffi.NULL) == INVALID_ARGUMENT
    assert lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ffi.NULL, ffi.NULL) == INVALID_ARGUMENT
