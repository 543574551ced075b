"""Holder processes: :class:`Holder` (a running process holding GPU memory, and the ways to end it), the
:class:`HolderFactory` protocol a study starts them through (with :class:`HolderSpec`, what one run's holders hold,
for factories that start a run's holders as a group: ``start_group``), and :class:`CudaHolderFactory` (real holders,
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
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

from .._units import format_bytes
from ..errors import ArgumentError
from .errors import HolderError

if TYPE_CHECKING:
    from .config import Ending

__all__ = ["CudaHolderFactory", "Holder", "HolderFactory", "HolderSpec", "LineReader", "start_holders"]

#: Kinds whose holders a factory must start as a group (``start_group``): they talk to each other, or need set-up
#: the plain ``start(device, nbytes)`` cannot express.
GROUP_KINDS: tuple[str, ...] = ("pinned", "ipc", "managed", "mps", "nccl")


@dataclass(frozen=True, slots=True)
class HolderSpec:
    """What one run's holders hold on each GPU: the holder ``kind`` and its ``count``, ``nbytes`` of device memory
    per holder (the exporter's, for ``ipc``), ``pinned_bytes`` of host memory pinned the ``pin_mode`` way
    (``pinned``), ``importers`` beside each exporter and which side is ended ``first`` (``ipc``)."""

    kind: str = "alloc"
    nbytes: int = 0
    count: int = 1
    pinned_bytes: int = 0
    pin_mode: str = "alloc"
    importers: int = 0
    first: str | None = None


class Holder:
    """A running process that holds GPU memory on one device, and the ways to end it.

    ``process`` is its :class:`subprocess.Popen` (with a pipe on stdin); ``stderr`` an optional file its stderr goes
    to. The study reaps it with :func:`os.waitpid` and then sets ``process.returncode``, so do not ``wait()`` on it
    while a study runs.
    """

    def __init__(
        self, process: subprocess.Popen[bytes], device: int, nbytes: int, *, stderr: IO[bytes] | None = None,
        steps: dict[str, int] | None = None, role: str = "holder",
    ) -> None:
        self.process = process
        self.device = device
        self.nbytes = nbytes
        self.stderr = stderr
        #: Its part in the run's group (:data:`nvmlcheck.study.child.ROLES`).
        self.role = role
        #: ``KEY:VALUE`` words of its ``ready`` line (``ipc``: the exporter's handle).
        self.words: dict[str, str] = {}
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
        role = "" if self.role == "holder" else f" {self.role}"
        return f"<Holder pid={self.pid}{role} GPU {self.device} {format_bytes(self.nbytes)}>"


class HolderFactory(Protocol):
    """Starts holders for a study.

    ``start`` returns once the holder holds its memory (or, for the stub, once the scenario lists it). ``finish`` is
    called after every run with the run's holders, once they have been reaped (or killed after an error).

    Optional, found by name: ``start_group(devices, spec, per_gpu)`` starts a whole run's holders (the kinds of
    :data:`GROUP_KINDS` need it; see :func:`start_holders`); ``prepare(devices)`` is called once before the first
    run (an MPS daemon starts there; :class:`StudySkipped` says the study cannot run);
    ``baseline_pids()`` names processes of the set-up (an MPS server) that a baseline allows; ``close()`` is called
    when the study ends. The attribute ``simulated`` (a bool; with ``simulation``, what simulates them) says whether
    its holders are simulated; each record keeps it (``RunRecord.simulated``), unknown for a factory without it.
    """

    def start(self, device: int, nbytes: int) -> Holder:
        """Start a process holding ``nbytes`` on GPU ``device`` (NVML index); :class:`HolderError` on failure."""
        ...

    def finish(self, holders: Sequence[Holder]) -> None:
        """The run of ``holders`` is over (they are reaped)."""
        ...


def start_holders(factory: HolderFactory, devices: Sequence[int], spec: HolderSpec, per_gpu: int) -> list[Holder]:
    """One run's holders: ``factory.start_group`` when it has one, else ``per_gpu`` plain ``start`` calls per GPU
    (a :data:`GROUP_KINDS` kind then raises :class:`HolderError`). Either way, a failure leaves no holder running."""
    group: Any = getattr(factory, "start_group", None)
    if group is not None:
        return list(group(devices, spec, per_gpu))
    if spec.kind in GROUP_KINDS:
        raise HolderError(f"{type(factory).__name__} cannot start {spec.kind} holders (it has no start_group)")
    holders: list[Holder] = []
    try:
        for device in devices:
            for _ in range(per_gpu):
                holders.append(factory.start(device, spec.nbytes))
    except BaseException:
        _abandon(holders)
        raise
    return holders


def _abandon(holders: Sequence[Holder]) -> None:
    """Kill, reap and close holders started by a group start that failed."""
    for h in holders:
        h.kill_quietly()
    for h in holders:
        with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
            h.process.wait(10.0)
        h.close()


class CudaHolderFactory:
    """Real holders: ``python -m nvmlcheck.holder --bytes N --device D --chunks C`` (CUDA driver API via cffi).

    ``start`` waits up to ``start_timeout_s`` for the holder's ``ready PID BYTES DEVICE`` line; a holder that exits or
    stays silent is killed and reported with its stderr. ``chunks`` splits each allocation (large sizes allocate
    faster in several pieces on some drivers). ``python`` is the interpreter (default: this one).

    ``start_group`` starts a run's holders of every kind: an ``ipc`` exporter, then its importers (in parallel) with
    its handle; an ``nccl`` root, then the other ranks with its communicator id; an ``mps`` client with the
    environment of the factory's own :class:`~nvmlcheck.study.mps.MpsDaemon` (started by ``prepare``, with a
    throwaway client per GPU so that its server is up before the first baseline; stopped by ``close``).
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
        self.mps: Any = None  # the MpsDaemon of an mps study, once prepared

    #: Real CUDA holders: records say ``simulated: false``.
    simulated = False

    def command(self, device: int, nbytes: int) -> list[str]:
        """The holder's argv (``chunks`` is the holder's ``--count``: allocations, contexts or streams by kind)."""
        return [self.python, "-m", "nvmlcheck.holder", "--bytes", str(nbytes), "--device", str(device),
                "--kind", self.kind, "--count", str(self.chunks)]

    def start(self, device: int, nbytes: int) -> Holder:
        """Start a holder and wait for its ``ready`` line."""
        holder, reader = self._spawn(device, nbytes, [])
        self._ready(holder, reader)
        return holder

    def start_group(self, devices: Sequence[int], spec: HolderSpec, per_gpu: int) -> list[Holder]:
        """Start one run's holders as :class:`HolderSpec` says (see the class); all or none."""
        started: list[Holder] = []
        try:
            if spec.kind == "ipc":
                for device in devices:
                    self._ipc_group(device, spec, started)
            elif spec.kind == "nccl":
                self._nccl_group(devices, spec, started)
            else:
                extra = ["--pinned", str(spec.pinned_bytes), "--pin-mode", spec.pin_mode] if spec.kind == "pinned" \
                    else []
                role = "client" if spec.kind == "mps" else "holder"
                for device in devices:
                    for _ in range(per_gpu):
                        holder, reader = self._spawn(device, spec.nbytes, extra, role=role)
                        started.append(holder)
                        self._ready(holder, reader)
        except BaseException:
            _abandon(started)
            raise
        return started

    def _ipc_group(self, device: int, spec: HolderSpec, started: list[Holder]) -> None:
        exporter, reader = self._spawn(device, spec.nbytes, ["--role", "exporter"], role="exporter")
        started.append(exporter)
        self._ready(exporter, reader)
        handle = exporter.words.get("ipc")
        if handle is None:
            raise HolderError(f"the IPC exporter (pid {exporter.pid}) printed no ipc:HANDLE on its ready line")
        pending = []
        for _ in range(spec.importers):  # started together: their set-up overlaps
            importer, r = self._spawn(device, 0, ["--role", "importer", "--ipc-handle", handle], role="importer")
            started.append(importer)
            pending.append((importer, r))
        for importer, r in pending:
            self._ready(importer, r)

    def _nccl_group(self, devices: Sequence[int], spec: HolderSpec, started: list[Holder]) -> None:
        n = len(devices)
        root, root_reader = self._spawn(devices[0], spec.nbytes, ["--role", "root", "--rank", "0", "--nranks", str(n)],
                                        role="root")
        started.append(root)
        try:
            first = root_reader.line(self.start_timeout_s).decode(errors="replace").split()
        except HolderError as exc:
            raise self._failed(root, str(exc)) from None
        if len(first) != 2 or first[0] != "nccl-id":
            raise self._failed(root, f"expected 'nccl-id HEX' first, got {' '.join(first)!r}")
        pending = [(root, root_reader)]
        for rank, device in enumerate(devices[1:], 1):
            extra = ["--role", "rank", "--rank", str(rank), "--nranks", str(n), "--nccl-id", first[1]]
            holder, reader = self._spawn(device, spec.nbytes, extra, role="rank")
            started.append(holder)
            pending.append((holder, reader))
        for holder, reader in pending:
            self._ready(holder, reader)

    def prepare(self, devices: Sequence[int]) -> None:
        """Before the first run: for ``mps``, start the daemon and one throwaway client per GPU (its server stays up
        and becomes part of the baseline). :class:`StudySkipped` when no daemon can be started."""
        if self.kind != "mps" or self.mps is not None:
            return
        from .mps import MpsDaemon

        daemon = MpsDaemon()
        daemon.start()
        self.mps = daemon
        for device in devices:
            holder, reader = self._spawn(device, 1 << 20, [], role="client")
            self._ready(holder, reader)
            holder.exit()
            with contextlib.suppress(subprocess.TimeoutExpired):
                holder.process.wait(self.start_timeout_s)
            holder.kill_quietly()
            with contextlib.suppress(ChildProcessError):
                holder.process.wait()
            holder.close()

    def baseline_pids(self) -> frozenset[int]:
        """The MPS servers of this factory's daemon (none for other kinds)."""
        return self.mps.server_pids() if self.mps is not None else frozenset()

    def close(self) -> str | None:
        """Stop the MPS daemon, if one was started; what was left behind, or ``None``."""
        daemon, self.mps = self.mps, None
        return daemon.stop() if daemon is not None else None

    def finish(self, holders: Sequence[Holder]) -> None:
        """Nothing to undo for real holders."""

    def _spawn(self, device: int, nbytes: int, extra: list[str], *, role: str = "holder") -> tuple[Holder, LineReader]:
        # A file, not a pipe: a chatty holder can never block on it. Closed by Holder.close().
        err = tempfile.TemporaryFile()  # noqa: SIM115
        env = None if self.mps is None else {**os.environ, **self.mps.env}
        try:
            proc = subprocess.Popen(self.command(device, nbytes) + extra, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=env)
        except OSError as exc:
            err.close()
            raise HolderError(f"could not start the holder ({self.python} -m nvmlcheck.holder): {exc}") from exc
        return Holder(proc, device, nbytes, stderr=err, role=role), LineReader(proc)

    def _ready(self, holder: Holder, reader: LineReader) -> None:
        try:
            line = reader.line(self.start_timeout_s)
            holder.steps.update(check_ready(line, holder.pid, holder.nbytes, holder.device))
        except HolderError as exc:
            raise self._failed(holder, str(exc)) from None
        from .child import parse_words

        holder.words.update(parse_words(line.decode(errors="replace").split()[4:]))

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
        role = "" if holder.role == "holder" else f" ({holder.role})"
        return HolderError(
            f"holder{role} for {format_bytes(holder.nbytes)} on GPU {holder.device} failed: {what} "
            f"(exit status {holder.process.returncode}); its stderr:\n{text}"
        )


class LineReader:
    """Reads a holder's stdout line by line without blocking past a timeout, keeping what follows a line for the
    next (the NCCL root prints its id, then, much later, ``ready``)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def line(self, timeout_s: float) -> bytes:
        """The next line (without its newline); :class:`HolderError` at the timeout or the end of the output."""
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HolderError(f"no 'ready' line within {timeout_s:g} s")
                if not sel.select(remaining):
                    continue
                chunk = os.read(self.fd, 4096)  # os.read: the buffered file object could block for more than a line
                if not chunk:
                    raise HolderError(
                        f"it exited before saying 'ready' (stdout: {self.buffer.decode(errors='replace')!r})")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


def read_ready_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """The first line of ``proc``'s stdout, read without blocking past ``timeout_s``."""
    return LineReader(proc).line(timeout_s)


def check_ready(line: bytes, pid: int, nbytes: int, device: int) -> dict[str, int]:
    """Check a ``ready PID BYTES DEVICE [STEP=NS ...]`` line; return its steps."""
    from .child import parse_steps

    parts = line.decode(errors="replace").split()
    expected = ["ready", str(pid), str(nbytes), str(device)]
    if parts[:4] != expected:
        raise HolderError(f"unexpected first line {line!r} (expected {' '.join(expected)!r})")
    return parse_steps(parts[4:])
