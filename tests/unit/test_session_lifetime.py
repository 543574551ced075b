"""A session's lifetime as a tool author meets it: a close that cannot hang forever (nvmlShutdown on a wedged
driver), closing twice and from several threads, ``with`` on a closed session, copying and pickling."""

from __future__ import annotations

import copy
import pickle
import threading
from typing import Any

import pytest
from snapshots import idle

import nvmlcheck as nc
from nvmlcheck import session as session_module
from nvmlcheck.errors import ArgumentError, ArgumentTypeError, SessionClosed, Timeout
from nvmlcheck.session import Session

# Generous: how long a test waits for a thread it released to get somewhere (never a timing assertion).
_SETTLE_S = 30.0


class HungRelease:
    """A backend whose close() blocks until the test lets it go, like nvmlShutdown on a wedged driver."""

    name = "nvml"

    def __init__(self, *, hang: bool = True, error: BaseException | None = None) -> None:
        self.closes = 0
        self.entered = threading.Event()
        self.go = threading.Event()
        self.returned = threading.Event()
        self.error = error
        if not hang:
            self.go.set()

    def close(self) -> None:
        self.closes += 1
        self.entered.set()
        self.go.wait(_SETTLE_S)
        self.returned.set()
        if self.error is not None:
            raise self.error

    def snapshot(self, indices: object, fields: object, *, deadline: object = None) -> Any:
        return idle(0)


def test_a_hung_release_is_given_up_after_the_bound_and_said() -> None:
    backend = HungRelease()
    gpus = Session(backend)  # type: ignore[arg-type]
    with pytest.raises(Timeout) as caught:
        gpus.close(timeout=0)
    assert caught.value.function == "nvmlShutdown"
    assert "left to finish in a daemon thread" in str(caught.value)
    assert gpus.closed
    with pytest.raises(SessionClosed):
        gpus.snapshot()
    gpus.close()  # at once: the release is not started again
    assert backend.entered.wait(_SETTLE_S) and backend.closes == 1
    backend.go.set()
    assert backend.returned.wait(_SETTLE_S)
    assert backend.closes == 1  # never released twice


def test_a_close_in_time_returns_and_a_release_error_reaches_the_caller() -> None:
    fine = HungRelease(hang=False)
    Session(fine).close(timeout=None)  # type: ignore[arg-type]
    assert fine.closes == 1 and fine.returned.is_set()
    broken = HungRelease(hang=False, error=OSError("boom"))
    with pytest.raises(OSError, match="boom"):
        Session(broken).close()  # type: ignore[arg-type]


def test_close_from_two_threads_releases_once() -> None:
    backend = HungRelease()
    gpus = Session(backend)  # type: ignore[arg-type]
    first = threading.Thread(target=gpus.close, kwargs={"timeout": None})
    first.start()
    assert backend.entered.wait(_SETTLE_S)
    gpus.close()  # the other thread is releasing: nothing more to do
    backend.go.set()
    first.join(_SETTLE_S)
    assert not first.is_alive() and backend.closes == 1


@pytest.mark.parametrize(("timeout", "error"), [(-1, ArgumentError), (float("nan"), ArgumentError),
                                                ("1", ArgumentTypeError), (True, ArgumentTypeError)])
def test_a_bad_close_timeout_is_refused_before_anything_is_released(timeout: object, error: type[Exception]) -> None:
    backend = HungRelease(hang=False)
    gpus = Session(backend)  # type: ignore[arg-type]
    with pytest.raises(error, match="close\\(\\)'s timeout"):
        gpus.close(timeout=timeout)  # type: ignore[arg-type]
    assert not gpus.closed and backend.closes == 0
    gpus.close(timeout=float("inf"))  # no bound
    assert backend.closes == 1


def test_leaving_with_through_an_exception_keeps_it_and_notes_a_hung_close(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "CLOSE_TIMEOUT_S", 0.0)
    backend = HungRelease()
    with pytest.raises(KeyError) as caught, Session(backend):  # type: ignore[arg-type]
        raise KeyError("the caller's own error")
    notes = getattr(caught.value, "__notes__", [])
    assert len(notes) == 1 and "closing the session" in notes[0] and "nvmlShutdown" in notes[0]
    backend.go.set()


def test_a_hung_close_does_not_change_the_answer_of_wait_until_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = HungRelease()
    monkeypatch.setattr(session_module, "open", lambda *args, **kwargs: Session(backend))  # type: ignore[arg-type]
    result = nc.wait_until_clean(timeout=0)
    assert result.clean and backend.closes == 1
    backend.go.set()


def test_with_on_a_closed_session_raises() -> None:
    gpus = Session(HungRelease(hang=False))  # type: ignore[arg-type]
    gpus.close()
    with pytest.raises(SessionClosed, match="closed"), gpus:
        pass


def test_a_session_cannot_be_copied_or_pickled() -> None:
    backend = HungRelease(hang=False)
    gpus = Session(backend)  # type: ignore[arg-type]
    for attempt in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(ArgumentTypeError, match="cannot be pickled or copied"):
            attempt(gpus)
    gpus.close()
    assert backend.closes == 1  # a copy would have shared (and released) the same backend


def test_a_close_timeout_beyond_any_float_is_no_bound() -> None:
    backend = HungRelease(hang=False)
    Session(backend).close(timeout=10**400)  # type: ignore[arg-type]  # it raised OverflowError
    assert backend.closes == 1


def test_a_listen_hung_in_its_registration_does_not_hang_close() -> None:
    backend = HungRelease(hang=False)
    gpus = Session(backend)  # type: ignore[arg-type]
    gpus._listener_lock.acquire()  # another thread's listen(), stuck registering the GPUs' events
    outcome: list[BaseException | None] = []

    def close() -> None:
        try:
            gpus.close(timeout=0)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(_SETTLE_S)
    hung = closer.is_alive()
    gpus._listener_lock.release()  # the registration returns: the release goes on
    closer.join(_SETTLE_S)
    assert not hung, "close() waited for the listener lock without a bound"
    assert len(outcome) == 1 and isinstance(outcome[0], Timeout) and gpus.closed
    assert backend.returned.wait(_SETTLE_S) and backend.closes == 1
