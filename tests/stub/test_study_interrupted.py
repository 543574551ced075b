"""A study interrupted (Ctrl-C) while its reapers are being started: the interrupt comes out as such (not a
``RuntimeError`` from joining a reaper never started), and every holder is reaped, none left a zombie."""

from __future__ import annotations

import os
from typing import Any

import pytest

import nvmlcheck
from nvmlcheck.study import StudyConfig, run_study
from nvmlcheck.study import observer as observer_module
from nvmlcheck.study.stub_holder import StubHolderFactory
from nvmlcheck.testing import Scenario, use_stub

pytestmark = [pytest.mark.stub, pytest.mark.usefixtures("nvml_released")]

GIB = 1 << 30


def _open() -> nvmlcheck.Session:
    return nvmlcheck.open("nvml")


def test_an_interrupt_while_the_reapers_start_reaps_every_holder(monkeypatch: pytest.MonkeyPatch) -> None:
    real_init, real_start = observer_module.Reaper.__init__, observer_module.Reaper.start
    started: list[int] = []
    pids: list[int] = []

    def init(self: Any, holder: Any) -> None:
        pids.append(holder.pid)
        real_init(self, holder)

    def start(self: Any) -> None:
        if len(started) == 1:  # the second reaper: Ctrl-C before its thread exists
            raise KeyboardInterrupt
        started.append(self.holder.pid)
        real_start(self)

    monkeypatch.setattr(observer_module.Reaper, "__init__", init)
    monkeypatch.setattr(observer_module.Reaper, "start", start)
    config = StudyConfig(sizes=(GIB,), repeats=1, endings=("KILL",), warmup="none", per_gpu=3)
    with use_stub(Scenario.h200()) as stub, pytest.raises(KeyboardInterrupt):
        run_study(config, session_factory=_open,
                  holder_factory=StubHolderFactory(stub.scenario_path, list_ms=10, release_ms=20))
    assert len(pids) == 3 and len(started) == 1
    for pid in pids:  # reaped: not a zombie child of this process (waitpid has no child of that pid)
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
