"""Holder processes: :class:`Holder` (a running process holding GPU memory, and the ways to end it), the
:class:`HolderFactory` protocol a study starts them through, and :class:`CudaHolderFactory` (real holders,
``python -m nvmlcheck.holder``)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Protocol

from .._units import format_bytes
from ..errors import ArgumentError
from .errors import HolderError

if TYPE_CHECKING:
    from .config import Ending

__all__ = ["CudaHolderFactory", "Holder", "HolderFactory"]

class Holder:
    """A running process that holds GPU memory on one device, and the ways to end it.

    ``process`` is its :class:`subprocess.Popen` (with a pipe on stdin); ``stderr`` an optional file its stderr goes
    to. The study reaps it with :func:`os.waitpid` and then sets ``process.returncode``, so do not ``wait()`` on it
    while a study runs.
    """

    def __init__(
        self, process: subprocess.Popen[bytes], device: int, nbytes: int, *, stderr: IO[bytes] | None = None,
        steps: dict[str, int] | None = None,
    ) -> None:
        self.process = process
        self.device = device
        self.nbytes = nbytes
        self.stderr = stderr
        #: The holder's own cost of each step, ns: set-up steps from its ``ready`` line, then (after it ended on a
        #: command) the ``done`` line's steps prefixed ``end.`` (for example ``end.free``).
        self.steps: dict[str, int] = dict(steps or {})

    def read_done(self) -> None:
        """After it was reaped: read what is left on its stdout and take the ``done STEP=NS ...`` line's steps (as
        ``end.STEP``). Nothing happens without a stdout pipe or a ``done`` line (a signal ended it)."""
        out = self.process.stdout
        if out is None or out.closed:
            return
        try:
            rest = out.read()  # the process is gone: this reads to end of file at once
        except (OSError, ValueError):
            return
        from .child import parse_steps

        for line in (rest or b"").decode(errors="replace").splitlines():
            words = line.split()
            if words and words[0] == "done":
                self.steps.update({f"end.{k}": v for k, v in parse_steps(words[1:]).items()})

    @property
    def pid(self) -> int:
        """The holder's PID (a host PID: what NVML lists)."""
        return self.process.pid

    def signal(self, sig: int) -> None:
        """Send ``sig``. ``os.kill`` directly: ``Popen.send_signal`` would poll, and could reap the process before
        the study's own ``waitpid`` does."""
        os.kill(self.pid, sig)

    def exit(self) -> None:
        """Tell it to exit without freeing (``exit`` on its stdin)."""
        self._tell(b"exit\n")

    def free_then_exit(self) -> None:
        """Tell it to free its memory, then exit (``free`` on its stdin)."""
        self._tell(b"free\n")

    def end(self, ending: Ending) -> None:
        """End it the given way."""
        if ending == "KILL":
            self.signal(signal.SIGKILL)
        elif ending == "TERM":
            self.signal(signal.SIGTERM)
        elif ending == "exit":
            self.exit()
        else:
            self.free_then_exit()

    def kill_quietly(self) -> None:
        """SIGKILL unless it was already reaped (clean-up after an error or a timeout)."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Close the pipes and the stderr file (after it was reaped)."""
        for stream in (self.process.stdin, self.process.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def _tell(self, command: bytes) -> None:
        stdin = self.process.stdin
        if stdin is None:
            raise HolderError(f"holder pid {self.pid} has no stdin pipe: it can only be ended by a signal")
        with contextlib.suppress(BrokenPipeError):  # already gone: nothing left to tell
            stdin.write(command)
            stdin.flush()

    def __repr__(self) -> str:
        return f"<Holder pid={self.pid} GPU {self.device} {format_bytes(self.nbytes)}>"


class HolderFactory(Protocol):
    """Starts holders for a study.

    ``start`` returns once the holder holds its memory (or, for the stub, once the scenario lists it). ``finish`` is
    called after every run with the run's holders, once they have been reaped (or killed after an error).
    """

    def start(self, device: int, nbytes: int) -> Holder:
        """Start a process holding ``nbytes`` on GPU ``device`` (NVML index); :class:`HolderError` on failure."""
        ...

    def finish(self, holders: Sequence[Holder]) -> None:
        """The run of ``holders`` is over (they are reaped)."""
        ...


class CudaHolderFactory:
    """Real holders: ``python -m nvmlcheck.holder --bytes N --device D --chunks C`` (CUDA driver API via cffi).

    ``start`` waits up to ``start_timeout_s`` for the holder's ``ready PID BYTES DEVICE`` line; a holder that exits or
    stays silent is killed and reported with its stderr. ``chunks`` splits each allocation (large sizes allocate
    faster in several pieces on some drivers). ``python`` is the interpreter (default: this one).
    """

    def __init__(
        self, *, chunks: int = 1, start_timeout_s: float = 120.0, python: str = sys.executable, kind: str = "alloc"
    ) -> None:
        from .child import HOLDER_KINDS

        if chunks < 1:
            raise ArgumentError(f"chunks must be at least 1, got {chunks}")
        if not start_timeout_s > 0:
            raise ArgumentError(f"start_timeout_s must be > 0, got {start_timeout_s!r}")
        if kind not in HOLDER_KINDS:
            raise ArgumentError(f"unknown holder kind {kind!r}: one of {', '.join(HOLDER_KINDS)}")
        self.chunks = chunks
        self.start_timeout_s = start_timeout_s
        self.python = python
        self.kind = kind

    def command(self, device: int, nbytes: int) -> list[str]:
        """The holder's argv (``chunks`` is the holder's ``--count``: allocations, contexts or streams by kind)."""
        return [self.python, "-m", "nvmlcheck.holder", "--bytes", str(nbytes), "--device", str(device),
                "--kind", self.kind, "--count", str(self.chunks)]

    def start(self, device: int, nbytes: int) -> Holder:
        """Start a holder and wait for its ``ready`` line."""
        # A file, not a pipe: a chatty holder can never block on it. Closed by Holder.close().
        err = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            proc = subprocess.Popen(self.command(device, nbytes), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err)
        except OSError as exc:
            err.close()
            raise HolderError(f"could not start the holder ({self.python} -m nvmlcheck.holder): {exc}") from exc
        holder = Holder(proc, device, nbytes, stderr=err)
        try:
            line = read_ready_line(proc, self.start_timeout_s)
            holder.steps.update(check_ready(line, proc.pid, nbytes, device))
        except HolderError as exc:
            raise self._failed(holder, str(exc)) from None
        return holder

    def finish(self, holders: Sequence[Holder]) -> None:
        """Nothing to undo for real holders."""

    def _failed(self, holder: Holder, what: str) -> HolderError:
        holder.kill_quietly()
        with contextlib.suppress(ChildProcessError):
            holder.process.wait()
        stderr = b""
        if holder.stderr is not None:
            holder.stderr.seek(0)
            stderr = holder.stderr.read()[-4000:]
        holder.close()
        text = stderr.decode(errors="replace").strip() or "(nothing on stderr)"
        return HolderError(
            f"holder for {format_bytes(holder.nbytes)} on GPU {holder.device} failed: {what} "
            f"(exit status {holder.process.returncode}); its stderr:\n{text}"
        )


def read_ready_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """The first line of ``proc``'s stdout, read without blocking past ``timeout_s``."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout_s
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while b"\n" not in data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise HolderError(f"no 'ready' line within {timeout_s:g} s")
            if not sel.select(remaining):
                continue
            chunk = os.read(fd, 4096)  # os.read: the buffered file object could block for more than one line
            if not chunk:
                raise HolderError(f"it exited before saying 'ready' (stdout: {data.decode(errors='replace')!r})")
            data += chunk
    return data.split(b"\n", 1)[0]


def check_ready(line: bytes, pid: int, nbytes: int, device: int) -> dict[str, int]:
    """Check a ``ready PID BYTES DEVICE [STEP=NS ...]`` line; return its steps."""
    from .child import parse_steps

    parts = line.decode(errors="replace").split()
    expected = ["ready", str(pid), str(nbytes), str(device)]
    if parts[:4] != expected:
        raise HolderError(f"unexpected first line {line!r} (expected {' '.join(expected)!r})")
    return parse_steps(parts[4:])
