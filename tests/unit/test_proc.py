"""Validation and pinned identity, with real processes and no NVML: what prepare_kill refuses, and that a signal never
reaches a process that took a target's PID (forced through ``ns_last_pid`` in a new PID namespace)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import procfs
from nvmlcheck._proc.pin import Pinned

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


# --- refused before anything is signalled -------------------------------------------------------------------------


@pytest.mark.parametrize("pid", [0, -1, -4000, 1, 2**31, 2**63, 2**70])
def test_impossible_pids_are_refused_with_a_plain_message(pid: int) -> None:
    with pytest.raises(nc.KillError) as info:
        nc.prepare_kill([pid])
    assert info.value.pid == pid
    text = str(info.value)
    assert "pids_gone" not in text and "Overflow" not in text
    assert ("process group" in text) if pid <= 0 else ("init" in text) if pid == 1 else ("pid_max" in text)


def test_pid_max_is_the_bound() -> None:
    limit = procfs.pid_max()
    with pytest.raises(nc.KillError, match="pid_max"):
        nc.prepare_kill([limit])


@pytest.mark.parametrize("pid", [True, False, 3.0, "123", None])
def test_non_int_pids_are_a_type_error(pid: object) -> None:
    with pytest.raises(TypeError, match="a PID is an int"):
        nc.prepare_kill([pid])  # type: ignore[list-item]


def test_no_pid_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="no PID"):
        nc.prepare_kill([])


def test_self_parent_and_every_ancestor_are_refused() -> None:
    lineage = procfs.ancestors()
    assert lineage and lineage[0] == os.getppid()
    with pytest.raises(nc.KillError, match="this process"):
        nc.prepare_kill([os.getpid()])
    for n, pid in enumerate(lineage):
        if pid == 1:
            continue  # refused as init
        with pytest.raises(nc.KillError) as info:
            nc.prepare_kill([pid])
        assert ("parent" if n == 0 else "grandparent" if n == 1 else "ancestor") in info.value.reason


def test_an_ancestor_in_a_subprocess_chain_is_refused() -> None:
    """`nvmlcheck kill $$ | tail`, under `timeout`: the shell two levels up is refused, not only the parent."""
    code = textwrap.dedent(
        """
        import os, sys
        import nvmlcheck as nc
        grandparent = int(sys.argv[1])
        try:
            nc.prepare_kill([grandparent])
        except nc.KillError as exc:
            print("refused:", exc.reason)
        """
    )
    # python -> timeout -> sh ($$); "; true" keeps sh from exec'ing timeout.
    shell = f'timeout 20 {sys.executable} -c "$0" $$; true'
    out = subprocess.run(["sh", "-c", shell, code], capture_output=True, text=True,
                         env=os.environ | {"PYTHONPATH": str(ROOT)}, check=True)
    assert "refused: that is this process's grandparent" in out.stdout, out.stderr


def test_a_thread_id_is_refused() -> None:
    import threading

    ready = threading.Event()
    done = threading.Event()
    tid: list[int] = []

    def run() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    t = threading.Thread(target=run)
    t.start()
    try:
        ready.wait(10)
        with pytest.raises(nc.KillError, match="thread"):
            nc.prepare_kill([tid[0]])
    finally:
        done.set()
        t.join()


def test_all_or_nothing(sleeper: subprocess.Popen[bytes]) -> None:
    with pytest.raises(nc.KillError, match="ESRCH"):
        nc.prepare_kill([sleeper.pid, procfs.pid_max() - 1 if not os.path.exists(f"/proc/{procfs.pid_max() - 1}")
                         else 2**22 - 1])
    assert sleeper.poll() is None


@pytest.mark.parametrize("grace", [math.nan, -1.0, True])
def test_bad_grace_is_refused_before_any_signal(grace: float, sleeper: subprocess.Popen[bytes]) -> None:
    with nc.prepare_kill([sleeper.pid]) as plan:
        plan.send_first(signal.SIGCONT)  # harmless
        with pytest.raises(ValueError, match="grace_s"):
            plan.wait(None, grace_s=grace)  # type: ignore[arg-type]


# --- pinned identity -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["pidfd", "start-time"])
def test_pinned_sees_exit_without_reaping(mode: str) -> None:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    pin = Pinned.open(child.pid, mode=mode)  # type: ignore[arg-type]
    try:
        assert pin.mode == mode and not pin.exited()
        assert pin.send(signal.SIGTERM)
        deadline_polls = 0
        while not pin.exited():
            deadline_polls += 1
            assert deadline_polls < 100_000, "the child never exited"
            os.sched_yield()
        assert procfs.read_stat(child.pid) is not None  # a zombie: nothing reaped it
        assert not pin.send(signal.SIGKILL)  # exited: nothing is sent
    finally:
        pin.close()
    assert child.wait() == -signal.SIGTERM  # the caller still reads its child's status


def test_zombie_counts_as_exited_and_is_pinned() -> None:
    child = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    while (st := procfs.read_stat(child.pid)) is not None and st.state != "Z":
        os.sched_yield()
    with nc.prepare_kill([child.pid]) as plan:
        plan.send_first()
        assert plan.targets[0].signals == ()  # nothing sent to a process that has exited
    assert child.wait() == 0


# The script runs as PID 1 of a new PID namespace: it pins a child that survives SIGTERM, sends SIGTERM, kills and
# reaps the child itself, makes the kernel hand the same PID to an impostor (ns_last_pid), then asks the plan to
# escalate. The impostor reports every signal it receives.
_REUSE = """
import json, os, signal, subprocess, sys, time
import nvmlcheck as nc
from nvmlcheck._proc import procfs

mode = sys.argv[1]
# A handler that does nothing (not SIG_IGN: a kill sends SIGKILL at once to a process that ignores SIGTERM).
IGNORE = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda n, f: None); "
          "print('ready', flush=True); time.sleep(60)")
target = subprocess.Popen([sys.executable, "-S", "-c", IGNORE], stdout=subprocess.PIPE)
assert target.stdout.readline() == b"ready\\n"
plan = nc.prepare_kill([target.pid], pinning=mode)
plan.send_first(signal.SIGTERM)
start = procfs.read_stat(target.pid).start_ticks
target.kill()
target.wait()  # the PID is free again
# The start-time fallback tells processes apart by their start tick: let the tick move on (a mechanism, not a
# duration under test).
tick = os.sysconf("SC_CLK_TCK")
while int(time.clock_gettime(time.CLOCK_BOOTTIME) * tick) <= start + 1:
    time.sleep(0.002)
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(target.pid - 1))
REPORT = ("import signal, sys, time\\n"
          "for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):\\n"
          "    signal.signal(s, lambda n, f: (print('got', n, flush=True)))\\n"
          "print('ready', flush=True)\\n"
          "sys.stdin.read()\\n")
impostor = subprocess.Popen([sys.executable, "-S", "-c", REPORT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
assert impostor.stdout.readline() == b"ready\\n"
same_pid = impostor.pid == target.pid
escalated = plan.escalate(signal.SIGKILL)
sent_term = plan.escalate(signal.SIGTERM)
record = plan.targets[0]
plan.close()
impostor.stdin.close()
rest = impostor.stdout.read().decode()
code = impostor.wait()
print(json.dumps({"same_pid": same_pid, "escalated": list(escalated), "sent_term": list(sent_term),
                  "impostor_exit": code, "impostor_output": rest, "pinning": record.pinning,
                  "signals": [s.name for s in record.signals]}))
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
@pytest.mark.parametrize("mode", ["pidfd", "start-time"])
def test_recycled_pid_is_never_signalled(mode: str, tmp_path: Path) -> None:
    script = tmp_path / "reuse.py"
    script.write_text(_REUSE)
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script), mode],
        check=False, capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0 and "unshare" in out.stderr and "Operation not permitted" in out.stderr:
        pytest.skip(f"no PID namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["same_pid"], "the kernel did not recycle the PID; the test proves nothing"
    assert report["pinning"] == mode
    assert report["escalated"] == [] and report["sent_term"] == []
    assert report["impostor_exit"] == 0 and "got" not in report["impostor_output"]
    assert report["signals"] == ["SIGTERM"]  # the first one, to the real target


def test_pids_gone_message_names_no_internal_function() -> None:
    with pytest.raises(ValueError) as info:
        nc.pids_gone([0])
    assert "pids_gone()" not in str(info.value) and "positive" in str(info.value)


def test_stat_parses_a_command_name_with_parentheses_and_spaces() -> None:
    code = "open('/proc/self/comm', 'w').write('a) b (c'); print('ready', flush=True); input()"
    child = subprocess.Popen([sys.executable, "-S", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        st = procfs.read_stat(child.pid)
        assert st is not None and st.comm == "a) b (c" and st.ppid == os.getpid() and st.state in ("S", "R")
        status = procfs.read_status(child.pid)
        assert status is not None and status.tgid == child.pid and status.nspid and status.nspid[-1] == child.pid
    finally:
        child.kill()
        child.wait()


def test_kill_timeout_pickles_with_its_records() -> None:
    import pickle

    rec = nc.PidTimes(123, "named", "python3", (nc.SignalSent("SIGTERM", 0),), None, None)
    exc = nc.KillTimeout(1.0, 10, ["pid 123 (python3) has not exited"], pids=[rec], tree_hint=[(456, 123)])
    back = pickle.loads(pickle.dumps(exc))
    assert isinstance(back, nc.KillTimeout) and isinstance(back, nc.WaitTimeout)
    assert back.pids == (rec,) and back.tree_hint == ((456, 123),) and str(back) == str(exc)
    assert back.to_json()["tree_hint"] == [{"pid": 456, "descends_from": 123}]


# Run in a PID namespace whose procfs was not mounted (`unshare --pid --fork` without --mount-proc): /proc is the
# host's. The parent names a host PID (as `ps` shows it there) and the script makes the kernel give a process of its
# own namespace that number (ns_last_pid). Before, the kill read the host process (its name, state, start time) and
# signalled the namespace's process of the same number: one it had never read.
_FOREIGN_PROC = """
import json, signal, subprocess, sys
import nvmlcheck as nc

meant = int(sys.argv[1])
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(meant - 1))
other = subprocess.Popen(["sleep", "60"])
try:
    with nc.prepare_kill([meant], pinning=sys.argv[2]) as plan:
        plan.send_first(signal.SIGTERM)
    refused = None
except nc.KillError as exc:
    refused = str(exc)
alive = other.poll() is None
other.kill()
other.wait()
print(json.dumps({"same_pid": other.pid == meant, "refused": refused, "other_alive": alive}))
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
@pytest.mark.parametrize("mode", ["pidfd", "start-time"])
def test_a_procfs_of_another_pid_namespace_refuses_the_kill(
        mode: str, tmp_path: Path, python_child: Callable[..., subprocess.Popen[bytes]]) -> None:
    meant = python_child("import time; print('ready', flush=True); time.sleep(60)")
    script = tmp_path / "foreign.py"
    script.write_text(_FOREIGN_PROC)
    out = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, str(script), str(meant.pid), mode],
        check=False, capture_output=True, text=True, timeout=60, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0 and "unshare" in out.stderr and "Operation not permitted" in out.stderr:
        pytest.skip(f"no PID namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["same_pid"], "the kernel did not give the namespace's process that PID; the test proves nothing"
    assert report["other_alive"], "a process the kill never read was signalled"
    assert "procfs of another PID namespace" in report["refused"] and "nothing was signalled" in report["refused"]
    assert meant.poll() is None


def test_foreign_numbering_reads_proc_self(tmp_path: Path) -> None:
    assert procfs.foreign_numbering() is None  # this test's own /proc
    (tmp_path / "self").symlink_to(str(os.getpid() + 1))
    assert "calls this process" in (procfs.foreign_numbering(str(tmp_path)) or "")
    assert "cannot be read" in (procfs.foreign_numbering(str(tmp_path / "none")) or "")
