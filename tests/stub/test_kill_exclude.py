"""``kill --exclude PID|REGEX`` (``prepare_kill(exclude=...)``): processes never to signal, however they were found.

``--all-holders`` takes every process with an NVIDIA device file open, and an NVML client of one's own (an exporter
that is not in ``holders.AGENTS``) opens the per-GPU file like a CUDA process: there was no way to keep it out but to
list every other PID by hand. CI has no /dev/nvidia*: the processes hold the simulation's stand-in device file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30

# argv[1]: the device file; argv[2]: a word for the command line (the agent's name).
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
# Starts a worker and an agent (argv[1]: their code; the agent's command line ends in "my-exporter", the launcher's
# does not), prints both PIDs.
LAUNCHER = ("import subprocess, sys, time; "
            "w = subprocess.Popen([sys.executable, '-S', '-c', sys.argv[1]], stdout=subprocess.PIPE); "
            "a = subprocess.Popen([sys.executable, '-S', '-c', sys.argv[1], 'my-' + 'exporter'], "
            "stdout=subprocess.PIPE); "
            "w.stdout.readline(); a.stdout.readline(); print(w.pid, a.pid, flush=True); time.sleep(60)")
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _scenario(tmp_path: Path, pid: int) -> str:
    sc = Scenario.h200()
    sc.add_process(0, pid, used_bytes=4 * GIB, bound=True, list_ms=20, release_ms=40)
    return str(sc.write(tmp_path / "scenario.txt"))


@pytest.mark.parametrize("by", ["pattern", "pid"])
def test_all_holders_leaves_an_excluded_agent_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
    device_file: str, by: str,
) -> None:
    worker = python_child(HOLD, device_file)
    agent = python_child(HOLD, device_file, "my-exporter")
    word = "my-exp.rter" if by == "pattern" else str(agent.pid)
    shown = repr(word) if by == "pattern" else word
    scenario = _scenario(tmp_path, worker.pid)
    code = cli.main(["--simulate", scenario, "--json", "kill", "--all-holders", "--yes", "--dry-run",
                     "--exclude", word])
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert code == 0, err
    assert [t["pid"] for t in plan["targets"]] == [worker.pid]
    assert {"pid": agent.pid, "reason": f"excluded (--exclude {shown})"} in [
        {k: e[k] for k in ("pid", "reason")} for e in plan["left_alone"]]  # and (added) its name
    assert f"left alone: pid {agent.pid} (" in err and f"): excluded (--exclude {shown})" in err  # the plan
    code = cli.main(["--simulate", scenario, "--json", "kill", "--all-holders", "--yes", "--timeout", "20",
                     "--exclude", word])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0, err
    assert [t["pid"] for t in doc["pids"]] == [worker.pid]
    assert any(e["pid"] == agent.pid and e["reason"] == f"excluded (--exclude {shown})" for e in doc["left_alone"])
    assert not _alive(worker.pid) and _alive(agent.pid)


def test_match_leaves_an_excluded_process_alone(
    capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]], tmp_path: Path,
) -> None:
    token = f"tok-{tmp_path.name}"
    kept, gone = python_child(SLEEP, token, "agent"), python_child(SLEEP, token, "worker")
    scenario = str(Scenario.h200().write(tmp_path / "scenario.txt"))
    code = cli.main(["--simulate", scenario, "--json", "kill", "--match", token, "--yes", "--exclude", "agent$",
                     "--timeout", "20"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert [t["pid"] for t in doc["pids"]] == [gone.pid]
    assert [(e["pid"], e["reason"]) for e in doc["left_alone"]] == [(kept.pid, "excluded (--exclude 'agent$')")]
    assert _alive(kept.pid) and not _alive(gone.pid)


def test_a_tree_leaves_an_excluded_descendant_alone(python_child: Callable[..., subprocess.Popen[bytes]]) -> None:
    launcher = python_child(LAUNCHER, SLEEP, ready=False)
    assert launcher.stdout is not None
    worker, agent = map(int, launcher.stdout.readline().split())
    try:
        with nc.prepare_kill([launcher.pid], tree=True, exclude=["my-exporter"]) as plan:
            plan.send_first()
            signalled = {t.pid for t in plan.targets}
            assert plan.left_alone == ((agent, "excluded (--exclude 'my-exporter')"),)
            plan._set.scan_descendants()  # a later scan does not take it either, nor list it twice
            assert {t.pid for t in plan.targets} == signalled and len(plan.left_alone) == 1
        assert signalled == {launcher.pid, worker}
        assert launcher.wait(timeout=10) != 0 and _alive(agent)
    finally:
        for pid in (worker, agent):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_named_pid_that_is_excluded_is_refused(python_child: Callable[..., subprocess.Popen[bytes]]) -> None:
    p = python_child(SLEEP, "my-exporter")
    for exclude in ([p.pid], ["my-exporter"]):
        with pytest.raises(nc.KillError, match="named and excluded"):
            nc.prepare_kill([p.pid], exclude=exclude)
    assert _alive(p.pid)


@pytest.mark.parametrize(("exclude", "error"), [
    ("my-exporter", TypeError), (123, TypeError), ([1.5], TypeError), ([True], TypeError), ([""], ValueError),
    (["("], ValueError), ([0], ValueError),
])
def test_bad_exclusions_are_refused_before_anything_is_pinned(exclude: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        nc.prepare_kill([1_000_000_000], exclude=exclude)  # type: ignore[arg-type]  # no such PID: never reached
