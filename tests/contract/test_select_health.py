"""``select`` passes over a GPU that ``ready`` refuses for its health, on both backends (the stub through NVML and
the fake nvidia-smi rendering the same scenario), and chooses it again with ``health=False``."""

from __future__ import annotations

import pytest
from test_backend_contract import Opener, open_backend  # noqa: F401  (the fixture, parametrised over backends)

from nvmlcheck.selection import SelectTimeout
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub


@pytest.mark.parametrize(
    "fields",
    [{"remapped_rows": (0, 1, True, False)}, {"remapped_rows": (2, 512, False, True)}, {"recovery_action": 1},
     # Volatile ECC errors with the recovery action unknown (with it read as none, the driver asks for nothing).
     {"ecc_uncorrected_volatile": 3, "unsupported": ("recovery", "retired_pages", "retired_pending")}],
    ids=["remap-pending", "remap-failure", "recovery-reset", "ecc-volatile"],
)
def test_select_passes_over_an_unhealthy_gpu(open_backend: Opener, fields: dict[str, object]) -> None:  # noqa: F811
    sc = Scenario.h200(devices=2)
    sc.set_device(0, **fields)
    with open_backend(sc) as gpus:
        assert gpus.select_clean(1, interval=0.0).indices == (1,)
        with pytest.raises(SelectTimeout) as err:
            gpus.select_clean(2, interval=0.0)
        assert err.value.clean == (1,) and [h.class_ for h in err.value.holders if h.gpu == 0] == ["unhealthy"]
        assert gpus.select_clean(2, health=False, interval=0.0).indices == (0, 1)


def test_select_takes_a_gpu_whose_volatile_ecc_errors_the_driver_asks_nothing_for(
        open_backend: Opener) -> None:  # noqa: F811
    """Round 6: volatile uncorrectable ECC errors with the recovery action read as none (a contained error: the
    driver asks for nothing, NVIDIA says the GPU can be used again) made select pass over the GPU, as unhealthy."""
    sc = Scenario.h200(devices=2)
    sc.set_device(0, ecc_uncorrected_volatile=3)
    with open_backend(sc) as gpus:
        assert gpus.select_clean(2, interval=0.0).indices == (0, 1)
