"""pytest fixtures for testing code that uses nvmlcheck (or ``nvmlcheck`` commands) on a simulated GPU.

Registered as a ``pytest11`` entry point, so installing nvmlcheck makes the fixtures available; where plugin
autoloading is off, ``-p nvmlcheck.testing.pytest_plugin`` loads it. pytest loads this module in every run, so it
imports nothing of the simulator until a fixture is used. The fixtures, with the types to annotate them:
``nvml_scenario: Scenario`` (override it to describe other GPUs), ``nvml_scenario_path: Path``, ``nvml_stub:
StubSession`` (skips the test where the stub cannot be built; ``--nvmlcheck-require-sim`` makes that a failure),
``nvml_stub_library: Path``, ``nvml_bound_process: BoundProcessFactory`` and ``fake_nvidia_smi: Path``; each has
its own docstring, and docs/testing.md shows them at work. Environment variables are set through ``monkeypatch``:
child processes inherit them, and they are undone after the test.
"""

from __future__ import annotations

import os
import sys

import pytest

TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from .._sim.fixtures import BoundProcessFactory
    from .._sim.scenario import ProcessKindName, Scenario
    from .._sim.session import StubSession
    from ..model import ProcessKind

__all__ = ["fake_nvidia_smi", "nvml_bound_process", "nvml_scenario", "nvml_scenario_path", "nvml_stub",
           "nvml_stub_library", "pytest_addoption"]

_HINT = "nvmlcheck's simulated GPU needs a C compiler and the nvidia-nvml-dev package (pip install 'nvmlcheck[sim]')"
_REQUIRE = "nvmlcheck_require_sim"


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--nvmlcheck-require-sim`` (or ``nvmlcheck_require_sim = true`` in the ini file): a stub that cannot be built
    fails the tests that need it instead of skipping them, for the CI job that must run them."""
    parser.addoption("--nvmlcheck-require-sim", action="store_true", default=False, dest=_REQUIRE,
                     help="fail (instead of skip) the tests that need nvmlcheck's simulated GPU when the stub "
                          "libnvidia-ml cannot be built (no C compiler, no nvidia-nvml-dev)")
    parser.addini(_REQUIRE, type="bool", default=False,
                  help="as --nvmlcheck-require-sim: fail instead of skip when the stub cannot be built")


def _sim_required(config: pytest.Config) -> bool:
    return bool(config.getoption(_REQUIRE, default=False) or config.getini(_REQUIRE))


def _check_balanced(library: Path, when: str) -> None:
    from .._sim.probe import StubProbe

    if StubProbe(library).init_refcount() != 0:
        pytest.fail(f"NVML (the stub) is still initialised in this process {when}: a session was left open, and the "
                    "stub reads a new scenario only at the nvmlInit that takes its reference count from 0 to 1",
                    pytrace=False)


@pytest.fixture(scope="session")
def nvml_stub_library(pytestconfig: pytest.Config) -> Path:
    """The stub ``libnvidia-ml.so.1``, compiled once (cached across runs). Skips the test when it cannot be built;
    with ``--nvmlcheck-require-sim`` (or the ini value ``nvmlcheck_require_sim``) fails it instead."""
    from .._sim.build import StubBuildError, build_stub

    try:
        return build_stub()
    except (StubBuildError, FileNotFoundError) as exc:
        why = f"{_HINT}: {exc}"
    if _sim_required(pytestconfig):
        pytest.fail(f"{why} (--nvmlcheck-require-sim: a failure, not a skip)", pytrace=False)
    pytest.skip(why)


@pytest.fixture
def nvml_scenario() -> Scenario:
    """The scenario of the test: one idle H200. Override this fixture to describe other GPUs."""
    from .._sim.scenario import Scenario

    return Scenario.h200()


@pytest.fixture
def nvml_scenario_path(nvml_scenario: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``nvml_scenario`` written to a file, which ``$NVMLCHECK_STUB_SCENARIO`` names for the test. Changes the test
    makes to ``nvml_scenario`` are written to it as they are made (atomically), for the next ``nvmlInit`` to read."""
    from .._sim.scenario import Scenario
    from .._sim.session import ENV_SCENARIO

    if not isinstance(nvml_scenario, Scenario):  # an override returning something else failed on a missing method
        raise TypeError(f"the nvml_scenario fixture must return a nvmlcheck.testing.Scenario, not "
                        f"{type(nvml_scenario).__name__}")
    directory = tmp_path / "nvmlcheck-stub"
    directory.mkdir(exist_ok=True)
    path = directory / "scenario.txt"
    nvml_scenario._keep_in(path)
    monkeypatch.setenv(ENV_SCENARIO, str(path))
    try:
        yield path
    finally:
        nvml_scenario._keep_in(None)  # a scenario shared by several tests writes to none of their files after them


@pytest.fixture
def nvml_stub(
    nvml_stub_library: Path, nvml_scenario_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[StubSession]:
    """The simulated GPUs: ``$NVMLCHECK_LIBNVML`` names the stub, which answers from ``nvml_scenario``.

    ``nvmlcheck.open()``, the ``nvmlcheck`` command and every child process see them. The stub reads the scenario
    when NVML is initialised, so change ``nvml_scenario`` (or start ``nvml_bound_process`` children) before opening
    nvmlcheck. Fails the test when it leaves a session open (the next test would not see its own scenario).
    """
    from .._proc.devfiles import simulated_globs, simulated_stand_ins
    from .._sim.session import ENV_LIBRARY, ENV_LOG, StubSession

    log_path = nvml_scenario_path.parent / "calls.log"
    monkeypatch.setenv(ENV_LIBRARY, str(nvml_stub_library))
    monkeypatch.setenv(ENV_LOG, str(log_path))
    _check_balanced(nvml_stub_library, "before the test")
    with simulated_stand_ins(simulated_globs(nvml_scenario_path), f"the test's simulation ({nvml_scenario_path})"):
        yield StubSession(nvml_stub_library, nvml_scenario_path, log_path)
    _check_balanced(nvml_stub_library, "after the test")


@pytest.fixture
def nvml_bound_process(nvml_scenario: Scenario, nvml_scenario_path: Path) -> Iterator[BoundProcessFactory]:
    """A factory (type :class:`nvmlcheck.testing.BoundProcessFactory`): ``nvml_bound_process(device=0,
    used_bytes=16 << 30, *, kind="compute", list_ms=90, release_ms=120, zombie_holds=False, argv=None)`` starts a
    real child process (``argv``, default a Python that sleeps) and lists it on ``device`` in ``nvml_scenario``
    while it lives: after it exits, it leaves the list ``list_ms`` later and gives its memory back ``release_ms``
    later, as a driver does. The child holds the simulation's stand-ins of ``/dev/nvidia<device>`` and
    ``/dev/nvidiactl`` open (inherited descriptors, whatever ``argv`` runs), as a CUDA process holds the real ones,
    so ``holders`` and ``kill --all-on-gpu`` / ``--all-holders`` find it on the simulator. Each child leads a
    process group of its own: at the end of the test whatever is left of it (the child, and what it started: a
    shell's background job) is killed, whether the test passed, failed or was interrupted, and its entry is removed
    from ``nvml_scenario``."""
    import subprocess

    from .._proc.devfiles import SIMULATED_DEVICE_DIR
    from .._sim.session import stand_in_device_files

    device_dir = nvml_scenario_path.parent / SIMULATED_DEVICE_DIR
    children: list[tuple[subprocess.Popen[bytes], int, ProcessKind | ProcessKindName]] = []

    def start(
        device: int = 0,
        used_bytes: int = 16 << 30,
        *,
        kind: ProcessKind | ProcessKindName = "compute",
        list_ms: int = 90,
        release_ms: int = 120,
        zombie_holds: bool = False,
        argv: Sequence[str] | None = None,
    ) -> subprocess.Popen[bytes]:
        from .._sim.scenario import Scenario
        from ..errors import ArgumentTypeError
        from ..simulate import check_hold_fits

        # Every argument is checked before any process starts: a refused call leaves no child behind.
        if isinstance(argv, (str, bytes)):
            raise ArgumentTypeError(f"argv must be a sequence of arguments, e.g. ['sleep', '30'], not {argv!r}")
        rehearsal = Scenario()  # the entry, validated on a scenario of as many GPUs, with a PID that exists
        for _ in range(nvml_scenario.device_count):
            rehearsal.add_device()
        rehearsal.add_process(device, os.getpid(), kind, used_bytes, bound=True, list_ms=list_ms,
                              release_ms=release_ms, zombie_holds=zombie_holds)
        check_hold_fits(nvml_scenario.render(), device, used_bytes, "the scenario")
        command = list(argv) if argv else [sys.executable, "-S", "-c", "import time; time.sleep(3600)"]
        fds = [os.open(path, os.O_RDONLY) for path in stand_in_device_files(device_dir, device)]
        try:
            # A session (so a process group) of its own, for the clean-up to reach the child's own children too.
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, pass_fds=fds, start_new_session=True)
        finally:
            for fd in fds:
                os.close(fd)
        children.append((child, device, kind))
        # Written to nvml_scenario_path at once (atomically: a process under test may be reading it).
        nvml_scenario.add_process(device, child.pid, kind, used_bytes, bound=True, list_ms=list_ms,
                                  release_ms=release_ms, zombie_holds=zombie_holds)
        return child

    yield start
    for child, device, kind in children:
        _kill_group(child)
        child.wait()
        # Off the scenario too: one that outlives the test (an override with a wider scope) would otherwise list the
        # dead child in the next test, until list_ms after that test's nvmlInit (or for good, were its PID reused).
        nvml_scenario.remove_process(device, child.pid, kind)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group ``child`` leads: the child and its descendants that are still in the group.

    Until the child is reaped its PID (the group's id) is ours. Once reaped (the test waited for it), a group with
    members keeps the number allocated, so the group is still ours; only a live process with that PID (the number
    reused, the group gone) is someone else's, and is left alone."""
    import signal

    if child.returncode is not None and os.path.exists(f"/proc/{child.pid}"):
        return
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:  # no process of the group is left
        pass
    except PermissionError:  # not ours after all
        pass


@pytest.fixture
def fake_nvidia_smi(nvml_scenario_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An executable ``nvidia-smi``, first on ``PATH`` for the test, that renders ``nvml_scenario`` as nvidia-smi
    580 prints it (``stubs/fake_nvidia_smi.py``; its ``FAKE_SMI_*`` variables inject failures). Returns its path,
    for ``nvmlcheck.open("smi", smi_command=[str(path)])``."""
    import shlex

    from .._sim.build import stub_source_dir

    directory = nvml_scenario_path.parent / "bin"
    directory.mkdir(exist_ok=True)
    script = directory / "nvidia-smi"
    fake = stub_source_dir() / "fake_nvidia_smi.py"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -S {shlex.quote(str(fake))} "$@"\n',
                      encoding="utf-8")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ.get('PATH', '')}")
    return script
