"""The simulated GPU's temporary directory cannot leak through a signal that lands while it is being made."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck._sim import session as sim_session
from nvmlcheck.testing import Scenario


def test_termination_signals_are_held_while_the_directory_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[set[int]] = []
    real = tempfile.TemporaryDirectory

    def recording(*args: Any, **kwargs: Any) -> tempfile.TemporaryDirectory[str]:
        seen.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))  # the mask in force right now
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", recording)
    before = set(signal.pthread_sigmask(signal.SIG_BLOCK, []))
    with sim_session.simulation(Scenario.h200()) as stub:
        assert set(signal.pthread_sigmask(signal.SIG_BLOCK, [])) == before  # released inside the block
        directory = Path(stub.scenario_path).parent
        assert directory.is_dir()
    assert seen and {signal.SIGTERM, signal.SIGHUP, signal.SIGINT} <= seen[0]
    assert not directory.exists()


def test_a_signal_held_during_creation_arrives_after_the_removal_is_registered() -> None:
    class Stop(Exception):
        pass

    def handler(signum: int, frame: object) -> None:
        raise Stop

    old = signal.signal(signal.SIGTERM, handler)
    made: list[Path] = []
    kept: list[tempfile.TemporaryDirectory[str]] = []
    real = tempfile.TemporaryDirectory

    def signalling(*args: Any, **kwargs: Any) -> tempfile.TemporaryDirectory[str]:
        made_dir = real(*args, **kwargs)
        made.append(Path(made_dir.name))
        kept.append(made_dir)  # as a traceback's frames keep it: its own finalizer must not be what removes it
        signal.raise_signal(signal.SIGTERM)  # lands between creation and registration of the removal
        return made_dir

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(tempfile, "TemporaryDirectory", signalling)
            with pytest.raises(Stop), sim_session.simulation(Scenario.h200()):
                pass
    finally:
        signal.signal(signal.SIGTERM, old)
    assert made and not made[0].exists()
    kept.clear()
