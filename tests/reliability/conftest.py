"""Fixtures for the reliability suite: the stub libnvidia-ml and the fake nvidia-smi, each pointed at one scenario
file, with the NVML reference count checked at 0 before and after every test that uses the stub (its state lives
as long as the process)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck._nvml import library
from nvmlcheck.testing import build_stub

from ._support import FAKE_SMI, KNOBS, Smi, Stub, wait_for


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    """The full stub build, ``$NVMLCHECK_LIBNVML`` pointing at it (so ``backend="auto"`` and the CLI find it), a fresh
    scenario file, and the fake nvidia-smi on ``$PATH`` as ``nvidia-smi`` (for ``auto``'s fallback and the CLI)."""
    lib = build_stub()
    scenario = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(lib))
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario))
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    for knob in KNOBS:
        monkeypatch.delenv(knob, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "nvidia-smi"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{FAKE_SMI}" "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    s = Stub(lib, scenario)
    assert s.probe.init_refcount() == 0, "an earlier test left NVML initialised"
    yield s
    # A test that abandoned a hung nvmlInit waits for it itself; this only double-checks, briefly. An init still in
    # flight (a wait that gave up on a re-init at its deadline) must have returned too: the next test's open would
    # join it, with this test's scenario.
    loaded = library._loaded.get(str(lib))
    wait_for(
        lambda: s.probe.init_refcount() == 0 and (loaded is None or loaded._pending is None),
        5.0,
        "the stub's NVML reference count to return to 0 and no init to be in flight",
    )
    assert loaded is None or loaded.refcount == 0, "a session of this test was not closed"


@pytest.fixture
def smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Smi:
    """A scenario file read by the fake nvidia-smi, with every test knob cleared."""
    scenario = tmp_path / "scenario.txt"
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario))
    for knob in KNOBS:
        monkeypatch.delenv(knob, raising=False)
    return Smi(scenario, tmp_path, monkeypatch)
