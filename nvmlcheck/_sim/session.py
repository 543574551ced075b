"""Running the stub: build it, write the scenario, and tell the stub library and child processes where things are.

Two readers, two channels. nvmlcheck itself is told explicitly: :class:`StubSession` carries the library path,
which the CLI and the demo pass to ``session.open(library_path=...)``. The stub library (C, it reads its scenario
at ``nvmlInit``) and child processes (the fake nvidia-smi, a launch script under test) read environment variables,
so :func:`simulation` sets those. :func:`use_stub`, the public helper, also exports ``$NVMLCHECK_LIBNVML`` so that
code under test that calls ``nvmlcheck.open()`` with no arguments finds the stub.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .._proc.devfiles import SIMULATED_DEVICE_DIR, simulated_globs, simulated_stand_ins
from .build import build_stub, stub_source_dir
from .calllog import LogEntry, read_call_log
from .scenario import Scenario

__all__ = ["ENV_LIBRARY", "ENV_LOG", "ENV_SCENARIO", "FAKE_SMI_COUNTS_SUFFIX", "StubSession", "exported", "simulation",
           "stand_in_device_files", "stub_environment", "use_stub"]

ENV_LIBRARY = "NVMLCHECK_LIBNVML"  # read by nvmlcheck's NVML backend when no library_path is given: the stub only
ENV_SCENARIO = "NVMLCHECK_STUB_SCENARIO"  # read by the stub at nvmlInit, and by the fake nvidia-smi
ENV_LOG = "NVMLCHECK_STUB_LOG"  # the stub appends one line per call here
#: Beside a scenario file, where the fake nvidia-smi keeps the counts of its counted faults across its runs
#: (stubs/fake_nvidia_smi.py, which imports nothing of nvmlcheck, spells it too).
FAKE_SMI_COUNTS_SUFFIX = ".fake-smi-counts"

def _enter(scenario_path: Path, library: Path) -> None:
    """Refuse a simulation of ``scenario_path`` while the stub is initialised in this process with another scenario
    (a session still open, of an enclosing block or of the pytest plugin's fixtures): the stub reads its scenario
    only at the nvmlInit that takes its count from 0, so the new block's sessions would share that initialisation
    and read the other scenario, silently. Nested blocks are fine while nothing holds NVML across them."""
    if not _loaded(library):
        return  # not even loaded here: nothing is initialised
    from .probe import StubProbe

    if StubProbe(library).init_refcount() == 0:
        return
    current = os.environ.get(ENV_SCENARIO)
    if current and Path(current) == scenario_path:
        return  # the scenario in force already
    from ..errors import StateError

    holding = f"with {current}" if current else "(a session is open)"
    raise StateError(
        f"the stub is initialised in this process {holding}: it reads a scenario only at the nvmlInit that takes "
        f"its count from 0, so the sessions of a simulation of {scenario_path} would share that one and read its "
        "scenario. Close the sessions first (one scenario at a time per process), or run this one in a process "
        "of its own (as pytest-xdist's workers are)"
    )


def _loaded(library: Path) -> bool:
    """Whether ``library`` is mapped into this process (without loading it, or ctypes, to ask its counters)."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return True  # cannot tell: ask the library
    return os.path.realpath(library) in maps


def stub_environment(
    scenario_path: str | os.PathLike[str],
    library_path: str | os.PathLike[str],
    log_path: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """The environment variables that point nvmlcheck (and a child process) at the stub and a scenario. Paths are
    made absolute: a child started in another directory (or a test that changes directory) finds the same files."""
    env = {ENV_LIBRARY: os.path.abspath(library_path), ENV_SCENARIO: os.path.abspath(scenario_path)}
    if log_path is not None:
        env[ENV_LOG] = os.path.abspath(log_path)
    return env


@dataclass(frozen=True)
class StubSession:
    """What :func:`use_stub` yields: where the library, scenario and call log are."""

    library_path: Path
    scenario_path: Path
    log_path: Path

    @property
    def device_dir(self) -> Path:
        """Where this simulation's stand-in device files are (``dev/`` next to the scenario): files there that a
        process holds open count as NVIDIA device files for ``holders`` and ``kill`` on this simulation only."""
        return self.scenario_path.parent / SIMULATED_DEVICE_DIR

    def environment(self) -> dict[str, str]:
        """The variables a child process needs to see this stub and scenario (:func:`stub_environment`)."""
        return stub_environment(self.scenario_path, self.library_path, self.log_path)

    def fake_smi_command(self) -> list[str]:
        """The argv of the fake nvidia-smi (``stubs/fake_nvidia_smi.py``), which renders the scenario that
        ``$NVMLCHECK_STUB_SCENARIO`` names: the ``smi_command`` for ``nvmlcheck.open("smi", ...)``."""
        return [sys.executable, str(stub_source_dir() / "fake_nvidia_smi.py")]

    def calls(self) -> list[LogEntry]:
        """Every logged call so far, in order (all processes that inherited the environment)."""
        return read_call_log(self.log_path)

    def call_counts(self) -> collections.Counter[str]:
        """Calls per function name so far."""
        return collections.Counter(entry.function for entry in self.calls())


def stand_in_device_files(device_dir: str | os.PathLike[str], device: int) -> tuple[Path, Path]:
    """Create (if missing) the stand-ins of ``/dev/nvidia<device>`` and ``/dev/nvidiactl`` in ``device_dir``, for a
    process of a simulation to hold open (:attr:`StubSession.device_dir`)."""
    directory = Path(device_dir)
    directory.mkdir(parents=True, exist_ok=True)
    files = (directory / f"nvidia{device}", directory / "nvidiactl")
    for path in files:
        path.touch(exist_ok=True)
    return files


@contextlib.contextmanager
def exported(env: Mapping[str, str]) -> Iterator[None]:
    """Set ``env`` in ``os.environ`` for the block; the previous values (or their absence) come back after."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def _termination_held() -> Iterator[None]:
    """Hold SIGTERM, SIGHUP and SIGINT while a temporary directory is made and its removal registered: a signal in
    between (the CLI turns them into exceptions) would leave the directory, or tempfile's probe file, behind. A held
    signal arrives when the block ends, when the removal is registered. Main thread only (where handlers run)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def simulation(
    scenario: Scenario | str | os.PathLike[str],
    *,
    variant: Iterable[str] = (),
    tmp_dir: str | os.PathLike[str] | None = None,
    export_library: bool = False,
) -> Iterator[StubSession]:
    """Build the stub, write the scenario, and set ``$NVMLCHECK_STUB_SCENARIO`` and ``$NVMLCHECK_STUB_LOG`` (for
    the stub and child processes) while the block runs; ``export_library`` also sets ``$NVMLCHECK_LIBNVML``.

    nvmlcheck's own callers (the CLI, the demo) leave ``export_library`` off and pass
    :attr:`StubSession.library_path` to ``session.open``. Arguments as :func:`use_stub`.
    """
    library = build_stub(variant)
    with contextlib.ExitStack() as stack:
        if tmp_dir is None:
            with _termination_held():
                directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nvmlcheck-stub-")))
        else:
            directory = Path(os.path.abspath(tmp_dir))  # absolute, as the environment must be (stub_environment)
            directory.mkdir(parents=True, exist_ok=True)
        if isinstance(scenario, Scenario):
            scenario_path = directory / "scenario.txt"
        else:
            scenario_path = Path(os.path.abspath(scenario))
            if not scenario_path.is_file():
                raise FileNotFoundError(f"scenario file {scenario_path} does not exist")
        _enter(scenario_path, library)
        if isinstance(scenario, Scenario):
            # Written now and after each change made in the block, for the next nvmlInit (as the pytest fixtures do).
            stack.callback(scenario._keep_in, scenario._kept_in)
            scenario._keep_in(scenario_path)
        log_path = directory / "calls.log"
        log_path.unlink(missing_ok=True)
        # The fake nvidia-smi's fault counts start afresh with each simulation, as the stub's do with each process's
        # nvmlInit: a file used again (--simulate FILE, one command after another) must not find its faults spent.
        counts = Path(f"{scenario_path}{FAKE_SMI_COUNTS_SUFFIX}")
        counts.unlink(missing_ok=True)
        stack.callback(counts.unlink, missing_ok=True)
        stub = StubSession(library, scenario_path, log_path)
        env = stub.environment()
        if not export_library:
            del env[ENV_LIBRARY]
        with exported(env), simulated_stand_ins(simulated_globs(scenario_path), f"the simulation of {scenario_path}"):
            yield stub


@contextlib.contextmanager
def use_stub(
    scenario: Scenario | str | os.PathLike[str],
    *,
    variant: Iterable[str] = (),
    tmp_dir: str | os.PathLike[str] | None = None,
) -> Iterator[StubSession]:
    """Build the stub, write the scenario and set ``NVMLCHECK_LIBNVML``, ``NVMLCHECK_STUB_SCENARIO`` and
    ``NVMLCHECK_STUB_LOG`` in ``os.environ`` for the duration (previous values restored afterwards).

    ``scenario`` is a :class:`Scenario` (written to ``tmp_dir``, and again after each change made to it in the
    block) or the path of an existing scenario file.
    ``tmp_dir`` holds the scenario and the call log; default a temporary directory removed afterwards.

    The stub reads the scenario at every ``nvmlInit`` that takes its reference count from 0 to 1, so opening
    nvmlcheck inside the block sees it. A process that loaded the stub keeps it loaded: the library's state (call
    counts, an un-shut-down init) outlives the block. One scenario at a time per process: a block of another
    scenario while a session holds NVML on the stub (whose sessions would share that initialisation and read its
    scenario) raises :class:`~nvmlcheck.StateError`; parallel processes each have their own.
    """
    with simulation(scenario, variant=variant, tmp_dir=tmp_dir, export_library=True) as stub:
        yield stub
