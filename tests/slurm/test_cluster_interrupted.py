"""slurmd ending nvmlcheck's Epilog at PrologEpilogTimeout, on a real one-node cluster (tests/slurm/slurmlab.py).

The lab here is misconfigured on purpose: ``PrologEpilogTimeout=3`` below the epilog's ``--timeout 30``, so slurmd
ends the epilog (SIGTERM to its process group, SIGKILL 10 ms later: ``_kill_pg`` in Slurm's run_command.c) while it
waits for a GPU that a process which is not the job's holds. The gate used to leave no record then; its record must
now say what it found and that it was interrupted. Skipped where the lab cannot run (see conftest.py).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from nvmlcheck.testing import Scenario

from . import slurmlab
from .conftest import lab_for_module
from .slurmlab import Lab, wait_for

GIB = 1 << 30


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    yield from lab_for_module(tmp_path_factory, "slurmlab-short", prolog_epilog_timeout=3,
                              timeouts={"prolog": 4.0, "epilog": 30.0, "health": 4.0})


def test_an_epilog_slurmd_ends_at_its_timeout_leaves_its_record(short: Lab) -> None:
    short.resume()
    Scenario.h200(devices=slurmlab.GPUS).write(short.scenario)
    short.scenario.chmod(0o666)
    go = short.jobs / "go"
    go.unlink(missing_ok=True)
    job = short.sbatch(f'echo "$SLURM_JOB_GPUS" > {short.jobs}/$SLURM_JOB_ID.gpus\n'
                       f"i=0; while [ ! -e {go} ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done\n",
                       "--gres=gpu:1")
    gpus_file = short.jobs / f"{job}.gpus"
    gpu = wait_for("the job to start", lambda: gpus_file.exists() and gpus_file.read_text().strip(), 20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    holder = subprocess.Popen(["sleep", "120"], env={**env, slurmlab.TAG: short.tag})
    try:
        with short.scenario.open("a", encoding="utf-8") as f:
            f.write(f"process device={gpu} kind=compute pid={holder.pid} used={8 * GIB} bound=1\n")
        go.touch()
        short.wait_node(lambda s: "DRAIN" in s, "drained", timeout_s=60)
        (record,) = [r for r in short.read_records("epilog") if (r.get("job") or {}).get("id") == str(job)]
        assert record["interrupted"] == "SIGTERM" and record["exit_code"] == 143 and record["ready"] is False
        texts = [c["text"] for c in record["causes"]]
        # The last cause says when SIGTERM came and what the gate was doing. Normally it was waiting for the GPU:
        # slurmd's 3 s are past the gate's start, its NVML and its holders' reading. On a loaded machine the start
        # alone can take that long; then it was still at an earlier stage, and had read nothing of the GPU yet.
        stop = texts[-1]
        assert stop.startswith("interrupted by SIGTERM after "), texts
        stages = ("starting", "opening the GPU backend", "choosing the job's GPUs", "finding the job's processes")
        if "while waiting for the GPUs to be ready" in stop:
            # The gate's last reading says what it saw: the memory alone while the wait's probe reads only that
            # ("GPU 0: 8.0 GiB in use after 2.9 s (who holds it was not read yet)"), or the holder once its lists
            # were read ("GPU 0 held by pid 4123 (sleep) 8.0 GiB after 2.9 s"); which one depends on when SIGTERM
            # came.
            memory_only = f"GPU {gpu}: 8.0 GiB in use after "
            named = f"GPU {gpu} held by pid {holder.pid} (sleep) 8.0 GiB after "
            assert any(t.startswith((memory_only, named)) for t in texts), texts
        else:
            assert any(f"while {stage}" in stop for stage in stages) and len(texts) == 1, texts
        assert holder.poll() is None  # not the job's: never signalled
        # slurmd's own word for it (22.05.8: "run_command: epilog poll timeout @ 3000 msec"); Slurm drains the node
        # with "Epilog error" (the gate's own drain, after its record, is cut by the SIGKILL 10 ms after SIGTERM).
        assert "epilog poll timeout" in short.log_tail(400)
    finally:
        holder.kill()
        holder.wait()
        go.unlink(missing_ok=True)
        short.health(False)
        short.settle()
