"""Building the stub (cache, variants, errors), the helpers of nvmlcheck.testing that touch the environment, and
nvidia-ml-py running against the stub."""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck._nvml._ffi import ffi
from nvmlcheck.testing import (
    NVML_FUNCTIONS,
    STUB_VARIANTS,
    Scenario,
    StubBuildError,
    StubProbe,
    build_stub,
    find_nvml_header,
    stub_environment,
    stub_source_dir,
    use_stub,
)

from .conftest import SUCCESS, UNINITIALIZED, open_lib

pytestmark = pytest.mark.stub

DECLARED = sorted(dir(ffi.dlopen(None)))  # every function in nvmlcheck's cdefs.h (names only; nothing is looked up)


def exports(lib: Any, name: str) -> bool:
    """Whether a cffi library has the symbol (cffi's ABI mode raises ffi.error, not AttributeError)."""
    try:
        getattr(lib, name)
    except (AttributeError, ffi.error):
        return False
    return True


def test_cdefs_are_all_exported(stub_library: Path) -> None:
    lib = open_lib(stub_library)
    assert len(DECLARED) >= 37
    missing = [name for name in DECLARED if not exports(lib, name)]
    assert missing == []
    raw = ctypes.CDLL(str(stub_library))
    extra = ("nvmlErrorString", "nvmlInitWithFlags", "stub_call_count", "stub_init_refcount", "stub_init_total",
             "stub_shutdown_total", "stub_last_error")  # fmt: skip
    assert [name for name in (*NVML_FUNCTIONS, *extra) if not hasattr(raw, name)] == []
    assert set(DECLARED) <= set(NVML_FUNCTIONS)


@pytest.mark.parametrize("macro", sorted(STUB_VARIANTS))
def test_variant_lacks_exactly_its_symbols(stub_variants: dict[str, Path], macro: str) -> None:
    lib = open_lib(stub_variants[macro])
    raw = ctypes.CDLL(str(stub_variants[macro]))
    lacking = STUB_VARIANTS[macro]
    for name in NVML_FUNCTIONS:
        assert hasattr(raw, name) == (name not in lacking), name
        if name in DECLARED:
            assert exports(lib, name) == (name not in lacking), name
    with pytest.raises(ffi.error, match="not found"):
        getattr(lib, lacking[0])


def test_variants_are_separate_libraries(
    stub_library: Path, stub_variants: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = {stub_library, *stub_variants.values()}
    assert len(paths) == 1 + len(STUB_VARIANTS)
    scenario = Scenario.h200(devices=2).write(tmp_path / "scenario.txt")
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(scenario))
    old = open_lib(stub_variants["STUB_NO_INIT_V2"])
    full = StubProbe(stub_library)
    assert full.init_refcount() == 0
    assert old.nvmlInit() == SUCCESS  # the legacy names work in the old-driver build
    try:
        count = ffi.new("unsigned int *")
        assert old.nvmlDeviceGetCount(count) == SUCCESS and count[0] == 2
        assert StubProbe(stub_variants["STUB_NO_INIT_V2"]).init_refcount() == 1
        assert full.init_refcount() == 0  # its own state
        assert open_lib(stub_library).nvmlDeviceGetCount(count) == UNINITIALIZED
    finally:
        assert old.nvmlShutdown() == SUCCESS


def test_build_is_cached_and_keyed(tmp_path: Path) -> None:
    first = build_stub(cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    assert first.name == "libnvidia-ml.so.1"
    assert build_stub(cache_dir=tmp_path) == first
    assert first.stat().st_mtime_ns == mtime  # not rebuilt
    both = build_stub(["STUB_NO_PROC_V3", "STUB_NO_PROC_V2"], cache_dir=tmp_path)
    assert both == build_stub(("STUB_NO_PROC_V2", "STUB_NO_PROC_V3", "STUB_NO_PROC_V2"), cache_dir=tmp_path)
    assert both.parent != first.parent
    assert both.parent.name.startswith("proc_v2-proc_v3-")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.parent.name, both.parent.name])
    assert [p.name for p in first.parent.iterdir()] == ["libnvidia-ml.so.1"]  # no temporary files left


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_STUB_CACHE", str(tmp_path / "cache"))
    path = build_stub(["STUB_NO_PCI_V3"])
    assert path.is_relative_to(tmp_path / "cache")


def test_parallel_builds_do_not_race(tmp_path: Path) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        paths = list(pool.map(lambda _: build_stub(["STUB_NO_CUDA_V2"], cache_dir=tmp_path), range(3)))
    assert len(set(paths)) == 1
    assert [p.name for p in paths[0].parent.iterdir()] == ["libnvidia-ml.so.1"]
    assert exports(open_lib(paths[0]), "nvmlDeviceGetCount_v2")
    assert not exports(open_lib(paths[0]), "nvmlSystemGetCudaDriverVersion_v2")


def test_unknown_variant(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="STUB_NO_V4"):
        build_stub(["STUB_NO_V4"], cache_dir=tmp_path)
    with pytest.raises(TypeError, match="not a string"):
        build_stub("STUB_NO_PROC_V3", cache_dir=tmp_path)


def test_missing_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StubBuildError, match=r"no C compiler found.*/nonexistent/cc"):
        build_stub(cache_dir=tmp_path, cc="/nonexistent/cc")
    monkeypatch.setenv("CC", "/nonexistent/gcc-99")
    with pytest.raises(StubBuildError, match="gcc-99"):
        build_stub(cache_dir=tmp_path)


def test_compiler_failure_carries_stderr(tmp_path: Path) -> None:
    fake = tmp_path / "fakecc"
    fake.write_text("#!/bin/sh\necho 'stub_nvml.c:1: error: the sky is falling' >&2\nexit 1\n")
    fake.chmod(0o755)
    cache = tmp_path / "cache"
    with pytest.raises(StubBuildError, match="the sky is falling"):
        build_stub(cache_dir=cache, cc=str(fake))
    leftovers = [p for p in cache.rglob("*") if p.is_file()]
    assert leftovers == []


def test_find_nvml_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_nvml_header()
    assert real.name == "nvml.h" and "nvmlDeviceGetMemoryInfo_v2" in real.read_text()
    monkeypatch.setenv("NVMLCHECK_NVML_H", str(tmp_path / "nope.h"))
    with pytest.raises(FileNotFoundError, match="NVMLCHECK_NVML_H"):
        find_nvml_header()
    monkeypatch.delenv("NVMLCHECK_NVML_H")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b")])
    with pytest.raises(FileNotFoundError, match="nvidia-nvml-dev"):
        find_nvml_header()
    for where in ("a/nvidia/cu12/include", "b/nvidia/cu13/include"):
        (tmp_path / where).mkdir(parents=True)
        (tmp_path / where / "nvml.h").write_text("/* fake */")
    assert find_nvml_header() == tmp_path / "b/nvidia/cu13/include/nvml.h"  # cu13 wins over an earlier cu12
    monkeypatch.setenv("NVMLCHECK_NVML_H", str(real))
    assert find_nvml_header() == real


def test_stub_source_dir() -> None:
    source = stub_source_dir()
    assert (source / "stub_nvml.c").is_file()
    assert (source / "README.md").is_file()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("macros", [(), tuple(STUB_VARIANTS)], ids=["full", "all-variants"])
def test_source_is_warning_free(macros: tuple[str, ...]) -> None:
    command = ["gcc", "-fsyntax-only", "-std=c11", "-Wall", "-Wextra", "-Werror", "-DNVML_NO_UNVERSIONED_FUNC_DEFS"]
    command += [f"-D{m}" for m in macros]
    command += [f"-I{find_nvml_header().parent}", str(stub_source_dir() / "stub_nvml.c")]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_stub_environment() -> None:
    assert stub_environment("/s.txt", Path("/lib/libnvidia-ml.so.1")) == {
        "NVMLCHECK_LIBNVML": "/lib/libnvidia-ml.so.1",
        "NVMLCHECK_STUB_SCENARIO": "/s.txt",
    }
    assert stub_environment(Path("/s"), "/l", Path("/log"))["NVMLCHECK_STUB_LOG"] == "/log"


def test_use_stub_sets_and_restores_the_environment(stub_library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_LIBNVML", "/previous/libnvidia-ml.so.1")
    monkeypatch.delenv("NVMLCHECK_STUB_SCENARIO", raising=False)
    monkeypatch.delenv("NVMLCHECK_STUB_LOG", raising=False)
    scenario = Scenario.h200(devices=3)
    with use_stub(scenario) as stub:
        assert stub.library_path == stub_library
        assert os.environ["NVMLCHECK_LIBNVML"] == str(stub_library)
        assert os.environ["NVMLCHECK_STUB_SCENARIO"] == str(stub.scenario_path)
        assert os.environ["NVMLCHECK_STUB_LOG"] == str(stub.log_path)
        assert stub.scenario_path.read_text() == scenario.render()
        assert stub.calls() == []
        lib = open_lib(stub.library_path)
        assert lib.nvmlInit_v2() == SUCCESS
        count = ffi.new("unsigned int *")
        assert lib.nvmlDeviceGetCount_v2(count) == SUCCESS and count[0] == 3
        assert lib.nvmlShutdown() == SUCCESS
        assert stub.call_counts() == {"nvmlInit_v2": 1, "nvmlDeviceGetCount_v2": 1, "nvmlShutdown": 1}
        assert {entry.pid for entry in stub.calls()} == {os.getpid()}
        temp = stub.scenario_path.parent
    assert not temp.exists()  # the temporary directory is gone
    assert os.environ["NVMLCHECK_LIBNVML"] == "/previous/libnvidia-ml.so.1"
    assert "NVMLCHECK_STUB_SCENARIO" not in os.environ
    assert "NVMLCHECK_STUB_LOG" not in os.environ


def test_use_stub_with_a_file_and_a_directory(tmp_path: Path) -> None:
    path = Scenario.h200().write(tmp_path / "given.txt")
    with use_stub(path, tmp_dir=tmp_path / "work", variant=["STUB_NO_MEMORY_V2"]) as stub:
        assert stub.scenario_path == path
        assert stub.log_path.parent == tmp_path / "work"
        assert not exports(open_lib(stub.library_path), "nvmlDeviceGetMemoryInfo_v2")
    assert (tmp_path / "work").is_dir()  # a directory the caller gave is kept
    with pytest.raises(FileNotFoundError), use_stub(tmp_path / "missing.txt"):
        pass


PYNVML_SCRIPT = """
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(1)
mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
print(json.dumps({
    "count": pynvml.nvmlDeviceGetCount(),
    "driver": pynvml.nvmlSystemGetDriverVersion(),
    "name": pynvml.nvmlDeviceGetName(h),
    "uuid": pynvml.nvmlDeviceGetUUID(h),
    "memory": [mem.total, mem.reserved, mem.free, mem.used],
    "procs": [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)],
    "error": pynvml.nvmlErrorString(15),
}))
pynvml.nvmlShutdown()
"""


def test_nvidia_ml_py_runs_against_the_stub(stub_library: Path, tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    scenario = Scenario.h200(devices=2)
    scenario.set_device(1, name="Second GPU", uuid="GPU-11111111-2222-3333-4444-555555555555")
    scenario.add_process(1, 4_000_001, used_bytes=2**30)
    scenario.add_process(1, 4_000_002, used_bytes=None)
    env = {
        **os.environ,
        **stub_environment(scenario.write(tmp_path / "s.txt"), stub_library),
        # pynvml dlopens "libnvidia-ml.so.1" by name: only a child process can be pointed at the stub safely
        "LD_LIBRARY_PATH": str(stub_library.parent),
    }
    out = subprocess.run([sys.executable, "-c", PYNVML_SCRIPT], env=env, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    reserved = 644_939_776
    used = 2**30
    assert json.loads(out.stdout) == {
        "count": 2,
        "driver": "580.159.04",
        "name": "Second GPU",
        "uuid": "GPU-11111111-2222-3333-4444-555555555555",
        "memory": [150_754_820_096, reserved, 150_754_820_096 - reserved - used, used],
        "procs": [[4_000_001, 2**30], [4_000_002, None]],
        "error": "GPU is lost",
    }
