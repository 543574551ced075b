"""Helpers shared by the reliability tests: stub and fake nvidia-smi handles, process and descriptor inventories, and
deadline-bounded polling (never a bare sleep)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario, StubProbe, stub_source_dir

GIB = 1 << 30
MIB = 1 << 20
FAKE_SMI = stub_source_dir() / "fake_nvidia_smi.py"
# -S: no site import, so each fake run starts in ~15 ms instead of ~60.
FAKE_SMI_CMD = [sys.executable, "-S", str(FAKE_SMI)]
#: Every knob of the fake nvidia-smi; fixtures clear them all.
KNOBS = (
    "FAKE_SMI_DELAY_S",
    "FAKE_SMI_HANG",
    "FAKE_SMI_CHILD_PID_FILE",
    "FAKE_SMI_EXIT",
    "FAKE_SMI_MATCH",
    "FAKE_SMI_REFUSE_FIELDS",
    "FAKE_SMI_PLACEHOLDER",
    "FAKE_SMI_LOST_STYLE",
    "FAKE_SMI_RAW_COMMAS",
    "FAKE_SMI_ARGV_LOG",
)


def sigint_default() -> None:
    """``preexec_fn`` for a child that a test interrupts with SIGINT: a background job of a non-interactive shell
    starts the suite with SIGINT ignored, the child inherits that, and nvmlcheck rightly keeps it ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll ``condition`` every 2 ms until it holds; return the seconds it took. Fails the test after ``timeout_s``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.002)
    return time.monotonic() - start


def children(pid: int | None = None) -> set[int]:
    """The live child processes of ``pid`` (default: this process), from ``/proc/<pid>/task/*/children``; zombies
    waiting to be reaped count as children until they are."""
    pid = os.getpid() if pid is None else pid
    out: set[int] = set()
    task_dir = Path(f"/proc/{pid}/task")
    for task in task_dir.iterdir():
        try:
            out.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue  # the thread ended meanwhile
    return out


def open_fds() -> set[int]:
    """The file descriptors open in this process (``/proc/self/fd``; the listing's own descriptor is left out)."""
    fds = {int(name) for name in os.listdir("/proc/self/fd")}
    return {fd for fd in fds if _is_open(fd)}


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def dead(pid: int) -> bool:
    """Gone, or a zombie: it runs no more."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


@dataclass
class Stub:
    """The stub library, its probe and the scenario file the next ``nvmlInit`` reads."""

    library: Path
    scenario_path: Path
    probe: StubProbe = field(init=False)

    def __post_init__(self) -> None:
        self.probe = StubProbe(self.library)

    def write(self, scenario: Scenario | str) -> None:
        """Write the scenario the next loading init (or re-init) reads."""
        text = scenario.render() if isinstance(scenario, Scenario) else scenario
        self.scenario_path.write_text(text, encoding="utf-8")

    def open(self, scenario: Scenario | None = None, *, init_timeout_s: float | None = None) -> nc.Session:
        """Write ``scenario`` (if given) and open an NVML session on the stub."""
        if scenario is not None:
            self.write(scenario)
        return nc.open("nvml", library_path=str(self.library), init_timeout_s=init_timeout_s)

    def balanced(self) -> bool:
        """NVML is not initialised and every successful init was shut down."""
        return self.probe.init_refcount() == 0 and self.probe.init_total() == self.probe.shutdown_total()


@dataclass
class Smi:
    """A scenario file rendered by the fake nvidia-smi, and its knobs."""

    scenario_path: Path
    tmp_path: Path
    monkeypatch: pytest.MonkeyPatch

    def write(self, scenario: Scenario) -> None:
        scenario.write(self.scenario_path)

    def knob(self, name: str, value: str) -> None:
        assert name in KNOBS, name
        self.monkeypatch.setenv(name, value)

    def open(
        self,
        scenario: Scenario | None = None,
        *,
        command: list[str] | None = None,
        prefix: list[str] | None = None,
        timeout_s: float | None = None,
    ) -> nc.Session:
        if scenario is not None:
            self.write(scenario)
        return nc.open("smi", smi_command=command or FAKE_SMI_CMD, smi_prefix=prefix, smi_timeout_s=timeout_s)

    def script(self, name: str, text: str) -> Path:
        """An executable script in the test's directory."""
        path = self.tmp_path / name
        path.write_text(text, encoding="utf-8")
        path.chmod(0o755)
        return path
