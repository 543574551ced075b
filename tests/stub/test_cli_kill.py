"""`nvmlcheck kill` and `nvmlcheck holders` end to end on the simulated GPU: refusals with exit 2 and a plain message,
--grace never, --tree, --all-holders with its listing and its prompt, and a launcher that ignores SIGTERM (issue 10).
CI has no /dev/nvidia*: the processes hold a stand-in device file in dev/ next to the scenario, where `--simulate`
looks for its stand-ins."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30

HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
# Survives SIGTERM with a handler that does nothing (SIG_IGN would get SIGKILL at once: the kernel discards it).
IGNORE_TERM = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda n, f: None); "
               "print('ready', flush=True); "
               "time.sleep(60)")
# A launcher whose worker holds the device file; the launcher itself holds nothing and is on no GPU list.
LAUNCHER = ("import subprocess, sys, time; "
            "w = subprocess.Popen([sys.executable, '-S', '-c', sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE); "
            "w.stdout.readline(); print(w.pid, flush=True); time.sleep(60)")


@pytest.fixture
def start(python_child: Callable[..., subprocess.Popen[bytes]]) -> Callable[..., subprocess.Popen[bytes]]:
    def run(code: str, *args: str) -> subprocess.Popen[bytes]:
        return python_child(code, *args, ready=False)

    return run


def _ready(p: subprocess.Popen[bytes]) -> str:
    assert p.stdout is not None
    return p.stdout.readline().decode().strip()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _scenario(tmp_path: Path, *holders: int) -> str:
    sc = Scenario.h200()
    for pid in holders:
        sc.add_process(0, pid, used_bytes=4 * GIB, bound=True, list_ms=20, release_ms=40)
    return str(sc.write(tmp_path / "scenario.txt"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("pid", "words"),
    [("0", "process groups"), ("-1", "process groups"), ("1", "init"), ("2147483648", "pid_max"),
     # A suite started by a shell that has exited meanwhile (nohup, a CI runner's reaped job) has init as its parent.
     (str(os.getpid()), "this process"), (str(os.getppid()), "init" if os.getppid() == 1 else "parent")],
)
def test_refused_pids_exit_2_with_a_plain_message_and_no_traceback(
    capsys: pytest.CaptureFixture[str], pid: str, words: str
) -> None:
    code, out, err = run(capsys, "--json", "kill", "--", pid) if pid.startswith("-") else run(
        capsys, "--json", "kill", pid)
    assert code == 2
    doc = json.loads(out)
    assert doc["error"]["type"] in ("KillError", "UsageError") and words in doc["error"]["message"]
    assert "Traceback" not in err and "OverflowError" not in out


def test_wait_pids_zero_names_no_internal_function(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--simulate", "h200", "wait", "--pids", "0", "--timeout", "0")
    assert code == 2 and "pids_gone" not in err and "process ID" in err


def test_a_launcher_that_ignores_sigterm_gets_sigkill_and_exit_0_waits_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    stubborn = start(IGNORE_TERM)
    assert _ready(stubborn) == "ready"
    code, out, _ = run(capsys, "--simulate", _scenario(tmp_path), "--json", "kill", str(stubborn.pid),
                       "--grace", "0.2", "--timeout", "20")
    assert code == 0
    (target,) = json.loads(out)["pids"]
    assert [s["signal"] for s in target["signals"]] == ["SIGTERM", "SIGKILL"] and target["exited_ns"] is not None
    assert stubborn.wait(timeout=10) == -9


def test_grace_never_does_not_escalate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    stubborn = start(IGNORE_TERM)
    assert _ready(stubborn) == "ready"
    code, out, _ = run(capsys, "--simulate", _scenario(tmp_path), "--json", "kill", str(stubborn.pid),
                       "--grace", "never", "--timeout", "0.3")
    assert code == 1
    doc: dict[str, Any] = json.loads(out)
    assert [s["signal"] for s in doc["pids"][0]["signals"]] == ["SIGTERM"]
    assert any("has not exited" in c for c in doc["culprits"]) and _alive(stubborn.pid)


def test_without_tree_the_worker_outlives_the_launcher_and_is_named_then_tree_ends_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    launcher = start(LAUNCHER, HOLD, device_file)
    worker = int(_ready(launcher))
    scenario = _scenario(tmp_path, worker)
    code, out, err = run(capsys, "--simulate", scenario, "kill", str(launcher.pid), "--timeout", "0.5")
    assert code == 1 and f"pid {worker}" in err and "--tree" in err
    assert _alive(worker)

    launcher2 = start(LAUNCHER, HOLD, device_file)
    worker2 = int(_ready(launcher2))
    code, out, _ = run(capsys, "--simulate", _scenario(tmp_path, worker, worker2), "--json", "kill", "--tree",
                       str(launcher2.pid), str(worker), "--timeout", "20")
    assert code == 0, out
    found = {t["pid"]: t["found_by"] for t in json.loads(out)["pids"]}
    assert found == {launcher2.pid: "named", worker: "named", worker2: "descendant"}
    assert not _alive(worker) and not _alive(worker2)


def test_all_holders_lists_then_kills_every_holder_and_spares_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    holder = start(HOLD, device_file)
    bystander = start("import time; print('ready', flush=True); time.sleep(60)")
    assert _ready(holder) == _ready(bystander) == "ready"
    code, out, err = run(capsys, "--simulate", _scenario(tmp_path, holder.pid), "--json", "kill", "--all-holders",
                         "--yes", "--timeout", "20")
    assert code == 0, err
    assert f"pid {holder.pid}" in err  # listed before anything was signalled
    # The plan names the device-file rule: the simulation's stand-ins only, never the host's real NVIDIA devices
    # (their holders hold none of the simulated GPUs: a simulated kill on a host with GPUs signalled them).
    assert f"note: device files: stand-in files {tmp_path}/dev/* only" in err and "no NVIDIA character" in err
    assert [t["pid"] for t in json.loads(out)["pids"]] == [holder.pid]
    assert not _alive(holder.pid) and _alive(bystander.pid)


def test_end_of_input_at_the_prompt_means_no(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    class ClosedTerminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    holder = start(HOLD, device_file)
    assert _ready(holder) == "ready"
    monkeypatch.setattr(sys, "stdin", ClosedTerminal(""))  # Ctrl-D: input() raises EOFError
    code, _, err = run(capsys, "--simulate", _scenario(tmp_path, holder.pid), "kill", "--all-holders")
    assert code == 2 and "not confirmed" in err and "EOFError" not in err
    assert _alive(holder.pid)


def test_all_holders_without_yes_and_without_a_terminal_signals_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    holder = start(HOLD, device_file)
    assert _ready(holder) == "ready"
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    code, _, err = run(capsys, "--simulate", _scenario(tmp_path, holder.pid), "kill", "--all-holders")
    assert code == 2 and "--yes" in err and _alive(holder.pid)


def test_holders_lists_nvml_and_device_file_holders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    listed = start(HOLD, device_file)
    hidden = start(HOLD, device_file)
    assert _ready(listed) == _ready(hidden) == "ready"
    code, out, _ = run(capsys, "--simulate", _scenario(tmp_path, listed.pid), "--json", "holders")
    assert code == 0
    doc = json.loads(out)
    by_pid = {h["pid"]: h for h in doc["holders"]}
    assert doc["schema"] == "nvmlcheck/holders" and doc["version"] == 1
    assert by_pid[listed.pid]["found_by"] == ["device-file", "nvml"]
    assert by_pid[listed.pid]["gpus"][0]["used_bytes"] == 4 * GIB
    assert by_pid[hidden.pid]["found_by"] == ["device-file"] and by_pid[hidden.pid]["gpus"] == []
    code, out, _ = run(capsys, "--simulate", _scenario(tmp_path, listed.pid), "holders")
    assert code == 0 and str(listed.pid) in out and str(hidden.pid) in out
    # The table says where each runs, as the document does (it said nothing of containers).
    for pid, h in by_pid.items():
        (line,) = [x for x in out.splitlines() if x.split()[:1] == [str(pid)]]
        where = (f"[in {h['container']}]" if h["container"] else
                 "[container unknown]" if "container" in (h.get("unknown") or {}) else None)
        assert (where is None and "[in " not in line and "[container unknown]" not in line) or (
            where is not None and where in line), (line, h)


def test_all_holders_with_nothing_to_kill_is_a_kill_document_of_a_plain_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], device_file: str
) -> None:
    code, out, err = run(capsys, "--simulate", _scenario(tmp_path), "--json", "kill", "--all-holders", "--yes",
                         "--timeout", "5")
    assert code == 0 and "nothing to kill" in err
    doc = json.loads(out)
    assert (doc["schema"], doc["clean"], doc["pids"]) == ("nvmlcheck/kill", True, [])
    busy = Scenario.h200()
    busy.add_process(0, 4_100_001, used_bytes=GIB)  # not a process here: left alone, and the GPU stays busy
    # --timeout bounds the holders reading too: 0.2 s raced the /proc scan on a loaded host (cut: exit 3); with 2 s
    # the reading completes and the wait times out.
    code, out, err = run(capsys, "--simulate", str(busy.write(tmp_path / "busy.txt")), "--json", "kill",
                         "--all-holders", "--yes", "--timeout", "2")
    doc = json.loads(out)
    assert code == 1 and doc["schema"] == "nvmlcheck/kill" and doc["clean"] is False
    assert [h["pid"] for h in doc["left_alone"]] == [4_100_001]


def test_all_on_gpu_refuses_when_nvmls_pids_are_of_another_numbering(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    # Issue 27: an older driver in a container lists host PIDs. The GPU-1 worker's host PID (4_100_002) names no
    # process here, and GPU 0's list holds a host PID that happens to be the local PID of that same worker: every
    # CUDA process has every /dev/nvidiaN open, so its device file proves nothing about which GPU.
    worker = start(HOLD, device_file)
    assert _ready(worker) == "ready"
    sc = Scenario.h200(devices=2)
    sc.add_process(0, worker.pid, used_bytes=4 * GIB)  # GPU 0's process, in host numbering: a collision here
    sc.add_process(1, 4_100_002, used_bytes=4 * GIB)  # the worker itself, by its host PID
    code, out, err = run(capsys, "--simulate", str(sc.write(tmp_path / "scenario.txt")), "--json", "kill",
                         "--all-on-gpu", "--devices", "0", "--yes", "--timeout", "2")
    assert code == 2, err
    doc = json.loads(out)
    assert doc["schema"] == "nvmlcheck/error" and "cannot be proven" in doc["error"]["message"]
    assert "4100002" in doc["error"]["message"] and "nothing was signalled" in doc["error"]["message"]
    assert _alive(worker.pid)
    # Consistent lists are still killed by GPU: the worker alone, listed under its own PID.
    sc = Scenario.h200(devices=2)
    sc.add_process(0, worker.pid, used_bytes=4 * GIB, bound=True, list_ms=20, release_ms=40)
    code, out, err = run(capsys, "--simulate", str(sc.write(tmp_path / "scenario.txt")), "--json", "kill",
                         "--all-on-gpu", "--devices", "0", "--yes", "--timeout", "20")
    assert code == 0, err
    assert [t["pid"] for t in json.loads(out)["pids"]] == [worker.pid] and not _alive(worker.pid)
