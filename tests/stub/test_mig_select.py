"""``select`` on a host with a GPU in MIG mode: CUDA never sees such a GPU whole, so select never chooses it, and a
``MIG-`` selector is refused rather than widened to its GPU (whose index or UUID select would then print)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.locks import LockSet, try_lock
from nvmlcheck.selection import SelectTimeout
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

MIB = 1 << 20
GIB = 1 << 30


def idle_mig_gpu0() -> Scenario:
    sc = Scenario.h200(2)
    sc.set_device(0, mig=True, used_bytes=55 * MIB)
    sc.add_mig_device(0, 0, total_bytes=16 * GIB)
    return sc


def test_a_gpu_in_mig_mode_is_passed_over_with_the_reason(gpus: Callable[[Scenario], nc.Session]) -> None:
    with gpus(idle_mig_gpu0()) as session:
        assert session.select_clean(1).indices == (1,)
        with pytest.raises(SelectTimeout) as err:
            session.select_clean(2)
    assert err.value.clean == (1,)
    assert any(c.startswith("GPU 0: in MIG mode") for c in err.value.culprits)


@pytest.mark.parametrize("devices", [["MIG-00000000-0000-0000-0000-000000000000"], "MIG-00000000", ["mig-0", 1]])
def test_a_mig_selector_is_refused_not_widened_to_its_gpu(
    gpus: Callable[[Scenario], nc.Session], devices: list[str | int] | str
) -> None:
    with gpus(idle_mig_gpu0()) as session, pytest.raises(nc.ArgumentError, match="not MIG instances"):
        session.select_clean(1, devices=devices)


def test_a_gpu_whose_mig_mode_cannot_be_read_is_passed_over_with_the_reason(
    gpus: Callable[[Scenario], nc.Session]
) -> None:
    # An idle GPU whose MIG mode read failed (NVML_ERROR_UNKNOWN) was chosen as a whole GPU; it may be in MIG mode.
    sc = Scenario.h200(2)
    sc.fault("nvmlDeviceGetMigMode", 999, device=0)
    with gpus(sc) as session:
        assert session.select_clean(1).indices == (1,)
        with pytest.raises(SelectTimeout) as err:
            session.select_clean(2)
    assert err.value.clean == (1,)
    assert any(c.startswith("GPU 0: its MIG mode is unknown") for c in err.value.culprits), err.value.culprits


def test_a_mig_mode_read_that_failed_once_is_read_again(gpus: Callable[[Scenario], nc.Session]) -> None:
    # One failed read at the identity made the mode unknown for the whole session: select passed GPU 0 over for
    # good, and every reading said "MIG mode unknown".
    sc = Scenario.h200(2)
    sc.fault("nvmlDeviceGetMigMode", 999, device=0, count=1)
    with gpus(sc) as session:
        d = session.snapshot(fields=nc.Fields.WAIT).device(0)
        assert d.mig_mode is False and d.why_unknown("mig") is None
        assert session.select_clean(2).indices == (0, 1)


@pytest.mark.parametrize("busy1", [False, True])
def test_a_gpu_that_entered_mig_mode_after_it_was_first_read_is_never_chosen(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path, busy1: bool
) -> None:
    # A wait reads the MIG mode again only while it is on: GPU 0, read whole, then put in MIG mode (idle, nothing used
    # on the parent), was chosen by select, whose UUID exported to CUDA_VISIBLE_DEVICES gives a job no whole GPU.
    sc = Scenario.h200(2)
    if busy1:
        sc.add_process(1, 4343, used_bytes=GIB)
    # After the identity read (the first snapshot), GPU 0 enters MIG mode; the 2 MiB it then reads (within the
    # 16 MiB limit) is how the test sees that the change was made.
    sc.at_call(40).set_device(0, mig=True, used_bytes=2 * MIB)
    sc.at_call(40).add_mig_device(0, 0, gi=1, total_bytes=16 * GIB)
    with gpus(sc) as session:
        first = session.snapshot(fields=nc.Fields.WAIT).devices[0]
        assert first.mig_mode is False and first.memory is not None and first.memory.used_bytes == 0
        for _ in range(20):  # WAIT snapshots do not read the mode of a GPU read whole: the change stays unseen
            d = session.snapshot(fields=nc.Fields.WAIT).devices[0]
            assert d.memory is not None
            if d.memory.used_bytes == 2 * MIB:
                break
        assert d.memory is not None and d.memory.used_bytes == 2 * MIB and d.mig_mode is False  # the set-up holds
        if busy1:
            with pytest.raises(SelectTimeout) as err:
                session.select_clean(1, lock=True, lock_dir=tmp_path)
            assert err.value.clean == ()
            assert any(c.startswith("GPU 0: in MIG mode") for c in err.value.culprits), err.value.culprits
        else:
            chosen = session.select_clean(1, lock=True, lock_dir=tmp_path)
            assert chosen.indices == (1,)
            assert any(c.startswith("GPU 0: in MIG mode") for c in chosen.passed_over), chosen.passed_over
            assert chosen.locks is not None
            chosen.locks.release()
        # GPU 0's lock, taken when it was about to be chosen, was given back.
        held = try_lock("GPU-00000000-0000-0000-0000-000000000000", tmp_path)
        assert held is not None
        LockSet([held], tmp_path).release()
