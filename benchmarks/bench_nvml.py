"""Per-call cost of nvmlcheck's NVML queries next to the raw cffi call and nvidia-ml-py (pytest-benchmark).

    pytest benchmarks/bench_nvml.py --benchmark-enable --benchmark-group-by=param:case

On a GPU host it measures the driver; elsewhere the stub (the figures then describe the stub). The side-by-side
ratio table for docs/performance.md comes from ``benchmarks/compare_nvml.py``, which runs the same cases.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from nvml_cases import Cases, open_cases

CASES = ("memory", "processes", "clock", "wait_snapshot", "full_snapshot")


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


@pytest.fixture(scope="module")
def cases(nvml_target: str) -> Iterator[Cases]:
    c = open_cases()
    yield c
    c.close()


@pytest.mark.parametrize("case", CASES)
def test_raw_cffi(benchmark: pytest.FixtureDef[object], cases: Cases, case: str) -> None:
    benchmark(cases.raw[case])  # type: ignore[operator]


@pytest.mark.parametrize("case", CASES)
def test_nvmlcheck(benchmark: pytest.FixtureDef[object], cases: Cases, case: str) -> None:
    benchmark(cases.typed[case])  # type: ignore[operator]


@pytest.mark.parametrize("case", CASES[:4])
def test_nvidia_ml_py(benchmark: pytest.FixtureDef[object], cases: Cases, case: str) -> None:
    if case not in cases.reference:
        pytest.skip("nvidia-ml-py is not usable here")
    benchmark(cases.reference[case])  # type: ignore[operator]
