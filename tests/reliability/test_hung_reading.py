"""A wait stuck in a call that never returns (a wedged driver: NVML calls can take minutes there) still ends: the
command line's watchdog reports it and exits 3 a second after the deadline (``_deadline.hung_after``). Mechanisms
only: which handler ran, with what, and the exit status of a command whose hung call outlasts the test's bound; no
duration is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck import _deadline
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

#: The stub's hung call: far longer than the test waits for the command (its bound, not an asserted time).
HANG_MS = 120_000
BOUND_S = 60


@pytest.fixture
def handler() -> Iterator[tuple[list[float], threading.Event]]:
    calls: list[float] = []
    fired = threading.Event()

    def record(late_s: float) -> None:
        calls.append(late_s)
        fired.set()

    _deadline.on_hung(record)
    yield calls, fired
    _deadline.on_hung(None)


def test_a_wait_still_running_after_its_deadline_calls_the_handler_once(
    handler: tuple[list[float], threading.Event],
) -> None:
    calls, fired = handler
    deadline = time.monotonic_ns()
    with _deadline.hung_after(deadline, after_ns=1_000_000):
        assert fired.wait(BOUND_S)  # the body "hangs" until the watchdog has fired
    assert len(calls) == 1 and calls[0] >= 0.001


def test_a_wait_that_ends_in_time_calls_nothing(handler: tuple[list[float], threading.Event]) -> None:
    calls, fired = handler
    guard = _deadline.hung_after(time.monotonic_ns(), after_ns=200_000_000)
    with guard:
        pass
    assert guard._done is not None and not guard._done.locked()  # released: the watchdog returns
    assert not fired.wait(0.5) and calls == []


def test_nothing_is_watched_without_a_handler_a_deadline_or_the_real_clock(
    handler: tuple[list[float], threading.Event],
) -> None:
    assert _deadline.hung_after(None)._done is None
    assert _deadline.hung_after(0, clock=lambda: 0)._done is None  # a test's injected clock is not the watchdog's
    _deadline.on_hung(None)
    assert _deadline.hung_after(time.monotonic_ns())._done is None


def _hung(tmp_path: Path, at_ms: int = 0) -> Path:
    s = Scenario.h200(devices=1)
    step = s if at_ms == 0 else s.at_ms(at_ms)
    step.fault("nvmlDeviceGetMemoryInfo_v2", None, delay_ms=HANG_MS)
    return s.write(tmp_path / "hung.txt")


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVMLCHECK_") or k == "NVMLCHECK_STUB_CACHE"}
    # The console script's own process (python -m: the same script()), where the handler is installed.
    return subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], capture_output=True, text=True, env=env,
                          timeout=BOUND_S, check=False)  # fmt: skip


@pytest.mark.parametrize(
    "command",
    [
        ["wait", "--timeout", "0"],
        ["ready", "--timeout", "0"],
        ["ready", "--timeout", "0.2"],
        ["wait", "--timeout", "0.2"],
        ["select", "1", "--wait", "0.2"],
        ["kill", "--devices", "0", "--all-holders", "--yes", "--timeout", "0.2"],  # its reading before any signal
    ],
)
def test_a_hung_reading_ends_the_command_with_exit_3(tmp_path: Path, command: list[str]) -> None:
    done = _run(["--simulate", str(_hung(tmp_path)), *command])
    assert done.returncode == 3, done.stderr
    assert "has not returned" in done.stderr and "after the deadline" in done.stderr


def test_a_call_hung_mid_wait_ends_it_with_an_error_document(tmp_path: Path) -> None:
    s = Scenario.h200(devices=1)
    s.add_process(0, 4_000_001, used_bytes=2**30)  # never clean: the wait polls on until the call hangs
    s.at_ms(200).fault("nvmlDeviceGetMemoryInfo_v2", None, delay_ms=HANG_MS)
    done = _run(["--json", "--simulate", str(s.write(tmp_path / "mid.txt")), "wait", "--timeout", "0.5"])
    assert done.returncode == 3, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == 3
    assert doc["error"]["type"] == "HungReading" and "has not returned" in doc["error"]["message"]


def test_in_process_callers_get_no_handler(tmp_path: Path) -> None:
    # main() in a tool's own process must never end that process: only the script installs the handler.
    from nvmlcheck import cli

    assert cli.main(["--simulate", "h200", "wait", "--timeout", "0"]) == 0
    assert _deadline._hung_handler is None


def _held(tmp_path: Path) -> Scenario:
    s = Scenario.h200(devices=1)
    s.add_process(0, 4_000_001, used_bytes=2**30)  # never clean: a wait follows the first reading
    return s


@pytest.mark.parametrize("command", [["ready", "--timeout", "0.5"], ["wait", "--events", "--timeout", "0.5"]])
def test_a_hung_event_registration_leaves_the_command_polling(tmp_path: Path, command: list[str]) -> None:
    """A registration call that never returns was outside every watchdog (ready listens by default): the command
    ran until the driver answered, then said not ready (exit 1). Then the watchdog ended it (exit 3, no answer).
    Now the registration runs in the listener's thread and the command waits for it until its deadline at most:
    it polls, answers its own question by its timeout (held: exit 1) and says why it heard no events."""
    s = _held(tmp_path)
    s.fault("nvmlDeviceRegisterEvents", None, delay_ms=HANG_MS)
    done = _run(["--json", "--simulate", str(s.write(tmp_path / "reg.txt")), *command])
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    assert doc["schema"] in ("nvmlcheck/ready", "nvmlcheck/wait")
    assert "nvmlDeviceRegisterEvents on GPU 0 has not returned" in done.stdout + done.stderr  # ready: its notes


def test_a_hung_health_reading_after_a_ready_wait_ends_it_with_exit_3(tmp_path: Path) -> None:
    """The health read again before a wait says ready was outside the watchdog: a hung call there ran on until the
    driver answered, and the command then said ready (exit 0), long past its deadline."""
    s = Scenario.h200(devices=1)
    s.fault("nvmlDeviceGetMemoryInfo_v2", 10, count=1)  # the first reading cannot judge the GPU: a wait follows
    s.fault("nvmlDeviceGetRemappedRows", None, after=1, delay_ms=HANG_MS)  # the first reading's passes
    done = _run(["--simulate", str(s.write(tmp_path / "health.txt")), "ready", "--timeout", "0.5", "--no-events"])
    assert done.returncode == 3, done.stderr
    assert "has not returned" in done.stderr


def test_kill_events_with_a_hung_registration_signals_and_answers(tmp_path: Path) -> None:
    # kill --events registered its listener before checking and signalling the PIDs, with no watchdog: a hung
    # nvmlDeviceRegisterEvents held a PID's refusal (exit 2) and the signal itself, and then the whole command.
    # Since the registration runs in the listener's thread, waited for until the deadline at most, the kill
    # signals and its wait polls: the GPU (idle) is clean once the target exited, and the listener's reason says
    # why no event was heard.
    s = Scenario.h200(devices=1)
    s.fault("nvmlDeviceRegisterEvents", None, delay_ms=HANG_MS)
    path = str(s.write(tmp_path / "reg.txt"))
    refused = _run(["--simulate", path, "kill", "--events", "--timeout", "0.2", "4194305"])
    assert refused.returncode == 2 and "not a process ID" in refused.stderr, refused.stderr
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        done = _run(["--simulate", path, "kill", "--events", "--timeout", "0.2", str(target.pid)])
        assert done.returncode == 0 and "has not returned" in done.stderr, done.stderr
        assert target.wait(BOUND_S) == -15
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def test_a_kill_whose_wait_hangs_after_its_signal_says_what_each_target_got(tmp_path: Path) -> None:
    # The watchdog's report after a kill's first signal said nothing of the targets: a launch script could not tell
    # from it that the process had been signalled (and had exited).
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        done = _run(["--json", "--simulate", str(_hung(tmp_path)), "kill", "--timeout", "0.2", str(target.pid)])
        assert done.returncode == 3, done.stderr
        doc = json.loads(done.stdout)
        assert doc["error"]["type"] == "HungReading"
        (pid,) = doc["pids"]
        assert pid["pid"] == target.pid and pid["signals"][0]["signal"] == "SIGTERM"
        assert target.wait(BOUND_S) == -15
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


@pytest.mark.parametrize(("backend", "watched"), [("nvml", True), ("smi", False)])
def test_the_watchdog_is_for_nvml_calls_only(monkeypatch: pytest.MonkeyPatch, backend: str, watched: bool) -> None:
    # NVML calls can hang where no thread reaches them; nvidia-smi's runs are killed at their own bounds by the
    # runner, and one complete check (timeout 0) over ssh can take more than the watchdog's second: as a "hung
    # reading" it ended with exit 3. The script installs the watchdog's handler for the NVML backend only.
    from nvmlcheck import cli
    from nvmlcheck.cli import _common

    installed: list[object] = []
    monkeypatch.setattr(_common, "FAST_EXIT", True)  # as the script; --simulate keeps the process (no os._exit)
    monkeypatch.setattr(_deadline, "on_hung", installed.append)
    assert cli.main(["--simulate", "h200", "--backend", backend, "wait", "--timeout", "0"]) == 0
    assert bool(installed) is watched
