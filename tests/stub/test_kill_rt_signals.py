"""Real-time signals as a kill's first signal. ``kill --signal 35`` (SIGRTMIN+1) was refused as an unknown signal:
the names came from ``signal.Signals``, which has SIGRTMIN and SIGRTMAX but none between; ``RTMIN+N`` was refused too.
Now a number of any signal a process may be sent, and ``RTMIN+N``/``SIGRTMIN+N``/``RTMAX-N``, are taken (named
``SIGRTMIN+N`` in the plan and the JSON), with the refusals of before: a stop signal is never the first signal, a
number that is no signal (0, 65, glibc's own 32 and 33) or an offset out of range is a usage error."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck._proc import procfs, signals
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
RT1 = signal.SIGRTMIN + 1


def _scenario(tmp_path: Path, *holders: int) -> str:
    sc = Scenario.h200()
    for pid in holders:
        sc.add_process(0, pid, used_bytes=4 * GIB, bound=True, list_ms=20, release_ms=40)
    return str(sc.write(tmp_path / "scenario.txt"))


def _state(pid: int) -> str | None:
    st = procfs.read_stat(pid)
    return None if st is None else st.state


@pytest.mark.parametrize("word", [str(int(RT1)), "RTMIN+1", "sigrtmin+1", f"SIGRTMAX-{signal.SIGRTMAX - RT1}"])
def test_a_real_time_signal_by_number_or_name_ends_the_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
        word: str) -> None:
    target = python_child(SLEEP)
    code = cli.main(["--simulate", _scenario(tmp_path), "--json", "kill", "--signal", word, "--timeout", "20",
                     str(target.pid)])
    out, err = capsys.readouterr()
    assert code == 0, err
    (entry,) = json.loads(out)["pids"]
    assert [s["signal"] for s in entry["signals"]] == ["SIGRTMIN+1"]
    assert target.wait(timeout=10) == -RT1  # its default action ends it: no SIGKILL was needed


def test_all_holders_with_a_real_time_signal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
        device_file: str) -> None:
    # --all-holders signals from the plan made with NVML open (signal.Signals[name] there: a KeyError for RTMIN+2).
    holder = python_child(HOLD, device_file)
    code = cli.main(["--simulate", _scenario(tmp_path, holder.pid), "--json", "kill", "--all-holders", "--yes",
                     "--signal", "RTMIN+2", "--timeout", "20"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [s["signal"] for s in json.loads(out)["pids"][0]["signals"]] == ["SIGRTMIN+2"]
    assert holder.wait(timeout=10) == -(signal.SIGRTMIN + 2)


def test_the_dry_run_plan_names_the_real_time_signal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]]
) -> None:
    target = python_child(SLEEP)
    code = cli.main(["--simulate", _scenario(tmp_path), "--json", "kill", "--dry-run", "--signal", str(int(RT1)),
                     str(target.pid)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["signal"] == "SIGRTMIN+1" and target.poll() is None


@pytest.mark.parametrize(("word", "why"), [
    ("0", "unknown signal"), ("65", "unknown signal"), ("32", "unknown signal"), ("33", "unknown signal"),
    (f"RTMIN+{signal.SIGRTMAX - signal.SIGRTMIN + 1}", "unknown signal"), ("RTMIN+x", "unknown signal"),
    ("RTMIN+", "unknown signal"), ("RTMAX-99", "unknown signal"), ("STOP", "stops a process"),
    ("TSTP", "stops a process"),
])
def test_what_is_no_first_signal_is_still_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
        word: str, why: str) -> None:
    target = python_child(SLEEP)
    code = cli.main(["--simulate", _scenario(tmp_path), "kill", "--signal", word, "--grace", "never", "--timeout",
                     "0.3", str(target.pid)])
    err = capsys.readouterr().err
    assert code == 2 and why in err, err
    assert target.poll() is None and _state(target.pid) != "T"


def test_the_names_round_trip() -> None:
    for n in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
        assert signals.number(signals.name(n)) == n
    assert signals.name(RT1) == "SIGRTMIN+1" and signals.number("rtmax") == signal.SIGRTMAX
    with pytest.raises(ValueError, match="reserved by the C library"):
        signals.name(32)


def test_the_library_takes_a_real_time_signal_and_refuses_a_bool(
        python_child: Callable[..., subprocess.Popen[bytes]], gpus: Callable[[Scenario], nc.Session]) -> None:
    target = python_child(SLEEP)
    with nc.prepare_kill([target.pid]) as plan:
        with pytest.raises(TypeError):
            plan.send_first(True)  # was SIGHUP
        plan.send_first(RT1)
    assert target.wait(timeout=10) == -RT1
    other = python_child(SLEEP)
    with gpus(Scenario.h200()) as session:
        with pytest.raises(TypeError):
            nc.kill_and_wait(session, [other.pid], first_signal=True)
        with pytest.raises(nc.ArgumentError, match="stops a process"):
            nc.kill_and_wait(session, [other.pid], first_signal=signal.SIGTSTP)
        assert other.poll() is None and _state(other.pid) != "T"
        result = nc.kill_and_wait(session, [other.pid], first_signal=RT1, timeout=20)
    assert [s.name for s in result.pids[0].signals] == ["SIGRTMIN+1"] and other.wait(timeout=10) == -RT1


@pytest.mark.parametrize(("word", "why"), [("32", "reserved by the C library"), ("RTMIN+99", "real-time signals here"),
                                           ("RTMIN+x", "takes a number N"), ("NOPE", "unknown signal 'NOPE'")])
def test_the_usage_error_says_what_is_wrong_with_the_signal(capsys: pytest.CaptureFixture[str], word: str,
                                                             why: str) -> None:
    code = cli.main(["kill", "--signal", word, "123"])
    err = capsys.readouterr().err
    assert code == 2 and why in err and "RTMIN+1" in err, err


@pytest.mark.parametrize("sig", [signal.SIGSTOP, signal.SIGTSTP, True, 0, 65])
def test_the_escalation_refuses_what_the_first_signal_refuses(
        python_child: Callable[..., subprocess.Popen[bytes]], sig: int) -> None:
    # KillPlan.escalate(SIGSTOP) stopped every target that was still running, holding its GPU; True sent SIGHUP.
    target = python_child("import signal, time; signal.signal(signal.SIGTERM, lambda n, f: None); "
                          "print('ready', flush=True); time.sleep(60)")
    with nc.prepare_kill([target.pid]) as plan:
        plan.send_first(signal.SIGTERM)
        with pytest.raises((TypeError, ValueError)):
            plan.escalate(sig)
        assert [s.name for s in plan.targets[0].signals] == ["SIGTERM"]
        assert target.poll() is None and _state(target.pid) != "T"
