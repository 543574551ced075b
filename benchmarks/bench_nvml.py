"""Per-call cost of nvmlcheck's NVML queries next to the raw cffi call and nvidia-ml-py (pytest-benchmark).

    pytest benchmarks/bench_nvml.py --benchmark-enable --benchmark-group-by=param:case

On a GPU host it measures the driver; elsewhere the stub (the figures then describe the stub). The side-by-side
ratio table for docs/performance.md comes from ``benchmarks/compare_nvml.py``, which runs the same cases.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from nvml_cases import Cases, open_cases

CASES = ("memory", "processes", "clock", "wait_snapshot", "full_snapshot")


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
