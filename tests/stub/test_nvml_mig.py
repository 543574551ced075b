"""Issue 11, MIG through the NVML backend on the stub: the MIG calls, old drivers without them, faults, and MIG
devices created or destroyed while a wait runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, build_stub

pytestmark = pytest.mark.stub

MIB = 1 << 20
GIB = 1 << 30


def mig_scenario() -> Scenario:
    sc = Scenario.h200()
    sc.set_device(0, mig=True, used_bytes=55 * MIB)
    sc.add_mig_device(0, 0, total_bytes=16 * GIB)
    sc.add_mig_device(0, 3, gi=9, ci=1, total_bytes=32 * GIB, used_bytes=2 * MIB)
    return sc


def snapshot(path: Path, sc: Scenario, *macros: str, fields: nc.Fields = nc.Fields.WAIT) -> nc.Snapshot:
    sc.write(path)
    with nc.open("nvml", library_path=str(build_stub(macros))) as s:
        return s.snapshot(fields=fields)


def test_empty_slots_are_skipped_and_ids_read(scenario_path: Path) -> None:
    d = snapshot(scenario_path, mig_scenario()).devices[0]
    assert d.mig_mode is True and d.mig_devices is not None
    assert [(m.index, m.gpu_instance_id, m.compute_instance_id) for m in d.mig_devices] == [(0, 1, 0), (3, 9, 1)]
    assert d.mig_devices[1].uuid == "MIG-00000000-0000-0000-0000-000000000003"
    assert d.mig_devices[1].memory is not None and d.mig_devices[1].memory.used_bytes == 2 * MIB


def test_a_driver_without_mig_symbols_is_not_in_mig_mode(scenario_path: Path) -> None:
    # A pre-450 library: MIG cannot be on as far as the driver knows; never a failure.
    snap = snapshot(scenario_path, mig_scenario(), "STUB_NO_MIG")
    assert not snap.failures
    d = snap.devices[0]
    assert d.mig_mode is False and d.mig_devices == ()


def test_mig_not_supported_is_off(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.set_device(0, unsupported=("mig",))
    d = snapshot(scenario_path, sc).devices[0]
    assert d.mig_mode is False and d.mig_devices == ()


def test_a_mig_mode_error_is_unknown_with_a_reason_not_off(scenario_path: Path) -> None:
    sc = mig_scenario()
    sc.fault("nvmlDeviceGetMigMode", 999)
    snap = snapshot(scenario_path, sc)
    d = snap.devices[0]
    assert d.mig_mode is None and d.mig_devices is None
    assert "nvmlDeviceGetMigMode" in (d.why_unknown("mig") or "")


def test_an_enumeration_error_leaves_the_instances_unknown(scenario_path: Path) -> None:
    sc = mig_scenario()
    sc.fault("nvmlDeviceGetMaxMigDeviceCount", 999)
    d = snapshot(scenario_path, sc).devices[0]
    assert d.mig_mode is True and d.mig_devices is None
    assert d.why_unknown("mig_devices")
    # Instances unknown: the parent is judged with the MIG allowance, so the idle 55 MiB is still clean.
    assert nc.default_predicate().evaluate(snapshot(scenario_path, sc)).clean


def test_lost_gpu_during_mig_reads_fails_the_device(scenario_path: Path) -> None:
    sc = mig_scenario()
    sc.fault("nvmlDeviceGetMaxMigDeviceCount", 15)
    snap = snapshot(scenario_path, sc)
    assert [f.index for f in snap.failures] == [0] and isinstance(snap.failures[0].error, nc.GpuLost)


def test_wait_sees_an_instance_emptied_on_the_timeline(scenario_path: Path) -> None:
    sc = mig_scenario()
    sc.add_process(0, 4_100_077, used_bytes=GIB, gi=9, ci=1)
    sc.at_call(60).remove_process(0, 4_100_077)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as s:
        first = s.snapshot(fields=nc.Fields.WAIT)
        assert not nc.default_predicate().evaluate(first).clean
        result = s.wait_until_clean(timeout=30.0)
    d = result.snapshot.devices[0]
    assert d.mig_devices is not None and all(m.processes == () for m in d.mig_devices)


@pytest.mark.parametrize("other", ["cuda:0", "1", 1, "GPU-busy-1"])
def test_a_busy_gpu_named_beside_a_mig_instance_is_still_judged(
    scenario_path: Path, monkeypatch: pytest.MonkeyPatch, other: object
) -> None:
    # Any selector next to a MIG UUID (a CUDA ordinal, an index, a UUID prefix) keeps its GPU in the verdict.
    mig_uuid = "MIG-5f0a0000-0000-5000-8000-0000000000aa"
    sc = Scenario.h200(devices=2)
    sc.set_device(0, mig=True, used_bytes=55 * MIB)
    sc.add_mig_device(0, 0, total_bytes=16 * GIB, uuid=mig_uuid)
    sc.set_device(1, uuid="GPU-busy-1-0000-0000-0000-000000000000")
    sc.add_process(1, 4_100_078, used_bytes=40 * GIB)
    sc.write(scenario_path)
    # By UUID: with a GPU in MIG mode CUDA's numbering of all GPUs is unknown, so a number would be refused.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-busy-1")
    with nc.open("nvml", library_path=str(build_stub())) as s:
        with pytest.raises(nc.WaitTimeout) as info:
            s.wait_until_clean(timeout=0, devices=[other, mig_uuid])  # type: ignore[list-item]
        assert any("GPU 1" in c for c in info.value.culprits), info.value.culprits
        assert s.wait_until_clean(timeout=0, devices=[mig_uuid]).clean  # the instance alone is idle


@pytest.mark.parametrize("call", ["wait", "ready"])
def test_reading_the_mig_devices_of_a_selection_stops_at_the_deadline(scenario_path: Path, call: str) -> None:
    # A MIG selection read every GPU of the host before the wait, with no deadline: an unselected GPU 1 whose process
    # lists take 0.5 s a call made a 0.3 s wait on an idle instance of GPU 0 take seconds, and end "clean". Each call
    # of GPU 1 outlasts the whole timeout: the reading is cut at the deadline (one query late) and the wait times out.
    sc = Scenario.h200(devices=2)
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, total_bytes=16 * GIB)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as s:
        (instance,) = s.snapshot(fields=nc.Fields.PROCESSES).devices[0].mig_devices or ()
        assert instance.uuid is not None
        sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", None, device=1, delay_ms=500)
        sc.write(scenario_path)  # the stub reads its scenario at init: the delay comes with the re-opened session
    with nc.open("nvml", library_path=str(build_stub())) as s:
        s.resolve([instance.uuid])  # resolving (no deadline) reads the instances once; the wait's reading comes next
        if call == "wait":
            with pytest.raises(nc.WaitTimeout) as info:
                s.wait_until_clean(0.3, devices=[instance.uuid])
            assert "MIG devices were still being read" in str(info.value)
        else:
            report = s.ready(devices=[instance.uuid], timeout=0.3)
            assert not report.ready


def test_an_instance_whose_id_cannot_be_read_has_unknown_processes_not_none(scenario_path: Path) -> None:
    # attribute_processes gave each instance processes=() (known: none) when its GPU-instance id could not be read,
    # while the parent listed a process with GI 2: the snapshot's JSON said [] for an instance that may run it.
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, total_bytes=70 * GIB)
    sc.add_mig_device(0, 1, total_bytes=70 * GIB)
    sc.add_process(0, 4_000_010, used_bytes=None, holds_bytes=0, gi=2, ci=0)
    sc.fault("nvmlDeviceGetGpuInstanceId", 999)
    d = snapshot(scenario_path, sc).devices[0]
    assert [p.pid for p in d.compute_processes or ()] == [4_000_010]
    for m in d.mig_devices or ():
        assert m.processes is None and "cannot be told" in (m.unknown.get("processes") or "")


def test_a_process_with_no_instance_id_makes_every_instance_s_processes_unknown() -> None:
    from nvmlcheck.model import attribute_processes

    sc_devices = (nc.MigDevice(0, "MIG-a", 1, 0, None, (), {}), nc.MigDevice(1, "MIG-b", 2, 0, None, (), {}))
    placed = nc.GpuProcess(10, nc.ProcessKind.COMPUTE, GIB, None, 1, 0)
    unplaced = nc.GpuProcess(11, nc.ProcessKind.COMPUTE, GIB, None, None, None)
    assert [m.processes for m in attribute_processes(sc_devices, (placed,))] == [(placed,), ()]
    assert [m.processes for m in attribute_processes(sc_devices, (placed, unplaced))] == [None, None]
    assert [m.processes for m in attribute_processes(sc_devices, ())] == [(), ()]


def test_a_gpu_that_leaves_mig_mode_is_judged_whole_again(scenario_path: Path) -> None:
    # The mode was read once, with the identity: after a reset that turned MIG off, the GPU was still judged with
    # the MIG idle allowance, and 60 MiB held with no process read clean (the smi backend reads the mode each poll).
    sc = mig_scenario()
    sc.at_call(60).set_device(0, mig=False, used_bytes=60 * MIB)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as s:
        first = s.snapshot(fields=nc.Fields.WAIT)
        assert first.devices[0].mig_mode is True
        readings = [s.snapshot(fields=nc.Fields.WAIT) for _ in range(30)]  # far past call 60
    after = [r for r in readings if r.devices[0].mig_mode is False]
    assert after, "the GPU that left MIG mode still read as in MIG mode"
    for r in after:
        assert r.devices[0].mig_devices == ()
        assert nc.default_predicate().evaluate(r).clean is False
