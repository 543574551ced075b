"""The nvidia-smi runner: argv building and prefix quoting, error classification, deadlines and process-group kills.

nvidia-smi is played by stubs/fake_nvidia_smi.py; ``ssh`` and ``pct exec`` by small shell scripts that behave as they
do (ssh joins its arguments into one line for a remote shell; pct passes argv through).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from nvmlcheck._proc.child import REAP_GRACE_S, Child
from nvmlcheck.backends import smi as smi_module
from nvmlcheck.backends.smi import SmiResult, SmiRunner, classify_failure
from nvmlcheck.errors import (
    BackendUnavailable,
    DriverNotLoaded,
    GpuLost,
    LibraryVersionMismatch,
    NoPermission,
    NotFound,
    SmiError,
    SmiTimeout,
    SmiTransportError,
    Unknown,
)
from nvmlcheck.wait import is_transient

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "stubs" / "fake_nvidia_smi.py"
CAP1 = ROOT / "tests" / "data" / "nvidia-smi" / "h200-driver-580.159.04"
CAP2 = ROOT / "tests" / "data" / "nvidia-smi" / "h200-driver-580.159.04-host2"
# -S: no site import, so each fake run starts in ~15 ms instead of ~60.
FAKE_CMD = [sys.executable, "-S", str(FAKE)]
SCENARIO = "nvmlcheck-stub-scenario 1\ndevice index=0\n"
QUERY = ("--query-gpu=index,uuid", "--format=csv,nounits")

# Stands in for ssh: options and the host are dropped, the rest is joined with spaces and run by a shell, as sshd does.
SSH_WRAPPER = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in -o|-p|-i|-l) shift 2 ;; -*) shift ;; *) break ;; esac
done
[ "$1" = unreachable ] && { echo "ssh: connect to host unreachable port 22: Connection refused" >&2; exit 255; }
shift
exec sh -c "$*"
"""
# Stands in for pct exec <vmid> -- cmd...: argv is passed through untouched.
PCT_WRAPPER = """#!/bin/sh
[ "$1" = exec ] && shift 2
[ "$1" = -- ] && shift
exec "$@"
"""


def write_script(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture(autouse=True)
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    path = tmp_path / "scenario.txt"
    path.write_text(SCENARIO, encoding="utf-8")
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(path))
    for knob in ("FAKE_SMI_DELAY_S", "FAKE_SMI_HANG", "FAKE_SMI_EXIT", "FAKE_SMI_MATCH", "FAKE_SMI_ARGV_LOG"):
        monkeypatch.delenv(knob, raising=False)
    yield path


@pytest.fixture
def argv_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_SMI_ARGV_LOG", str(log))
    return log


def logged(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def child_started_before_the_kill(monkeypatch: pytest.MonkeyPatch, pid_file: Path) -> None:
    """Each run's wait first waits (bounded) for the hanging fake to write its child's pid: on loaded CI cores the
    fake could still be starting when its 1 s deadline came, so there was no child (and no pid file) to check. The
    deadline is absolute, so a wait that begins late kills at once: the kill still comes after the child started."""
    real_wait = smi_module._Running.wait

    def wait(self: smi_module._Running) -> SmiResult:
        limit = time.monotonic() + 60.0
        while not pid_file.exists() and time.monotonic() < limit:
            time.sleep(0.01)
        return real_wait(self)

    monkeypatch.setattr(smi_module._Running, "wait", wait)


def dies_soon(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` is dead within ``within_s`` (a killed process's death is asynchronous)."""
    deadline = time.monotonic() + within_s
    while not dead(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def dead(pid: int) -> bool:
    """Gone, or a zombie waiting for its new parent to reap it: either way it runs no more."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[-1].split()[0] == "Z"


# --- argv -------------------------------------------------------------------------------------------------------------


class TestArgv:
    def test_plain_argv_is_command_then_args(self) -> None:
        runner = SmiRunner()
        assert runner.argv_for(QUERY) == (("nvidia-smi", *QUERY), ("nvidia-smi", *QUERY))

    def test_command_as_string_is_split_like_a_shell(self) -> None:
        runner = SmiRunner(command="'/opt/my tools/nvidia-smi' --loop-free")
        assert runner.command == ("/opt/my tools/nvidia-smi", "--loop-free")

    def test_ssh_prefix_quotes_every_word_for_the_remote_shell(self) -> None:
        runner = SmiRunner(command=["/opt/x y/nvidia-smi"], prefix="ssh -o BatchMode=yes gpu01")
        assert runner.prefix_shell is True
        argv, words = runner.argv_for(["-i", "0"])
        assert argv == ("ssh", "-o", "BatchMode=yes", "gpu01", "'/opt/x y/nvidia-smi'", "-i", "0")
        assert words == ("/opt/x y/nvidia-smi", "-i", "0")

    @pytest.mark.parametrize(
        ("prefix", "shell"),
        [
            ("ssh gpu01", True),
            ("/usr/bin/ssh -p 2222 gpu01", True),
            ("sshpass -p pw ssh gpu01", True),
            ("pct exec 129 --", False),
            (["docker", "exec", "c1"], False),
            ("sudo -n", False),
        ],
    )
    def test_prefix_shell_is_inferred_from_ssh(self, prefix: str | list[str], shell: bool) -> None:
        assert SmiRunner(prefix=prefix).prefix_shell is shell

    def test_prefix_shell_can_be_forced(self) -> None:
        runner = SmiRunner(prefix="ssh gpu01", prefix_shell=False)
        assert runner.argv_for(["a b"])[0] == ("ssh", "gpu01", "nvidia-smi", "a b")

    @pytest.mark.parametrize("timeout", [0, -1, math.nan, math.inf])
    def test_bad_timeouts_are_refused(self, timeout: float) -> None:
        with pytest.raises(ValueError, match="timeout_s"):
            SmiRunner(timeout_s=timeout)

    def test_empty_command_is_refused(self) -> None:
        with pytest.raises(ValueError, match="command"):
            SmiRunner(command=[])


TRICKY = ["--query-gpu=index", "two words", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "*", "", "back\\slash"]


class TestPrefixes:
    def test_ssh_like_prefix_delivers_spaces_and_quotes_intact(self, tmp_path: Path, argv_log: Path) -> None:
        ssh = write_script(tmp_path / "ssh", SSH_WRAPPER)
        spaced = tmp_path / "dir with space"
        spaced.mkdir()
        fake = shutil.copy(FAKE, spaced / "nvidia-smi's copy")
        runner = SmiRunner(command=[sys.executable, "-S", str(fake)], prefix=[str(ssh), "-o", "BatchMode=yes", "gpu01"])
        assert runner.prefix_shell is True
        runner.run(TRICKY)
        assert logged(argv_log) == [TRICKY]

    def test_pct_like_prefix_delivers_argv_untouched(self, tmp_path: Path, argv_log: Path) -> None:
        pct = write_script(tmp_path / "pct", PCT_WRAPPER)
        runner = SmiRunner(command=FAKE_CMD, prefix=f"{pct} exec 129 --")
        assert runner.prefix_shell is False
        runner.run(TRICKY)
        assert logged(argv_log) == [TRICKY]

    def test_quoting_for_a_prefix_that_has_no_shell_would_corrupt_arguments(
        self, tmp_path: Path, argv_log: Path
    ) -> None:
        # Why the choice matters: the quotes arrive literally when nothing unquotes them.
        pct = write_script(tmp_path / "pct", PCT_WRAPPER)
        SmiRunner(command=FAKE_CMD, prefix=f"{pct} exec 129 --", prefix_shell=True).run(["two words"])
        assert logged(argv_log) == [["'two words'"]]

    def test_a_prefixed_query_answers(self, tmp_path: Path) -> None:
        ssh = write_script(tmp_path / "ssh", SSH_WRAPPER)
        result = SmiRunner(command=FAKE_CMD, prefix=[str(ssh), "gpu01"]).run(QUERY)
        assert result.returncode == 0
        assert result.stdout == "index, uuid\n0, GPU-00000000-0000-0000-0000-000000000000\n"

    def test_ssh_own_failure_is_a_transport_error(self, tmp_path: Path) -> None:
        ssh = write_script(tmp_path / "ssh", SSH_WRAPPER)
        runner = SmiRunner(command=FAKE_CMD, prefix=[str(ssh), "unreachable"])
        result = runner.run(QUERY)
        error = classify_failure(result, prefixed=True)
        assert isinstance(error, SmiTransportError)
        assert not isinstance(error, BackendUnavailable)  # never read as "no driver", let alone as GPU state
        assert error.returncode == 255 and "Connection refused" in str(error)

    def test_remote_command_not_found_is_a_transport_error(self, tmp_path: Path) -> None:
        ssh = write_script(tmp_path / "ssh", SSH_WRAPPER)
        result = SmiRunner(command="no-such-nvidia-smi-here", prefix=[str(ssh), "gpu01"]).run(QUERY)
        assert result.returncode == 127
        error = classify_failure(result, prefixed=True)
        assert isinstance(error, SmiTransportError) and "was not found" in str(error)

    def test_remote_command_not_executable_is_a_transport_error(self, tmp_path: Path) -> None:
        ssh = write_script(tmp_path / "ssh", SSH_WRAPPER)
        plain = tmp_path / "not-executable"
        plain.write_text("x", encoding="utf-8")
        result = SmiRunner(command=str(plain), prefix=[str(ssh), "gpu01"]).run(QUERY)
        assert result.returncode == 126
        assert isinstance(classify_failure(result, prefixed=True), SmiTransportError)

    @pytest.mark.parametrize("prefix", [None, "/no/such/ssh gpu01"])
    def test_program_that_cannot_start_is_a_transport_error(self, prefix: str | None) -> None:
        runner = SmiRunner(command="/no/such/nvidia-smi", prefix=prefix)
        with pytest.raises(SmiTransportError, match="cannot start") as info:
            runner.run(QUERY)
        assert info.value.returncode is None


# --- classification ---------------------------------------------------------------------------------------------------


class TestClassification:
    @pytest.mark.parametrize(
        ("code", "cls", "text"),
        [
            (9, DriverNotLoaded, "couldn't communicate with the NVIDIA driver"),
            (18, LibraryVersionMismatch, "Driver/library version mismatch"),
            (6, NotFound, "No devices were found"),
            (4, NoPermission, "Failed to initialize NVML: Insufficient Permissions"),
            (15, GpuLost, ""),
            (255, Unknown, "Failed to initialize NVML: Unknown Error"),
        ],
    )
    def test_fake_exit_codes(self, monkeypatch: pytest.MonkeyPatch, code: int, cls: type, text: str) -> None:
        monkeypatch.setenv("FAKE_SMI_EXIT", str(code))
        result = SmiRunner(command=FAKE_CMD).run(QUERY)
        assert result.returncode == code
        assert text in result.stdout  # printed where the real one prints it: stdout
        error = classify_failure(result)
        assert error is not None and type(error) is cls
        assert isinstance(error.__cause__, SmiError) and error.__cause__.argv == result.argv
        assert text in str(error)

    def test_driver_errors_are_backend_unavailable(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for code in (9, 18):
            monkeypatch.setenv("FAKE_SMI_EXIT", str(code))
            assert isinstance(classify_failure(SmiRunner(command=FAKE_CMD).run(QUERY)), BackendUnavailable)

    def test_invalid_field_is_an_smi_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_SMI_EXIT", "2")
        result = SmiRunner(command=FAKE_CMD).run(QUERY)
        assert result.stdout.startswith('Field "index" is not a valid field to query.')
        error = classify_failure(result)
        assert type(error) is SmiError and error.returncode == 2

    @pytest.mark.parametrize(
        ("directory", "name", "cls"),
        [
            (CAP1, "bad_index", NotFound),
            (CAP1, "bogus_field", SmiError),
            (CAP2, "bad_format", SmiError),
            (CAP2, "bad_uuid", NotFound),
            (CAP2, "idle_qx_pids", SmiError),
        ],
    )
    def test_real_error_outputs(self, directory: Path, name: str, cls: type) -> None:
        stdout = (directory / f"{name}.stdout").read_text()
        code = int((directory / f"{name}.exitcode").read_text())
        result = SmiResult(("nvidia-smi", name), ("nvidia-smi", name), code, stdout, "", 0)
        assert type(classify_failure(result)) is cls

    def test_success_is_no_error(self) -> None:
        assert classify_failure(SmiResult(("x",), ("x",), 0, "", "", 0)) is None

    def test_255_without_prefix_is_nvidia_smi_not_transport(self) -> None:
        # 255 is nvidia-smi's "other error or internal driver error": NVML's Unknown, as the library answers it.
        error = classify_failure(SmiResult(("nvidia-smi",), ("nvidia-smi",), 255,
                                           "Failed to initialize NVML: Unknown Error", "", 0))
        assert type(error) is Unknown and error.code == 999 and "Unknown Error" in str(error)
        assert isinstance(error.__cause__, SmiError) and is_transient(error)
        bare = classify_failure(SmiResult(("nvidia-smi",), ("nvidia-smi",), 255, "", "", 0))
        assert type(bare) is Unknown and "255" in str(bare)

    def test_255_that_refuses_the_arguments_is_a_refused_command(self) -> None:
        text = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."
        argv = ("nvidia-smi", "-L", "--query-gpu=index")
        error = classify_failure(SmiResult(argv, ("nvidia-smi",), 255, text, "", 0))
        assert type(error) is SmiError and "refused" in str(error)


# --- deadlines --------------------------------------------------------------------------------------------------------


class TestDeadlines:
    def test_hanging_nvidia_smi_is_killed_with_its_children(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        pid_file = tmp_path / "child.pid"
        monkeypatch.setenv("FAKE_SMI_HANG", "1")
        monkeypatch.setenv("FAKE_SMI_CHILD_PID_FILE", str(pid_file))
        child_started_before_the_kill(monkeypatch, pid_file)
        runner = SmiRunner(command=FAKE_CMD, timeout_s=1.0)
        with pytest.raises(SmiTimeout) as info:
            runner.run(QUERY)
        assert str(FAKE) in str(info.value) and "1 s" in str(info.value)
        assert info.value.timeout_s == 1.0
        child = int(pid_file.read_text())
        assert dies_soon(child), "the hanging nvidia-smi's child survived the timeout"

    def test_runs_started_together_share_one_reap_grace(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # A wedged GPU hangs every nvidia-smi of a pass, in uninterruptible sleep: killing them one after another, each
        # with its own reap grace, overran the wait's deadline by one grace per run. Every run of the batch now gets
        # SIGKILL at the first kill, and all are reaped by the same moment (the mechanism; no stopwatch).
        kills: list[int | None] = []
        real_kill = Child.kill

        def kill(self: Child, grace_s: float = REAP_GRACE_S, **kw: object) -> bool:
            kills.append(kw.get("deadline_ns"))  # type: ignore[arg-type]
            return real_kill(self, grace_s, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(Child, "kill", kill)
        monkeypatch.setenv("FAKE_SMI_HANG", "1")
        with pytest.raises(SmiTimeout):
            SmiRunner(command=FAKE_CMD, timeout_s=0.3).run_many([QUERY, QUERY, ("-q", "-d", "PIDS")])
        assert len(kills) == 3 and kills[0] is not None and len(set(kills)) == 1, kills

    def test_hang_behind_a_prefix_kills_the_whole_chain(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        ssh = write_script(tmp_path / "ssh", SSH_WRAPPER)
        pid_file = tmp_path / "child.pid"
        monkeypatch.setenv("FAKE_SMI_HANG", "1")
        monkeypatch.setenv("FAKE_SMI_CHILD_PID_FILE", str(pid_file))
        child_started_before_the_kill(monkeypatch, pid_file)
        with pytest.raises(SmiTimeout):
            SmiRunner(command=FAKE_CMD, prefix=[str(ssh), "gpu01"], timeout_s=1.0).run(QUERY)
        assert dies_soon(int(pid_file.read_text()))

    def test_timeout_is_the_one_asked_for(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # The mechanism, not a stopwatch: the run's deadline is its start plus the timeout (the runner's own, or the
        # one given to this run), and a run that outlives it is killed with SmiTimeout naming that timeout.
        monkeypatch.setenv("FAKE_SMI_DELAY_S", "30")
        runner = SmiRunner(command=FAKE_CMD, timeout_s=0.3)
        running = runner.start(QUERY)
        assert running.deadline_ns - running.started_ns == 300_000_000
        with pytest.raises(SmiTimeout) as info:
            running.wait()
        assert info.value.timeout_s == 0.3 and running.proc.returncode is not None  # killed and reaped
        shorter = runner.start(QUERY, timeout_s=0.1)
        assert shorter.deadline_ns - shorter.started_ns == 100_000_000
        with pytest.raises(SmiTimeout) as info:
            shorter.wait()
        assert info.value.timeout_s == 0.1

    def test_slow_but_alive_answers(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FAKE_SMI_DELAY_S", "0.4")
        result = SmiRunner(command=FAKE_CMD, timeout_s=5.0).run(QUERY)
        # A lower bound only checks that the knob slowed the run (a loaded machine makes it slower, never faster).
        assert result.returncode == 0 and result.elapsed_ns >= 400_000_000
        assert result.stdout.startswith("index, uuid\n0, ")

    def test_run_many_runs_in_parallel(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # Overlapped, checked by the order of events rather than a stopwatch: every run is started before the first
        # is waited for, so the three 0.5 s runs take one run's time.
        monkeypatch.setenv("FAKE_SMI_DELAY_S", "0.5")
        runner = SmiRunner(command=FAKE_CMD, timeout_s=5.0)
        events: list[str] = []
        real_start, real_wait = runner.start, smi_module._Running.wait

        def start(args: Sequence[str], timeout_s: float | None = None) -> smi_module._Running:
            events.append("start")
            return real_start(args, timeout_s)

        def wait(self: smi_module._Running) -> SmiResult:
            events.append("wait")
            return real_wait(self)

        monkeypatch.setattr(runner, "start", start)
        monkeypatch.setattr(smi_module._Running, "wait", wait)
        results = runner.run_many([QUERY, QUERY, QUERY])
        assert [r.returncode for r in results] == [0, 0, 0]
        assert events == ["start"] * 3 + ["wait"] * 3

    def test_run_many_kills_the_others_when_one_hangs(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        pid_file = tmp_path / "child.pid"
        monkeypatch.setenv("FAKE_SMI_HANG", "1")
        monkeypatch.setenv("FAKE_SMI_MATCH", "--query-gpu")
        monkeypatch.setenv("FAKE_SMI_CHILD_PID_FILE", str(pid_file))
        child_started_before_the_kill(monkeypatch, pid_file)
        with pytest.raises(SmiTimeout):
            SmiRunner(command=FAKE_CMD, timeout_s=1.0).run_many([("--version",), QUERY])
        # SIGKILL went to the whole group; the grandchild dies asynchronously (and is reaped by init, not us).
        assert dies_soon(int(pid_file.read_text()))

    def test_no_process_is_left_after_a_normal_run(self) -> None:
        runner = SmiRunner(command=FAKE_CMD)
        running = runner.start(QUERY)
        result = running.wait()
        assert result.returncode == 0
        assert running.proc.returncode == 0  # reaped
        assert not os.path.exists(f"/proc/{running.proc.pid}") or dead(running.proc.pid)
