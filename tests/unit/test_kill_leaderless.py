"""A process whose main thread exited while another thread lives on reads ``Z`` in ``/proc/PID/stat``: it is no
zombie. ``--container``/``--cgroup`` left it alone as "a zombie: it has exited already", though it ran (and could
hold a GPU) and a signal ends it. Now it is chosen; a true zombie still is not."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from collections.abc import Iterator

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import procfs, selectors

# Starts a thread that sleeps, says ready, then ends its main thread alone (pthread_exit): stat reads Z.
LEADERLESS = ("import ctypes, threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
              "print('ready', flush=True); ctypes.CDLL(None).pthread_exit(None)")


def _until_z(pid: int) -> procfs.ProcStat:
    """``pid``'s stat once it reads ``Z``. Polled until then (30 s at most, a failure): a fixed number of reads (10,000,
    ~0.1 s) was not always enough on a loaded CI host for the child's main thread to end after saying ready."""
    import time

    end = time.monotonic() + 30
    while True:
        st = procfs.read_stat(pid)
        if st is not None and st.state == "Z":
            return st
        if time.monotonic() > end:
            pytest.fail(f"pid {pid} never read Z: {st}")
        time.sleep(0.001)


@pytest.fixture
def leaderless() -> Iterator[int]:
    p = subprocess.Popen([sys.executable, "-S", "-c", LEADERLESS], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    _until_z(p.pid)  # until the main thread has exited
    yield p.pid
    p.kill()
    p.wait()
    p.stdout.close()


@pytest.fixture
def zombie() -> Iterator[int]:
    p = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    _until_z(p.pid)  # exited, not reaped: a zombie
    yield p.pid
    p.wait()


def test_a_process_whose_main_thread_exited_is_chosen(
    monkeypatch: pytest.MonkeyPatch, leaderless: int, zombie: int
) -> None:
    st = procfs.read_stat(leaderless)
    zst = procfs.read_stat(zombie)
    assert st is not None and st.state == "Z" and zst is not None and zst.state == "Z"
    members = [(leaderless, st.start_ticks), (zombie, zst.start_ticks)]
    monkeypatch.setattr("nvmlcheck._proc.container.members", lambda spec, proc="/proc", doubtful=None: members)
    chosen, skipped = selectors.by_container("lxc/test")
    assert chosen == [(leaderless, st.start_ticks, "container")]
    assert skipped == [(zombie, "a zombie: it has exited already; its parent has to reap it")]


def test_it_is_pinned_alive_and_its_sigterm_ends_it(monkeypatch: pytest.MonkeyPatch, leaderless: int) -> None:
    st = procfs.read_stat(leaderless)
    assert st is not None
    monkeypatch.setattr("nvmlcheck._proc.container.members",
                        lambda spec, proc="/proc", doubtful=None: [(leaderless, st.start_ticks)])
    with nc.prepare_kill(container="lxc/test") as plan:
        assert [t.pid for t in plan.targets] == [leaderless] and not plan._set.all_exited()  # the pidfd: alive
        plan.send_first()
        (t,) = plan.targets
        assert [s.name for s in t.signals] == ["SIGTERM"]
    fd = os.pidfd_open(leaderless)
    try:
        assert select.select([fd], [], [], 10)[0]  # its live thread took the SIGTERM: the process ended
    finally:
        os.close(fd)


# As LEADERLESS, holding a file open first: the device file a GPU process would hold.
HOLDING = ("import ctypes, sys, threading, time; f = open(sys.argv[1]); "
           "threading.Thread(target=time.sleep, args=(60,)).start(); "
           "print('ready', flush=True); ctypes.CDLL(None).pthread_exit(None)")


def test_a_process_whose_main_thread_exited_is_no_zombie_to_holders_and_its_files_are_seen(
    tmp_path: object, zombie: int
) -> None:
    # holders and ready called it a zombie (left alone by --all-holders, "stuck" in ready), and the device-file
    # scan read /proc/PID/fd, which lists nothing once the main thread is gone: the holder was missed.
    from pathlib import Path

    from nvmlcheck import holders
    from nvmlcheck._proc import devfiles

    stand_in = Path(str(tmp_path)) / "nvidia0"
    stand_in.write_text("")
    p = subprocess.Popen([sys.executable, "-S", "-c", HOLDING, str(stand_in)], stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        st = _until_z(p.pid)
        assert procfs.state_of(st) in ("S", "R")  # its other thread's
        zst = procfs.read_stat(zombie)
        assert zst is not None and procfs.state_of(zst) == "Z"  # a true zombie stays one
        assert holders.describe_process(p.pid, found_by=frozenset({"nvml"})).state in ("sleeping", "running")
        assert devfiles.open_device_files(p.pid, [str(stand_in)]) == (str(stand_in),)
        assert p.pid in devfiles.scan([str(stand_in)]).holders
    finally:
        p.kill()
        p.wait()
        p.stdout.close() if p.stdout else None


def test_an_exclusion_pattern_that_cannot_be_checked_leaves_it_alone(leaderless: int, zombie: int) -> None:
    # Its command line reads empty: --exclude PATTERN could not match it, and --all-holders (or a selector, or
    # --tree) signalled it, though it may be the very agent the pattern names.
    from nvmlcheck._proc.targets import Refused, prepare

    assert procfs.cmdline(leaderless) == ()
    exclusion = selectors.check_exclude(["some-agent"])
    why = exclusion.why(leaderless)
    assert why is not None and "command line cannot be read" in why and "--exclude 'some-agent'" in why
    kept, excluded = exclusion.split([(leaderless, 0, "container")])
    assert kept == [] and [pid for pid, _ in excluded] == [leaderless]
    assert exclusion.why(os.getpid()) is None  # a command line that can be read and does not match: not excluded
    assert selectors.check_exclude(["pytest|python"]).why(os.getpid()) == "excluded (--exclude 'pytest|python')"
    assert selectors.check_exclude([leaderless]).why(leaderless) == f"excluded (--exclude {leaderless})"
    # Named, it is refused with the reason (nothing signalled), not called "named and excluded".
    with pytest.raises(Refused, match="it is named, but its command line cannot be read"):
        prepare([leaderless], exclude=exclusion.why)


def test_all_holders_less_excluded_reads_each_command_line_once() -> None:
    # Read twice, a command line that changed in between (a process that rewrites its own) put a holder both among
    # the targets and among those left alone as excluded.
    from nvmlcheck.cli._kill import _less_excluded
    from nvmlcheck.holders import Holder, KillSelection

    def holder(pid: int) -> Holder:
        return Holder(pid=pid, found_by=frozenset({"device-file"}), gpus=(), name="x", state="sleeping", uid=0,
                      user="root", cmdline=("x",), nspid=(pid,), ancestry=(1,), device_files=("/dev/nvidia0",),
                      is_daemon=False, relation=None, start_ticks=1)

    class Flipping(selectors.Exclusion):
        calls = 0

        def why(self, pid: int) -> str | None:
            type(self).calls += 1
            return "excluded (--exclude 'x')" if type(self).calls % 2 == 0 else None

    out = _less_excluded(KillSelection((holder(4_000_001),), ()), Flipping(frozenset({9})))
    listed = [h.pid for h in out.targets] + [h.pid for h, _ in out.skipped]
    assert listed == [4_000_001] and Flipping.calls == 1
