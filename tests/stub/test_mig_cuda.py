"""``cuda:N`` when ``CUDA_VISIBLE_DEVICES`` names a MIG instance (``MIG-<uuid>``, or the name of drivers before
R470): CUDA's device 0 is that instance, so a wait, ready, holders and a kill by ``cuda:0`` judge that instance
alone, as ``--devices MIG-...`` does, never its GPU's other tenants; select (whole GPUs) refuses it. nvmlcheck's
own selectors take ``mig-...``/``gpu-...`` as ``MIG-...``/``GPU-...`` (CUDA_VISIBLE_DEVICES does not:
tests/unit/test_cudamap.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import devfiles
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

from .conftest import GIB, GPU0, MIG0, MIG1, two_instances

pytestmark = pytest.mark.stub

def tenants(in0: int = 4_000_020, in1: int = 4_000_010) -> Scenario:
    """GPU 0 in MIG mode: MIG 0 (GI 1) runs ``in0``, MIG 1 (GI 2) runs ``in1`` (2 GiB); GPU 1 whole and idle."""
    return two_instances(in0=in0, in1=in1, in1_bytes=2 * GIB)


def options() -> WaitOptions:
    clock = StepClock(0.001)
    return WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02)


@pytest.mark.parametrize("visible", [MIG1, f"MIG-{GPU0}/2/0"])
def test_cuda_0_is_the_instance_cuda_visible_devices_names(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch, visible: str
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    with gpus(tenants()) as session:
        assert session.resolve(["cuda:0"]) == (0,)
        (row,) = session.cuda_mapping().devices_of("cuda:0")
        assert row.mig_uuid == MIG1
        with pytest.raises(nc.WaitTimeout) as err:
            session.wait_until_clean(timeout=0.1, devices=["cuda:0"], options=options())
        # Only the instance's tenant, never MIG 0's.
        assert [h.pid for h in err.value.holders] == [4_000_010]
        assert err.value.holders[0].mig_uuid == MIG1
        assert all("MIG 1" in line for line in err.value.culprits), err.value.culprits
        report = session.ready(["cuda:0"])
        assert [v.uuid for v in report.verdicts] == [MIG1]


def test_a_clean_instance_by_cuda_0_is_clean_though_its_gpu_is_busy(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    sc = two_instances(1, in1=4_000_010, in1_bytes=2 * GIB)  # in MIG 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG0)
    with gpus(sc) as session:
        assert session.wait_until_clean(0, devices=["cuda:0"]).clean
        with pytest.raises(nc.WaitTimeout):
            session.wait_until_clean(0, devices=[0])


def test_select_refuses_cuda_n_that_is_a_mig_instance(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG1)
    with gpus(tenants()) as session, pytest.raises(nc.ArgumentError, match="cuda:N selector names a MIG instance"):
        session.select_clean(1, devices=["cuda:0"])


def test_lowercase_mig_selectors_name_the_instance(gpus: Callable[[Scenario], nc.Session]) -> None:
    # A lowercase name was read as a GPU UUID: NoSuchDevice, or, for a wait, the whole GPU.
    with gpus(tenants()) as session:
        for name in (MIG1.lower(), "mig-" + MIG1[4:]):
            assert session.resolve([name]) == (0,)
            with pytest.raises(nc.WaitTimeout) as err:
                session.wait_until_clean(timeout=0.1, devices=[name], options=options())
            assert [h.pid for h in err.value.holders] == [4_000_010], name


def test_a_kill_by_cuda_0_chooses_only_the_instances_process(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch,
    hold: Callable[[], subprocess.Popen[bytes]], dev: tuple[Path, str],
) -> None:
    # cuda:0 resolved to the whole GPU: kill --all-on-gpu --devices cuda:0 chose every tenant of GPU 0.
    files = dev[1]
    a, b = hold(), hold()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG1)
    with gpus(tenants(a.pid, b.pid)) as session, devfiles.simulated_stand_ins(files.split(":"), "the test"):
        sel = nc.select_kill_holders(session, ["cuda:0"], all_holders=False)
        found = session.holders(["cuda:0"], device_files=files)
    assert [t.pid for t in sel.targets] == [b.pid]
    assert [(h.pid, [g.uuid for g in h.gpus]) for h in found if h.gpus] == [(b.pid, [MIG1])]


def test_a_gpu_uuid_in_lowercase_or_any_case_names_its_gpu(gpus: Callable[[Scenario], nc.Session]) -> None:
    # The CUDA mapping read GPU- UUIDs in any case, --devices did not (NoSuchDevice).
    with gpus(Scenario.h200(2)) as session:
        gpu1 = session.snapshot(fields=nc.Fields(0)).devices[1].uuid
        for name in (gpu1.lower(), gpu1.upper(), gpu1.lower()[:-1] + gpu1[-1].upper()):
            assert session.resolve([name]) == (1,), name
        with pytest.raises(nc.NoSuchDevice):
            session.resolve(["gpu-ffffffff"])


def test_a_selection_given_as_a_generator_still_selects_the_instance(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path
) -> None:
    # Read twice (resolved, then its MIG instances): the second read of a generator was empty, so the whole GPU,
    # every tenant, was judged and listed.
    with gpus(tenants()) as session:
        with pytest.raises(nc.WaitTimeout) as err:
            session.wait_until_clean(timeout=0.1, devices=(d for d in [MIG1]), options=options())
        assert [h.pid for h in err.value.holders] == [4_000_010]
        found = session.holders((d for d in [MIG1]), device_files=str(tmp_path / "no-such-dev*"))
        assert [h.pid for h in found if h.gpus] == [4_000_010]
        assert [v.uuid for v in session.ready(d for d in [MIG1]).verdicts] == [MIG1]
