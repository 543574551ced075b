"""What a wait does before its first poll counts against its deadline too: `ready`'s first reading (with health)
and the event listener's registration. Before, both ran unbounded: on a slow driver `ready --timeout 0.5` took
2.7 s (eight GPUs, a 300 ms health call each) and `wait --events --timeout 0` 2.6 s (a 300 ms registration each).
Time is a StepClock: how far a reading gets before the deadline depends on the code path alone."""

from __future__ import annotations

from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock, build_stub
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub


def _open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, devices: int) -> nc.Session:
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(Scenario.h200(devices=devices).write(tmp_path / "s.txt")))
    return nc.open("nvml", library_path=str(build_stub()))


def test_readys_first_reading_stops_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _open(tmp_path, monkeypatch, 8) as gpus:
        # Each clock reading is 0.1 s: the reading of eight GPUs (a deadline check between queries) passes 0.5 s.
        report = gpus.ready(timeout=0.5, events=False, options=WaitOptions(clock=StepClock(0.1).clock))
        assert not report.ready and report.polls == 1
        assert {v.class_ for v in report.verdicts} == {"unknown"}  # idle GPUs, but not read in time: never ready
        assert "did not complete within the timeout (0.5 s)" in report.verdicts[0].culprits[0].reason
        # One check (timeout 0) always completes, as a wait's does.
        assert gpus.ready(timeout=0, options=WaitOptions(clock=StepClock(0.1).clock)).ready


def test_the_listener_registration_stops_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _open(tmp_path, monkeypatch, 4) as gpus:
        # Steps of 1 s, timeout 2.5 s: the registration (in the listener's thread) is waited for 1.5 s of real time
        # at most, far more than the stub's few calls take, so the StepClock alone decides how far it gets. The
        # registration used the timeout up: what is left is a bound still, not one check judged alone (which called
        # the GPUs clean after one poll of the two asked for).
        steps = StepClock(1.0)
        with pytest.raises(nc.WaitTimeout):
            gpus.wait_until_clean(2.5, events=True, options=WaitOptions(clock=steps.clock, sleep=steps.sleep))
        listener = gpus.listener
        assert listener is not None and listener.state == "running"
        # Registered until the deadline (at least one GPU: a listener with none would be "unsupported" for good).
        assert 1 <= len(listener.covered) < 4
        assert "the deadline of the wait that started the listener came first" in (listener.reason or "")


def test_one_check_starts_no_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with _open(tmp_path, monkeypatch, 2) as gpus:
        gpus.wait_until_clean(0, events=True)
        assert gpus.listener is None  # registering would only delay the one check
        gpus.wait_until_clean(5, events=True)
        running = gpus.listener
        assert running is not None and running.state == "running" and running.covered == {0, 1}
        gpus.wait_until_clean(0, events=True)
        assert gpus.listener is running  # a running one is used


@pytest.mark.parametrize("backend", ["nvml", "smi"])
def test_a_remap_pending_while_waiting_is_seen_without_any_event(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], backend: str) -> None:
    import json

    from nvmlcheck import cli

    # The GPU is held until 400 ms; a remap becomes pending at 200 ms and no XID says so (events off, or nvidia-smi,
    # which has none). Before, health was read again only after an XID: "ready", exit 0.
    sc = Scenario.h200()
    sc.add_process(0, 4_123_456, used_bytes=8 << 30)
    sc.at_ms(200).set_device(0, remapped_rows=(0, 1, True, False))
    sc.at_ms(400).remove_process(0, 4_123_456)
    path = str(sc.write(tmp_path / "s.txt"))
    code = cli.main(["--simulate", path, "--backend", backend, "--json", "ready", "--timeout", "30", "--no-events"])
    doc = json.loads(capsys.readouterr()[0])
    assert not doc["ready"] and doc["gpus"][0]["class"] == "unhealthy", doc["gpus"][0]
    assert code == doc["exit_code"] != 0


def test_threads_that_listen_at_once_share_one_listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    with _open(tmp_path, monkeypatch, 2) as gpus:
        got: list[object] = []
        start = threading.Barrier(16)

        def listen() -> None:
            start.wait()
            got.append(gpus.listen())

        threads = [threading.Thread(target=listen) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # One per session (it was 5-6 listeners and threads: events heard by an orphan were lost).
        assert len({id(x) for x in got}) == 1
        assert sum(t.name == "nvmlcheck events" for t in threading.enumerate()) == 1


def test_ready_takes_the_options_timeout_a_caller_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tool author reuses one WaitOptions: ready took one check whatever it said (its keyword's default won).
    sc = Scenario.h200()
    sc.add_process(0, 4_123_456, used_bytes=8 << 30)  # never clean: a wait runs to its timeout
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "s.txt")))
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        steps = StepClock(0.1)
        report = gpus.ready(options=WaitOptions(timeout=60.0, clock=steps.clock, sleep=steps.sleep), events=False)
        assert report.timeout_s == 60.0 and report.polls > 1, report.verdicts[0].culprits
        # Options that do not set a timeout leave ready's own default: one check.
        report = gpus.ready(options=WaitOptions(policy="precise"))
        assert report.timeout_s == 0.0 and report.polls == 1
        # The keyword, given, wins over the options.
        report = gpus.ready(timeout=0, options=WaitOptions(timeout=2.0))
        assert report.timeout_s == 0.0 and report.polls == 1
        assert WaitOptions(timeout=2.0).given("timeout") and not WaitOptions(policy="precise").given("timeout")
