"""On a real GPU: the NVML backend agrees with nvidia-smi and with nvidia-ml-py on the same device.

Run on a GPU host with ``pytest tests/gpu --require-gpu``. A value that can change between two reads (memory,
current clocks) is checked against a bracket: NVML read, other tool read, NVML read again.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

import nvmlcheck as nc

pytestmark = pytest.mark.gpu
MIB = 1 << 20


def smi_rows(query: str, *extra: str) -> list[list[str]]:
    """Run nvidia-smi with a CSV query (noheader, nounits) and split rows (independent of nvmlcheck's parser)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run(
        [exe, *extra, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    return [[c.strip() for c in line.split(", ")] for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def gpus() -> Iterator[nc.Session]:
    with nc.open("nvml") as session:
        yield session


@pytest.fixture(scope="module")
def pynvml() -> Iterator[Any]:
    module = pytest.importorskip("pynvml")
    module.nvmlInit()
    yield module
    module.nvmlShutdown()


@pytest.fixture
def holder(gpus: nc.Session) -> Iterator[tuple[int, int]]:
    """A child process holding 1 GiB on GPU 0 (through the CUDA driver API); yields (pid, bytes)."""
    nbytes = 1 << 30
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck.holder", "--bytes", str(nbytes), "--device", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        pytest.fail(f"holder did not start: {line!r}")
    # The process list can lag the allocation slightly: wait (bounded) until NVML lists it.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = gpus.snapshot(0, fields=nc.Fields.PROCESSES).devices[0].compute_processes or ()
        if any(p.pid == proc.pid for p in procs):
            break
        time.sleep(0.01)
    yield proc.pid, nbytes
    proc.kill()
    proc.wait()
    gpus.wait_until_clean(timeout=30, devices=[0])


def _bracket(read: Any, other: Any) -> tuple[int, int, int]:
    a = read()
    b = other()
    c = read()
    return a, b, c


def _within(value_mib: float, lo_bytes: int, hi_bytes: int, slack_mib: float = 1.0) -> bool:
    lo, hi = min(lo_bytes, hi_bytes) / MIB, max(lo_bytes, hi_bytes) / MIB
    return lo - slack_mib <= value_mib <= hi + slack_mib


def test_identity_agrees_with_nvidia_smi_and_pynvml(gpus: nc.Session, pynvml: Any) -> None:
    snap = gpus.snapshot(fields=nc.Fields(0))
    rows = smi_rows("--query-gpu=index,uuid,name,pci.bus_id,serial,driver_version")
    assert len(rows) == len(snap.devices)
    for dev, row in zip(snap.devices, rows, strict=True):
        index, uuid, name, bus_id, serial, driver = row
        assert dev.index == int(index)
        assert dev.uuid == uuid
        assert dev.name == name
        assert dev.pci_bus_id is not None and dev.pci_bus_id.upper() == bus_id.upper()
        assert dev.serial == (None if serial.startswith("[") else serial)
        assert snap.system.driver_version == driver
        h = pynvml.nvmlDeviceGetHandleByIndex(dev.index)
        assert pynvml.nvmlDeviceGetUUID(h) == dev.uuid
        assert pynvml.nvmlDeviceGetMinorNumber(h) == dev.minor_number
    assert snap.system.nvml_version == pynvml.nvmlSystemGetNVMLVersion()
    assert snap.system.cuda_driver_version == pynvml.nvmlSystemGetCudaDriverVersion_v2()


def _check_memory(gpus: nc.Session) -> None:
    def ours() -> nc.Memory:
        mem = gpus.snapshot(0, fields=nc.Fields.MEMORY).devices[0].memory
        assert mem is not None
        return mem

    a = ours()
    row = smi_rows("--query-gpu=memory.total,memory.used,memory.free,memory.reserved", "-i", "0")[0]
    c = ours()
    total, used, free, reserved = (float(x) for x in row)
    assert a.total_bytes / MIB == pytest.approx(total, abs=1)
    assert _within(used, a.used_bytes, c.used_bytes), (used, a, c)
    assert _within(free, a.free_bytes, c.free_bytes), (free, a, c)
    assert a.reserved_bytes is not None and _within(reserved, a.reserved_bytes, c.reserved_bytes or 0)
    assert not a.used_includes_reserved


def test_memory_agrees_with_nvidia_smi_to_the_mib_idle(gpus: nc.Session) -> None:
    _check_memory(gpus)


def test_memory_agrees_with_nvidia_smi_to_the_mib_busy(gpus: nc.Session, holder: tuple[int, int]) -> None:
    _check_memory(gpus)
    mem = gpus.snapshot(0).devices[0].memory
    assert mem is not None and mem.used_bytes >= holder[1]


def test_memory_bytes_equal_pynvml(gpus: nc.Session, pynvml: Any, holder: tuple[int, int]) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(5):  # equal on a quiet device; retry a few times in case something moved in between
        ours = gpus.snapshot(0, fields=nc.Fields.MEMORY).devices[0].memory
        theirs = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert ours is not None
        if (ours.total_bytes, ours.used_bytes, ours.free_bytes, ours.reserved_bytes) == (
            theirs.total,
            theirs.used,
            theirs.free,
            theirs.reserved,
        ):
            return
    pytest.fail(f"memory differs: ours {ours}, nvidia-ml-py {theirs}")


def test_holder_process_seen_identically(gpus: nc.Session, pynvml: Any, holder: tuple[int, int]) -> None:
    pid, nbytes = holder
    dev = gpus.snapshot(0).devices[0]
    ours = {p.pid: p for p in dev.compute_processes or ()}
    assert pid in ours, f"holder {pid} not in {ours}"
    mine = ours[pid]
    assert mine.used_bytes is not None and mine.used_bytes >= nbytes
    assert mine.name is not None and "python" in mine.name
    # nvidia-smi: same pid, same MiB
    apps = smi_rows("--query-compute-apps=pid,process_name,used_memory", "-i", "0")
    smi = {int(r[0]): r for r in apps}
    assert pid in smi
    assert float(smi[pid][-1]) == pytest.approx(mine.used_bytes / MIB, abs=1)
    # nvidia-ml-py: same pid, same bytes
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    theirs = {p.pid: p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    assert theirs.get(pid) == mine.used_bytes


def test_clocks_agree(gpus: nc.Session, pynvml: Any) -> None:
    snap = gpus.snapshot(0, fields=nc.Fields.CLOCKS)
    clocks = snap.devices[0].clocks
    assert clocks is not None
    row = smi_rows("--query-gpu=clocks.max.sm,clocks.max.mem,clocks.max.gr,clocks.sm,clocks.mem", "-i", "0")[0]
    assert clocks.max.sm_mhz == int(row[0])
    assert clocks.max.memory_mhz == int(row[1])
    assert clocks.max.graphics_mhz == int(row[2])
    assert clocks.memory_mhz == int(row[4])  # the memory clock does not move at idle
    sm_after = gpus.snapshot(0, fields=nc.Fields.CLOCKS).devices[0].clocks
    assert sm_after is not None
    lo = min(clocks.sm_mhz or 0, sm_after.sm_mhz or 0)
    hi = max(clocks.sm_mhz or 0, sm_after.sm_mhz or 0)
    assert lo - 50 <= int(row[3]) <= hi + 50
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == clocks.max.sm_mhz
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_VIDEO) == clocks.max.video_mhz


def test_memory_health_agrees(gpus: nc.Session, pynvml: Any) -> None:
    dev = gpus.snapshot(0, fields=nc.Fields.HEALTH).devices[0]
    assert dev.health is not None
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        corr, unc, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
    except pynvml.NVMLError_NotSupported:
        assert dev.health.remapped_rows is None
        assert "not supported" in (dev.why_unknown("health.remapped_rows") or "")
    else:
        assert dev.health.remapped_rows == nc.RemappedRows(corr, unc, bool(pending), bool(failure))
    try:
        pages = pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    except pynvml.NVMLError_NotSupported:
        # Hopper remaps rows instead of retiring pages: unknown with a reason, never an empty list or 0
        assert dev.health.retired_pages is None
        assert "not supported" in (dev.why_unknown("health.retired_pages") or "")
    else:
        assert dev.health.retired_pages is not None
        assert len([p for p in dev.health.retired_pages if p.cause is nc.RetirementCause.DOUBLE_BIT_ECC]) == len(pages)


def test_symbols_are_the_newest(gpus: nc.Session) -> None:
    from nvmlcheck.backends.nvml import NvmlBackend

    backend = gpus.backend
    assert isinstance(backend, NvmlBackend)
    sym = backend.symbols
    assert sym.init == "nvmlInit_v2"
    assert sym.memory == "nvmlDeviceGetMemoryInfo_v2"
    assert sym.compute_processes == "nvmlDeviceGetComputeRunningProcesses_v3"


def test_mig_mode_agrees_with_nvidia_smi_and_no_false_failure(gpus: nc.Session) -> None:
    """Issue 11: the MIG queries answer on a real driver. The H200 here is normally not in MIG mode (enabling it
    needs a GPU reset, which these tests never do): both say so, and nothing fails for it."""
    snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert not snap.failures
    rows = smi_rows("--query-gpu=index,mig.mode.current")
    for dev, (index, mode) in zip(snap.devices, rows, strict=True):
        assert dev.index == int(index)
        expected = {"Enabled": True, "Disabled": False}.get(mode, False)  # [N/A]: a GPU without MIG
        assert dev.mig_mode is expected, (dev.index, mode, dev.why_unknown("mig"))
        if expected:
            assert dev.mig_devices is not None, dev.why_unknown("mig_devices")
        else:
            assert dev.mig_devices == ()
    with nc.open("smi") as smi:
        other = smi.snapshot(fields=nc.Fields.WAIT)
    assert [d.mig_mode for d in other.devices] == [d.mig_mode for d in snap.devices]
