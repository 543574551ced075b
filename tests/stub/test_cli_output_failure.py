"""An output failure never changes a verdict that is not clean into 0 (issue 27, item 1): each verdict-printing
command, run as the ``nvmlcheck`` script on an 8-GPU simulated document (larger than a pipe's buffer), with stdout a
pipe whose reader is gone (as in ``| head -c 200``) or a full disk (``/dev/full``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nvmlcheck.cli._common import EXIT_OUTPUT_FAILED
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

GIB = 1 << 30


@pytest.fixture(scope="module")
def busy8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight H200s, each held by a process that never lets go."""
    sc = Scenario.h200(devices=8)
    for i in range(8):
        sc.add_process(i, 4_000_000 + i, used_bytes=16 * GIB)
    return sc.write(tmp_path_factory.mktemp("busy8") / "scenario.txt")


@pytest.fixture(scope="module")
def idle8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Scenario.h200(devices=8).write(tmp_path_factory.mktemp("idle8") / "scenario.txt")


@pytest.fixture
def victim() -> Iterator[subprocess.Popen[bytes]]:
    """A process for ``kill`` to end (reaped whatever happens)."""
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _run_closed_reader(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``nvmlcheck argv`` with stdout a pipe whose read end is closed before it writes a byte."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], stdout=write_end, stderr=subprocess.PIPE,
                              timeout=60, check=False)
    finally:
        os.close(write_end)


def _run_full_disk(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    with open("/dev/full", "wb") as full:
        return subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], stdout=full, stderr=subprocess.PIPE,
                              timeout=60, check=False)


NOT_CLEAN = [
    ["--json", "wait", "--timeout", "0.2"],
    ["wait", "--timeout", "0.2"],
    ["--json", "select", "--count", "8", "--wait", "0.2"],
    ["--json", "kill", "--timeout", "0.5", "--grace", "0.1", "--yes"],  # the victim's PID appended
]


@pytest.mark.parametrize("runner", [_run_closed_reader, _run_full_disk], ids=["reader-gone", "disk-full"])
@pytest.mark.parametrize("argv", NOT_CLEAN, ids=lambda a: " ".join(a[:3]))
def test_a_verdict_that_is_not_clean_survives_an_output_failure(
    busy8: Path, victim: subprocess.Popen[bytes],
    runner: Callable[[list[str]], subprocess.CompletedProcess[bytes]], argv: list[str],
) -> None:
    if "kill" in argv:
        argv = [*argv, str(victim.pid)]
    proc = runner([f"--simulate={busy8}", *argv])
    assert proc.returncode == 1, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr


CLEAN = [
    (["--json", "wait", "--timeout", "5"], 0),
    (["--json", "kill", "--timeout", "10", "--yes"], 0),  # the victim's PID appended
    # The answer is the output: unread, it was not given.
    (["--json", "select", "--count", "8", "--wait", "5"], EXIT_OUTPUT_FAILED),
    (["--json", "snapshot"], EXIT_OUTPUT_FAILED),
    (["--json", "holders"], EXIT_OUTPUT_FAILED),
    (["select", "--count", "8", "--wait", "5", "--format", "index"], EXIT_OUTPUT_FAILED),
]


@pytest.mark.parametrize(("argv", "code"), CLEAN, ids=lambda a: " ".join(a[:2]) if isinstance(a, list) else str(a))
def test_a_clean_verdict_with_the_reader_gone_is_0_only_where_the_answer_is_not_the_output(
    idle8: Path, victim: subprocess.Popen[bytes], argv: list[str], code: int
) -> None:
    if "kill" in argv:
        argv = [*argv, str(victim.pid)]
    proc = _run_closed_reader([f"--simulate={idle8}", *argv])
    assert proc.returncode == code, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr
    assert b"output failed" in proc.stderr


def test_a_snapshot_with_an_unreadable_gpu_keeps_exit_3_when_output_fails(tmp_path: Path) -> None:
    sc = Scenario.h200(devices=8)
    sc.fault("nvmlDeviceGetMemoryInfo_v2", 15, device=3)  # NVML_ERROR_GPU_IS_LOST
    proc = _run_closed_reader([f"--simulate={sc.write(tmp_path / 'sc.txt')}", "--json", "snapshot"])
    assert proc.returncode == 3, proc.stderr.decode()


@pytest.mark.parametrize(("declared", "code"), [("verdict(1)", 1), ("verdict(0)", 0),
                                                ("verdict(0, answer_is_output=True)", EXIT_OUTPUT_FAILED),
                                                ("None", EXIT_OUTPUT_FAILED)])
def test_the_fast_exit_keeps_the_verdict_when_the_last_flush_fails(declared: str, code: int) -> None:
    # As the script ends (os._exit after a flush): the text is still in the buffer when the flush meets the pipe.
    source = ("from nvmlcheck.cli import _common as c\n"
              f"c.FAST_EXIT = True\n{'' if declared == 'None' else 'c.' + declared}\n"
              "print('GPU-0')\nc.verdict_printed(0)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # the print must stay in the buffer
    write_end = _closed_pipe_fd()
    try:
        proc = subprocess.run([sys.executable, "-c", source], stdout=write_end, stderr=subprocess.PIPE, env=env,
                              timeout=60, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == code, proc.stderr.decode()
    assert b"Traceback" not in proc.stderr and b"output failed" in proc.stderr


def _closed_pipe_fd() -> int:
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end
