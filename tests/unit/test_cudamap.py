"""The CUDA numbering rules (nvmlcheck.cudamap): pure functions over (environment, GPU identities)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvmlcheck.cudamap import (
    CudaMappingError,
    GpuIdentity,
    cuda_mapping,
    is_cuda_selector,
    parse_cuda_selector,
)

PCI = "PCI_BUS_ID"


def gpus_with_buses(buses: list[int], names: list[str] | None = None) -> list[GpuIdentity]:
    """GPUs whose NVML index order is not their PCI order when ``buses`` is not sorted."""
    names = names or ["NVIDIA H200"] * len(buses)
    return [
        GpuIdentity(i, f"GPU-{i:08x}-1111-2222-3333-{bus:012x}", names[i], f"00000000:{bus:02X}:00.0")
        for i, bus in enumerate(buses)
    ]


buses_st = st.lists(st.integers(1, 0xFF), min_size=1, max_size=8, unique=True)


def pci_order(gpus: list[GpuIdentity]) -> list[int]:
    return [g.index for g in sorted(gpus, key=lambda g: int(g.pci_bus_id.split(":")[1], 16))]  # type: ignore[union-attr]


@given(buses_st)
def test_unset_visible_devices_is_every_gpu_in_pci_order(buses: list[int]) -> None:
    gpus = gpus_with_buses(buses)
    for env in ({"CUDA_DEVICE_ORDER": PCI}, {}, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}):
        m = cuda_mapping(gpus, env)
        assert m.devices is not None
        assert [d.nvml_index for d in m.devices] == pci_order(gpus)
        assert [d.cuda_index for d in m.devices] == list(range(len(gpus)))


@given(buses_st, st.data())
def test_numbers_are_positions_in_pci_order_listed_in_list_order(buses: list[int], data: st.DataObject) -> None:
    gpus = gpus_with_buses(buses)
    picks = data.draw(st.lists(st.integers(0, len(gpus) - 1), unique=True, min_size=1))
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": ",".join(map(str, picks)), "CUDA_DEVICE_ORDER": PCI})
    order = pci_order(gpus)
    assert m.resolve("cuda:all") == tuple(order[p] for p in picks)
    for i, p in enumerate(picks):
        assert m.resolve(f"cuda:{i}") == (order[p],)
        assert m.cuda_index(order[p]) == i
    with pytest.raises(CudaMappingError, match=rf"cuda:{len(picks)}: no such CUDA device"):
        m.resolve(f"cuda:{len(picks)}")


@given(buses_st, st.data())
def test_the_first_entry_naming_no_gpu_ends_the_list(buses: list[int], data: st.DataObject) -> None:
    gpus = gpus_with_buses(buses)
    picks = data.draw(st.lists(st.integers(0, len(gpus) - 1), unique=True))
    # ("GPU-ffffffff" after indices is a mixed list, refused: test_refusals.)
    bad = data.draw(st.sampled_from(["-1", str(len(gpus)), "99", "foo", ""]))
    tail = data.draw(st.lists(st.integers(0, len(gpus) - 1), max_size=3))
    value = ",".join([*map(str, picks), bad, *map(str, tail)])
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": PCI})
    assert m.devices is not None
    order = pci_order(gpus)
    assert [d.nvml_index for d in m.devices] == [order[p] for p in picks]
    if value:
        assert any(f"entry {bad!r}" in n and "CUDA ignores it and what follows" in n for n in m.notes)


@given(buses_st, st.data(), st.sampled_from([None, "FASTEST_FIRST", PCI]))
def test_uuids_work_in_any_order_with_mixed_models(buses: list[int], data: st.DataObject, order: str | None) -> None:
    names = data.draw(st.lists(st.sampled_from(["A100", "H200", "L4"]), min_size=len(buses), max_size=len(buses)))
    gpus = gpus_with_buses(buses, names)
    picks = data.draw(st.permutations([g.index for g in gpus]).map(lambda p: p[: max(1, len(p) // 2)]))
    # A unique prefix is enough: "GPU-" plus the 8 hex digits that differ from GPU to GPU.
    value = ",".join(gpus[p].uuid[: data.draw(st.sampled_from([12, 40]))] for p in picks)
    env = {"CUDA_VISIBLE_DEVICES": value} | ({} if order is None else {"CUDA_DEVICE_ORDER": order})
    m = cuda_mapping(gpus, env)
    assert m.resolve("cuda:all") == tuple(picks)


def test_mixed_models_fastest_first_is_refused_with_the_mapping_in_the_message() -> None:
    gpus = gpus_with_buses([0x10, 0x20], ["NVIDIA A100", "NVIDIA H200"])
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": "1"})
    assert m.devices is None and m.order is None
    assert m.unknown is not None and "is a number" in m.unknown
    assert m.order_unknown is not None and "not all one model" in m.order_unknown
    with pytest.raises(CudaMappingError) as err:
        m.resolve("cuda:0")
    text = str(err.value)
    assert "CUDA_VISIBLE_DEVICES='1'" in text and "FASTEST_FIRST" in text and "PCI_BUS_ID" in text
    assert gpus[0].uuid in text and gpus[1].uuid in text  # the GPUs NVML sees are listed
    assert err.value.mapping is m
    # With PCI_BUS_ID the same environment is fine.
    assert cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": PCI}).resolve("cuda:0") == (1,)
    # The visible_value for select --format cuda needs the order too.
    with pytest.raises(CudaMappingError, match="--format uuid"):
        cuda_mapping(gpus).visible_value([0])


def test_error_message_shows_the_table() -> None:
    gpus = gpus_with_buses([1, 2, 3, 4])
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": "3,1"})
    with pytest.raises(CudaMappingError) as err:
        m.resolve("cuda:2")
    text = str(err.value)
    assert f"cuda:0 -> GPU 3 {gpus[3].uuid}" in text and f"cuda:1 -> GPU 1 {gpus[1].uuid}" in text
    assert "CUDA_VISIBLE_DEVICES='3,1'" in text and "CUDA_DEVICE_ORDER=unset (FASTEST_FIRST)" in text
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == text and again.mapping == m


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0,0", "listed twice"),
        (f"0,{'GPU-00000001'}", "UUID after indices"),
        ("0, 1", "spaces"),
        ("GPU-0000000", "prefix of"),
    ],
)
def test_refusals(value: str, why: str) -> None:
    gpus = gpus_with_buses([1, 2, 3])
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": value})
    assert m.devices is None and m.unknown is not None and why in m.unknown
    with pytest.raises(CudaMappingError, match=why):
        m.resolve("cuda:all")


def test_empty_and_minus_one_hide_every_gpu() -> None:
    gpus = gpus_with_buses([1, 2])
    for value in ("", "-1"):
        m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": value})
        assert m.devices == ()
        with pytest.raises(CudaMappingError, match="CUDA sees no GPU"):
            m.resolve("cuda:all")


def test_unknown_order_value_and_unreadable_gpus_are_refused() -> None:
    gpus = gpus_with_buses([1, 2])
    m = cuda_mapping(gpus, {"CUDA_DEVICE_ORDER": "SLOWEST_FIRST"})
    assert m.devices is None and "SLOWEST_FIRST" in (m.order_unknown or "")
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": gpus[0].uuid}, unreadable=[1])
    assert m.devices is None and "could not be read" in (m.unknown or "")
    no_pci = [GpuIdentity(0, "GPU-a", "X", None), GpuIdentity(1, "GPU-b", "X", "00000000:01:00.0")]
    assert "no readable PCI bus id" in (cuda_mapping(no_pci).order_unknown or "")
    # One GPU needs no order at all.
    assert cuda_mapping([GpuIdentity(0, "GPU-a", None, None)]).resolve("cuda:0") == (0,)


@given(buses_st, st.data(), st.sampled_from([None, PCI]))
def test_visible_value_round_trips(buses: list[int], data: st.DataObject, order: str | None) -> None:
    gpus = gpus_with_buses(buses)
    picks = data.draw(st.lists(st.sampled_from([g.index for g in gpus]), unique=True, min_size=1))
    env = {} if order is None else {"CUDA_DEVICE_ORDER": order}
    # The value is absolute: it replaces a current CUDA_VISIBLE_DEVICES, whatever that says.
    current = cuda_mapping(gpus, {**env, "CUDA_VISIBLE_DEVICES": "0"})
    value = current.visible_value(picks)
    assert cuda_mapping(gpus, {**env, "CUDA_VISIBLE_DEVICES": value}).resolve("cuda:all") == tuple(picks)


def test_parse_cuda_selector() -> None:
    assert parse_cuda_selector("cuda:0") == 0 and parse_cuda_selector("CUDA:12") == 12
    assert parse_cuda_selector("cuda:all") is None
    for bad in ("cuda:", "cuda:-1", "cuda:x", "cuda:1,2", "gpu:0"):
        with pytest.raises(ValueError, match="cuda:N"):
            parse_cuda_selector(bad)
    assert is_cuda_selector("cuda:x") and not is_cuda_selector("GPU-1") and not is_cuda_selector(0)


def test_on_devices_refuses_cuda_selectors() -> None:
    from nvmlcheck import no_processes, on_devices

    with pytest.raises(ValueError, match=r"Session\.resolve"):
        on_devices(["cuda:0"], no_processes())


def test_an_entry_of_the_other_kind_ends_the_list() -> None:
    # Measured with PyTorch on 2x H200: CUDA_VISIBLE_DEVICES="GPU-<prefix>,1" gives one device, not two.
    gpus = gpus_with_buses([1, 2])
    m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": f"{gpus[0].uuid[:12]},1"})
    assert m.devices is not None and [d.nvml_index for d in m.devices] == [0]
    assert any("index after UUIDs" in note for note in m.notes)


def mig_host(mode: bool | None = True) -> list[GpuIdentity]:
    """GPU 0 in MIG mode (or its mode unknown), GPUs 1 and 2 whole."""
    return [GpuIdentity(i, f"GPU-{i}aaa", "NVIDIA H200", f"00000000:{0x10 + i:02X}:00.0", mode if i == 0 else False)
            for i in range(3)]


@pytest.mark.parametrize("mode", [True, None])
@pytest.mark.parametrize("env", [{}, {"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "0,1"},
                                 {"CUDA_VISIBLE_DEVICES": "GPU-0", "CUDA_DEVICE_ORDER": PCI}])
def test_a_gpu_in_mig_mode_makes_numbers_unknown_never_the_whole_gpu(env: dict[str, str], mode: bool | None) -> None:
    # CUDA sees one MIG device of a MIG-mode GPU, not the GPU: cuda:0 is not "GPU 0", and the numbers of the others
    # may shift. Refused with the reason, never guessed.
    m = cuda_mapping(mig_host(mode), env)
    assert m.devices is None and "MIG mode" in f"{m.unknown} {m.order_unknown}"
    with pytest.raises(CudaMappingError, match="MIG"):
        m.resolve("cuda:0")
    with pytest.raises(CudaMappingError, match="MIG"):
        m.visible_value([1])
    assert "GPU 0 GPU-0aaa (00000000:10:00.0, NVIDIA H200, MIG mode" in m.describe()


def test_uuids_of_whole_gpus_still_map_beside_a_gpu_in_mig_mode() -> None:
    m = cuda_mapping(mig_host(), {"CUDA_VISIBLE_DEVICES": "GPU-2,GPU-1"})
    assert m.resolve("cuda:all") == (2, 1)


def test_a_mig_entry_whose_instances_cannot_be_read_is_unknown() -> None:
    m = cuda_mapping(mig_host(), {"CUDA_VISIBLE_DEVICES": "MIG-0aaa"})
    assert m.devices is None and m.unknown is not None and "MIG instances of GPU 0" in m.unknown
    with pytest.raises(CudaMappingError, match="MIG instances of GPU 0"):
        m.resolve("cuda:0")


MIG_A = "MIG-5f0a0000-0000-5000-8000-00000000000a"
MIG_B = "MIG-5f0a0000-0000-5000-8000-00000000000b"


def mig_instances_host() -> list[GpuIdentity]:
    """GPU 0 in MIG mode with two instances (GI 1 and GI 2), GPUs 1 and 2 whole."""
    from nvmlcheck.model import MigDevice

    migs = (MigDevice(0, MIG_A, 1, 0, None, None), MigDevice(1, MIG_B, 2, 0, None, None))
    return [GpuIdentity(i, f"GPU-{i}aaa", "NVIDIA H200", f"00000000:{0x10 + i:02X}:00.0", i == 0,
                        migs if i == 0 else ()) for i in range(3)]


@pytest.mark.parametrize("entry", [MIG_B, "MIG-" + MIG_B[4:].upper(), "MIG-GPU-0aaa/2/0", "MIG-GPU-0AAA/2/0"])
def test_a_mig_instance_as_the_cuda_device_resolves_to_that_instance(entry: str) -> None:
    # CUDA_VISIBLE_DEVICES=MIG-<uuid> (hex digits in either case; or the name of drivers before R470): cuda:0 is
    # that instance.
    m = cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": entry})
    assert m.resolve("cuda:0") == (0,) and m.resolve("cuda:all") == (0,)
    (row,) = m.devices_of("cuda:0")
    assert (row.cuda_index, row.nvml_index, row.mig_uuid) == (0, 0, MIG_B)
    assert m.cuda_index(0) is None  # the instance is not GPU 0 whole
    with pytest.raises(CudaMappingError, match="no such CUDA device"):
        m.resolve("cuda:1")
    assert f"cuda:0 -> {MIG_B}, a MIG instance of GPU 0 GPU-0aaa" in m.describe()


def test_what_follows_a_mig_instance_is_unknown_but_cuda_0_is_known() -> None:
    m = cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": f"{MIG_A},{MIG_B}"})
    assert m.devices is None and m.unknown is not None and "not documented" in m.unknown
    assert m.devices_of("cuda:0")[0].mig_uuid == MIG_A
    for selector in ("cuda:1", "cuda:all"):
        with pytest.raises(CudaMappingError, match="not documented"):
            m.resolve(selector)
    assert "known all the same: cuda:0..cuda:0" in m.describe()


@pytest.mark.parametrize("value", [f"GPU-1aaa,{MIG_A}", MIG_A[:12], "MIG-GPU-0aaa/2"])
def test_a_mig_entry_whose_place_or_instance_cannot_be_told_is_refused(value: str) -> None:
    m = cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": PCI})
    if value == "MIG-GPU-0aaa/2":  # not a name CUDA documents: names no instance, so CUDA sees nothing
        assert m.devices == () and any("names no MIG instance" in n for n in m.notes)
        return
    assert m.devices is None and m.known == ()
    with pytest.raises(CudaMappingError):
        m.resolve("cuda:0")


def test_a_mig_entry_of_no_instance_hides_it_and_what_follows() -> None:
    # As for a UUID no GPU has: CUDA ignores the entry and every one after it.
    m = cuda_mapping(gpus_with_buses([1, 2, 3]), {"CUDA_VISIBLE_DEVICES": "MIG-12345678-aaaa-bbbb-cccc-1234567890ab,0"})
    assert m.devices == () and any("names no MIG instance" in n for n in m.notes)
    with pytest.raises(CudaMappingError, match="CUDA sees no GPU"):
        m.resolve("cuda:all")


def test_an_identity_without_mig_mode_is_read_as_before() -> None:
    class Old:  # a tool's own identity type, from before mig_mode
        def __init__(self, i: int) -> None:
            self.index, self.uuid, self.name, self.pci_bus_id = i, f"GPU-{i}", "NVIDIA H200", f"0000:{i + 1:02X}:00.0"

    assert cuda_mapping([Old(0), Old(1)], {"CUDA_VISIBLE_DEVICES": "1"}).resolve("cuda:0") == (1,)


def test_a_refusal_with_mig_instances_pickles() -> None:
    m = cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": f"{MIG_A},1"})
    with pytest.raises(CudaMappingError) as err:
        m.resolve("cuda:1")
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value) and again.mapping == m and again.mapping.known == m.known


@pytest.mark.parametrize("value", ["mig-5f0a0000-0000-5000-8000-00000000000b", "gpu-1aaa", "Gpu-1aaa,0"])
def test_a_lowercase_prefix_names_no_device_as_cuda_reads_it(value: str) -> None:
    """Measured (H200, driver 580.159.04, cuInit + cuDeviceGetCount): CUDA_VISIBLE_DEVICES=gpu-<uuid> and mig-<uuid>
    give no device, GPU-<UUID in capitals> gives the GPU. The mapping named GPU 1 for gpu-1aaa, a device CUDA never
    shows the job."""
    m = cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": value, "CUDA_DEVICE_ORDER": PCI})
    assert m.devices == () and any("in capitals only" in n for n in m.notes), m.notes
    with pytest.raises(CudaMappingError, match="CUDA sees no GPU"):
        m.resolve("cuda:all")
    assert cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": "GPU-1AAA"}).resolve("cuda:0") == (1,)


def test_a_mig_entry_with_a_whole_gpus_uuid_is_refused() -> None:
    # Measured: CUDA took MIG-<the UUID digits of a GPU not in MIG mode> as that GPU; NVIDIA documents no such name.
    m = cuda_mapping(mig_instances_host(), {"CUDA_VISIBLE_DEVICES": "MIG-1aaa"})
    assert m.devices is None and m.unknown is not None and "whole GPU" in m.unknown


def test_a_mig_mode_the_tool_does_not_have_is_no_mig_mode_and_a_failed_one_stays_unknown() -> None:
    """An nvidia-smi older than MIG (its driver has none) leaves ``mig_mode`` unknown with a reason that says so: the
    GPU is numbered as before MIG. A reading that failed (NO_PERMISSION) keeps the numbering unknown."""
    from types import SimpleNamespace

    def gpu(i: int, why: str) -> SimpleNamespace:
        return SimpleNamespace(index=i, uuid=f"GPU-{i}", name="X", pci_bus_id=f"00000000:{i + 1:02X}:00.0",
                               mig_mode=None, mig_devices=None, unknown={"mig": why})

    old = [gpu(0, "this nvidia-smi does not know the field mig.mode.current"), gpu(1, "[N/A]: not supported")]
    assert cuda_mapping(old).resolve("cuda:1") == (1,)
    failed = [gpu(0, "NVML_ERROR_NO_PERMISSION (4): nvmlDeviceGetMigMode"), gpu(1, "[N/A]: not supported")]
    m = cuda_mapping(failed)
    assert m.devices is None and "MIG mode that could not be read" in (m.order_unknown or ""), m


def unread_instance_host(uuid: str | None, gi: int | None) -> list[GpuIdentity]:
    """mig_instances_host, with GPU 0's first instance read as ``uuid``, GI ``gi`` (``None``: that read failed)."""
    from nvmlcheck.model import MigDevice

    hosts = mig_instances_host()
    first = MigDevice(0, uuid, gi, None if gi is None else 0, None, None, {"uuid": "NVML_ERROR_UNKNOWN"})
    migs = (first, *(hosts[0].mig_devices or ())[1:])
    return [GpuIdentity(0, "GPU-0aaa", "NVIDIA H200", "00000000:10:00.0", True, migs), *hosts[1:]]


@pytest.mark.parametrize(("uuid", "gi", "entry", "why"), [
    # A MIG- UUID no readable instance has may be the unread one's: never "CUDA sees nothing".
    (None, 1, "MIG-5f0a0000-0000-5000-8000-00000000000c", "MIG- UUID of MIG 0"),
    # The name of drivers before R470: an instance whose ids were not read may be the one named...
    (MIG_A, None, "MIG-GPU-0aaa/3/0", "instance ids of MIG 0"),
    # ...and one named by its ids whose UUID was not read was a whole GPU (mig_uuid None).
    (None, 1, "MIG-GPU-0aaa/1/0", "whose MIG- UUID could not be read"),
])
def test_a_mig_entry_beside_an_instance_not_read_is_unknown(uuid: str | None, gi: int | None, entry: str,
                                                             why: str) -> None:
    m = cuda_mapping(unread_instance_host(uuid, gi), {"CUDA_VISIBLE_DEVICES": entry})
    assert m.devices is None and m.known == () and m.unknown is not None and why in m.unknown, m.unknown
    with pytest.raises(CudaMappingError, match="could not be read"):
        m.resolve("cuda:0")


def test_a_mig_entry_read_whole_still_maps_beside_an_instance_not_read() -> None:
    m = cuda_mapping(unread_instance_host(None, None), {"CUDA_VISIBLE_DEVICES": MIG_B})
    assert m.devices_of("cuda:0")[0].mig_uuid == MIG_B
    m = cuda_mapping(unread_instance_host(MIG_A, None), {"CUDA_VISIBLE_DEVICES": "MIG-GPU-0aaa/2/0"})
    assert m.devices_of("cuda:0")[0].mig_uuid == MIG_B
