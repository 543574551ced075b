"""A Python without cffi: the NVML backend is unavailable with the reason (``--backend nvml``: exit 3, no
traceback), ``auto`` falls back to nvidia-smi, and the one-shot's early start does not fail the command. The child
blocks ``_cffi_backend`` (``sys.modules[...] = None``), as an interpreter without cffi installed would fail it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvmlcheck.testing import Scenario, stub_source_dir

pytestmark = pytest.mark.stub

ROOT = Path(__file__).resolve().parents[2]
_NO_CFFI = ("import sys; sys.modules['_cffi_backend'] = None; sys.argv[0] = 'nvmlcheck'; "
            "from nvmlcheck.cli import script; script()")


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    scenario = tmp_path / "scenario.txt"
    Scenario.h200().write(scenario)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nexec {sys.executable} {stub_source_dir() / 'fake_nvidia_smi.py'} \"$@\"\n")
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NVMLCHECK_STUB_SCENARIO": str(scenario),
           "LD_LIBRARY_PATH": "/nonexistent"}
    return subprocess.run([sys.executable, "-c", _NO_CFFI, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip


def test_without_cffi_the_nvml_backend_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    done = _run(tmp_path, "--backend", "nvml", "--json", "snapshot")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    assert "needs cffi" in doc["error"]["message"] and "pip install cffi" in doc["error"]["message"]


@pytest.mark.parametrize("command", [["wait", "--timeout", "0"], ["ready"], ["snapshot"]])
def test_without_cffi_auto_falls_back_to_nvidia_smi(tmp_path: Path, command: list[str]) -> None:
    done = _run(tmp_path, "--json", *command)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    snapshot = doc.get("snapshot", doc)
    assert snapshot["backend"] == "smi", doc


@pytest.mark.parametrize("command", [["wait", "--events", "--timeout", "1"], ["ready", "--timeout", "1"]])
def test_without_cffi_a_wait_that_listens_polls_nvidia_smi(tmp_path: Path, command: list[str]) -> None:
    # The listener module imported the NVML library (and so cffi) at its top: the smi backend's "no events" listener
    # could not even be made, and `wait --events` and a `ready` that waits died with ModuleNotFoundError.
    done = _run(tmp_path, "--json", *command)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_without_cffi_watch_says_the_smi_backend_has_no_events(tmp_path: Path) -> None:
    done = _run(tmp_path, "watch", "--for", "1")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "the smi backend has none" in done.stderr
