"""``select`` on a host with a GPU in MIG mode: CUDA never sees such a GPU whole, so select never chooses it, and a
``MIG-`` selector is refused rather than widened to its GPU (whose index or UUID select would then print)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import nvmlcheck as nc
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
