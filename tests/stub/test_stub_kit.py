"""The test kit as a downstream suite uses it: the fixtures follow changes a test makes to its scenario, and a stub
that cannot be built (its cache unwritable) is the kit's build error, which the fixtures turn into a skip."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import (
    BoundProcessFactory,
    LogEntry,
    Scenario,
    StubBuildError,
    StubProbe,
    StubSession,
    build_stub,
    read_call_log,
    stub_environment,
    use_stub,
)

pytestmark = pytest.mark.stub


def test_a_change_the_test_makes_to_its_scenario_reaches_the_stub(
    nvml_scenario: Scenario, nvml_stub: StubSession
) -> None:
    # nvml_stub had already written the scenario: the process added here was never seen by the stub.
    nvml_scenario.add_process(0, pid=4_123_456, used_bytes=8 << 30)
    nvml_scenario.at_call(1).set_device(0, used_bytes=1 << 20)
    nvml_scenario.driver = "535.43.02"
    with nc.open("nvml") as gpus:
        snap = gpus.snapshot()
    assert [p.pid for p in snap.device(0).processes or ()] == [4_123_456]
    assert snap.system.driver_version == "535.43.02"
    assert nvml_stub.scenario_path.read_text(encoding="utf-8") == nvml_scenario.render()


def test_after_its_test_a_scenario_writes_to_no_file(tmp_path: Path) -> None:
    scenario = Scenario.h200()
    path = tmp_path / "scenario.txt"
    scenario._keep_in(path)
    assert path.read_text(encoding="utf-8") == scenario.render()
    scenario._keep_in(None)
    scenario.add_process(0, pid=4_123_456)
    assert "4123456" not in path.read_text(encoding="utf-8")


def test_an_unwritable_build_cache_is_a_build_error_naming_it(tmp_path: Path) -> None:
    # A cache path that cannot be a directory (as a read-only one, but also for root) raised NotADirectoryError,
    # which the fixtures did not turn into a skip (nor --nvmlcheck-require-sim into a failure saying why).
    blocked = tmp_path / "cache"
    blocked.write_text("not a directory", encoding="utf-8")
    with pytest.raises(StubBuildError, match=r"cannot write the stub's build cache .*NVMLCHECK_STUB_CACHE"):
        build_stub(cache_dir=blocked)


def test_a_call_being_logged_is_left_for_the_next_read(tmp_path: Path) -> None:
    # A child process writing its line while the test reads the log: the half line made read_call_log raise.
    log = tmp_path / "calls.log"
    log.write_text("nvmlInit_v2 12 13\nnvmlDeviceGetCou", encoding="utf-8")
    assert read_call_log(log) == [LogEntry("nvmlInit_v2", 12, 13)]
    with log.open("a", encoding="utf-8") as f:
        f.write("nt_v2 12 14\n")
    assert [entry.function for entry in read_call_log(log)] == ["nvmlInit_v2", "nvmlDeviceGetCount_v2"]


@pytest.mark.parametrize("text", ["garbage\n", "nvmlInit_v2 12\n", "nvmlInit_v2 x 13\n", "nvmlInit_v2 \u00b2 1\n"])
def test_a_file_that_is_no_call_log_is_a_value_error_naming_the_line(tmp_path: Path, text: str) -> None:
    log = tmp_path / "calls.log"
    log.write_text("nvmlInit_v2 12 13\n" + text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"calls.log line 2 is not a stub call log line"):
        read_call_log(log)


@pytest.mark.parametrize(("text", "why"), [("root:x:0:0:root:/root:/bin/bash\n", "its first line must be"),
                                          ("", "it is empty")])
@pytest.mark.parametrize("command", [["hold", "--gpu", "0", "--bytes", "1GiB"], ["run"]])
def test_simulate_refuses_a_file_that_is_no_scenario_alike(
    tmp_path: Path, text: str, why: str, command: list[str]
) -> None:
    # `simulate hold` said "GPU 0 is not in the scenario (it declares GPU none)" where `run` and --simulate say
    # "not a scenario file".
    path = tmp_path / "not-a-scenario"
    path.write_text(text, encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "simulate", *command, "--scenario", str(path), "--",
                           "true"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "not a scenario file" in done.stderr and why in done.stderr, done.stderr
    assert path.read_text(encoding="utf-8") == text  # nothing added to it


def _children() -> list[int]:
    """The PIDs of this process's live children (zombies included: they were started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == os.getpid():
                    found.append(int(entry.name))
    return found


@pytest.mark.parametrize("wrong", [{"device": 5}, {"kind": "cuda"}, {"used_bytes": -1}, {"list_ms": -5},
                                   {"zombie_holds": 1}, {"argv": "sleep 30"}])
def test_a_refused_bound_process_starts_nothing(
    nvml_stub: StubSession, nvml_bound_process: BoundProcessFactory, wrong: dict[str, Any]
) -> None:
    # The child was started before the scenario refused its entry, and ran until the end of the test.
    before = _children()
    with pytest.raises((ValueError, TypeError)):
        nvml_bound_process(**wrong)
    assert _children() == before
    assert "bound=1" not in nvml_stub.scenario_path.read_text(encoding="utf-8")


@pytest.mark.parametrize("given", ["file", "tmp_dir"])
def test_a_relative_path_reaches_a_child_started_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    # The environment named the scenario (and the log) relative to the test's directory: a child started in
    # another one found no scenario, and its nvmlcheck no GPU.
    monkeypatch.chdir(tmp_path)
    scenario = Scenario.h200(devices=2)
    if given == "file":
        scenario.write("gpus.txt")
        block = use_stub("gpus.txt", tmp_dir="work")
    else:
        block = use_stub(scenario, tmp_dir="work")
    with block as stub:
        assert stub.scenario_path.is_absolute() and stub.log_path.is_absolute()
        done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--backend", "nvml", "--json", "snapshot"], cwd="/",
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)["devices"]) == 2
        assert stub.call_counts()["nvmlInit_v2"] == 1  # the child logged its calls where the test reads them
    assert stub_environment("s.txt", "lib.so", "calls.log") == {
        "NVMLCHECK_LIBNVML": str(tmp_path / "lib.so"), "NVMLCHECK_STUB_SCENARIO": str(tmp_path / "s.txt"),
        "NVMLCHECK_STUB_LOG": str(tmp_path / "calls.log")}


@pytest.mark.parametrize("how", ["cc", "CC"])
def test_a_compiler_command_line_builds_the_stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    # $CC="ccache gcc" (a command line, as make reads it) was "no C compiler found".
    argv_file = tmp_path / "argv.txt"
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$@" > {argv_file}\nexec cc "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    command_line = f"{wrapper} -DSTUB_KIT_MARK=1"
    if how == "CC":
        monkeypatch.setenv("CC", command_line)
        library = build_stub(cache_dir=tmp_path / "cache")
    else:
        library = build_stub(cache_dir=tmp_path / "cache", cc=command_line)
    assert library.is_file()
    assert argv_file.read_text(encoding="utf-8").startswith("-DSTUB_KIT_MARK=1 ")
    # Its own cache entry: the same compiler without the arguments is another build.
    assert build_stub(cache_dir=tmp_path / "cache", cc=str(wrapper)).parent != library.parent


def _fake_smi(scenario: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    from nvmlcheck.testing import stub_source_dir

    return subprocess.run(
        [sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py"), "--query-gpu=index,memory.used",
         "--format=csv,noheader,nounits"],
        env={**os.environ, "NVMLCHECK_STUB_SCENARIO": scenario}, cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False,
    )


def test_the_fake_smi_names_a_scenario_it_cannot_read(tmp_path: Path) -> None:
    # It printed a FileNotFoundError traceback.
    done = _fake_smi(str(tmp_path / "missing.txt"), tmp_path)
    assert done.returncode == 255 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == f"fake nvidia-smi: cannot read the scenario {tmp_path / 'missing.txt'}: No such file or " \
                          "directory\n"


@pytest.mark.parametrize("used", ["-5", "1_000", "+5", str(2**64), "0x", "٣"])
def test_the_fake_smi_refuses_the_numbers_the_stub_refuses(tmp_path: Path, used: str) -> None:
    # Python's int() took a sign, '_' and any size, so the smi backend read a file the NVML stub refuses.
    path = tmp_path / "s.txt"
    path.write_text(Scenario.h200().render() + f"device index=0 used={used}\n", encoding="utf-8")
    done = _fake_smi(str(path), tmp_path)
    assert done.returncode == 255, done.stdout
    assert f"line 4: used={used}: expected a non-negative decimal or 0x hex number (at most 64 bits)" in done.stderr, \
        done.stderr
    path.write_text(Scenario.h200().render() + "device index=0 used=0x10\n", encoding="utf-8")
    assert _fake_smi(str(path), tmp_path).stdout == "0, 1\n"  # 16 B: 1 MiB, rounded up as nvidia-smi does


def test_a_probe_of_a_library_that_is_not_the_stub_says_so() -> None:
    import ctypes.util

    libc = ctypes.util.find_library("c")
    assert libc is not None
    with pytest.raises(ValueError, match="is not nvmlcheck's stub libnvidia-ml"):  # was AttributeError
        StubProbe(libc)


def test_an_nvml_scenario_override_that_is_no_scenario_is_named(tmp_path: Path) -> None:
    # It failed with "'str' object has no attribute 'write'", deep in the plugin.
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "test_tool.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef nvml_scenario():\n    return 'h200'\n\n"
        "def test_it(nvml_stub):\n    pass\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "nvmlcheck.testing.pytest_plugin", "-p", "no:cacheprovider", "-q",
         "test_tool.py"],
        cwd=tmp_path, env={**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, capture_output=True, text=True,
        timeout=300, check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the nvml_scenario fixture must return a nvmlcheck.testing.Scenario, not str" in done.stdout, done.stdout


def test_use_stub_follows_changes_made_in_its_block(tmp_path: Path) -> None:
    scenario = Scenario.h200()
    with use_stub(scenario, tmp_dir=tmp_path) as stub:
        scenario.add_process(0, pid=4_123_456, used_bytes=1 << 30)  # after use_stub wrote the file
        with nc.open("nvml") as gpus:
            snap = gpus.snapshot()
    assert [p.pid for p in snap.device(0).processes or ()] == [4_123_456]
    scenario.add_process(0, pid=4_123_457)
    assert "4123457" not in stub.scenario_path.read_text(encoding="utf-8")  # the block is over: no more writes



def test_a_copy_of_a_kept_scenario_writes_to_no_file_of_the_original(tmp_path: Path) -> None:
    import copy
    import pickle

    scenario = Scenario.h200()
    path = tmp_path / "scenario.txt"
    scenario._keep_in(path)
    for other in (copy.deepcopy(scenario), pickle.loads(pickle.dumps(scenario)), copy.copy(scenario)):
        other.add_process(0, pid=4_123_456)
        assert "4123456" in other.render()
    assert path.read_text(encoding="utf-8") == scenario.render() == Scenario.h200().render()


def test_a_shallow_copy_is_a_scenario_of_its_own() -> None:
    # copy.copy shared the list of lines (and the UUID and MIG bookkeeping): a process added to the copy was the
    # original's too, and a UUID the copy took was refused to the original.
    import copy

    scenario = Scenario.h200()
    other = copy.copy(scenario)
    other.add_process(0, pid=4_123_456)
    other.set_device(0, uuid="GPU-copy", mig=True)
    other.add_mig_device(0, 0)
    assert "4123456" in other.render() and "4123456" not in scenario.render()
    assert scenario.render() == Scenario.h200().render()
    scenario.add_device(uuid="GPU-copy")  # still free in the original
    with pytest.raises(ValueError, match="not in MIG mode"):
        scenario.add_mig_device(0, 0)


def test_writing_a_scenario_to_a_directory_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    # The rename failed with "Is a directory: '<parent>/.scenario.XXXX' -> '<dir>'", the temporary file made in the
    # directory's parent first.
    target = tmp_path / "gpus"
    target.mkdir()
    with pytest.raises(IsADirectoryError, match="a scenario is written to a file, not a directory"):
        Scenario.h200().write(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus"] and not any(target.iterdir())


def test_the_fake_smi_checks_a_timeline_line_that_is_not_due_yet(tmp_path: Path) -> None:
    # The stub refuses a bad `at` line when it loads the scenario; the fake read it only once due, so until then the
    # smi backend read a scenario the NVML backend refused.
    path = tmp_path / "s.txt"
    path.write_text(Scenario.h200().render() + "at ms=3600000 device index=0 used=abc\n", encoding="utf-8")
    done = _fake_smi(str(path), tmp_path)
    assert done.returncode == 255 and "used=abc: expected a non-negative" in done.stderr, done.stdout + done.stderr
    path.write_text(Scenario.h200().render() + "at ms=3600000 device index=0 used=0x100000\n", encoding="utf-8")
    assert _fake_smi(str(path), tmp_path).stdout == "0, 0\n"  # a good line waits for its time


def test_a_scenario_the_stub_refuses_is_named_in_the_error_a_test_sees(tmp_path: Path) -> None:
    # The stub said which line it refused on its own stderr only: the test saw "nvmlInit_v2 failed: UNKNOWN".
    import nvmlcheck as nc
    from nvmlcheck.testing import use_stub

    bad = tmp_path / "bad.txt"
    bad.write_text("device index=0 total=abc\n", encoding="utf-8")
    with use_stub(str(bad)), pytest.raises(nc.NvmlError) as err:
        nc.open("nvml")
    assert "the stub says: scenario" in str(err.value) and "line 1" in str(err.value)


REFUSED_LINES = [
    ("mig device=0 index=0 total=10 used=20", "mig: used=20 exceeds total=10"),
    ("mig device=0 index=7", "mig index=7: at most 7 MIG devices a GPU"),
    ("mig device=1 index=0", "mig device=1: no such device (1 declared)"),
    ("mig device=0 index=0 remove=2", "remove=2: expected 0 or 1"),
    ("process device=1 kind=compute pid=5", "process device=1: no such device (1 declared)"),
    ("process device=0 kind=compute pid=5 remove=1 used=3", "process remove=1 takes only device, kind and pid"),
    ("process device=0 kind=compute pid=5 bound=2", "bound=2: expected 0 or 1"),
    ("process device=0 kind=compute pid=5 zombie_holds=yes", "zombie_holds=yes: expected 0 or 1"),
    ("device index=0 lost=2", "lost=2: expected 0 or 1"),
    ("device index=0 retired_pending=7", "retired_pending=7: expected 0 or 1"),
    ("at ms=999999 device index=0 mig=2", "mig=2: expected 0 or 1"),
    ("fault fn=nvmlNope code=3", "fault fn=nvmlNope: not a function this stub exports"),
    ("fault fn=nvmlErrorString code=3", "fault fn=nvmlErrorString: this function cannot fail"),
    # A MIG device handle's call: the fake took device= on it (the stub refuses it)
    ("fault fn=nvmlDeviceGetGpuInstanceId code=3 device=0",
     "fault fn=nvmlDeviceGetGpuInstanceId: device= given but the function takes no device"),
    ("fault fn=nvmlDeviceGetMemoryInfo code=0", "fault code=0: that is success"),
    ("fault fn=nvmlDeviceGetMemoryInfo code=2147483648", "code=2147483648: out of range (at most 2147483647)"),
]


# A tool author's typos: each error names the file, the line and the misspelt word, on both backends. The stub said
# only "device: index= is required" for idx=0; the fake nvidia-smi named no word for kind=, at's key or an
# unterminated quote, and no file.
TYPOS = [
    ("devce index=0", "'devce'"),
    ("device idx=0", "'idx'"),
    ("device index=0 totl=5", "'totl'"),
    ("device index=0 total=12x", "total=12x"),
    ("process device=0 kind=compte pid=5", "kind=compte"),
    ("process device=0 kind=compute pid=5 bund=1", "'bund'"),
    ("fault fn=nvmlDeviceGetMemoryInfo_v2 cod=3", "'cod'"),
    ("at cal=5 device index=0 used=1", "'cal='"),
    ("at call=5 devic index=0 used=1", "'devic'"),
    ('device index=0 name="NVIDIA H200', "'name'"),
    ("device index=0 lost=yes", "lost=yes"),
]


@pytest.mark.parametrize(("line", "word"), TYPOS)
def test_a_typo_is_named_with_its_file_and_line_by_both_backends(tmp_path: Path, line: str, word: str) -> None:
    from nvmlcheck.testing import use_stub

    path = tmp_path / "s.txt"
    path.write_text(f"nvmlcheck-stub-scenario 1\ndevice index=0\n{line}\n", encoding="utf-8")
    done = _fake_smi(str(path), tmp_path)
    assert done.returncode == 255 and f"scenario {path} line 3: " in done.stderr and word in done.stderr, done.stderr
    with use_stub(str(path)), pytest.raises(nc.NvmlError) as err:
        nc.open("nvml")
    assert f"scenario {path} line 3: " in str(err.value) and word in str(err.value), str(err.value)


@pytest.mark.parametrize(("line", "why"), REFUSED_LINES)
def test_the_fake_smi_refuses_the_lines_the_stub_refuses(tmp_path: Path, line: str, why: str) -> None:
    # The fake nvidia-smi rendered GPUs from these files while the stub refused them at nvmlInit: one file, a
    # working smi backend and a failing NVML one. Both now refuse it, naming the line and the reason alike.
    from nvmlcheck.testing import use_stub

    path = tmp_path / "s.txt"
    path.write_text(f"nvmlcheck-stub-scenario 1\ndevice index=0\n{line}\n", encoding="utf-8")
    done = _fake_smi(str(path), tmp_path)
    assert done.returncode == 255, done.stdout
    assert f"scenario {path} line 3: {why}" in done.stderr, done.stderr
    with use_stub(str(path)), pytest.raises(nc.NvmlError) as err:
        nc.open("nvml")
    assert "line 3" in str(err.value) and why in str(err.value), str(err.value)


# --- two stubs at once: one scenario per process, any number of processes (pytest-xdist's workers) -------------------


def test_a_simulation_while_a_session_holds_the_stub_is_refused_naming_both(tmp_path: Path) -> None:
    # The inner block's session shared the outer one's nvmlInit and read the outer scenario: 1 GPU where its
    # scenario has 3, silently.
    from nvmlcheck.testing import use_stub

    with use_stub(Scenario.h200(1), tmp_dir=tmp_path / "a") as outer, nc.open("nvml") as gpus:
        with pytest.raises(nc.StateError, match="initialised in this process") as err, \
                use_stub(Scenario.h200(3), tmp_dir=tmp_path / "b"):
            raise AssertionError("entered")
        assert str(outer.scenario_path) in str(err.value) and str(tmp_path / "b" / "scenario.txt") in str(err.value)
        assert len(gpus.snapshot().devices) == 1  # the outer block goes on, unchanged
        with use_stub(outer.scenario_path):  # its own file again: the scenario in force, allowed
            pass


def test_nested_simulations_are_fine_while_nothing_holds_the_stub_across_them(tmp_path: Path) -> None:
    from nvmlcheck.testing import use_stub

    with use_stub(Scenario.h200(1), tmp_dir=tmp_path / "a"):
        with use_stub(Scenario.h200(3), tmp_dir=tmp_path / "b"), nc.open("nvml") as gpus:
            assert len(gpus.snapshot().devices) == 3
        with nc.open("nvml") as gpus:  # the inner block's sessions closed: the outer scenario again
            assert len(gpus.snapshot().devices) == 1


def test_a_simulation_while_the_stub_holds_another_scenario_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the pytest plugin's fixtures leave it: the environment names a scenario and a session holds NVML.
    from nvmlcheck.testing import build_stub, use_stub

    path = Scenario.h200(1).write(tmp_path / "fixture.txt")
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(path))
    with nc.open("nvml", library_path=str(build_stub())), pytest.raises(nc.StateError, match=str(path)), \
            use_stub(Scenario.h200(3)):
        raise AssertionError("entered")
    with use_stub(Scenario.h200(3)), nc.open("nvml") as gpus:  # closed: its next nvmlInit reads the new scenario
        assert len(gpus.snapshot().devices) == 3


WORKER = """
import sys
import nvmlcheck as nc
from nvmlcheck.testing import Scenario, use_stub
count = int(sys.argv[1])
with use_stub(Scenario.h200(count)):
    seen = set()
    for _ in range(20):
        with nc.open("nvml") as gpus:
            seen.add(len(gpus.snapshot().devices))
print(sorted(seen))
"""


def test_two_processes_each_read_their_own_scenario_at_once(tmp_path: Path) -> None:
    # As two pytest-xdist workers do: each process its own stub state, environment and temporary directory.
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path) for n in (1, 3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [out.strip() for out, _ in outs] == ["[1]", "[3]"], outs
