"""The verdict module on synthetic snapshots: each class, the ETA and the stuck bound on an injected clock, the
structured culprits, WaitTimeout.holders. /proc states and containers are injected: nothing here reads a real
process, and no assertion depends on how fast the machine runs."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from snapshots import GIB, H200_RESERVED, H200_TOTAL, SYSTEM, dev, failure, mem, proc, snap

import nvmlcheck as nc
from nvmlcheck import reclaim_model
from nvmlcheck.errors import GpuLost, NoPermission
from nvmlcheck.model import Health, RecoveryAction, RemappedRows
from nvmlcheck.verdict import Culprit, Watch, classify, health_causes

MS = 1_000_000
MODEL = reclaim_model.model_for(SYSTEM.driver_version)


def states(table: dict[int, str | None]) -> Watch:
    """A watch whose /proc reads come from ``table`` (pid -> state letter; missing: not visible)."""
    return Watch(read_state=table.get)


def lxc(pid: int) -> str | None:
    return "lxc/129"


def test_idle_gpu_is_ready_with_its_free_memory() -> None:
    (v,) = classify(snap(dev(0)), now_ns=0, watch=states({}))
    assert v.ready and v.class_ == "ready" and v.culprits == ()
    assert v.free_bytes == v.total_bytes - 644_939_776  # type: ignore[operator]
    assert v.line().startswith("GPU 0: ready")


def test_a_live_holder_is_held_naming_pid_name_container_and_bytes() -> None:
    s = snap(dev(1, procs=[proc(4123, 8 * GIB)]))
    (v,) = classify(s, now_ns=0, watch=states({4123: "S"}), container=lxc)
    assert v.class_ == "held"
    (c,) = v.culprits
    assert (c.gpu, c.pid, c.name, c.used_bytes, c.kind, c.class_, c.container, c.state) == (
        1, 4123, "python3", 8 * GIB, "compute", "held", "lxc/129", "sleeping")
    assert v.line() == "GPU 1: held by pid 4123 (python3) in lxc/129, 8.0 GiB"
    assert c.to_json()["class"] == "held" and c.to_json()["container"] == "lxc/129"


def test_an_exited_holder_is_reclaiming_with_the_models_eta() -> None:
    s = snap(dev(0, procs=[proc(777, 4 * GIB)]))
    (v,) = classify(s, now_ns=5 * MS, watch=states({777: "Z"}), container=lxc)
    assert v.class_ == "reclaiming"
    assert v.eta_ns == MODEL.expected_ns(1, 4 * GIB)  # first seen now: the whole expected time
    assert v.culprits[0].action == "WAIT" and "exited (zombie)" in v.culprits[0].reason


def test_the_models_eta_states_its_error_and_whether_the_data_backs_it() -> None:
    """The ETA was a bare "back in ~108 ms": nothing said the model's error (error_ns, the ETA's ±) nor that a
    teardown beyond what the model was fitted to (an A100 given the H200 figures, 16 contexts, a driver not measured)
    is an extrapolation."""
    s = snap(dev(0, procs=[proc(777, 4 * GIB)]))
    (v,) = classify(s, now_ns=5 * MS, watch=states({777: "Z"}), container=lxc)
    assert v.eta_error_ns == MODEL.error_ns and v.eta_beyond is None
    assert f"(model error up to {MODEL.error_ns / 1e6:.0f} ms)" in v.line() and "beyond" not in v.line()
    doc = v.to_json()
    assert doc["eta_error_ns"] == MODEL.error_ns and doc["eta_beyond"] is None
    other = snap(replace(dev(0, procs=[proc(777, 4 * GIB)]), name="NVIDIA A100-SXM4-80GB"))
    (a100,) = classify(other, now_ns=5 * MS, watch=states({777: "Z"}), container=lxc)
    assert a100.eta_beyond is not None
    assert "GPU model NVIDIA A100-SXM4-80GB (measured on NVIDIA H200)" in a100.line()
    many = snap(dev(0, procs=[proc(700 + n, GIB // 4) for n in range(16)]))
    (v16,) = classify(many, now_ns=5 * MS, watch=states({700 + n: "Z" for n in range(16)}), container=lxc)
    assert v16.class_ == "reclaiming" and "16 contexts (measured up to 4)" in (v16.eta_beyond or "")
    unknown = replace(snap(dev(0, procs=[proc(777, 4 * GIB)])), system=replace(SYSTEM, driver_version="470.256.02"))
    (old,) = classify(unknown, now_ns=5 * MS, watch=states({777: "Z"}), container=lxc)
    assert old.eta_beyond is not None and "a driver not measured" in old.line()


def test_an_eta_from_the_release_rate_claims_no_model_error() -> None:
    w = states({})
    w.observe(snap(dev(0, used=8 * GIB)), 0)
    now = snap(dev(0, used=2 * GIB))
    w.observe(now, 400 * MS)
    (v,) = classify(now, now_ns=400 * MS, watch=w)
    assert v.eta_error_ns is None and v.eta_beyond is None and v.line().endswith("(from the release rate so far)")
    held = snap(dev(0, procs=[proc(777, 4 * GIB)]))
    (h,) = classify(held, now_ns=5 * MS, watch=states({777: "R"}), container=lxc)  # not reclaiming: no ETA at all
    assert h.eta_ns is None and h.eta_error_ns is None and h.eta_beyond is None


def test_memory_falling_eta_counts_from_when_the_teardown_was_first_seen() -> None:
    w = states({})
    w.observe(snap(dev(0, used=8 * GIB)), 1_000 * MS)  # held, nothing listed: the teardown began here
    later = snap(dev(0, used=6 * GIB))
    w.observe(later, 1_050 * MS)
    (v,) = classify(later, now_ns=1_050 * MS, watch=w)
    assert v.class_ == "reclaiming"
    assert v.eta_ns == MODEL.expected_ns(1, 8 * GIB) - 50 * MS


def test_overdue_teardown_extrapolates_the_observed_release_rate() -> None:
    w = states({})
    w.observe(snap(dev(0, used=8 * GIB)), 0)
    t = 400 * MS  # past the model's ~120 ms, before the 1 s stuck bound
    now = snap(dev(0, used=2 * GIB))
    w.observe(now, t)
    (v,) = classify(now, now_ns=t, watch=w)
    assert v.class_ == "reclaiming"
    assert v.eta_ns == round(2 * GIB * t / (6 * GIB))  # 6 GiB back in 400 ms: the last 2 GiB in ~133 ms


def test_an_overdue_teardown_with_nothing_back_promises_no_time() -> None:
    """Past the model's time with none of the memory back, the ETA was 0 ("back now") and the line said "overdue,
    still coming back": nothing was coming back. No rate can be extrapolated: the ETA is unknown (null), said so."""
    w = states({})
    w.observe(snap(dev(0, used=8 * GIB)), 0)
    t = 400 * MS  # past the model's ~120 ms, before the stuck bound
    same = snap(dev(0, used=8 * GIB))
    w.observe(same, t)
    (v,) = classify(same, now_ns=t, watch=w)
    assert v.class_ == "reclaiming" and v.eta_ns is None and v.to_json()["eta_ns"] is None
    assert v.line().endswith("; overdue: none of it has come back yet") and "still coming back" not in v.line()


def test_memory_held_with_no_holder_past_the_bound_is_stuck() -> None:
    w = states({})
    held = snap(dev(0, used=8 * GIB))
    w.observe(held, 0)
    bound = MODEL.stuck_after_ns(1, 8 * GIB)
    (before,) = classify(held, now_ns=bound, watch=w)
    assert before.class_ == "reclaiming"
    (after,) = classify(held, now_ns=bound + 1, watch=w)
    assert after.class_ == "stuck" and after.needs_operator
    (c,) = after.culprits
    assert (c.kind, c.action, c.used_bytes, c.pid) == ("memory", "RESET_GPU", 8 * GIB, None)
    assert after.stuck_after_ns == bound


def test_a_mig_instance_holding_memory_with_no_holder_past_the_bound_is_stuck() -> None:
    """``ready`` on one MIG instance (its units: instance views): the watch keeps each instance's own history, so
    memory held there with nothing listed becomes stuck past the bound, as on a whole GPU (it stayed "reclaiming",
    the bound counted from each judgement, forever). The parent's MIG bookkeeping starts no teardown."""
    from nvmlcheck.model import Memory, MigDevice
    from nvmlcheck.predicates import instance_view

    held = MigDevice(1, "MIG-1", 2, 0, Memory(70 * GIB, 8 * GIB, 62 * GIB, 0), ())
    idle = MigDevice(0, "MIG-0", 1, 0, Memory(70 * GIB, 0, 70 * GIB, 0), ())
    gpu = replace(dev(0, used=8 * GIB + 55 * (1 << 20)), mig_mode=True, mig_devices=(idle, held))
    s = snap(gpu)
    w = states({})
    w.observe(s, 0)
    bound = MODEL.stuck_after_ns(1, 8 * GIB)
    (before,) = classify(s, now_ns=bound, watch=w, units=[instance_view(gpu, held)])
    assert before.class_ == "reclaiming"
    w.observe(s, bound + 1)
    (after,) = classify(s, now_ns=bound + 1, watch=w, units=[instance_view(gpu, held)])
    assert after.class_ == "stuck" and after.needs_operator and after.uuid == "MIG-1"
    (other,) = classify(s, now_ns=bound + 1, watch=w, units=[instance_view(gpu, idle)])
    assert other.ready


def test_a_whole_mig_gpu_names_the_instance_figure_it_judged_not_the_parents() -> None:
    """The parent reads 0 B while one instance holds 10 GiB with no process: the line said "0 B used with no process
    listed" (the parent's figure) though the rule judged the instance's. It names the instance's figure and
    instance; the teardown's expected time counts those bytes too."""
    from nvmlcheck.model import Memory, MigDevice

    held = MigDevice(0, "MIG-0", 1, 0, Memory(18 * GIB, 10 * GIB, 8 * GIB, 0), ())
    idle = MigDevice(1, "MIG-1", 2, 0, Memory(18 * GIB, 0, 18 * GIB, 0), ())
    gpu = replace(dev(0, used=0), mig_mode=True, mig_devices=(held, idle))
    (v,) = classify(snap(gpu), now_ns=0, watch=states({}))
    (c,) = v.culprits
    assert v.class_ == "reclaiming" and c.kind == "memory"
    assert c.used_bytes == 10 * GIB and "10.0 GiB used" in c.reason and "0 B" not in c.reason
    assert (c.mig_uuid, c.gpu_instance_id) == ("MIG-0", 1)
    two = replace(gpu, mig_devices=(held, replace(idle, memory=Memory(18 * GIB, 4 * GIB, 14 * GIB, 0))))
    (w,) = classify(snap(two), now_ns=0, watch=states({}))
    # One culprit per instance over its limit, each with its own figure and instance.
    assert [(c.used_bytes, c.mig_uuid) for c in w.culprits] == [(10 * GIB, "MIG-0"), (4 * GIB, "MIG-1")]
    assert "4.0 GiB used" in w.culprits[1].reason


def test_an_undecided_mig_gpu_names_the_instance_figure_and_the_mig_limit() -> None:
    """nvidia-smi's whole MiB: an instance at the limit + the MIG allowance cannot be judged. The line named the
    parent's figure and the bare limit."""
    from nvmlcheck.model import Memory, MigDevice
    from nvmlcheck.predicates import DEFAULT_MAX_USED_BYTES, DEFAULT_MIG_IDLE_BYTES

    at = DEFAULT_MAX_USED_BYTES + DEFAULT_MIG_IDLE_BYTES
    mib = 1 << 20
    edge = MigDevice(0, "MIG-0", 1, 0, Memory(18 * GIB, at, 18 * GIB - at, 0, granularity_bytes=mib), ())
    gpu = replace(dev(0, used=0, granularity=mib), mig_mode=True, mig_devices=(edge,))
    (v,) = classify(snap(gpu), now_ns=0, watch=states({}))
    (c,) = v.culprits
    assert v.class_ == "unknown" and c.used_bytes == at and c.mig_uuid == "MIG-0"
    assert c.reason.startswith("80.0 MiB used is within") and "MIG idle allowance" in c.reason


def test_verdicts_come_in_gpu_index_order_an_unreadable_gpu_in_its_place() -> None:
    lost = failure(1, GpuLost(15, "nvmlDeviceGetHandleByIndex_v2", 1))
    s = nc.Snapshot("nvml", 0, 0, 0.0, SYSTEM, (dev(0), dev(2)), (lost,))
    assert [v.index for v in classify(s, now_ns=0, watch=states({}), judge_health=False)] == [0, 1, 2]


def test_a_live_holder_resets_the_teardown_clock() -> None:
    w = states({42: "R"})
    w.observe(snap(dev(0, used=8 * GIB)), 0)
    w.observe(snap(dev(0, procs=[proc(42, 8 * GIB)])), 10 * MS)  # a process took it: no teardown
    again = snap(dev(0, used=8 * GIB))
    w.observe(again, 5_000 * MS)
    (v,) = classify(again, now_ns=5_000 * MS, watch=w)
    assert v.class_ == "reclaiming"  # measured from 5 s, not from 0


def test_a_zombie_holding_memory_past_the_bound_is_stuck_and_names_its_parent_action() -> None:
    w = states({99: "Z"})
    s = snap(dev(0, procs=[proc(99, 4 * GIB)]))
    w.observe(s, 0)
    (v,) = classify(s, now_ns=MODEL.stuck_after_ns(1, 4 * GIB) + 1, watch=w, container=lxc)
    assert v.class_ == "stuck" and v.culprits[0].action == "REAP_ZOMBIE" and v.culprits[0].pid == 99


def test_a_stuck_zombie_whose_parent_cannot_be_read_never_names_pid_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck import verdict

    monkeypatch.setattr(verdict, "_read_stat", lambda pid: None)  # reaped (or its stat unreadable) meanwhile
    w = states({99: "Z"})
    s = snap(dev(0, procs=[proc(99, 4 * GIB)]))
    w.observe(s, 0)
    (v,) = classify(s, now_ns=MODEL.stuck_after_ns(1, 4 * GIB) + 1, watch=w, container=lxc)
    assert v.class_ == "stuck" and "its parent must reap it" in v.line() and "None" not in v.line()


def test_a_process_in_d_state_is_held_then_stuck() -> None:
    w = states({5: "D"})
    s = snap(dev(0, procs=[proc(5, 1 * GIB)]))
    w.observe(s, 0)
    assert classify(s, now_ns=10 * MS, watch=w, container=lxc)[0].class_ == "held"
    late = classify(s, now_ns=MODEL.stuck_after_ns(1, 1 * GIB) + 1, watch=w, container=lxc)[0]
    assert late.class_ == "stuck" and late.culprits[0].state == "uninterruptible"


def test_a_listed_pid_not_visible_here_past_the_bound_is_held_not_stuck() -> None:
    w = states({})  # pid 7 is not in this PID namespace
    s = snap(dev(0, procs=[proc(7, 1 * GIB)]))
    w.observe(s, 0)
    assert classify(s, now_ns=1 * MS, watch=w)[0].class_ == "reclaiming"
    v = classify(s, now_ns=MODEL.stuck_after_ns(1, 1 * GIB) + 1, watch=w)[0]
    assert v.class_ == "held" and "another" in v.culprits[0].reason


def test_health_causes_make_it_unhealthy_with_the_operators_action() -> None:
    health = Health(retired_pages=None, retired_pages_pending=None,
                    remapped_rows=RemappedRows(0, 1, pending=True, failure=False))
    d = replace(dev(3), health=health)
    (v,) = classify(snap(d), now_ns=0, watch=states({}))
    assert v.class_ == "unhealthy" and v.needs_operator and v.actions == ("RESET_GPU",)
    (c,) = v.culprits
    assert c.kind == "row-remap-pending" and "nvidia-smi -r -i 3" in c.reason


def test_recovery_action_reboot_and_remap_failure_carry_their_actions() -> None:
    health = Health(None, None, RemappedRows(0, 0, pending=False, failure=True),
                    recovery_action=RecoveryAction.NODE_REBOOT)
    causes = health_causes(replace(dev(0), health=health))
    assert [c.action for c in causes] == ["CONTACT_SUPPORT", "NODE_REBOOT"]


def test_health_that_a_later_reading_could_not_read_is_never_ready() -> None:
    """``health=`` a reading where a GPU failed (lost: unhealthy; other errors: unknown) or is absent (unknown):
    never the judged snapshot's own, unrequested health, which says nothing."""
    not_requested = dev(0, unknown={"health": "not requested"})
    lost = snap(failures=[failure(0, GpuLost(15, "nvmlDeviceGetRemappedRows", 0))])
    (v,) = classify(snap(not_requested), now_ns=0, watch=states({}), health=lost)
    assert v.class_ == "unhealthy" and v.actions == ("NODE_REBOOT",)
    denied = snap(failures=[failure(0, NoPermission(4, "nvmlDeviceGetRemappedRows", 0))])
    (v,) = classify(snap(not_requested), now_ns=0, watch=states({}), health=denied)
    assert v.class_ == "unknown" and "NO_PERMISSION" in v.line()
    (v,) = classify(snap(not_requested), now_ns=0, watch=states({}), health=snap(dev(1)))
    assert v.class_ == "unknown" and "health was not read" in v.line()
    (v,) = classify(snap(not_requested), now_ns=0, watch=states({}), judge_health=False)  # a wait's timeout
    assert v.ready


def test_a_snapshot_read_without_health_is_never_ready() -> None:
    """``classify`` on a snapshot read without ``Fields.HEALTH`` (its health "not requested") called the GPU
    ready, a pending remap unseen: health never read is unknown."""
    not_requested = dev(0, unknown={"health": "not requested"})
    (v,) = classify(snap(not_requested), now_ns=0, watch=states({}))
    assert v.class_ == "unknown" and "health was not read" in v.line()


def test_unsupported_health_is_no_refusal_but_an_unreadable_one_is_unknown() -> None:
    unsupported = dev(0, unknown={"health.retired_pages": "not supported: nvmlDeviceGetRetiredPages_v2 returned X"})
    assert classify(snap(unsupported), now_ns=0, watch=states({}))[0].ready
    failed = dev(0, unknown={"health.remapped_rows": "unreadable: nvmlDeviceGetRemappedRows returned 999"})
    (v,) = classify(snap(failed), now_ns=0, watch=states({}))
    assert v.class_ == "unknown" and "health.remapped_rows" in v.culprits[0].reason


def test_short_when_clean_but_free_is_below_the_need() -> None:
    (v,) = classify(snap(dev(0)), now_ns=0, watch=states({}), need_bytes=200 * GIB)
    assert v.class_ == "short" and v.need_bytes == 200 * GIB and v.culprits[0].kind == "capacity-limit"
    (u,) = classify(snap(dev(0, used=8 << 20)), now_ns=0, watch=states({}), need_bytes=H200_TOTAL - H200_RESERVED - 1)
    assert u.class_ == "short" and u.culprits[0].kind == "capacity" and not u.beyond_capacity
    (f,) = classify(snap(dev(0)), now_ns=0, watch=states({}), need_fraction=0.9)
    assert f.ready and f.need_bytes is not None and f.need_bytes <= f.free_bytes  # type: ignore[operator]
    (g,) = classify(snap(dev(0)), now_ns=0, watch=states({}), need_fraction=1.0)
    assert g.class_ == "short" and g.beyond_capacity  # the driver's reserve is never free: 1.0 cannot be met


def test_a_need_beyond_what_the_gpu_has_empty_is_beyond_capacity() -> None:
    empty = H200_TOTAL - H200_RESERVED  # what a job can ever get: total - the driver's reserve
    (edge,) = classify(snap(dev(0)), now_ns=0, watch=states({}), need_bytes=empty)
    assert edge.ready and not edge.beyond_capacity
    (v,) = classify(snap(dev(0)), now_ns=0, watch=states({}), need_bytes=empty + 1)
    assert v.class_ == "short" and v.beyond_capacity and [c.kind for c in v.culprits] == ["capacity-limit"]
    assert "can never be free on this GPU" in v.line() and v.to_json()["beyond_capacity"] is True
    # A held GPU with such a need: held, and still beyond capacity (no wait can help)
    (h,) = classify(snap(dev(1, procs=[proc(4123, 8 * GIB)])), now_ns=0, watch=states({4123: "S"}),
                    need_bytes=empty + 1)
    assert h.class_ == "held" and h.beyond_capacity and not h.needs_operator
    # A need that only today's use makes unmet is short, not beyond capacity
    (s,) = classify(snap(dev(0, used=8 << 20)), now_ns=0, watch=states({}), need_bytes=empty - 1)
    assert s.class_ == "short" and not s.beyond_capacity
    # v1 (used counts the reserve, which is unknown): only a need above the total is beyond it
    (one,) = classify(snap(dev(0, memory=mem(v1=True))), now_ns=0, watch=states({}), need_bytes=empty + 1)
    assert not one.beyond_capacity
    (two,) = classify(snap(dev(0, memory=mem(v1=True))), now_ns=0, watch=states({}), need_bytes=H200_TOTAL + 1)
    assert two.beyond_capacity and any("not known" in c.reason for c in two.culprits)
    # nvidia-smi's whole MiB: within that resolution of the limit is not called beyond it
    mib = mem(granularity=1 << 20)
    (smi,) = classify(snap(dev(0, memory=mib)), now_ns=0, watch=states({}), need_bytes=empty + (1 << 20))
    assert not smi.beyond_capacity
    (smi2,) = classify(snap(dev(0, memory=mib)), now_ns=0, watch=states({}), need_bytes=empty + (3 << 20))
    assert smi2.beyond_capacity
    report = nc.ReadyReport((edge, v), None, 0, 1, 0.0)
    assert report.beyond_capacity and not report.needs_operator


def test_a_failed_query_is_never_ready_and_says_why() -> None:
    unknown_mem = dev(0, memory=None, unknown={"memory": "unreadable: nvmlDeviceGetMemoryInfo_v2 returned 4"})
    (v,) = classify(snap(unknown_mem), now_ns=0, watch=states({}))
    assert v.class_ == "unknown" and "nvmlDeviceGetMemoryInfo_v2" in v.culprits[0].reason
    (w,) = classify(snap(dev(0, procs=None, unknown={"processes": "no permission"})), now_ns=0, watch=states({}))
    assert w.class_ == "unknown" and not w.ready
    s = snap(failures=[failure(1, NoPermission(4, "nvmlDeviceGetMemoryInfo_v2", 1))])
    (x,) = classify(s, now_ns=0, watch=states({}))
    assert (x.index, x.class_) == (1, "unknown")
    lost = classify(snap(failures=[failure(2, GpuLost(15, "nvmlDeviceGetHandleByIndex_v2", 2))]), now_ns=0)
    assert lost[0].class_ == "unhealthy" and lost[0].actions == ("NODE_REBOOT",)


def test_the_gpu_takes_its_worst_culprits_class() -> None:
    health = Health(None, None, RemappedRows(0, 0, pending=True, failure=False))
    d = replace(dev(0, procs=[proc(1, 1 * GIB)]), health=health)
    (v,) = classify(snap(d), now_ns=0, watch=states({1: "S"}), container=lxc)
    assert v.class_ == "unhealthy" and {c.class_ for c in v.culprits} == {"unhealthy", "held"}
    assert v.actions[0] == "RESET_GPU"


def test_wait_timeout_holders_are_judged_from_its_snapshot_and_pickle() -> None:
    s = snap(dev(0, procs=[proc(4_000_123, 8 * GIB)]))
    exc = nc.WaitTimeout(1.0, 10, ["GPU 0: pid 4000123 (python3) holds 8.0 GiB (compute)"], s, 3)
    (c,) = exc.holders
    assert (c.gpu, c.pid, c.used_bytes, c.kind) == (0, 4_000_123, 8 * GIB, "compute")
    assert exc.culprits == ("GPU 0: pid 4000123 (python3) holds 8.0 GiB (compute)",)  # the text is kept
    given = Culprit(0, "held", "compute", "held by pid 1", pid=1)
    again = pickle.loads(pickle.dumps(nc.WaitTimeout(1.0, 10, ["x"], None, 1, holders=[given])))
    assert again.holders == (given,) and again.culprits == ("x",)
    assert nc.WaitTimeout(1.0, 10, [], None).holders == ()


@pytest.mark.parametrize("fraction", [0.0, 1.5, -0.1])
def test_capacity_predicate_refuses_bad_fractions(fraction: float) -> None:
    with pytest.raises(ValueError, match="fraction"):
        nc.memory_free_at_least(fraction=fraction)


def test_capacity_predicate_is_three_valued_with_smi_granularity() -> None:
    p = nc.memory_free_at_least(10 * GIB)
    assert p.check(snap(dev(0))) is True
    assert p.check(snap(dev(0, used=140 * GIB))) is False
    with pytest.raises(ValueError, match="exactly one"):
        nc.memory_free_at_least(1, fraction=0.5)


@pytest.mark.parametrize(
    ("why", "expected"),
    [("not supported: nvmlDeviceGetRetiredPages_v2 returned NVML_ERROR_NOT_SUPPORTED", True),
     ("not available: nvmlDeviceGetTotalEccErrors is missing from this driver's libnvidia-ml", True),
     ("nvidia-smi printed [N/A] for retired_pages.pending: not available on this GPU or driver", True),
     ("nvidia-smi printed [Unknown Error] for remapped_rows.pending", False),
     ("unreadable: nvmlDeviceGetRemappedRows returned NVML_ERROR_UNKNOWN (999)", False)],
)
def test_which_unknown_health_reasons_are_unsupported(why: str, expected: bool) -> None:
    from nvmlcheck.model import unsupported

    assert unsupported(why) is expected


def test_a_gpus_actions_put_the_strongest_first() -> None:
    """A fatal XID's reset came before a remap failure's service, both unhealthy: ``actions[0]`` read as enough."""
    from nvmlcheck.verdict import GpuVerdict

    v = GpuVerdict(0, None, "GPU 0", "unhealthy", (
        Culprit(0, "unhealthy", "xid", "XID 48", action="RESET_GPU"),
        Culprit(0, "held", "compute", "held by pid 1", pid=1, action="STOP_HOLDER"),
        Culprit(0, "unhealthy", "row-remap-failure", "a row remapping failed", action="CONTACT_SUPPORT"),
    ))
    assert v.actions == ("CONTACT_SUPPORT", "RESET_GPU", "STOP_HOLDER")


def test_a_holder_on_a_mig_instance_is_told_apart_from_one_on_the_whole_gpu() -> None:
    """Culprits carry the MIG instance (UUID, GI, CI): in JSON and in the line, a holder in one instance of a GPU
    in MIG mode is not read as the whole GPU's; a holder outside MIG has none."""
    from nvmlcheck.model import Memory, MigDevice, ProcessKind
    from nvmlcheck.predicates import instance_view

    inst = MigDevice(1, "MIG-1", 2, 0, Memory(70 * GIB, 8 * GIB, 62 * GIB, 0), ())
    p = nc.GpuProcess(4242, ProcessKind.COMPUTE, 8 * GIB, "python3", 2, 0)
    gpu = replace(dev(0, used=8 * GIB), compute_processes=(p,), mig_mode=True, mig_devices=(inst,))
    (v,) = classify(snap(gpu), now_ns=0, watch=states({4242: "S"}), judge_health=False)
    (c,) = v.culprits
    assert (c.mig_uuid, c.gpu_instance_id, c.compute_instance_id, c.on_instance) == ("MIG-1", 2, 0, True)
    doc = c.to_json()
    assert (doc["mig_uuid"], doc["gpu_instance_id"], doc["compute_instance_id"]) == ("MIG-1", 2, 0)
    assert c.describe().startswith("GPU 0 MIG (GI 2, CI 0, MIG-1): held by pid 4242")
    # The instance judged alone (--devices MIG-1): its memory culprit is the instance's too.
    view = instance_view(replace(gpu, compute_processes=()), inst)
    (iv,) = classify(snap(gpu), now_ns=0, watch=states({}), units=[view], judge_health=False)
    assert iv.culprits and all(x.mig_uuid == "MIG-1" and x.gpu_instance_id == 2 for x in iv.culprits)
    # Outside MIG: no instance, and the line is unchanged.
    (w,) = classify(snap(dev(1, procs=[proc(4123, 8 * GIB)])), now_ns=0, watch=states({4123: "S"}),
                    judge_health=False)
    (plain,) = w.culprits
    assert (plain.mig_uuid, plain.gpu_instance_id, plain.on_instance) == (None, None, False)
    assert plain.to_json()["gpu_instance_id"] is None and plain.describe().startswith("GPU 1: held by")


def test_a_mig_holders_instance_survives_pickling_of_wait_timeout() -> None:
    c = Culprit(0, "held", "compute", "held by pid 1", pid=1, mig_uuid="MIG-1", gpu_instance_id=2,
                compute_instance_id=0)
    err = nc.WaitTimeout(1.0, 1, ["GPU 0: held"], holders=(c,))
    back = pickle.loads(pickle.dumps(err))
    assert back.holders == (c,) and back.holders[0].gpu_instance_id == 2


def test_the_verdict_line_of_a_whole_mig_gpu_names_the_holders_instance() -> None:
    from nvmlcheck.model import Memory, MigDevice, ProcessKind

    inst = MigDevice(1, "MIG-1", 2, 0, Memory(70 * GIB, 8 * GIB, 62 * GIB, 0), ())
    p = nc.GpuProcess(4242, ProcessKind.COMPUTE, 8 * GIB, "python3", 2, 0)
    gpu = replace(dev(0, used=8 * GIB), compute_processes=(p,), mig_mode=True, mig_devices=(inst,))
    (v,) = classify(snap(gpu), now_ns=0, watch=states({4242: "S"}), judge_health=False)
    assert v.line() == "GPU 0: held by pid 4242 (python3), 8.0 GiB, on MIG (GI 2, CI 0, MIG-1)"
    report = nc.ReadyReport((v,), snap(gpu), 0, 1, 0.0)
    assert report.culprits == ("GPU 0 MIG (GI 2, CI 0, MIG-1): held by pid 4242 (python3), 8.0 GiB",)


@pytest.mark.parametrize("mig", ["instances", "mode"])
def test_a_need_on_a_gpu_whose_mig_facts_are_unknown_is_unknown_never_ready(mig: str) -> None:
    """In MIG mode a job gets one instance, not the whole GPU's free memory: with the instances (or the MIG mode)
    unread, ``ready --need`` said ready on the parent's 139 GiB free."""
    from types import MappingProxyType

    if mig == "instances":
        d = replace(dev(0, used=55 << 20), mig_mode=True, mig_devices=None,
                    unknown=MappingProxyType({"mig_devices": "nvmlDeviceGetMaxMigDeviceCount failed"}))
    else:
        d = replace(dev(0), mig_mode=None, unknown=MappingProxyType({"mig": "nvmlDeviceGetMigMode failed"}))
    (v,) = classify(snap(d), now_ns=0, watch=states({}), need_bytes=100 * GIB, judge_health=False)
    assert v.class_ == "unknown" and not v.ready
    assert any(c.kind == "capacity" and "MIG" in c.reason for c in v.culprits), v.culprits
    # No need: it was judged clean alone, and ready; but in MIG mode with no instance no CUDA job can run (short),
    # and that is what cannot be told here: unknown, as select passes it over.
    (plain,) = classify(snap(d), now_ns=0, watch=states({}), judge_health=False)
    assert plain.class_ == "unknown" and not plain.ready
    (c,) = plain.culprits
    assert c.kind == "capacity" and "whether a CUDA job can run on it is unknown" in c.reason
