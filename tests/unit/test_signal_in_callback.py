"""A signal whose handler runs inside a finaliser or a callback (where Python only reports an exception) is not lost.

Python runs a signal's handler at the main thread's next bytecode, which can be a weakref callback of the import
system (seen: a SIGTERM to ``nvmlcheck --json ready --timeout 600`` while it imported a module was reported as
"Exception ignored in: <function _get_module_lock.<locals>.cb>" and the command ran on). These tests raise the
exception inside a finaliser themselves, as the handler would have, so nothing depends on when a signal lands.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

from nvmlcheck.cli._signals import Terminated, ending_on_signals

BOUND_S = 60.0  # only a bound: the re-delivered signal ends the loop at its first sleep


class _RaisesWhenFinalised:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __del__(self) -> None:
        raise self.exc


def _lose(exc: BaseException) -> None:
    _RaisesWhenFinalised(exc)  # finalised at once: the exception goes to sys.unraisablehook, not to this frame


def _sleep_until_raised() -> None:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_terminated_raised_in_a_finaliser_is_raised_again_in_the_command() -> None:
    guard = ending_on_signals()
    with pytest.raises(Terminated) as caught, guard:
        guard._raised = True  # what the handler leaves when it raised in the finaliser
        _lose(Terminated(signal.SIGTERM))
        _sleep_until_raised()
    assert caught.value.signum == signal.SIGTERM


def test_a_keyboard_interrupt_raised_in_a_finaliser_is_raised_again_in_the_command() -> None:
    with pytest.raises(KeyboardInterrupt), ending_on_signals():
        _lose(KeyboardInterrupt())
        _sleep_until_raised()


def test_other_unraisable_exceptions_go_to_the_previous_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    with ending_on_signals():
        _lose(ValueError("a finaliser's own error"))
    assert [type(e) for e in seen] == [ValueError]
    _lose(ValueError("after the block"))
    assert len(seen) == 2, "the hook was not restored"
