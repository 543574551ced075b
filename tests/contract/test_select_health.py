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
     {"ecc_uncorrected_volatile": 3}],
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
