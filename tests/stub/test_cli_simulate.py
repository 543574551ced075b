"""``nvmlcheck simulate`` (run, hold, scenario) and the "simulated" marker on every simulated output, end to end: the
real command in a child process, real held processes, the stub. No test waits on a clock: a held process ends when
the test closes its stdin, and every wait has a generous timeout that only guards against a hang."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30
# A command that runs until its stdin closes, then exits 3: the test decides when it ends.
UNTIL_STDIN_CLOSES = [sys.executable, "-S", "-c", "import sys; sys.stdin.read(); sys.exit(3)"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NVMLCHECK_STUB_", "NVMLCHECK_SIMULATE")) and k != "NVMLCHECK_LIBNVML"}
    return {**env, **extra}


def nvmlcheck(
    *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], env=env or _env(), cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def gpus_file(tmp_path: Path, stub_library: Path) -> Path:
    return Scenario.h200(devices=2).write(tmp_path / "gpus.txt")


@pytest.fixture
def holding(gpus_file: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``simulate hold --gpu 1 --bytes 8GiB`` of a command that ends when its stdin closes: (hold, the held PID)."""
    hold = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "simulate", "hold", "--scenario", str(gpus_file), "--gpu", "1",
         "--bytes", "8GiB", "--list-ms", "0", "--release-ms", "0", "--", *UNTIL_STDIN_CLOSES],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
    )
    try:
        assert hold.stderr is not None
        line = hold.stderr.readline().decode()  # said once the entry is in the file
        assert "nvmlcheck: simulated: pid " in line and "holds 8.0 GiB on GPU 1" in line, line
        yield hold, int(line.split("pid ")[1].split()[0])
    finally:
        if hold.poll() is None:
            hold.kill()
        hold.wait()
        for pipe in (hold.stdin, hold.stderr):
            if pipe is not None:
                pipe.close()


def _snapshot(gpus_file: Path) -> dict[str, Any]:
    done = nvmlcheck("--simulate", str(gpus_file), "--json", "snapshot")
    assert done.returncode == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_hold_lists_a_real_process_with_its_memory_until_it_exits(
    gpus_file: Path, holding: tuple[subprocess.Popen[bytes], int]
) -> None:
    hold, pid = holding
    doc = _snapshot(gpus_file)
    assert doc["simulated"] is True
    gpu1 = doc["devices"][1]
    assert gpu1["memory"]["used_bytes"] == 8 * GIB
    assert [p["pid"] for p in gpu1["processes"]["compute"]] == [pid]
    assert doc["devices"][0]["memory"]["used_bytes"] == 0
    assert Path(f"/proc/{pid}").exists()  # a real process: `nvmlcheck kill PID` can end it

    assert hold.stdin is not None
    hold.stdin.close()  # the held command ends (exit 3): hold exits with its status, once the entry is gone
    assert hold.wait(timeout=60) == 3
    assert gpus_file.read_text().rstrip().endswith(f"pid={pid} remove=1")
    after = _snapshot(gpus_file)
    assert after["devices"][1]["memory"]["used_bytes"] == 0 and after["devices"][1]["processes"]["compute"] == []


def test_a_wait_started_meanwhile_sees_the_simulated_reclaim(
    gpus_file: Path, holding: tuple[subprocess.Popen[bytes], int]
) -> None:
    hold, _ = holding
    waiter = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "--simulate", str(gpus_file), "--devices", "1", "--json", "wait",
         "--timeout", "60"],
        stdout=subprocess.PIPE, text=True, env=_env(),
    )
    try:
        assert hold.stdin is not None
        hold.stdin.close()
        out, _ = waiter.communicate(timeout=90)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        waiter.wait()
    assert waiter.returncode == 0
    doc = json.loads(out)
    assert doc["clean"] is True and doc["simulated"] is True
    assert hold.wait(timeout=60) == 3


def test_kill_all_on_gpu_finds_and_ends_a_held_process(
    gpus_file: Path, holding: tuple[subprocess.Popen[bytes], int]
) -> None:
    # The held process keeps the simulation's stand-in device files open (dev/ beside the scenario), as a CUDA process
    # keeps /dev/nvidia*: holders and kill --all-on-gpu find it as they would a real one.
    hold, pid = holding
    holders = nvmlcheck("--simulate", str(gpus_file), "--json", "holders")
    (holder,) = json.loads(holders.stdout)["holders"]
    assert holder["pid"] == pid and sorted(holder["found_by"]) == ["device-file", "nvml"]
    done = nvmlcheck("--simulate", str(gpus_file), "--devices", "1", "kill", "--all-on-gpu", "--yes", "--timeout", "30")
    assert done.returncode == 0, done.stderr
    assert hold.wait(timeout=60) == 128 + signal.SIGTERM  # its command, ended by the kill's SIGTERM


def test_hold_passes_sigterm_on_and_removes_its_entry(gpus_file: Path) -> None:
    hold = subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "simulate", "hold", "--scenario", str(gpus_file), "--gpu", "0",
         "--bytes", "1GiB", "--", sys.executable, "-S", "-c", "import time; time.sleep(600)"],
        stderr=subprocess.PIPE, env=_env(),
    )
    try:
        assert hold.stderr is not None
        line = hold.stderr.readline().decode()
        pid = int(line.split("pid ")[1].split()[0])
        hold.send_signal(signal.SIGTERM)
        assert hold.wait(timeout=60) == 128 + signal.SIGTERM  # the held command's status: ended by the SIGTERM
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        assert gpus_file.read_text().rstrip().endswith(f"pid={pid} remove=1")
    finally:
        if hold.poll() is None:
            hold.kill()
        hold.wait()
        if hold.stderr is not None:
            hold.stderr.close()


def test_a_refused_hold_starts_nothing(gpus_file: Path, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    for options in (["--scenario", str(gpus_file), "--gpu", "5"], ["--scenario", "h200", "--gpu", "0"],
                    ["--scenario", str(tmp_path / "missing.txt"), "--gpu", "0"], ["--gpu", "0"]):
        done = nvmlcheck("simulate", "hold", *options, "--bytes", "1GiB", "--", "touch", str(marker))
        assert done.returncode == 2, (options, done.stderr)
        assert "nvmlcheck: error:" in done.stderr
        assert not marker.exists(), options
    assert "declares GPU 0, 1" in nvmlcheck("simulate", "hold", "--scenario", str(gpus_file), "--gpu", "5",
                                            "--bytes", "1GiB", "--", "true").stderr
    # More than the GPU has: the stub would report used > total, read as a misread struct ("UNREADABLE").
    done = nvmlcheck("simulate", "hold", "--scenario", str(gpus_file), "--gpu", "0", "--bytes", "1000TiB", "--",
                     "touch", str(marker))
    assert done.returncode == 2 and "is more than GPU 0" in done.stderr and not marker.exists()


def test_run_gives_its_command_the_simulation(tmp_path: Path, stub_library: Path) -> None:
    script = (
        "nvmlcheck --json snapshot && "  # the run's own nvmlcheck, first on the command's PATH
        f"{sys.executable} -c 'import nvmlcheck as nc; s = nc.open(\"nvml\"); print(len(s.snapshot().devices)); "
        "s.close()' && exit 7"
    )
    done = nvmlcheck("simulate", "run", "--scenario", "h200-busy", "--", "sh", "-c", script)
    assert done.returncode == 7, done.stderr
    doc_text, _, rest = done.stdout.partition("\n}\n")
    doc = json.loads(doc_text + "\n}")
    assert doc["simulated"] is True and doc["devices"][0]["memory"]["used_bytes"] == 16 * GIB
    assert rest.strip() == "1"  # Python code in the command sees the simulated GPU through nvmlcheck.open()
    assert "simulated GPUs for sh: scenario h200-busy" in done.stderr


def test_hold_inside_run_changes_the_runs_scenario(tmp_path: Path, stub_library: Path) -> None:
    # The run's `nvmlcheck` (first on its PATH) passes --simulate FILE: hold adds to that file, and the snapshot
    # held reads it.
    script = "nvmlcheck simulate hold --gpu 0 --bytes 2GiB -- nvmlcheck --json snapshot"
    done = nvmlcheck("simulate", "run", "--scenario", "h200", "--", "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    # The held command is the snapshot itself: it sees itself on GPU 0 with 2 GiB.
    assert doc["devices"][0]["memory"]["used_bytes"] == 2 * GIB


def test_simulate_takes_no_global_gpu_options(stub_library: Path) -> None:
    done = nvmlcheck("--backend", "smi", "simulate", "run", "--", "true")
    assert done.returncode == 2 and "takes no --backend" in done.stderr
    # --simulate is its scenario (what the run's own `nvmlcheck` passes to a nested simulate command).
    done = nvmlcheck("--simulate", "h200x8", "simulate", "run", "--", "sh", "-c", "nvmlcheck --json snapshot")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["devices"]) == 8


def test_scenario_prints_a_bundled_scenario(tmp_path: Path) -> None:
    from nvmlcheck.simulate import SCENARIOS

    for name in SCENARIOS:  # the parser offers exactly the bundled names
        done = nvmlcheck("simulate", "scenario", name)
        assert done.returncode == 0 and done.stdout == SCENARIOS[name]().render()
    assert nvmlcheck("simulate", "scenario", "nope").returncode == 2


def test_every_simulated_output_says_so(tmp_path: Path, stub_library: Path) -> None:
    text = nvmlcheck("--simulate", "h200", "snapshot")
    assert text.returncode == 0 and "nvmlcheck: simulated GPUs (scenario h200" in text.stderr
    as_json = nvmlcheck("--simulate", "h200", "--json", "wait", "--timeout", "5")
    doc = json.loads(as_json.stdout)
    assert list(doc)[:3] == ["schema", "version", "simulated"] and doc["simulated"] is True
    assert as_json.stderr == ""  # the document says it; stderr stays clean for tools
    error = nvmlcheck("--simulate", "h200", "--json", "wait", "--devices", "7")
    assert error.returncode == 2 and json.loads(error.stdout)["simulated"] is True
    demo = nvmlcheck("demo", "--json")
    assert demo.returncode == 0 and json.loads(demo.stdout)["simulated"] is True
    # No variable makes a production command simulated (issue 27: a test seam is never a bare variable).
    from_env = nvmlcheck("--json", "snapshot", env=_env(NVMLCHECK_SIMULATE="h200x8"))
    assert "simulated" not in json.loads(from_env.stdout)
    # The stub named directly (a test harness, the pytest fixtures) is not "simulate": no marker there.
    plain = nvmlcheck("--json", "snapshot", env=_env(NVMLCHECK_LIBNVML=str(stub_library),
                                                     NVMLCHECK_STUB_SCENARIO=str(Scenario.h200().write(
                                                         tmp_path / "s.txt"))))
    assert plain.returncode == 0 and "simulated" not in json.loads(plain.stdout)


@pytest.mark.parametrize(("text", "why"), [("root:x:0:0:root:/root:/bin/bash\n", "its first line must be"),
                                          ("", "it is empty"), ("# only a comment\n\n", "it is empty")])
def test_a_file_that_is_no_scenario_is_a_usage_error(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "not-a-scenario"
    path.write_text(text)
    done = nvmlcheck("--simulate", str(path), "wait", "--timeout", "0")
    assert done.returncode == 2 and "not a scenario file" in done.stderr and why in done.stderr, done.stderr
    assert "nvmlInit" not in done.stderr  # refused before the stub was loaded (it was exit 3 from nvmlInit)
    ok = tmp_path / "commented"
    ok.write_text("# a comment first\n\n" + Scenario.h200().render())
    assert nvmlcheck("--simulate", str(ok), "wait", "--timeout", "0").returncode == 0


@pytest.mark.parametrize("argv", [
    ["kill", "--grace", "nan", "123"], ["select", "0"], ["ready", "--need", "abc"], ["wait", "--timeout", "-1"],
])
def test_a_usage_error_on_simulated_gpus_says_simulated(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck.cli import main

    # Found by the parser, before the simulation is set up: the document says so as every other of the run would.
    code = main(["--simulate", "h200", "--json", *argv])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and doc["schema"] == "nvmlcheck/error" and doc["simulated"] is True
    code = main(["--json", *argv])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and "simulated" not in doc  # a real run's (and a later in-process run is not marked)
