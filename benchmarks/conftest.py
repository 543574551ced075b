"""Benchmarks run on a real GPU when one is usable, else on the stub library (and say so in their names)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def nvml_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``"gpu"`` when libnvidia-ml loads and sees a GPU, else ``"stub"`` with the stub pointed at an idle H200."""
    from nvmlcheck import NvmlCheckError
    from nvmlcheck.backends.nvml import NvmlBackend

    if not os.environ.get("NVMLCHECK_LIBNVML"):
        try:
            NvmlBackend().close()
        except NvmlCheckError:
            pass
        else:
            yield "gpu"
            return
    from nvmlcheck.testing import Scenario, use_stub

    tmp: Path = tmp_path_factory.mktemp("stub")
    with use_stub(Scenario.h200(), tmp_dir=tmp):
        os.environ.pop("NVMLCHECK_STUB_LOG", None)  # logging every call would be measured too
        yield "stub"
