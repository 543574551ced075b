"""On a real GPU: the nvidia-smi backend's snapshot equals the NVML backend's (to the MiB), idle and with a process
holding memory; auto-selection picks NVML."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import nvmlcheck as nc

pytestmark = pytest.mark.gpu
MIB = 1 << 20


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[nc.Session, nc.Session]]:
    with nc.open("nvml") as nvml, nc.open("smi") as smi:
        yield nvml, smi


def _compare(nvml: nc.Session, smi: nc.Session) -> None:
    fields = nc.Fields.MEMORY | nc.Fields.PROCESSES
    for _ in range(5):  # memory can move between the two reads; a quiet device agrees within a few tries
        a = nvml.snapshot(fields=fields)
        b = smi.snapshot(fields=fields)
        c = nvml.snapshot(fields=fields)
        if _agree(a, b, c):
            return
    pytest.fail(f"nvml {a.devices} vs smi {b.devices}")


def _agree(a: nc.Snapshot, b: nc.Snapshot, c: nc.Snapshot) -> bool:
    assert b.backend == "smi" and a.backend == "nvml"
    assert [d.uuid for d in a.devices] == [d.uuid for d in b.devices]
    for da, db, dc in zip(a.devices, b.devices, c.devices, strict=True):
        ma, mb, mc = da.memory, db.memory, dc.memory
        assert ma is not None and mb is not None and mc is not None
        assert mb.granularity_bytes == MIB
        assert abs(ma.total_bytes - mb.total_bytes) <= MIB
        for attr in ("used_bytes", "free_bytes", "reserved_bytes"):
            lo = min(getattr(ma, attr), getattr(mc, attr)) - MIB
            hi = max(getattr(ma, attr), getattr(mc, attr)) + MIB
            if not lo <= getattr(mb, attr) <= hi:
                return False
        pa = {(p.pid, p.kind) for p in da.compute_processes or ()}
        pb = {(p.pid, p.kind) for p in db.compute_processes or ()}
        if pa != pb:
            return False
        used_a = {p.pid: p.used_bytes for p in da.compute_processes or ()}
        for p in db.compute_processes or ():
            ua = used_a.get(p.pid)
            if ua is None or p.used_bytes is None or abs(ua - p.used_bytes) > MIB:
                return False
    return True


def test_smi_equals_nvml_idle(both: tuple[nc.Session, nc.Session]) -> None:
    _compare(*both)


def test_smi_equals_nvml_with_a_holder(both: tuple[nc.Session, nc.Session]) -> None:
    nvml, smi = both
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck.holder", "--bytes", "2GiB"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("ready")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            procs = nvml.snapshot(0, fields=nc.Fields.PROCESSES).devices[0].compute_processes or ()
            if any(p.pid == proc.pid for p in procs):
                break
            time.sleep(0.01)
        _compare(nvml, smi)
        snap = smi.snapshot(0, fields=nc.Fields.PROCESSES)
        assert proc.pid in [p.pid for p in snap.devices[0].compute_processes or ()]
    finally:
        proc.kill()
        proc.wait()
        nvml.wait_until_clean(timeout=30, devices=[0])


def test_auto_selects_nvml() -> None:
    with nc.open() as gpus:
        assert gpus.backend_name == "nvml"
        assert gpus.snapshot().backend == "nvml"


def test_the_minor_numbers_agree(both: tuple[nc.Session, nc.Session]) -> None:
    """nvidia-smi prints no minor number: the smi backend reads the driver's procfs list, which must name the same
    ``/dev/nvidiaN`` for each GPU as ``nvmlDeviceGetMinorNumber`` (what Slurm's GPU IDs are matched with)."""
    nvml, smi = both
    mine = [(d.uuid, d.minor_number) for d in nvml.devices()]
    theirs = [(d.uuid, d.minor_number) for d in smi.devices()]
    assert all(minor is not None for _, minor in mine) and theirs == mine
