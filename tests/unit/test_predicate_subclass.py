"""Predicates of a tool author's own: DevicePredicate and SnapshotPredicate, the public hooks of the three-valued
protocol, and how the combinators, on_devices and the poller treat them."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from snapshots import GIB, dev, failure, proc, snap

import nvmlcheck as nc
from nvmlcheck.errors import ArgumentTypeError, GpuLost, WaitTimeout
from nvmlcheck.model import DeviceState, Snapshot
from nvmlcheck.predicates import DevicePredicate, SnapshotPredicate, blamed_devices, on_devices
from nvmlcheck.testing import StepClock
from nvmlcheck.wait import poll_until


class AtMost(DevicePredicate):
    """At most ``most`` processes per GPU; counts its calls."""

    def __init__(self, most: int, *, reasons: bool = True) -> None:
        self.most = most
        self.reasons = reasons
        self.calls: list[int] = []

    def check_device(self, device: DeviceState) -> bool | None:
        self.calls.append(device.index)
        procs = device.processes
        return None if procs is None else len(procs) <= self.most

    def reasons_device(self, device: DeviceState) -> Iterable[str]:
        if not self.reasons:
            return ()
        procs = device.processes
        return ["process list unknown"] if procs is None else [f"{len(procs)} processes"]

    def describe(self) -> str:
        return f"at most {self.most} processes"


class IdleCount(SnapshotPredicate):
    """At least ``need`` GPUs with no process; records the GPUs of each snapshot it was handed."""

    def __init__(self, need: int) -> None:
        self.need = need
        self.seen: list[tuple[int, ...]] = []

    def check_snapshot(self, snapshot: Snapshot) -> bool | None:
        self.seen.append(tuple(d.index for d in snapshot.devices))
        return sum(d.processes == () for d in snapshot.devices) >= self.need

    def describe(self) -> str:
        return f"at least {self.need} idle GPUs"


class Answers(DevicePredicate):
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def check_device(self, device: DeviceState) -> bool | None:
        return self.answer  # type: ignore[return-value]  # what a careless subclass returns

    def describe(self) -> str:
        return "whatever"


def test_the_base_classes_are_public_at_the_top_level() -> None:
    assert nc.DevicePredicate is DevicePredicate and nc.SnapshotPredicate is SnapshotPredicate
    assert "DevicePredicate" in nc.__all__ and "SnapshotPredicate" in nc.__all__
    assert issubclass(DevicePredicate, nc.Predicate) and issubclass(SnapshotPredicate, nc.Predicate)


def test_a_device_predicate_is_three_valued_per_gpu_with_reasons_prefixed() -> None:
    two = snap(dev(0), dev(1, procs=[proc(11), proc(12)]))
    p = AtMost(1)
    assert p.evaluate(two) == nc.Verdict(False, ("GPU 1: 2 processes",))
    assert p.check(snap(dev(0), dev(1, procs=None))) is None
    assert p.evaluate(snap(dev(0), dev(1, procs=None))).reasons == ("GPU 1: process list unknown",)
    assert p.check(snap(dev(0), dev(1, procs=[proc(11)]))) is True


def test_a_device_predicate_without_reasons_gets_one_from_describe() -> None:
    p = AtMost(0, reasons=False)
    assert p.evaluate(snap(dev(0, procs=[proc(11)]))).reasons == ("GPU 0: not at most 0 processes",)
    assert p.evaluate(snap(dev(0, procs=None))).reasons == ("GPU 0: cannot tell whether at most 0 processes",)


def test_unreadable_missing_and_absent_gpus_make_it_unknown_never_clean() -> None:
    p = AtMost(5)
    lost = snap(dev(0), failures=[failure(1, GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1))])
    assert p.check(lost) is None
    assert on_devices([0, 3], p).check(snap(dev(0))) is None
    assert on_devices([0, 3], p).evaluate(snap(dev(0))).reasons == ("GPU 3: selected but not in the snapshot",)
    assert p.check(snap()) is None
    # ... unless a readable GPU already says False
    assert AtMost(0).check(snap(dev(0, procs=[proc(1)]), failures=lost.failures)) is False


def test_combinators_keep_kleene_logic_and_not_keeps_only_the_unknown_reasons() -> None:
    p = AtMost(1)
    unknown = snap(dev(0, procs=[proc(1)]), dev(1, procs=None))
    assert p.check(unknown) is None and (~p).check(unknown) is None  # an unknown satisfies neither p nor ~p
    assert (~p).evaluate(unknown).reasons == ("GPU 1: process list unknown",)
    assert (p | nc.always()).check(unknown) is True and (p & nc.never()).check(unknown) is False
    decided = snap(dev(0, procs=[proc(1), proc(2)]), dev(1, procs=None))
    assert p.check(decided) is False and (~p).check(decided) is True  # GPU 0 decides
    assert on_devices([1], p).check(decided) is None and on_devices([1], ~p).check(decided) is None


def test_an_answer_that_is_not_true_false_or_none_is_refused_not_read_as_truth() -> None:
    for answer in (1, 0, "yes", nc.Verdict(True)):
        with pytest.raises(ArgumentTypeError, match=r"Answers.check_device\(\) must return True, False or None"):
            Answers(answer).check(snap(dev(0)))
    assert Answers(True).check(snap(dev(0))) is True


def test_a_snapshot_predicate_is_handed_only_the_gpus_on_devices_selects() -> None:
    s = snap(dev(0), dev(1, procs=[proc(7)]), dev(2))
    q = IdleCount(2)
    assert q.check(s) is True
    assert on_devices([1, 2], q).check(s) is False
    assert q.seen == [(0, 1, 2), (1, 2)]
    assert on_devices([1, 2], q).evaluate(s).reasons == ("not at least 2 idle GPUs",)


def test_a_snapshot_predicate_is_not_asked_when_a_selected_gpu_is_missing() -> None:
    q = IdleCount(1)
    assert on_devices([0, 5], q).check(snap(dev(0))) is None
    assert q.seen == []


def test_a_snapshot_predicates_reasons_blame_every_gpu() -> None:
    s = snap(dev(0), dev(1))
    assert blamed_devices(IdleCount(3), s) is None
    assert blamed_devices(AtMost(0), snap(dev(0), dev(1, procs=[proc(3)]))) == frozenset({1})


def test_the_poller_waits_on_a_predicate_of_ones_own_until_it_holds() -> None:
    polls = iter([snap(dev(0, procs=[proc(1), proc(2)])), snap(dev(0, procs=[proc(1)])), snap(dev(0))])
    clock = StepClock(0.0001)
    result = poll_until(lambda: next(polls), AtMost(1), timeout=10.0, stable_polls=2, policy=0.001,
                        clock=clock.clock, sleep=clock.sleep)
    assert result.polls == 3 and result.last_dirty_ns is not None


def test_a_timeout_names_the_reasons_of_a_predicate_of_ones_own() -> None:
    clock = StepClock(0.0001)
    with pytest.raises(WaitTimeout) as caught:
        poll_until(lambda: snap(dev(0, procs=[proc(1), proc(2)], used=2 * GIB)), AtMost(1), timeout=0.01,
                   policy=0.001, clock=clock.clock, sleep=clock.sleep)
    assert caught.value.culprits == ("GPU 0: 2 processes",)


def test_a_predicate_asked_about_something_that_is_not_a_snapshot_says_so() -> None:
    for p in (nc.no_processes(), nc.always(), AtMost(1), IdleCount(1)):
        with pytest.raises(ArgumentTypeError, match="a predicate judges a Snapshot"):
            p.check(None)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match="a predicate judges a Snapshot"):
            p.evaluate(3)  # type: ignore[arg-type]


def test_nvmlchecks_own_predicates_cannot_be_changed_once_made() -> None:
    shared = nc.always()
    with pytest.raises(AttributeError, match="immutable"):
        shared.value = False  # it turned every always() of the process into never()
    assert nc.always().check(snap(dev(0))) is True
    limit = nc.memory_used_at_most(16)
    with pytest.raises(AttributeError, match="immutable"):
        limit.limit = 1 << 40
    with pytest.raises(AttributeError, match="immutable"):
        del limit.limit  # type: ignore[attr-defined]
    assert limit.describe() == "used memory at most 16 B"


def test_a_tool_authors_subclass_keeps_its_own_attributes_to_itself() -> None:
    p = AtMost(1)
    p.most = 0  # its own business: nothing of nvmlcheck's is shared through it
    assert p.check(snap(dev(0, procs=[proc(1)]))) is False


class OneLine(DevicePredicate):
    """Returns its reason as a str, not a list of them (a mistake mypy does not catch: a str is an Iterable[str])."""

    def check_device(self, device: DeviceState) -> bool | None:
        return False

    def reasons_device(self, device: DeviceState) -> Iterable[str]:
        return "busy"

    def describe(self) -> str:
        return "never idle"


class OneLineSnapshot(SnapshotPredicate):
    def check_snapshot(self, snapshot: Snapshot) -> bool | None:
        return False

    def reasons_snapshot(self, snapshot: Snapshot) -> Iterable[str]:
        return "too few idle GPUs"

    def describe(self) -> str:
        return "enough idle GPUs"


def test_a_reason_returned_as_one_str_is_one_line_not_one_per_character() -> None:
    assert OneLine().evaluate(snap(dev(0))).reasons == ("GPU 0: busy",)
    assert OneLineSnapshot().evaluate(snap(dev(0))).reasons == ("too few idle GPUs",)
