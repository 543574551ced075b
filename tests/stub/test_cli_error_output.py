"""An error, or a notice, that cannot be written keeps the command's exit status (docs/cli.md, "Exit codes").

A usage error's or a backend error's report on a full disk (``>/dev/full``, ``2>/dev/full``) ended in a traceback
and Python's exit 1, which reads as "not clean"; the simulation's notice on a full stderr did the same to a clean
wait."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.stub


def _run(argv: list[str], *, full: str) -> subprocess.CompletedProcess[str]:
    """``nvmlcheck argv`` with stdout or stderr (``full``) on ``/dev/full``; the other one captured."""
    argv = [sys.executable, "-m", "nvmlcheck", *argv]
    with open("/dev/full", "w") as disk:
        if full == "stdout":
            return subprocess.run(argv, stdout=disk, stderr=subprocess.PIPE, text=True, timeout=120, check=False)
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=disk, text=True, timeout=120, check=False)


@pytest.mark.parametrize(("argv", "code"), [
    (["--json", "--simulate", "h200", "snapshot", "--devices", "5"], 2),  # the library's NoSuchDevice
    (["--json", "--simulate", "h200", "wait", "--timeout", "bad"], 2),  # the parser's own error document
])
def test_an_error_document_on_a_full_disk_keeps_its_exit_status(argv: list[str], code: int) -> None:
    out = _run(argv, full="stdout")
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr
    assert f"output failed (No space left on device); exit status {code}" in out.stderr


@pytest.mark.parametrize(("argv", "code"), [
    (["--simulate", "h200", "snapshot", "--devices", "5"], 2),  # the error line itself cannot be written
    (["--simulate", "h200", "wait", "--timeout", "5"], 0),  # the simulation's notice cannot be written
    (["--simulate", "h200-busy", "wait", "--timeout", "0"], 1),
])
def test_a_full_stderr_keeps_the_exit_status(argv: list[str], code: int) -> None:
    out = _run(argv, full="stderr")
    assert out.returncode == code, out.stdout


@pytest.mark.parametrize("argv", [["--version"], ["--json", "--version"]])
def test_a_version_that_cannot_be_written_is_141(argv: list[str]) -> None:
    # The answer is the output (as snapshot's): argparse's own write dropped the error and exited 0.
    out = _run(argv, full="stdout")
    assert out.returncode == 141, out.stderr
    assert "output failed (No space left on device); exit status 141" in out.stderr


@pytest.mark.parametrize("argv", [["demo"], ["--json", "demo"]])
def test_a_demo_that_cannot_be_written_is_141_not_a_traceback(argv: list[str]) -> None:
    # README's first command, on a full disk: a traceback and exit 1.
    out = _run(argv, full="stdout")
    assert out.returncode == 141, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("argv", [["simulate", "scenario", "h200"],
                                  ["--simulate", "h200", "--json", "kill", "--dry-run", "--all-holders", "--yes"]])
def test_a_full_disk_before_any_verdict_is_an_output_failure(argv: list[str]) -> None:
    # With PYTHONUNBUFFERED=1 (as container images set it) the first line fails at once, before the command decided a
    # verdict: a traceback and exit 1 ("not clean", "not ready") where the answer was not delivered (141).
    import os

    with open("/dev/full", "w") as disk:
        out = subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], stdout=disk, stderr=subprocess.PIPE,
                             text=True, timeout=120, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 141, out.stderr
    assert "Traceback" not in out.stderr and "output failed (No space left on device)" in out.stderr


@pytest.mark.parametrize(("scenario", "code"), [("h200", 0), ("h200-busy", 1)])
def test_ready_keeps_its_verdict_when_its_lines_cannot_be_written(scenario: str, code: int) -> None:
    # ready's answer is its exit status (`nvmlcheck ready && start`), as wait's is: the GPUs are ready (or not)
    # whether or not anyone read the lines. "Not ready" became 141 on a full disk.
    import os

    with open("/dev/full", "w") as disk:
        out = subprocess.run([sys.executable, "-m", "nvmlcheck", "--simulate", scenario, "ready"], stdout=disk,
                             stderr=subprocess.PIPE, text=True, timeout=120, check=False,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr
