"""nvmlcheck.hosts against hostile or absurd input, without sshd: a fake ``ssh`` program stands for the connection
(issue 27: item 6, the ssh part of item 2, item 10's connect timeout and SIGKILL cleanup).

Nothing here asserts a duration; waits are for events (a process gone), capped only against a hang.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck import cli, hosts
from nvmlcheck._proc.child import Child
from nvmlcheck.hosts import Fleet, Host, RemoteError, hosts_file_lines, read_hosts_file

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT_DOC = json.dumps({"schema": "nvmlcheck/snapshot", "version": 1, "devices": [], "failures": []})


def _fake_ssh(directory: Path, body: str) -> str:
    """An executable standing for ssh: ``body`` is Python run with the ssh arguments in ``sys.argv``."""
    script = directory / "fake-ssh"
    script.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n", encoding="utf-8")
    script.chmod(0o755)
    return str(script)


def _guards(marker: str) -> list[int]:
    """The guard processes still running whose command line names ``marker`` (their ssh program)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "guard.py" in cmdline and marker in cmdline and not _gone_within(int(entry), 0):
            found.append(int(entry))
    return found


def _gone_within(pid: int, cap_s: float = 30.0) -> bool:
    end = time.monotonic() + cap_s
    while True:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


# --- bounded output ----------------------------------------------------------------------------------------------


def test_a_child_keeps_at_most_its_bound_and_says_which_pipe() -> None:
    flood = "import sys\nwhile True: sys.stdout.buffer.write(b'x' * 65536)"
    child = Child([sys.executable, "-S", "-c", flood], max_output_bytes=1 << 20)
    try:
        assert child.wait(time.monotonic_ns() + int(60e9)) is False  # given up at the bound, not the deadline
        assert child.overflow == "stdout" and len(child.stdout) == 1 << 20
    finally:
        assert child.kill()
    assert len(child.stdout) == 1 << 20  # what came while it was killed was dropped


def test_a_flooding_host_fails_with_output_over_the_bound(tmp_path: Path) -> None:
    ssh = _fake_ssh(tmp_path, "while True: sys.stdout.buffer.write(b'{' * 65536)")  # a hostile host: endless output
    with Fleet(ssh=ssh, control_master=False, max_output_bytes=1 << 20) as fleet:
        (result,) = fleet.run(["gpu01"], ["snapshot"], deadline_s=60.0)
    assert isinstance(result.error, RemoteError) and result.verdict == "failed"
    assert f"output over {1 << 20} bytes on its stdout" in result.error.message


def test_the_default_bound_is_a_few_mib() -> None:
    assert Fleet().max_output_bytes == hosts.MAX_OUTPUT_BYTES == 4 << 20
    with pytest.raises(ValueError, match="max_output_bytes"):
        Fleet(max_output_bytes=0)


def test_what_ssh_leaves_in_its_group_after_answering_is_killed(tmp_path: Path) -> None:
    # A helper left in the ssh client's process group (a ProxyCommand that outlives its client, say) ends with the
    # run, as the Slurm gate's scontrol's does; a ControlMaster is in a session of its own and is not reached.
    pid_file = tmp_path / "stray.pid"
    ssh = _fake_ssh(tmp_path, "import subprocess\n"
                              "p = subprocess.Popen(['sleep', '300'], stdout=subprocess.DEVNULL, "
                              "stderr=subprocess.DEVNULL)\n"
                              f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
                              f"print({SNAPSHOT_DOC!r})")
    try:
        with Fleet(ssh=ssh, control_master=False) as fleet:
            (result,) = fleet.run(["gpu01"], ["snapshot"], deadline_s=60.0)
        assert result.error is None and result.verdict == "clean"
        assert _gone_within(int(pid_file.read_text())), "what ssh left in its group outlived its run"
    finally:
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


# --- hosts files ---------------------------------------------------------------------------------------------------


def test_a_device_is_not_read_as_a_hosts_file() -> None:
    with pytest.raises(ValueError, match="/dev/zero is a device"):
        read_hosts_file("/dev/zero")


def test_a_hosts_file_is_bounded_and_text(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"gpu01\n" * (hosts.HOSTS_FILE_MAX_BYTES // 6 + 1))
    with pytest.raises(ValueError, match="larger than"):
        read_hosts_file(big)
    binary = tmp_path / "binary"
    binary.write_bytes(b"gpu01\ngpu02\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"binary:3: not UTF-8"):
        read_hosts_file(binary)
    with pytest.raises(IsADirectoryError):  # the CLI's usage error says "Is a directory"
        read_hosts_file(tmp_path)


def test_a_pipe_is_a_hosts_file() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"gpu01\ngpu02 # two\n")
    os.close(write_end)
    try:
        assert read_hosts_file(f"/proc/self/fd/{read_end}") == ["gpu01", "gpu02"]  # what <(...) gives
    finally:
        os.close(read_end)


@pytest.mark.parametrize("json_mode", [False, True])
def test_cli_hosts_file_dev_zero_is_a_usage_error(json_mode: bool, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main([*(["--json"] if json_mode else []), "wait", "--hosts-file", "/dev/zero"])
    out, err = capsys.readouterr()
    assert code == 2
    if json_mode:
        doc = json.loads(out)
        assert doc["schema"] == "nvmlcheck/error" and "/dev/zero is a device" in doc["error"]["message"]
    else:
        assert "/dev/zero is a device" in err


# --- ssh options only from an explicit argument ------------------------------------------------------------------


def test_the_environment_does_not_change_what_ssh_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_SSH_OPTIONS", "-o ProxyCommand=evil -F /tmp/evil")
    argv = Fleet(control_master=False).ssh_argv(Host("gpu01"))
    assert "ProxyCommand=evil" not in argv and "/tmp/evil" not in argv
    explicit = Fleet(control_master=False, ssh_options="-F /etc/lab").ssh_argv(Host("gpu01"))
    assert explicit[explicit.index("-F") + 1] == "/etc/lab"


def test_cli_ssh_options_are_an_option_and_the_old_variable_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = tmp_path / "argv.json"
    ssh = _fake_ssh(tmp_path, f"open({str(seen)!r}, 'w').write(__import__('json').dumps(sys.argv[1:]))\n"
                              f"print({SNAPSHOT_DOC!r})")
    monkeypatch.setenv("NVMLCHECK_SSH_OPTIONS", "-o ProxyCommand=evil")
    monkeypatch.setattr(hosts, "Fleet", functools.partial(Fleet, ssh=ssh))  # what the CLI makes, with the fake ssh
    code = cli.main(["snapshot", "--host", "gpu01", "--ssh-options", "-F /etc/lab_config"])
    _, err = capsys.readouterr()
    assert code == 0, err
    argv = json.loads(seen.read_text())
    assert argv[argv.index("-F") + 1] == "/etc/lab_config" and "ProxyCommand=evil" not in " ".join(argv)
    assert "NVMLCHECK_SSH_OPTIONS is no longer read" in err


# --- absurd timeouts -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1e308", "86401"])
def test_an_absurd_connect_timeout_is_a_usage_error(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--json", "wait", "--host", "gpu01", "--connect-timeout", value])
    out, _ = capsys.readouterr()
    message = json.loads(out)["error"]["message"]
    assert code == 2 and "--connect-timeout" in message and "at most" in message, message
    with pytest.raises(ValueError, match="connect_timeout_s"):
        Fleet(connect_timeout_s=float(value))


def test_a_command_timeout_of_1e308_is_no_deadline_not_an_internal_error(tmp_path: Path) -> None:
    ssh = _fake_ssh(tmp_path, f"print({SNAPSHOT_DOC!r})")
    with Fleet(ssh=ssh, control_master=False) as fleet:
        (result,) = fleet.run(["gpu01"], ["snapshot"], timeout_s=1e308)
    assert result.error is None and result.verdict == "clean"


# --- killed without a chance to clean up -------------------------------------------------------------------------


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary directory of its own for control directories (short: socket paths are limited)."""
    import shutil

    path = Path(tempfile.mkdtemp(prefix="nc"))
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_sigkilled_fleet_leaves_no_ssh_and_no_directory(tmp_path: Path, short_tmp: Path) -> None:
    pid_file = tmp_path / "ssh.pid"
    # The ssh "connection" outlives its parent (its own session), as a real ssh client waiting on a remote wait does.
    ssh = _fake_ssh(tmp_path, f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)")
    program = (
        "import sys\nfrom nvmlcheck.hosts import Fleet\n"
        f"Fleet(ssh={ssh!r}).run(['gpu01'], ['wait', '--timeout', 'none'])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(short_tmp))
    owner = subprocess.Popen([sys.executable, "-c", program], env=env)
    try:
        end = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert owner.poll() is None and time.monotonic() < end, "the fake ssh never started"
            time.sleep(0.02)
        ssh_pid = int(pid_file.read_text())
        assert [p.name for p in short_tmp.iterdir() if p.name.startswith("nvmlcheck-ssh-")]
        owner.kill()  # no close(), no stop(): the guard process is all that is left to clean up
        owner.wait()
        assert _gone_within(ssh_pid), "the ssh client outlived its fleet's SIGKILL"
        end = time.monotonic() + 30
        while any(p.name.startswith("nvmlcheck-ssh-") for p in short_tmp.iterdir()) and time.monotonic() < end:
            time.sleep(0.02)
        assert not any(p.name.startswith("nvmlcheck-ssh-") for p in short_tmp.iterdir())
        assert all(_gone_within(pid) for pid in _guards(ssh)), "the guard did not end after its cleanup"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_later_fleet_removes_the_directories_of_dead_fleets(short_tmp: Path) -> None:
    dead = short_tmp / "nvmlcheck-ssh-4194305-1-abcd"  # a PID above any pid_max: its process is gone
    dead.mkdir()
    (dead / "0123456789ab").write_text("")
    alive = short_tmp / f"nvmlcheck-ssh-{hosts._self_identity()}-efgh"  # this process's own: still in use
    alive.mkdir()
    legacy = short_tmp / "nvmlcheck-ssh-qwerty"  # an older version's: its owner cannot be told, left alone
    legacy.mkdir()
    fleet = Fleet()
    try:
        fleet.ssh_argv(Host("gpu01"))  # the first control path makes the directory, after the sweep
        assert not dead.exists() and alive.exists() and legacy.exists()
    finally:
        fleet.close()


# --- interrupted while the workers end -----------------------------------------------------------------------------


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_interrupt_while_a_fleet_ends_still_waits_for_its_workers(
        first: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Python 3.11's Thread.join, cut by an exception, can mark a running thread stopped (bpo-45274's handling): a
    # Ctrl-C while run() waited for its workers after a first interrupt once returned with a worker still running,
    # free to start an nvidia-smi over ssh after the fleet's last stop(). gpu01 has no nvmlcheck and its fallback is
    # slow to see the stop (as between two nvidia-smi runs); gpu02's ssh hangs until it is killed.
    import threading

    from nvmlcheck.cli._signals import Terminated, ending_on_signals

    hang_s = 30.0
    ssh_pid = tmp_path / "ssh.pid"
    ssh = _fake_ssh(tmp_path, "host = sys.argv[sys.argv.index('--') + 1]\n"
                              "if host == 'gpu01':\n"
                              "    sys.stderr.write('/usr/bin/python3: No module named nvmlcheck\\n'); sys.exit(1)\n"
                              f"open({str(ssh_pid)!r}, 'w').write(str(os.getpid()))\n"
                              "time.sleep(600)")
    entered, release, returned, stopped = (threading.Event() for _ in range(4))

    def fallback(context: hosts.FallbackContext) -> tuple[dict[str, object], int]:
        entered.set()
        try:
            release.wait(hang_s)
            return json.loads(SNAPSHOT_DOC), 0
        finally:
            returned.set()

    fleet = Fleet(ssh=ssh, control_master=False)
    stop = fleet.stop

    def stopping() -> None:
        stop()
        stopped.set()

    monkeypatch.setattr(fleet, "stop", stopping)

    def interrupt() -> None:
        end = time.monotonic() + hang_s
        while not (entered.is_set() and ssh_pid.exists() and ssh_pid.read_text()) and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(os.getpid(), first)
        stopped.wait(hang_s)
        for _ in range(2):  # the second lands in the wait for the workers even if the first came a moment early
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        release.set()

    armed = [True]

    def on_sigint(signum: int, frame: object) -> None:
        if armed[0]:
            raise KeyboardInterrupt

    released_when_it_raised: list[bool] = []
    helper = threading.Thread(target=interrupt, daemon=True)
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with ending_on_signals(), pytest.raises((KeyboardInterrupt, Terminated)):
            helper.start()
            try:
                fleet.run(["gpu01", "gpu02"], ["snapshot"], deadline_s=hang_s, fallback=fallback)
            finally:
                armed[0] = False
                released_when_it_raised.append(release.is_set())
    finally:
        armed[0] = False
        release.set()
        helper.join(hang_s)
        signal.signal(signal.SIGINT, previous)
        fleet.close()
    # The fallback could only end once released: run() ending before that left its worker running.
    assert released_when_it_raised == [True], "run() returned while a worker was still running"
    assert returned.is_set()
    assert _gone_within(int(ssh_pid.read_text())), "the hung ssh outlived the interrupted run"
    end = time.monotonic() + hang_s
    while any(t.name.startswith("nvmlcheck-host-") for t in threading.enumerate()) and time.monotonic() < end:
        time.sleep(0.01)
    assert not any(t.name.startswith("nvmlcheck-host-") for t in threading.enumerate())


def test_an_interrupt_while_the_workers_start_is_raised_as_itself(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Ctrl-C while run() starts its threads: the wait for them once joined a thread never started, and
    # "cannot join thread before it is started" (a RuntimeError) replaced the KeyboardInterrupt.
    import threading

    ssh_pid = tmp_path / "ssh.pid"
    ssh = _fake_ssh(tmp_path, f"open({str(ssh_pid)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)")
    start = threading.Thread.start
    started: list[str] = []

    def starting(self: threading.Thread) -> None:
        if started:
            raise KeyboardInterrupt  # the second thread: before it starts
        started.append(self.name)
        start(self)
        end = time.monotonic() + 30
        while not (ssh_pid.exists() and ssh_pid.read_text()) and time.monotonic() < end:
            time.sleep(0.01)  # the first host's ssh runs: the interruption must end it

    monkeypatch.setattr(threading.Thread, "start", starting)
    try:
        with Fleet(ssh=ssh, control_master=False, fanout=2) as fleet, pytest.raises(KeyboardInterrupt):
            fleet.run(["gpu01", "gpu02"], ["snapshot"], deadline_s=60.0)
    finally:
        monkeypatch.undo()
    assert started == ["nvmlcheck-host-0"]
    assert _gone_within(int(ssh_pid.read_text())), "the first host's ssh outlived the interrupted run"


@pytest.mark.parametrize(("given", "deadline"), [([], 30.0 + 2.0 + hosts.START_ALLOWANCE_S),
                                                 (["--timeout", "60"], 60.0 + 2.0 + hosts.START_ALLOWANCE_S),
                                                 (["--timeout", "none"], None)])
def test_holders_on_hosts_gives_each_host_its_reading_bound(
        given: list[str], deadline: float | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # holders' --timeout (default 30) bounds each host's reading, and is passed to the host; the host's deadline was
    # the connect timeout + 5 s whatever it said: a reading told it had 60 s was killed at 7 s as "no answer".
    ssh = _fake_ssh(tmp_path, 'print(\'{"schema": "nvmlcheck/holders", "version": 1, "holders": []}\')')
    seen: dict[str, object] = {}

    class Recording(Fleet):
        def run(self, *args: object, **kwargs: object) -> object:  # type: ignore[override]
            seen.update(kwargs)
            return super().run(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(hosts, "Fleet", functools.partial(Recording, ssh=ssh, control_master=False))
    assert cli.main(["holders", "--host", "gpu01", "--connect-timeout", "2", *given]) == 0
    assert seen["deadline_s"] == deadline and seen["timeout_s"] is None, seen


@pytest.mark.parametrize("beside", [[], ["--host", "gpu01"]])
def test_an_empty_hosts_file_is_a_usage_error_even_beside_host(
        beside: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Beside --host, a fleet file with every line commented out ran --host alone: its hosts unchecked, exit 0.
    fleet = tmp_path / "fleet.txt"
    fleet.write_text("# gpu02\n\n   # gpu03\n", encoding="utf-8")
    assert cli.main(["wait", "--timeout", "0", "--hosts-file", str(fleet), *beside]) == 2
    assert f"--hosts-file {fleet}: no host in it" in capsys.readouterr().err


def test_a_bad_line_of_a_hosts_file_is_named_by_its_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The error named the file only: in a fleet file of hundreds of hosts, the operator had to find the line.
    fleet = tmp_path / "fleet.txt"
    fleet.write_text("gpu01\n# gpu02\n\ngpu03  # the new one\nb, c\n", encoding="utf-8")
    assert cli.main(["wait", "--timeout", "0", "--hosts-file", str(fleet)]) == 2
    assert f"--hosts-file {fleet}:5: bad host 'b, c'" in capsys.readouterr().err
    assert hosts_file_lines(fleet)[:2] == [(1, "gpu01"), (4, "gpu03")]
