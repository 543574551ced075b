"""What ``kill_and_wait`` reads before its first signal (a UUID, ``cuda:N`` or ``MIG-`` selector's GPU identities,
``only_targets``' baseline) is bounded by the call's deadline. Before, ``session.resolve`` ran unbounded: a slow or
hung GPU (or nvidia-smi) held the call past its timeout, and the signal went out after it. A cut reading ends the
call with a :class:`~nvmlcheck.KillTimeout` that says nothing was signalled, and nothing is. Time is a StepClock:
how far a reading gets before the deadline depends on the code path alone. Whether a slow reading after the signal
holds back the grace period's SIGKILL is told by counting the stub's calls made before the SIGKILL (each sleeps in
the stub), never by the time it went out."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StepClock

pytestmark = pytest.mark.stub
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


@pytest.mark.parametrize("selector", ["uuid", "cuda:0"])
def test_a_selection_read_past_the_deadline_signals_nothing(
    gpus: Callable[[Scenario], nc.Session], python_child: Callable[..., subprocess.Popen[bytes]], selector: str,
) -> None:
    child = python_child(SLEEP)
    with gpus(Scenario.h200(devices=8)) as session:
        uuid = session.snapshot(0).devices[0].uuid
        devices = {"uuid": uuid, "cuda:0": "cuda:0"}[selector]
        # Each clock reading is 0.1 s: reading eight GPUs' identities (a deadline check between queries) passes 0.5 s.
        with pytest.raises(nc.KillTimeout) as info:
            nc.kill_and_wait(session, [child.pid], devices=devices, timeout=0.5,
                             options=nc.WaitOptions(clock=StepClock(0.1).clock))
        exc = info.value
        assert exc.pids == () and not exc.held and exc.timeout_s == 0.5
        assert "nothing was signalled" in str(exc) and "still being read" in str(exc)
        assert child.poll() is None  # not signalled
        # With time to read them, the same selection kills.
        result = nc.kill_and_wait(session, [child.pid], devices=devices, timeout=30, grace_s=0,
                                  predicate=nc.always())
        assert [t.pid for t in result.pids] == [child.pid] and child.wait(10) is not None


def test_only_targets_baseline_read_past_the_deadline_signals_nothing(
    gpus: Callable[[Scenario], nc.Session], python_child: Callable[..., subprocess.Popen[bytes]],
) -> None:
    child = python_child(SLEEP)
    with gpus(Scenario.h200(devices=8)) as session:
        # An index selection reads nothing to resolve; the baseline (eight GPUs' memory and lists) is what is cut.
        with pytest.raises(nc.KillTimeout) as info:
            nc.kill_and_wait(session, [child.pid], devices=list(range(8)), timeout=0.5, only_targets=True,
                             options=nc.WaitOptions(clock=StepClock(0.1).clock))
        assert "the baseline of the selected GPUs" in str(info.value) and info.value.pids == ()
        assert child.poll() is None


def test_one_check_reads_the_selection_whole(
    gpus: Callable[[Scenario], nc.Session], python_child: Callable[..., subprocess.Popen[bytes]],
) -> None:
    child = python_child(SLEEP)
    with gpus(Scenario.h200(devices=8)) as session:
        uuid = session.snapshot(7).devices[0].uuid
        # timeout 0: one check, which always completes (as a wait's): the selection is read, the signal sent.
        try:
            records = nc.kill_and_wait(session, [child.pid], devices=uuid, timeout=0, grace_s=None,
                                       options=nc.WaitOptions(clock=StepClock(0.1).clock)).pids
        except nc.KillTimeout as exc:  # the one check may come before the child's exit
            records = exc.pids
        assert [(t.pid, [s.name for s in t.signals]) for t in records] == [(child.pid, ["SIGTERM"])]
        assert child.wait(10) == -15


def test_the_command_line_stops_a_slow_selection_at_its_timeout_with_nothing_signalled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
) -> None:
    from nvmlcheck import cli

    child = python_child(SLEEP)
    sc = Scenario.h200(devices=4)
    # Every UUID reading takes 0.3 s: the selection's four take 1.2 s, the timeout is 0.5 s.
    sc.fault("nvmlDeviceGetUUID", delay_ms=300)
    path = str(sc.write(tmp_path / "s.txt"))
    uuid = "GPU-00000000-0000-0000-0000-000000000003"
    code = cli.main(["--simulate", path, "--json", "kill", "--only-targets", "--devices", uuid, "--timeout", "0.5",
                     str(child.pid)])
    out, err = capsys.readouterr()
    assert code == 3, (out, err)
    assert "nothing was signalled" in out and "still being read" in out
    assert child.poll() is None  # not signalled


# A handler that does nothing: SIGTERM is delivered (no SIGKILL at once for a discarded signal) and survived.
SURVIVES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, lambda n, f: None); print('ready', flush=True); "
                 "time.sleep(60)")


def _slow_identities(devices: int, delay_ms: int = 300) -> Scenario:
    sc = Scenario.h200(devices=devices)
    sc.fault("nvmlDeviceGetUUID", delay_ms=delay_ms)  # reading every GPU's identity: this long per GPU
    return sc


@pytest.fixture
def calls_at_sigkill(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], list[int]]:
    """``watch(fn)``: the list of how many calls to ``fn`` the stub (in this process) had begun when each SIGKILL
    escalation went out, counted from now. A slow reading that held the SIGKILL back shows as every one of its
    calls made first; one cut at the grace period's end, as the few that began before it (each sleeps in the
    stub: load makes none of them sooner). Counted calls, not a duration: the assertion cannot flip under load."""
    from nvmlcheck._proc.targets import TargetSet
    from nvmlcheck.testing import StubProbe, build_stub

    real = TargetSet.escalate
    seen: list[int] = []
    watched: list[tuple[str, int]] = []

    def escalate(self: TargetSet, sig: int = signal.SIGKILL) -> tuple[int, ...]:
        if sig == signal.SIGKILL and watched:
            fn, before = watched[0]
            seen.append(StubProbe(build_stub()).call_count(fn) - before)
        return real(self, sig)

    monkeypatch.setattr(TargetSet, "escalate", escalate)

    def watch(fn: str) -> list[int]:
        watched.append((fn, StubProbe(build_stub()).call_count(fn)))
        return seen

    return watch


def test_a_slow_selection_after_the_signal_does_not_hold_back_the_sigkill(
    gpus: Callable[[Scenario], nc.Session], python_child: Callable[..., subprocess.Popen[bytes]],
    calls_at_sigkill: Callable[[str], list[int]],
) -> None:
    child = python_child(SURVIVES_TERM)
    with gpus(_slow_identities(8)) as session:
        plan = nc.prepare_kill([child.pid])
        plan.send_first(signal.SIGTERM)
        reads = calls_at_sigkill("nvmlDeviceGetUUID")
        # The selection takes eight 0.3 s identity reads (sleeps in the stub); the grace period is 0.3 s. Before,
        # the SIGKILL waited for the first poll, after the whole reading.
        result = plan.wait(session, devices="GPU-00000000-0000-0000-0000-000000000003", grace_s=0.3, timeout=60,
                           predicate=nc.always())
        (record,) = result.pids
        assert [s.name for s in record.signals] == ["SIGTERM", "SIGKILL"]
        assert len(reads) == 1 and reads[0] < 8, reads  # sent with the selection's identities still unread
    assert child.wait(10) == -9


def test_a_selection_cut_by_the_deadline_still_gets_the_grace_periods_sigkill(
    gpus: Callable[[Scenario], nc.Session], python_child: Callable[..., subprocess.Popen[bytes]],
) -> None:
    child = python_child(SURVIVES_TERM)
    with gpus(_slow_identities(8)) as session:
        plan = nc.prepare_kill([child.pid])
        plan.send_first(signal.SIGTERM)
        # Grace 0.3 s, timeout 1 s, no poll before the deadline. Before, the kill timed out with SIGTERM alone sent
        # and the target (which survives it) left running.
        with pytest.raises(nc.KillTimeout) as info:
            plan.wait(session, devices="GPU-00000000-0000-0000-0000-000000000003", grace_s=0.3, timeout=1.0)
        (record,) = info.value.pids
        assert [s.name for s in record.signals] == ["SIGTERM", "SIGKILL"]
    assert child.wait(10) == -9


def test_the_command_lines_check_after_the_signal_does_not_hold_back_the_sigkill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch, calls_at_sigkill: Callable[[str], list[int]],
) -> None:
    import json

    from nvmlcheck import cli
    from nvmlcheck.testing import build_stub

    child = python_child(SURVIVES_TERM)
    # The stub as the host's libnvidia-ml (not --simulate): named PIDs are signalled before NVML opens, and the
    # selection's existence is checked after, reading eight identities of 0.5 s each (4 s), the timeout 3 s.
    # Before, the SIGKILL of the 0.3 s grace period waited for that reading: sent after all eight, past the timeout.
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(build_stub()))
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(_slow_identities(8, 500).write(tmp_path / "s.txt")))
    reads = calls_at_sigkill("nvmlDeviceGetUUID")
    code = cli.main(["--json", "kill", "--devices", "GPU-00000000-0000-0000-0000-000000000003", "--grace", "0.3",
                     "--timeout", "3", str(child.pid)])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 1, (out, err)
    (record,) = doc["pids"]
    assert [s["signal"] for s in record["signals"]] == ["SIGTERM", "SIGKILL"]
    assert len(reads) == 1 and reads[0] < 8, reads  # sent with the identities still unread: the reading was cut
    assert child.wait(10) == -9


def test_the_event_listeners_registration_does_not_hold_back_the_sigkill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], python_child: Callable[..., subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch, calls_at_sigkill: Callable[[str], list[int]],
) -> None:
    import json

    from nvmlcheck import cli
    from nvmlcheck.testing import build_stub

    child = python_child(SURVIVES_TERM)
    sc = Scenario.h200(devices=8)
    sc.fault("nvmlDeviceRegisterEvents", delay_ms=500)  # --events registers every GPU: 4 s (sleeps in the stub)
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(build_stub()))
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "s.txt")))
    registrations = calls_at_sigkill("nvmlDeviceRegisterEvents")
    # Before, the registration ran to --timeout from after the signal, and the 0.3 s grace period's SIGKILL waited
    # for it: sent after all eight registrations, past the timeout.
    code = cli.main(["--json", "kill", "--events", "--grace", "0.3", "--timeout", "3", str(child.pid)])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 0, (out, err)  # the target exited and the GPUs are clean
    (record,) = doc["pids"]
    assert [s["signal"] for s in record["signals"]] == ["SIGTERM", "SIGKILL"]
    assert len(registrations) == 1 and registrations[0] < 8, registrations  # the registration was cut for it
    assert child.wait(10) == -9
