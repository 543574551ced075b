"""The Scenario builder of nvmlcheck.testing: exact rendering and argument validation (no C involved)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.testing import DEVICE_FIELDS, UNSUPPORTED_FIELDS, Scenario

HEADER = "nvmlcheck-stub-scenario 1\nsystem driver=580.159.04 nvml=13.580.159.04 cuda=13000\n"


def body(scenario: Scenario) -> list[str]:
    text = scenario.render()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert lines[0] == "nvmlcheck-stub-scenario 1"
    return lines[2:]


def test_empty_scenario() -> None:
    assert Scenario().render() == HEADER


def test_system_line() -> None:
    text = Scenario(driver="535.43.02", nvml="12.535.43.02", cuda=12020).render()
    assert text.splitlines()[1] == "system driver=535.43.02 nvml=12.535.43.02 cuda=12020"


def test_h200_preset() -> None:
    scenario = Scenario.h200(devices=2)
    assert scenario.device_count == 2
    assert body(scenario) == [
        f'device index={i} name="NVIDIA H200" total=150754820096 reserved=644939776 used=0 clock.graphics=345 '
        "clock.sm=345 clock.mem=3201 clock.video=765 max.graphics=1980 max.sm=1980 max.mem=3201 max.video=1545"
        for i in range(2)
    ]


def test_every_device_field_renders() -> None:
    scenario = Scenario()
    index = scenario.add_device(
        name="NVIDIA H200",
        uuid="GPU-acdc9db5-97f7-57e3-53d2-3061aececeec",
        serial="1650924060042",
        pci_bus_id="00000000:00:06.0",
        pci_device_id=0x233510DE,
        pci_subsystem_id=0,
        minor=0,
        total_bytes=150754820096,
        reserved_bytes=644939776,
        used_bytes=0,
        clocks_mhz={"graphics": 345, "sm": 345},
        max_clocks_mhz={"mem": 3201},
        app_clocks_mhz={"video": 1545},
        clock_event_reasons=1,
        retired_pages=[("sbe", 0x1000, 1700000000), ("dbe", 0x2000, 1700000100)],
        retired_pending=False,
        remapped_rows=(0, 1, False, True),
        ecc_uncorrected_volatile=2,
        ecc_uncorrected_aggregate=5,
        recovery_action=4,
        unsupported=("retired_pages", "retired_pending"),
        lost=False,
        mig=True,
        event_types=0x11F,
    )
    assert index == 0
    assert body(scenario) == [
        'device index=0 name="NVIDIA H200" uuid=GPU-acdc9db5-97f7-57e3-53d2-3061aececeec serial=1650924060042 '
        "pci=00000000:00:06.0 pci.device_id=0x233510de pci.subsystem_id=0x0 minor=0 total=150754820096 "
        "reserved=644939776 used=0 clock.graphics=345 clock.sm=345 max.mem=3201 app.video=1545 reasons=0x1 "
        "retired=sbe:0x1000@1700000000,dbe:0x2000@1700000100 retired_pending=0 remapped=0,1,0,1 "
        "ecc_volatile=2 ecc_aggregate=5 recovery=4 unsupported=retired_pages,retired_pending lost=0 mig=1 "
        "event_types=0x11f"
    ]
    assert set(DEVICE_FIELDS) == {
        "name", "uuid", "serial", "pci_bus_id", "pci_device_id", "pci_subsystem_id", "minor", "total_bytes",
        "reserved_bytes", "used_bytes", "clocks_mhz", "max_clocks_mhz", "app_clocks_mhz", "clock_event_reasons",
        "retired_pages", "retired_pending", "remapped_rows", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate",
        "recovery_action", "unsupported", "lost", "mig", "event_types",
    }  # fmt: skip


def test_empty_lists_render_as_empty_quoted_values() -> None:
    scenario = Scenario()
    scenario.add_device(unsupported=(), retired_pages=[])
    assert body(scenario) == ['device index=0 unsupported="" retired=""']


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("hash#tag", '"hash#tag"'),
        ("tab\there", '"tab\there"'),
        ("", '""'),
        ("ünïcödé", "ünïcödé"),
    ],
)
def test_quoting(value: str, rendered: str) -> None:
    scenario = Scenario()
    scenario.add_device(name=value)
    assert body(scenario) == [f"device index=0 name={rendered}"]


def test_processes() -> None:
    scenario = Scenario.h200()
    scenario.add_process(0, 4123456, used_bytes=1073741824)
    scenario.add_process(0, 12345, used_bytes=17179869184, bound=True, release_ms=120)
    scenario.add_process(0, 4123457, "graphics", used_bytes=None, holds_bytes=2097152)
    scenario.add_process(0, 4123458, "mps", 5, gi=1, ci=2)
    scenario.add_process(0, 4123459, bound=True, list_ms=5, zombie_holds=True)
    scenario.remove_process(0, 4123456)
    assert body(scenario)[1:] == [
        "process device=0 kind=compute pid=4123456 used=1073741824",
        "process device=0 kind=compute pid=12345 used=17179869184 bound=1 release_ms=120 list_ms=0",
        "process device=0 kind=graphics pid=4123457 used=na holds=2097152",
        "process device=0 kind=mps pid=4123458 used=5 gi=1 ci=2",
        "process device=0 kind=compute pid=4123459 used=0 bound=1 release_ms=0 list_ms=5 zombie_holds=1",
        "process device=0 kind=compute pid=4123456 remove=1",
    ]


def test_faults_races_quirks() -> None:
    scenario = Scenario.h200()
    scenario.fault("nvmlDeviceGetMemoryInfo_v2", 999, device=0, after=3, count=2)
    scenario.fault("nvmlInit_v2", delay_ms=5000)
    scenario.fault("nvmlDeviceGetHandleByIndex_v2", 15, device=0)
    scenario.race(0, "compute", grow=100)
    scenario.race(0, "mps", grow=-2, count=0)
    scenario.quirk()
    scenario.quirk("none")
    assert body(scenario)[1:] == [
        "fault fn=nvmlDeviceGetMemoryInfo_v2 code=999 device=0 after=3 count=2",
        "fault fn=nvmlInit_v2 delay_ms=5000",
        "fault fn=nvmlDeviceGetHandleByIndex_v2 code=15 device=0",
        "race device=0 kind=compute grow=100 count=1",
        "race device=0 kind=mps grow=-2 count=0",
        "quirk proc_struct=535.43",
        "quirk proc_struct=none",
    ]


def test_timeline() -> None:
    scenario = Scenario.h200(devices=2)
    scenario.at_call(120).set_device(0, used_bytes=4096)
    at = scenario.at_ms(250)
    at.remove_process(1, 4123456)
    at.add_process(1, 4123457, used_bytes=1)
    at.fault("nvmlShutdown", 3, count=1)
    at.race(0, "graphics", 2)
    at.quirk()
    assert body(scenario)[2:] == [
        "at call=120 device index=0 used=4096",
        "at ms=250 process device=1 kind=compute pid=4123456 remove=1",
        "at ms=250 process device=1 kind=compute pid=4123457 used=1",
        "at ms=250 fault fn=nvmlShutdown code=3 count=1",
        "at ms=250 race device=0 kind=graphics grow=2 count=1",
        "at ms=250 quirk proc_struct=535.43",
    ]


def test_write(tmp_path: Path) -> None:
    scenario = Scenario.h200()
    path = scenario.write(tmp_path / "s.txt")
    assert path == tmp_path / "s.txt"
    assert path.read_text(encoding="utf-8") == scenario.render()
    assert Scenario.h200() == scenario  # plain data: equal when built the same way


# --- validation -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"total_bytes": -1}, ValueError, "total_bytes must be >= 0"),
        ({"used_bytes": 2**64}, ValueError, "used_bytes must be <="),
        ({"reserved_bytes": 1.5}, TypeError, "reserved_bytes must be an int"),
        ({"total_bytes": True}, TypeError, "total_bytes must be an int"),
        ({"minor": 2**32}, ValueError, "minor must be <="),
        ({"name": "x" * 64}, ValueError, "longer than 63 bytes"),
        ({"name": "a\nb"}, ValueError, "newlines"),
        ({"name": 5}, TypeError, "name must be a str"),
        ({"serial": "1" * 30}, ValueError, "serial is longer"),
        ({"pci_bus_id": "0:0:6"}, ValueError, "pci_bus_id must look like"),
        ({"pci_bus_id": "0x0:00:06.0"}, ValueError, "pci_bus_id must look like"),
        ({"pci_bus_id": "0:100:06.0"}, ValueError, "out of range"),
        ({"clocks_mhz": {"shader": 1}}, ValueError, "unknown clock domain 'shader'"),
        ({"clocks_mhz": {"sm": -5}}, ValueError, "clocks_mhz['sm'] must be >= 0"),
        ({"clocks_mhz": [("sm", 1)]}, TypeError, "mapping"),
        ({"retired_pages": [("tbe", 1, 2)]}, ValueError, "'sbe' or 'dbe'"),
        ({"retired_pages": [("sbe", 1)]}, TypeError, "(cause, address, timestamp)"),
        ({"retired_pages": [("sbe", -1, 2)]}, ValueError, "retired page address must be >= 0"),
        ({"remapped_rows": (1, 2, 3)}, TypeError, "remapped_rows"),
        ({"remapped_rows": (1, 2, -3, 0)}, ValueError, "remapped_rows pending"),
        ({"unsupported": ("memory", "colour")}, ValueError, "unknown unsupported field(s) ['colour']"),
        ({"unsupported": "memory"}, TypeError, "iterable of field names"),
        ({"lost": 1}, TypeError, "lost must be a bool"),
        ({"colour": "red"}, TypeError, "unknown device field 'colour'"),
    ],
)
def test_device_validation(fields: dict[str, Any], error: type[Exception], message: str) -> None:
    scenario = Scenario()
    with pytest.raises(error, match=re.escape(message)):
        scenario.add_device(**fields)
    assert scenario.device_count == 0
    assert scenario.render() == HEADER  # nothing half-written


def test_unsupported_field_names_are_the_readme_list() -> None:
    assert {"memory", "processes.mps", "app.video", "clock.sm", "max.graphics"} <= UNSUPPORTED_FIELDS
    # "mig" since issue 11, "events" since issue 15, "ecc" and "recovery" since issue 22
    assert {"ecc", "recovery"} <= UNSUPPORTED_FIELDS
    assert len(UNSUPPORTED_FIELDS) == 14 + 3 + 12


def test_device_index_checks() -> None:
    scenario = Scenario.h200()
    with pytest.raises(ValueError, match="device index 1 does not exist"):
        scenario.set_device(1, used_bytes=1)
    with pytest.raises(ValueError, match="device 3 does not exist"):
        scenario.add_process(3, 4_000_000)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        scenario.at_call(5).remove_process(1, 4_000_000)
    with pytest.raises(ValueError, match="device 2 does not exist"):
        scenario.race(2, "compute", 1)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        scenario.fault("nvmlDeviceGetName", 3, device=1)
    with pytest.raises(ValueError, match="device must be >= 0"):
        scenario.add_process(-1, 4_000_000)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kind": "cuda"}, ValueError, "unknown process kind 'cuda'"),
        ({"pid": -1}, ValueError, "pid must be >= 0"),
        ({"pid": 2**32}, ValueError, "pid must be <="),
        ({"used_bytes": -1}, ValueError, "used_bytes must be >= 0"),
        ({"used_bytes": 2**64 - 1}, ValueError, "used_bytes must be <="),  # that is the `na` sentinel: use None
        ({"holds_bytes": -2}, ValueError, "holds_bytes must be >= 0"),
        ({"release_ms": 5}, ValueError, "need bound=True"),
        ({"zombie_holds": True}, ValueError, "need bound=True"),
        ({"bound": True, "list_ms": -1}, ValueError, "list_ms must be >= 0"),
        ({"bound": 1}, TypeError, "bound must be a bool"),
        ({"gi": -1}, ValueError, "gi must be >= 0"),
    ],
)
def test_process_validation(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    scenario = Scenario.h200()
    args: dict[str, Any] = {"device": 0, "pid": 4_000_000, **kwargs}
    with pytest.raises(error, match=re.escape(message)):
        scenario.add_process(**args)
    assert len(body(scenario)) == 1


def test_fault_race_quirk_timeline_validation() -> None:
    scenario = Scenario.h200()
    with pytest.raises(ValueError, match="nvmlGetEverything"):
        scenario.fault("nvmlGetEverything", 1)
    with pytest.raises(ValueError, match="cannot fail"):
        scenario.fault("nvmlErrorString", 1)
    with pytest.raises(ValueError, match="takes no GPU's handle or index"):
        scenario.fault("nvmlInit_v2", 1, device=0)
    with pytest.raises(ValueError, match="takes no GPU's handle or index"):
        scenario.fault("nvmlDeviceGetCount_v2", 1, device=0)
    with pytest.raises(ValueError, match=r"code= .* delay_ms="):
        scenario.fault("nvmlShutdown")
    with pytest.raises(ValueError, match="code must be >= 1"):
        scenario.fault("nvmlShutdown", -1)
    with pytest.raises(ValueError, match="code must be >= 1"):
        scenario.fault("nvmlShutdown", 0)
    with pytest.raises(ValueError, match="after must be >= 0"):
        scenario.fault("nvmlShutdown", 1, after=-1)
    with pytest.raises(ValueError, match="unknown process kind"):
        scenario.race(0, "opengl", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="count must be >= 0"):
        scenario.race(0, "compute", 1, count=-1)
    with pytest.raises(ValueError, match=r"535\.43"):
        scenario.quirk("550.54")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="call must be >= 1"):
        scenario.at_call(0)
    with pytest.raises(ValueError, match="ms must be >= 0"):
        scenario.at_ms(-1)
    with pytest.raises(ValueError, match="cuda must be <="):
        Scenario(cuda=2**31)
    with pytest.raises(ValueError, match="newlines"):
        Scenario(driver="5\n")
    with pytest.raises(ValueError, match="devices must be >= 0"):
        Scenario.h200(devices=-1)
    assert len(body(scenario)) == 1


def test_mig_device_lines() -> None:
    scenario = Scenario.h200()
    scenario.set_device(0, mig=True)
    scenario.add_mig_device(0, 2, gi=5, uuid="MIG-abc", total_bytes=10, used_bytes=3)
    scenario.at_call(9).remove_mig_device(0, 2)
    assert body(scenario)[-2:] == [
        "mig device=0 index=2 ci=0 gi=5 uuid=MIG-abc total=10 used=3",
        "at call=9 mig device=0 index=2 remove=1",
    ]
    with pytest.raises(ValueError, match="exceeds"):
        scenario.add_mig_device(0, 0, total_bytes=1, used_bytes=2)
    with pytest.raises(ValueError):
        scenario.add_mig_device(0, 7)
    with pytest.raises(ValueError, match="device 1 does not exist"):
        scenario.add_mig_device(1, 0)


# --- what is rendered is what was checked ---------------------------------------------------------------------------


class _Sneaky(int):
    """An int subclass that formats itself as more keys: a scenario must render the checked number, not this."""

    def __str__(self) -> str:
        return "1 lost=1"

    def __format__(self, spec: str) -> str:
        return "1 lost=1"

    def __int__(self) -> int:
        return 7


class _SneakyStr(str):
    def __str__(self) -> str:
        return "x lost=1"

    def __format__(self, spec: str) -> str:
        return "x lost=1"


def test_int_and_str_subclasses_render_as_the_value_checked() -> None:
    sc = Scenario(cuda=_Sneaky(12020), driver=_SneakyStr("535.43.02"))
    sc.add_device(total_bytes=_Sneaky(1000), minor=_Sneaky(2), name=_SneakyStr("GPU one"))
    sc.add_process(_Sneaky(0), _Sneaky(4_100_001), _SneakyStr("compute"), _Sneaky(5), bound=True,  # type: ignore[arg-type]
                   release_ms=_Sneaky(3), list_ms=_Sneaky(4))
    sc.fault("nvmlDeviceGetMemoryInfo_v2", code=_Sneaky(3), after=_Sneaky(2), count=_Sneaky(1))
    sc.race(0, "compute", grow=_Sneaky(2))
    sc.at_call(_Sneaky(9)).set_device(0, used_bytes=_Sneaky(6))
    text = sc.render()
    assert "lost" not in text and " 7" not in text
    assert text.splitlines()[1] == "system driver=535.43.02 nvml=13.580.159.04 cuda=12020"
    assert body(sc) == [
        'device index=0 total=1000 minor=2 name="GPU one"',
        "process device=0 kind=compute pid=4100001 used=5 bound=1 release_ms=3 list_ms=4",
        "fault fn=nvmlDeviceGetMemoryInfo_v2 code=3 after=2 count=1",
        "race device=0 kind=compute grow=2 count=1",
        "at call=9 device index=0 used=6",
    ]


def test_unsupported_names_of_the_wrong_type_are_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"unsupported field names must be str, got \['mig'\]"):
        Scenario.h200().set_device(0, unsupported=[["mig"]])


# --- UUIDs: each device its own, in the shape NVML writes ------------------------------------------------------------


def test_a_uuid_another_device_has_is_refused() -> None:
    sc = Scenario.h200(devices=2)
    with pytest.raises(ValueError, match="UUID GPU-00000000-0000-0000-0000-000000000000 is already GPU 0's"):
        sc.set_device(1, uuid="GPU-00000000-0000-0000-0000-000000000000")  # GPU 0's default
    with pytest.raises(ValueError, match="already GPU 1's"):
        sc.add_device(uuid="GPU-00000000-0000-0000-0000-000000000001")
    assert sc.device_count == 2  # the refused device was not declared
    sc.set_device(0, uuid="GPU-aaaa")
    with pytest.raises(ValueError, match="already GPU 0's"):
        sc.at_ms(10).set_device(1, uuid="GPU-aaaa")
    sc.set_device(1, uuid="GPU-00000000-0000-0000-0000-000000000000")  # free again once GPU 0 changed its own
    sc.set_device(0, uuid="GPU-aaaa")  # a device may restate its own
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, uuid="MIG-1")
    with pytest.raises(ValueError, match="already MIG device 0 of GPU 0's"):
        sc.add_mig_device(0, 1, uuid="MIG-1")
    sc.add_mig_device(0, 2)
    with pytest.raises(ValueError, match="already MIG device 2 of GPU 0's"):
        sc.add_mig_device(0, 3, uuid="MIG-00000000-0000-0000-0000-000000000002")  # MIG 2's default...
    sc.add_mig_device(0, 2, uuid="MIG-2")  # ... until it is replaced
    sc.add_mig_device(0, 3, uuid="MIG-00000000-0000-0000-0000-000000000002")
    sc.remove_mig_device(0, 2)
    sc.set_device(1, mig=True)
    sc.add_mig_device(1, 0, uuid="MIG-2")  # a destroyed MIG device's UUID can be reused


def test_a_gi_ci_pair_another_mig_device_of_the_gpu_has_is_refused() -> None:
    # Two MIG devices of one (GPU instance, compute instance) pair were accepted: both backends then counted the
    # instance's processes in both devices' memory and listed them under both.
    sc = Scenario.h200(devices=2)
    sc.set_device(0, mig=True)
    sc.set_device(1, mig=True)
    sc.add_mig_device(0, 0, gi=1, ci=0)
    with pytest.raises(ValueError, match="MIG device 0 of GPU 0 already has gi=1 ci=0"):
        sc.add_mig_device(0, 1, gi=1, ci=0)
    with pytest.raises(ValueError, match="MIG device 0 of GPU 0 already has gi=1 ci=0"):
        sc.add_mig_device(0, 1, gi=1)  # ci defaults to 0
    with pytest.raises(ValueError, match="MIG device 0 of GPU 0 already has gi=1 ci=0"):
        sc.at_ms(5).add_mig_device(0, 3, gi=1)  # in the timeline too
    sc.add_mig_device(0, 5)  # no gi: index + 1 = 6, free
    sc.add_mig_device(0, 1, gi=1, ci=1)  # another compute instance of the same GPU instance
    sc.add_mig_device(1, 0, gi=1, ci=0)  # another GPU's
    sc.add_mig_device(0, 0, gi=1, ci=0)  # a device may restate its own
    sc.add_mig_device(0, 2)  # default gi=3
    with pytest.raises(ValueError, match="MIG device 2 of GPU 0 already has gi=3 ci=0"):
        sc.add_mig_device(0, 4, gi=3)
    with pytest.raises(ValueError, match="already MIG device 0 of GPU 0's"):
        sc.add_mig_device(0, 2, gi=9, uuid="MIG-00000000-0000-0000-0000-000000000000")  # refused for its UUID...
    with pytest.raises(ValueError, match="MIG device 2 of GPU 0 already has gi=3 ci=0"):
        sc.add_mig_device(0, 4, gi=3)  # ... so MIG device 2 still has gi=3
    sc.remove_mig_device(0, 2)
    sc.add_mig_device(0, 4, gi=3)  # a destroyed MIG device's pair can be reused
    assert sc.render().count("mig device=") == 8  # the refused calls wrote nothing


@pytest.mark.parametrize("uuid", ["not a uuid", "GPU 0", "gpu-1234", "MIG-1234", "GPU-", "GPU-12,34"])
def test_a_gpu_uuid_must_have_nvmls_shape(uuid: str) -> None:
    with pytest.raises(ValueError, match="uuid must look like GPU-"):
        Scenario.h200().set_device(0, uuid=uuid)


@pytest.mark.parametrize("uuid", ["GPU-1234", "MIG 1", "MIG-"])
def test_a_mig_uuid_must_have_nvmls_shape(uuid: str) -> None:
    with pytest.raises(ValueError, match="uuid must look like MIG-"):
        sc = Scenario.h200()
        sc.set_device(0, mig=True)
        sc.add_mig_device(0, 0, uuid=uuid)


def test_a_mig_device_on_a_gpu_never_in_mig_mode_is_refused() -> None:
    # It was accepted, and neither backend ever showed it (a MIG device answers only while its GPU has mig=1).
    sc = Scenario.h200(devices=3)
    with pytest.raises(ValueError, match=r"add_mig_device: GPU 0 is not in MIG mode; give it mig=True first"):
        sc.add_mig_device(0, 0, total_bytes=1 << 30)
    with pytest.raises(ValueError, match="GPU 1 is not in MIG mode"):
        sc.at_ms(10).add_mig_device(1, 0)
    assert "mig device=" not in sc.render()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0)
    sc.at_call(5).set_device(1, mig=True)  # MIG turned on in the timeline: its instances may be declared
    sc.at_call(5).add_mig_device(1, 0)
    sc.add_device(mig=True)
    sc.add_mig_device(3, 0)
    with pytest.raises(ValueError, match="GPU 2 is not in MIG mode"):
        sc.set_device(2, mig=False)
        sc.add_mig_device(2, 0)


def test_raise_event_renders_every_kind_and_raw_type_bits() -> None:
    from nvmlcheck.testing import EVENT_KINDS

    sc = Scenario.h200(1)
    step = sc.at_ms(0)
    step.raise_event(0, "mig", gi=1, ci=0)
    step.raise_event(0, 0x10008, data=48)
    step.raise_event(0, 0)
    step.raise_event(0, "recovery_action", data=2)
    step.raise_event(0, "xid", xid=79)
    assert body(sc)[-5:] == [
        "at ms=0 event device=0 type=mig gi=1 ci=0",
        "at ms=0 event device=0 type=0x10008 data=48",
        "at ms=0 event device=0 type=0x0",
        "at ms=0 event device=0 type=recovery_action data=2",
        "at ms=0 event device=0 type=xid data=79",
    ]
    assert EVENT_KINDS[:6] == ("xid", "sbe", "dbe", "pstate", "clock", "power") and "mig" in EVENT_KINDS


@pytest.mark.parametrize(
    ("kind", "kwargs", "error", "says"),
    [
        ("bogus", {}, ValueError, "event kind must be one of"),
        (True, {}, TypeError, "must be an int"),
        (-1, {}, ValueError, ">= 0"),
        (1 << 64, {}, ValueError, "<="),
        ("clock", {"xid": 79}, ValueError, "xid= is only meaningful"),
        ("xid", {"data": 79}, ValueError, "give xid="),
        ("xid", {"xid": 79, "data": 1}, ValueError, "not both"),
    ],
)
def test_raise_event_refuses_what_the_stub_could_not_deliver(
    kind: Any, kwargs: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=re.escape(says)):
        Scenario.h200(1).at_ms(0).raise_event(0, kind, **kwargs)


def test_event_types_must_name_a_type() -> None:
    with pytest.raises(ValueError, match="at least one event type bit"):
        Scenario().add_device(event_types=0)


# --- strings both backends read alike -------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["name", "serial"])
@pytest.mark.parametrize("value", ["  padded  ", " lead", "trail\t", "x\u00a0"])
def test_a_name_or_serial_with_whitespace_at_an_end_is_refused(field: str, value: str) -> None:
    # Accepted: NVML read "  padded  ", nvidia-smi's reader "padded" (its columns cannot carry the spaces).
    with pytest.raises(ValueError, match=f"{field} cannot begin or end with whitespace"):
        Scenario.h200().set_device(0, **{field: value})
    with pytest.raises(ValueError, match=f"{field} cannot begin or end with whitespace"):
        Scenario().add_device(**{field: value})
    Scenario.h200().set_device(0, **{field: value.strip().replace(" ", "") + " inside ok"})


@pytest.mark.parametrize("field", ["driver", "nvml"])
@pytest.mark.parametrize(("value", "why"), [("", "cannot be empty"), (" 580.1", "cannot begin or end with whitespace")])
def test_a_driver_or_nvml_version_both_backends_cannot_read_alike_is_refused(field: str, value: str, why: str) -> None:
    # driver="" was accepted: NVML read '' (a known, empty version), nvidia-smi nothing (unknown, with a reason).
    with pytest.raises(ValueError, match=f"{field} {why}"):
        Scenario(**{field: value})  # type: ignore[arg-type]
    sc = Scenario.h200()
    setattr(sc, field, value)  # set after construction: refused when rendered
    with pytest.raises(ValueError, match=f"{field} {why}"):
        sc.render()


# --- copies: every way Python copies a Scenario keeps what its methods built, and shares none of it ------------------


def _copies() -> dict[str, Any]:
    import copy
    import dataclasses
    import pickle

    ways: dict[str, Any] = {
        "dataclasses.replace": dataclasses.replace,
        "copy.copy": copy.copy,
        "copy.deepcopy": copy.deepcopy,
        "pickle": lambda sc: pickle.loads(pickle.dumps(sc)),
    }
    if hasattr(copy, "replace"):  # Python 3.13
        ways["copy.replace"] = copy.replace
    return ways


def _built() -> Scenario:
    sc = Scenario.h200(devices=2)
    sc.set_device(0, uuid="GPU-aa", mig=True)
    sc.add_mig_device(0, 0, uuid="MIG-aa")
    sc.add_process(1, 4_123_456, used_bytes=1 << 30)
    sc.at_call(5).remove_process(1, 4_123_456)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", 999, device=1, count=1)
    return sc


@pytest.mark.parametrize("how", sorted(_copies()))
def test_a_copy_keeps_what_the_methods_built(how: str) -> None:
    # dataclasses.replace() made the copy through __init__ with the init fields alone: the devices, processes,
    # timeline and faults (and the UUID/MIG bookkeeping) were lost, and the copy rendered an empty scenario.
    original = _built()
    text = original.render()
    other = _copies()[how](original)
    assert other == original and other.render() == text and other.device_count == 2
    with pytest.raises(ValueError, match="already GPU 0's"):
        other.add_device(uuid="GPU-aa")  # the bookkeeping came along
    with pytest.raises(ValueError, match="already has gi=1 ci=0"):
        other.add_mig_device(0, 1, gi=1)
    other.add_mig_device(0, 1)  # GPU 0 is in MIG mode in the copy too
    other.add_process(0, 4_000_001)
    assert original.render() == text and original.device_count == 2  # nothing the copy did reached the original
    original.add_device(uuid="GPU-bb")
    assert "GPU-bb" not in other.render() and other.device_count == 2  # nor the other way


def test_replace_changes_the_system_line_and_keeps_the_rest() -> None:
    import dataclasses

    original = _built()
    other = dataclasses.replace(original, driver="535.43.02", cuda=12020)
    assert other.render().splitlines()[1] == "system driver=535.43.02 nvml=13.580.159.04 cuda=12020"
    assert other.render().splitlines()[2:] == original.render().splitlines()[2:]
    with pytest.raises(ValueError, match="driver cannot be empty"):
        dataclasses.replace(original, driver="")  # still checked


def test_a_scenario_pickled_by_the_previous_release_loads() -> None:
    # Before, the bookkeeping was five fields of the instance; such a pickle's state loads into the new form.
    sc = Scenario.__new__(Scenario)
    sc.__setstate__({"driver": "580.159.04", "nvml": "13.580.159.04", "cuda": 13000,
                     "_lines": ["device index=0 uuid=GPU-aa"], "_devices": 1, "_uuid_of": {(0,): "GPU-aa"},
                     "_mig_ids_of": {}, "_mig_gpus": set(), "_kept_in": None})
    assert sc.render() == HEADER + "device index=0 uuid=GPU-aa\n" and sc.device_count == 1
    with pytest.raises(ValueError, match="already GPU 0's"):
        sc.add_device(uuid="GPU-aa")


def test_device_restricts_a_fault_exactly_where_the_stub_takes_it() -> None:
    # The builder took device= on every nvmlDevice* call, the MIG handle's too (nvmlDeviceGetGpuInstanceId, ...),
    # which the stub refuses at nvmlInit ("device= given but the function takes no device"): a scenario the builder
    # wrote did not load. The stub's table (F_DEVICE / F_INDEX) is the source of truth.
    from nvmlcheck._sim.symbols import DEVICE_FUNCTIONS
    from nvmlcheck.testing import NVML_FUNCTIONS, stub_source_dir

    source = (stub_source_dir() / "stub_nvml.c").read_text(encoding="utf-8")
    flags = dict(re.findall(r"^\s*X\((nvml\w+),\s*([^)]*)\)", source, re.M))
    assert set(flags) == set(NVML_FUNCTIONS)
    assert {fn for fn, f in flags.items() if "F_DEVICE" in f or "F_INDEX" in f} == DEVICE_FUNCTIONS
    for fn in sorted(set(NVML_FUNCTIONS) - {"nvmlErrorString"}):
        scenario = Scenario.h200()
        if fn in DEVICE_FUNCTIONS:
            scenario.fault(fn, 3, device=0)
        else:
            with pytest.raises(ValueError, match="takes no GPU's handle or index"):
                scenario.fault(fn, 3, device=0)
