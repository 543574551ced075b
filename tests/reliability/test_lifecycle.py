"""Sessions over the life of a process: thousands of opens and closes (some failing), fork, threads, and a wait
interrupted with Ctrl-C. Sources: FACTS.md ("After fork() the child must initialise again. Init/shutdown are
reference counted by NVML")."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._nvml import library
from nvmlcheck.testing import Scenario

from ._support import FAKE_SMI, GIB, Stub, dead, sigint_default, wait_for

pytestmark = pytest.mark.stub

HERE = Path(__file__).resolve().parent


# --- init/shutdown balanced across thousands of sessions -----------------------------------------------------------
# Plain open/close: tests/stub/test_nvml_backend.py::test_many_sessions_stay_balanced (2,000 sessions). Here the
# sessions overlap, some inits fail and some sessions re-initialise after "Unknown Error".


def test_thousands_of_overlapping_sessions_with_failures_stay_balanced(stub: Stub) -> None:
    good = Scenario.h200()
    failing = Scenario.h200()
    failing.fault("nvmlInit_v2", code=999)
    stub.write(good)
    inits = stub.probe.init_total()
    keeper = stub.open()  # one long-lived session under all the others
    try:
        open_sessions: list[nc.Session] = []
        for i in range(3000):
            s = stub.open()
            s.snapshot(fields=nc.Fields.MEMORY)
            open_sessions.append(s)
            if i % 7 == 0:  # close out of order
                open_sessions.pop(len(open_sessions) // 2).close()
            if i % 500 == 499:
                for s in open_sessions:
                    s.close()
                open_sessions.clear()
        for s in open_sessions:
            s.close()
        assert stub.probe.init_refcount() == 1 and stub.probe.init_total() == inits + 1  # one init, shared
    finally:
        keeper.close()
    assert stub.balanced()
    # Inits that fail never count: 500 failed opens, then 500 that work, leave nothing behind.
    stub.write(failing)
    for _ in range(500):
        with pytest.raises(nc.Unknown):
            stub.open()
    stub.write(good)
    for _ in range(500):
        with stub.open() as s:
            s.device_count()
    assert stub.balanced() and library._loaded[str(stub.library)].refcount == 0


# --- fork after init -------------------------------------------------------------------------------------------------
# Snapshot in the child: tests/stub/test_nvml_backend.py::test_forked_child_reinitialises. Here the child waits, and
# a second inherited session that the child never uses is closed there without touching the child's count.


def test_forked_child_reinitialises_and_waits(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    sc.at_call(400).remove_process(0, 4_000_001)
    with stub.open(sc) as used, stub.open() as unused:
        used.snapshot()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: NVML state did not survive the fork; the inherited session must init again
            try:
                unused.close()  # holds no reference in the child: must not shut the child's NVML down
                result = used.wait_until_clean(timeout=10, policy=0)
                report = {"clean": result.clean, "polls": result.polls, "refcount": stub.probe.init_refcount()}
                used.close()
                report["after_close"] = stub.probe.init_refcount()
                os.write(write, json.dumps(report).encode())
            except BaseException as exc:
                os.write(write, json.dumps({"error": repr(exc)}).encode())
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            answer = json.loads(f.read())
        os.waitpid(pid, 0)
        assert answer == {"clean": True, "polls": answer.get("polls"), "refcount": 1, "after_close": 0}, answer
        assert stub.probe.init_refcount() == 1  # the parent's NVML is untouched by the child
        assert not used.snapshot().failures


# --- many threads taking snapshots at once ---------------------------------------------------------------------------
# One shared session: tests/stub/test_nvml_backend.py::test_threads_take_snapshots_concurrently; 8 x 10,000 in
# test_soak.py. Here the threads open and close their own sessions while NVML re-initialises under them.


def test_threads_survive_a_reinit_under_them(stub: Stub) -> None:
    sc = Scenario.h200(devices=2)
    sc.add_process(1, 4_000_002, used_bytes=GIB)
    stub.write(sc)
    inits = stub.probe.init_total()
    with stub.open() as shared:
        loaded = library._loaded[str(stub.library)]

        def work(n: int) -> int:
            seen = 0
            with stub.open() as own:
                for i in range(300):
                    snap = (own if i % 2 else shared).snapshot(fields=nc.Fields.WAIT)
                    assert not snap.failures, snap.failures
                    assert snap.devices[1].memory is not None and snap.devices[1].memory.used_bytes == GIB
                    if n == 0 and i % 50 == 25:
                        # As a session does after "Unknown Error": shut NVML down and initialise it under the others.
                        loaded.reinit(loaded.init_generation)
                    seen += 1
            return seen

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            assert sum(pool.map(work, range(8))) == 8 * 300
        assert stub.probe.init_refcount() == 1
        assert stub.probe.init_total() - inits >= 1 + 6  # the open, then six re-inits while the others read
    assert stub.balanced()


# --- KeyboardInterrupt during a wait ---------------------------------------------------------------------------------


def _interrupt(backend: str, env: dict[str, str], ready: str, when: Path | None = None) -> dict[str, object]:
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_interrupted_wait.py"), backend, str(FAKE_SMI)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=sigint_default,  # noqa: PLW1509 - one signal call, no locks taken
    )
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline().strip()) != ready:
            assert line, f"the waiting process ended early: {proc.stderr.read() if proc.stderr else ''}"
        if when is not None:  # the nvidia-smi run in flight has started its own child: interrupt it there
            wait_for(lambda: when.exists() and when.read_text().endswith("\n"), 10.0, "the hung nvidia-smi")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return report


def test_keyboard_interrupt_during_an_nvml_wait_leaves_nothing(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)  # never clean: only Ctrl-C ends the wait
    stub.write(sc)
    report = _interrupt("nvml", dict(os.environ), "polling")
    assert report["after"] == report["before"] and report["refcount"] == 0


def test_keyboard_interrupt_during_an_nvidia_smi_run_leaves_nothing(stub: Stub, tmp_path: Path) -> None:
    stub.write(Scenario.h200())
    pid_file = tmp_path / "hung.pid"
    env = dict(os.environ, FAKE_SMI_HANG="1", FAKE_SMI_MATCH="PIDS", FAKE_SMI_CHILD_PID_FILE=str(pid_file))
    report = _interrupt("smi", env, "open", when=pid_file)
    assert report["after"] == report["before"]  # the run in flight was killed and reaped, its pipes closed
    grandchild = int(pid_file.read_text())
    wait_for(lambda: dead(grandchild), 2.0, "the interrupted nvidia-smi's own child to die with its group")


def test_keyboard_interrupt_in_the_cli_exits_130_and_kills_nvidia_smi(stub: Stub, tmp_path: Path) -> None:
    stub.write(Scenario.h200())
    pid_file = tmp_path / "hung.pid"
    env = dict(os.environ, FAKE_SMI_HANG="1", FAKE_SMI_MATCH="PIDS", FAKE_SMI_CHILD_PID_FILE=str(pid_file))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "wait", "--backend", "smi", "--timeout", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=sigint_default,  # noqa: PLW1509 - one signal call, no locks taken
    )
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"), 20.0, "the hung nvidia-smi")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and b"interrupted" in err
    grandchild = int(pid_file.read_text())
    wait_for(lambda: dead(grandchild), 2.0, "the interrupted nvidia-smi's own child to die with its group")
