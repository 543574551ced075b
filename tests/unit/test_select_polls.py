"""select_clean polls as a wait does: transient errors are retried, the deadline goes down to the backend."""

from __future__ import annotations

from typing import Any

import pytest
from snapshots import busy, idle

from nvmlcheck.errors import ArgumentError, ArgumentTypeError, NotSupported, SmiTimeout
from nvmlcheck.model import Snapshot
from nvmlcheck.selection import SelectTimeout, select_clean
from nvmlcheck.testing import StepClock


class FakeBackend:
    name = "smi"

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.deadlines: list[Any] = []

    def snapshot(self, indices: Any, fields: Any, *, deadline: Any = None) -> Snapshot:
        self.deadlines.append(deadline)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, Snapshot)
        return answer


class FakeSession:
    backend_name = "smi"

    def __init__(self, backend: FakeBackend) -> None:
        self.backend = backend

    def _resolve(self, devices: Any, deadline_ns: int | None, clock: Any) -> None:
        return None

    def device_count(self) -> int:
        return 1


def _select(answers: list[Any], timeout: float) -> tuple[Any, FakeBackend]:
    backend = FakeBackend(answers)
    steps = StepClock(0.1)
    result = select_clean(FakeSession(backend), 1, timeout=timeout, clock=steps.clock,  # type: ignore[arg-type]
                          sleep=steps.sleep)
    return result, backend


def test_a_transient_error_is_retried_and_the_deadline_handed_down() -> None:
    timeout_error = SmiTimeout(("nvidia-smi",), 1.0, "")
    result, backend = _select([timeout_error, timeout_error, idle(0)], timeout=30.0)
    assert [d.index for d in result.devices] == [0] and result.polls == 1
    assert len(backend.deadlines) == 3 and all(d is not None for d in backend.deadlines)


def test_a_fatal_error_is_raised_at_once() -> None:
    with pytest.raises(NotSupported):
        _select([NotSupported(3, "nvmlDeviceGetCount_v2")], timeout=30.0)


def test_a_timeout_keeps_what_the_last_complete_poll_found() -> None:
    with pytest.raises(SelectTimeout) as info:
        _select([busy(), SmiTimeout(("nvidia-smi",), 1.0, "")], timeout=5.0)
    assert info.value.polls == 1 and any("pid 1234" in c for c in info.value.culprits)


@pytest.mark.parametrize(("keyword", "value"), [("lock", "no"), ("lock", 1), ("health", 0), ("health", None),
                                                ("interval", True)])
def test_flags_and_the_interval_take_their_own_types_only(keyword: str, value: Any) -> None:
    """``lock="no"`` (a non-empty string, so truthy) took the locks; ``health=0`` judged no health; ``interval=True``
    polled every second. Each is refused before anything is read."""
    backend = FakeBackend([idle(0)])
    with pytest.raises(ArgumentTypeError, match=f"{keyword} must be"):
        select_clean(FakeSession(backend), 1, **{keyword: value})  # type: ignore[arg-type]
    assert backend.deadlines == []  # nothing read


@pytest.mark.parametrize(("value", "error"), [("1", ArgumentTypeError), (1e300, ArgumentError),
                                              (10**400, ArgumentError), (float("inf"), ArgumentError),
                                              (float("nan"), ArgumentError), (-1, ArgumentError)],
                         ids=["str", "1e300", "10**400", "inf", "nan", "negative"])
def test_an_interval_no_sleep_can_take_is_refused_before_anything_is_read(value: Any, error: type) -> None:
    """1e300 or 10**400 passed the check (finite, >= 0) and overflowed ``time.sleep`` at the first pause; ``"1"``
    was a ValueError. Each is now refused by name before anything is read, as a policy's interval is."""
    backend = FakeBackend([busy(), idle(0)])
    with pytest.raises(error, match="interval must be"):
        select_clean(FakeSession(backend), 1, timeout=None, interval=value)  # type: ignore[arg-type]
    assert backend.deadlines == []  # nothing read
