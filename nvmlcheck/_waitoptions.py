"""The options of a wait (:class:`WaitOptions`) and its polling policies (:class:`PollPolicy`, :data:`DEFAULT`,
:data:`SMI_DEFAULT`, :data:`PRECISE`), apart from the poller that uses them.

Part of :mod:`nvmlcheck.wait`, which offers every name here (import them from there; their ``__module__`` says
``nvmlcheck.wait``). Their own module because ``ready``'s one-shot check takes options but never polls: it does not
import the poller (docs/performance.md, "One-shot checks").
"""

from __future__ import annotations

import math

from ._record import record
from ._waitdefaults import CLOCK, EVENTS, ON_POLL, POLICY, SLEEP, STABLE_POLLS, TIMEOUT, TRACE, Default
from .errors import ArgumentError, ArgumentTypeError

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, Literal

    from .wait import OnPoll

    PolicyMode = Literal["default", "precise", "custom"]

__all__ = ["DEFAULT", "PRECISE", "SMI_DEFAULT", "PollPolicy", "WaitOptions"]

_NS = 1_000_000_000
# The largest back-off factor: the interval is multiplied by it (a factor beyond any float would overflow there).
_LARGEST_FACTOR = 1e300

# --- policy -----------------------------------------------------------------------------------------------------


@record(kw_only=True)
class PollPolicy:
    """How often to poll.

    ``interval_s``: time from the end of one poll to the start of the next (0: no sleep at all, a tight loop).
    ``confirm_interval_s``: the interval after a clean poll, while the run of clean polls is being confirmed
    (``None``: same as ``interval_s``); shorter means faster detection, longer guards better against flapping.
    ``max_duty``: the largest fraction of a cycle's time that its CPU time may take (the wall time of a query
    stands in without a CPU clock); the base interval is stretched to respect it when polls are costly (``None``:
    no cap). ``backoff_after_s``: once nothing seen has changed for this long, the
    interval grows by ``backoff_factor`` per poll up to ``max_interval_s`` (``backoff_after_s`` ``None``: never;
    ``max_interval_s`` ``None``: the interval is its own ceiling, so it never grows either). ``compensate_sleep``:
    ask ``sleep`` for less by its measured lateness, so real intervals match the nominal ones. ``full_every_s``:
    with a ``probe`` (see :func:`poll_until`), the longest time between two full queries, so the live status line
    and the trace still name the processes. ``mode`` labels the policy (``"default"``, ``"precise"`` or ``"custom"``).
    """

    interval_s: float = 0.001
    mode: PolicyMode = "custom"
    confirm_interval_s: float | None = None
    max_duty: float | None = None
    backoff_after_s: float | None = None
    backoff_factor: float = 1.5
    max_interval_s: float | None = None
    compensate_sleep: bool = True
    full_every_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("backoff_factor", "max_duty"):
            value = getattr(self, name)
            if (value is not None or name == "backoff_factor") and (
                    isinstance(value, bool) or not isinstance(value, int | float)):
                raise ArgumentTypeError(f"{name} must be a number, got {value!r}")
        if not isinstance(self.compensate_sleep, bool):
            raise ArgumentTypeError(f"compensate_sleep must be True or False, got {self.compensate_sleep!r}")
        _check_seconds("interval_s", self.interval_s)
        _check_seconds("full_every_s", self.full_every_s)
        if self.confirm_interval_s is not None:
            _check_seconds("confirm_interval_s", self.confirm_interval_s)
        if self.backoff_after_s is not None:
            _check_seconds("backoff_after_s", self.backoff_after_s)
        if self.max_interval_s is not None:
            _check_seconds("max_interval_s", self.max_interval_s)
            if self.max_interval_s < self.interval_s:
                raise ArgumentError(f"max_interval_s ({self.max_interval_s}) is below interval_s ({self.interval_s})")
        if not (1.0 <= self.backoff_factor < _LARGEST_FACTOR):  # compared: math.isfinite overflows on a huge int
            raise ArgumentError(f"backoff_factor must be a number from 1 to 1e300, got {self.backoff_factor!r}")
        if self.max_duty is not None and not (0.0 < self.max_duty <= 1.0):
            raise ArgumentError(f"max_duty must be in (0, 1], got {self.max_duty!r}")
        if self.mode not in ("default", "precise", "custom"):
            raise ArgumentError(f"mode must be 'default', 'precise' or 'custom', got {self.mode!r}")

    @classmethod
    def every(cls, interval_s: float) -> PollPolicy:
        """A plain fixed interval: no confirmation shortcut, duty cap, back-off or sleep compensation."""
        return cls(interval_s=interval_s, mode="custom", compensate_sleep=False)


def _check_seconds(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(f"{name} must be a number of seconds, got {value!r}")
    if not 0 <= value < math.inf:  # NaN fails it; compared, not math.isfinite, which overflows on 10**400
        raise ArgumentError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if value > 1e9:  # about 31 years: no poll waits that long, and the ns arithmetic would overflow a float
        raise ArgumentError(f"{name} must be at most 1e9 seconds, got {value!r}")


#: Detects within ~2 ms (p99) at <= 5 % of one core on one GPU; backs off to 10 ms after 10 s without change.
DEFAULT = PollPolicy(
    mode="default",
    interval_s=0.001,
    confirm_interval_s=0.00025,
    max_duty=0.05,
    backoff_after_s=10.0,
    backoff_factor=1.5,
    max_interval_s=0.010,
)
#: The default for the nvidia-smi backend, where a poll is one or two nvidia-smi runs, mostly CPU in the child:
#: :data:`DEFAULT`'s 5 % cap would space the runs far apart (docs/performance.md). Half a core keeps the next run
#: within about one run time of the last, so the clean moment is seen within about two runs; back-off after 10 s
#: without change, up to 0.25 s between polls.
SMI_DEFAULT = PollPolicy(
    mode="default",
    interval_s=0.001,
    confirm_interval_s=0.0,
    max_duty=0.5,
    backoff_after_s=10.0,
    backoff_factor=1.5,
    max_interval_s=0.25,
)
#: A tight loop without sleeping: detects within about two query times, keeps one core busy.
PRECISE = PollPolicy(mode="precise", interval_s=0.0, confirm_interval_s=0.0, compensate_sleep=False)


def _resolve_policy(policy: PollPolicy | str | float | None) -> PollPolicy:
    if policy is None:
        return DEFAULT
    if isinstance(policy, PollPolicy):
        return policy
    if isinstance(policy, str):
        if policy == "default":
            return DEFAULT
        if policy == "precise":
            return PRECISE
        raise ArgumentError(f"unknown polling mode {policy!r}; use 'default', 'precise' or a PollPolicy")
    if isinstance(policy, bool) or not isinstance(policy, int | float):
        raise ArgumentTypeError(
            f"policy must be a PollPolicy, 'default', 'precise' or an interval in seconds, got {policy!r}")
    _check_seconds("policy (an interval)", policy)  # before float(): an int beyond any float (10**400) overflows it
    return PollPolicy.every(float(policy))



def _timeout_ns(timeout: float | None) -> int | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ArgumentTypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if not timeout >= 0:  # NaN fails it; math.isnan would overflow on an int beyond any float
        raise ArgumentError(f"timeout must be >= 0 seconds (or None for no timeout), got {timeout!r}")
    # _deadline.ns_or_none's rule, inline: ready's one-shot path imports this module but not _deadline.
    try:
        ns = float(timeout) * _NS
    except OverflowError:  # an int beyond any float (10**400)
        return None
    if math.isinf(ns):
        return None  # inf (or too large to count in ns) means no timeout
    return round(ns)  # not ceil: 63225e-9 * 1e9 is 63225.00000000001



# --- options ----------------------------------------------------------------------------------------------------

_OPTION_NAMES = ("timeout", "policy", "stable_polls", "trace", "on_poll", "clock", "sleep", "events")


class WaitOptions:
    """How a wait waits, in one immutable value that :func:`poll_until`, :meth:`Session.wait_until_clean`,
    :func:`~nvmlcheck.wait_until_clean`, :func:`~nvmlcheck.kill_and_wait` and :meth:`KillPlan.wait` all take as
    ``options=``.

    ``timeout``: seconds (``None`` or ``inf``: wait forever; ``0``: one check). ``policy``: a :class:`PollPolicy`,
    ``"default"``, ``"precise"``, an interval in seconds, or ``None`` (:data:`DEFAULT`; :data:`SMI_DEFAULT` with
    the nvidia-smi backend). ``stable_polls``: consecutive clean polls required. ``trace``: keep every poll in
    :attr:`WaitResult.trace`. ``on_poll``: called with each poll's :class:`TracePoint`. ``clock`` (integer ns) and
    ``sleep`` (seconds): injectable for tests. ``events``: ``True`` starts the session's event listener, ``None``
    uses it if it runs, ``False`` ignores it (a session's business: :func:`poll_until` refuses ``True``). The
    defaults are those of the APIs' keyword arguments: ``WaitOptions()`` waits as a call without any.

    The APIs keep their keyword arguments as shortcuts: a keyword given wins over the options' field, also when
    both are given (``wait_until_clean(timeout=5, options=o)`` waits 5 s whatever ``o.timeout`` says).
    :meth:`with_` returns a changed copy. Invalid values raise at construction, naming the value: ``ValueError``
    for a negative or NaN ``timeout``, a ``stable_polls`` that is not an int >= 1, an unknown polling mode;
    ``TypeError`` for a value of the wrong type.

    >>> from nvmlcheck.wait import WaitOptions
    >>> quick = WaitOptions(timeout=5.0, policy="precise")
    >>> quick.with_(stable_polls=3).stable_polls
    3
    """

    # A plain class with slots, not a dataclass: wait is on the launch path, and a dataclass costs its import time.
    # _given: the fields set by a caller (here or in a base of with_), not left at their default; an API whose own
    # default differs (ready's timeout is 0) reads a field only when it was given.
    __slots__ = (*_OPTION_NAMES, "_given")

    timeout: float | None
    policy: PollPolicy | str | float | None
    stable_polls: int
    trace: bool
    on_poll: OnPoll | None
    clock: Callable[[], int]
    sleep: Callable[[float], object]
    events: bool | None
    _given: frozenset[str]

    #: ``WaitOptions()``: the defaults.
    DEFAULT: ClassVar[WaitOptions]

    def __init__(
        self,
        *,
        timeout: float | None = TIMEOUT,
        policy: PollPolicy | str | float | None = POLICY,
        stable_polls: int = STABLE_POLLS,
        trace: bool = TRACE,
        on_poll: OnPoll | None = ON_POLL,
        clock: Callable[[], int] = CLOCK,
        sleep: Callable[[float], object] = SLEEP,
        events: bool | None = EVENTS,
    ) -> None:
        _fill(self, (timeout, policy, stable_polls, trace, on_poll, clock, sleep, events), None)

    def with_(
        self,
        *,
        timeout: float | None = TIMEOUT,
        policy: PollPolicy | str | float | None = POLICY,
        stable_polls: int = STABLE_POLLS,
        trace: bool = TRACE,
        on_poll: OnPoll | None = ON_POLL,
        clock: Callable[[], int] = CLOCK,
        sleep: Callable[[float], object] = SLEEP,
        events: bool | None = EVENTS,
    ) -> WaitOptions:
        """A copy with the fields given changed (the others as in this one); this same object when none is given."""
        new = object.__new__(WaitOptions)
        given = _fill(new, (timeout, policy, stable_polls, trace, on_poll, clock, sleep, events), self)
        return new if given else self

    @staticmethod
    def or_default(options: WaitOptions | None) -> WaitOptions:
        """``options``, or :attr:`DEFAULT` for ``None``; a :class:`TypeError` for anything else."""
        if options is None:
            return WaitOptions.DEFAULT
        if not isinstance(options, WaitOptions):
            raise ArgumentTypeError(f"options must be a WaitOptions or None, got {options!r}")
        return options

    def given(self, name: str) -> bool:
        """Whether field ``name`` was set by a caller (here or in the options :meth:`with_` copied), not left at its
        default: an API whose own default differs (``ready``'s timeout, 0) takes the field only then."""
        return name in self._given

    def _values(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _OPTION_NAMES)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"WaitOptions is immutable: use options.with_({name}=...) for a changed copy")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("WaitOptions is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WaitOptions):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return f"WaitOptions({', '.join(f'{n}={v!r}' for n, v in zip(_OPTION_NAMES, self._values(), strict=True))})"

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_options, (self._values(), tuple(sorted(self._given))))


def _rebuild_options(values: tuple[object, ...], given: tuple[str, ...] | None = None) -> WaitOptions:
    # Only the fields given are passed: the others are their defaults, and stay "not given" (None: an older pickle).
    fields: dict[str, Any] = {n: v for n, v in zip(_OPTION_NAMES, values, strict=True) if given is None or n in given}
    return WaitOptions(**fields)


def _fill(target: WaitOptions, values: tuple[object, ...], base: WaitOptions | None) -> bool:
    """Set ``target``'s fields: a value given is checked, one left at its marker comes from ``base`` (already
    checked) or is the default. Whether any was given. Once per wait: only the values given are checked."""
    names: set[str] = set() if base is None else set(base._given)
    given = False
    for name, value in zip(_OPTION_NAMES, values, strict=True):
        if isinstance(value, Default):
            value = value.value if base is None else getattr(base, name)  # noqa: PLW2901
        else:
            _check_option(name, value)
            if name == "timeout":
                value = _storable_timeout(value)  # noqa: PLW2901
            given = True
            names.add(name)
        object.__setattr__(target, name, value)
    object.__setattr__(target, "_given", frozenset(names))
    return given


def _storable_timeout(value: object) -> object:
    """A timeout as every wait can compute with: an int too large for a float (``10**400``) is ``inf``, no bound
    (as the rule of :func:`_timeout_ns` reads it), not an ``OverflowError`` in the first float arithmetic."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return math.inf
    return value


def _check_option(name: str, value: object) -> None:
    """Raise for an invalid option, naming it and its value (the timeout's and the policy's rules are the poller's)."""
    if name == "timeout":
        _timeout_ns(value)  # type: ignore[arg-type]
    elif name == "policy":
        _resolve_policy(value)  # type: ignore[arg-type]
    elif name == "stable_polls":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"stable_polls must be an int >= 1, got {value!r}")
    elif name in ("trace", "events"):
        if not isinstance(value, bool) and not (name == "events" and value is None):
            allowed = "True, False or None" if name == "events" else "True or False"
            raise ArgumentTypeError(f"{name} must be {allowed}, got {value!r}")
    elif not (callable(value) or (name == "on_poll" and value is None)):
        raise ArgumentTypeError(f"{name} must be callable{' or None' if name == 'on_poll' else ''}, got {value!r}")


WaitOptions.DEFAULT = WaitOptions()


# Pickles and reprs name nvmlcheck.wait, where these were defined before and are offered now.
for _made in (PollPolicy, WaitOptions, _rebuild_options):
    _made.__module__ = "nvmlcheck.wait"
