"""A ``/proc`` read that never returns during ``kill --match``'s scan (``/proc/PID/cmdline`` is read under the
process's memory-map lock, which a process stuck in the driver can hold for good: ``ps`` hangs there too) ends the
command at ``--timeout`` + 1 s with exit 3 and nothing signalled. Before, the scan had no bound: the command hung
with it, whatever ``--timeout`` said. The hang is a stand-in (the read of one PID's command line sleeps), in the
command's own process, where the watchdog runs."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable

SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


def test_a_hung_proc_read_in_the_match_scan_ends_the_kill_with_nothing_signalled(
        python_child: Callable[..., subprocess.Popen[bytes]],
        hung_cmdline_cli: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    token = f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"
    target = python_child(SLEEP, token)
    stuck = python_child(SLEEP)
    out = hung_cmdline_cli(stuck.pid, "kill", "--match", token, "--yes", "--timeout", "0.5")
    assert out.returncode == 3, out.stderr
    assert "a /proc read has not returned" in out.stderr and "nothing was signalled" in out.stderr
    assert target.poll() is None and stuck.poll() is None

