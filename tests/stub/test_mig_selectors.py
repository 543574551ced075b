"""``MIG-`` selectors through the session: the full UUID, a prefix, and the name of drivers before R470
(``MIG-<GPU UUID>/<GI>/<CI>``) name the same instance in resolve, wait and holders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario

from .conftest import GIB, GPU0, MIG1, two_instances

pytestmark = pytest.mark.stub


def busy_instance() -> Scenario:
    return two_instances(in1=4242)


@pytest.mark.parametrize("busy", [MIG1, f"MIG-{GPU0}/2/0", f"MIG-GPU-{GPU0[4:].upper()}/2/0"])
def test_the_legacy_name_selects_the_instance_as_its_uuid_does(
    gpus: Callable[[Scenario], nc.Session], busy: str, tmp_path: Path
) -> None:
    with gpus(busy_instance()) as session:
        assert session.resolve([busy]) == (0,)
        with pytest.raises(nc.WaitTimeout) as err:
            session.wait_until_clean(0, devices=[busy])
        assert err.value.culprits and all(MIG1 in c for c in err.value.culprits)
        # The other instance of the same GPU, named the old way, is clean.
        assert session.wait_until_clean(0, devices=[f"MIG-{GPU0}/1/0"]).clean
        assert [h.pid for h in session.holders([busy], device_files=str(tmp_path / "no-such-dev*")) if h.gpus] == [4242]


@pytest.mark.parametrize("name", [f"MIG-{GPU0}/3/0", f"MIG-{GPU0}/2/1", "MIG-GPU-00000000/2/0", f"MIG-{GPU0}/2"])
def test_a_legacy_name_of_no_instance_names_nothing(gpus: Callable[[Scenario], nc.Session], name: str) -> None:
    with gpus(busy_instance()) as session, pytest.raises(nc.NoSuchDevice):
        session.resolve([name])


def test_an_instance_destroyed_between_resolving_and_judging_is_never_dropped(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The instance was there when the selection was resolved (stood in for: _mig_parent answers), gone when the
    # wait read the instances: judged unknown (missing), never left out while GPU 1 beside it is judged clean.
    gone = "MIG-00000000-0000-0000-0000-00000000000f"
    with gpus(busy_instance()) as session:
        monkeypatch.setattr(session, "_mig_parent", lambda item, *args: (0,))
        with pytest.raises(nc.WaitTimeout) as err:
            session.wait_until_clean(0, devices=[1, gone])
        assert any(gone in c for c in err.value.culprits), err.value.culprits
        with pytest.raises(nc.WaitTimeout):
            session.wait_until_clean(0, devices=[gone])


def test_a_lost_gpu_is_reported_as_lost_not_as_a_mig_name_that_names_nothing(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path
) -> None:
    # Its MIG devices cannot be read, so the instance may be there: the wait reads that GPU and says why it cannot
    # be judged (a usage error, exit 2, said the name was wrong). A prefix cannot be shown to name one instance.
    sc = busy_instance()
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", 15, device=0)
    with gpus(sc) as session:
        assert session.resolve([MIG1]) == (0,)
        with pytest.raises(nc.GpuLost):
            session.wait_until_clean(0, devices=[MIG1])
        with pytest.raises(nc.GpuLost):
            session.holders([MIG1], device_files=str(tmp_path / "no-such-dev*"))
        assert session.resolve(["MIG-ffffffff"]) == (0,)  # on no readable GPU: maybe on GPU 0


def test_unreadable_mig_devices_make_a_prefix_ambiguous_and_a_name_their_gpus(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path
) -> None:
    sc = busy_instance()
    sc.set_device(1, mig=True)
    sc.add_mig_device(1, 0, gi=1, total_bytes=16 * GIB, uuid="MIG-aaaaaaaa-0000-0000-0000-000000000000")
    sc.fault("nvmlDeviceGetMaxMigDeviceCount", 999, device=0)  # GPU 0's instances: unknown
    with gpus(sc) as session:
        with pytest.raises(nc.ArgumentError, match="cannot be shown to name one MIG device"):
            session.resolve(["MIG-aaaa"])
        assert session.resolve(["MIG-aaaaaaaa-0000-0000-0000-000000000000"]) == (1,)
        assert session.resolve([MIG1]) == (0,)  # maybe on GPU 0: its reading says why it cannot be judged
        with pytest.raises(nc.WaitTimeout):
            session.wait_until_clean(0, devices=[MIG1])
        with pytest.raises(nc.NvmlCheckError, match="MIG devices of GPU 0 could not be read"):
            session.holders([MIG1], device_files=str(tmp_path / "no-such-dev*"))


@pytest.mark.parametrize("name", [MIG1, f"MIG-{GPU0}/2/0"])
def test_an_instance_whose_uuid_could_not_be_read_is_never_said_to_be_absent_or_clean(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch, name: str, tmp_path: Path
) -> None:
    # MIG 1's UUID read failed (nvmlDeviceGetUUID on its handle): "no MIG device has a UUID starting with ..." was a
    # guess (it may be that one), and it ended a wait at once. Now the selection resolves to its GPU and the
    # instance is judged unknown.
    with gpus(two_instances()) as session:
        calls = session.backend._calls  # type: ignore[attr-defined]
        read = calls.mig_devices

        def uuid_unread(handle: object, index: int) -> list[tuple[object, ...]]:
            return [(slot, None, *rest[:3], {**why, "uuid": "nvmlDeviceGetUUID on the MIG handle: NVML_ERROR_UNKNOWN"})
                    if slot == 1 else (slot, uuid, *rest, why)
                    for slot, uuid, *rest, why in read(handle, index)]

        monkeypatch.setattr(calls, "mig_devices", uuid_unread)
        assert session.resolve([name]) == (0,)
        with pytest.raises(nc.WaitTimeout) as err:
            session.wait_until_clean(0, devices=[name])
        assert err.value.culprits and all(name in c for c in err.value.culprits), err.value.culprits
        (verdict,) = session.ready(devices=[name]).verdicts
        assert verdict.class_ == "unknown"
        if "/" in name:
            return  # named by its ids, which were read: holders find it by them
        # Its holders cannot be told (was: NoSuchDevice, "destroyed, or its GPU left MIG mode").
        with pytest.raises(nc.NvmlCheckError, match="cannot tell what holds it") as held:
            session.holders([name], device_files=str(tmp_path / "no-such-dev*"))
        assert not isinstance(held.value, nc.NoSuchDevice)


def test_a_prefix_of_one_instance_that_names_two_when_read_again_is_refused_by_holders(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The prefix named one instance when the selection was resolved (stood in for: _mig_parent answers); an
    # instance created since has it too. holders (and so a kill) took the processes of both instances.
    prefix = MIG1[:-1]  # MIG0 and MIG1 both start with it
    with gpus(two_instances(in0=4241, in1=4242)) as session:
        monkeypatch.setattr(session, "_mig_parent", lambda item, *args: (0,))
        with pytest.raises(nc.ArgumentError, match="names 2 MIG devices now"):
            session.holders([prefix], device_files=str(tmp_path / "no-such-dev*"))
