"""A tree's stop before its SIGKILL (``TargetSet._stop_tree``) rescans only once every member is seen stopped.

``kill()`` only queues SIGSTOP, and since Linux 4.20 a fork already under way completes after it (only a fatal signal
aborts one): a rescan made at once could miss the child and the SIGKILL that follows leave it alive, a kill that
reports clean with a worker running (``tests/stub/test_kill_tree_forker.py`` caught it in 3 kills of ~650 under load).
Fakes stand in for the pinned processes: each reports running for a few reads after its SIGSTOP, then stopped.
"""

from __future__ import annotations

import pytest

from nvmlcheck._proc import signals, targets
from nvmlcheck._proc.procfs import ProcStat


class _Pin:
    """A pinned process that stops ``lag`` reads of its stat after SIGSTOP (never, with ``lag`` None: state D)."""

    def __init__(self, pid: int, lag: int | None) -> None:
        self.pid = pid
        self.lag = lag
        self.sent: list[int] = []
        self.reads_after_stop = 0

    def exited(self) -> bool:
        return False

    def send(self, sig: int) -> bool:
        self.sent.append(sig)
        return True

    @property
    def stopped(self) -> bool:
        return signals.SIGSTOP in self.sent and self.lag is not None and self.reads_after_stop > self.lag

    def stat(self) -> ProcStat:
        if signals.SIGSTOP in self.sent:
            self.reads_after_stop += 1
        state = "T" if self.stopped else ("D" if self.lag is None else "R")
        return ProcStat(pid=self.pid, comm="worker", state=state, ppid=1, start_ticks=1)


class _Time:
    """``targets.time`` for the test: no real waiting; each sleep moves the clock on by what it asked for."""

    def __init__(self) -> None:
        self.now_ns = 0
        self.sleeps = 0

    def monotonic_ns(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now_ns += int(seconds * 1e9)


@pytest.fixture
def fake_time(monkeypatch: pytest.MonkeyPatch) -> _Time:
    clock = _Time()
    monkeypatch.setattr(targets, "time", clock)
    return clock


def _tree(pins: list[_Pin]) -> targets.TargetSet:
    return targets.TargetSet([targets.Target(p, "named") for p in pins], tree=True, mode="auto")  # type: ignore[arg-type]


def test_the_rescan_waits_until_every_member_is_stopped(monkeypatch: pytest.MonkeyPatch, fake_time: _Time) -> None:
    pins = [_Pin(101, lag=0), _Pin(102, lag=3), _Pin(103, lag=7)]
    tree = _tree(pins)
    seen: list[list[bool]] = []
    monkeypatch.setattr(tree, "scan_descendants", lambda: seen.append([p.stopped for p in pins]))
    tree._stop_tree()
    assert seen == [[True, True, True]]  # one round (nothing new found), and only after all three stopped
    assert all(p.sent == [signals.SIGSTOP] for p in pins)


def test_a_member_that_never_stops_delays_the_rescan_only_until_the_bound(
    monkeypatch: pytest.MonkeyPatch, fake_time: _Time
) -> None:
    # A process in uninterruptible sleep (a GPU process stuck in the driver) does not stop: the kill goes on.
    pins = [_Pin(201, lag=None), _Pin(202, lag=1)]
    tree = _tree(pins)
    rescans: list[int] = []
    monkeypatch.setattr(tree, "scan_descendants", lambda: rescans.append(fake_time.now_ns))
    tree._stop_tree()
    assert rescans == [targets.STOP_WAIT_NS]  # polled until the bound (and not past it), then the rescan anyway
    assert pins[1].stopped and pins[0].reads_after_stop == fake_time.sleeps + 1


@pytest.mark.parametrize("step", ["escalate", "send_first"])
@pytest.mark.parametrize("where", ["while stopping", "during the rescan"])
def test_an_interrupt_while_the_tree_is_stopped_still_resumes_it(
    monkeypatch: pytest.MonkeyPatch, fake_time: _Time, step: str, where: str
) -> None:
    # Ctrl-C (or SIGTERM's handler, or a refusal from the rescan) inside the stop: every member gets SIGCONT on the
    # way out, so nothing stays SIGSTOPped holding its GPU. Before the fix the stop ran outside the try.
    pins = [_Pin(301, lag=0), _Pin(302, lag=2)]
    tree = _tree(pins)
    if step == "escalate":
        monkeypatch.setattr(tree, "scan_descendants", lambda: None)
        tree.send_first(signals.SIGTERM, clock=lambda: 0)
        for p in pins:
            p.sent.clear()

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    if where == "while stopping":
        monkeypatch.setattr(tree, "_await_stopped", interrupt)
    else:
        monkeypatch.setattr(tree, "scan_descendants", interrupt if step == "escalate" else _second_call(interrupt))
    with pytest.raises(KeyboardInterrupt):
        if step == "escalate":
            tree.escalate(signals.SIGKILL)
        else:
            tree.send_first(signals.SIGKILL, clock=lambda: 0)
    for p in pins:
        assert signals.SIGSTOP in p.sent and p.sent[-1] == signals.SIGCONT, p.sent
    assert not tree.stopping


def _second_call(then: object) -> object:
    """A stand-in for ``scan_descendants`` that does nothing the first time (send_first's own scan), then ``then``."""
    calls = []

    def scan(*args: object) -> None:
        calls.append(args)
        if len(calls) > 1:
            then()  # type: ignore[operator]

    return scan


class _InterruptedPin(_Pin):
    """A member whose SIGCONT is interrupted once (Ctrl-C lands while the tree is resumed)."""

    interrupted = False

    def send(self, sig: int) -> bool:
        if sig == signals.SIGCONT and not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return super().send(sig)


def test_an_interrupt_while_the_tree_is_resumed_still_resumes_every_member(
    monkeypatch: pytest.MonkeyPatch, fake_time: _Time
) -> None:
    # Ctrl-C in the middle of the SIGCONT round: before the fix the round stopped there, and every member after the
    # interrupted one stayed SIGSTOPped (a first signal it got while stopped stays pending: it holds its GPU for good).
    pins = [_Pin(401, lag=0), _InterruptedPin(402, lag=0), _Pin(403, lag=0), _Pin(404, lag=0)]
    tree = _tree(pins)
    monkeypatch.setattr(tree, "scan_descendants", lambda: None)
    tree.send_first(signals.SIGTERM, clock=lambda: 0)
    with pytest.raises(KeyboardInterrupt):
        tree.escalate(signals.SIGKILL)
    for p in pins:
        assert signals.SIGSTOP in p.sent and p.sent[-1] == signals.SIGCONT, (p.pid, p.sent)
    assert not tree.stopping
