"""``ready`` on the simulated GPU (issue 22): one test per class, through the library and the CLI.

Time is the injected StepClock wherever a bound matters (the stuck bound, a wait's deadline); no assertion depends on
how fast the machine runs. Real processes stand for live holders and are reaped by their fixtures.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import cli, reclaim_model
from nvmlcheck._proc.container import container_of
from nvmlcheck._proc.devfiles import simulated_globs, simulated_stand_ins
from nvmlcheck.cli._ready import exit_code_of
from nvmlcheck.testing import Scenario, StepClock, build_stub
from nvmlcheck.wait import WaitOptions

pytestmark = pytest.mark.stub
GIB = 1 << 30
MODEL = reclaim_model.model_for("580.159.04")
#: A wait's timeout (s) past the stuck bound of 8 GiB held with no holder (the 580 entry's: ~6.4 s). The
#: device-file scan past the bound reads the step clock once per process of this host: 5 s of it is 5000 processes (a
#: busy CI host), not a margin that the host's process count could use up.
PAST_BOUND_S = MODEL.stuck_after_ns(1, 8 * GIB) / 1e9 + 5.0


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def ready_json(capsys: pytest.CaptureFixture[str], path: str, *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = run(capsys, "--simulate", path, "--json", "ready", *argv)
    doc: dict[str, Any] = json.loads(out)
    assert (doc["schema"], doc["version"], doc["exit_code"]) == ("nvmlcheck/ready", 1, code)
    return code, doc


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def steps() -> WaitOptions:
    """A step clock and a fixed 20 ms interval: how many polls fit before a deadline depends on the code alone."""
    clock = StepClock(0.001)
    return WaitOptions(clock=clock.clock, sleep=clock.sleep, policy=0.02)


def test_idle_gpu_is_ready_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--simulate", "h200", "ready")
    assert code == 0
    assert out.splitlines()[0].startswith("GPU 0: ready") and "ready: 1 GPU" in out


def test_live_holder_is_held_naming_pid_name_and_container(
    gpus: Callable[[Scenario], nc.Session], sleeper: subprocess.Popen[bytes]
) -> None:
    sc = Scenario.h200(2)
    sc.add_process(1, sleeper.pid, used_bytes=8 * GIB, bound=True)
    with gpus(sc) as session:
        report = session.ready()
    assert not report.ready and not report.needs_operator
    v0, v1 = report.verdicts
    assert v0.ready and v1.class_ == "held"
    (c,) = v1.culprits
    where = container_of(sleeper.pid)
    assert (c.gpu, c.pid, c.used_bytes, c.class_, c.kind) == (1, sleeper.pid, 8 * GIB, "held", "compute")
    assert c.name is not None and c.name.startswith("python")
    assert c.container == (None if where is None else where.label())
    assert f"held by pid {sleeper.pid} ({c.name})" in v1.line() and "8.0 GiB" in v1.line()
    assert exit_code_of(report) == 1


def test_held_in_the_cli_json_with_structured_culprits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sleeper: subprocess.Popen[bytes]
) -> None:
    sc = Scenario.h200()
    sc.add_process(0, sleeper.pid, used_bytes=4 * GIB, bound=True)
    code, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")))
    assert code == 1 and doc["ready"] is False
    (gpu,) = doc["gpus"]
    assert gpu["class"] == "held" and gpu["culprits"][0]["pid"] == sleeper.pid
    assert doc["holders"][0]["class"] == "held" and doc["holders"][0]["used_bytes"] == 4 * GIB
    assert any(str(sleeper.pid) in line for line in doc["culprits"])


def test_memory_with_no_holder_is_reclaiming_with_the_models_eta(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    with gpus(sc) as session:
        (v,) = session.ready(options=steps()).verdicts
    # the model's time from the first reading, less the few steps of the clock until the verdict
    expected = MODEL.expected_ns(1, 8 * GIB)
    assert v.class_ == "reclaiming" and v.eta_ns is not None and expected - 10_000_000 < v.eta_ns <= expected
    assert "back in ~" in v.line()


def test_memory_falling_while_waiting_is_reclaiming_with_an_eta(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    for n, left in ((40, 6), (80, 4), (120, 2)):  # coming back, never all of it before the deadline
        sc.at_call(n).set_device(0, used_bytes=left * GIB)
    with gpus(sc) as session:
        report = session.ready(timeout=0.5, options=steps())  # 0.5 s of the step clock: within the stuck bound
    (v,) = report.verdicts
    assert v.class_ == "reclaiming" and report.polls > 1
    assert v.used_bytes is not None and v.used_bytes < 8 * GIB  # it fell while the wait watched
    # past the model's ~102 ms, so the ETA is the observed rate extrapolated: what is left at the rate seen so far
    assert v.eta_ns is not None and v.eta_ns > 0 and "back in ~" in v.line()


def test_falling_memory_that_comes_back_is_ready(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    sc.at_call(60).set_device(0, used_bytes=0)
    with gpus(sc) as session:
        report = session.ready(timeout=30, options=steps())
    assert report.ready and report.polls > 1


def test_memory_held_with_no_holder_past_the_bound_is_stuck_exit_5(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 * GIB)
    with gpus(sc) as session:
        report = session.ready(timeout=PAST_BOUND_S, options=steps())  # of the step clock, past the stuck bound
    (v,) = report.verdicts
    assert v.class_ == "stuck" and report.needs_operator and exit_code_of(report) == 5
    assert v.culprits[0].action == "RESET_GPU" and "no holder" in v.culprits[0].reason


def test_pending_remap_is_unhealthy_exit_5_with_the_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200(2)
    sc.set_device(1, remapped_rows=(0, 1, True, False))
    path = str(sc.write(tmp_path / "s.txt"))
    code, doc = ready_json(capsys, path, "--timeout", "30")  # ends at once: waiting cannot help
    assert code == 5 and doc["needs_operator"] is True and doc["polls"] == 1
    g0, g1 = doc["gpus"]
    assert g0["class"] == "ready" and g1["class"] == "unhealthy" and g1["actions"] == ["RESET_GPU"]
    assert g1["culprits"][0]["kind"] == "row-remap-pending"
    code, out, _ = run(capsys, "--simulate", path, "ready")
    assert code == 5 and "GPU 1: unhealthy: a row remapping is pending" in out and "RESET_GPU" in out


def test_short_with_need(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = ready_json(capsys, "h200", "--need", "200GiB")
    assert code == 1 and doc["gpus"][0]["class"] == "short" and doc["need_bytes"] == 200 * GIB
    code, doc = ready_json(capsys, "h200", "--need", "90%")
    assert code == 0 and doc["need_fraction"] == 0.9 and doc["gpus"][0]["need_bytes"] > 0


@pytest.mark.parametrize("need", ["200GiB", "1.0"])
def test_a_need_beyond_the_gpu_ends_the_wait_at_once(capsys: pytest.CaptureFixture[str], need: str) -> None:
    # More than the GPU has with nothing running (its total less the driver's reserve): no wait can help.
    code, doc = ready_json(capsys, "h200", "--need", need, "--timeout", "2")  # without the rule: 2 s of polls
    (g,) = doc["gpus"]
    assert code == 1 and doc["polls"] == 1 and g["class"] == "short" and g["beyond_capacity"] is True
    assert g["culprits"][0]["kind"] == "capacity-limit" and "can never be free" in g["line"]


def test_bad_ready_arguments_are_refused_with_this_calls_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(build_stub()))
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(Scenario.h200().write(tmp_path / "s.txt")))
    bad: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"timeout": -1.0}, ValueError, "timeout must be >= 0"),  # was clipped to 0 and judged: ready
        ({"timeout": float("nan")}, ValueError, "timeout must be >= 0"),
        ({"timeout": "1"}, TypeError, "timeout must be a number"),  # was a bare TypeError from math
        ({"need_fraction": 0}, ValueError, "need_fraction must be in"),
        ({"need_fraction": True}, TypeError, "need_fraction must be a number"),
        ({"need_bytes": 1, "need_fraction": 0.5}, ValueError, "need_bytes or need_fraction, not both"),
        ({"need_bytes": -1}, ValueError, "need_bytes must be >= 0"),
    ]
    for kwargs, error, text in bad:
        with pytest.raises(error, match=text):
            nc.ready(**kwargs)
        with nc.open("nvml") as session, pytest.raises(error, match=text):
            session.ready(**kwargs)
    assert nc.ready(timeout=float("inf"), need_fraction=0.5).ready  # inf: no bound (ready at once here)


def test_a_need_only_todays_use_leaves_unmet_is_waited_for(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=8 << 20)  # clean (within 16 MiB), but 8 MiB short of the need below
    with gpus(sc) as session:
        m = session.snapshot().devices[0].memory
        assert m is not None and m.reserved_bytes is not None
        report = session.ready(need_bytes=m.total_bytes - m.reserved_bytes - 1, timeout=0.2, options=steps())
    (v,) = report.verdicts
    assert v.class_ == "short" and not v.beyond_capacity and report.polls > 1  # it could still come: waited


def test_a_failed_query_is_not_ready_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", 4)  # NVML_ERROR_NO_PERMISSION
    code, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")))
    assert code == 1 and doc["ready"] is False
    (gpu,) = doc["gpus"]
    assert gpu["class"] == "unknown"
    assert any("could not be read" in c["reason"] and "NO_PERMISSION" in c["reason"] for c in gpu["culprits"])


def test_a_fatal_xid_while_waiting_is_unhealthy_exit_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)  # never ready
    sc.at_ms(50).raise_event(0, "xid", xid=79)
    code, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")), "--timeout", "120")
    assert code == 5
    (gpu,) = doc["gpus"]
    assert gpu["class"] == "unhealthy"
    xid = [c for c in gpu["culprits"] if c["kind"] == "xid"]
    assert xid and xid[0]["action"] and "XID 79" in xid[0]["reason"]


def test_wait_timeout_documents_carry_structured_holders(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--simulate", "h200-busy", "--json", "wait", "--timeout", "2")
    assert code == 1
    doc = json.loads(out)
    assert (doc["schema"], doc["version"]) == ("nvmlcheck/wait", 2)
    (h,) = doc["holders"]
    assert (h["gpu"], h["pid"], h["used_bytes"], h["kind"]) == (0, 4123456, 16 * GIB, "compute")
    assert doc["culprits"]  # the lines stay


def test_wait_timeout_document_holders_follow_max_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``holders`` names the GPUs the wait refused, as ``culprits`` does: not GPU 1, clean under ``--max-used``."""
    sc = Scenario.h200(2)
    sc.add_process(0, 4_000_003, used_bytes=4 * GIB)
    sc.set_device(1, used_bytes=512 << 20)
    code, out, _ = run(capsys, "--simulate", str(sc.write(tmp_path / "s.txt")), "--json", "wait", "--timeout", "0",
                       "--max-used", "1GiB")
    doc = json.loads(out)
    assert code == 1 and all(line.startswith("GPU 0") for line in doc["culprits"])
    assert [(h["gpu"], h["pid"]) for h in doc["holders"]] == [(0, 4_000_003)]


def test_library_wait_timeout_has_holders(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_002, used_bytes=2 * GIB)
    with gpus(sc) as session, pytest.raises(nc.WaitTimeout) as info:
        session.wait_until_clean(timeout=1.0, options=steps())
    (h,) = info.value.holders
    assert (h.gpu, h.pid, h.used_bytes) == (0, 4_000_002, 2 * GIB)


def test_cuda_selectors_and_devices(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    code, doc = ready_json(capsys, "h200x8", "--devices", "cuda:0")
    assert code == 0 and [g["index"] for g in doc["gpus"]] == [1]


def test_top_level_ready_opens_and_closes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario.h200()
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "s.txt")))
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(build_stub()))
    report = nc.ready(need_fraction=0.5, backend="nvml")
    assert report.ready and report.polls == 1


@pytest.mark.parametrize(("scenario", "code"), [("idle", 0), ("remap", 5)])
def test_the_smi_backend_judges_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario: str, code: int
) -> None:
    sc = Scenario.h200()
    if scenario == "remap":
        sc.set_device(0, remapped_rows=(0, 1, True, False))
    # nvidia-smi prints [N/A] for the retired pages an H200 does not have: not judged, never a refusal
    got, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")), "--backend", "smi")
    assert got == code and doc["snapshot"]["backend"] == "smi"
    assert doc["gpus"][0]["class"] == ("ready" if code == 0 else "unhealthy")
    assert any("not judged" in note for note in doc["notes"])


def test_a_mig_instance_is_judged_alone(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, total_bytes=70 * GIB)
    sc.add_mig_device(0, 1, total_bytes=70 * GIB)
    sc.add_process(0, 4_000_010, used_bytes=4 * GIB, gi=2, ci=0)  # in instance 1
    with gpus(sc) as session:
        free, busy = (m.uuid for m in session.snapshot().devices[0].mig_devices or ())
        assert free is not None and busy is not None
        (v,) = session.ready([free], need_bytes=10 * GIB).verdicts
        assert v.ready and v.label.startswith("GPU 0 MIG 0") and v.free_bytes == 70 * GIB
        (w,) = session.ready([busy]).verdicts
        assert not w.ready and w.culprits[0].pid == 4_000_010


def test_a_process_on_no_list_with_a_device_file_open_is_held_not_stuck(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The simulator's stand-in for /dev/nvidia0: dev/ beside the scenario the session opens (CI has no NVIDIA device).
    (tmp_path / "dev").mkdir(exist_ok=True)
    dev = tmp_path / "dev" / "nvidia0"
    dev.write_text("")
    child = subprocess.Popen([sys.executable, "-S", "-c", "import sys, time; f = open(sys.argv[1]); "
                              "print('ready', flush=True); time.sleep(60)", str(dev)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        sc = Scenario.h200()
        sc.set_device(0, used_bytes=8 * GIB)  # held, nothing listed: as from another PID namespace's numbering
        stand_ins = simulated_stand_ins(simulated_globs(tmp_path / "scenario.txt"), "this test's simulation")
        with stand_ins, gpus(sc) as session:
            (v,) = session.ready(timeout=PAST_BOUND_S, options=steps()).verdicts  # past the bound: it would be stuck
    finally:
        child.kill()
        child.wait()
    assert v.class_ == "held"
    (c,) = v.culprits
    assert (c.kind, c.pid, c.action) == ("device-file", child.pid, "STOP_HOLDER") and "on no GPU list" in c.reason


def test_a_gpu_lost_when_its_health_is_read_again_is_not_ready(gpus: Callable[[Scenario], nc.Session]) -> None:
    """The health read again before a wait says ready fails on the GPU: it is in that reading's failures, and its
    health is not "not requested" (nothing to say) but lost: unhealthy, never ready."""
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetMemoryInfo_v2", 10, device=0, count=1)  # the first reading cannot judge it: a wait follows
    sc.fault("nvmlDeviceGetRemappedRows", 15, device=0, after=1)  # the first reading's health passes, the next is lost
    with gpus(sc) as session:
        report = session.ready(timeout=5.0, events=False, options=steps())
    (v,) = report.verdicts
    assert not report.ready and report.needs_operator
    assert v.class_ == "unhealthy" and v.actions == ("NODE_REBOOT",) and "lost" in v.line()


@pytest.mark.parametrize("call", [150, 400])
def test_a_selected_mig_instance_destroyed_while_waiting_is_unknown_never_dropped(
    gpus: Callable[[Scenario], nc.Session], call: int
) -> None:
    """Two instances selected; the busy one is destroyed during the wait (a few polls in, by NVML call count). It is
    not dropped from the report (which then called the selection ready), nor does selecting it again by UUID fail
    the call: it is ``unknown``."""
    sc = Scenario.h200()
    sc.set_device(0, mig=True)
    sc.add_mig_device(0, 0, total_bytes=70 * GIB)
    sc.add_mig_device(0, 1, total_bytes=70 * GIB, used_bytes=GIB)  # held, nothing listed: never ready
    sc.at_call(call).remove_mig_device(0, 1)  # the first reading and a few polls (or many) are done by then
    with gpus(sc) as session:
        free, busy = (m.uuid for m in session.snapshot().devices[0].mig_devices or ())
        assert free is not None and busy is not None
        report = session.ready([free, busy], timeout=1.0, events=False, options=steps())
    assert not report.ready and report.polls > 3
    first, gone = report.verdicts
    assert first.ready and first.uuid == free
    assert (gone.uuid, gone.class_, gone.index) == (busy, "unknown", 0)
    assert "not in the reading" in gone.culprits[0].reason


@pytest.mark.parametrize("timeout", [0.0, 1.0])
def test_a_gpu_with_an_impossible_value_is_unknown_waiting_or_not(
    gpus: Callable[[Scenario], nc.Session], tmp_path: Path, capsys: pytest.CaptureFixture[str], timeout: float
) -> None:
    """A process list with an impossible PID (CorruptData, as a struct layout mismatch gives): GPU 1 is unknown,
    GPU 0 judged, whether ready checks once or waits (a wait raised the error, failing the call and the command)."""
    sc = Scenario.h200(2)
    sc.add_process(1, pid=5_000_000, used_bytes=GIB)  # above PID_MAX_LIMIT
    with gpus(sc) as session:
        report = session.ready(timeout=timeout, events=False, options=steps())
    v0, v1 = report.verdicts
    assert v0.ready and v1.class_ == "unknown" and "impossible PID" in v1.line()
    code, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")), "--timeout", str(timeout), "--no-events")
    assert code == 1 and [g["class"] for g in doc["gpus"]] == ["ready", "unknown"]


@pytest.mark.parametrize(("need", "shown"), [("100%", "(100% of 140.4 GiB)"), ("1.0", "(100% of 140.4 GiB)")])
def test_a_fractional_need_is_shown_as_a_percentage(tmp_path: Path, capsys: pytest.CaptureFixture[str], need: str,
                                                    shown: str) -> None:
    # "140.4 GiB needed (1 of 140.4 GiB)": the fraction 1.0 printed as "1", read as one byte or one GPU.
    sc = Scenario.h200()  # idle: short only, as no GPU has all of its memory free
    assert cli.main(["--simulate", str(sc.write(tmp_path / "sc.txt")), "ready", "--need", need]) == 1
    assert shown in capsys.readouterr().out


@pytest.mark.parametrize(
    ("xid", "change", "action"),
    [
        (63, {"remapped_rows": (0, 1, True, False)}, "RESET_GPU"),  # a row marked for remapping: reset to activate
        (154, {"recovery_action": 2}, "NODE_REBOOT"),  # the driver's recovery action changed
    ],
)
def test_a_recorded_xid_that_leaves_the_gpu_unhealthy_ends_the_wait_exit_5(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], xid: int, change: dict[str, Any], action: str
) -> None:
    """XIDs 63 and 154 are not fatal (the table records them), but the health they announce is: the health is read
    again when one comes, and an unhealthy GPU ends the wait at once, as at the start. It was read only before a
    wait that ended ready: a held GPU waited out its timeout and was called held (exit 1)."""
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)  # never ready: only the health can end the wait early
    step = sc.at_ms(50)
    step.set_device(0, **change)
    step.raise_event(0, "xid", xid=xid)
    code, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")), "--timeout", "120")
    assert code == 5 and doc["needs_operator"] is True
    (gpu,) = doc["gpus"]
    assert gpu["class"] == "unhealthy" and gpu["actions"][0] == action
    assert not any(c["kind"] == "xid" for c in gpu["culprits"])  # the cause is the health, not the recorded XID


def test_a_recorded_xid_on_a_healthy_gpu_does_not_stop_the_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    sc.at_ms(50).raise_event(0, "xid", xid=13)  # an application's fault: its health read finds nothing
    sc.at_ms(300).remove_process(0, 4_000_001)
    code, doc = ready_json(capsys, str(sc.write(tmp_path / "s.txt")), "--timeout", "120")
    assert code == 0 and doc["gpus"][0]["class"] == "ready"


def test_gpus_not_listened_to_are_said_on_stderr_as_in_the_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The document's notes named the GPU whose XIDs were not heard; the human output said nothing of it (wait
    --events says it on stderr)."""
    sc = Scenario.h200(2)
    sc.fault("nvmlDeviceRegisterEvents", 4, device=1)  # a container without the capability, on GPU 1 only
    sc.add_process(1, 4_000_001, used_bytes=GIB)  # never ready: the command waits, listening
    path = str(sc.write(tmp_path / "s.txt"))

    def why_not(text: str) -> bool:
        # Either valid answer: GPU 1's registration refused (NO_PERMISSION), or, on a loaded machine where the
        # listener's start did not get that far within the 0.3 s, GPU 1 not registered by the deadline.
        return ("GPU 1" in text and "NO_PERMISSION" in text) or "registration had not finished" in text

    code, out, err = run(capsys, "--simulate", path, "ready", "--timeout", "0.3")
    assert code == 1 and "GPU 1" in out
    assert any(line.startswith("nvmlcheck: events: ") and why_not(line) for line in err.splitlines()), err
    code, doc = ready_json(capsys, path, "--timeout", "0.3")
    assert code == 1 and any(n.startswith("events: ") and why_not(n) for n in doc["notes"]), doc["notes"]


def _health_reads_of_ready_after(tmp_path: Path, event_before: bool) -> int:
    """How many times ``ready`` reads the remapped rows (its health) on a GPU held for 0.3 s, in a session whose
    listener the caller started first, with (or without) an XID heard before ``ready`` began."""
    from nvmlcheck.testing import StubProbe, use_stub

    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=4 * GIB)
    if event_before:
        sc.at_call(1).raise_event(0, "xid", xid=13)
    sc.at_ms(300).remove_process(0, 4_000_001)
    with use_stub(sc, tmp_dir=tmp_path) as stub, nc.open("nvml") as gpus:
        listener = gpus.listen()
        if event_before:
            got, _ = listener.next_events(0, 30.0)
            assert [e.xid for e in got] == [13]
        probe = StubProbe(stub.library_path)
        before = probe.call_count("nvmlDeviceGetRemappedRows")
        assert gpus.ready(timeout=30).ready
        return probe.call_count("nvmlDeviceGetRemappedRows") - before


def test_an_xid_heard_before_ready_began_prompts_no_health_reading(tmp_path: Path) -> None:
    # Its health is in ready's first reading already: it cost one more reading once the wait began.
    assert _health_reads_of_ready_after(tmp_path / "a", True) == _health_reads_of_ready_after(tmp_path / "b", False)
