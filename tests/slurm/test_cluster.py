"""``nvmlcheck slurm`` as a real slurmd runs it: Prolog, Epilog and HealthCheckProgram of a one-node cluster
(tests/slurm/slurmlab.py) whose two GPUs are the simulator's.

Each test writes the scenario the GPUs read; a job script adds its own workers to it (a ``process … bound=1`` line:
the stub lists a real process while it lives and gives its memory back ``release_ms`` after it is gone). What is
asserted is the mechanism, from the ``nvmlcheck/slurm`` records the wrappers write (``--record``) and Slurm's own
view of the node and the job, never a duration.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import slurm as gate
from nvmlcheck.testing import Scenario

from . import slurmlab
from .slurmlab import Lab, wait_for
from .test_gate import IMPOSSIBLE_PID, assert_waited_for_the_memory

GIB = 1 << 30


@pytest.fixture
def pids(cluster: Lab) -> Iterator[list[int]]:
    """PIDs a test started or learnt of (job workers): killed after the test if still alive."""
    found: list[int] = []
    yield found
    for path in cluster.jobs.glob("*.pid"):
        with contextlib.suppress(ValueError, OSError):
            found.append(int(path.read_text().strip()))
        path.unlink(missing_ok=True)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def write_scenario(lab: Lab, scenario: Scenario) -> None:
    scenario.write(lab.scenario)
    lab.scenario.chmod(0o666)  # job scripts append their workers


def worker_line(lab: Lab, gpu: str, used: int, *, release_ms: int, list_ms: int = 50) -> str:
    """Shell: append a bound process line for ``$W`` (the worker's PID) to the scenario, and note the PID."""
    return (f'echo "$W" > {lab.jobs}/$SLURM_JOB_ID.pid\n'
            f'echo "process device={gpu} kind=compute pid=$W used={used} bound=1 list_ms={list_ms} '
            f'release_ms={release_ms}" >> {lab.scenario}\n')


def only(records: list[dict[str, Any]], job_id: int) -> dict[str, Any]:
    mine = [r for r in records if (r.get("job") or {}).get("id") == str(job_id)]
    assert len(mine) == 1, records
    return mine[0]


def test_a_clean_job_end_leaves_the_node_idle_and_the_epilog_saw_the_reclaim(cluster: Lab, pids: list[int]) -> None:
    write_scenario(cluster, Scenario.h200(devices=slurmlab.GPUS))
    # The job's GPU worker ends with the job; its 8 GiB come back 300 ms after the epilog first sees it gone.
    job = cluster.sbatch(
        "sleep 0.3 & W=$!\n" + worker_line(cluster, "$SLURM_JOB_GPUS", 8 * GIB, release_ms=300) + "wait\n",
        "--gres=gpu:1")
    done = cluster.wait_job_done(job)
    assert done["JobState"] == "COMPLETED", done
    assert cluster.node_state() == "IDLE", cluster.node_info()
    record = only(cluster.read_records("epilog"), job)
    assert record["ready"] is True and record["exit_code"] == 0
    assert record["killed"] == [] and record["left_alone"] == []
    readiness = record["readiness"]
    assert isinstance(readiness, dict)
    assert_waited_for_the_memory(readiness)
    assert record["scontrol"] == []  # nothing drained
    prolog = only(cluster.read_records("prolog"), job)
    assert prolog["ready"] is True and prolog["devices"] == [0]


def test_the_gate_judges_the_gpu_behind_slurms_device_file_not_nvmls_index(cluster: Lab, pids: list[int]) -> None:
    # As on some hosts: NVML's GPU 0 is /dev/nvidia1 and its GPU 1 is /dev/nvidia0 (gres.conf's File= order).
    scenario = Scenario.h200(devices=slurmlab.GPUS)
    for index in range(slurmlab.GPUS):
        scenario.set_device(index, minor=slurmlab.GPUS - 1 - index)
    write_scenario(cluster, scenario)
    # The worker holds memory on the GPU the job's device file is (NVML's index GPUS-1-ID).
    job = cluster.sbatch(
        f"sleep 0.3 & W=$!\nG=$(({slurmlab.GPUS - 1} - $SLURM_JOB_GPUS))\n"
        + worker_line(cluster, "$G", 8 * GIB, release_ms=300) + "wait\n",
        "--gres=gpu:1")
    done = cluster.wait_job_done(job)
    assert done["JobState"] == "COMPLETED", done
    assert cluster.node_state() == "IDLE", cluster.node_info()
    record = only(cluster.read_records("epilog"), job)
    (slurm_id,) = record["job"]["gpus"]
    assert record["devices"] == [slurmlab.GPUS - 1 - int(slurm_id)]
    assert record["ready"] is True and record["exit_code"] == 0
    assert_waited_for_the_memory(record["readiness"])


def test_an_orphaned_worker_holding_memory_is_killed_by_the_epilog(cluster: Lab, pids: list[int]) -> None:
    write_scenario(cluster, Scenario.h200(devices=slurmlab.GPUS))
    # A worker that left the job: its own session, and out of the job's freezer cgroup (where proctrack/cgroup would
    # otherwise kill it), as a daemonised data loader or a process started through ssh would be. Its environment
    # still says SLURM_JOB_ID, and it runs as the job's user.
    escape = "echo $$ > /sys/fs/cgroup/freezer/cgroup.procs 2>/dev/null; exec sleep 60"
    job = cluster.sbatch(
        f"setsid sh -c '{escape}' </dev/null >/dev/null 2>&1 & W=$!\n"
        # Gone from the job once it runs sleep (it left the cgroup before the exec): the job may end then.
        'i=0; while [ "$(cat /proc/$W/comm)" != sleep ] && [ $i -lt 200 ]; do sleep 0.02; i=$((i+1)); done\n'
        + worker_line(cluster, "$SLURM_JOB_GPUS", 8 * GIB, release_ms=200),
        "--gres=gpu:1")
    done = cluster.wait_job_done(job)
    assert done["JobState"] == "COMPLETED", done
    worker = int((cluster.jobs / f"{job}.pid").read_text())
    pids.append(worker)
    assert cluster.node_state() == "IDLE", cluster.node_info()
    record = only(cluster.read_records("epilog"), job)
    assert record["ready"] is True, record["causes"]
    killed = record["killed"]
    assert isinstance(killed, list) and [k["pid"] for k in killed] == [worker]
    assert killed[0]["signals"][0]["signal"] == "SIGTERM" and killed[0]["exited_ns"] is not None
    assert not slurmlab._alive(worker)


def test_a_holder_that_is_not_the_jobs_is_left_alone_and_the_node_drained_naming_it(
        cluster: Lab, pids: list[int]) -> None:
    write_scenario(cluster, Scenario.h200(devices=slurmlab.GPUS))
    go = cluster.jobs / "go"
    go.unlink(missing_ok=True)
    # The job waits until the test has put a process of its own (root's, in no job) on the job's GPU.
    job = cluster.sbatch(f'echo "$SLURM_JOB_GPUS" > {cluster.jobs}/$SLURM_JOB_ID.gpus\n'
                         f"i=0; while [ ! -e {go} ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done\n",
                         "--gres=gpu:1")
    gpus_file = cluster.jobs / f"{job}.gpus"
    gpu = wait_for("the job to start", lambda: gpus_file.exists() and gpus_file.read_text().strip(), 20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    holder = subprocess.Popen(["sleep", "60"], env={**env, slurmlab.TAG: cluster.tag})
    pids.append(holder.pid)
    try:
        with cluster.scenario.open("a", encoding="utf-8") as f:
            f.write(f"process device={gpu} kind=compute pid={holder.pid} used={8 * GIB} bound=1\n")
        go.touch()
        cluster.wait_job_done(job)
        state = cluster.wait_node(lambda s: "DRAIN" in s, "drained")
        reason = cluster.node_info().get("Reason", "")
        assert reason.startswith("nvmlcheck: "), reason
        assert f"GPU {gpu} held by pid {holder.pid} (sleep) 8.0 GiB after" in reason, reason
        assert state.startswith("IDLE")
        record = only(cluster.read_records("epilog"), job)
        assert record["ready"] is False and record["exit_code"] == 1 and record["killed"] == []
        left = record["left_alone"]
        assert isinstance(left, list) and [x["pid"] for x in left] == [holder.pid]
        assert f"not job {job}'s process" in left[0]["reason"]
        assert holder.poll() is None  # never signalled
        runs = record["scontrol"]
        assert isinstance(runs, list) and runs[-1]["argv"][1:4] == ["update", f"NodeName={cluster.node}", "State=DRAIN"]
    finally:
        holder.kill()
        holder.wait()
        go.unlink(missing_ok=True)


def test_health_drains_a_gpu_with_a_pending_row_remap_and_returns_it_once_reset(cluster: Lab) -> None:
    scenario = Scenario.h200(devices=slurmlab.GPUS)
    scenario.set_device(1, remapped_rows=(0, 1, True, False))  # an uncorrectable error, a remap pending
    write_scenario(cluster, scenario)
    cluster.health(True)
    cluster.wait_node(lambda s: "DRAIN" in s, "drained by the health check")
    reason = "nvmlcheck: GPU 1: row remap pending, reset needed"
    assert cluster.node_info().get("Reason") == reason
    # The run that drained writes its record after its scontrol returned: Slurm shows the drain before the record
    # is there (read at once, the record list was empty on a loaded machine). Wait for the run whose drain it was.

    def drained_by() -> dict[str, Any] | None:
        return next((r for r in cluster.read_records("health")
                     if any(s["argv"][1] == "update" and s["exit_code"] == 0 for s in r["scontrol"])), None)

    drainer = wait_for("the record of the health run that drained", drained_by, 15)
    assert drainer["causes"][0]["action"] == "RESET_GPU", drainer
    # Idempotent: a run that found the node drained with this reason leaves it as it is (no second drain). Judged
    # on what each run read of the node (slurmd may start a run before the last one ended, so which run comes
    # next is no proof), once a run has read the drain.

    def found_drained() -> list[dict[str, Any]]:
        return [r for r in cluster.read_records("health") if (r["node_state"] or {}).get("reason") == reason]

    for record in wait_for("a health run that read the node drained", found_drained, 20):
        assert record["exit_code"] == 0 and all(r["argv"][1] != "update" for r in record["scontrol"]), record
    # The GPU was reset: the next run returns the node to service (it was nvmlcheck's drain).
    write_scenario(cluster, Scenario.h200(devices=slurmlab.GPUS))
    cluster.wait_node(lambda s: s == "IDLE", "returned to service")


def test_a_job_whose_gpu_is_still_reclaiming_waits_in_the_prolog_then_runs(cluster: Lab, pids: list[int]) -> None:
    # The previous job's worker has exited; the driver gives its 8 GiB back 600 ms after the prolog first looks.
    # A PID no process can have, not an exited child's: that one is free only until the PID counter wraps (pid_max
    # is 32768 on some hosts), and a process given it would hold the GPU for good.
    scenario = Scenario.h200(devices=slurmlab.GPUS)
    scenario.add_process(0, IMPOSSIBLE_PID, used_bytes=8 * GIB, bound=True, list_ms=100, release_ms=600)
    write_scenario(cluster, scenario)
    job = cluster.sbatch("echo ran\n", "--gres=gpu:1")
    done = cluster.wait_job_done(job)
    assert done["JobState"] == "COMPLETED", done
    assert (cluster.jobs / f"slurm-{job}.out").read_text() == "ran\n"
    assert cluster.node_state() == "IDLE"
    record = only(cluster.read_records("prolog"), job)
    readiness = record["readiness"]
    assert record["ready"] is True and isinstance(readiness, dict)
    assert readiness["last_dirty_ns"] is not None  # it saw the memory held, and waited for it


def test_a_job_without_gpus_opens_no_gpu_at_all(cluster: Lab) -> None:
    write_scenario(cluster, Scenario.h200(devices=slurmlab.GPUS))
    job = cluster.sbatch("true\n")
    assert cluster.wait_job_done(job)["JobState"] == "COMPLETED"
    for command in ("prolog", "epilog"):
        record = only(cluster.read_records(command), job)
        assert record["ready"] is True and record["devices"] == [] and record["readiness"] is None


def test_a_nodeset_name_is_found_out_and_nothing_drained(cluster: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in cluster.env().items():  # the lab's SLURM_CONF and PATH for the scontrol nvmlcheck runs
        monkeypatch.setenv(key, value)
    scontrol = gate.Scontrol()
    deadline = time.monotonic_ns() + 20_000_000_000  # a hang guard
    with pytest.raises(gate.NodeNotFound, match=f"'{slurmlab.NODESET}' is not one node's name"):
        scontrol.node(slurmlab.NODESET, deadline_ns=deadline)
    run = scontrol.drain(slurmlab.NODESET, "nvmlcheck: test", deadline_ns=deadline)
    assert not run.ran and cluster.node_state() == "IDLE", cluster.node_info()
    assert scontrol.node(cluster.node, deadline_ns=deadline).state == "IDLE"
    # What it guards against: Slurm's own update drains every node of a set named as if it were a node.
    cluster.run("scontrol", "update", f"NodeName={slurmlab.NODESET}", "State=DRAIN", "Reason=lab check")
    assert "DRAIN" in cluster.node_state()


def test_slurm_keeps_the_drain_reason_as_given(cluster: Lab, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    scontrol = gate.Scontrol()
    deadline = time.monotonic_ns() + 20_000_000_000  # a hang guard
    long = [gate.Cause("held", f"GPU {i} held by pid {4000 + i} (python3) 8.0 GiB after 30 s") for i in range(8)]
    for causes in ([gate.Cause("unknown", 'GPU 2: could not be read: NVML says "Unknown Error"')],
                   [gate.Cause("unknown", "GPU 0 held by pid 7 (it's=\"odd\";#) 1 GiB")],
                   [gate.Cause("unknown", "GPU 0 held by pid 7 (a\\b 'c') 1 GiB, ünïcödé")],
                   [gate.Cause("unknown", "x" * 400)], long):  # cut: "…", "(+N more)"
        reason = gate.drain_reason(causes)
        assert scontrol.drain(cluster.node, reason, deadline_ns=deadline).ok
        assert scontrol.node(cluster.node, deadline_ns=deadline).reason == reason
        cluster.run("scontrol", "update", f"NodeName={cluster.node}", "State=RESUME")


def test_the_lab_is_what_the_tests_think(slurm: Lab) -> None:
    """Slurm hands out the simulated GPUs: two, as gres."""
    assert slurm.node_info().get("Gres") == f"gpu:{slurmlab.GPUS}"
    assert Path(slurm.conf).read_text().count("nvmlcheck-") == 3
