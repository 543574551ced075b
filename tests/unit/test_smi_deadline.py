"""The nvidia-smi backend under a wait's deadline (issue 12): each run gets at most the time left, none starts once
it has passed, and a run cut by it abandons the pass (DeadlinePassed) rather than failing with SmiTimeout.

Checked through the mechanism, the timeout each run is given (on a fake clock), never by timing the runs: a wait
used to overrun its deadline by a whole nvidia-smi run timeout (10 s) because the deadline was not passed down.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.backends.smi import SmiBackend, _Running
from nvmlcheck.errors import DeadlinePassed, SmiTimeout
from nvmlcheck.model import Fields
from nvmlcheck.wait import Deadline

ROOT = Path(__file__).resolve().parents[2]
FAKE_CMD = [sys.executable, "-S", str(ROOT / "stubs" / "fake_nvidia_smi.py")]
KNOBS = ("FAKE_SMI_DELAY_S", "FAKE_SMI_HANG", "FAKE_SMI_EXIT", "FAKE_SMI_MATCH", "FAKE_SMI_CHILD_PID_FILE")
START = 1_000_000_000_000
MS = 1_000_000


class FrozenClock:
    """A clock that moves only when told: the time left before a deadline is exactly what the test says."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> int:
        return self.now


@pytest.fixture(autouse=True)
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "scenario.txt"
    path.write_text("nvmlcheck-stub-scenario 1\ndevice index=0\n", encoding="utf-8")
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(path))
    for knob in KNOBS:
        monkeypatch.delenv(knob, raising=False)
    return path


def record_runs(backend: SmiBackend, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeout every run of ``backend`` is started with, in order."""
    given: list[float] = []
    runner = backend._runner
    real_start = runner.start

    def start(args: Sequence[str], timeout_s: float | None = None) -> _Running:
        running = real_start(args, timeout_s)
        given.append(running.timeout_s)
        return running

    monkeypatch.setattr(runner, "start", start)
    return given


def test_each_run_gets_at_most_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SmiBackend(command=FAKE_CMD)  # its own run timeout: 10 s
    given = record_runs(backend, monkeypatch)
    clock = FrozenClock()
    snap = backend.snapshot(None, Fields.WAIT, deadline=Deadline(START + 2500 * MS, clock))
    assert [d.index for d in snap.devices] == [0]
    assert given == [2.5, 2.5]  # the GPU query and the process query, each given the 2.5 s left, not 10 s


def test_a_far_deadline_leaves_the_runs_own_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SmiBackend(command=FAKE_CMD, timeout_s=4.0)
    given = record_runs(backend, monkeypatch)
    backend.snapshot(None, Fields.WAIT, deadline=Deadline(START + 60_000 * MS, FrozenClock()))
    backend.snapshot(None, Fields.WAIT)
    assert given == [4.0] * 4


def test_no_run_starts_once_the_deadline_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SmiBackend(command=FAKE_CMD)
    given = record_runs(backend, monkeypatch)
    with pytest.raises(DeadlinePassed):
        backend.snapshot(None, Fields.WAIT, deadline=Deadline(START, FrozenClock()))
    assert given == []


def test_a_hung_run_cut_by_the_wait_abandons_the_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = SmiBackend(command=FAKE_CMD)
    given = record_runs(backend, monkeypatch)
    monkeypatch.setenv("FAKE_SMI_HANG", "1")
    with pytest.raises(DeadlinePassed) as info:
        backend.snapshot(None, Fields.WAIT, deadline=Deadline(START + 300 * MS, FrozenClock()))
    assert given == [0.3, 0.3]
    cause = info.value.__cause__
    assert isinstance(cause, SmiTimeout) and cause.timeout_s == 0.3  # killed at the wait's deadline, not at 10 s


def test_the_runs_own_timeout_is_still_an_smi_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the wait's deadline abandons the pass; a run past its own (shorter) timeout is nvidia-smi's failure,
    # transient in a wait and named by its WaitTimeout.
    backend = SmiBackend(command=FAKE_CMD, timeout_s=0.3)
    monkeypatch.setenv("FAKE_SMI_HANG", "1")
    with pytest.raises(SmiTimeout):
        backend.snapshot(None, Fields.WAIT, deadline=Deadline(START + 60_000 * MS, FrozenClock()))


def test_a_wait_hands_its_deadline_to_every_run(monkeypatch: pytest.MonkeyPatch) -> None:
    with nc.open("smi", smi_command=FAKE_CMD) as gpus:  # runs may take 10 s each on their own
        backend = gpus.backend
        assert isinstance(backend, SmiBackend)
        given = record_runs(backend, monkeypatch)
        monkeypatch.setenv("FAKE_SMI_HANG", "1")  # nvidia-smi now hangs (a wedged GPU)
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=0.5)
    assert given and all(t <= 0.5 for t in given), given
    assert info.value.polls == 0 and "no poll finished before the deadline" in str(info.value)
