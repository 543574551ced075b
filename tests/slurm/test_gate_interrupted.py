"""A gate ended before its verdict still writes its record, and drains with what it found.

slurmd ends a Prolog or Epilog at PrologEpilogTimeout with SIGTERM to its process group and SIGKILL 10 ms later
(``_kill_pg`` in Slurm's ``src/common/run_command.c``). The gate used to exit 143 with no ``--record`` line and no
drain reason of its own: what it had found was lost. The in-process cases raise the interrupt at a counted poll
(nothing here depends on timing); the subprocess case sends a real SIGTERM once the gate is known to be waiting on
scontrol (its log line is there).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.cli import main
from nvmlcheck.cli._signals import Terminated
from nvmlcheck.session import Session
from nvmlcheck.testing import Scenario
from nvmlcheck.wait import PollPolicy, TracePoint, WaitOptions

from .test_gate import FakeScontrol, busy, scontrol, slurm_env

__all__ = ["scontrol", "slurm_env"]  # fixtures used by name

GIB = 1 << 30


def interrupt_at_poll(monkeypatch: pytest.MonkeyPatch, polls: int, exc: BaseException, *,
                      full_every_s: float | None = None) -> list[int]:
    """The readiness wait raises ``exc`` from its ``polls``-th poll (after the gate has seen it). ``full_every_s``:
    the wait's policy reads the process lists at most this often (0: at every poll; large: the first poll only,
    later ones read the memory alone while it is held), so which reading the interrupted poll was is the test's
    choice, not the scheduler's (the default, 0.1 s, makes it depend on how fast the polls came)."""
    seen: list[int] = []
    original = Session.ready

    def ready(self: Session, *args: Any, options: WaitOptions | None = None, **kwargs: Any) -> Any:
        assert options is not None and options.on_poll is not None
        observe = options.on_poll

        def on_poll(point: TracePoint) -> None:
            observe(point)
            seen.append(1)
            if len(seen) == polls:
                raise exc

        changed = options.with_(on_poll=on_poll)
        if full_every_s is not None:
            changed = changed.with_(policy=PollPolicy(interval_s=0.001, full_every_s=full_every_s))
        return original(self, *args, options=changed, **kwargs)

    monkeypatch.setattr(Session, "ready", ready)
    return seen


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


#: What the interrupted poll read, by the policy's full_every_s: the memory alone (the wait's probe, while the memory
#: is held), or the process lists too (no local process has the busy scenario's PID: an exited holder, its memory
#: coming back). Before, the default policy left it to the machine: poll 3 was the probe only when it came within
#: 0.1 s of poll 1, and on a loaded machine it was a full reading, which the test did not expect.
READINGS = {
    "probe": (3600.0, "unknown", "GPU 0: 8.0 GiB in use after "),
    "full": (0.0, "reclaiming", "GPU 0: 8.0 GiB of exited pid 4123456 still coming back after "),
}


@pytest.mark.usefixtures("slurm_env")
@pytest.mark.parametrize("reading", list(READINGS))
@pytest.mark.parametrize("case", [(Terminated(signal.SIGTERM), 143, "SIGTERM"), (KeyboardInterrupt(), 130, "SIGINT")])
def test_an_interrupted_prolog_records_what_it_found_and_drains_with_it(
        scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        *, case: tuple[BaseException, int, str], reading: str) -> None:
    exc, code, name = case
    full_every_s, kind, text = READINGS[reading]
    record = tmp_path / "slurm.jsonl"
    seen = interrupt_at_poll(monkeypatch, 3, exc, full_every_s=full_every_s)
    scontrol.state.write_text(scontrol.line)
    got = main(["--simulate", str(busy(tmp_path)), "slurm", "prolog", "--scontrol", str(scontrol.path), "--node", "n1",
                "--timeout", "60", "--record", str(record)])
    err = capsys.readouterr().err
    assert got == code and len(seen) == 3
    (doc,) = records(record)
    assert doc["interrupted"] == name and doc["ready"] is False and doc["exit_code"] == code
    assert doc["readiness"]["polls"] == 3
    held, stop = doc["causes"]
    # What the last poll showed (the memory alone, or with the process lists: READINGS), then the interruption:
    # when, and while doing what.
    assert held["used_bytes"] == 8 * GIB and held["gpu"] == 0 and held["kind"] == kind
    assert held["text"].startswith(text)
    assert stop["kind"] == "unknown"
    assert stop["text"].startswith(f"interrupted by {name} after ")
    assert stop["text"].endswith(" while waiting for the GPUs to be ready (GPU 0)")
    # The record went out first (slurmd's SIGKILL follows by 10 ms); the drain after it, with the same reason.
    assert doc["scontrol"] == [] and doc["reason"].startswith(f"nvmlcheck: {text}")
    assert scontrol.updates() == [["update", "NodeName=n1", "State=DRAIN", f"Reason={doc['reason']}"]]
    line = err.splitlines()[-1]  # after the simulation's banner
    assert line.startswith(f"nvmlcheck slurm prolog: {text}")
    assert f"; interrupted by {name}" in line


@pytest.mark.usefixtures("slurm_env")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_real_signal_writes_the_record_before_anything_unwinds(
        scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        signum: int) -> None:
    # slurmd's SIGKILL follows its SIGTERM by 10 ms. The record waited for the exception to unwind the wait and close
    # the NVML session first: 7 ms from SIGTERM to the record (median, cores busy), and 1 run in 5 lost it to the
    # SIGKILL. The signal's handler writes it now, before anything unwinds: it is there when the session closes.
    record = tmp_path / "slurm.jsonl"
    at_close: list[int] = []
    close_after = Session._close_after

    def closing(self: Session, *args: Any, **kwargs: Any) -> None:
        at_close.append(len(records(record)))
        close_after(self, *args, **kwargs)

    monkeypatch.setattr(Session, "_close_after", closing)
    original = Session.ready

    def ready(self: Session, *args: Any, options: WaitOptions | None = None, **kwargs: Any) -> Any:
        assert options is not None and options.on_poll is not None
        observe, polls = options.on_poll, []

        def on_poll(point: TracePoint) -> None:
            observe(point)
            polls.append(1)
            if len(polls) == 2:
                os.kill(os.getpid(), signum)  # a real signal: the handlers run here, in the main thread

        return original(self, *args, options=options.with_(on_poll=on_poll), **kwargs)

    monkeypatch.setattr(Session, "ready", ready)
    scontrol.state.write_text(scontrol.line)
    got = main(["--simulate", str(busy(tmp_path)), "slurm", "prolog", "--scontrol", str(scontrol.path), "--node", "n1",
                "--timeout", "60", "--record", str(record)])
    capsys.readouterr()
    assert got == 128 + signum and at_close == [1]
    (doc,) = records(record)  # once: the handler's, not again on the way out
    assert doc["interrupted"] == signal.Signals(signum).name and doc["exit_code"] == 128 + signum
    assert doc["causes"][-1]["text"].endswith(" while waiting for the GPUs to be ready (GPU 0)")


@pytest.mark.usefixtures("slurm_env")
def test_an_interrupted_epilog_records_what_it_signalled(
        scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]]) -> None:
    # The job's worker (its environment names the job, it runs as the job's user) holds GPU 0 and exits on SIGTERM;
    # the memory stays held (it is not bound to the worker), so the wait polls until the interrupt.
    worker = python_child("import time; print('ready', flush=True); time.sleep(60)")  # SLURM_JOB_ID=42 inherited
    sc = Scenario.h200(devices=1)
    sc.add_process(0, worker.pid, used_bytes=8 * GIB)
    record = tmp_path / "slurm.jsonl"
    interrupt_at_poll(monkeypatch, 2, Terminated(signal.SIGTERM))
    scontrol.state.write_text(scontrol.line)
    got = main(["--simulate", str(sc.write(tmp_path / "job.txt")), "slurm", "epilog", "--scontrol",
                str(scontrol.path), "--node", "n1", "--timeout", "60", "--record", str(record), "--no-drain"])
    capsys.readouterr()
    assert got == 143
    (doc,) = records(record)
    assert doc["interrupted"] == "SIGTERM" and doc["ready"] is False
    assert [k["pid"] for k in doc["killed"]] == [worker.pid]
    assert doc["killed"][0]["signals"][0]["signal"] == "SIGTERM"
    assert scontrol.calls() == []  # --no-drain: nothing run


def test_an_interruption_alone_drains_nothing(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Interrupted while choosing the job's GPUs: nothing found wrong, so no drain of nvmlcheck's (slurmd drains a
    # node whose Prolog it ended); the record says it was interrupted, and where.
    from nvmlcheck import slurm

    def interrupted(*args: object, **kwargs: object) -> object:
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(slurm, "job_gpu_indices", interrupted)
    record = tmp_path / "slurm.jsonl"
    scontrol.state.write_text(scontrol.line)
    got = main(["--simulate", str(Scenario.h200().write(tmp_path / "idle.txt")), "slurm", "prolog", "--scontrol",
                str(scontrol.path), "--node", "n1", "--timeout", "60", "--record", str(record)])
    capsys.readouterr()
    (doc,) = records(record)
    assert got == 143 and doc["interrupted"] == "SIGTERM" and doc["ready"] is False and doc["devices"] == []
    (cause,) = doc["causes"]
    assert cause["text"].startswith("interrupted by SIGTERM after ")
    assert cause["text"].endswith(" while choosing the job's GPUs")
    assert scontrol.calls() == []


def test_a_gate_signalled_while_scontrol_hangs_records_it_and_ends_scontrol(
        scontrol: FakeScontrol, tmp_path: Path) -> None:
    # The health check reads the node's state first; that scontrol hangs (it logs, then sleeps). A real SIGTERM,
    # once the log shows it running, ends the gate: exit 143, the record, and scontrol's group killed.
    scontrol.path.write_text(
        "#!/bin/sh\n"
        f"printf '%s\\037' \"$@\" >> {scontrol.log}; echo >> {scontrol.log}\n"
        f"echo $$ > {tmp_path / 'scontrol.pid'}\n"
        'if [ "$1" = -o ]; then exec sleep 120; fi\n', encoding="utf-8")
    record = tmp_path / "slurm.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    gate = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "--simulate", str(Scenario.h200().write(tmp_path / "idle.txt")),
         "slurm", "health", "--scontrol", str(scontrol.path), "--node", "n1", "--timeout", "60", "--record",
         str(record)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        pid_file = tmp_path / "scontrol.pid"
        for _ in range(6000):  # until scontrol runs (bounded: 60 s of 10 ms looks at a file)
            if (pid_file.exists() and pid_file.read_text().strip()) or gate.poll() is not None:
                break
            subprocess.run(["sleep", "0.01"], check=True)
        assert gate.poll() is None, gate.communicate()
        sleeper = int(pid_file.read_text())
        gate.send_signal(signal.SIGTERM)
        _, err = gate.communicate(timeout=60)
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()
    assert gate.returncode == 143, err
    (doc,) = records(record)
    assert doc["interrupted"] == "SIGTERM" and doc["exit_code"] == 143 and doc["command"] == "health"
    (cause,) = doc["causes"]
    assert cause["text"].startswith("interrupted by SIGTERM after ")
    assert cause["text"].endswith(" while reading the node's state")
    assert not Path(f"/proc/{sleeper}").exists() or "Z" in Path(f"/proc/{sleeper}/stat").read_text().split()[2]
    assert [c[:2] for c in scontrol.calls()] == [["-o", "show"]]  # nothing found: no drain


@pytest.mark.usefixtures("slurm_env")
def test_a_signal_once_the_verdict_is_recorded_leaves_the_verdict(
        scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The verdict (not ready, drained) is recorded; SIGTERM comes while it is being printed: exit 1 and the record
    # as it was, not 143 (which slurmd would read as a gate that never decided).
    from nvmlcheck.cli import _slurm

    def say(self: object, *args: object) -> None:
        raise Terminated(signal.SIGTERM)

    monkeypatch.setattr(_slurm._Gate, "_say", say)
    record = tmp_path / "slurm.jsonl"
    scontrol.state.write_text(scontrol.line)
    # The job's GPU needs a reset: not ready at once, without waiting, so that the time left for scontrol is the
    # 5 s reserve of --timeout 60 (a busy GPU on --timeout 0.5 left it 0.1 s, two scontrol starts on a loaded
    # machine, and the drain this test counts could be cut).
    sc = Scenario.h200(devices=2)
    sc.set_device(0, remapped_rows=(0, 1, True, False))
    got = main(["--simulate", str(sc.write(tmp_path / "remap.txt")), "slurm", "prolog", "--scontrol",
                str(scontrol.path), "--node", "n1", "--timeout", "60", "--record", str(record)])
    capsys.readouterr()
    (doc,) = records(record)
    assert got == 1 and doc["exit_code"] == 1 and doc["interrupted"] is None
    assert len(scontrol.updates()) == 1  # drained once, by the verdict
