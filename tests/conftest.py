"""Suite-wide options: the ``gpu`` marker is skipped without a real NVIDIA driver, unless ``--require-gpu``."""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail (instead of skip) tests marked gpu when no real GPU is reachable",
    )


def _real_gpu_reason() -> str | None:
    """None when a real libnvidia-ml initialises and sees at least one GPU, else why not."""
    if os.environ.get("NVMLCHECK_LIBNVML") or os.environ.get("NVMLCHECK_STUB_SCENARIO"):
        return "NVMLCHECK_LIBNVML/NVMLCHECK_STUB_SCENARIO point at a stub, not a real driver"
    from nvmlcheck import NvmlCheckError
    from nvmlcheck.backends.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except NvmlCheckError as exc:
        return f"no NVIDIA driver: {exc}".splitlines()[0]
    try:
        if backend.device_count() == 0:
            return "NVML sees no GPU"
    finally:
        backend.close()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _real_gpu_reason()
    if reason is None:
        return
    if config.getoption("--require-gpu"):
        raise pytest.UsageError(f"--require-gpu given but no GPU is usable: {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)
