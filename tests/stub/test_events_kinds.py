"""Event kinds beyond XIDs and ECC through the stub (MIG configuration changes, nvml.h's newer types, types
nvmlcheck has no name for, records with no type bit), and a GPU lost while listened to. Events are raised by the
stub's timeline; nothing asserts how long anything took."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.events import EventKind, EventListener, GpuEvent
from nvmlcheck.testing import EVENT_KINDS, Scenario, build_stub

pytestmark = pytest.mark.stub
GIB = 1 << 30
ALL_TYPES = 0xFFFF


def _heard(listener: EventListener, count: int) -> list[GpuEvent]:
    """The first ``count`` events the listener hears (or fewer after 60 s: the assertion then says which)."""
    got: list[GpuEvent] = []
    after = 0
    for _ in range(600):
        new, after = listener.next_events(after, 0.1)
        got.extend(new)
        if len(got) >= count:
            break
    return got


def test_a_mig_configuration_change_is_recorded_and_stops_no_wait(scenario_path: Path) -> None:
    sc = Scenario.h200(1)
    sc.set_device(0, mig=True, event_types=ALL_TYPES)
    sc.at_ms(0).raise_event(0, "mig", gi=1, ci=0)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        [event] = _heard(listener, 1)
        # Before, the stub could raise no MIG event (raise_event refused "mig"): only the unit fake reached this.
        assert (event.index, event.kind, event.event_type) == (0, EventKind.MIG_CONFIG, 0x100)
        assert (event.gpu_instance_id, event.compute_instance_id) == (1, 0) and not event.fatal
        assert gpus.wait_until_clean(timeout=60.0, events=True).clean


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_every_named_kind_reaches_the_listener(scenario_path: Path, kind: str) -> None:
    sc = Scenario.h200(1)
    sc.set_device(0, event_types=ALL_TYPES)
    if kind == "xid":
        sc.at_ms(0).raise_event(0, "xid", xid=13)
    else:
        sc.at_ms(0).raise_event(0, kind, data=7)  # type: ignore[arg-type]
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        [event] = _heard(gpus.listen(), 1)
        names = {"sbe": "single_bit_ecc", "dbe": "double_bit_ecc", "power": "power_source", "mig": "mig_config",
                 "sbe_storm": "single_bit_ecc_storm", "recovery_action": "gpu_recovery_action"}
        assert event.kind.value == names.get(kind, kind)
        assert event.event_data == (13 if kind == "xid" else 7)


def test_types_without_a_name_reach_the_listener_as_unknown(scenario_path: Path) -> None:
    sc = Scenario.h200(1)
    sc.set_device(0, event_types=ALL_TYPES)
    sc.at_ms(0).raise_event(0, 0x10008, data=48)  # XID 48 with a bit of a newer driver's
    sc.at_ms(0).raise_event(0, 0)  # a record with no type bit at all
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        got = _heard(gpus.listen(), 3)
        assert [(e.kind, e.xid, e.event_type, e.event_data) for e in got] == [
            (EventKind.XID, 48, 0x10008, 48),
            (EventKind.UNKNOWN, None, 0x10008, 48),
            (EventKind.UNKNOWN, None, 0, 0),
        ]
        assert [e.fatal for e in got] == [True, False, False]


def test_a_type_the_gpu_does_not_report_is_not_registered(scenario_path: Path) -> None:
    # The default device reports sbe, dbe, pstate, xid and clock: its MIG changes are not asked for, not heard.
    sc = Scenario.h200(1)
    sc.at_ms(0).raise_event(0, "mig")
    sc.at_ms(0).raise_event(0, "clock")
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        assert [e.kind for e in _heard(gpus.listen(), 1)] == [EventKind.CLOCK]


def test_a_gpu_lost_while_listened_to_leaves_the_others_listened_to(scenario_path: Path) -> None:
    sc = Scenario.h200(2)
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.at_ms(200).set_device(1, lost=True)
    sc.at_ms(600).raise_event(0, "xid", xid=79)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        # Registered before the loss (the usual case) or, on a machine loaded enough that opening took 200 ms,
        # after it: both are valid, and GPU 0 must be listened to either way. This asserted the first alone.
        lost_first = listener.covered == frozenset({0})
        assert listener.covered == frozenset({0, 1}) or lost_first
        # Before, GPU 1's loss (nvmlEventSetWait_v2: GPU_IS_LOST) ended the listener for both GPUs: the wait on
        # GPU 0 polled until its timeout and never heard the XID 79.
        with pytest.raises(nc.GpuFault) as info:
            gpus.wait_until_clean(timeout=60.0, devices=0)
        assert (info.value.index, info.value.xid) == (0, 79)
        assert listener.state == "running" and listener.covered == frozenset({0})
        assert "NVML_ERROR_GPU_IS_LOST" in listener.device_reasons[1]
        reason = listener.reason or ""
        assert "GPU 1: " in reason and ("GPU 1: no longer listened to" in reason or lost_first)
