"""An MPS control daemon of the study's own (holder ``mps``): started in a private pipe directory, so that only the
study's holders (which get ``CUDA_MPS_PIPE_DIRECTORY``) become its clients and every other CUDA process on the host
runs as before; stopped with ``quit`` when the study ends. :func:`mps_unavailable` says why none can be started.
The MPS server the daemon starts for the first client stays up between runs, so a study primes it first and
counts it as part of the baseline (docs/study-records.md, "MPS")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .errors import StudySkipped
from .holdkinds import MPS_PIPE_ENV

__all__ = ["CONTROL", "MpsDaemon", "mps_unavailable"]

#: The control program (it ships with the driver's compute utilities).
CONTROL = "nvidia-cuda-mps-control"
_LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"


def mps_unavailable(control: str = CONTROL) -> str | None:
    """Why no MPS daemon can be started here (``None``: the control program is on ``PATH``)."""
    if shutil.which(control) is None:
        return (f"{control} is not on PATH, so no MPS daemon can be started on this host (it ships with the "
                f"driver's compute utilities, e.g. the nvidia-compute-utils package)")
    return None


class MpsDaemon:
    """One control daemon in a temporary pipe directory. :meth:`start` raises :class:`StudySkipped` when it cannot
    be started; :meth:`stop` (also on leaving a ``with`` block) asks it to quit and waits ``timeout_s``."""

    def __init__(self, *, control: str = CONTROL, timeout_s: float = 10.0) -> None:
        self.control = control
        self.timeout_s = timeout_s
        self.directory: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        """The variables that make a process a client of this daemon (empty before :meth:`start`)."""
        if self.directory is None:
            return {}
        return {MPS_PIPE_ENV: str(self.directory / "pipe"), _LOG_ENV: str(self.directory / "log")}

    @property
    def control_pipe(self) -> Path | None:
        """The daemon's control pipe (it exists while the daemon runs)."""
        return None if self.directory is None else self.directory / "pipe" / "control"

    def start(self) -> None:
        """Start the daemon (``-d``: it detaches) and wait for its control pipe."""
        reason = mps_unavailable(self.control)
        if reason is not None:
            raise StudySkipped(reason)
        self.directory = Path(tempfile.mkdtemp(prefix="nvmlcheck-mps-"))
        for sub in ("pipe", "log"):
            (self.directory / sub).mkdir()
        try:
            done = subprocess.run([self.control, "-d"], env={**os.environ, **self.env}, capture_output=True,
                                  timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self._remove()
            raise StudySkipped(f"{self.control} -d could not be run: {exc}") from None
        if done.returncode != 0:
            text = (done.stderr or done.stdout).decode(errors="replace").strip() or "(no output)"
            self._remove()
            raise StudySkipped(f"{self.control} -d failed (exit status {done.returncode}): {text}")
        if not self._wait(lambda: self.control_pipe is not None and self.control_pipe.exists()):
            self.stop()
            raise StudySkipped(f"the MPS daemon made no control pipe within {self.timeout_s:g} s")

    def command(self, text: str) -> str:
        """Send one command (``get_server_list``, ``quit``) to the daemon and return its answer."""
        done = subprocess.run([self.control], input=(text.rstrip("\n") + "\n").encode(), capture_output=True,
                              env={**os.environ, **self.env}, timeout=self.timeout_s, check=False)
        return done.stdout.decode(errors="replace")

    def server_pids(self) -> frozenset[int]:
        """The PIDs of the MPS servers this daemon runs (each is listed by NVML as a compute process)."""
        if self.directory is None:
            return frozenset()
        try:
            return frozenset(int(w) for w in re.findall(r"\d+", self.command("get_server_list")))
        except (OSError, subprocess.TimeoutExpired):
            return frozenset()

    def stop(self) -> str | None:
        """Ask the daemon to quit (it ends its servers) and wait for its control pipe to go; ``None`` when it went,
        else what is left (nothing is killed: this module cannot prove which process is the daemon)."""
        if self.directory is None:
            return None
        left: str | None = None
        try:
            self.command("quit")
        except (OSError, subprocess.TimeoutExpired) as exc:
            left = f"quit could not be sent: {exc}"
        if left is None and not self._wait(lambda: self.control_pipe is None or not self.control_pipe.exists()):
            left = f"the MPS daemon still had its control pipe {self.timeout_s:g} s after quit"
        if left is None:
            self._remove()
        else:
            self.directory = None  # keep the files: the daemon may still use them
        return left

    def _wait(self, ready: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if ready():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _remove(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def __enter__(self) -> MpsDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
