"""WaitOptions: one value for a wait's settings. Its defaults are the keyword defaults of every API that takes it (read
from the signatures, not copied here), a keyword given wins over its field, and bad values are refused when the
options are made, naming the value."""

from __future__ import annotations

import inspect
import math
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from snapshots import busy, idle

from nvmlcheck._waitdefaults import Default
from nvmlcheck.errors import WaitTimeout
from nvmlcheck.kill import KillPlan, kill_and_wait
from nvmlcheck.session import Session, wait_until_clean
from nvmlcheck.wait import DEFAULT, PRECISE, TracePoint, WaitOptions, poll_until

#: Every API that takes ``options=``, and its keyword for each option where the name differs.
APIS: dict[str, tuple[Callable[..., Any], dict[str, str]]] = {
    "poll_until": (poll_until, {"keep_trace": "trace"}),
    "Session.wait_until_clean": (Session.wait_until_clean, {}),
    "wait_until_clean": (wait_until_clean, {}),
    "KillPlan.wait": (KillPlan.wait, {}),
    "kill_and_wait": (kill_and_wait, {}),
}
FIELDS = ("timeout", "policy", "stable_polls", "trace", "on_poll", "clock", "sleep", "events")


def _option_keywords(fn: Callable[..., Any], renamed: dict[str, str]) -> dict[str, inspect.Parameter]:
    """The API's parameters that are options, by option name."""
    params = inspect.signature(fn).parameters
    return {renamed.get(name, name): p for name, p in params.items() if renamed.get(name, name) in FIELDS}


# --- defaults ---------------------------------------------------------------------------------------------------


def test_the_fields_are_the_constructors_keywords() -> None:
    assert tuple(inspect.signature(WaitOptions).parameters) == FIELDS
    assert tuple(inspect.signature(WaitOptions.with_).parameters)[1:] == FIELDS


@pytest.mark.parametrize("api", APIS)
def test_defaults_are_each_apis_keyword_defaults(api: str) -> None:
    fn, renamed = APIS[api]
    keywords = _option_keywords(fn, renamed)
    assert keywords, api
    plain = WaitOptions()
    for name, param in keywords.items():
        # The marker stands for "not given" (so options apply) and carries the default the API documents.
        assert isinstance(param.default, Default), (api, name)
        assert param.default.name == name
        assert getattr(plain, name) == param.default.value, (api, name)
        value: Any = param.default.value  # help() and docs/api.md show the value
        shown = f"{value.__module__}.{value.__qualname__}" if callable(value) else repr(value)
        assert repr(param.default) == shown
    assert inspect.signature(fn).parameters["options"].default is None


def test_every_api_takes_the_common_options_as_keywords() -> None:
    common = {"timeout", "policy", "stable_polls", "on_poll", "sleep", "events"}
    for api, (fn, renamed) in APIS.items():
        exempt = {"poll_until": {"events"}, "wait_until_clean": {"on_poll", "sleep"}}.get(api, set())
        missing = common - set(_option_keywords(fn, renamed)) - exempt
        assert not missing, (api, missing)


def test_the_signature_shows_the_default_values() -> None:
    text = str(inspect.signature(Session.wait_until_clean))
    assert "timeout: 'float | None' = 30.0" in text and "stable_polls: 'int' = 2" in text
    assert "clock: 'Callable[[], int]' = time.monotonic_ns" in text


def test_the_default_instance() -> None:
    assert WaitOptions() == WaitOptions.DEFAULT
    assert WaitOptions.or_default(None) is WaitOptions.DEFAULT
    opts = WaitOptions(timeout=1.0)
    assert WaitOptions.or_default(opts) is opts
    with pytest.raises(TypeError, match="WaitOptions"):
        WaitOptions.or_default({"timeout": 1.0})  # type: ignore[arg-type]


# --- values -----------------------------------------------------------------------------------------------------


def test_with_returns_a_changed_copy_and_leaves_the_original() -> None:
    base = WaitOptions(timeout=5.0, policy="precise")
    changed = base.with_(stable_polls=3)
    assert (changed.timeout, changed.policy, changed.stable_polls) == (5.0, "precise", 3)
    assert base.stable_polls == WaitOptions().stable_polls
    assert base.with_() is base
    assert changed != base and changed == WaitOptions(timeout=5.0, policy="precise", stable_polls=3)


def test_options_are_immutable_hashable_and_picklable() -> None:
    opts = WaitOptions(timeout=2.5, policy=PRECISE, trace=True)
    with pytest.raises(AttributeError, match="immutable"):
        opts.timeout = 3.0
    with pytest.raises(AttributeError):
        del opts.timeout
    assert hash(opts) == hash(WaitOptions(timeout=2.5, policy=PRECISE, trace=True))
    assert pickle.loads(pickle.dumps(opts)) == opts
    assert b"nvmlcheck.wait" in pickle.dumps(opts) and b"_waitoptions" not in pickle.dumps(opts)  # the public module
    assert "timeout=2.5" in repr(opts) and "trace=True" in repr(opts)


@pytest.mark.parametrize(
    ("kwargs", "error", "text"),
    [
        ({"timeout": -1.0}, ValueError, "-1.0"),
        ({"timeout": math.nan}, ValueError, "nan"),
        ({"timeout": "5"}, TypeError, "'5'"),
        ({"timeout": True}, TypeError, "True"),
        ({"stable_polls": 0}, ValueError, "stable_polls.*0"),
        ({"stable_polls": 1.5}, ValueError, "stable_polls.*1.5"),
        ({"stable_polls": True}, ValueError, "stable_polls.*True"),
        ({"policy": "fast"}, ValueError, "'fast'"),
        ({"policy": [1]}, TypeError, r"\[1\]"),
        ({"trace": "yes"}, TypeError, "trace.*'yes'"),
        ({"events": 1}, TypeError, "events.*1"),
        ({"on_poll": 3}, TypeError, "on_poll.*3"),
        ({"clock": None}, TypeError, "clock.*None"),
        ({"sleep": 0.1}, TypeError, "sleep.*0.1"),
    ],
)
def test_bad_values_are_refused_at_construction(kwargs: dict[str, Any], error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        WaitOptions(**kwargs)
    with pytest.raises(error, match=text):
        WaitOptions().with_(**kwargs)


def test_good_edge_values() -> None:
    assert WaitOptions(timeout=None).timeout is None
    assert WaitOptions(timeout=math.inf).timeout == math.inf
    assert WaitOptions(timeout=0).timeout == 0
    assert WaitOptions(policy=0.002, stable_polls=1, events=False).policy == 0.002


# --- poll_until with options ------------------------------------------------------------------------------------


class _Fake:
    """A fake clock, sleep and GPU: ``states`` answered in turn (the last repeated), each query costing 10 µs."""

    def __init__(self, *states: Any) -> None:
        self.now = 1_000_000_000_000
        self.states = list(states)
        self.polls = 0

    def clock(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += round(seconds * 1e9)

    def snapshot(self) -> Any:
        self.now += 10_000
        self.polls += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def test_poll_until_takes_its_settings_from_options() -> None:
    gpu = _Fake(idle())
    seen: list[TracePoint] = []
    opts = WaitOptions(timeout=1.0, policy=PRECISE, stable_polls=3, trace=True, on_poll=seen.append,
                       clock=gpu.clock, sleep=gpu.sleep)
    res = poll_until(gpu.snapshot, options=opts)
    assert res.polls == 3 and res.policy is PRECISE
    assert res.trace is not None and len(res.trace) == 3 and len(seen) == 3


def test_a_keyword_wins_over_the_options_field() -> None:
    gpu = _Fake(idle())
    opts = WaitOptions(stable_polls=5, policy=PRECISE, clock=gpu.clock, sleep=gpu.sleep)
    res = poll_until(gpu.snapshot, options=opts, stable_polls=2, policy="default", keep_trace=True)
    assert res.polls == 2 and res.policy is DEFAULT and res.trace is not None
    # The options' timeout applies when no keyword gives one: 0 is one check, judged alone.
    late = _Fake(busy())
    with pytest.raises(WaitTimeout):
        poll_until(late.snapshot, options=WaitOptions(timeout=0, clock=late.clock, sleep=late.sleep))
    assert late.polls == 1


def test_poll_until_refuses_events_it_cannot_listen_for() -> None:
    gpu = _Fake(idle())
    with pytest.raises(ValueError, match="events"):
        poll_until(gpu.snapshot, options=WaitOptions(events=True, clock=gpu.clock, sleep=gpu.sleep))
    res = poll_until(gpu.snapshot, options=WaitOptions(events=False, clock=gpu.clock, sleep=gpu.sleep))
    assert res.polls == 2


# --- a timeout too long for a float ---------------------------------------------------------------------------------

HUGE = 10**400  # an int no float holds: every float() of it raised OverflowError


def test_a_timeout_beyond_any_float_is_no_bound_not_an_overflow() -> None:
    from nvmlcheck._deadline import ns_or_none

    assert WaitOptions(timeout=HUGE).timeout == math.inf
    assert WaitOptions().with_(timeout=HUGE).timeout == math.inf
    assert ns_or_none(HUGE) is None
    assert WaitOptions(timeout=10**30).timeout == 10**30  # an int a float holds is kept as given
    result = poll_until(lambda: idle(0), timeout=HUGE, stable_polls=1)
    assert result.clean and result.polls == 1


@pytest.mark.parametrize("make", [
    lambda: DEFAULT.__class__.every(HUGE),
    lambda: DEFAULT.__class__(interval_s=0.001, backoff_factor=HUGE),
    lambda: DEFAULT.__class__(interval_s=0.001, max_interval_s=HUGE),
    lambda: WaitOptions(policy=HUGE),  # an interval as the policy: float() of it overflowed first
    lambda: poll_until(lambda: idle(0), timeout=0, policy=HUGE),
])
def test_a_policy_value_beyond_any_float_is_refused_by_name(make: Callable[[], object]) -> None:
    from nvmlcheck.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"interval|backoff_factor"):
        make()
