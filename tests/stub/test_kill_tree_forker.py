"""``kill --tree`` against a launcher that forks a worker every 2 ms and ignores SIGTERM (issue 27, item 10): the
tree is stopped (SIGSTOP, rescan until no new member) before its SIGKILL, so no worker forked in the last instant
survives a kill that reports clean, and nothing is left stopped. A mechanism test: bounded, and the whole session is
SIGKILLed afterwards whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

# Forks a sleeping worker every 2 ms (at most 4,000, for at most 30 s); SIGTERM is ignored by it and its workers:
# SIG_IGN ("ignore": the kill sends SIGKILL at once, the kernel would discard SIGTERM) or a handler that carries on
# ("handler": SIGKILL comes at the grace period's end).
FORKER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN if sys.argv[1] == "ignore" else (lambda *a: None))
print("ready", flush=True)
end = time.monotonic() + 30
for _ in range(4000):
    if time.monotonic() > end:
        break
    if os.fork() == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(0.002)
time.sleep(60)
"""


def _session_members(sid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process in session ``sid`` (field 6 of /proc/PID/stat)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            out.append((int(name), fields[0].decode()))
    return out


@pytest.fixture(params=["ignore", "handler"])
def forker(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[bytes]]:
    p = subprocess.Popen([sys.executable, "-S", "-c", FORKER, request.param], stdout=subprocess.PIPE,
                         start_new_session=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)  # every worker too: fork keeps the process group
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


@pytest.mark.parametrize("run", range(3))
def test_a_fast_forking_tree_is_killed_whole_and_nothing_stays_stopped(
    forker: subprocess.Popen[bytes], gpus: Callable[[Scenario], nc.Session], run: int
) -> None:
    with gpus(Scenario.h200()) as session:
        plan = nc.prepare_kill([forker.pid], tree=True)
        plan.send_first(signal.SIGTERM)
        result = plan.wait(session, timeout=30, grace_s=0.2)
    assert result.clean_ns is not None
    forker.wait(timeout=10)  # reap the launcher: its workers go to init, zombies reaped there
    alive = [(pid, state) for pid, state in _session_members(forker.pid) if state not in ("Z", "X")]
    assert alive == [], f"{len(alive)} workers survived a kill that reported clean: {alive[:5]}"
    assert len(result.pids) > 1  # workers were found and killed with the launcher
    assert all(s.name in ("SIGTERM", "SIGKILL") for t in result.pids for s in t.signals)  # STOP/CONT not recorded
