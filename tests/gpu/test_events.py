"""On a real GPU: the NVML event listener starts, hears no event over a kill cycle, and stops cleanly (issue 15).

Run on a GPU host with ``pytest tests/gpu --require-gpu``. Where the driver refuses events (a container without
permission, MIG), the listener must say why instead of failing: that is checked too, and reported.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

import nvmlcheck as nc

pytestmark = pytest.mark.gpu


def _event_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvmlcheck events"]


def test_the_listener_hears_no_event_over_a_kill_cycle_and_stops() -> None:
    with nc.open("nvml") as gpus:
        listener = gpus.listen()
        print(f"events: state {listener.state}, covered {sorted(listener.covered)}, reason {listener.reason}")
        if listener.state == "unsupported":
            assert listener.reason, "an unsupported listener must say why"
            gpus.wait_until_clean(timeout=30, devices=[0], events=True)  # polls
            return
        assert listener.active and 0 in listener.covered
        thread = listener.thread
        assert thread is not None and thread.is_alive()
        holder = subprocess.Popen(
            [sys.executable, "-m", "nvmlcheck.holder", "--bytes", str(1 << 30), "--device", "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert holder.stdout is not None
        line = holder.stdout.readline()
        if not line.startswith("ready"):
            holder.kill()
            pytest.fail(f"holder did not start: {line!r}")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # NVML lists it (bounded)
            procs = gpus.snapshot(0, fields=nc.Fields.PROCESSES).devices[0].compute_processes or ()
            if any(p.pid == holder.pid for p in procs):
                break
            time.sleep(0.01)
        result = nc.kill_and_wait(gpus, [holder.pid], devices=[0], timeout=30)
        holder.wait()
        clean_ms = result.clean_ns / 1e6
        print(f"kill cycle with events: clean {clean_ms:.1f} ms after the signal; events {listener.events}")
        assert not [e for e in listener.events if e.fatal], listener.events
        assert listener.active
    assert not thread.is_alive() and listener.state == "stopped"
    assert not _event_threads()
