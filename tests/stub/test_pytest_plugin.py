"""The pytest plugin (nvmlcheck.testing.pytest_plugin) as a tool author meets it: a test module of theirs, run by a
separate pytest with the plugin loaded by ``-p`` (plugin autoload off, so an installed entry point cannot load it
twice), its fixtures against the stub; a skip where the stub cannot be built; and a plugin load that imports none of
the simulator."""

from __future__ import annotations

import ast
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from nvmlcheck.testing import BoundProcessFactory, StubSession

pytestmark = pytest.mark.stub

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "nvmlcheck.testing.pytest_plugin"

TOOL_TESTS = '''
import subprocess
import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import BoundProcessFactory, Scenario, StubSession


def test_the_default_is_one_idle_gpu(nvml_stub: StubSession) -> None:
    with nc.open("nvml") as gpus:
        snap = gpus.snapshot()
    assert [d.index for d in snap.devices] == [0] and snap.devices[0].processes == ()
    assert nvml_stub.call_counts()["nvmlInit_v2"] == 1


class TestABusyGpu:
    @pytest.fixture
    def nvml_scenario(self) -> Scenario:
        scenario = Scenario.h200(devices=2)
        scenario.add_process(1, pid=4_123_456, used_bytes=16 << 30)
        return scenario

    def test_only_the_idle_gpu_is_clean(self, nvml_stub: StubSession) -> None:
        nc.wait_until_clean(timeout=5, devices=[0])
        with pytest.raises(nc.WaitTimeout):
            nc.wait_until_clean(timeout=0.2, devices=[1])

    def test_a_child_nvmlcheck_sees_it_too(self, nvml_stub: StubSession) -> None:
        # 2 s, not 0.2: the timeout also bounds the child's nvmlInit (half of it, at least 0.25 s), which a fresh
        # process on a loaded machine must meet for the wait to end with 1 (not clean) rather than a backend error.
        done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--devices", "1", "wait", "--timeout", "2"],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 1, done.stderr


def test_a_bound_process_frees_its_gpu_when_killed(
    nvml_stub: StubSession, nvml_bound_process: BoundProcessFactory
) -> None:
    server = nvml_bound_process(0, used_bytes=8 * nc.GIB)
    with nc.open("nvml") as gpus:
        assert [p.pid for p in gpus.snapshot().devices[0].processes or ()] == [server.pid]
        result = nc.kill_and_wait(gpus, [server.pid], timeout=10)
    assert result.pids[0].off_gpu_ns is not None and result.clean_ns is not None


def test_a_bound_process_is_a_holder_and_all_on_gpu_kills_it(
    nvml_stub: StubSession, nvml_bound_process: BoundProcessFactory
) -> None:
    # It holds the simulation's stand-in device files, as a CUDA process holds /dev/nvidia*: proven here.
    server = nvml_bound_process(0, used_bytes=8 << 30)
    bystander = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    try:
        with nc.open("nvml") as gpus:
            (holder,) = gpus.holders()
            assert holder.pid == server.pid and holder.found_by == {"nvml", "device-file"}
            selection = nc.select_kill_holders(gpus, all_holders=False)
        assert [t.pid for t in selection.targets] == [server.pid], selection.skipped
        assert any("stand-in" in note for note in selection.notes)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_child_nvmlcheck_kills_a_bound_process_with_all_on_gpu(
    nvml_stub: StubSession, nvml_bound_process: BoundProcessFactory
) -> None:
    server = nvml_bound_process(0, used_bytes=8 * nc.GIB,
                                argv=[sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "kill", "--all-on-gpu", "--yes", "--timeout", "10"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "stand-in" in done.stderr and "$NVMLCHECK_LIBNVML" in done.stderr  # the plan says whose rule
    assert server.wait(timeout=10) is not None


def test_the_fake_nvidia_smi_is_on_path(fake_nvidia_smi: Path, nvml_scenario: Scenario) -> None:
    with nc.open("smi") as gpus:
        assert gpus.snapshot().devices[0].name == "NVIDIA H200"
    out = subprocess.run(["nvidia-smi", "--version"], capture_output=True, text=True, check=True).stdout
    assert "580.159.04" in out
'''

LEFT_OPEN = '''
import nvmlcheck as nc

def test_leaves_a_session_open(nvml_stub) -> None:
    global kept
    kept = nc.open("nvml")
'''


def run_pytest(
    tmp_path: Path, module: str, *, extra_args: Sequence[str] = (), ini: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "pytest.ini").write_text("[pytest]\n" + ini, encoding="utf-8")  # rootdir here, not this repository
    (tmp_path / "test_tool.py").write_text(textwrap.dedent(module), encoding="utf-8")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("NVMLCHECK_STUB_", "PYTEST_"))}
    child_env.pop("NVMLCHECK_LIBNVML", None)
    child_env.update(PYTHONPATH=str(ROOT), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rs", *extra_args,
         "test_tool.py"],
        cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_a_tool_authors_tests_pass_with_the_fixtures(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, TOOL_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "7 passed" in done.stdout, done.stdout


def test_without_a_compiler_the_stub_fixtures_skip_and_the_fake_smi_still_works(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, TOOL_TESTS, NVMLCHECK_STUB_CACHE=str(tmp_path / "empty-cache"),
                      CC=str(tmp_path / "no-such-cc"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 6 skipped" in done.stdout and "C compiler" in done.stdout, done.stdout


def test_a_tool_authors_tests_pass_mypy_strict(tmp_path: Path) -> None:
    # The fixtures are typed (BoundProcessFactory, Scenario, StubSession, Path): a tool author's test module that
    # annotates them passes mypy --strict with no ignore.
    (tmp_path / "test_tool.py").write_text(textwrap.dedent(TOOL_TESTS), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.10", "--cache-dir", str(tmp_path / ".mypy"),
         "test_tool.py"],
        cwd=tmp_path, env=dict(os.environ, MYPYPATH=str(ROOT)), capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("how", ["option", "ini"])
def test_require_sim_fails_instead_of_skipping(tmp_path: Path, how: str) -> None:
    no_compiler = {"NVMLCHECK_STUB_CACHE": str(tmp_path / "empty-cache"), "CC": str(tmp_path / "no-such-cc")}
    if how == "option":
        done = run_pytest(tmp_path, TOOL_TESTS, extra_args=["--nvmlcheck-require-sim"], **no_compiler)
    else:
        done = run_pytest(tmp_path, TOOL_TESTS, ini="nvmlcheck_require_sim = true\n", **no_compiler)
    assert done.returncode == 1, done.stdout + done.stderr
    # Every test that needs the stub fails, naming why; the fake nvidia-smi needs no compiler and still passes.
    summary = done.stdout.strip().splitlines()[-1]
    assert "6 errors" in summary and "1 passed" in summary and "skipped" not in summary, done.stdout
    assert "--nvmlcheck-require-sim: a failure, not a skip" in done.stdout and "C compiler" in done.stdout, done.stdout


def test_a_session_left_open_fails_the_test(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, LEFT_OPEN)
    assert done.returncode == 1 and "a session was left open" in done.stdout, done.stdout


def test_loading_the_plugin_imports_none_of_the_simulator() -> None:
    code = f"import pytest, sys; before = set(sys.modules); import {PLUGIN}; print(' '.join(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         capture_output=True, text=True, check=True).stdout
    assert set(out.split()) == {"nvmlcheck", "nvmlcheck.testing", PLUGIN}


def test_the_fixture_names_do_not_clash_with_this_repositorys_fixtures() -> None:
    from nvmlcheck.testing import pytest_plugin

    ours: set[str] = set()
    for conftest in ROOT.glob("tests/**/conftest.py"):
        for node in ast.walk(ast.parse(conftest.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
                ours.add(node.name)
    assert ours and not ours & set(pytest_plugin.__all__)


def test_a_bound_process_larger_than_its_gpu_is_refused_before_it_starts(
        nvml_stub: StubSession, nvml_bound_process: BoundProcessFactory) -> None:
    # It was accepted, and the GPU then vanished from snapshots ("struct layout probably differs"), as
    # `simulate hold --bytes 500GiB` refuses it.
    with pytest.raises(ValueError, match=r"500\.0 GiB is more than GPU 0 of the scenario has \(140\.4 GiB\)"):
        nvml_bound_process(0, used_bytes=500 << 30)


LEAVES_CHILDREN = '''
import time
from pathlib import Path

def start_with_a_background_job(nvml_bound_process, name):
    # A shell that starts a job of its own and records its pid: the job is a grandchild of the test.
    script = f"sleep 300 & echo $! > {name}; wait"
    return nvml_bound_process(argv=["sh", "-c", script])

def test_fails_with_a_grandchild_running(nvml_stub, nvml_bound_process) -> None:
    start_with_a_background_job(nvml_bound_process, "failing.pid")
    while not Path("failing.pid").is_file() or not Path("failing.pid").read_text().strip():
        time.sleep(0.01)
    assert False, "on purpose"

def test_its_child_exits_and_leaves_a_job(nvml_stub, nvml_bound_process) -> None:
    child = nvml_bound_process(argv=["sh", "-c", "sleep 300 & echo $! > orphan.pid"])
    assert child.wait(timeout=30) == 0  # reaped by the test: the clean-up still finds its job
'''


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")  # killed, not yet reaped by its new parent


def test_a_bound_processs_own_children_are_killed_after_the_test(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, LEAVES_CHILDREN)
    pids = [int((tmp_path / name).read_text()) for name in ("failing.pid", "orphan.pid")]
    try:
        assert "1 failed, 1 passed" in done.stdout, done.stdout + done.stderr
        for _ in range(1000):  # SIGKILL is sent before pytest exits; the new parent reaps at its own pace
            if all(_gone(pid) for pid in pids):
                break
            time.sleep(0.01)
        assert [pid for pid in pids if not _gone(pid)] == []
    finally:
        for pid in pids:  # not to leave them behind when the clean-up failed (only while they are still the sleep)
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x00300\x00":
                    os.kill(pid, signal.SIGKILL)
