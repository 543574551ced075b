"""A signal's fate before it is sent (issue 23, item 1): the decision from recorded /proc/PID/status text
(tests/data/status), then real processes: one that ignores SIGTERM gets SIGKILL at once, one with a handler keeps
its grace, a --tree member that ignores it too, and a PID-namespace init seen from outside (unshare, where allowed)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import fate, procfs
from nvmlcheck._proc.fate import discarded

DATA = Path(__file__).resolve().parents[1] / "data" / "status"
TERM = signal.SIGTERM


def status(name: str) -> procfs.ProcStatus:
    return procfs.parse_status((DATA / name).read_bytes())


@pytest.mark.parametrize(("name", "sig", "words"), [
    ("ignores-term.txt", TERM, "ignores SIGTERM (SIG_IGN)"),
    ("ns-init-no-handler.txt", TERM, "PID 1 of its own PID namespace and has no SIGTERM handler"),
    ("ns-init-no-handler.txt", signal.SIGINT, None),  # it catches SIGINT
    ("ns-init-no-handler.txt", signal.SIGKILL, None),  # SIGKILL from outside always reaches it
    ("ns-init-with-handler.txt", TERM, None),  # dumb-init: a handler, so the full grace
    # systemd as a container's init: no handler, its signals blocked and read from a signalfd: pending, not
    # discarded (it used to get SIGKILL at once, and the whole container with it).
    ("ns-init-signalfd.txt", TERM, None),
    ("ns-init-signalfd.txt", signal.SIGTTIN, "PID 1 of its own PID namespace"),  # not blocked, no handler
    ("ns-worker.txt", TERM, None),  # PID 3 of the namespace: an ordinary process
    ("blocks-term.txt", TERM, None),  # blocked stays pending (sigwait, signalfd): not discarded
    ("blocks-term.txt", signal.SIGWINCH, "default action is to ignore it"),
    ("ignores-term.txt", signal.SIGKILL, None),
])
def test_the_decision_from_status_text(name: str, sig: int, words: str | None) -> None:
    why = discarded(status(name), sig)
    if words is None:
        assert why is None
    else:
        assert why is not None and words in why


def test_unknown_status_assumes_nothing() -> None:
    assert discarded(None, TERM) is None
    # This namespace's own init (NSpid a single 1) is refused by rule, never judged as a namespace init from outside.
    assert discarded(procfs.parse_status(b"NSpid:\t1\nSigCgt:\t0\nSigIgn:\t0\n"), TERM) is None


# --- real processes ------------------------------------------------------------------------------------------------

IGNORES = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
           "time.sleep(60)")
CATCHES = ("import signal, time; signal.signal(signal.SIGTERM, lambda n, f: print('term', flush=True)); "
           "print('ready', flush=True); time.sleep(60)")
# A launcher (with a handler) whose worker ignores SIGTERM: the worker is a --tree member.
LAUNCHER = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, lambda n, f: sys.exit(0)); "
            "w = subprocess.Popen([sys.executable, '-S', '-c', sys.argv[1]], stdout=subprocess.PIPE); "
            "w.stdout.readline(); print(w.pid, flush=True); time.sleep(60)")


@pytest.fixture
def spawn() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def _start(started: list[subprocess.Popen[bytes]], *argv: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen([sys.executable, "-S", *argv], stdout=subprocess.PIPE)
    started.append(p)
    return p


def _line(p: subprocess.Popen[bytes]) -> str:
    assert p.stdout is not None
    return p.stdout.readline().decode().strip()


def _exits(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether ``pid`` exits within ``timeout_s`` (a pidfd poll: the kernel says so, no sleep loop)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # gone and reaped already
    try:
        return bool(select.select([fd], [], [], timeout_s)[0])
    finally:
        os.close(fd)


def test_a_process_that_ignores_sigterm_gets_sigkill_at_once(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "-c", IGNORES)
    assert _line(p) == "ready"
    with nc.prepare_kill([p.pid]) as plan:
        plan.send_first(TERM)
        (t,) = plan.targets
    assert [s.name for s in t.signals] == ["SIGKILL"] and t.discarded is not None and "SIG_IGN" in t.discarded
    assert t.to_json()["discarded"] == t.discarded
    assert p.wait(timeout=10) == -signal.SIGKILL


def test_never_escalating_sends_the_signal_anyway_and_says_why(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "-c", IGNORES)
    assert _line(p) == "ready"
    with nc.prepare_kill([p.pid]) as plan:
        plan.send_first(TERM, sigkill_if_discarded=False)
        (t,) = plan.targets
        # What a timeout names: the SIGTERM was sent but never received, not "has not exited (SIGTERM)" alone.
        empty = nc.Snapshot("nvml", 0, 0, 0.0, nc.SystemInfo(None, None, None), (), ())
        (why,) = plan.exited_predicate().evaluate(empty).reasons
    assert [s.name for s in t.signals] == ["SIGTERM"] and t.discarded is not None
    assert f"pid {p.pid}" in why and "the kernel discards its first signal: it ignores SIGTERM (SIG_IGN)" in why
    assert p.poll() is None  # SIGTERM ignored: still running (the fixture kills it)


def test_a_handler_keeps_the_grace(spawn: list[subprocess.Popen[bytes]]) -> None:
    p = _start(spawn, "-c", CATCHES)
    assert _line(p) == "ready"
    with nc.prepare_kill([p.pid]) as plan:
        plan.send_first(TERM)
        (t,) = plan.targets
        assert _line(p) == "term"  # the handler ran: SIGTERM was delivered, not replaced
    assert [s.name for s in t.signals] == ["SIGTERM"] and t.discarded is None
    assert p.poll() is None


def test_a_tree_member_that_ignores_sigterm_gets_sigkill_at_once(spawn: list[subprocess.Popen[bytes]]) -> None:
    launcher = _start(spawn, "-c", LAUNCHER, IGNORES)
    worker = int(_line(launcher))
    try:
        with nc.prepare_kill([launcher.pid], tree=True) as plan:
            plan.send_first(TERM)
            by_pid = {t.pid: t for t in plan.targets}
        assert [s.name for s in by_pid[launcher.pid].signals] == ["SIGTERM"]
        assert by_pid[launcher.pid].discarded is None
        assert [s.name for s in by_pid[worker].signals] == ["SIGKILL"]
        assert by_pid[worker].found_by == "descendant" and "SIG_IGN" in (by_pid[worker].discarded or "")
        assert _exits(worker)
    finally:
        if not _exits(worker, 0):
            os.kill(worker, signal.SIGKILL)
            _exits(worker)
    assert launcher.wait(timeout=10) == 0


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_a_pid_namespace_init_without_a_handler_gets_sigkill_at_once(
    spawn: list[subprocess.Popen[bytes]],
) -> None:
    # unshare forks: its child is PID 1 of the new namespace and prints its host PID (NSpid's first field).
    code = "import os, time; print(open('/proc/self/status').read().split('NSpid:')[1].split()[0], flush=True); " \
           "time.sleep(60)"
    p = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-S", "-c", code],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    spawn.append(p)
    first = _line(p)
    if not first.isdigit():
        assert p.stderr is not None
        pytest.skip(f"no PID namespace here: {p.stderr.read().decode().strip()}")
    init = int(first)
    st = procfs.read_status(init)
    assert st is not None and st.nspid is not None and st.nspid[-1] == 1
    try:
        with nc.prepare_kill([p.pid], tree=True) as plan:
            plan.send_first(TERM)
            by_pid = {t.pid: t for t in plan.targets}
        assert init in by_pid and [s.name for s in by_pid[init].signals] == ["SIGKILL"]
        assert "PID 1 of its own PID namespace" in (by_pid[init].discarded or "")
        assert by_pid[p.pid].discarded is None  # unshare itself: an ordinary process of this namespace
        assert _exits(init)
    finally:
        if not _exits(init, 0):
            os.kill(init, signal.SIGKILL)
            _exits(init)


# --- a stopped target (Ctrl-Z, SIGSTOP) ------------------------------------------------------------------------------

# A server whose SIGTERM handler is its graceful shutdown: exit 0 once it ran.
SHUTS_DOWN = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda n, f: sys.exit(0)); "
              "print('ready', flush=True); time.sleep(60)")


def _stopped(p: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """``p``, once ready, after SIGSTOP, once /proc shows it stopped (``T``)."""
    assert _line(p) == "ready"
    _stop(p.pid)
    return p


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    for _ in range(10_000):
        st = procfs.read_stat(pid)
        if st is not None and st.state == "T":
            return
        select.select([], [], [], 0.001)
    raise AssertionError(f"pid {pid} was never seen stopped")


@pytest.mark.parametrize("sigkill_if_discarded", [True, False])  # False: --grace never
def test_a_stopped_target_is_resumed_after_its_first_signal(
    spawn: list[subprocess.Popen[bytes]], sigkill_if_discarded: bool
) -> None:
    # Stopped, it runs no handler: its SIGTERM stayed pending until the grace period's SIGKILL (with --grace never,
    # for good), so the shutdown it handles never ran. SIGCONT after the first signal lets it run, and says so.
    p = _stopped(_start(spawn, "-c", SHUTS_DOWN))
    with nc.prepare_kill([p.pid]) as plan:
        plan.send_first(TERM, sigkill_if_discarded=sigkill_if_discarded)
        (t,) = plan.targets
    assert [s.name for s in t.signals] == ["SIGTERM", "SIGCONT"] and t.discarded is None
    assert p.wait(timeout=10) == 0  # its handler ran: a graceful exit, no SIGKILL


def test_a_running_target_and_a_sigkill_get_no_sigcont(spawn: list[subprocess.Popen[bytes]]) -> None:
    running = _start(spawn, "-c", CATCHES)
    stopped = _stopped(_start(spawn, "-c", SHUTS_DOWN))
    assert _line(running) == "ready"
    with nc.prepare_kill([running.pid]) as plan:
        plan.send_first(TERM)
        (t,) = plan.targets
    assert [s.name for s in t.signals] == ["SIGTERM"]
    with nc.prepare_kill([stopped.pid]) as plan:
        plan.send_first(signal.SIGKILL)  # SIGKILL ends a stopped process as it is
        (t,) = plan.targets
    assert [s.name for s in t.signals] == ["SIGKILL"]
    assert stopped.wait(timeout=10) == -signal.SIGKILL


def test_a_stopped_tree_member_is_resumed(spawn: list[subprocess.Popen[bytes]]) -> None:
    launcher = _start(spawn, "-c", LAUNCHER, SHUTS_DOWN)
    worker = int(_line(launcher))
    try:
        _stop(worker)
        with nc.prepare_kill([launcher.pid], tree=True) as plan:
            plan.send_first(TERM)
            by_pid = {t.pid: t for t in plan.targets}
        assert [s.name for s in by_pid[worker].signals] == ["SIGTERM", "SIGCONT"]
        assert _exits(worker)
    finally:
        if not _exits(worker, 0):
            os.kill(worker, signal.SIGKILL)
            _exits(worker)


# tini's way (docker run --init): no handler, every signal blocked, taken with sigtimedwait; prints its host PID.
TINI = ("import signal, sys; "
        "signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.Signals) - {signal.SIGKILL, signal.SIGSTOP}); "
        "print(open('/proc/self/status').read().split('NSpid:')[1].split()[0], flush=True); "
        "sig = signal.sigwait({signal.SIGTERM, signal.SIGINT}); print('got', sig, flush=True); sys.exit(0)")


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_a_pid_namespace_init_that_takes_signals_with_sigtimedwait_keeps_its_sigterm(
    spawn: list[subprocess.Popen[bytes]],
) -> None:
    # While it waits, SigBlk does not show SIGTERM (the kernel unblocks what it waits for) and SigCgt has no handler:
    # read from /proc/PID/status alone it was "discarded", and it got SIGKILL at once, its container with it.
    p = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-S", "-c", TINI],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    spawn.append(p)
    first = _line(p)
    if not first.isdigit():
        assert p.stderr is not None
        pytest.skip(f"no PID namespace here: {p.stderr.read().decode().strip()}")
    init = int(first)
    try:
        for _ in range(10_000):  # until it sleeps in sigtimedwait
            if fate.takes_signals_synchronously(init):
                break
            select.select([], [], [], 0.001)
        assert fate.takes_signals_synchronously(init)
        with nc.prepare_kill([init]) as plan:
            plan.send_first(TERM)
            (t,) = plan.targets
        assert [s.name for s in t.signals] == ["SIGTERM"] and t.discarded is None
        assert _line(p) == "got 15"  # the SIGTERM reached it: its graceful path ran
        assert _exits(init)
    finally:
        if not _exits(init, 0):
            os.kill(init, signal.SIGKILL)
            _exits(init)


def test_a_stopped_target_without_a_handler_ends_at_its_sigterm(spawn: list[subprocess.Popen[bytes]]) -> None:
    # A stopped process takes no signal but SIGKILL: even a fatal SIGTERM stayed pending until the grace's SIGKILL.
    p = _stopped(_start(spawn, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_DFL); "
                                     "print('ready', flush=True); time.sleep(60)"))
    with nc.prepare_kill([p.pid]) as plan:
        plan.send_first(TERM)
        (t,) = plan.targets
    assert [s.name for s in t.signals] == ["SIGTERM", "SIGCONT"]
    assert p.wait(timeout=10) == -signal.SIGTERM  # ended by its SIGTERM, not a SIGKILL
