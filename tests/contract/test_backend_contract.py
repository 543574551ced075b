"""One contract, two backends: the same assertions on the NVML backend (the stub libnvidia-ml, through cffi) and the
nvidia-smi backend (the fake nvidia-smi, which renders the same scenario file with code that shares nothing with
nvmlcheck). Memory agrees to nvidia-smi's granularity: it prints whole MiB, rounded up.

Where the backends legitimately differ, the contract says so explicitly: nvidia-smi has no NVML version string, no
max video clock and no minor number of its own (the driver's procfs list gives it on a real host; the fake GPUs
are in none), and it reads a GPU's name and PCI bus id once, when the backend opens (one it may not read is then
unknown, where NVML fails the GPU).

NVML errors are played on both sides by the scenario's sticky ``fault`` lines: the stub answers the call with the
code, the fake nvidia-smi prints the placeholder nvidia-smi prints for it (``[Insufficient Permissions]``, ...).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock, build_stub, stub_source_dir

pytestmark = pytest.mark.stub

MIB = 1 << 20
GIB = 1 << 30
BACKENDS = ("nvml", "smi")

Opener = Callable[[Scenario], nc.Session]


@pytest.fixture(params=BACKENDS)
def open_backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Opener]:
    scenario_path = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario_path))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    sessions: list[nc.Session] = []

    def opener(scenario: Scenario) -> nc.Session:
        scenario.write(scenario_path)
        if request.param == "nvml":
            session = nc.open("nvml", library_path=str(build_stub()))
        else:
            session = nc.open("smi", smi_command=[sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py")])
        sessions.append(session)
        return session

    yield opener
    for s in sessions:
        s.close()


def _busy() -> Scenario:
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_100_001, used_bytes=16 * GIB)
    sc.add_process(0, 4_100_002, kind="graphics", used_bytes=300 * MIB + 5)
    sc.add_process(1, 4_100_003, kind="mps", used_bytes=GIB + 1)
    sc.add_process(1, 4_100_004, used_bytes=None, holds_bytes=2 * MIB)
    return sc


def _close(exact: int, smi_value: int, granularity: int) -> bool:
    """smi's value is the exact byte count rounded up to its granularity."""
    return exact <= smi_value < exact + granularity or (exact % granularity == 0 and smi_value == exact)


def test_identity(open_backend: Opener) -> None:
    with open_backend(_busy()) as gpus:
        snap = gpus.snapshot()
    assert [d.index for d in snap.devices] == [0, 1]
    assert [d.uuid for d in snap.devices] == [
        "GPU-00000000-0000-0000-0000-000000000000",
        "GPU-00000000-0000-0000-0000-000000000001",
    ]
    assert {d.name for d in snap.devices} == {"NVIDIA H200"}
    assert [d.pci_bus_id for d in snap.devices] == ["00000000:01:00.0", "00000000:02:00.0"]
    assert snap.system.driver_version == "580.159.04"
    assert snap.backend == gpus.backend_name


# Characters the scenario format keeps inside a value (it splits words at space and tab only, lines at "\n" only):
# both readers must see the same name, not a line broken at U+2028 or a word broken at a no-break space.
ODD_NAMES = ["NVIDIA\u00a0H200", "NVIDIA\u2003H200", "GPU\u2028one", "GPU\u0085one", "GPU\x0bone", "GPU\x1cone",
             'Ünï "çødé" #1\\', "NVIDIA\tH200"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_names_with_odd_characters_read_alike(open_backend: Opener, name: str) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(0, name=name)
    sc.add_process(1, 4_100_001, used_bytes=GIB)  # the lines after the odd one are read too
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [d.name for d in snap.devices] == [name, "NVIDIA H200"]
    assert [p.pid for p in snap.devices[1].processes or ()] == [4_100_001]


def test_memory_to_the_granularity(open_backend: Opener) -> None:
    with open_backend(_busy()) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.MEMORY)
    held = [16 * GIB + 300 * MIB + 5, GIB + 1 + 2 * MIB]
    for d, used in zip(snap.devices, held, strict=True):
        m = d.memory
        assert m is not None and not m.used_includes_reserved
        g = m.granularity_bytes
        assert g == (1 if snap.backend == "nvml" else MIB)
        assert _close(150_754_820_096, m.total_bytes, g)
        assert _close(used, m.used_bytes, g)
        assert m.reserved_bytes is not None and _close(644_939_776, m.reserved_bytes, g)


def test_processes_of_every_kind(open_backend: Opener) -> None:
    with open_backend(_busy()) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.PROCESSES)
    d0, d1 = snap.devices
    assert [(p.pid, p.kind) for p in d0.compute_processes or ()] == [(4_100_001, nc.ProcessKind.COMPUTE)]
    assert [p.pid for p in d0.graphics_processes or ()] == [4_100_002]
    assert d0.mps_processes == ()
    (g,) = d0.graphics_processes or ()
    assert g.used_bytes is not None and _close(300 * MIB + 5, g.used_bytes, 1 if snap.backend == "nvml" else MIB)
    assert [p.pid for p in d1.mps_processes or ()] == [4_100_003]
    na = [p for p in d1.compute_processes or () if p.pid == 4_100_004]
    assert len(na) == 1 and na[0].used_bytes is None  # "not available" is unknown, never 0
    assert d1.why_unknown("processes.used_bytes")  # with its reason, on both backends
    assert d0.why_unknown("processes.used_bytes") is None  # only where a process's amount is unknown
    assert d0.processes is not None and len(d0.processes) == 2


def test_unsupported_is_none_with_a_reason(open_backend: Opener) -> None:
    sc = Scenario.h200()
    sc.set_device(0, unsupported=("remapped", "clock.sm", "retired_pages", "retired_pending"))
    with open_backend(sc) as gpus:
        d = gpus.snapshot().devices[0]
    assert d.health is not None and d.health.remapped_rows is None
    assert d.why_unknown("health.remapped_rows")
    assert d.clocks is not None and d.clocks.sm_mhz is None
    assert d.clocks.memory_mhz == 3201
    # Hopper retires no pages: unknown on both, never an empty list
    assert d.health.retired_pages is None and d.why_unknown("health.retired_pages")


def test_clocks(open_backend: Opener) -> None:
    with open_backend(Scenario.h200()) as gpus:
        clocks = gpus.snapshot().devices[0].clocks
    assert clocks is not None
    assert clocks.current == nc.ClockSet(345, 345, 3201, 765)
    assert (clocks.max.graphics_mhz, clocks.max.sm_mhz, clocks.max.memory_mhz) == (1980, 1980, 3201)


def test_lost_gpu_is_a_failure_and_the_others_report(open_backend: Opener) -> None:
    sc = Scenario.h200(devices=3)
    sc.set_device(1, lost=True)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [d.index for d in snap.devices] == [0, 2]
    assert [f.index for f in snap.failures] == [1]
    assert isinstance(snap.failures[0].error, nc.NvmlCheckError)


def test_wait_clean_on_an_idle_gpu(open_backend: Opener) -> None:
    with open_backend(Scenario.h200()) as gpus:
        result = gpus.wait_until_clean(timeout=30)
    assert result.clean and result.polls >= 2
    assert result.snapshot.backend == gpus.backend_name


def test_wait_names_the_holder_at_the_timeout(open_backend: Opener) -> None:
    t = StepClock(2.0)
    with open_backend(_busy()) as gpus, pytest.raises(nc.WaitTimeout) as info:
        gpus.wait_until_clean(timeout=30, devices=[0], clock=t.clock, sleep=t.sleep)
    text = str(info.value)
    assert "4100001" in text and "16.0 GiB" in text and "GPU 0" in text
    assert info.value.snapshot is not None and info.value.snapshot.backend == gpus.backend_name


def test_process_list_empty_but_memory_used_is_not_clean(open_backend: Opener) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)  # memory held with no visible process (a PID namespace, say)
    t = StepClock(2.0)
    with open_backend(sc) as gpus, pytest.raises(nc.WaitTimeout) as info:
        gpus.wait_until_clean(timeout=30, clock=t.clock, sleep=t.sleep)
    assert "no visible process" in str(info.value)


# --- MIG (issue 11): the same scenario through NVML's MIG calls on the stub and the fake nvidia-smi's -q / -L -------

MIG_UUIDS = ("MIG-5f0a0000-0000-5000-8000-000000000000", "MIG-5f0a0000-0000-5000-8000-000000000001")
IDLE_MIG_PARENT = 55 * MIB  # an idle H200 in MIG mode, no process (public capture, driver 590.48.01)


def _mig(*, loaded: bool) -> Scenario:
    sc = Scenario.h200(devices=2)
    sc.set_device(0, mig=True, used_bytes=IDLE_MIG_PARENT)
    for i, uuid in enumerate(MIG_UUIDS):
        sc.add_mig_device(0, i, gi=i + 1, ci=0, uuid=uuid, total_bytes=16 * GIB, used_bytes=0)
    if loaded:
        sc.add_process(0, 4_100_042, used_bytes=3 * GIB, gi=2, ci=0)
    return sc


def test_mig_devices_are_read(open_backend: Opener) -> None:
    with open_backend(_mig(loaded=True)) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    d0, d1 = snap.devices
    assert (d0.mig_mode, d1.mig_mode) == (True, False)
    assert d1.mig_devices == ()
    assert d0.mig_devices is not None
    assert [(m.index, m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in d0.mig_devices] == [
        (0, MIG_UUIDS[0], 1, 0),
        (1, MIG_UUIDS[1], 2, 0),
    ]
    m0, m1 = d0.mig_devices
    assert m0.memory is not None and m0.memory.used_bytes == 0 and m0.memory.total_bytes == 16 * GIB
    assert m1.memory is not None and _close(3 * GIB, m1.memory.used_bytes, m1.memory.granularity_bytes)
    assert m0.processes == () and [p.pid for p in m1.processes or ()] == [4_100_042]
    assert [(p.gpu_instance_id, p.compute_instance_id) for p in d0.compute_processes or ()] == [(2, 0)]


def test_idle_mig_gpu_is_clean(open_backend: Opener) -> None:
    with open_backend(_mig(loaded=False)) as gpus:
        result = gpus.wait_until_clean(timeout=30.0)
    assert result.snapshot.devices[0].mig_mode is True


def test_loaded_mig_gpu_is_not_clean_naming_the_instance(open_backend: Opener) -> None:
    with open_backend(_mig(loaded=True)) as gpus:
        verdict = nc.default_predicate().evaluate(gpus.snapshot(fields=nc.Fields.WAIT))
    assert verdict.satisfied is False
    assert any("4100042" in r and MIG_UUIDS[1] in r and "GI 2" in r for r in verdict.reasons)


def test_devices_mig_selects_one_instance(open_backend: Opener) -> None:
    with open_backend(_mig(loaded=True)) as gpus:
        assert gpus.resolve(MIG_UUIDS[0]) == (0,)
        with pytest.raises(ValueError, match="2 MIG devices"):
            gpus.resolve(MIG_UUIDS[1][:-1])  # a prefix of both
        # The idle instance is clean although its GPU holds a process in the other instance ...
        result = gpus.wait_until_clean(timeout=30.0, devices=[MIG_UUIDS[0]])
        assert result.snapshot.devices[0].mig_mode is True
        # ... and the loaded one is not, named by its UUID.
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=0, devices=[MIG_UUIDS[1]])
        assert any("4100042" in c and MIG_UUIDS[1] in c for c in info.value.culprits)
        with pytest.raises(ValueError, match="no MIG device"):
            gpus.resolve("MIG-ffffffff")


def test_mig_mode_comes_with_the_identity_and_cuda_numbers_are_refused(open_backend: Opener) -> None:
    with open_backend(_mig(loaded=False)) as gpus:
        ident = gpus.snapshot(fields=nc.Fields(0))
        assert [d.mig_mode for d in ident.devices] == [True, False]
        mapping = gpus.cuda_mapping({"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
        assert mapping.devices is None and "GPU 0 is in MIG mode" in (mapping.order_unknown or "")
        by_uuid = gpus.cuda_mapping({"CUDA_VISIBLE_DEVICES": ident.devices[1].uuid})
        assert by_uuid.resolve("cuda:all") == (1,)


def test_an_instance_is_named_alike_by_its_uuid_and_the_old_name(open_backend: Opener) -> None:
    with open_backend(_mig(loaded=True)) as gpus:
        parent = gpus.snapshot(fields=nc.Fields(0)).devices[0].uuid
        for name in (MIG_UUIDS[1], f"MIG-{parent}/2/0"):
            with pytest.raises(nc.WaitTimeout) as info:
                gpus.wait_until_clean(timeout=0, devices=[name])
            assert all(MIG_UUIDS[1] in c for c in info.value.culprits)
        assert gpus.wait_until_clean(timeout=0, devices=[f"MIG-{parent}/1/0"]).clean


# --- health (issue 22): each state read the same way by both backends, and judged by Health.causes ---------------

HEALTH_STATES: dict[str, tuple[dict[str, object], set[str]]] = {
    # state: (device fields, the cause codes expected)
    "healthy": ({}, set()),
    "row_remap_pending": ({"remapped_rows": (0, 1, True, False)}, {"row-remap-pending"}),
    "row_remap_failure": ({"remapped_rows": (2, 512, False, True)}, {"row-remap-failure"}),
    "retired_pages_pending": (
        {"unsupported": (), "retired_pages": [("dbe", 0x2000, 1_700_000_100)], "retired_pending": True},
        {"retired-pages-pending"},
    ),
    # The driver read the recovery action as NONE: it judged those errors (contained) and asks for nothing.
    "ecc_volatile_uncorrected_recovery_none": ({"ecc_uncorrected_volatile": 3, "ecc_uncorrected_aggregate": 11}, set()),
    "ecc_volatile_uncorrected_recovery_reset": (
        {"ecc_uncorrected_volatile": 3, "ecc_uncorrected_aggregate": 11, "recovery_action": 1},
        {"ecc-uncorrected-volatile", "recovery-action"},
    ),
    "ecc_aggregate_only": ({"ecc_uncorrected_aggregate": 11}, set()),  # a lifetime count alone is no cause
    "recovery_reset": ({"recovery_action": 1}, {"recovery-action"}),
    "recovery_drain_and_reset": ({"recovery_action": 4}, {"recovery-action"}),
    "recovery_unknown_code": ({"recovery_action": 9}, {"recovery-action"}),
}


@pytest.mark.parametrize("state", sorted(HEALTH_STATES))
def test_health_state(open_backend: Opener, state: str) -> None:
    fields, codes = HEALTH_STATES[state]
    sc = Scenario.h200()
    sc.set_device(0, **fields)
    with open_backend(sc) as gpus:
        d = gpus.snapshot(fields=nc.Fields.HEALTH).devices[0]
    h = d.health
    assert h is not None
    assert {c.code for c in h.causes()} == codes
    rows = fields.get("remapped_rows", (0, 0, False, False))
    assert isinstance(rows, tuple)
    assert h.remapped_rows == nc.RemappedRows(*rows)
    assert h.ecc_uncorrected_volatile == fields.get("ecc_uncorrected_volatile", 0)
    assert h.ecc_uncorrected_aggregate == fields.get("ecc_uncorrected_aggregate", 0)
    assert h.recovery_action == nc.RecoveryAction(fields.get("recovery_action", 0))  # type: ignore[arg-type]
    if "retired_pending" in fields:
        assert h.retired_pages_pending is True
        assert h.retired_pages == (nc.RetiredPage(0x2000, nc.RetirementCause.DOUBLE_BIT_ECC, 1_700_000_100),)
    else:
        assert h.retired_pages_pending is None and d.why_unknown("health.retired_pages_pending")  # Hopper
    if codes:
        assert h.action is not None and not h.action.waiting_helps
    else:
        assert h.action is None


def test_volatile_ecc_errors_without_a_recovery_action_are_a_cause(open_backend: Opener) -> None:
    # A driver before 565 (or a board without the field): the count is judged alone, as XID 48 (a reset clears it).
    sc = Scenario.h200()
    sc.set_device(0, ecc_uncorrected_volatile=2, unsupported=("recovery", "retired_pages", "retired_pending"))
    with open_backend(sc) as gpus:
        d = gpus.snapshot(fields=nc.Fields.HEALTH).devices[0]
    assert d.health is not None and d.health.recovery_action is None
    assert [(c.code, c.action) for c in d.health.causes()] == [
        ("ecc-uncorrected-volatile", nc.OperatorAction.RESET_GPU)]


def test_health_unsupported_is_unknown_never_a_cause(open_backend: Opener) -> None:
    sc = Scenario.h200()
    sc.set_device(0, unsupported=("ecc", "recovery", "remapped", "retired_pages", "retired_pending"))
    with open_backend(sc) as gpus:
        d = gpus.snapshot(fields=nc.Fields.HEALTH).devices[0]
    h = d.health
    assert h is not None and h.causes() == ()
    for key in ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate", "recovery_action", "remapped_rows"):
        assert getattr(h, key) is None
        assert d.why_unknown(f"health.{key}"), key


def _pending_remap_ecc_unreadable(sc: Scenario) -> None:
    sc.set_device(0, remapped_rows=(0, 1, True, False))
    sc.fault("nvmlDeviceGetTotalEccErrors", 999, device=0)


# The JSON document's health.state: "causes": [] alone read as healthy when nothing could be read (round 6).
HEALTH_JSON_STATES: dict[str, tuple[Callable[[Scenario], None], str]] = {
    "all read, no cause": (lambda sc: None, "healthy"),  # retired pages not supported (Hopper): still judged
    "every value not supported": (
        lambda sc: sc.set_device(0, unsupported=("ecc", "recovery", "remapped", "retired_pages", "retired_pending")),
        "unknown",
    ),
    "remapper: no permission": (lambda sc: sc.fault("nvmlDeviceGetRemappedRows", 4, device=0), "unknown"),
    "remapper: transient error": (lambda sc: sc.fault("nvmlDeviceGetRemappedRows", 999, device=0), "unknown"),
    "ECC: no permission": (lambda sc: sc.fault("nvmlDeviceGetTotalEccErrors", 4, device=0), "unknown"),
    "recovery action: transient error": (lambda sc: sc.fault("nvmlDeviceGetFieldValues", 999, device=0), "unknown"),
    "ECC off (not supported)": (lambda sc: sc.set_device(0, unsupported=("ecc", "retired_pages")), "healthy"),
    "pending remap, ECC unreadable": (_pending_remap_ecc_unreadable, "unhealthy"),
}



@pytest.mark.parametrize("case", sorted(HEALTH_JSON_STATES))
def test_health_json_state_says_unknown_where_causes_cannot_tell(open_backend: Opener, case: str) -> None:
    from nvmlcheck.jsonout import device_json

    setup, expected = HEALTH_JSON_STATES[case]
    sc = Scenario.h200()
    setup(sc)
    with open_backend(sc) as gpus:
        d = gpus.snapshot(fields=nc.Fields.HEALTH).devices[0]
    health = device_json(d)["health"]
    assert health["state"] == expected, (health, d.unknown)
    assert (health["causes"] != []) == (expected == "unhealthy")


def test_health_is_not_read_on_the_wait_path(open_backend: Opener) -> None:
    sc = Scenario.h200()
    sc.set_device(0, remapped_rows=(0, 1, True, False), recovery_action=1)
    with open_backend(sc) as gpus:
        d = gpus.snapshot(fields=nc.Fields.WAIT).devices[0]
    assert d.health is None and d.why_unknown("health") == "not requested"


@pytest.mark.parametrize(
    "fields", [nc.Fields.CURRENT_CLOCKS, nc.Fields.MEMORY | nc.Fields.PROCESSES | nc.Fields.CURRENT_CLOCKS]
)
def test_current_clocks_alone_leave_the_limits_unknown_as_not_asked(open_backend: Opener, fields: nc.Fields) -> None:
    with open_backend(Scenario.h200()) as gpus:
        d = gpus.snapshot(fields=fields).devices[0]
    assert d.clocks is not None and d.clocks.sm_mhz is not None and d.clocks.current.memory_mhz is not None
    assert d.clocks.max.sm_mhz is None and d.clocks.applications.graphics_mhz is None
    for key in ("clocks.max.sm_mhz", "clocks.applications.graphics_mhz"):
        why = d.why_unknown(key)
        assert why is not None and ("not requested" in why or "not asked" in why), (key, why)
    assert d.health is None  # not asked either


@pytest.mark.parametrize(
    "fields", [nc.Fields.CLOCK_SPEEDS, nc.Fields.MEMORY | nc.Fields.PROCESSES | nc.Fields.CLOCK_SPEEDS]
)
def test_the_speeds_alone_leave_the_event_reasons_unknown_as_not_asked(open_backend: Opener, fields: nc.Fields) -> None:
    # What the snapshot table asks for: the reasons' first call costs ~1.4 ms on an H200 and the table does not show
    # them.
    assert nc.Fields.CURRENT_CLOCKS == nc.Fields.CLOCK_SPEEDS | nc.Fields.CLOCK_REASONS
    with open_backend(Scenario.h200()) as gpus:
        d = gpus.snapshot(fields=fields).devices[0]
        full = gpus.snapshot(fields=nc.Fields.CURRENT_CLOCKS).devices[0]
        reasons_only = gpus.snapshot(fields=nc.Fields.CLOCK_REASONS).devices[0]
    assert d.clocks is not None and d.clocks.sm_mhz is not None and d.clocks.current.video_mhz is not None
    assert d.clocks.event_reasons is None
    why = d.why_unknown("clocks.event_reasons")
    assert why is not None and ("not requested" in why or "not asked" in why), why
    assert full.clocks is not None and full.clocks.event_reasons is not None  # the control
    assert full.why_unknown("clocks.event_reasons") is None
    # The reasons alone come with the speeds they qualify (as the limits do).
    assert reasons_only.clocks is not None and reasons_only.clocks.event_reasons is not None
    assert reasons_only.clocks.sm_mhz is not None


def test_the_clocks_are_current_and_limits_together(open_backend: Opener) -> None:
    assert nc.Fields.CLOCKS == nc.Fields.CURRENT_CLOCKS | nc.Fields.CLOCK_LIMITS
    with open_backend(Scenario.h200()) as gpus:
        every = gpus.snapshot(fields=nc.Fields.CLOCKS).devices[0]
        limits = gpus.snapshot(fields=nc.Fields.CLOCK_LIMITS).devices[0]
    for d in (every, limits):  # the limits come with the current clocks they are read around
        assert d.clocks is not None and d.clocks.sm_mhz is not None and d.clocks.max.sm_mhz is not None
        assert d.clocks.applications.graphics_mhz is not None


# --- one GPU's reading that cannot be true fails that GPU alone, on both backends -------------------------------------

TB = 1 << 40


def _corrupt_second_gpu(what: str) -> Scenario:
    sc = Scenario.h200(devices=3)
    sc.add_process(0, 4_100_001, used_bytes=GIB)
    if what == "pid":  # above Linux's PID_MAX_LIMIT: a struct layout mismatch (driver 535.43)
        sc.add_process(1, 4_194_305, used_bytes=GIB)
    elif what == "memory":  # used above total
        sc.set_device(1, used_bytes=TB)
    else:  # one process holding more than the GPU has
        sc.add_process(1, 4_100_002, used_bytes=TB, holds_bytes=0)
    sc.add_process(2, 4_100_003, used_bytes=2 * GIB)
    return sc


@pytest.mark.parametrize("what", ["pid", "memory", "process_bytes"])
def test_a_corrupt_reading_fails_its_gpu_alone(open_backend: Opener, what: str) -> None:
    with open_backend(_corrupt_second_gpu(what)) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
        t = StepClock(2.0)
        slept: list[float] = []
        with pytest.raises(nc.CorruptData) as info:
            gpus.wait_until_clean(timeout=30, devices=[1], clock=t.clock, sleep=slept.append)
    assert [d.index for d in snap.devices] == [0, 2]  # the others still report, with their processes
    assert [[p.pid for p in d.processes or ()] for d in snap.devices] == [[4_100_001], [4_100_003]]
    (failure,) = snap.failures
    assert (failure.index, failure.uuid) == (1, "GPU-00000000-0000-0000-0000-000000000001")
    assert isinstance(failure.error, nc.CorruptData)
    assert "GPU 1" in str(info.value)  # a wait on it fails at its first poll, naming it (never clean, never idle)
    assert slept == []


def test_a_gpu_with_no_memory_at_all_is_corrupt_never_idle(open_backend: Opener) -> None:
    # A total of 0 bytes (a buffer the call left zeroed, a struct layout mismatch) came with 0 bytes used: both
    # backends called that GPU clean.
    sc = Scenario.h200(devices=2)
    sc.set_device(1, total_bytes=0, used_bytes=0, reserved_bytes=0)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [d.index for d in snap.devices] == [0]
    (failure,) = snap.failures
    assert failure.index == 1 and isinstance(failure.error, nc.CorruptData) and "total 0" in str(failure.error)
    assert nc.default_predicate().evaluate(snap).satisfied is not True


def test_a_mig_instance_holding_more_than_it_has_is_corrupt_alike(open_backend: Opener) -> None:
    # The stub once clamped a MIG device's used memory to its total (a full instance, clean-looking numbers) where
    # the fake nvidia-smi printed what the processes hold (a corrupt reading): one scenario, two verdicts.
    sc = _mig(loaded=False)
    sc.add_process(0, 4_100_042, used_bytes=20 * GIB, gi=2, ci=0)  # instance gi=2 has 16 GiB
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [d.index for d in snap.devices] == [1]
    (failure,) = snap.failures
    assert failure.index == 0 and isinstance(failure.error, nc.CorruptData)


def test_a_restated_mig_device_is_replaced_alike(open_backend: Opener) -> None:
    # A line naming an existing MIG device replaces it (stubs/README.md): the stub did, the fake nvidia-smi merged
    # it into the old one, keeping the old UUID and memory the new line left out.
    sc = _mig(loaded=False)
    sc.add_mig_device(0, 1, gi=2, ci=0, total_bytes=8 * GIB)  # no uuid: the default, not MIG_UUIDS[1]
    sc.add_mig_device(0, 0, gi=1, ci=0, uuid=MIG_UUIDS[0])  # no total: 0
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    migs = snap.devices[0].mig_devices
    assert migs is not None
    assert [(m.index, m.uuid) for m in migs] == [(0, MIG_UUIDS[0]), (1, "MIG-00000000-0000-0000-0000-000000000001")]
    assert [m.memory.total_bytes if m.memory else None for m in migs] == [0, 8 * GIB]


def test_a_restated_process_changes_only_what_its_line_names_alike(open_backend: Opener) -> None:
    # A process line naming an existing entry changes only the keys it names (stubs/README.md): the stub did, the
    # fake nvidia-smi replaced the entry, dropping its instance ids and its holds.
    sc = _mig(loaded=False)
    sc.add_process(0, 4_100_042, used_bytes=GIB, holds_bytes=3 * GIB, gi=2, ci=0)
    sc.add_process(0, 4_100_042, used_bytes=2 * GIB)  # still in GI 2, still holding 3 GiB
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    d0 = snap.devices[0]
    assert [(p.pid, p.used_bytes, p.gpu_instance_id, p.compute_instance_id) for p in d0.compute_processes or ()] == [
        (4_100_042, 2 * GIB, 2, 0)
    ]
    migs = d0.mig_devices
    assert migs is not None and [[p.pid for p in m.processes or ()] for m in migs] == [[], [4_100_042]]
    assert migs[1].memory is not None and _close(3 * GIB, migs[1].memory.used_bytes, migs[1].memory.granularity_bytes)


@pytest.mark.parametrize("how", ["fault-3", "fault-999", "unsupported"])
def test_a_failing_memory_call_leaves_the_mig_devices_memory_unknown_alike(open_backend: Opener, how: str) -> None:
    # The stub fails the memory call on a MIG handle as on its GPU; the fake nvidia-smi's -q printed the MIG devices'
    # memory anyway, so the smi backend read an instance with 0 used: a failed query that looked idle.
    sc = _mig(loaded=True)
    if how == "unsupported":
        sc.set_device(0, unsupported=("memory",))
    else:
        for fn in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"):
            sc.fault(fn, int(how.removeprefix("fault-")), device=0)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    by_index = {d.index: d for d in snap.devices}
    assert 1 in by_index and by_index[1].memory is not None  # the other GPU still reads
    if 0 in by_index:
        migs = by_index[0].mig_devices
        assert migs is not None and migs and all(m.memory is None for m in migs), migs
        assert any("memory" in key for m in migs for key in m.unknown), [m.unknown for m in migs]


# --- identity: one spelling of the PCI bus id, one answer for a field the GPU does not support -----------------------


@pytest.mark.parametrize(
    ("given", "read"),
    [
        ("0000:0a:00.0", "00000000:0A:00.0"),  # the legacy 4-digit domain, lower case
        ("00000000:0b:1f.7", "00000000:0B:1F.7"),
        ("0001:c1:00.0", "00000001:C1:00.0"),
    ],
)
def test_pci_bus_id_is_spelled_alike(open_backend: Opener, given: str, read: str) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, pci_bus_id=given)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [d.pci_bus_id for d in snap.devices] == ["00000000:01:00.0", read]


@pytest.mark.parametrize("field", ["name", "serial", "pci_bus_id"])
def test_an_unsupported_identity_field_is_none_with_a_reason(open_backend: Opener, field: str) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, unsupported=({"pci_bus_id": "pci"}.get(field, field),))
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.MEMORY)
    d0, d1 = snap.devices
    assert getattr(d1, field) is None and d1.why_unknown(field)
    assert getattr(d0, field) is not None and d0.why_unknown(field) is None


def test_an_unsupported_uuid_fails_the_gpu_as_not_supported(open_backend: Opener) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, unsupported=("uuid",))
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [d.index for d in snap.devices] == [0]
    (failure,) = snap.failures
    assert failure.index == 1 and failure.uuid is None
    assert type(failure.error) is nc.NotSupported  # the same class from NVML's code and nvidia-smi's [N/A]


# --- an NVML error behind one value: what NVML answers, nvidia-smi prints as a placeholder; both read it alike -------

# NVML return code -> (the failure's class, or None where the value is unknown with a reason and the GPU reports).
FAULTS: dict[int, type[nc.NvmlCheckError] | None] = {
    3: None,  # NOT_SUPPORTED ([N/A]): unknown, never 0
    4: nc.NoPermission,  # [Insufficient Permissions]
    15: nc.GpuLost,  # [GPU is lost]
    16: nc.GpuRequiresReset,  # [GPU requires reset]
    999: nc.Unknown,  # [Unknown Error]
}


@pytest.mark.parametrize("code", sorted(FAULTS))
def test_memory_call_failing_reads_alike(open_backend: Opener, code: int) -> None:
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", code, device=1)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    failure_class = FAULTS[code]
    assert snap.devices[0].index == 0 and snap.devices[0].memory is not None  # the other GPU reports
    if failure_class is None:
        (_, d1) = snap.devices
        assert d1.memory is None and d1.why_unknown("memory") and snap.failures == ()
        assert nc.default_predicate().evaluate(snap).satisfied is not True
    else:
        (failure,) = snap.failures
        assert failure.index == 1 and type(failure.error) is failure_class
        assert [d.index for d in snap.devices] == [0]
    if failure_class is not None and not failure_class.TRANSIENT:
        # A wait on it ends at its first poll with that error, as NVML's does: it never polls to its deadline.
        slept: list[float] = []
        with open_backend(sc) as gpus, pytest.raises(failure_class):
            gpus.wait_until_clean(timeout=600, devices=[1], sleep=slept.append)
        assert slept == []


IDENTITY_CALLS = {"name": "nvmlDeviceGetName", "serial": "nvmlDeviceGetSerial", "pci_bus_id": "nvmlDeviceGetPciInfo_v3"}


@pytest.mark.parametrize("field", sorted(IDENTITY_CALLS))
@pytest.mark.parametrize("code", [3, 4])
def test_identity_call_failing_reads_alike(open_backend: Opener, field: str, code: int) -> None:
    sc = Scenario.h200(devices=2)
    sc.fault(IDENTITY_CALLS[field], code, device=1)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    if field != "serial" and code == 4 and snap.backend == "nvml":
        # NVML reads the identity until it can and fails a GPU whose name or bus id it may not read (the serial is
        # optional); nvidia-smi's are read once, when the backend opens, and are then unknown with the reason.
        assert [d.index for d in snap.devices] == [0]
        assert [type(f.error) for f in snap.failures] == [nc.NoPermission]
        return
    d1 = snap.device(1)
    assert getattr(d1, field) is None and d1.why_unknown(field)


@pytest.mark.parametrize("code", sorted(FAULTS))
def test_process_list_call_failing_reads_alike(open_backend: Opener, code: int) -> None:
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_100_001, used_bytes=GIB)
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", code, device=1)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert [p.pid for p in snap.device(0).processes or ()] == [4_100_001]  # the other GPU reports
    failure_class = FAULTS[code]
    if failure_class is None:  # not supported: unknown with the reason (nvidia-smi prints one N/A for all three)
        d1 = snap.device(1)
        assert d1.compute_processes is None and d1.processes is None and d1.why_unknown("processes.compute")
        assert nc.default_predicate().evaluate(snap).satisfied is not True
    else:
        (failure,) = snap.failures
        assert failure.index == 1 and type(failure.error) is failure_class


# --- every fault option of the scenario format, alike on both backends (stubs/README.md, "fault" and "at") ----------
# fn and code: above. device= absent: every GPU. after=/count=: counted calls (one per GPU and reading on both: the
# stub counts NVML's calls, the fake nvidia-smi its runs that print the answer). delay_ms=: the reading answers that
# much later. In the timeline (at call=N, at ms=T): in force from then on. The fake nvidia-smi ignored at call=N
# lines (the stub played them) and a fault on nvmlDeviceGetMigDeviceHandleByIndex (the stub failed the MIG listing).


def _failed(snap: nc.Snapshot) -> list[int]:
    return [f.index for f in snap.failures]


def test_a_fault_without_a_device_fails_every_gpu(open_backend: Opener) -> None:
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", 4)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert snap.devices == () and _failed(snap) == [0, 1]
    assert all(type(f.error) is nc.NoPermission for f in snap.failures)


def test_a_counted_fault_fails_the_readings_it_counts(open_backend: Opener) -> None:
    # after=1 count=2: GPU 1's first call passes, the next two fail, then it answers again; GPU 0 never. Which reading
    # makes which call is the backend's (opening a session may read memory too): at most two readings fail, one
    # after the other, and the GPU answers after them. (Not 999: after an Unknown Error the NVML backend initialises
    # again, and the stub's counts restart.)
    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", 4, device=1, after=1, count=2)
    with open_backend(sc) as gpus:
        readings = [_failed(gpus.snapshot(fields=nc.Fields.MEMORY)) for _ in range(5)]
    failing = [i for i, r in enumerate(readings) if r]
    assert all(r in ([], [1]) for r in readings), readings
    assert 1 <= len(failing) <= 2 and failing == list(range(failing[0], failing[0] + len(failing))), readings
    assert readings[-2:] == [[], []], readings


@pytest.mark.parametrize("code", [None, 4])
def test_a_delayed_fault_answers_that_much_later(open_backend: Opener, code: int | None) -> None:
    import time

    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", code, device=1, delay_ms=300)
    with open_backend(sc) as gpus:
        for _ in range(2):
            started = time.monotonic()
            snap = gpus.snapshot(fields=nc.Fields.MEMORY)
            assert time.monotonic() - started >= 0.3  # a lower bound only: load makes it longer, never shorter
            assert _failed(snap) == ([] if code is None else [1])
    if code is None:  # only late: the values are the GPU's
        assert [d.memory is not None for d in snap.devices] == [True, True]


@pytest.mark.parametrize("what", ["fault", "process"])
def test_an_at_call_line_applies_from_its_call_on(open_backend: Opener, what: str) -> None:
    # At call 40: after the first reading on both backends (NVML makes ~30 calls to open and read two GPUs, the fake
    # nvidia-smi counts one per run and one per GPU it reports), and a few readings later; then for good.
    sc = Scenario.h200(devices=2)
    sc.add_process(1, 4_100_001, used_bytes=GIB)
    step = sc.at_call(40)
    if what == "fault":
        step.fault("nvmlDeviceGetMemoryInfo_v2", 4, device=1)
    else:
        step.remove_process(1, 4_100_001)

    def applied(snap: nc.Snapshot) -> bool:
        if what == "fault":
            return _failed(snap) == [1]
        assert snap.failures == ()
        return snap.device(1).processes == ()

    with open_backend(sc) as gpus:
        seen = [applied(gpus.snapshot(fields=nc.Fields.WAIT))]
        while not seen[-1] and len(seen) < 40:
            seen.append(applied(gpus.snapshot(fields=nc.Fields.WAIT)))
        seen += [applied(gpus.snapshot(fields=nc.Fields.WAIT)) for _ in range(2)]
    assert seen[0] is False, "applied before its call"
    assert seen[-3:] == [True, True, True], seen  # applied, and it stays


@pytest.mark.parametrize(("at", "applies"), [("call=1", True), ("ms=0", True), ("call=1000000000", False),
                                             ("ms=100000000", False)])
def test_a_timeline_fault_applies_when_it_is_due(open_backend: Opener, at: str, applies: bool) -> None:
    sc = Scenario.h200(devices=2)
    key, _, value = at.partition("=")
    step = sc.at_call(int(value)) if key == "call" else sc.at_ms(int(value))
    step.fault("nvmlDeviceGetMemoryInfo_v2", 4, device=1)
    with open_backend(sc) as gpus:
        readings = [_failed(gpus.snapshot(fields=nc.Fields.MEMORY)) for _ in range(2)]
    assert readings == ([[1], [1]] if applies else [[], []])


@pytest.mark.parametrize("code", [3, 4, 15, 999])
def test_a_failing_mig_listing_reads_alike(open_backend: Opener, code: int) -> None:
    # nvmlDeviceGetMigDeviceHandleByIndex failing: NVML fails the GPU on an error of the GPU (lost) and leaves its MIG
    # devices unknown on any other; the fake nvidia-smi printed the MIG devices as if the call had answered.
    sc = _mig(loaded=True)
    sc.fault("nvmlDeviceGetMigDeviceHandleByIndex", code, device=0)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert snap.device(1).mig_devices == ()  # the other GPU reads
    if code == 15:
        assert _failed(snap) == [0] and type(snap.failures[0].error) is nc.GpuLost
        return
    d0 = snap.device(0)
    assert d0.mig_mode is True and d0.mig_devices is None and d0.why_unknown("mig_devices")
    assert [p.pid for p in d0.processes or ()] == [4_100_042]  # the GPU itself still reports
    assert nc.default_predicate().evaluate(snap).satisfied is not True


# The call behind each value the fake nvidia-smi renders a fault on (it printed the value as if the call had answered),
# and the value's key in DeviceState ("why_unknown").
VALUE_CALLS = {
    "nvmlDeviceGetClockInfo": "clocks.current.sm_mhz",
    "nvmlDeviceGetMaxClockInfo": "clocks.max.sm_mhz",
    "nvmlDeviceGetApplicationsClock": "clocks.applications.graphics_mhz",
    "nvmlDeviceGetCurrentClocksEventReasons": "clocks.event_reasons",
    "nvmlDeviceGetTotalEccErrors": "health.ecc_uncorrected_volatile",
    "nvmlDeviceGetFieldValues": "health.recovery_action",
    "nvmlDeviceGetRetiredPages_v2": "health.retired_pages",
    "nvmlDeviceGetRetiredPagesPendingStatus": "health.retired_pages_pending",
    "nvmlDeviceGetMigMode": "mig_mode",
}


@pytest.mark.parametrize("code", [3, 4, 15, 999])
@pytest.mark.parametrize("fn", sorted(VALUE_CALLS))
def test_a_value_call_failing_reads_alike(open_backend: Opener, fn: str, code: int) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, unsupported=())  # retired pages readable, so only the fault makes them unknown
    sc.fault(fn, code, device=1)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.CLOCKS | nc.Fields.HEALTH | nc.Fields.WAIT)
    assert 0 in [d.index for d in snap.devices]  # the other GPU reads
    if code == 15:  # the GPU is lost: it fails, whichever call said so
        assert _failed(snap) == [1] and type(snap.failures[0].error) is nc.GpuLost
        return
    d1 = snap.device(1)
    value: object = d1
    for part in VALUE_CALLS[fn].split("."):
        value = getattr(value, part)
    if fn == "nvmlDeviceGetMigMode":  # not supported: a GPU without MIG; any other error: unknown, with the reason
        assert value is (False if code == 3 else None) and (code == 3 or d1.why_unknown("mig"))
    else:
        assert value is None and d1.why_unknown(VALUE_CALLS[fn]), (value, d1.unknown)


@pytest.mark.parametrize("fn", ["nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo_v2"])
def test_a_fault_on_a_call_the_backends_do_not_make_changes_nothing(open_backend: Opener, fn: str) -> None:
    # The NVML backend reads memory with _v2 and the bus id with _v3 where the driver has them (as nvidia-smi 580
    # does): the fake nvidia-smi failed the memory (and the bus id) on a fault of the older call.
    sc = Scenario.h200(devices=2)
    sc.fault(fn, 4, device=1)
    with open_backend(sc) as gpus:
        snap = gpus.snapshot(fields=nc.Fields.WAIT)
    assert snap.failures == () and [d.memory is not None and d.pci_bus_id is not None for d in snap.devices] == [
        True, True]
