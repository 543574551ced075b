"""Session.wait_until_clean's setup counts against its timeout: resolving a selection that must read the GPUs (a
UUID, ``cuda:N``) is stopped at the deadline, and a timeout reports the timeout asked for and the time since the call
began. Driven by a backend whose every reading takes 0.5 s on an injected clock (a slow nvidia-smi)."""

from __future__ import annotations

from typing import Any

import pytest
from snapshots import idle

from nvmlcheck.errors import DeadlinePassed, WaitTimeout
from nvmlcheck.model import Fields, Snapshot
from nvmlcheck.session import Session
from nvmlcheck.wait import Deadline

MS = 1_000_000
READ_NS = 500 * MS


class SlowReads:
    """A two-GPU backend: each snapshot takes READ_NS on its clock and stops once its deadline has passed."""

    name = "smi"

    def __init__(self) -> None:
        self.now_ns = 0
        self.reads: list[Fields] = []

    def clock(self) -> int:
        return self.now_ns

    def sleep(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)

    def device_count(self) -> int:
        return 2

    def snapshot(self, indices: Any, fields: Fields, *, deadline: Deadline | None = None) -> Snapshot:
        self.reads.append(fields)
        self.now_ns += READ_NS
        if deadline is not None and deadline.expired():
            raise DeadlinePassed("the run was cut at the deadline")
        return idle(0, 1)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("selector", [idle(0, 1).devices[1].uuid, "GPU-00000001", "cuda:1"])
def test_a_selection_that_reads_the_gpus_is_stopped_at_the_wait_deadline(selector: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = SlowReads()
    gpus = Session(backend)  # type: ignore[arg-type]
    with pytest.raises(WaitTimeout) as caught:
        gpus.wait_until_clean(timeout=0.3, devices=selector, clock=backend.clock, sleep=backend.sleep)
    # One reading, cut at the deadline: the wait ended one query late, not a reading and then a whole wait later.
    assert backend.reads == [Fields(0)]
    assert backend.now_ns <= 300 * MS + READ_NS
    err = caught.value
    assert err.timeout_s == 0.3 and err.elapsed_ns == backend.now_ns and err.polls == 0 and not err.held
    assert "the GPUs named by the selection were still being read" in str(err)


def test_the_time_a_selection_took_is_taken_from_the_wait_and_reported() -> None:
    backend = SlowReads()
    gpus = Session(backend)  # type: ignore[arg-type]
    result = gpus.wait_until_clean(timeout=2.0, devices="GPU-00000001", clock=backend.clock, sleep=backend.sleep,
                                   stable_polls=1)
    assert result.clean and backend.reads[0] == Fields(0)
    with pytest.raises(WaitTimeout) as caught:
        gpus.wait_until_clean(timeout=0.7, devices="GPU-00000001", clock=backend.clock, sleep=backend.sleep)
    # 0.5 s to resolve, then the wait has 0.2 s: its first poll (0.5 s) is cut. Reported: the 0.7 s asked for, and
    # the whole second, not what the poller alone saw.
    err = caught.value
    assert err.timeout_s == 0.7 and err.elapsed_ns == 1000 * MS and err.polls == 0


@pytest.mark.parametrize("selector", [idle(0, 1).devices[1].uuid, "cuda:1"])
def test_a_selects_selection_is_read_by_its_deadline_and_counted_in_it(selector: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck.selection import SelectTimeout

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    backend = SlowReads()
    gpus = Session(backend)  # type: ignore[arg-type]
    with pytest.raises(SelectTimeout) as caught:
        gpus.select_clean(1, timeout=0.3, devices=selector, clock=backend.clock, sleep=backend.sleep)
    assert backend.reads == [Fields(0)] and backend.now_ns <= 300 * MS + READ_NS  # one query late at most
    err = caught.value
    assert err.timeout_s == 0.3 and err.elapsed_ns == backend.now_ns and err.polls == 0 and err.count == 1
    assert "the GPUs named by the selection were still being read" in str(err)


def test_the_time_a_selects_selection_took_is_taken_from_its_timeout() -> None:
    from nvmlcheck.selection import SelectTimeout

    backend = SlowReads()
    gpus = Session(backend)  # type: ignore[arg-type]
    # 0.5 s to resolve leaves 0.2 s, and the poll that then takes 0.5 s is cut at the deadline.
    with pytest.raises(SelectTimeout) as caught:
        gpus.select_clean(1, timeout=0.7, devices=idle(0, 1).devices[1].uuid, clock=backend.clock,
                          sleep=backend.sleep)
    assert caught.value.elapsed_ns == 1000 * MS and caught.value.polls == 0
