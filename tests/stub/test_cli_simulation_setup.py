"""A simulation that cannot be set up because a file cannot be written (``$NVMLCHECK_STUB_CACHE`` under a regular
file or in ``/proc``, a read-only home) is exit 3 with a message that names the cache and the variable that moves it:
it was a traceback (exit 1, and no document under ``--json``), or blamed the C compiler and ``nvidia-nvml-dev``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.stub


def _nvmlcheck(argv: list[str], cache: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NVMLCHECK_STUB_CACHE": cache}
    return subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], capture_output=True, text=True, timeout=120,
                          check=False, env=env)


@pytest.fixture(params=["not-a-directory", "in-proc"])
def unwritable_cache(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "in-proc":
        return "/proc/nvmlcheck-no-such-cache"  # mkdir: ENOENT, which was read as "no nvml.h"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    return str(blocker / "cache")  # mkdir: ENOTDIR, which was a traceback


@pytest.mark.parametrize("argv", [["--simulate", "h200", "snapshot"], ["demo"], ["simulate", "run", "--", "true"]])
def test_a_stub_cache_that_cannot_be_written_is_named(argv: list[str], unwritable_cache: str) -> None:
    out = _nvmlcheck(argv, unwritable_cache)
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    assert "nvmlcheck: unavailable: the simulated GPU could not be set up" in out.stderr
    assert "set $NVMLCHECK_STUB_CACHE to a writable directory" in out.stderr
    assert "C compiler" not in out.stderr  # no compiler or package would help


def test_its_json_document_says_so(unwritable_cache: str) -> None:
    out = _nvmlcheck(["--json", "demo"], unwritable_cache)
    doc = json.loads(out.stdout)
    assert out.returncode == doc["exit_code"] == 3
    assert doc["schema"] == "nvmlcheck/error" and doc["error"]["type"] == "SimulationUnavailable"
    assert unwritable_cache in doc["error"]["message"]


def test_no_gpu_on_a_simulated_scenario_does_not_offer_the_simulation(tmp_path: Path) -> None:
    # The "no GPU here? `nvmlcheck --simulate h200 COMMAND`" hint was printed under --simulate too: the simulation had
    # ended when the error was reported.
    empty = tmp_path / "empty.txt"
    empty.write_text("nvmlcheck-stub-scenario 1\n")
    out = _nvmlcheck(["--simulate", str(empty), "snapshot"], os.environ.get("NVMLCHECK_STUB_CACHE", ""))
    assert out.returncode == 3 and "sees no GPU" in out.stderr
    assert "no GPU here?" not in out.stderr
    real = _nvmlcheck(["--backend", "nvml", "snapshot"], "")  # no driver here: the hint is still given
    if real.returncode == 3 and "sees no GPU" not in real.stderr:
        assert "no GPU here?" in real.stderr


@pytest.mark.parametrize("argv", [["--simulate", "x" * 5000, "snapshot"],
                                  ["simulate", "run", "--scenario", "x" * 5000, "--", "true"]])
def test_a_scenario_path_the_system_refuses_is_a_usage_error(argv: list[str]) -> None:
    # ENAMETOOLONG from looking at the path escaped as a traceback, exit 1.
    out = _nvmlcheck(argv, os.environ.get("NVMLCHECK_STUB_CACHE", ""))
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "not a bundled scenario nor a readable scenario file (File name too long)" in out.stderr
