"""A registration call that does not return (a wedged driver) does not hang the wait, ready or kill that started
the listener: it is waited for until their deadline (and ``START_WAIT_S`` at most), then they poll, and use the
listener once it runs; close() does not wait for it. The stub's ``fault ... delay_ms`` hangs the call; nothing
asserts how long anything took."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, build_stub

pytestmark = pytest.mark.stub
GIB = 1 << 30
HANG_MS = 2_500  # longer than any deadline here; each test waits for the hung call to return before it ends


def _hung(scenario_path: Path, fn: str, device: int | None, *, held_until_ms: int | None = None) -> None:
    sc = Scenario.h200(2)
    sc.fault(fn, device=device, count=1, delay_ms=HANG_MS)
    if held_until_ms is not None:
        sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
        sc.at_ms(held_until_ms).remove_process(0, 4_000_001)
    sc.write(scenario_path)


def _bounded(work: Callable[[], object]) -> None:
    """Run ``work`` in a helper thread the test joins: a call that hangs fails the test instead of hanging it."""
    done = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # handed to the test
            failed.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(HANG_MS / 1000 * 4), "the call hung in the listener's registration"
    if failed:
        raise failed[0]


def _join(thread: threading.Thread | None) -> None:
    """The listener thread, given up by close(), ends when the hung call returns: not left to later tests."""
    if thread is not None:
        thread.join(30.0)
        assert not thread.is_alive()


@pytest.mark.parametrize(("fn", "device"), [("nvmlDeviceRegisterEvents", 0), ("nvmlEventSetCreate", None)])
def test_a_wait_whose_listener_registration_hangs_polls(scenario_path: Path, fn: str, device: int | None) -> None:
    _hung(scenario_path, fn, device)
    gpus = nc.open("nvml", library_path=str(build_stub()))
    try:
        results: list[nc.WaitResult] = []
        _bounded(lambda: results.append(gpus.wait_until_clean(timeout=0.5, events=True)))
        # Idle GPUs: clean, by polling (before, the wait hung in the first GPU's registration as long as it did).
        assert results and results[0].clean
        listener = gpus.listener
        assert listener is not None
        thread = listener.thread
        # The wait's result says it polled without the listener, naming the call, whenever the call returns. The
        # listener's state said it alone: "starting" unless the machine was slow enough for the call (2.5 s) to
        # have returned by now, an order this test lost on a loaded machine.
        starting = [g for g in results[0].listening_gaps or () if g.cause == "starting"]
        assert starting and starting[0].indices == (0, 1)
        assert fn in starting[0].why and "GPUs not registered: 0, 1" in starting[0].why
        if listener.state == "starting":
            assert not listener.active
            assert fn in (listener.reason or "") and "GPUs not registered: 0, 1" in (listener.reason or "")
        else:
            assert listener.state == "running" and starting[0].ended_ns is not None
        # A second wait does not start a second registration (it would hang in the same call): it polls too.
        _bounded(lambda: results.append(gpus.wait_until_clean(timeout=0.2, events=True)))
        assert results[1].clean and gpus.listener is listener
    finally:
        _bounded(gpus.close)  # not waiting for the hung call
    assert listener.state == "stopped"
    _join(thread)


def test_ready_with_a_hung_registration_polls_and_says_why(scenario_path: Path) -> None:
    _hung(scenario_path, "nvmlDeviceRegisterEvents", 0, held_until_ms=300)
    gpus = nc.open("nvml", library_path=str(build_stub()))
    try:
        reports: list[nc.ReadyReport] = []
        _bounded(lambda: reports.append(gpus.ready(timeout=60.0)))
        # Before, ready waited in the registration; bounded by its deadline alone, it would have waited out its
        # whole timeout there before its first poll.
        assert reports[0].ready
        assert any("nvmlDeviceRegisterEvents on GPU 0 has not returned" in n for n in reports[0].notes)
        listener = gpus.listener
        thread = None if listener is None else listener.thread
    finally:
        _bounded(gpus.close)
    _join(thread)


def test_a_wait_uses_the_listener_once_its_registration_returns(scenario_path: Path) -> None:
    # GPU 0 held for ever; its registration hangs, then returns; an XID 79 comes after: the wait that started
    # polling without the listener stops on it.
    sc = Scenario.h200(1)
    sc.fault("nvmlDeviceRegisterEvents", device=0, count=1, delay_ms=1_500)
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.at_ms(3_000).raise_event(0, "xid", xid=79)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        faults: list[nc.GpuFault] = []

        def wait() -> None:
            try:
                gpus.wait_until_clean(timeout=60.0, events=True)
            except nc.GpuFault as fault:
                faults.append(fault)

        _bounded(wait)
        assert [(f.index, f.xid) for f in faults] == [(0, 79)]
        listener = gpus.listener
        assert listener is not None and listener.state == "running" and listener.covered == frozenset({0})


def test_watch_for_a_while_ends_when_the_registration_hangs(
    scenario_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from nvmlcheck import cli

    _hung(scenario_path, "nvmlDeviceRegisterEvents", 0)
    codes: list[int] = []
    before = {t for t in threading.enumerate() if t.name == "nvmlcheck events"}
    # Before, watch --for 0.3 registered without bound: it hung as long as the call did, past its --for.
    _bounded(lambda: codes.append(cli.main(["--simulate", str(scenario_path), "watch", "--for", "0.3"])))
    err = capsys.readouterr().err
    assert codes == [3] and "nvmlDeviceRegisterEvents on GPU 0 has not returned" in err
    for thread in {t for t in threading.enumerate() if t.name == "nvmlcheck events"} - before:
        _join(thread)
