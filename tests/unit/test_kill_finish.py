"""The command line's kill finishes without the GPUs (a device that names no GPU, no backend) within a bound.

The targets were signalled before NVML opened; when the GPUs then cannot be judged, ``cli._kill._finish_without_gpus``
still sees the kill through (SIGKILL at ``--grace``) before the error is reported. With ``--timeout none`` it had no
bound: a target that never exits (SIGTERM ignored under ``--grace never``; a D state after SIGKILL) held the command
forever. A fake clock counts: the loop must end once ``kill.AFTER_KILL_WAIT_S`` has passed with nothing more to send.
"""

from __future__ import annotations

import argparse

import pytest

from nvmlcheck import kill
from nvmlcheck._proc import signals, targets
from nvmlcheck.cli import _kill

STEP_NS = 10_000_000  # each clock reading moves the clock on by 10 ms
BOUND_READINGS = 100_000  # ~17 minutes of fake time: a loop past this has no bound


class _Pin:
    """A pinned target that never exits, whatever it is sent."""

    pid = 4242
    comm = "stubborn"
    mode = "pidfd"

    def __init__(self) -> None:
        self.sent: list[int] = []

    def exited(self) -> bool:
        return False

    def send(self, sig: int) -> bool:
        self.sent.append(sig)
        return True


class _Clock:
    def __init__(self) -> None:
        self.now_ns = 0
        self.readings = 0

    def __call__(self) -> int:
        self.readings += 1
        if self.readings > BOUND_READINGS:
            raise AssertionError("the wait without the GPUs has no bound")
        self.now_ns += STEP_NS
        return self.now_ns


@pytest.mark.parametrize(("grace", "first", "sigkill"), [
    (None, signals.SIGTERM, False),  # --grace never: nothing more will be sent
    (1.0, signals.SIGTERM, True),  # SIGKILL at the grace, then a D state: nothing more to send
    (5.0, signals.SIGKILL, False),  # --signal KILL: escalated from the start
])
def test_without_a_timeout_the_exits_are_awaited_for_a_bounded_time(
    monkeypatch: pytest.MonkeyPatch, grace: float | None, first: int, sigkill: bool
) -> None:
    pin = _Pin()
    found = targets.TargetSet([targets.Target(pin, "named")], tree=False, mode="auto")  # type: ignore[arg-type]
    clock = _Clock()
    found.clock, found.started, found.first = clock, 0, first
    found.escalated = first == signals.SIGKILL
    monkeypatch.setattr("nvmlcheck.cli._kill.time.sleep", lambda s: None)
    left = _kill._finish_without_gpus(kill.KillPlan(found), argparse.Namespace(grace=grace, timeout=None))
    assert left == [pin.pid]
    assert (signals.SIGKILL in pin.sent) is sigkill
    waited_s = clock.now_ns / 1e9
    assert waited_s <= (grace or 0.0) + kill.AFTER_KILL_WAIT_S + 0.1  # a fake clock: exact, not wall time


def test_a_timeout_still_bounds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pin = _Pin()
    found = targets.TargetSet([targets.Target(pin, "named")], tree=False, mode="auto")  # type: ignore[arg-type]
    clock = _Clock()
    found.clock, found.started, found.first = clock, 0, signals.SIGTERM
    monkeypatch.setattr("nvmlcheck.cli._kill.time.sleep", lambda s: None)
    assert _kill._finish_without_gpus(kill.KillPlan(found), argparse.Namespace(grace=None, timeout=2.0)) == [pin.pid]
    assert 2.0 <= clock.now_ns / 1e9 <= 2.0 + 2 * STEP_NS / 1e9
