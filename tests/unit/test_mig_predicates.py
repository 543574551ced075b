"""Issue 11, the MIG clean rule (docs/waiting.md, "MIG"): no process on any instance, and memory judged per
instance (or, when the instances' memory is unknown, on the parent) against the MIG idle allowance. The figures
are those of public captures (driver 590.48.01): an idle H100 in MIG mode reads 59 MiB used with no process, an
idle H200 55 MiB."""

from __future__ import annotations

import dataclasses
import json
import pickle

from snapshots import dev, mem, snap

import nvmlcheck as nc
from nvmlcheck.jsonout import device_json
from nvmlcheck.model import MIB, DeviceState, GpuProcess, Memory, MigDevice, ProcessKind, attribute_processes
from nvmlcheck.predicates import DEFAULT_MIG_IDLE_BYTES, memory_used_at_most, no_processes

GIB = 1 << 30
H100_TOTAL = 81_559 * MIB


def mig_proc(pid: int, gi: int, ci: int = 0, used: int | None = 2 * GIB) -> GpuProcess:
    return GpuProcess(pid, ProcessKind.COMPUTE, used, "python3", gi, ci)


def instance(index: int, gi: int, used: int | None = 0, uuid: str | None = None) -> MigDevice:
    memory = None if used is None else Memory(10_000 * MIB, used, 10_000 * MIB - used, 0, False, 1)
    return MigDevice(index, uuid or f"MIG-0000000{index}-aaaa-bbbb-cccc-dddddddddddd", gi, 0, memory, ())


def mig_gpu(
    parent_used: int,
    instances: tuple[MigDevice, ...] | None = (),
    procs: tuple[GpuProcess, ...] = (),
    granularity: int = 1,
) -> DeviceState:
    d = dev(0, memory=mem(parent_used, total=H100_TOTAL, granularity=granularity), procs=())
    d = dataclasses.replace(d, compute_processes=procs)
    if instances is not None:
        instances = attribute_processes(instances, procs)
    return dataclasses.replace(d, mig_mode=True, mig_devices=instances)


def test_idle_h100_and_h200_in_mig_mode_are_clean() -> None:
    for used in (59 * MIB, 55 * MIB):
        for instances in (None, (), (instance(0, 1), instance(1, 2))):
            verdict = nc.default_predicate().evaluate(snap(mig_gpu(used, instances, granularity=MIB)))
            assert verdict.clean, (used, instances, verdict.reasons)


def test_the_same_59_mib_without_mig_is_not_clean() -> None:
    # The allowance is MIG's only: a non-MIG GPU holding 59 MiB with no process stays "not clean".
    d = dev(0, memory=mem(59 * MIB, total=H100_TOTAL))
    assert nc.default_predicate().evaluate(snap(d)).satisfied is False
    assert (
        nc.default_predicate().evaluate(snap(dataclasses.replace(d, mig_mode=False, mig_devices=()))).satisfied is False
    )


def test_a_loaded_instance_is_not_clean_and_is_named() -> None:
    p = mig_proc(4242, gi=2)
    insts = (instance(0, 1), instance(1, 2, used=2 * GIB))
    verdict = nc.default_predicate().evaluate(snap(mig_gpu(59 * MIB + 2 * GIB, insts, (p,))))
    assert verdict.satisfied is False
    named = [r for r in verdict.reasons if "pid 4242" in r]
    assert named and "MIG 1 (GI 2, CI 0, MIG-00000001" in named[0]
    assert any("MIG 1" in r and "used" in r for r in verdict.reasons)  # its memory too
    assert not any("MIG 0 " in r for r in verdict.reasons)  # the idle instance is not blamed


def test_a_process_on_an_instance_list_only_is_seen() -> None:
    # NVML can list processes per MIG handle; one missing from the parent's lists still holds the GPU.
    p = mig_proc(77, gi=1)
    inst = dataclasses.replace(instance(0, 1), processes=(p,))
    d = dataclasses.replace(mig_gpu(59 * MIB, None), mig_devices=(inst,))
    assert no_processes().check(snap(d)) is False
    assert any("pid 77" in r and "MIG 0" in r for r in no_processes().evaluate(snap(d)).reasons)


def test_instance_memory_is_judged_per_instance_not_on_the_parent() -> None:
    # Parent well above the allowance (7 instances' bookkeeping) but every instance idle: clean.
    insts = tuple(instance(i, i + 1, used=13 * MIB) for i in range(7))
    assert memory_used_at_most(16 * MIB).check(snap(mig_gpu(400 * MIB, insts))) is True
    # One instance holding memory with no visible process (a PID namespace): not clean, and named.
    held = (*insts[:6], instance(6, 7, used=900 * MIB))
    verdict = memory_used_at_most(16 * MIB).evaluate(snap(mig_gpu(1300 * MIB, held)))
    assert verdict.satisfied is False
    assert any("MIG 6" in r and "no visible process" in r for r in verdict.reasons)


def test_unknown_instance_memory_falls_back_to_the_parent() -> None:
    insts = (instance(0, 1, used=None),)
    assert memory_used_at_most(16 * MIB).check(snap(mig_gpu(59 * MIB, insts))) is True
    over = 16 * MIB + DEFAULT_MIG_IDLE_BYTES + 1 * GIB
    verdict = memory_used_at_most(16 * MIB).evaluate(snap(mig_gpu(over, insts)))
    assert verdict.satisfied is False and "MIG mode" in verdict.reasons[0]


def test_the_edge_of_the_allowance_at_mib_granularity_is_unknown() -> None:
    edge = 16 * MIB + DEFAULT_MIG_IDLE_BYTES
    assert memory_used_at_most(16 * MIB).check(snap(mig_gpu(edge, None, granularity=MIB))) is None


def test_unknown_process_lists_stay_unknown_on_mig() -> None:
    d = dataclasses.replace(mig_gpu(59 * MIB, (instance(0, 1),)), compute_processes=None)
    assert no_processes().check(snap(d)) is None


def test_bytes_not_available_are_none_never_zero_in_reasons() -> None:
    p = mig_proc(5, gi=1, used=None)
    verdict = nc.default_predicate().evaluate(snap(mig_gpu(59 * MIB, (instance(0, 1),), (p,))))
    assert verdict.satisfied is False
    assert any("unknown amount" in r for r in verdict.reasons)


def test_attribution_by_instance_ids() -> None:
    a, b, c = mig_proc(1, gi=1), mig_proc(2, gi=2), GpuProcess(3, ProcessKind.COMPUTE, 1, None)
    out = attribute_processes((instance(0, 1), instance(1, 2)), (a, b))
    assert [tuple(p.pid for p in m.processes or ()) for m in out] == [(1,), (2,)]
    # A process listed with no instance id may run in either: neither instance's list is known then.
    out = attribute_processes((instance(0, 1), instance(1, 2)), (a, b, c))
    assert [m.processes for m in out] == [None, None] and "cannot be told" in out[0].unknown["processes"]
    unknown = attribute_processes((instance(0, 1),), None)
    assert unknown[0].processes is None and "unknown" in unknown[0].unknown["processes"]


def test_json_gains_mig_fields_and_keeps_the_old_ones() -> None:
    plain = device_json(dev(0))
    d = mig_gpu(59 * MIB, (instance(0, 1),), (mig_proc(9, gi=1),))
    out = device_json(d)
    assert set(plain) <= set(out) and {"mig_mode", "mig_devices"} <= set(out)
    assert plain["mig_mode"] is None and plain["mig_devices"] is None
    assert out["mig_devices"][0]["gpu_instance_id"] == 1 and out["mig_devices"][0]["processes"][0]["pid"] == 9
    json.dumps(out)


def test_mig_state_pickles() -> None:
    d = mig_gpu(59 * MIB, (instance(0, 1),))
    back = pickle.loads(pickle.dumps(d))
    assert back == d and back.mig_devices is not None and back.mig_devices[0].label.startswith("MIG 0 (GI 1")


def test_on_devices_with_a_mig_uuid_judges_that_instance_only() -> None:
    insts = (instance(0, 1), instance(1, 2, used=2 * GIB))
    s = snap(mig_gpu(59 * MIB + 2 * GIB, insts, (mig_proc(4242, gi=2),)))
    idle, busy = insts[0].uuid, insts[1].uuid
    assert idle is not None and busy is not None
    assert nc.on_devices([idle], nc.default_predicate()).evaluate(s).clean
    verdict = nc.on_devices([busy], nc.default_predicate()).evaluate(s)
    assert verdict.satisfied is False and all(busy in r for r in verdict.reasons)
    # An instance that is not in the snapshot (destroyed, or MIG not read) is unknown, never clean.
    gone = nc.on_devices(["MIG-not-there"], nc.default_predicate()).evaluate(s)
    assert gone.satisfied is None
    # Its memory unknown: unknown too.
    blind = snap(mig_gpu(59 * MIB, (instance(0, 1, used=None),)))
    assert nc.on_devices([idle], nc.default_predicate()).evaluate(blind).satisfied is None


def test_on_devices_reads_uuids_in_any_case_as_the_session_does() -> None:
    # The session takes ``mig-…``/``gpu-…`` and hex in either case; on_devices compared exactly, so the instance (or
    # the GPU) a lowercase selector names read as missing: a wait on it could never end clean.
    insts = (instance(0, 1), instance(1, 2, used=2 * GIB))
    d = mig_gpu(59 * MIB + 2 * GIB, insts, (mig_proc(4242, gi=2),))
    s = snap(d)
    idle, busy = insts[0].uuid, insts[1].uuid
    assert idle is not None and busy is not None
    assert nc.on_devices([idle.lower()], nc.default_predicate()).evaluate(s).clean
    assert nc.on_devices([busy.lower()], nc.default_predicate()).evaluate(s).satisfied is False
    whole = nc.on_devices([d.uuid.lower(), d.uuid.upper()], nc.no_processes()).evaluate(s)
    assert whole.satisfied is False and not any("missing" in r or "not in" in r for r in whole.reasons)
    plain = snap(dev(0, memory=mem(0)))
    assert nc.on_devices([plain.devices[0].uuid.swapcase()], nc.default_predicate()).evaluate(plain).clean


def test_an_instance_whose_processes_cannot_be_attributed_is_unknown_never_clean() -> None:
    """Selecting one instance (``on_devices(["MIG-…"])``, ``ready``): a process of the parent's list that may run in
    it, its instance unknown on one side (an id that could not be read, a driver listing no ids), makes its list
    unknown. Its memory, withheld and adding nothing, cannot tell."""
    from nvmlcheck.predicates import on_devices

    unread = dataclasses.replace(instance(1, 2), gpu_instance_id=None)  # nvmlDeviceGetGpuInstanceId failed
    gpu = mig_gpu(59 * MIB, (instance(0, 1), unread), (mig_proc(4242, gi=2, used=None),))
    s = snap(gpu)
    busy = on_devices([unread.uuid or ""], nc.default_predicate()).evaluate(s)
    assert busy.satisfied is None and any("pid 4242 (GI 2) may run in MIG 1" in r for r in busy.reasons)
    # GI 1 is known and is not GI 2: that instance is clean.
    assert on_devices([instance(0, 1).uuid or ""], nc.default_predicate()).check(s) is True
    no_ids = mig_gpu(59 * MIB, (instance(0, 1), instance(1, 2)),
                     (GpuProcess(4243, ProcessKind.COMPUTE, None, "python3"),))  # listed with no instance id
    for inst in no_ids.mig_devices or ():
        v = on_devices([inst.uuid or ""], nc.default_predicate()).evaluate(snap(no_ids))
        assert v.satisfied is None and any("pid 4243 has no MIG instance id" in r for r in v.reasons)
    # A process whose known GI matches no instance runs in none of those selected: they stay clean.
    other = mig_gpu(59 * MIB, (instance(0, 1), instance(1, 2)), (mig_proc(4244, gi=7, used=None),))
    assert on_devices([instance(0, 1).uuid or ""], nc.default_predicate()).check(snap(other)) is True


def test_ready_report_lines_name_the_instance_as_its_verdict_does() -> None:
    from nvmlcheck.verdict import Culprit, GpuVerdict, ReadyReport

    label = "GPU 0 MIG 1 (GI 2, CI 0, MIG-00000001-aaaa-bbbb-cccc-dddddddddddd)"
    held = Culprit(0, "held", "compute", "held by pid 4242 (python3), 2.0 GiB", pid=4242)
    loose = Culprit(None, "unknown", "query", "the listener stopped")
    report = ReadyReport((GpuVerdict(0, "MIG-00000001-aaaa-bbbb-cccc-dddddddddddd", label, "held", (held, loose)),
                          GpuVerdict(1, "GPU-1", "GPU 1", "held", (Culprit(1, "held", "memory", "8.0 GiB used"),))),
                         None, 0, 1, 0.0)
    assert report.culprits == (f"{label}: held by pid 4242 (python3), 2.0 GiB", "the listener stopped",
                               "GPU 1: 8.0 GiB used")


def test_pids_gone_sees_a_pid_on_an_instance_list_only() -> None:
    # The same list no_processes() counts: a kill or wait must not call pid 77 gone while its instance lists it.
    p = mig_proc(77, gi=1)
    inst = dataclasses.replace(instance(0, 1), processes=(p,))
    d = dataclasses.replace(mig_gpu(59 * MIB, None), mig_devices=(inst,))
    gone = nc.pids_gone([77])
    assert gone.check(snap(d)) is False  # the poller's inlined path
    assert nc.on_devices([0], gone).check(snap(d)) is False  # the per-device path
    reasons = gone.evaluate(snap(d)).reasons
    assert any("pid 77" in r and "MIG 0" in r and "still listed" in r for r in reasons), reasons
    assert nc.pids_gone([78]).check(snap(d)) is True


def test_pids_gone_names_the_instance_of_a_pid_on_the_parent_list() -> None:
    p = mig_proc(4242, gi=2)
    d = mig_gpu(59 * MIB + 2 * GIB, (instance(0, 1), instance(1, 2, used=2 * GIB)), (p,))
    reasons = nc.pids_gone([4242]).evaluate(snap(d)).reasons
    assert len(reasons) == 1 and "GPU 0 MIG 1 (GI 2, CI 0" in reasons[0], reasons


def test_a_process_on_an_instance_list_only_is_among_the_gpus_processes() -> None:
    # Every reader of DeviceState.processes (holders, kill's "off every list", ready's culprits) missed it.
    from nvmlcheck.verdict import Watch, classify

    p = mig_proc(77, gi=1)
    inst = dataclasses.replace(instance(0, 1, used=2 * GIB), processes=(p,))
    d = dataclasses.replace(mig_gpu(59 * MIB + 2 * GIB, None), mig_devices=(inst,))
    assert d.processes == (p,)
    (v,) = classify(snap(d), now_ns=0, watch=Watch(read_state={77: "S"}.get), judge_health=False)
    assert [(c.pid, c.class_) for c in v.culprits] == [(77, "held")]
    # A process on both the parent's list and its instance's is there once.
    both = mig_gpu(59 * MIB + 2 * GIB, (instance(0, 1, used=2 * GIB),), (p,))
    assert both.processes == (p,)
