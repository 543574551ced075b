"""``ready`` held to its deadline in every step, and what it says when the deadline cuts one: the selection's
resolution (a UUID, ``cuda:N``), a transient error while waiting, nvidia-smi's run bound.

Time is the injected StepClock: a slow call is a step of that clock, never a sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30


def hung_identity(session: nc.Session, clock: StepClock) -> list[Any]:
    """Every reading of the GPUs' identities alone (what resolving a UUID or ``cuda:N`` reads) hangs, as an
    nvidia-smi run on a wedged GPU does: 30 s of ``clock``, or until the deadline it is handed, where the backend
    stops it (as the nvidia-smi runner kills a run at the deadline). The deadlines handed."""
    real = session.backend.snapshot
    handed: list[Any] = []

    def snapshot(indices: Any, fields: Any, **kw: Any) -> Any:
        if fields == nc.Fields(0):
            deadline = kw.get("deadline")
            handed.append(deadline)
            if deadline is None:
                clock.sleep(30.0)
            else:
                clock.sleep(max(0.0, (deadline.at_ns - clock.now_ns) / 1e9))
                deadline.check()
        return real(indices, fields, **kw)

    session.backend.snapshot = snapshot  # type: ignore[method-assign,assignment]
    return handed


@pytest.mark.parametrize("selector", ["cuda:1", "uuid"])
def test_a_selection_still_being_resolved_at_the_deadline_is_unknown_never_overrun(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch, selector: str
) -> None:
    """``ready(["cuda:1"], timeout=0.5)``: reading which GPU the selector names was not bounded by the deadline
    (the library's path: the command line's watchdog is not installed there), so a slow or hung reading overran
    it by all it took. It is now read by the deadline; cut, every GPU is unknown, saying why: never ready."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    clock = StepClock(0.001)
    with gpus(Scenario.h200(devices=4)) as session:
        uuid = session.devices()[1].uuid
        assert uuid is not None
        real_snapshot = session.backend.snapshot
        handed = hung_identity(session, clock)
        report = session.ready([uuid if selector == "uuid" else selector], timeout=0.5, events=False,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep))
        # The reading got the deadline and stopped there; nothing was read after it.
        assert handed and all(d is not None for d in handed)
        assert clock.now_ns <= (0.5 + 0.05) * 1e9 and report.polls == 0
        assert not report.ready and [v.class_ for v in report.verdicts] == ["unknown"] * 4
        reason = report.verdicts[0].culprits[0].reason
        assert "still being read" in reason and "which GPUs it names is unknown" in reason
        assert (uuid if selector == "uuid" else "cuda:1") in reason
        # One check (timeout 0) always completes, as a wait's does.
        session.backend.snapshot = real_snapshot  # type: ignore[method-assign]
        report = session.ready([uuid if selector == "uuid" else selector], timeout=0,
                               options=WaitOptions(clock=clock.clock, sleep=clock.sleep))
        assert report.ready and [v.index for v in report.verdicts] == [1]
