"""``nvmlcheck.slurm`` without a cluster: the job from Slurm's environment, the drain reason, scontrol's node line,
whose process is the job's, and ``nvmlcheck slurm …`` on the simulated GPUs with a stand-in scontrol that records
what it is asked (what slurmd would see: exit code, stderr, and the commands)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import slurm
from nvmlcheck.cli import main
from nvmlcheck.holders import Holder
from nvmlcheck.testing import Scenario, StubSession
from nvmlcheck.verdict import Culprit

GIB = 1 << 30
#: The kernel's highest pid_max (PID_MAX_LIMIT): every PID is below pid_max, so no process has this one, and a
#: ``bound`` entry with it is gone from the first call (an exited child's PID is free only until the PID counter
#: wraps, and pid_max is 32768 on some hosts).
IMPOSSIBLE_PID = 4_194_304


# --- the job from the environment -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "gpus"), [
    ("0", ("0",)), ("0,1,3", ("0", "1", "3")), ("0-2,5", ("0", "1", "2", "5")), ("3,3,1", ("3", "1")),
    ("", ()), ("NoDevFiles", ()), (" 07 ", ("7",)),
    ("GPU-acdc9db5-97f7-57e3-53d2-3061aececeec,1", ("GPU-acdc9db5-97f7-57e3-53d2-3061aececeec", "1")),
    # GRES as scontrol show job -d prints it: its IDX lists (a comma inside one is not an item of the list).
    ("gpu:h200:2(IDX:0,2)", ("0", "2")), ("gpu(IDX:0-3,5)", ("0", "1", "2", "3", "5")),
    ("gpu:a100:1(IDX:1),gpu:h200:2(IDX:4-5)", ("1", "4", "5")), ("gpu:h200:0(IDX:N/A)", ()),
    # A MIG instance as drivers before R470 name it.
    ("MIG-GPU-acdc9db5-97f7-57e3-53d2-3061aececeec/1/0", ("MIG-GPU-acdc9db5-97f7-57e3-53d2-3061aececeec/1/0",)),
])
def test_gpu_lists_as_slurm_writes_them(text: str, gpus: tuple[str, ...]) -> None:
    assert slurm.parse_gpu_list(text, "SLURM_JOB_GPUS") == gpus


@pytest.mark.parametrize("text", ["gpu0", "1,,2", "3-1", "-1", "0;1", "1 2", "gpu:h200:2(IDX:0,2", "x(IDX:0)",
                                  "gpu(IDX:0-300)", "MIG-GPU-x/1", "GPU-x/1/0"])
def test_a_malformed_gpu_list_names_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=r"\$CUDA_VISIBLE_DEVICES="):
        slurm.parse_gpu_list(text, "CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize(("text", "why"), [
    ("0-1000000", "GPU '1000000' is beyond /dev/nvidia253"),  # 0-100000000 once built 10**8 IDs: 4.8 GB
    ("0-254", "GPU '254' is beyond /dev/nvidia253"),
    ("254", "GPU '254' is beyond /dev/nvidia253"),
    ("0,1," + "9" * 100_000, "is beyond /dev/nvidia253"),  # never converted: int() refuses > 4300 digits
    (",".join(["0"] * 255), "more than 254 GPUs"),
])
def test_an_id_or_list_beyond_the_minor_numbers_is_refused_before_it_is_built(text: str, why: str) -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"^\$SLURM_JOB_GPUS=") as raised:
            slurm.parse_gpu_list(text, "SLURM_JOB_GPUS")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert why in str(raised.value) and len(str(raised.value)) < 300
    assert peak < 4 * len(text) + (1 << 20)  # nothing in proportion to the range: only the text, split


def test_the_highest_minor_number_and_a_full_list_are_accepted() -> None:
    assert slurm.parse_gpu_list("253", "SLURM_JOB_GPUS") == ("253",)
    assert slurm.parse_gpu_list("0-253", "SLURM_JOB_GPUS") == tuple(map(str, range(254)))
    assert slurm.parse_gpu_list(",".join(["0"] * 254), "SLURM_JOB_GPUS") == ("0",)


def test_the_job_as_an_epilog_sees_it() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_UID": "1000", "SLURM_JOB_USER": "ana", "SLURMD_NODENAME": "gpu07",
           "SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}
    job = slurm.job_from_env(env)
    assert job == slurm.SlurmJob("42", 1000, "ana", "gpu07", ("2", "3"), "SLURM_JOB_GPUS")
    # Slurm's GPU IDs win over CUDA_VISIBLE_DEVICES, which is the fallback.
    del env["SLURM_JOB_GPUS"]
    assert slurm.job_from_env(env).gpus == ("0", "1")
    assert slurm.job_from_env(env).gpus_from == "CUDA_VISIBLE_DEVICES"
    # The HealthCheckProgram's environment: no job at all.
    assert slurm.job_from_env({"SLURMD_NODENAME": "gpu07"}) == slurm.SlurmJob(None, None, None, "gpu07", (), None)


def test_uuids_that_are_not_as_many_as_slurms_gpu_ids_are_refused() -> None:
    # CUDA_VISIBLE_DEVICES's UUIDs replaced SLURM_JOB_GPUS whatever their number: with one UUID for IDs 0 and 1, GPU
    # 1 was never judged, and a holder on it passed the gate.
    uuid = "GPU-acdc9db5-97f7-57e3-53d2-3061aececeec"
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": uuid}
    with pytest.raises(ValueError, match=r"names 2 GPU\(s\) and \$CUDA_VISIBLE_DEVICES='GPU-[^']*' 1 UUID\(s\)"):
        slurm.job_from_env(env)
    other = uuid.replace("GPU-a", "GPU-b")
    assert slurm.job_from_env({**env, "CUDA_VISIBLE_DEVICES": f"{uuid},{other}"}).gpus == (uuid, other)


@pytest.mark.parametrize(("name", "value"), [("SLURM_JOB_UID", "root"), ("SLURM_JOB_ID", "42a")])
def test_a_malformed_job_variable_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        slurm.job_from_env({name: value})


def test_the_node_name() -> None:
    assert slurm.node_name("n1", {"SLURMD_NODENAME": "n2"}) == "n1"
    assert slurm.node_name(None, {"SLURMD_NODENAME": "n2"}) == "n2"
    assert slurm.node_name(None, {}) and "." not in slurm.node_name(None, {})
    # An empty --node (a wrapper's unset variable: --node "$NODE") was taken as none given: the node of
    # $SLURMD_NODENAME or the host name was drained instead of the usage error.
    with pytest.raises(ValueError, match=r"--node='' is not one node's name \(empty\)"):
        slurm.node_name("", {"SLURMD_NODENAME": "n2"})


@pytest.mark.parametrize(("name", "why"), [("n1,n2", "','"), ("gpu[01-64]", "'[]'"), ("-h", "starts with '-'"),
                                         ("n1 State=RESUME", "' ='"), ("n1\nn2", "'\\n'"), ("n\x1b", "'\\x1b'"),
                                         ("ALL", "every node"), ("all", "every node")])
def test_what_is_not_one_nodes_name_is_refused(name: str, why: str) -> None:
    # scontrol reads NodeName= as a hostlist expression: "n1,n2" drained (or resumed) two nodes.
    with pytest.raises(ValueError, match=r"^\$SLURMD_NODENAME=.* is not one node's name") as raised:
        slurm.node_name(None, {"SLURMD_NODENAME": name})
    assert why in str(raised.value)
    with pytest.raises(ValueError, match=r"^--node="):
        slurm.node_name(name, {})
    assert slurm.check_node_name("gpu-01.rack_2") == "gpu-01.rack_2"


# --- the drain reason ----------------------------------------------------------------------------------------------


def held(gpu: int, pid: int) -> slurm.Cause:
    return slurm.Cause("held", f"GPU {gpu} held by pid {pid} (python3) 8.0 GiB after 30 s", gpu=gpu, pid=pid)


def test_the_reason_names_the_cause_after_the_prefix() -> None:
    assert slurm.drain_reason([held(3, 4123)]) == "nvmlcheck: GPU 3 held by pid 4123 (python3) 8.0 GiB after 30 s"


def test_an_unhealthy_gpu_comes_first_and_what_does_not_fit_is_counted() -> None:
    remap = slurm.Cause("unhealthy", "GPU 1: row remap pending, reset needed", gpu=1, action="RESET_GPU")
    reason = slurm.drain_reason([held(n, 4_000_000 + n) for n in range(8)] + [remap])
    assert reason.startswith("nvmlcheck: GPU 1: row remap pending, reset needed; GPU 0 held by pid 4000000")
    assert len(reason) <= slurm.MAX_REASON_CHARS
    shown = reason.count("held by")
    assert reason.endswith(f" (+{8 - shown} more)")


def test_a_reason_is_one_printable_line_even_from_a_hostile_process_name() -> None:
    cause = slurm.Cause("held", "GPU 0 held by pid 7 (evil\nState=RESUME\x1b[2J) 1.0 GiB after 1 s")
    reason = slurm.drain_reason([cause])
    assert "\n" not in reason and "\x1b" not in reason and reason.isprintable()
    long = slurm.Cause("stuck", "x" * 500)
    assert len(slurm.drain_reason([long])) <= slurm.MAX_REASON_CHARS
    with pytest.raises(ValueError):
        slurm.drain_reason([])


# --- scontrol's node line --------------------------------------------------------------------------------------------


def test_the_node_line_of_scontrol() -> None:
    line = ("NodeName=gpu07 Arch=x86_64 CoresPerSocket=1 State=IDLE+DRAIN ThreadsPerCore=1 Partitions=gpu "
            "Reason=nvmlcheck: GPU 0 held by pid 4123 (python3) 8.0 GiB after 30 s [root@2026-12-01T14:08:18]")
    state = slurm.parse_node_line(line)
    assert state.state == "IDLE+DRAIN" and state.base == "IDLE" and state.flags == {"DRAIN"}
    assert state.reason == "nvmlcheck: GPU 0 held by pid 4123 (python3) 8.0 GiB after 30 s"
    assert state.drained and state.ours
    other = slurm.parse_node_line("NodeName=gpu07 State=MIXED+DRAIN Reason=Kill task failed [slurm@2026-12-01T1]")
    assert other.drained and not other.ours and other.base == "MIXED"
    idle = slurm.parse_node_line("NodeName=gpu07 State=IDLE ThreadsPerCore=1")
    assert idle.reason is None and not idle.drained and not idle.ours
    with pytest.raises(ValueError):
        slurm.parse_node_line("slurm_load_node error: Invalid node name specified")


# --- whose process ---------------------------------------------------------------------------------------------------


@pytest.fixture
def children() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(**env: str) -> subprocess.Popen[bytes]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time; print(flush=True); time.sleep(60)"],
                                 env={**base, **env}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        started.append(child)
        # Popen returns once the exec began, before the kernel has set the new environment up (a vfork parent is
        # released at exec_mmap): /proc/PID/environ may still read empty. The child's first line says it runs.
        assert child.stdout is not None and child.stdout.readline() == b"\n"
        return child

    yield start
    for child in started:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def as_holder(pid: int, **fields: Any) -> Holder:
    from nvmlcheck.holders import describe_process

    h = describe_process(pid, found_by=frozenset({"nvml"}))
    return Holder(**{**{f: getattr(h, f) for f in Holder.__dataclass_fields__}, **fields})


def test_the_jobs_processes_by_environment_and_user(children: Callable[..., subprocess.Popen[bytes]]) -> None:
    ours = children(SLURM_JOB_ID="42")
    other_job = children(SLURM_JOB_ID="41")
    no_job = children()
    job = slurm.SlurmJob("42", os.getuid(), None, None, ("0",), "SLURM_JOB_GPUS")
    holders = [as_holder(c.pid) for c in (ours, other_job, no_job)]
    mine, others = slurm.job_processes(holders, job)
    assert [h.pid for h, _ in mine] == [ours.pid]
    assert "its environment names the job" in mine[0][1]
    assert {h.pid for h, _ in others} == {other_job.pid, no_job.pid}
    assert all("not job 42's process" in why for _, why in others)
    # Another user's process is not the job's, whatever its environment says (a user cannot name another's job).
    stranger = slurm.SlurmJob("42", os.getuid() + 1, None, None, ("0",), "SLURM_JOB_GPUS")
    assert slurm.job_processes(holders, stranger)[0] == ()


def test_never_this_process_an_ancestor_a_daemon_a_zombie_or_without_a_job_id(
        children: Callable[..., subprocess.Popen[bytes]]) -> None:
    ours = children(SLURM_JOB_ID="42")
    job = slurm.SlurmJob("42", os.getuid(), None, None, ("0",), "SLURM_JOB_GPUS")
    cases = {
        "this process": as_holder(ours.pid, relation="self"),
        "an ancestor": as_holder(ours.pid, relation="ancestor"),
        "a daemon": as_holder(ours.pid, is_daemon=True, name="nvidia-persistenced"),
        "a zombie": as_holder(ours.pid, state="zombie"),
        "no process with this PID here": as_holder(ours.pid, start_ticks=None),
    }
    for why, h in cases.items():
        mine, others = slurm.job_processes([h], job)
        assert mine == () and why in others[0][1], (why, others)
    unknown = slurm.SlurmJob(None, os.getuid(), None, None, ("0",), "CUDA_VISIBLE_DEVICES")
    assert slurm.job_processes([as_holder(ours.pid)], unknown)[1][0][1].startswith("the job ID is unknown")


def test_the_cgroup_decides_before_the_environment(children: Callable[..., subprocess.Popen[bytes]],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck._proc import container

    in_job = children()
    forged = children(SLURM_JOB_ID="42")  # says job 42, but lives in job 43's cgroup
    stepd = children(SLURM_JOB_ID="42")
    where = {
        in_job.pid: container.Container("slurm", "42", "/slurm/uid_0/job_42/step_0"),
        forged.pid: container.Container("slurm", "43", "/slurm/uid_0/job_43/step_0"),
        stepd.pid: container.Container("slurm", "42", "/system.slice/slurmstepd.scope/job_42/step_0/slurm",
                                       monitor=True),
    }
    monkeypatch.setattr(container, "container_of", lambda pid, proc="/proc": where.get(int(pid)))
    job = slurm.SlurmJob("42", os.getuid(), None, None, ("0",), "SLURM_JOB_GPUS")
    mine, others = slurm.job_processes([as_holder(c.pid) for c in (in_job, forged, stepd)], job)
    assert [(h.pid, why) for h, why in mine] == [(in_job.pid, "in job 42's cgroup")]
    reasons = {h.pid: why for h, why in others}
    assert reasons == {forged.pid: "in another job's cgroup (job 43)", stepd.pid: "Slurm's step daemon of job 42"}


# --- the gates on the simulated GPUs ---------------------------------------------------------------------------------


@pytest.fixture
def nvml_scenario() -> Scenario:
    return Scenario.h200(devices=2)


def job(gpus: str = "0", job_id: str = "42") -> slurm.SlurmJob:
    return slurm.job_from_env({"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": gpus})


def assert_waited_for_the_memory(readiness: dict[str, Any]) -> None:
    """The epilog judged the memory by polls, not after a fixed time: it saw the GPU held, then clean for the stable
    polls ready asks (at least 3 polls); or, where it came late, clean from its first poll (2 polls, none dirty).

    Which of the two depends on the machine: the stub gives a bound worker's memory back ``release_ms`` after a call
    first finds the worker gone, and the epilog's first such call comes before its wait (its reading of the
    holders, or its kill's wait for the exit). Whether the wait's first poll comes within ``release_ms`` of it is
    up to the scheduler (on 2 loaded cores it need not). The wait's seeing the memory held is asserted where the
    first reading is the wait's own: test_a_prolog_waits_for_the_memory_of_an_exited_holder and the lab's
    test_a_job_whose_gpu_is_still_reclaiming_waits_in_the_prolog_then_runs."""
    if readiness["last_dirty_ns"] is not None:
        assert readiness["dirty_polls"] >= 1 and readiness["polls"] >= 3, readiness
        assert readiness["first_clean_ns"] is not None and readiness["first_clean_ns"] > readiness["last_dirty_ns"]
    else:
        assert readiness["dirty_polls"] == 0 and readiness["polls"] >= 2, readiness


def test_the_epilog_kills_the_jobs_leftover_and_waits_for_its_memory(
        nvml_stub: StubSession, nvml_bound_process: Callable[..., subprocess.Popen[bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    leftover = nvml_bound_process(0, 8 * GIB, list_ms=20, release_ms=150)
    monkeypatch.delenv("SLURM_JOB_ID")
    elsewhere = nvml_bound_process(1, 4 * GIB)  # on a GPU the job did not have: not looked at
    with nc.open("nvml") as gpus:
        result = slurm.epilog(gpus, job("0"), timeout_s=10)
    assert result.ready and result.devices == (0,) and result.causes == ()
    assert [t.pid for t in result.killed] == [leftover.pid]
    assert leftover.wait(5) == -signal.SIGTERM
    assert elsewhere.poll() is None
    assert result.readiness is not None
    assert_waited_for_the_memory(result.readiness.to_json())


def test_a_prolog_waits_for_the_memory_of_an_exited_holder(nvml_stub: StubSession, nvml_scenario: Scenario) -> None:
    # The wait's own first poll is the first call to find the holder gone (no such PID can exist), and the stub
    # gives its memory back release_ms after that call: whatever the load, the wait sees it held, then back.
    nvml_scenario.add_process(0, IMPOSSIBLE_PID, used_bytes=8 * GIB, bound=True, list_ms=100, release_ms=500)
    nvml_scenario.write(nvml_stub.scenario_path)
    with nc.open("nvml") as gpus:
        result = slurm.prolog(gpus, job("0"), timeout_s=30)
    assert result.ready and result.readiness is not None, result.causes
    readiness = result.readiness
    assert readiness.dirty_polls >= 1 and readiness.last_dirty_ns is not None and readiness.polls >= 3, readiness
    assert readiness.first_clean_ns is not None and readiness.first_clean_ns > readiness.last_dirty_ns


def test_a_dry_run_epilog_signals_nothing_and_says_what_it_would_kill(
        nvml_stub: StubSession, nvml_bound_process: Callable[..., subprocess.Popen[bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    from nvmlcheck.testing import StepClock

    leftover = nvml_bound_process(0, 8 * GIB)
    # A StepClock, not 0.3 s of the machine's: on a loaded machine the setup (NVML, the holders' scan) could use the
    # whole budget, and the wait's timeout then named no holder (or the cut scan signalled nothing to list).
    steps = StepClock(0.01)
    with nc.open("nvml") as gpus:
        result = slurm.epilog(gpus, job("0"), timeout_s=1.0, kill=False, clock=steps.clock, sleep=steps.sleep)
    assert leftover.poll() is None and result.killed == ()
    assert [pid for pid, _, _ in result.would_kill] == [leftover.pid]
    assert not result.ready
    assert [(c.kind, c.pid, c.used_bytes) for c in result.causes] == [("held", leftover.pid, 8 * GIB)]


def test_a_pending_row_remap_is_reported_at_once_without_waiting(nvml_stub: StubSession,
                                                                 nvml_scenario: Scenario) -> None:
    nvml_scenario.set_device(1, remapped_rows=(0, 1, True, False))
    nvml_scenario.write(nvml_stub.scenario_path)
    with nc.open("nvml") as gpus:
        result = slurm.prolog(gpus, job("1"), timeout_s=30)
        healthy = slurm.prolog(gpus, job("0"), timeout_s=30)
    # One reading, no wait: the health cause ends it (waiting cannot help).
    assert not result.ready and result.readiness is not None and result.readiness.polls == 1
    assert result.readiness.dirty_polls == 0
    assert [(c.kind, c.text, c.action) for c in result.causes] == [
        ("unhealthy", "GPU 1: row remap pending, reset needed", "RESET_GPU")]
    assert healthy.ready


# --- Slurm's GPU IDs are minor numbers ----------------------------------------------------------------------------


def driver_list(directory: Path, devices: tuple[nc.DeviceState, ...], *, uuids: bool = True) -> str:
    """``/proc/driver/nvidia/gpus`` as the driver writes it, for ``devices`` (their UUIDs, bus ids and minors)."""
    for d in devices:
        assert d.pci_bus_id is not None and d.minor_number is not None
        bus = d.pci_bus_id[4:].lower()  # 00000000:18:00.0 -> 0000:18:00.0
        (directory / bus).mkdir(parents=True)
        (directory / bus / "information").write_text(
            "Model: \t\t NVIDIA H200\nIRQ:   \t\t 151\n"
            + (f"GPU UUID: \t {d.uuid}\n" if uuids else "GPU UUID: \t ??\n")
            + f"Bus Type: \t PCIe\nBus Location: \t {bus}\nDevice Minor: \t {d.minor_number}\n")
    return str(directory)


@pytest.mark.parametrize("uuids", [True, False], ids=["by-uuid", "by-bus-id"])
def test_slurms_gpu_ids_are_minor_numbers_on_both_backends(
        nvml_stub: StubSession, nvml_scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        uuids: bool) -> None:
    from nvmlcheck.backends import _driver_procfs
    from nvmlcheck.testing import stub_source_dir

    # As on some hosts (AMD EPYC boards among them): /dev/nvidia0 is NVML's GPU 1, and /dev/nvidia1 its GPU 0.
    nvml_scenario.set_device(0, minor=1)
    nvml_scenario.set_device(1, minor=0)
    nvml_scenario.write(nvml_stub.scenario_path)
    with nc.open("nvml") as gpus:
        devices = gpus.devices()
        assert slurm.job_gpu_indices(gpus, ("0",)) == ((1,), ())
        assert slurm.job_gpu_indices(gpus, ("1", "0")) == ((0, 1), ())
        assert slurm.job_gpu_indices(gpus, (devices[1].uuid,)) == ((1,), ())
    # nvidia-smi prints no minor number: the driver's own list in procfs gives it.
    monkeypatch.setattr(_driver_procfs, "GPUS_DIR", driver_list(tmp_path / "gpus", devices, uuids=uuids))
    with nc.open("smi", smi_command=[sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py")]) as smi:
        assert [d.minor_number for d in smi.devices()] == [1, 0]
        assert slurm.job_gpu_indices(smi, ("0",)) == ((1,), ())
    # Without that list nothing tells which GPU is /dev/nvidia0: a cause, never a guess.
    monkeypatch.setattr(_driver_procfs, "GPUS_DIR", str(tmp_path / "absent"))
    with nc.open("smi", smi_command=[sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py")]) as smi:
        d = smi.devices()[0]
        assert d.minor_number is None and "absent" in (d.why_unknown("minor_number") or "")
        indices, causes = slurm.job_gpu_indices(smi, ("0",))
    assert indices == () and [c.kind for c in causes] == ["unknown"]
    assert causes[0].text.startswith("which GPU is the job's GPU 0 (/dev/nvidia0) cannot be told: no minor number ")


def swapped(tmp_path: Path) -> Path:
    """NVML's GPU 1 is ``/dev/nvidia0`` and holds 8 GiB; NVML's GPU 0 is ``/dev/nvidia1`` and idle."""
    sc = Scenario.h200(devices=2)
    sc.set_device(0, minor=1)
    sc.set_device(1, minor=0)
    sc.add_process(1, 4_123_456, used_bytes=8 * GIB)
    return sc.write(tmp_path / "swapped.txt")


@pytest.mark.parametrize("command", ["prolog", "epilog"])
def test_the_gate_judges_the_gpu_slurm_gave_the_job(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
        capsys: pytest.CaptureFixture[str], command: str) -> None:
    scenario = swapped(tmp_path)
    code, doc, _ = run(scontrol, scenario, command, "--no-drain", capsys=capsys)  # SLURM_JOB_GPUS=0
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [1]
    assert [c["gpu"] for c in doc["causes"]] == [1]
    monkeypatch.setenv("SLURM_JOB_GPUS", "1")
    code, doc, _ = run(scontrol, scenario, command, "--no-drain", capsys=capsys)
    assert code == 0 and isinstance(doc, dict) and doc["devices"] == [0] and doc["job"]["gpus"] == ["1"]
    # --devices names NVML's indices, as everywhere else.
    code, doc, _ = run(scontrol, scenario, command, "--no-drain", "--devices", "1", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [1]


def test_a_job_gpu_that_is_no_gpu_here_drains_the_node(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_JOB_GPUS", "1,5")
    code, doc, err = run(scontrol, swapped(tmp_path), "prolog", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [0]  # /dev/nvidia1 is judged: it is ready
    assert [(c["kind"], c["text"]) for c in doc["causes"]] == [
        ("unknown", "the job's GPU 5 (/dev/nvidia5) is none of this host's GPUs (minor numbers 0, 1)")]
    assert scontrol.updates() == [["update", "NodeName=n1", "State=DRAIN", f"Reason={doc['reason']}"]]
    monkeypatch.setenv("SLURM_JOB_GPUS", "5")
    code, doc, err = run(scontrol, swapped(tmp_path), "epilog", "--no-drain", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [] and doc["killed"] == []
    assert err.startswith("nvmlcheck slurm epilog: the job's GPU 5 (/dev/nvidia5) is none of this host's GPUs")


def mig_shared(tmp_path: Path) -> Path:
    """GPU 0 in MIG mode with two instances; another job's process (exited, its 8 GiB coming back) in instance 1."""
    sc = Scenario.h200(devices=1)
    sc.set_device(0, mig=True)
    for index in (0, 1):
        sc.add_mig_device(0, index, total_bytes=20 * GIB)
    sc.add_process(0, 4_123_456, used_bytes=8 * GIB, gi=2, ci=0)  # instance 1: GI 2
    return sc.write(tmp_path / "mig.txt")


MIG_0, MIG_1 = (f"MIG-00000000-0000-0000-0000-00000000000{i}" for i in (0, 1))


@pytest.mark.parametrize("command", ["prolog", "epilog"])
def test_a_mig_instance_is_judged_alone_not_with_its_gpus_other_instances(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
        capsys: pytest.CaptureFixture[str], command: str) -> None:
    # The job's MIG UUID was resolved to its GPU's index and the whole GPU judged: another job's process in another
    # instance made every prolog and epilog on a shared MIG GPU "not ready", and drained the node.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_0)
    code, doc, _ = run(scontrol, mig_shared(tmp_path), command, "--no-drain", capsys=capsys)
    assert isinstance(doc, dict) and doc["job"]["gpus"] == [MIG_0] and doc["devices"] == [0]
    assert code == 0 and doc["ready"] is True and doc["causes"] == [], doc["causes"]
    # The instance that holds the memory is still judged so.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", MIG_1)
    code, doc, _ = run(scontrol, mig_shared(tmp_path), command, "--no-drain", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["ready"] is False
    assert [(c["gpu"], c["used_bytes"]) for c in doc["causes"]] == [(0, 8 * GIB)], doc["causes"]
    # --devices names an instance the same way; its GPU's index names the whole GPU.
    for devices, ready in ((MIG_0, True), ("0", False)):
        code, doc, _ = run(scontrol, mig_shared(tmp_path), command, "--no-drain", "--devices", devices,
                           capsys=capsys)
        assert isinstance(doc, dict) and doc["ready"] is ready and code == (0 if ready else 1), (devices, doc)


def same_minor(tmp_path: Path) -> Path:
    """NVML's GPUs 0 and 1 both report minor number 0 (a reading is wrong); GPU 0 holds 8 GiB, GPU 1 is idle."""
    sc = Scenario.h200(devices=3)
    for index in (0, 1):
        sc.set_device(index, minor=0)
    sc.add_process(0, 4_123_456, used_bytes=8 * GIB)
    return sc.write(tmp_path / "same-minor.txt")


def test_an_id_that_two_gpus_minor_numbers_match_cannot_be_told(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # The last GPU with minor 0 (idle) once won: the gate said ready, and GPU 0 (8 GiB held) was never judged.
    code, doc, _ = run(scontrol, same_minor(tmp_path), "prolog", "--no-drain", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [] and doc["ready"] is False
    assert [(c["kind"], c["text"]) for c in doc["causes"]] == [
        ("unknown", "which GPU is the job's GPU 0 (/dev/nvidia0) cannot be told: GPUs 0 and 1 both report minor "
                    "number 0")]
    # An ID that one GPU alone matches is still judged (GPU 2 is /dev/nvidia2).
    monkeypatch.setenv("SLURM_JOB_GPUS", "2")
    code, doc, _ = run(scontrol, same_minor(tmp_path), "prolog", "--no-drain", capsys=capsys)
    assert code == 0 and isinstance(doc, dict) and doc["devices"] == [2]


def test_a_gpu_whose_device_file_is_not_its_index_is_named_by_both(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # NVML's GPU 0 is /dev/nvidia1 (Slurm's GPU 1) and holds 8 GiB: "GPU 0" alone sent operators to /dev/nvidia0.
    sc = Scenario.h200(devices=2)
    sc.set_device(0, minor=1)
    sc.set_device(1, minor=0, remapped_rows=(0, 1, True, False))
    sc.add_process(0, 4_123_456, used_bytes=8 * GIB)
    scenario = sc.write(tmp_path / "swap.txt")
    monkeypatch.setenv("SLURM_JOB_GPUS", "1")
    code, doc, err = run(scontrol, scenario, "epilog", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [0]
    assert doc["reason"].startswith("nvmlcheck: GPU 0 (/dev/nvidia1): 8.0 GiB of exited pid 4123456 still coming back")
    assert [c["gpu"] for c in doc["causes"]] == [0]  # the field stays NVML's index
    assert scontrol.updates() == [["update", "NodeName=n1", "State=DRAIN", f"Reason={doc['reason']}"]]
    assert err.startswith("nvmlcheck slurm epilog: GPU 0 (/dev/nvidia1): ")
    code, doc, _ = run(scontrol, scenario, "health", "--no-drain", capsys=capsys)
    assert isinstance(doc, dict) and doc["reason"] == "nvmlcheck: GPU 1 (/dev/nvidia0): row remap pending, reset needed"


def test_gpu_labels_name_the_device_file_only_where_it_is_not_the_index() -> None:
    assert slurm.gpu_label(0) == slurm.gpu_label(0, {0: 0}) == slurm.gpu_label(0, {1: 0}) == "GPU 0"
    assert slurm.gpu_label(0, {0: 1}) == "GPU 0 (/dev/nvidia1)"
    culprit = Culprit(3, "held", "compute", "…", pid=4123, name="python3", used_bytes=8 * GIB)
    cause = slurm.cause_of(culprit, after_ns=30_000_000_000, minors={3: 5})
    assert cause.text == "GPU 3 (/dev/nvidia5) held by pid 4123 (python3) 8.0 GiB after 30 s" and cause.gpu == 3
    assert slurm.cause_of(culprit, after_ns=30_000_000_000, minors={3: 3}).text.startswith("GPU 3 held by ")
    many = [slurm.cause_of(Culprit(i, "held", "compute", "…", pid=4_000_000 + i, name="python3", used_bytes=GIB),
                           after_ns=30_000_000_000, minors={i: 7 - i}) for i in range(8)]
    assert len(slurm.drain_reason(many)) <= slurm.MAX_REASON_CHARS


# --- the command, as slurmd runs it ---------------------------------------------------------------------------------


class FakeScontrol:
    """An executable that records each argv and answers ``-o show node`` with :attr:`line`. A shell script: it
    starts in a millisecond even on a loaded machine, inside the command's scontrol reserve (20 % of --timeout)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "scontrol"
        self.log = directory / "scontrol.log"
        self.state = directory / "node.txt"
        self.line = "NodeName=n1 State=IDLE ThreadsPerCore=1"
        self.path.write_text(
            "#!/bin/sh\n"
            f"printf '%s\\037' \"$@\" >> {self.log}; echo >> {self.log}\n"
            f'if [ "$1" = -o ]; then cat {self.state}; fi\n',
            encoding="utf-8")
        self.path.chmod(0o755)

    def set(self, line: str) -> None:
        self.line = line

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split("\x1f")[:-1] for line in self.log.read_text().splitlines()]

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls() if c[:1] == ["update"]]


@pytest.fixture
def scontrol(tmp_path: Path) -> FakeScontrol:
    return FakeScontrol(tmp_path)


def run(scontrol: FakeScontrol, scenario: Path, command: str, *args: str, json_out: bool = True,
        timeout: str = "1", capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | str, str]:
    """``nvmlcheck --simulate SCENARIO slurm COMMAND … --timeout 1``: long enough for every answer that does not
    wait for memory (the stub answers at once), short where the GPU stays held."""
    scontrol.state.write_text(scontrol.line)
    argv = ["--simulate", str(scenario), "slurm", command, "--scontrol", str(scontrol.path), "--node", "n1",
            "--timeout", timeout, *args] + (["--json"] if json_out else [])
    code = main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if json_out else out), err


@pytest.fixture
def slurm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SLURM"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_UID", str(os.getuid()))
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")


def busy(tmp_path: Path) -> Path:
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_123_456, used_bytes=8 * GIB)  # no such local process: nobody nvmlcheck can kill
    return sc.write(tmp_path / "busy.txt")


def remapped(tmp_path: Path) -> Path:
    """GPU 0 needs a reset (a row remap pending): a gate on it is not ready at once, without waiting."""
    sc = Scenario.h200(devices=2)
    sc.set_device(0, remapped_rows=(0, 1, True, False))
    return sc.write(tmp_path / "remapped.txt")


def test_a_not_ready_epilog_drains_with_the_cause_and_exits_1(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --timeout 3: the GPU stays held, so the wait takes all but scontrol's reserve (20 %), in which the node's state
    # is read and the drain run: 0.2 s of --timeout 1 was two shell starts on a loaded machine, and a cut drain
    # failed the test.
    code, doc, err = run(scontrol, busy(tmp_path), "epilog", timeout="3", capsys=capsys)
    assert code == 1 and isinstance(doc, dict)
    reason = doc["reason"]
    # No local process has that PID: ready calls it an exited holder whose memory is coming back (for now).
    assert reason.startswith("nvmlcheck: GPU 0: 8.0 GiB of exited pid 4123456 still coming back after ")
    assert scontrol.updates() == [["update", "NodeName=n1", "State=DRAIN", f"Reason={reason}"]]
    assert err == f"nvmlcheck slurm epilog: {reason.removeprefix('nvmlcheck: ')}\n"  # one line, for slurmd's log
    assert doc["schema"] == "nvmlcheck/slurm" and doc["exit_code"] == 1 and doc["job"]["id"] == "42"


def test_dry_run_prints_the_command_and_runs_none(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(scontrol, busy(tmp_path), "epilog", "--dry-run", json_out=False, capsys=capsys)
    assert code == 1 and scontrol.updates() == []
    assert isinstance(out, str)
    assert out.startswith(f"{scontrol.path} update NodeName=n1 State=DRAIN 'Reason=nvmlcheck: GPU 0: 8.0 GiB of ")


def test_no_drain_only_exits_1(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(scontrol, busy(tmp_path), "prolog", "--no-drain", capsys=capsys)
    assert code == 1 and scontrol.calls() == []


def test_someone_elses_drain_reason_is_kept(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scontrol.set("NodeName=n1 State=IDLE+DRAIN Reason=maintenance: new cables [admin@2026-12-01T10:00:00]")
    # Not ready at once (a reset is needed), so the node's state is read with scontrol's whole reserve: one cut by
    # the 0.1 s a busy GPU left it (--timeout 1) was no state, and the node was drained over the other reason.
    code, doc, _ = run(scontrol, remapped(tmp_path), "prolog", timeout="60", capsys=capsys)
    assert code == 1 and scontrol.updates() == []
    assert isinstance(doc, dict) and doc["node_state"]["reason"] == "maintenance: new cables"


def test_a_job_without_gpus_opens_nothing(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SLURM_JOB_GPUS")
    sc = Scenario.h200()
    sc.fault("nvmlInit_v2", code=9)  # opening NVML would fail: exit 3
    code, doc, err = run(scontrol, sc.write(tmp_path / "nodriver.txt"), "epilog", "--backend", "nvml",
                         capsys=capsys)
    assert (code, err) == (0, "") and isinstance(doc, dict) and doc["devices"] == []
    assert scontrol.calls() == []


@pytest.mark.parametrize("command", ["epilog", "prolog"])
def test_a_gate_run_outside_slurm_with_no_gpu_named_is_a_usage_error_not_ready(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *,
        capsys: pytest.CaptureFixture[str], command: str) -> None:
    # Run by hand (no SLURM_* at all), the gate took the empty environment for a job without GPUs: exit 0, "ready",
    # with GPU 0 held, having judged nothing.
    for key in ("SLURM_JOB_ID", "SLURM_JOB_UID", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(key)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    record = tmp_path / "record.jsonl"
    code, out, err = run(scontrol, busy(tmp_path), command, "--record", str(record), json_out=False, capsys=capsys)
    assert code == 2 and out == "" and scontrol.calls() == [] and not record.exists()
    assert "not run by slurmd ($SLURM_JOB_ID is unset) and no GPU named" in err and "--devices" in err, err
    # Named GPUs are judged, job or not (no job: nothing is signalled).
    code, doc, _ = run(scontrol, busy(tmp_path), command, "--devices", "0", "--no-drain", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["devices"] == [0] and doc["killed"] == []
    # The library says the same, before it reads anything.
    gate = slurm.epilog if command == "epilog" else slurm.prolog
    untouched: Any = object()  # no session: nothing of it may be used
    with pytest.raises(ValueError, match="not run by slurmd"):
        gate(untouched, slurm.job_from_env({}), timeout_s=1)


@pytest.mark.parametrize(("command", "code"), [("health", 0), ("prolog", 1), ("epilog", 1)])
def test_devices_that_name_no_gpu_here_are_a_cause_recorded_and_drained(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, *, capsys: pytest.CaptureFixture[str], command: str,
        code: int) -> None:
    # --devices 7 on a 2-GPU host (only the host can tell: a GPU gone, a wrapper copied from another node) was exit 2
    # with no record and no drain: slurmd ignores its HealthCheckProgram's exit code, so the node was never checked.
    record = tmp_path / "record.jsonl"
    got, doc, _ = run(scontrol, busy(tmp_path), command, "--devices", "7", "--record", str(record), capsys=capsys)
    assert got == code and isinstance(doc, dict) and doc["ready"] is False and doc["devices"] == []
    assert [c["text"] for c in doc["causes"]] == ["--devices: no GPU with index 7: this host has 2 GPUs (indices 0..1)"]
    assert scontrol.updates() == [["update", "NodeName=n1", "State=DRAIN", f"Reason={doc['reason']}"]]
    assert [json.loads(line)["reason"] for line in record.read_text().splitlines()] == [doc["reason"]]


def test_a_malformed_environment_is_a_usage_error(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_JOB_GPUS", "gpu0")
    code, _, err = run(scontrol, busy(tmp_path), "epilog", json_out=False, capsys=capsys)
    assert code == 2 and "$SLURM_JOB_GPUS='gpu0'" in err and scontrol.calls() == []


@pytest.mark.parametrize("option", ["--scontrol", "--record", "--node"])
def test_an_empty_path_or_name_is_a_usage_error_not_the_default(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        option: str) -> None:
    # "--scontrol \"$SCONTROL\"" with the variable unset ran whatever scontrol PATH had, "--record ''" recorded
    # nothing, silently, and "--node ''" drained $SLURMD_NODENAME's node: each is now a usage error.
    scontrol.state.write_text(scontrol.line)
    argv = ["--simulate", str(busy(tmp_path)), "slurm", "epilog", "--timeout", "1", option, ""]
    if option != "--scontrol":
        argv += ["--scontrol", str(scontrol.path)]
    if option != "--node":
        argv += ["--node", "n1"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and f"{option}" in err and scontrol.calls() == [], err


def test_a_hostlist_as_the_node_name_is_a_usage_error_and_drains_nothing(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", "n1,n2")
    code = main(["--simulate", str(busy(tmp_path)), "slurm", "epilog", "--scontrol", str(scontrol.path), "--timeout",
                 "1"])
    err = capsys.readouterr().err
    assert code == 2 and "$SLURMD_NODENAME='n1,n2' is not one node's name" in err and scontrol.calls() == []


def test_a_huge_range_is_a_usage_error_naming_the_variable(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SLURM_JOB_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0-100000")
    code, _, err = run(scontrol, busy(tmp_path), "prolog", json_out=False, capsys=capsys)
    assert code == 2 and "$CUDA_VISIBLE_DEVICES='0-100000'" in err and "beyond /dev/nvidia253" in err
    assert scontrol.calls() == []


def test_no_backend_drains_and_exits_3(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlInit_v2", code=9)  # NVML_ERROR_DRIVER_NOT_LOADED
    code, doc, _ = run(scontrol, sc.write(tmp_path / "nodriver.txt"), "prolog", "--backend", "nvml", capsys=capsys)
    assert code == 3 and isinstance(doc, dict)
    assert doc["causes"][0]["kind"] == "unavailable"
    assert scontrol.updates()[0][3].startswith("Reason=nvmlcheck: no GPU backend: ")


class TestHealth:
    """The HealthCheckProgram: drains by cause, once; returns nvmlcheck's drains to service; leaves others'."""

    @pytest.fixture
    def remap(self, tmp_path: Path) -> Path:
        sc = Scenario.h200(devices=2)
        sc.set_device(1, remapped_rows=(0, 1, True, False))
        return sc.write(tmp_path / "remap.txt")

    @pytest.fixture
    def healthy(self, tmp_path: Path) -> Path:
        return Scenario.h200(devices=2).write(tmp_path / "healthy.txt")

    REASON = "nvmlcheck: GPU 1: row remap pending, reset needed"

    def test_it_drains_an_unhealthy_gpu(self, scontrol: FakeScontrol, remap: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
        code, doc, _ = run(scontrol, remap, "health", capsys=capsys)
        # Exit 0: the node is as it should be (drained with the reason); slurmd at start-up waits for a 0.
        assert code == 0 and isinstance(doc, dict) and doc["ready"] is False
        assert scontrol.updates() == [["update", "NodeName=n1", "State=DRAIN", f"Reason={self.REASON}"]]

    def test_it_is_idempotent(self, scontrol: FakeScontrol, remap: Path, capsys: pytest.CaptureFixture[str]) -> None:
        scontrol.set(f"NodeName=n1 State=IDLE+DRAIN Reason={self.REASON} [root@2026-12-01T10:00:00]")
        code, _, _ = run(scontrol, remap, "health", capsys=capsys)
        assert code == 0 and scontrol.updates() == []

    def test_it_leaves_someone_elses_drain(self, scontrol: FakeScontrol, remap: Path, healthy: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
        scontrol.set("NodeName=n1 State=IDLE+DRAIN Reason=Kill task failed [slurm@2026-12-01T10:00:00]")
        for scenario in (remap, healthy):
            run(scontrol, scenario, "health", capsys=capsys)
        assert scontrol.updates() == []

    def test_a_node_someone_else_drained_is_as_it_should_be(
            self, scontrol: FakeScontrol, remap: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        # Once exit 1: slurmd, rerunning a failing health program at start-up, would not register the node.
        scontrol.set("NodeName=n1 State=IDLE+DRAIN Reason=Kill task failed [slurm@2026-12-01T10:00:00]")
        record = tmp_path / "slurm.jsonl"
        code, doc, err = run(scontrol, remap, "health", "--record", str(record), capsys=capsys)
        assert code == 0 and scontrol.updates() == []
        assert isinstance(doc, dict) and doc["ready"] is False and doc["exit_code"] == 0
        causes = json.loads(record.read_text())["causes"]
        assert [c["text"] for c in causes] == ["GPU 1: row remap pending, reset needed"]
        assert err == f"nvmlcheck slurm health: {self.REASON.removeprefix('nvmlcheck: ')}\n"
        # Not drained by anyone, and not drained by this run either (--no-drain): the exit says so.
        scontrol.set("NodeName=n1 State=IDLE ThreadsPerCore=1")
        code, _, _ = run(scontrol, remap, "health", "--no-drain", capsys=capsys)
        assert code == 1

    def test_it_returns_its_own_drain_to_service_once_ready(self, scontrol: FakeScontrol, healthy: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
        scontrol.set(f"NodeName=n1 State=IDLE+DRAIN Reason={self.REASON} [root@2026-12-01T10:00:00]")
        code, _, _ = run(scontrol, healthy, "health", capsys=capsys)
        assert code == 0 and scontrol.updates() == [["update", "NodeName=n1", "State=RESUME"]]
        # Not while a job still runs on it (draining), nor with --no-resume.
        scontrol.log.unlink()
        scontrol.set(f"NodeName=n1 State=MIXED+DRAIN Reason={self.REASON} [root@2026-12-01T10:00:00]")
        run(scontrol, healthy, "health", capsys=capsys)
        scontrol.set(f"NodeName=n1 State=IDLE+DRAIN Reason={self.REASON} [root@2026-12-01T10:00:00]")
        run(scontrol, healthy, "health", "--no-resume", capsys=capsys)
        assert scontrol.updates() == []

    def test_it_keeps_its_drain_while_memory_is_still_held(self, scontrol: FakeScontrol, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
        scontrol.set("NodeName=n1 State=IDLE+DRAIN Reason=nvmlcheck: GPU 0 held by pid 4123456 8.0 GiB after 30 s")
        code, doc, _ = run(scontrol, busy(tmp_path), "health", capsys=capsys)
        assert code == 0 and scontrol.updates() == []
        assert isinstance(doc, dict) and doc["causes"][0]["pid"] == 4_123_456


# --- ready's culprits as drain-reason causes -------------------------------------------------------------------------


@pytest.mark.parametrize(("culprit", "text"), [
    (Culprit(3, "held", "compute", "held by pid 4123 (python3), 8.0 GiB", pid=4123, name="python3",
             used_bytes=8 * GIB, state="sleeping", action="STOP_HOLDER"),
     "GPU 3 held by pid 4123 (python3) 8.0 GiB after 30 s"),
    (Culprit(3, "held", "compute", "…", pid=4123, name="python3", used_bytes=8 * GIB, container="lxc/129"),
     "GPU 3 held by pid 4123 (python3) in lxc/129 8.0 GiB after 30 s"),
    (Culprit(3, "held", "compute", "…", pid=4123, name="python3", used_bytes=8 * GIB, container="cgroup /user.slice"),
     "GPU 3 held by pid 4123 (python3) 8.0 GiB after 30 s"),
    (Culprit(0, "stuck", "compute", "…", pid=77, name="python3", used_bytes=GIB, state="zombie", action="REAP_ZOMBIE"),
     "GPU 0 held by pid 77 (python3) 1.0 GiB (a zombie) after 30 s"),
    (Culprit(0, "stuck", "compute", "…", pid=77, name="dd", used_bytes=GIB, state="uninterruptible",
             action="NODE_REBOOT"),
     "GPU 0 held by pid 77 (dd) 1.0 GiB (in D state) after 30 s"),
    (Culprit(0, "reclaiming", "compute", "…", pid=77, used_bytes=GIB, action="WAIT"),
     "GPU 0: 1.0 GiB of exited pid 77 still coming back after 30 s"),
    (Culprit(0, "stuck", "memory", "…", used_bytes=8 * GIB, action="RESET_GPU"),
     "GPU 0: 8.0 GiB held by no process after 30 s"),
    (Culprit(0, "reclaiming", "memory", "…", used_bytes=8 * GIB, action="WAIT"),
     "GPU 0: 8.0 GiB still coming back after 30 s"),
    (Culprit(1, "unhealthy", "row-remap-pending", "a row remapping is pending: … [RESET_GPU: nvidia-smi -r -i 1]",
             action="RESET_GPU"),
     "GPU 1: row remap pending, reset needed"),
    (Culprit(1, "unhealthy", "row-remap-failure", "…", action="CONTACT_SUPPORT"),
     "GPU 1: row remap failed, service needed"),
    (Culprit(2, "unhealthy", "xid", "XID 79: fell off the bus [NODE_REBOOT]", action="NODE_REBOOT"),
     "GPU 2: XID 79: fell off the bus"),
    (Culprit(2, "unknown", "query", "could not be read: no permission"), "GPU 2: could not be read: no permission"),
    (Culprit(2, "unhealthy", "query", "the GPU needs a reset (nvmlDeviceGetMemoryInfo_v2 for GPU 2 failed: "
             "NVML_ERROR_RESET_REQUIRED (24). …): nvidia-smi -r -i 2", action="RESET_GPU"),
     "GPU 2: GPU requires a reset, reset needed"),
])
def test_each_culprit_of_ready_reads_as_a_drain_reason(culprit: Culprit, text: str) -> None:
    cause = slurm.cause_of(culprit, after_ns=30_000_000_000)
    assert cause.text == text
    assert (cause.kind, cause.gpu, cause.pid) == (culprit.class_, culprit.gpu, culprit.pid)
    assert cause.action == culprit.action


def test_a_holder_the_epilog_killed_is_named_a_survivor() -> None:
    from nvmlcheck.kill import PidTimes, SignalSent

    survivor = PidTimes(77, "nvml", "python3", (SignalSent("SIGTERM", 0), SignalSent("SIGKILL", 2_000_000_000)),
                        None, None)
    culprit = Culprit(0, "held", "compute", "…", pid=77, name="python3", used_bytes=GIB, state="running")
    assert slurm.cause_of(culprit, after_ns=5_000_000_000, killed={77: survivor}).text == (
        "GPU 0 held by pid 77 (python3) 1.0 GiB (survived SIGKILL) after 5.0 s")


def test_an_epilog_whose_gpu_list_cannot_be_read_still_ends_and_drains(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Session.holders raises for a process list it cannot read (never "no holder"): the epilog goes on, finds the
    # job's processes by their device files, and the readiness judgement names what cannot be read.
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_123_456, used_bytes=8 * GIB)
    sc.set_device(0, unsupported=("processes.compute",))
    code, doc, _ = run(scontrol, sc.write(tmp_path / "unreadable.txt"), "epilog", capsys=capsys)
    assert code == 1 and isinstance(doc, dict) and doc["schema"] == "nvmlcheck/slurm" and doc["devices"] == [0]
    assert doc["causes"] and scontrol.updates()  # drained, with a cause


def test_the_minor_numbers_and_the_health_are_read_within_the_gates_deadline(
        nvml_stub: StubSession, nvml_scenario: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck.testing import StepClock

    # Read without a deadline, eight GPUs with a 2 s minor-number call held `prolog --timeout 3` for 16 s (slurmd
    # kills a Prolog at its own timeout). A StepClock: each reading is 0.5 s, whatever the machine.
    Scenario.h200(devices=8).write(nvml_stub.scenario_path)
    with nc.open("nvml") as gpus:
        result = slurm.prolog(gpus, job("0"), timeout_s=1.0, clock=StepClock(0.5).clock)
        assert not result.ready and [c.kind for c in result.causes] == ["unknown"]
        assert "minor numbers were not read within the timeout" in result.causes[0].text
    with nc.open("nvml") as gpus:
        result = slurm.health(gpus, timeout_s=1.0, clock=StepClock(0.5).clock)
        assert not result.ready and "health not read within the timeout" in result.causes[0].text


def test_polls_that_could_not_read_the_gpu_are_not_counted_dirty(nvml_stub: StubSession,
                                                                nvml_scenario: Scenario) -> None:
    # A poll that failed to read the GPUs saw nothing held: it was counted in dirty_polls and moved last_dirty_ns,
    # as if the GPU had been seen busy then (the wait's own WaitResult no longer does that).
    nvml_scenario.fault("nvmlDeviceGetMemoryInfo_v2", 10, device=0, after=2, count=3)  # NVML_ERROR_TIMEOUT: retried
    nvml_scenario.write(nvml_stub.scenario_path)
    with nc.open("nvml") as gpus:
        result = slurm.prolog(gpus, job("0"), timeout_s=30)
    assert result.ready and result.readiness is not None
    assert result.readiness.dirty_polls == 0 and result.readiness.last_dirty_ns is None, result.readiness


def test_an_epilog_whose_holders_scan_is_cut_signals_nothing_and_is_not_ready(
        nvml_stub: StubSession, nvml_bound_process: Callable[..., subprocess.Popen[bytes]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck._proc import devfiles

    monkeypatch.setenv("SLURM_JOB_ID", "42")
    leftover = nvml_bound_process(0, 8 * GIB)
    monkeypatch.delenv("SLURM_JOB_ID")
    real_scan = devfiles.scan

    def cut(*args: Any, **kwargs: Any) -> devfiles.FdScan:
        # A host whose /proc takes longer than the gate has: a scan given a deadline is cut by it.
        out = real_scan(*args, **kwargs)
        return out if kwargs.get("deadline_ns") is None else out._replace(unscanned=1000)

    monkeypatch.setattr(devfiles, "scan", cut)
    with nc.open("nvml") as gpus:
        result = slurm.epilog(gpus, job("0"), timeout_s=0.5)
    # Before, the scan took no bound (a huge /proc held the gate past slurmd's timeout); a cut one is unknown.
    assert leftover.poll() is None and result.killed == ()
    assert not result.ready
    assert any(c.kind == "unknown" and "could not all be found" in c.text and "nothing was signalled" in c.text
               for c in result.causes), result.causes


@pytest.mark.parametrize("how", ["prolog-uuid", "prolog-cuda", "epilog-uuid", "health-uuid", "job-uuids"])
def test_gpus_named_by_uuid_or_cuda_number_are_resolved_within_the_gates_deadline(
        nvml_stub: StubSession, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    from nvmlcheck.testing import StepClock

    # The selection was resolved with Session.resolve, which reads every GPU's identity with no deadline: a slow
    # or hung GPU held the gate past slurmd's own timeout. A StepClock moves 0.5 s at each reading of the clock, so
    # a bounded reading of eight GPUs stops at the deadline, while an unbounded one never looks at the clock.
    Scenario.h200(devices=8).write(nvml_stub.scenario_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with nc.open("nvml") as gpus:
        uuid = gpus.snapshot(7, fields=nc.Fields(0)).devices[0].uuid
    with nc.open("nvml") as gpus:
        clock = StepClock(0.5).clock
        if how == "prolog-uuid":
            result = slurm.prolog(gpus, job("0"), timeout_s=1.0, devices=[uuid], clock=clock)
        elif how == "prolog-cuda":
            result = slurm.prolog(gpus, job("0"), timeout_s=1.0, devices=["cuda:7"], clock=clock)
        elif how == "epilog-uuid":
            result = slurm.epilog(gpus, job("0"), timeout_s=1.0, devices=[uuid], clock=clock)
        elif how == "health-uuid":
            result = slurm.health(gpus, timeout_s=1.0, devices=[uuid], clock=clock)
        else:
            as_uuids = slurm.job_from_env({"SLURM_JOB_ID": "42", "SLURM_JOB_GPUS": "7",
                                           "CUDA_VISIBLE_DEVICES": uuid})
            assert as_uuids.gpus == (uuid,)
            result = slurm.prolog(gpus, as_uuids, timeout_s=1.0, clock=clock)
    assert not result.ready and result.devices == ()
    assert [c.kind for c in result.causes] == ["unknown"], result.causes
    assert "not read within the timeout" in result.causes[0].text


@pytest.mark.parametrize("command", ["epilog", "prolog", "health"])
@pytest.mark.parametrize("named", ["minor", "uuid", "cuda"])
def test_every_reading_a_gate_makes_carries_its_deadline(
        nvml_stub: StubSession, nvml_scenario: Scenario, monkeypatch: pytest.MonkeyPatch, command: str,
        named: str) -> None:
    # The class of defect above: any reading without the gate's deadline (the selection's, the epilog's process
    # lists through Session.holders) can hold the gate past slurmd's timeout on a hung GPU.
    nvml_scenario.add_process(0, 4_123_456, used_bytes=GIB)  # a holder to list (no such process: nothing killed)
    nvml_scenario.write(nvml_stub.scenario_path)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with nc.open("nvml") as gpus:
        uuid = gpus.snapshot(0, fields=nc.Fields(0)).devices[0].uuid
        backend = gpus.backend
        calls: list[object] = []
        real = backend.snapshot

        def spy(*args: Any, **kwargs: Any) -> Any:
            calls.append(kwargs.get("deadline"))
            return real(*args, **kwargs)

        monkeypatch.setattr(backend, "snapshot", spy)
        devices = {"minor": None, "uuid": [uuid], "cuda": ["cuda:0"]}[named]
        if command == "epilog":
            slurm.epilog(gpus, job("0"), timeout_s=0.2, devices=devices)
        elif command == "prolog":
            slurm.prolog(gpus, job("0"), timeout_s=0.2, devices=devices)
        else:
            slurm.health(gpus, timeout_s=0.2, devices=devices)
    assert calls and all(d is not None for d in calls), calls


def test_a_process_of_slurms_own_prolog_or_epilog_is_never_a_root_jobs_leftover(
        children: Callable[..., subprocess.Popen[bytes]]) -> None:
    # slurmd runs the Epilog as root with SLURM_JOB_ID of the job, outside the job's cgroup (Slurm 22.05 sets
    # SLURM_SCRIPT_CONTEXT=epilog_slurmd): for a job of root's (SLURM_JOB_UID=0), a helper the epilog script left
    # running on the GPU (nvidia-smi, dcgmi) matched "environment names the job and runs as its user", and the
    # epilog signalled its own helper.
    leftover = children(SLURM_JOB_ID="42")
    helper = children(SLURM_JOB_ID="42", SLURM_SCRIPT_CONTEXT="epilog_slurmd")
    job = slurm.SlurmJob("42", os.getuid(), None, None, ("0",), "SLURM_JOB_GPUS")
    mine, others = slurm.job_processes([as_holder(c.pid) for c in (leftover, helper)], job)
    assert [h.pid for h, _ in mine] == [leftover.pid]
    assert [(h.pid, why) for h, why in others] == [
        (helper.pid, "Slurm's own script ('epilog_slurmd'), not the job's")]


@pytest.mark.parametrize("command", ["epilog", "health"])
def test_a_lost_gpu_is_named_in_the_drain_reason_with_what_to_do(
        slurm_env: None, scontrol: FakeScontrol, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        command: str) -> None:
    # A lost GPU's culprit carries NVML's whole message: health's reason was 200 characters of it, cut before
    # "reboot the node"; the epilog's (the job's GPU cannot be matched to a minor number) was cut at "NVML_ERROR_GPU"
    # and never said the GPU was lost.
    sc = Scenario.h200(devices=2)
    sc.set_device(0, lost=True)
    code, doc, _ = run(scontrol, sc.write(tmp_path / "lost.txt"), command, capsys=capsys)
    assert isinstance(doc, dict)
    assert doc["reason"].startswith("nvmlcheck: GPU 0: GPU lost, node reboot needed"), doc["reason"]
    lost = doc["causes"][0] if command == "health" else next(c for c in doc["causes"] if c["kind"] == "unhealthy")
    assert (lost["kind"], lost["gpu"], lost["action"]) == ("unhealthy", 0, "NODE_REBOOT")
    assert code == (1 if command == "epilog" else 0) and scontrol.updates()


@pytest.mark.parametrize(("error", "kind", "action"), [
    (nc.SmiTransportError(["ssh", "gpu01", "nvidia-smi"], 255, "Connection refused"), "unknown", None),
    (nc.NoPermission(4, "nvmlDeviceGetMemoryInfo_v2"), "unknown", None),
    (nc.GpuLost(15, "nvmlDeviceGetMemoryInfo_v2"), "unhealthy", "NODE_REBOOT"),
    (nc.GpuRequiresReset(24, "nvmlDeviceGetMemoryInfo_v2"), "unhealthy", "RESET_GPU"),
])
def test_a_readiness_check_that_raises_names_the_errors_own_action(
        nvml_stub: StubSession, monkeypatch: pytest.MonkeyPatch, error: Exception, kind: str,
        action: str | None) -> None:
    # Every error session.ready raised became "reset the GPU": a failing nvidia-smi over ssh, a refused permission.
    with nc.open("nvml") as gpus:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise error

        monkeypatch.setattr(gpus, "ready", fail)
        result = slurm.prolog(gpus, job("0"), timeout_s=5)
    assert not result.ready and [(c.kind, c.action) for c in result.causes] == [(kind, action)]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_record_path_that_is_no_regular_file_is_refused_without_blocking(tmp_path: Path, kind: str) -> None:
    # --record on a FIFO with no reader (one a user made where the record goes, in /tmp) blocked the open forever:
    # the epilog never ended, past slurmd's timeout; /dev/null-like devices took the record silently.
    target = tmp_path / "record.jsonl"
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target = Path("/dev/null")
    script = ("import sys\nfrom nvmlcheck.cli._slurm import _append\n"
              f"_append({str(target)!r}, {{'schema': 'nvmlcheck/slurm'}})\n")
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                          timeout=60)  # a hang guard, not a duration asserted
    why = "No such device or address" if kind == "fifo" else "not a regular file"  # ENXIO: a FIFO with no reader
    assert done.returncode == 0 and "cannot write the record" in done.stderr and why in done.stderr, done.stderr


@pytest.mark.parametrize("how", ["prolog-minor", "prolog-uuid", "epilog-minor", "health", "health-uuid"])
def test_a_gate_with_timeout_0_is_one_check_that_completes(nvml_stub: StubSession, nvml_scenario: Scenario,
                                                           how: str) -> None:
    from nvmlcheck.testing import StepClock

    # health's "timeout_s=0 waits no longer" (one check, as every timeout=0 of the library) failed on every idle
    # GPU: the setup readings (minor numbers, UUIDs, health) were cut at a deadline already come. A StepClock:
    # every reading of the clock is later, as on a loaded machine.
    with nc.open("nvml") as gpus:
        uuid = gpus.snapshot(1, fields=nc.Fields(0)).devices[0].uuid
        clock = StepClock(0.5).clock
        if how == "prolog-minor":
            result = slurm.prolog(gpus, job("0"), timeout_s=0, clock=clock)
        elif how == "prolog-uuid":
            result = slurm.prolog(gpus, job("0"), timeout_s=0, devices=[uuid], clock=clock)
        elif how == "epilog-minor":
            result = slurm.epilog(gpus, job("0"), timeout_s=0, clock=clock)
        elif how == "health":
            result = slurm.health(gpus, timeout_s=0, clock=clock)
        else:
            result = slurm.health(gpus, timeout_s=0, devices=[uuid], clock=clock)
    assert result.ready and result.causes == (), result.causes


@pytest.mark.parametrize("command", ["prolog", "epilog"])
def test_a_gate_whose_budget_its_setup_used_up_is_not_judged_on_one_check(
        nvml_stub: StubSession, command: str) -> None:
    from nvmlcheck.testing import StepClock

    # A positive timeout the setup readings used up was handed to the readiness check as 0: one check, judged alone
    # (the stable polls ignored), and an idle GPU was called ready after 1 poll, past the gate's deadline. Steps of
    # 5 to 100 ms on a 0.5 s gate: however far the setup gets, a ready gate saw the stable polls it asks for (2).
    seen = []
    for step_ms in range(5, 105, 5):
        with nc.open("nvml") as gpus:
            clock = StepClock(step_ms / 1000).clock
            gate = slurm.prolog if command == "prolog" else slurm.epilog
            result = gate(gpus, job("0"), timeout_s=0.5, clock=clock)
        seen.append((step_ms, result.ready, None if result.readiness is None else result.readiness.polls))
    assert all(polls is not None and polls >= 2 for _, ready, polls in seen if ready), seen
    assert any(ready for _, ready, _ in seen) and not all(ready for _, ready, _ in seen), seen  # both sides met
