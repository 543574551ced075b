"""A ``/proc`` read that never returns during ``kill --match``'s scan (``/proc/PID/cmdline`` is read under the
process's memory-map lock, which a process stuck in the driver can hold for good: ``ps`` hangs there too) ends the
command at ``--timeout`` + 1 s with exit 3 and nothing signalled. Before, the scan had no bound: the command hung
with it, whatever ``--timeout`` said. The hang is a stand-in (the read of one PID's command line sleeps), in the
command's own process, where the watchdog runs."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"
COMMAND = """
import sys, time
token, stuck = sys.argv[1], int(sys.argv[2])
from nvmlcheck._proc import procfs
real = procfs.cmdline
def cmdline(pid, proc="/proc"):
    if pid == stuck:
        time.sleep(3600)
    return real(pid, proc)
procfs.cmdline = cmdline
sys.argv = ["nvmlcheck", "kill", "--match", token, "--yes", "--timeout", "0.5"]
from nvmlcheck import cli
cli.script()
"""


def test_a_hung_proc_read_in_the_match_scan_ends_the_kill_with_nothing_signalled(
        python_child: Callable[..., subprocess.Popen[bytes]]) -> None:
    token = f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"
    target = python_child(SLEEP, token)
    stuck = python_child(SLEEP)
    out = subprocess.run([sys.executable, "-c", COMMAND, token, str(stuck.pid)], capture_output=True, text=True,
                         timeout=60, check=False, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode == 3, out.stderr
    assert "a /proc read has not returned" in out.stderr and "nothing was signalled" in out.stderr
    assert target.poll() is None and stuck.poll() is None

