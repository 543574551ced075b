"""NVML events on the stub (issue 15): the listener, waits aborted by fatal XIDs, application XIDs only recorded,
events unsupported -> polling, the thread stopped at close, fork safety.

No wall-clock duration is asserted: events are raised by the stub's timeline (``at ms=`` lines, so the listener
thread, which does not count toward ``at call=``, can see them), waits get generous timeouts and the assertions are
about what was raised and what was seen, never how fast.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.events import XID_TABLE, EventKind, GpuEvent, xid_info
from nvmlcheck.testing import Scenario, StubProbe, build_stub, stub_source_dir

pytestmark = pytest.mark.stub
GIB = 1 << 30


def _event_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nvmlcheck events"]


def _busy_until_xid(xid: int, *, gpus: int = 1, device: int = 0, at_ms: int = 50) -> Scenario:
    """GPU 0 held for ever (4 GiB by a process), an XID on ``device`` at ``at_ms``."""
    sc = Scenario.h200(gpus)
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.at_ms(at_ms).raise_event(device, "xid", xid=xid)
    return sc


def test_xid_79_aborts_a_wait_with_gpu_fault(scenario_path: Path) -> None:
    _busy_until_xid(79).write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus, pytest.raises(nc.GpuFault) as info:
        gpus.wait_until_clean(timeout=120.0, events=True)
    fault = info.value
    assert (fault.index, fault.xid, fault.kind) == (0, 79, "xid")
    assert fault.uuid is not None and fault.uuid.startswith("GPU-")
    assert "fallen off the bus" in str(fault) and "GPU 0" in str(fault)
    assert pickle.loads(pickle.dumps(fault)).xid == 79
    assert isinstance(fault, nc.NvmlCheckError)


def test_a_fatal_xid_on_an_unselected_gpu_is_recorded_not_raised(scenario_path: Path) -> None:
    sc = Scenario.h200(2)
    sc.at_ms(0).raise_event(1, "xid", xid=79)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        # Wait until the listener has seen it, then wait on GPU 0 only: clean.
        seen, _ = listener.next_events(0, 60.0)
        assert [(e.index, e.xid) for e in seen] == [(1, 79)]
        result = gpus.wait_until_clean(timeout=60.0, devices=0, events=True)
        assert result.polls >= 1


def test_application_xid_13_is_recorded_and_the_wait_ends_clean(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.at_ms(0).raise_event(0, "xid", xid=13)
    sc.at_ms(200).remove_process(0, 4_000_001)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        gpus.wait_until_clean(timeout=120.0, events=True)
        # The XID came at 0 ms, the release at 200: by the time the wait ends clean it has been received.
        seen, _ = listener.next_events(0, 60.0)
        assert [(e.index, e.kind, e.xid, e.fatal) for e in seen] == [(0, EventKind.XID, 13, False)]


def test_events_not_supported_falls_back_to_polling(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.add_device(unsupported=("events",))
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        assert listener.active and listener.covered == {0}
        assert listener.device_reasons == {1: "nvmlDeviceGetSupportedEventTypes: NVML_ERROR_NOT_SUPPORTED"}
        assert listener.reason is not None and "GPU 1" in listener.reason
        gpus.wait_until_clean(timeout=60.0, events=True)


def test_no_gpu_with_events_is_unsupported_with_a_reason_and_waits_poll(scenario_path: Path) -> None:
    sc = Scenario()
    sc.add_device(unsupported=("events",))
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        assert listener.state == "unsupported" and listener.thread is None
        assert listener.reason is not None and "NOT_SUPPORTED" in listener.reason
        assert gpus.listen() is listener  # said once, not retried per call
        gpus.wait_until_clean(timeout=60.0, events=True)
    assert not _event_threads()


def test_no_permission_is_a_reason_not_a_failure(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlDeviceRegisterEvents", 4)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        assert listener.state == "unsupported"
        assert listener.reason is not None and "NVML_ERROR_NO_PERMISSION" in listener.reason


def test_a_library_without_event_symbols_says_so(scenario_path: Path) -> None:
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub(["STUB_NO_EVENTS"]))) as gpus:
        listener = gpus.listen()
        assert listener.state == "unsupported"
        assert listener.reason is not None and "does not export nvmlEventSetCreate" in listener.reason
        gpus.wait_until_clean(timeout=60.0, events=True)


def test_the_smi_backend_has_no_events_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi = [sys.executable, "-S", str(stub_source_dir() / "fake_nvidia_smi.py")]
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(Scenario.h200().write(tmp_path / "scenario.txt")))
    with nc.open("smi", smi_command=fake_smi) as gpus:
        listener = gpus.listen()
        assert listener.state == "unsupported" and not listener.active and listener.thread is None
        assert listener.reason is not None and "smi backend has no events" in listener.reason
        gpus.wait_until_clean(timeout=30, events=True)  # polls, never fails for want of events


def test_the_listener_thread_stops_at_close(scenario_path: Path) -> None:
    Scenario.h200(2).write(scenario_path)
    before = len(_event_threads())
    gpus = nc.open("nvml", library_path=str(build_stub()))
    listener = gpus.listen()
    assert listener.active and listener.covered == {0, 1}
    thread = listener.thread
    assert thread is not None and thread.is_alive() and thread.daemon
    assert len(_event_threads()) == before + 1
    assert gpus.listen() is listener  # one thread per session
    gpus.close()
    assert not thread.is_alive()
    assert listener.state == "stopped" and listener.thread is None
    assert len(_event_threads()) == before
    assert StubProbe(build_stub()).call_count("nvmlEventSetFree") >= 1


def test_double_bit_ecc_event_is_fatal_single_bit_is_recorded(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.at_ms(0).raise_event(0, "sbe")
    sc.at_ms(50).raise_event(0, "dbe")
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus, pytest.raises(nc.GpuFault) as info:
        gpus.wait_until_clean(timeout=120.0, events=True)
    assert info.value.kind == "double_bit_ecc" and info.value.xid is None


def test_kill_and_wait_aborts_on_a_fatal_xid(scenario_path: Path) -> None:
    import subprocess

    from nvmlcheck.kill import kill_and_wait

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        sc = Scenario.h200()
        sc.add_process(0, child.pid, used_bytes=4 * GIB, bound=True)
        sc.add_process(0, 4_000_002, used_bytes=GIB)  # never goes away: only the XID can end the wait early
        # At 1 s of the stub's clock: the listener runs from before the wait, and an XID it receives before the wait
        # began is not the wait's (100 ms did not always cover the steps before it on a loaded CI machine).
        sc.at_ms(1000).raise_event(0, "xid", xid=48)
        sc.write(scenario_path)
        with nc.open("nvml", library_path=str(build_stub())) as gpus:
            gpus.listen()
            with pytest.raises(nc.GpuFault) as info:
                kill_and_wait(gpus, [child.pid], timeout=120.0)
        assert info.value.xid == 48
    finally:
        child.kill()
        child.wait()


def test_a_forked_child_does_not_inherit_the_listener(scenario_path: Path) -> None:
    Scenario.h200().write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        assert listener.active
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            code = 1
            try:
                ok = listener.state == "stopped" and listener.thread is None and not _event_threads()
                fresh = gpus.listen()  # a new listener in the child, on the child's own NVML init
                ok = ok and fresh is not listener and fresh.active
                gpus.close()
                ok = ok and not fresh.active and not _event_threads()
                os.write(w, b"ok" if ok else b"bad")
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        answer = os.read(r, 16)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert answer == b"ok" and os.waitstatus_to_exitcode(status) == 0
        assert listener.active  # the parent's is untouched
    assert not listener.active


def test_gpu_event_json_and_table() -> None:
    ev = GpuEvent(0, "GPU-x", EventKind.XID, 79, 5, 1_700_000_000.25)
    doc = ev.to_json()
    assert doc["schema"] == "nvmlcheck/event" and doc["version"] == 1 and doc["fatal"] is True
    assert "XID 79" in ev.line() and "FATAL" in ev.line()
    assert {c for c, x in XID_TABLE.items() if x.fatal} >= {48, 79, 95}
    assert not any(XID_TABLE[c].fatal for c in (13, 31, 43, 45))
    assert not xid_info(12345).fatal


# --- the CLI ----------------------------------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from nvmlcheck import cli

    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_wait_events_exits_4_on_xid_79(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(_busy_until_xid(79).write(tmp_path / "scenario.txt"))
    code, out, err = _cli(capsys, "--simulate", path, "wait", "--events", "--timeout", "120")
    assert code == 4, err
    assert "XID 79" in err and "fallen off the bus" in err
    code, out, _ = _cli(capsys, "--simulate", path, "--json", "wait", "--events", "--timeout", "120")
    import json

    doc = json.loads(out)
    assert (doc["schema"], doc["exit_code"]) == ("nvmlcheck/error", 4)
    err_doc = doc["error"]
    assert (err_doc["type"], err_doc["index"], err_doc["xid"], err_doc["kind"]) == ("GpuFault", 0, 79, "xid")
    assert not _event_threads()


def test_cli_wait_without_events_support_says_so_and_polls(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario()
    sc.add_device(unsupported=("events",))
    code, _, err = _cli(capsys, "--simulate", str(sc.write(tmp_path / "s.txt")), "wait", "--events", "--timeout", "60")
    assert code == 0
    assert err.count("events:") == 1 and "NOT_SUPPORTED" in err


class _HeldClock:
    """``watch``'s ``time``, whose clocks stand still until it has written ``lines`` lines: its ``--for`` then ends
    after the events raised at load were printed, however slowly the machine registered and heard them. The events
    were there at load, but a loaded machine could take the whole --for (1 s, 0.5 s) to register the GPUs and hear
    them: the stream came out empty, a race these tests lost on two loaded cores."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, lines: int) -> None:
        import time as real

        from nvmlcheck.cli import _watch

        self._real, self.lines, self.written = real, lines, 0
        self._held_ns: int | None = None
        write = vars(_watch)["write_whole"]

        def counted(text: str, **kwargs: object) -> None:
            write(text, **kwargs)
            self.written += 1

        monkeypatch.setattr(_watch, "write_whole", counted)
        monkeypatch.setattr(_watch, "time", self)

    def monotonic_ns(self) -> int:
        now = self._real.monotonic_ns()
        if self._held_ns is None:
            self._held_ns = now
        return now if self.written >= self.lines else self._held_ns

    def monotonic(self) -> float:
        return self.monotonic_ns() / 1e9

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


def test_cli_watch_streams_json_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    sc = Scenario.h200(2)
    sc.at_ms(0).raise_event(0, "xid", xid=13)
    sc.at_ms(0).raise_event(1, "xid", xid=79)
    sc.at_ms(0).raise_event(0, "sbe")
    path = str(sc.write(tmp_path / "scenario.txt"))
    # --for ends the stream once GPU 0's two events are out (its clock held until then: _HeldClock).
    clock = _HeldClock(monkeypatch, 2)
    code, out, err = _cli(capsys, "--simulate", path, "--json", "watch", "--devices", "0", "--for", "1")
    assert code == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert [(d["schema"], d["version"], d["index"], d["kind"], d["xid"]) for d in docs] == [
        ("nvmlcheck/event", 1, 0, "xid", 13),
        ("nvmlcheck/event", 1, 0, "single_bit_ecc", None),
    ]
    assert all(d["simulated"] is True for d in docs)  # as every document on simulated GPUs
    clock.lines, clock.written, clock._held_ns = 3, 0, None  # the three events of both GPUs
    code, out, _ = _cli(capsys, "--simulate", path, "watch", "--for", "1")
    assert code == 0 and "GPU 1 FATAL XID 79" in out


def test_cli_watch_says_on_stderr_that_it_listens_and_how_many_events_came(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario.h200(2)
    path = str(sc.write(tmp_path / "quiet.txt"))
    # Quiet GPUs: stdout stays empty (it is the events alone), stderr says it listened and that nothing came.
    code, out, err = _cli(capsys, "--simulate", path, "watch", "--for", "0.2")
    assert (code, out) == (0, "")
    assert _watch_lines(err) == ["listening to GPUs 0, 1 for 0.2 s", "0 events in 0.2 s"]
    sc.at_ms(0).raise_event(1, "xid", xid=13)
    sc.write(tmp_path / "quiet.txt")
    clock = _HeldClock(monkeypatch, 1)  # --for 0.5 ends once the XID is out, however long hearing it took
    code, out, err = _cli(capsys, "--simulate", path, "watch", "--devices", "1", "--for", "0.5")
    assert code == 0 and out.count("XID 13") == 1
    assert _watch_lines(err) == ["listening to GPU 1 for 0.5 s", "1 event in 0.5 s"]
    clock.lines = 0
    code, out, err = _cli(capsys, "--simulate", path, "--json", "watch", "--for", "0.2")
    assert code == 0 and _watch_lines(err) == []  # JSON Lines: nothing else


def _watch_lines(err: str) -> list[str]:
    return [line.removeprefix("nvmlcheck watch: ") for line in err.splitlines() if line.startswith("nvmlcheck watch: ")]


def test_cli_watch_of_gpus_without_events_exits_3_even_when_others_have_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200()
    sc.add_device(unsupported=("events",))
    path = str(sc.write(tmp_path / "s.txt"))
    code, _, err = _cli(capsys, "--simulate", path, "watch", "--devices", "1", "--for", "1")
    assert code == 3 and "no selected GPU is listened to" in err and "NOT_SUPPORTED" in err
    code, _, err = _cli(capsys, "--simulate", path, "watch", "--devices", "0", "--for", "0.1")
    assert code == 0 and "listening to GPU 0 for 0.1 s" in err
    # GPU 1 is not watched: its reason is not the operator's concern here (it was printed as a warning).
    assert "GPU 1" not in err and "NOT_SUPPORTED" not in err
    code, _, err = _cli(capsys, "--simulate", path, "watch", "--for", "0.1")  # all GPUs: GPU 1's reason, once
    assert code == 0 and err.count("not listened to: GPU 1: ") == 1 and "NOT_SUPPORTED" in err


def test_cli_watch_without_events_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario()
    sc.add_device(unsupported=("events",))
    code, _, err = _cli(capsys, "--simulate", str(sc.write(tmp_path / "s.txt")), "watch", "--for", "1")
    assert code == 3 and "NOT_SUPPORTED" in err
    # Under --json the error is a document too (the stream's last line), as for every command.
    import json

    code, out, _ = _cli(capsys, "--simulate", str(tmp_path / "s.txt"), "--json", "watch", "--for", "1")
    doc = json.loads(out.splitlines()[-1])
    assert code == 3 and (doc["schema"], doc["exit_code"]) == ("nvmlcheck/error", 3)
    assert "NOT_SUPPORTED" in doc["error"]["message"]


@pytest.mark.parametrize(("signum", "code"), [(2, 130), (15, 143)])
def test_cli_watch_ends_on_ctrl_c_and_sigterm(tmp_path: Path, signum: int, code: int) -> None:
    import signal
    import subprocess

    sc = Scenario.h200()
    sc.at_ms(0).raise_event(0, "xid", xid=13)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "--simulate", str(sc.write(tmp_path / "s.txt")), "--json", "watch"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        # SIGINT at its default in the child even where the suite runs with it ignored (a background job).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 - one call, no locks
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the listener runs: the event raised at load is out
        assert b'"xid":13' in first
        proc.send_signal(signal.Signals(signum))
        assert proc.wait(timeout=120) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_fake_nvidia_smi_accepts_event_scenarios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One scenario serves both backends: nvidia-smi has no events, so its fake ignores event lines.
    fake_smi = [sys.executable, "-S", str(stub_source_dir() / "fake_nvidia_smi.py")]
    sc = Scenario.h200()
    sc.add_device(unsupported=("events",))
    sc.at_ms(0).raise_event(0, "xid", xid=79)
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "scenario.txt")))
    with nc.open("smi", smi_command=fake_smi) as gpus:
        assert len(gpus.snapshot().devices) == 2


def test_a_listener_whose_wait_fails_says_why_and_waits_poll(scenario_path: Path) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlEventSetWait_v2", 999)
    sc.write(scenario_path)
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        listener.next_events(0, 60.0)  # returns once the thread has stopped listening
        assert listener.state == "failed" and listener.thread is not None
        assert listener.reason is not None and "nvmlEventSetWait_v2" in listener.reason
        listener.thread.join(60.0)
        assert not listener.thread.is_alive()
        gpus.wait_until_clean(timeout=60.0)  # a new listener (failing the same way) or none: the wait polls
    assert not _event_threads()


def test_a_refused_full_mask_falls_back_to_the_fault_kinds(scenario_path: Path) -> None:
    # A driver may refuse P-state/clock registration although it reports them: XID and ECC must still be heard.
    sc = Scenario.h200()
    sc.fault("nvmlDeviceRegisterEvents", 3, count=1)
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    # At the 40th counted NVML call: within the wait's polls, whatever the machine's speed (the listener's event calls
    # do not count). It was at 1 s of the stub's clock: an XID the listener received before the wait began is not
    # the wait's, and on a loaded machine opening and the checks below could take that second (first 50 ms, then
    # 1 s): the wait then polled its GPU, held for ever, until its timeout.
    sc.at_call(_XID_AT_CALL).raise_event(0, "xid", xid=79)
    sc.write(scenario_path)
    before = _counted_calls()  # the probe counts since the library was loaded: earlier tests' calls too
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        listener = gpus.listen()
        assert listener.active and listener.covered == {0} and listener.reason is None
        assert StubProbe(build_stub()).call_count("nvmlDeviceRegisterEvents") >= 2
        assert _counted_calls() - before < _XID_AT_CALL  # the XID comes during the wait, not before it
        with pytest.raises(nc.GpuFault):
            gpus.wait_until_clean(timeout=120.0)  # events=None: the running listener is used


_XID_AT_CALL = 40
_EVENT_CALLS = ("nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
                "nvmlEventSetWait_v2", "nvmlEventSetFree")


def _counted_calls() -> int:
    """The NVML calls ``at call=N`` counts, since the library was loaded: every call but the listener's event
    calls."""
    probe = StubProbe(build_stub())
    return probe.call_count() - sum(probe.call_count(fn) for fn in _EVENT_CALLS)


def test_a_long_sleep_between_polls_is_woken_by_the_fault(scenario_path: Path) -> None:
    # A 60 s interval: without the listener's wake-up the fault would be seen at the second poll, a minute later.
    # Counted, not timed: at most one poll happens before the fault ends the wait.
    _busy_until_xid(79).write(scenario_path)
    polls: list[object] = []
    with nc.open("nvml", library_path=str(build_stub())) as gpus, pytest.raises(nc.GpuFault):
        gpus.wait_until_clean(timeout=600.0, policy=nc.PollPolicy.every(60.0), events=True, on_poll=polls.append)
    assert len(polls) <= 1


_PLAIN_WAIT = """
import sys
import nvmlcheck as nc
from nvmlcheck.testing import Scenario, use_stub
with use_stub(Scenario.h200()), nc.open("nvml") as gpus:
    gpus.wait_until_clean(timeout=5)
print("nvmlcheck.events" in sys.modules)
"""


def test_a_wait_without_events_does_not_load_the_events_module() -> None:
    # A launch script's plain wait pays nothing for the listener: neither its import nor a check per poll.
    import subprocess

    out = subprocess.run([sys.executable, "-c", _PLAIN_WAIT], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_a_failed_listener_replaced_by_each_wait_leaks_no_event_set(scenario_path: Path) -> None:
    # NVML's wait fails for good (re-initialised under the listener, say): each wait with events=None replaces the
    # failed listener, without stopping it, and the failed one never freed its set: one set per wait, each still
    # registered for every GPU.
    sc = Scenario.h200()
    sc.fault("nvmlEventSetWait_v2", 999)
    sc.write(scenario_path)
    probe = StubProbe(build_stub())
    created, freed = probe.call_count("nvmlEventSetCreate"), probe.call_count("nvmlEventSetFree")
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        for _ in range(3):
            listener = gpus.listen()
            listener.next_events(0, 60.0)  # returns once the thread has stopped listening
            assert listener.thread is not None
            listener.thread.join(60.0)
            assert listener.state == "failed"
            gpus.wait_until_clean(timeout=60.0)
        now = gpus.listener
        assert now is not None and now.thread is not None
        now.thread.join(60.0)  # the last wait's listener has failed too: nothing in flight
        made = probe.call_count("nvmlEventSetCreate") - created
        assert made >= 3 and probe.call_count("nvmlEventSetFree") - freed == made
