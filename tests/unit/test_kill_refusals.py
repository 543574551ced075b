"""What a kill never selects, found by trying it as an adversary: kernel threads (named, or inside a selector's
choice), this process's own PID namespace as a ``--container pidns:`` selector (every process it can see, as a root
cgroup), and a first signal that stops instead of ending (``--signal STOP``: the target would stay stopped, holding
its GPU). Each is refused or left alone before anything is signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import container, procfs, selectors, signals


def _stat_line(pid: int, comm: str, flags: int, ppid: int = 1, start: int = 1000) -> str:
    # /proc/PID/stat: pid (comm) state ppid pgrp session tty tpgid flags, 12 more fields, then the start time.
    return f"{pid} ({comm}) S {ppid} 0 0 0 -1 {flags} " + " ".join(["0"] * 12) + f" {start} 0 0\n"


def _fake_proc(root: Path, entries: dict[int, tuple[str, int, str]]) -> Path:
    for pid, (comm, flags, cgroup) in entries.items():
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(_stat_line(pid, comm, flags))
        (d / "cgroup").write_text(f"0::{cgroup}\n")
        (d / "cmdline").write_bytes(b"" if flags & procfs.PF_KTHREAD else comm.encode() + b"\0")
    return root


def test_read_stat_reads_the_kernel_thread_flag(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {2: ("kthreadd", 0x208040, "/"), 700: ("python3", 0x400100, "/")})
    kthread, process = procfs.read_stat(2, str(proc)), procfs.read_stat(700, str(proc))
    assert kthread is not None and process is not None
    assert procfs.is_kernel_thread(kthread) and not procfs.is_kernel_thread(process)


def test_a_selector_leaves_a_kernel_thread_alone(tmp_path: Path) -> None:
    # cgroup v1 lets a kernel thread be moved into a cgroup; a selector used to choose it like any process (and,
    # since a kernel thread ignores SIGTERM, send it SIGKILL at once).
    proc = _fake_proc(tmp_path, {
        2_000_001: ("kworker/0:1", procfs.PF_KTHREAD | 0x8040, "/job.slice"),
        2_000_002: ("python3", 0x400100, "/job.slice"),
    })
    chosen, skipped = selectors.by_container(container.parse_spec("/job.slice"), str(proc))
    assert [pid for pid, _, _ in chosen] == [2_000_002]
    assert [pid for pid, _ in skipped] == [2_000_001] and "kernel thread" in skipped[0][1]


def _a_kernel_thread() -> int | None:
    for name in sorted(os.listdir("/proc"), key=lambda n: (len(n), n)):
        if name.isdigit():
            st = procfs.read_stat(int(name))
            if st is not None and procfs.is_kernel_thread(st):
                return st.pid
    return None


def test_a_named_kernel_thread_is_refused() -> None:
    # `nvmlcheck kill 2` planned SIGKILL at once to kthreadd ("it ignores SIGTERM"), and as root sent it.
    pid = _a_kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread is visible here (a PID namespace of its own)")
    with pytest.raises(nc.KillError, match="kernel thread"):
        nc.prepare_kill([pid])


def test_this_process_s_own_pid_namespace_is_not_a_container() -> None:
    # pidns:INODE of the namespace nvmlcheck runs in selected every process it can see, kernel threads included:
    # the root cgroup under another name.
    own = procfs.pidns_inode("self")
    if own is None:
        pytest.skip("/proc/self/ns/pid cannot be read here")
    with pytest.raises(nc.ArgumentError, match="own PID namespace"):
        container.members(f"pidns:{own}")


@pytest.fixture
def sleeper(python_child: Callable[..., subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    return python_child("import time; print('ready', flush=True); time.sleep(60)")


def _state(pid: int) -> str:
    st = procfs.read_stat(pid)
    assert st is not None
    return st.state


@pytest.mark.parametrize("word", ["STOP", "SIGTSTP", str(int(signal.SIGTTIN)), "ttou"])
def test_a_stop_signal_is_a_usage_error_before_anything_is_signalled(
    sleeper: subprocess.Popen[bytes], word: str
) -> None:
    # `kill --signal STOP --grace never PID` stopped PID and left it stopped, holding its GPU (exit 1 at the timeout;
    # here, with no GPU, exit 3 after the signal). Now: exit 2, the target untouched.
    out = subprocess.run([sys.executable, "-m", "nvmlcheck", "kill", "--signal", word, "--grace", "never",
                          "--timeout", "0.3", str(sleeper.pid)], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 2, out.stderr
    assert "stops a process instead of ending it" in out.stderr
    assert _state(sleeper.pid) != "T"


def test_a_stop_signal_is_refused_by_the_library_too(sleeper: subprocess.Popen[bytes]) -> None:
    with nc.prepare_kill([sleeper.pid]) as plan, pytest.raises(nc.ArgumentError, match="stops a process"):
        plan.send_first(signal.SIGSTOP)
    assert _state(sleeper.pid) != "T" and signals.SIGSTOP in signals.STOP_SIGNALS


def test_a_thread_id_excluded_is_refused_not_ignored(python_child: Callable[..., subprocess.Popen[bytes]]) -> None:
    import uuid

    from nvmlcheck import cli

    word = f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"
    code = ("import sys, threading, time; t = threading.Thread(target=time.sleep, args=(60,)); t.start(); "
            "print('ready', flush=True); print(t.native_id, flush=True); time.sleep(60)")
    p = python_child(code, word)
    assert p.stdout is not None
    tid = int(p.stdout.readline())
    # Before, exclusion compared process IDs only: the thread's process was selected, and signalled.
    with pytest.raises(ValueError, match=f"that is a thread of process {p.pid}"):
        nc.prepare_kill(match=word, exclude=[tid])
    assert cli.main(["kill", "--match", word, "--exclude", str(tid), "--yes", "--timeout", "1"]) == 2
    assert p.poll() is None
    with pytest.raises(ValueError, match=rf"left alone: pid {p.pid}: excluded \(--exclude {p.pid}\)"):
        nc.prepare_kill(match=word, exclude=[p.pid])  # its process ID excludes it
