"""``WaitTimeout.holders`` (the structured culprits of every wait, kill and select that times out) on a selection of
MIG instances: only the selected instances' holders, as the ``culprits`` lines say, never another tenant's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30


def two_tenants() -> Scenario:
    """One H200 split in two instances, each with its own tenant's process."""
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, total_bytes=70 * GIB)
    sc.add_mig_device(0, 1, total_bytes=70 * GIB)
    sc.add_process(0, 4_000_010, used_bytes=4 * GIB, gi=2, ci=0)  # in instance 1
    sc.add_process(0, 4_000_020, used_bytes=2 * GIB, gi=1, ci=0)  # in instance 0
    return sc


def test_a_wait_on_one_mig_instance_names_only_its_holders(gpus: Callable[[Scenario], nc.Session]) -> None:
    """The wait on instance 1 timed out, and ``holders`` named both tenants (the whole GPU judged): a kill by
    them would end the other instance's process."""
    clock = StepClock(0.001)
    with gpus(two_tenants()) as session:
        _, busy = (m.uuid for m in session.snapshot().devices[0].mig_devices or ())
        assert busy is not None
        with pytest.raises(nc.WaitTimeout) as info:
            session.wait_until_clean(timeout=0.2, devices=[busy],
                                     options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    assert [(h.gpu, h.pid) for h in info.value.holders] == [(0, 4_000_010)]
    assert all("MIG 1" in line for line in info.value.culprits)  # the lines already said so


def test_a_wait_on_the_whole_gpu_still_names_every_holder(gpus: Callable[[Scenario], nc.Session]) -> None:
    clock = StepClock(0.001)
    with gpus(two_tenants()) as session, pytest.raises(nc.WaitTimeout) as info:
        session.wait_until_clean(timeout=0.2, options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    assert sorted(h.pid or 0 for h in info.value.holders) == [4_000_010, 4_000_020]


def test_the_wait_document_names_only_the_selected_instances_holders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = str(two_tenants().write(tmp_path / "s.txt"))
    assert cli.main(["--simulate", path, "--json", "snapshot"]) == 0
    busy = json.loads(capsys.readouterr().out)["devices"][0]["mig_devices"][1]["uuid"]
    code = cli.main(["--simulate", path, "--json", "wait", "--devices", busy, "--timeout", "0"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and [h["pid"] for h in doc["holders"]] == [4_000_010]


def test_the_wait_command_does_not_call_an_unreadable_gpu_held(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The command rebuilt the library's WaitTimeout without its `held`: "still held" for a GPU nothing was seen on.
    from nvmlcheck.testing import use_stub

    sc = Scenario.h200(devices=2)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", 999, device=1)
    with use_stub(sc, tmp_dir=tmp_path):
        code = cli.main(["wait", "--timeout", "0"])
    err = capsys.readouterr().err
    assert code == 1 and "GPUs not confirmed clean" in err and "still held" not in err, err
