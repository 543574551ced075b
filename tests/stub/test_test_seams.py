"""Test seams never decide what a real run does (issue 27, item 2): ``$NVMLCHECK_LIBNVML`` loads nvmlcheck's stub
only, from a file no other user can write, and ``$NVMLCHECK_DEVICE_FILES`` is gone (tests/stub/test_holders.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, build_stub

pytestmark = pytest.mark.stub


def _loaded_libc() -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/libc.so" in path or "/libc-" in path:
            return path
    pytest.skip("no libc mapped by path")


def test_the_environment_cannot_load_a_library_that_is_not_the_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_LIBNVML", _loaded_libc())
    with pytest.raises(nc.BackendUnavailable, match="not nvmlcheck's stub"):
        nc.open("nvml")


def test_the_environment_cannot_load_a_library_others_may_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "lib" / "libnvidia-ml.so.1"
    copy.parent.mkdir()
    shutil.copy(build_stub(), copy)
    copy.chmod(0o666)
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(copy))
    with pytest.raises(nc.BackendUnavailable, match="writable by other users"):
        nc.open("nvml")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chown)")
def test_as_root_the_environment_cannot_load_another_users_stub(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `sudo -E nvmlcheck kill ...` from a shell where a test exported the variable.
    copy = tmp_path / "lib" / "libnvidia-ml.so.1"
    copy.parent.mkdir()
    shutil.copy(build_stub(), copy)
    os.chown(copy, 1000, 1000)
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(copy))
    with pytest.raises(nc.BackendUnavailable, match="owned by uid 1000"):
        nc.open("nvml")


def test_the_stub_named_by_the_environment_still_works(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(Scenario.h200(devices=2).write(tmp_path / "sc.txt")))
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(build_stub()))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    with nc.open("nvml") as gpus:
        assert gpus.device_count() == 2
