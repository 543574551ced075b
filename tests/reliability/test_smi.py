"""The nvidia-smi backend when nvidia-smi hangs, crawls, prints placeholders or damaged text, or the command prefix in
front of it fails, judged end to end through ``nvmlcheck.open("smi")``, ``Session.wait_until_clean`` and the CLI.
Sources: FACTS.md (nvidia-smi CSV: placeholders, exit codes, "nvidia-smi can hang in D state on a wedged GPU: always
a timeout, and kill the whole process group")."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.backends.smi import SmiBackend, _Running
from nvmlcheck.testing import Scenario, StepClock

from ._support import FAKE_SMI, FAKE_SMI_CMD, GIB, Smi, children, dead, wait_for

# --- nvidia-smi hanging -----------------------------------------------------------------------------------------------


def test_hanging_nvidia_smi_is_killed_at_its_deadline_and_nothing_is_left(smi: Smi) -> None:
    before = children()
    with smi.open(Scenario.h200()) as gpus:
        backend = gpus.backend
        assert isinstance(backend, SmiBackend)
        # 0.3 s per run from now on: opening with it could time out on a loaded machine before the test begins.
        backend._runner.timeout_s = 0.3
        given: list[float] = []
        pid_files: list[Path] = []
        real_start = backend._runner.start

        def start(args: Sequence[str], timeout_s: float | None = None) -> _Running:
            # A pid file per run: the fake truncates its file before writing the pid, and a run killed in between
            # (the wait's deadline can come at any moment of a run) left the one shared file empty under load.
            pid_files.append(smi.tmp_path / f"hung-child-{len(pid_files)}.pid")
            smi.knob("FAKE_SMI_CHILD_PID_FILE", str(pid_files[-1]))
            running = real_start(args, timeout_s)
            given.append(running.timeout_s)
            return running

        smi.monkeypatch.setattr(backend._runner, "start", start)
        smi.knob("FAKE_SMI_HANG", "1")  # from now on the process query hangs, with a child of its own
        smi.knob("FAKE_SMI_MATCH", "PIDS")
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=1.0)
    # Each run is bounded by smi_timeout_s, and by what is left of the wait (the mechanism; no wall-clock assertion).
    assert given and all(t <= 0.3 for t in given), given
    assert "did not answer within 0.3 s" in str(info.value) and "process group" in str(info.value)
    assert children() == before  # every run was killed and reaped
    written = [p.read_text() for p in pid_files if p.exists()]
    grandchildren = [int(text) for text in written if text.endswith("\n")]
    assert grandchildren, written  # a hung run started its own child
    wait_for(lambda: all(dead(pid) for pid in grandchildren), 2.0, "the hung nvidia-smi's own children to die")


# Stands in for an nvidia-smi that SIGKILL cannot end in time (D state): a helper outside its process group keeps the
# output pipe open, so the end of the output never comes.
_UNREAPABLE = """#!/bin/sh
setsid sleep 30 &
echo $! >> "{pid_file}"
exec sleep 30
"""


def test_nvidia_smi_whose_pipes_never_close_is_abandoned_after_a_bounded_grace(smi: Smi) -> None:
    pid_file = smi.tmp_path / "detached.pid"
    stuck = smi.script("stuck-nvidia-smi", _UNREAPABLE.format(pid_file=pid_file))
    before = children()
    start = time.monotonic()
    with pytest.raises(nc.BackendUnavailable) as info:
        smi.open(Scenario.h200(), command=[str(stuck)], timeout_s=0.3)
    elapsed = time.monotonic() - start
    try:
        # A hang guard only (normal: the 0.3 s deadline plus the 1 s reap grace per open run, ~1.3 s): without the
        # grace, reading would wait for the detached helper's `sleep 30` to close the pipe.
        assert elapsed < 20
        assert "did not answer within 0.3 s" in str(info.value)
        assert children() == before  # the leader was killed and reaped; only the detached helper outlives it
    finally:
        for detached in map(int, pid_file.read_text().split()):  # one per run that opening made
            if not dead(detached):
                os.kill(detached, signal.SIGKILL)


def test_slow_but_alive_nvidia_smi_answers(smi: Smi) -> None:
    smi.knob("FAKE_SMI_DELAY_S", "0.2")
    with smi.open(Scenario.h200(), timeout_s=2.0) as gpus:
        result = gpus.wait_until_clean(timeout=30)
    # A lower bound only checks that the knob slowed the runs (a loaded machine makes them slower, never faster).
    assert result.clean and result.poll_cost_ns >= 0.2e9


# --- placeholders, blank lines, CRLF, truncated lines, commas ----------------------------------------------------

PLACEHOLDERS = ("[N/A]", "[Not Supported]")  # the others fail the GPU: tests/contract (memory_call_failing_reads_alike)


@pytest.mark.parametrize("placeholder", PLACEHOLDERS)
def test_placeholder_memory_is_unknown_and_never_clean(smi: Smi, placeholder: str) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, unsupported=("memory",))
    smi.knob("FAKE_SMI_PLACEHOLDER", placeholder)
    with smi.open(sc) as gpus:
        d0, d1 = gpus.snapshot().devices
        assert d0.memory is not None and d0.memory.used_bytes == 0
        assert d1.memory is None and placeholder in (d1.why_unknown("memory") or "")
        # The timeout is on a fake clock (2 s a reading): polls complete however slowly a loaded machine runs them.
        t = StepClock(2.0)
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=30, clock=t.clock, sleep=t.sleep)
    assert "GPU 1" in str(info.value) and placeholder in str(info.value)


# Runs the fake nvidia-smi and damages what it prints for runs whose arguments contain $DAMAGE_MATCH.
_DAMAGER = """
import os, subprocess, sys
run = subprocess.run([sys.executable, "-S", {fake!r}, *sys.argv[1:]], capture_output=True, text=True)
text, mode = run.stdout, os.environ.get("DAMAGE", "")
if os.environ.get("DAMAGE_MATCH", "\\0") in " ".join(sys.argv[1:]):
    if mode == "crlf-blank":
        text = "\\r\\n" + text.replace("\\n", "\\r\\n\\r\\n")
    elif mode == "truncate":
        text = text[: text.rstrip("\\n").rfind(",")] + "\\n"
sys.stdout.write(text)
sys.stderr.write(run.stderr)
sys.exit(run.returncode)
"""


@pytest.fixture
def damaging(smi: Smi) -> list[str]:
    script = smi.script("damage.py", _DAMAGER.format(fake=str(FAKE_SMI)))
    smi.monkeypatch.setenv("DAMAGE_MATCH", "memory.used")  # the poll's --query-gpu, not the one at open
    return [sys.executable, "-S", str(script)]


def test_blank_lines_and_crlf_read_the_same(smi: Smi, damaging: list[str]) -> None:
    sc = Scenario.h200(devices=2)
    sc.add_process(1, 4_000_001, used_bytes=GIB)
    with smi.open(sc, command=damaging) as gpus:
        plain = gpus.snapshot(fields=nc.Fields.MEMORY)
        smi.monkeypatch.setenv("DAMAGE", "crlf-blank")
        damaged = gpus.snapshot(fields=nc.Fields.MEMORY)
        assert [d.memory for d in damaged.devices] == [d.memory for d in plain.devices]
        assert damaged.devices[1].memory is not None and damaged.devices[1].memory.used_bytes == GIB
        t = StepClock(2.0)  # a fake clock: the timeout comes after polls that completed, however loaded the machine
        with pytest.raises(nc.WaitTimeout, match="GPU 1"):
            gpus.wait_until_clean(timeout=30, clock=t.clock, sleep=t.sleep)
        assert gpus.wait_until_clean(timeout=30, devices=[0]).clean


def test_truncated_line_is_a_parse_error_that_fails_the_wait_fast(smi: Smi, damaging: list[str]) -> None:
    with smi.open(Scenario.h200(devices=2), command=damaging) as gpus:
        smi.monkeypatch.setenv("DAMAGE", "truncate")
        snap = gpus.snapshot(fields=nc.Fields.MEMORY)
        # The second GPU's row, cut short, fails that GPU alone (as NVML fails one GPU); the first still reports.
        assert [d.index for d in snap.devices] == [0]
        (failure,) = snap.failures
        assert failure.index == 1 and isinstance(failure.error, nc.SmiParseError)
        assert failure.error.line_no == 3 and "columns" in str(failure.error)
        polls: list[nc.TracePoint] = []
        with pytest.raises(nc.SmiParseError):
            gpus.wait_until_clean(timeout=10, on_poll=polls.append)
        assert polls == []  # nothing is guessed from damaged output, and it is not retried: the first poll raised


# Commas in process names: tests/unit/test_smi_backend.py::TestMemoryAndProcesses::test_names_with_commas_and_spaces
# (a real child named "my, odd  name") and tests/unit/test_smi_csv.py (parsing from both ends).


# --- the command prefix failing -----------------------------------------------------------------------------------

# A prefix that hands argv through (like `pct exec ID --`), or fails as its flag file says: ssh's own failure is
# exit 255, a remote shell's "command not found" 127.
_PREFIX = """#!/bin/sh
if [ -f "{flag}" ]; then
  code=$(cat "{flag}")
  [ "$code" = 255 ] && echo "ssh: connect to host gpu01 port 22: Connection refused" >&2
  [ "$code" = 127 ] && echo "sh: 1: nvidia-smi: not found" >&2
  exit "$code"
fi
exec "$@"
"""


@pytest.mark.parametrize("code", [255, 127])
def test_prefix_failing_at_open_is_backend_unavailable(smi: Smi, code: int, capsys: pytest.CaptureFixture[str]) -> None:
    flag = smi.tmp_path / "fail"
    flag.write_text(str(code))
    prefix = smi.script("prefix", _PREFIX.format(flag=flag))
    with pytest.raises(nc.BackendUnavailable) as info:
        smi.open(Scenario.h200(), prefix=[str(prefix)])
    assert isinstance(info.value.__cause__, nc.SmiTransportError)
    assert "SmiTransportError" in str(info.value) and str(code) in str(info.value)
    assert cli.main(["wait", "--backend", "smi", "--smi-prefix", str(prefix)]) == cli.EXIT_BACKEND
    assert "unavailable" in capsys.readouterr().err


@pytest.mark.parametrize("code", [255, 127])
def test_prefix_failing_mid_wait_fails_fast_and_is_never_gpu_state(smi: Smi, code: int) -> None:
    flag = smi.tmp_path / "fail"
    prefix = smi.script("prefix", _PREFIX.format(flag=flag))
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    with smi.open(sc, command=FAKE_SMI_CMD, prefix=[str(prefix)]) as gpus:
        gpus.snapshot()
        flag.write_text(str(code))
        polls: list[nc.TracePoint] = []
        with pytest.raises(nc.SmiTransportError) as info:
            gpus.wait_until_clean(timeout=10, on_poll=polls.append)
        assert polls == []  # fails fast: the first poll raised, nothing was retried until the deadline
    assert info.value.returncode == code


def test_no_nvidia_smi_at_all(smi: Smi, tmp_path: Path) -> None:
    with pytest.raises(nc.BackendUnavailable, match="cannot start"):
        smi.open(Scenario.h200(), command=[str(tmp_path / "nvidia-smi")])


def test_the_smi_backend_waits_with_its_own_default_policy(smi: Smi) -> None:
    # DEFAULT's 5 % duty cap, charged with each nvidia-smi run's CPU, stretched the interval to ~0.4 s on an H200 and
    # saw a reclaim ~0.9 s late; SMI_DEFAULT allows half a core. An explicit policy is kept as given.
    from nvmlcheck.wait import DEFAULT, SMI_DEFAULT

    with smi.open(Scenario.h200()) as gpus:
        assert gpus.wait_until_clean(timeout=30).policy is SMI_DEFAULT
        assert gpus.wait_until_clean(timeout=30, policy="default").policy is DEFAULT
    assert SMI_DEFAULT.max_duty is not None and DEFAULT.max_duty is not None
    assert SMI_DEFAULT.max_duty >= 10 * DEFAULT.max_duty
