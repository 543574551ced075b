"""``ready``'s inputs as a tool author passes them: selections of every shape, needs at the edges."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30


@pytest.mark.parametrize("selection", [lambda: iter([1]), lambda: (d for d in ["cuda:1"]), lambda: map(int, "1")])
def test_an_iterator_selection_is_read_once(gpus: Callable[[Scenario], nc.Session],
                                            selection: Callable[[], object]) -> None:
    """``ready(iter([1]), timeout=5)`` on a held GPU: the selection was resolved (which used the iterator up) and
    then handed to the wait, which refused it as an "empty device selection"."""
    sc = Scenario.h200(devices=2)
    sc.add_process(1, 4_000_001, used_bytes=GIB)
    sc.at_call(60).remove_process(1, 4_000_001)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        report = session.ready(selection(), timeout=5.0, events=False,  # type: ignore[arg-type]
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    assert report.ready and [v.index for v in report.verdicts] == [1]


def test_a_uuid_selection_is_resolved_once(gpus: Callable[[Scenario], nc.Session]) -> None:
    """``ready([uuid], timeout=5)`` read every GPU's identity twice: to resolve the selection, and again in the wait
    it then started with the selection as given (with nvidia-smi over ssh, a run of seconds taken out of the
    timeout). The wait now gets the GPUs the first resolution found."""
    sc = Scenario.h200(devices=2)
    sc.add_process(1, 4_000_001, used_bytes=GIB)
    sc.at_call(80).remove_process(1, 4_000_001)
    clock = StepClock(0.001)
    with gpus(sc) as session:
        uuid = session.devices()[1].uuid
        real = session.backend.snapshot
        every: list[object] = []

        def snapshot(indices: object, fields: object, **kw: object) -> object:
            if indices is None:
                every.append(fields)
            return real(indices, fields, **kw)  # type: ignore[arg-type]

        session.backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
        report = session.ready([uuid], timeout=5.0, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02))
    assert report.ready and report.polls > 2 and every == [nc.Fields(0)]
