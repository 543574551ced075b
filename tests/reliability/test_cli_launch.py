"""The CLI as launch scripts use it: SIGTERM/SIGHUP end it like Ctrl-C, every error is a document under --json,
repeated options, a failed simulation, and a start-up that loads only what the command needs (issue 12)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvmlcheck import cli
from nvmlcheck.testing import Scenario

from ._support import Stub, dead, sigint_default, wait_for

pytestmark = pytest.mark.stub

ROOT = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- signals ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_signal_ends_an_smi_wait_with_its_code_kills_nvidia_smi_and_prints_a_document(
    stub: Stub, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    stub.write(Scenario.h200())
    pid_file = tmp_path / "hung.pid"
    env = dict(os.environ, FAKE_SMI_HANG="1", FAKE_SMI_MATCH="PIDS", FAKE_SMI_CHILD_PID_FILE=str(pid_file))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "--json", "wait", "--backend", "smi", "--timeout", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
        preexec_fn=sigint_default,  # noqa: PLW1509 - one signal call, no locks taken
    )
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"), 20.0, "the hung nvidia-smi")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code, err
    doc = json.loads(out)
    assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == code
    grandchild = int(pid_file.read_text())
    wait_for(lambda: dead(grandchild), 2.0, "the ended nvidia-smi's own child to die with its group")


def test_sigterm_during_a_simulated_wait_removes_the_stub_directory(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "--simulate", "h200-busy", "wait", "--timeout", "none"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )
    try:
        # Signal once the wait runs: the stub has written its call log into the simulation's directory. Anything
        # earlier in $TMPDIR can be tempfile's short-lived writability probe (a SIGTERM then leaves that file behind)
        # or the directory between its mkdir and the registration of its removal: not "during a simulated wait".
        wait_for(lambda: any(tmp.glob("nvmlcheck-stub-*/calls.log")), 30.0, "the simulated wait's first NVML calls")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143 and "SIGTERM" in err
    assert list(tmp.iterdir()) == []


def test_handlers_are_restored_after_main() -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    assert cli.main(["--version"]) == 0
    assert {s: signal.getsignal(s) for s in before} == before


# --- argument errors and --json -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--json", "wait", "--timeout", "abc"],
        ["wait", "--json", "--stable-polls", "0"],
        ["--json", "--backend", "bogus", "snapshot"],
        ["--json", "kill", "--grace", "-1", "123"],
        ["--json", "frobnicate"],
    ],
)
def test_argument_errors_under_json_are_error_documents(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = _run(capsys, *argv)
    assert code == 2
    doc = json.loads(out)
    assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == 2 and doc["error"]["type"] == "UsageError"
    assert doc["error"]["message"] and "error" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "--timeout", "1", "--timeout", "2"],
        ["--backend", "nvml", "snapshot", "--backend", "smi"],
        ["kill", "--grace", "1", "--grace", "2", "123"],
        ["--simulate", "h200", "wait", "--simulate", "h200x8"],
    ],
)
def test_a_repeated_single_valued_option_is_refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "given twice" in err


def test_list_options_given_twice_merge() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["--devices", "0,1", "wait", "--devices", "1,3", "--pids", "5", "--pids", "7", "5"])
    assert args.devices == [0, 1, 3] and args.pids == [5, 7]
    # A parser parses afresh each time: what the last parse saw is not "given twice" now.
    assert parser.parse_args(["wait", "--timeout", "1"]).timeout == 1.0
    assert parser.parse_args(["wait", "--timeout", "2"]).timeout == 2.0


@pytest.mark.parametrize(("text", "value"), [("inf", None), ("none", None), ("never", None), ("0.5", 0.5)])
def test_grace_accepts_never_escalating_words(text: str, value: float | None) -> None:
    assert cli.build_parser().parse_args(["kill", "--grace", text, "123"]).grace == value


def test_demo_takes_no_gpu_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "--backend", "smi", "demo")
    assert code == 2 and "--backend" in err
    code, out, _ = _run(capsys, "demo", "--help")
    assert code == 0 and "--json" in out
    assert "--backend" not in out and "--devices" not in out and "--simulate" not in out


def test_simulate_without_a_compiler_exits_3_with_the_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NVMLCHECK_STUB_CACHE", str(tmp_path / "cache"))  # nothing cached: it must compile
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out, err = _run(capsys, "--simulate", "h200", "--json", "snapshot")
    assert code == 3
    doc = json.loads(out)
    assert doc["error"]["type"] == "SimulationUnavailable" and "nvidia-nvml-dev" in doc["error"]["message"]
    code, out, err = _run(capsys, "--simulate", "h200", "wait")
    assert code == 3 and "C compiler" in err and "Traceback" not in err
    for argv in (["demo", "--json"], ["demo"]):  # the demo reports it the same way, a document under --json
        code, out, err = _run(capsys, *argv)
        assert code == 3 and "C compiler" in err + out and "Traceback" not in err
        if "--json" in argv:
            assert json.loads(out)["error"]["type"] == "SimulationUnavailable"


def test_one_poll_is_singular(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--simulate", "h200", "wait", "--stable-polls", "1")
    assert code == 0 and " 1 poll," in out


# --- start-up: what importing and parsing load ----------------------------------------------------------------------

#: Modules the kill/wait fast path must not load before the first signal: each costs milliseconds of start-up.
_HEAVY = ("typing", "dataclasses", "inspect", "json", "nvmlcheck.model", "nvmlcheck.errors", "nvmlcheck._nvml",
          "cffi", "threading", "contextlib", "pathlib")


def _loaded_by(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-S", "-c", f"{code}\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, env=env, check=True).stdout
    return set(out.split())


def test_importing_the_cli_loads_nothing_heavy() -> None:
    loaded = _loaded_by("import nvmlcheck.cli") - _loaded_by("pass")
    assert not {m for m in loaded if m.startswith(_HEAVY)}, sorted(loaded)
    assert "argparse" not in loaded  # parsing is main()'s job, not the import's


# --- exit as soon as the verdict is out ------------------------------------------------------------------------------


def test_the_script_exits_after_the_verdict_without_nvml_teardown(stub: Stub, tmp_path: Path) -> None:
    from nvmlcheck.testing import read_call_log

    stub.write(Scenario.h200())
    log = tmp_path / "calls.log"
    env = dict(os.environ, NVMLCHECK_STUB_LOG=str(log))
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "wait", "--timeout", "5"], check=False, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("clean: 1 GPU"), done.stderr
    calls = [entry.function for entry in read_call_log(log)]
    assert "nvmlInit_v2" in calls and "nvmlShutdown" not in calls  # the kernel does that teardown anyway


def test_main_in_process_still_closes_nvml(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    stub.write(Scenario.h200())
    assert cli.main(["wait", "--timeout", "5"]) == 0
    assert stub.probe.init_refcount() == 0  # a library caller's process goes on: everything is closed


# Run in a fresh interpreter without site: everything the kill command does before its first signal.
_BEFORE_SIGNAL = """
import subprocess, sys
target = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
from nvmlcheck.cli._main import _parse
from nvmlcheck.cli._kill import signal_first
args = _parse(["kill", str(target.pid)], False)
signal_first(args)
loaded = sorted(sys.modules)
assert target.wait(timeout=10) == -15, "the target was not signalled"
print(" ".join(loaded))
"""


def test_kill_loads_nothing_of_the_gpu_side_before_its_first_signal() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-S", "-c", _BEFORE_SIGNAL], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout
    loaded = set(out.split()) - _loaded_by("import subprocess")
    assert not {m for m in loaded if m.startswith(_HEAVY)}, sorted(loaded)
    assert "nvmlcheck._proc.targets" in loaded  # it was the real path


def test_the_parser_is_built_for_the_command_alone() -> None:
    from nvmlcheck.cli._parser import build_parser, command_in

    assert command_in(["--backend", "nvml", "--devices", "0", "kill", "5"]) == "kill"
    assert command_in(["--help", "kill"]) is None and command_in(["frobnicate"]) is None
    assert command_in(["--json", "wait"]) == "wait"
    def commands(parser: argparse.ArgumentParser) -> set[str]:
        return {name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices}

    assert commands(build_parser(only="kill")) == {"kill"}
    assert {"snapshot", "wait", "kill", "holders", "demo", "study"} <= commands(build_parser())


# The console script as a launch script runs it, in an interpreter without site: at the first signal, record the
# modules loaded and end at once (the target is the caller's to reap).
_AT_SIGNAL = r"""
import os, sys, _signal
def _at(real):
    def call(*a):
        real(*a)
        if a[1] == 0:  # an existence probe, not the signal
            return
        sys.stdout.write(" ".join(sorted(sys.modules)))
        sys.stdout.flush()
        os._exit(0)
    return call
os.kill = _at(os.kill)
if hasattr(_signal, "pidfd_send_signal"):
    _signal.pidfd_send_signal = _at(_signal.pidfd_send_signal)
sys.argv = ["nvmlcheck", *sys.argv[1:]]
from nvmlcheck.cli import script
script()
"""

#: All that a kill whose targets are named may load before its first signal, beyond a bare interpreter's os and sys:
#: nvmlcheck's cli and _proc modules it runs, three small modules of the standard library and the built-in
#: _collections (procfs's tuples). No signal (its enums: enum, functools, collections), argparse, re, importlib,
#: warnings, typing, json, dataclasses, threading, nor anything of the GPU side (docs/performance.md).
_BEFORE_SIGNAL_ALLOWED = {
    "__future__", "_collections", "errno", "math", "select", "nvmlcheck", "nvmlcheck._record",
    "nvmlcheck._text", "nvmlcheck._units", "nvmlcheck._proc", "nvmlcheck._proc.fate", "nvmlcheck._proc.pin",
    "nvmlcheck._proc.procfs", "nvmlcheck._proc.signals", "nvmlcheck._proc.targets", "nvmlcheck.cli",
    "nvmlcheck.cli._common", "nvmlcheck.cli._kill", "nvmlcheck.cli._main", "nvmlcheck.cli._output",
    "nvmlcheck.cli._quick", "nvmlcheck.cli._signals", "nvmlcheck.cli._values",
}  # fmt: skip
#: ``--match``/``--container``/``--cgroup`` read every process's command line or cgroup: these too.
_SELECTOR_ALLOWED = {"nvmlcheck._proc.container", "nvmlcheck._proc.selectors"}
#: A ``--match`` pattern with regex syntax: ``re`` (and the enum, functools and collections it imports) as well; a
#: literal one is searched as a substring, without them.
_REGEX_ALLOWED = {
    "re", "re._casefix", "re._compiler", "re._constants", "re._parser", "_sre", "copyreg", "enum", "functools",
    "_functools", "collections", "itertools", "keyword", "operator", "_operator", "reprlib", "types",
}  # fmt: skip


@pytest.mark.parametrize(
    "form",
    [["kill", "{pid}"], ["kill", "--devices", "0", "{pid}"], ["kill", "--tree", "{pid}"], ["--json", "kill", "{pid}"],
     ["kill", "--match", "{token}", "--yes"], ["kill", "--match", "{token}$", "--yes"],
     ["kill", "--devices", "0", "--tree", "--grace", "2", "{pid}"]],
    ids=" ".join,
)
def test_a_kill_of_named_targets_loads_only_its_own_modules_before_the_signal(form: list[str]) -> None:
    token = f"nvmlcheck-launch-test-{os.getpid()}"
    # SIGTERM's default action in the target, whatever the runner ignores or blocks.
    sleeper = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_DFL); "
               "signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM]); time.sleep(60)")
    target = subprocess.Popen([sys.executable, "-S", "-c", sleeper, token])
    try:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        argv = [w.replace("{pid}", str(target.pid)).replace("{token}", token) for w in form]
        out = subprocess.run([sys.executable, "-S", "-c", _AT_SIGNAL, *argv], capture_output=True, text=True,
                             env=env, timeout=60, check=False)  # fmt: skip
        assert out.returncode == 0 and out.stdout, out.stderr
        assert target.wait(timeout=10) == -signal.SIGTERM
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    loaded = set(out.stdout.split()) - _loaded_by("import os, _signal")
    allowed = _BEFORE_SIGNAL_ALLOWED | (_SELECTOR_ALLOWED if "--match" in form else set())
    allowed |= _REGEX_ALLOWED if "{token}$" in form else set()
    assert loaded <= allowed, sorted(loaded - allowed)


def test_a_one_shot_parses_without_argparse(stub: Stub) -> None:
    stub.write(Scenario.h200())
    for argv in (["wait", "--timeout", "0"], ["--json", "snapshot"], ["ready", "--need", "1GiB"]):
        code = ("import sys\nfrom nvmlcheck.cli import main\nmain(sys.argv[1:])\n"
                "print(' '.join(sys.modules), file=sys.stderr)")
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        loaded = set(done.stderr.split())
        assert "nvmlcheck.cli._quick" in loaded and not {"argparse", "nvmlcheck.cli._parser"} & loaded, argv
