"""nvmlcheck.testing.StepClock: a wait's timeout comes after counted polls, not after wall time."""

from __future__ import annotations

import pytest

from nvmlcheck.predicates import never
from nvmlcheck.testing import StepClock
from nvmlcheck.wait import poll_until


def test_each_reading_steps_and_sleep_only_moves_the_clock() -> None:
    steps = StepClock(0.25)
    assert (steps.clock(), steps.clock()) == (250_000_000, 500_000_000)
    steps.sleep(1.0)
    assert steps.clock() == 1_750_000_000
    with pytest.raises(ValueError, match="step_s"):
        StepClock(0)


def test_a_wait_on_it_times_out_after_polls_whatever_the_load() -> None:
    from nvmlcheck.errors import WaitTimeout
    from nvmlcheck.model import Snapshot, SystemInfo

    steps = StepClock(1.0)
    calls = []

    def snapshot() -> Snapshot:
        calls.append(steps.now_ns)
        return Snapshot("nvml", 0, 0, 0.0, SystemInfo(None, None, None), (), ())

    with pytest.raises(WaitTimeout) as info:
        poll_until(snapshot, never(), timeout=10, clock=steps.clock, sleep=steps.sleep)
    assert info.value.polls == len(calls) >= 2


@pytest.mark.parametrize("step_s", [1e-12, 4e-10, float("inf"), float("nan"), -1.0, 0.0])
def test_a_step_that_would_stop_or_break_the_clock_is_refused(step_s: float) -> None:
    # A step that rounds to 0 ns froze the clock (a wait on it never timed out); inf raised OverflowError.
    with pytest.raises(ValueError, match="step_s"):
        StepClock(step_s)


@pytest.mark.parametrize("step_s", ["1", None, True])
def test_a_step_that_is_not_a_number_is_a_type_error_naming_it(step_s: object) -> None:
    with pytest.raises(TypeError, match="step_s must be a number of seconds"):
        StepClock(step_s)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [-0.5, float("nan"), float("inf")])
def test_sleep_never_moves_the_clock_back_or_off_the_integers(seconds: float) -> None:
    steps = StepClock(1.0)
    with pytest.raises(ValueError, match="sleep length"):
        steps.sleep(seconds)
    assert steps.now_ns == 0
    steps.sleep(0)
    assert steps.clock() == 1_000_000_000


def test_a_length_whose_ns_overflow_is_refused_naming_it_as_inf_is() -> None:
    # inf was refused, but 1e300 s (finite) overflowed to inf ns: a bare OverflowError from round(), naming nothing.
    with pytest.raises(ValueError, match="step_s is too large"):
        StepClock(1e300)
    steps = StepClock(1.0)
    with pytest.raises(ValueError, match="sleep length is too large"):
        steps.sleep(1e300)
    assert steps.now_ns == 0
