"""Count-limited faults (``Scenario.fault(..., after=, count=)``) on the fake nvidia-smi: each run is a new process,
so the fake keeps the counts beside the scenario; a transient failure of nvidia-smi can then be played end to end.
Before, only sticky faults were rendered and a counted one was silently ignored (the GPU read as fine)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from nvmlcheck.testing import Scenario

from ._support import FAKE_SMI_CMD, Smi

MEMORY = "nvmlDeviceGetMemoryInfo_v2"
QUERY = ["--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits"]


def run_fake(scenario: Path) -> list[str]:
    """One run of the fake: each GPU's row."""
    env = {**os.environ, "NVMLCHECK_STUB_SCENARIO": str(scenario)}
    done = subprocess.run([*FAKE_SMI_CMD, *QUERY], env=env, capture_output=True, text=True, check=True)
    return done.stdout.splitlines()


def failing(rows: list[str]) -> list[int]:
    return [int(r.split(",")[0]) for r in rows if "[Unknown Error]" in r]


def test_a_counted_fault_fails_the_runs_it_counts(smi: Smi) -> None:
    sc = Scenario.h200(2)
    sc.fault(MEMORY, 999, device=0, after=1, count=2)
    smi.write(sc)
    runs = [failing(run_fake(smi.scenario_path)) for _ in range(4)]
    assert runs == [[], [0], [0], []]  # one passes, two fail, then it answers again; GPU 1 never


def test_without_a_device_each_gpu_read_counts_as_a_call(smi: Smi) -> None:
    sc = Scenario.h200(2)
    sc.fault(MEMORY, 999, after=1, count=2)  # calls: run 1 GPU 0 (passes), GPU 1; run 2 GPU 0; then none
    smi.write(sc)
    assert [failing(run_fake(smi.scenario_path)) for _ in range(3)] == [[1], [0], []]


def test_the_counts_restart_when_the_scenario_is_written_again(smi: Smi) -> None:
    sc = Scenario.h200()
    sc.fault(MEMORY, 999, device=0, count=1)
    smi.write(sc)
    assert [failing(run_fake(smi.scenario_path)) for _ in range(2)] == [[0], []]
    smi.write(sc)  # a new scenario file (as a new load of the stub): its faults count from the start
    stat = smi.scenario_path.stat()
    os.utime(smi.scenario_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # even within the clock's resolution
    assert [failing(run_fake(smi.scenario_path)) for _ in range(2)] == [[0], []]


def test_sticky_faults_still_need_no_count_file(smi: Smi) -> None:
    sc = Scenario.h200()
    sc.fault(MEMORY, 999, device=0)
    smi.write(sc)
    assert [failing(run_fake(smi.scenario_path)) for _ in range(2)] == [[0], [0]]
    assert not Path(f"{smi.scenario_path}.fake-smi-counts").exists()


def test_a_transient_nvidia_smi_failure_is_waited_through_and_never_clean(smi: Smi) -> None:
    sc = Scenario.h200()
    sc.fault(MEMORY, 999, device=0, count=2)  # the first two memory readings fail
    with smi.open(sc) as gpus:
        result = gpus.wait_until_clean(timeout=30, trace=True, stable_polls=1)
    assert result.trace is not None
    first, last = result.trace[0], result.trace[-1]
    # The failed reading is a failure of that GPU, never clean; the wait goes on and confirms clean once it answers.
    assert first.clean is False and first.failures == 1 and first.devices == ()
    assert last.clean is True and last.devices == (0,) and last.used_bytes == (0,)
    memory = result.snapshot.devices[0].memory
    assert result.polls >= 2 and memory is not None and memory.used_bytes == 0


def test_a_timeline_fault_holds_once_it_is_due(smi: Smi) -> None:
    # `at ms=T fault ...` was ignored by the fake (the stub plays it): due at once here, and never due in the test.
    sc = Scenario.h200(2)
    sc.at_ms(0).fault(MEMORY, 999, device=0, count=1)
    sc.at_ms(10**9).fault(MEMORY, 999, device=1)
    smi.write(sc)
    assert [failing(run_fake(smi.scenario_path)) for _ in range(2)] == [[0], []]


def test_each_simulation_of_a_scenario_file_starts_its_faults_afresh(tmp_path: Path) -> None:
    # As the stub's counts restart at each process's nvmlInit: `nvmlcheck --simulate FILE --backend smi` run twice
    # on one file found the faults spent by the first command.
    import sys

    import nvmlcheck as nc
    from nvmlcheck._sim.session import FAKE_SMI_COUNTS_SUFFIX
    from nvmlcheck.testing import stub_source_dir, use_stub

    sc = Scenario.h200()
    sc.fault(MEMORY, 999, device=0, count=1)
    path = sc.write(tmp_path / "scenario.txt")
    fake = [sys.executable, "-S", str(stub_source_dir() / "fake_nvidia_smi.py")]
    for _ in range(2):
        with use_stub(path), nc.open("smi", smi_command=fake) as gpus:
            result = gpus.wait_until_clean(timeout=30, trace=True, stable_polls=1)
        assert result.trace is not None and result.trace[0].failures == 1
        assert not Path(f"{path}{FAKE_SMI_COUNTS_SUFFIX}").exists()  # not left beside the user's file


def test_a_call_is_counted_only_by_the_runs_that_print_its_answer(smi: Smi) -> None:
    # Every --query-gpu counted a call of nvmlDeviceGetMigMode, so a run that never printed mig.mode.current spent
    # the fault and the run that printed it read the mode as if the call had answered.
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetMigMode", 999, device=0, count=1)
    smi.write(sc)
    assert run_fake(smi.scenario_path) == ["0, 0, 143156"]  # no mig.mode.current: no call of it
    env = {**os.environ, "NVMLCHECK_STUB_SCENARIO": str(smi.scenario_path)}
    mode = ["--query-gpu=index,mig.mode.current", "--format=csv,noheader,nounits"]
    runs = [subprocess.run([*FAKE_SMI_CMD, *mode], env=env, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs == ["0, [Unknown Error]\n", "0, Disabled\n"]
