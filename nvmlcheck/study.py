"""The reclamation timing instrument: how long after a process ends does the driver give its GPU memory back?

>>> import nvmlcheck
>>> from nvmlcheck.study import StudyConfig, run_study, summarize, format_summary
>>> config = StudyConfig(sizes=(2**30, 16 * 2**30), repeats=5, endings=("KILL", "TERM"))
>>> result = run_study(config, session_factory=lambda: nvmlcheck.open("nvml"))      # doctest: +SKIP
>>> print(format_summary(summarize(result.records)))                                # doctest: +SKIP

One run
-------
For each planned run (a size, a way to end the holder, a repeat index), on every selected GPU at once:

a. **Baseline.** A session is opened, the selected GPUs are read, and the run is refused
   (:class:`BaselineNotClean`) unless they are clean by :func:`~nvmlcheck.predicates.default_predicate` (no process
   of any kind, at most 16 MiB used; on drivers with only the v1 memory call, no process). The first run looks once;
   later runs wait up to :attr:`StudyConfig.settle_timeout_s` for the previous run's tail. The session is closed.
b. **Holders.** :meth:`HolderFactory.start` starts one holder per GPU (``python -m nvmlcheck.holder`` on real GPUs).
c. **Ready.** A *fresh* session is opened and polled (bounded by :attr:`StudyConfig.ready_timeout_s`) until every
   holder's PID is listed on its GPU and its memory is visible (used at least baseline + size).
d. **End.** One reaper thread per holder blocks in :func:`os.waitpid`; then each holder is ended (SIGKILL, SIGTERM,
   ``exit`` or ``free`` on its stdin), its signal time taken with :func:`time.monotonic_ns` just before.
e. **Observe.** The same session is polled through ``Session.snapshot(devices, fields=Fields.WAIT)`` by
   :func:`~nvmlcheck.wait.poll_until` (``"precise"``: a tight loop; ``"default"``: the DEFAULT policy) until every GPU
   is clean for ``stable_polls`` consecutive polls: memory back to its baseline + ``tolerance_bytes`` *and* the
   holder's PID off every process list. Per GPU it records the last poll still held, the first clean poll, the first
   poll with the PID off the lists, the first poll with the memory back, and when ``waitpid`` returned. A run that
   is not clean (or whose holders are not reaped) within :attr:`StudyConfig.run_timeout_s` of the signal is recorded
   with ``timed_out`` and its holders are SIGKILLed; the study goes on.

Every time is taken when a poll's query *returned*, so an event happened at that time at the latest and after the
previous poll started: the sampling period (``poll_interval_ns``, the median time between polls, and
``poll_cost_ns``, the median query time) is the uncertainty of every figure.

Holder factories and the stub
-----------------------------
A :class:`HolderFactory` starts holders and is told when a run's holders are gone (:meth:`HolderFactory.finish`).
The stub libnvidia-ml reads its scenario at every ``nvmlInit`` that takes NVML's reference count from 0 to 1, which
is why step (c) opens a fresh session after the holders started: a factory for the stub
(:class:`nvmlcheck.simulate.StubHolderFactory`) writes the scenario with the holders' real PIDs as pid-bound
processes in ``start`` and restores it in ``finish``, so that the session of the next baseline sees idle GPUs. The
contract: nothing else in the process may hold NVML initialised while a study runs on the stub.

Warm-up
-------
The default (``warmup="per_cell"``) runs one discarded warm-up before the repeats of each (size, ending) cell, and runs
the cells one after another: the first run after a change of size or ending pays for things the next ones do not
(fresh pages for a new allocation size, a GPU coming out of idle clocks). ``"once"`` runs a single warm-up at the
start; ``"none"`` runs none. Warm-up records are kept (``warmup: true``) and left out of :func:`summarize`.

Records (JSON Lines, schema ``nvmlcheck/reclaim-run`` version 1)
----------------------------------------------------------------
One JSON object per line and per run (see :class:`RunRecord`, :class:`DeviceRun`)::

    {"schema": "nvmlcheck/reclaim-run", "version": 1, "run": 0, "repeat": 0, "warmup": false,
     "size_bytes": 1073741824, "ending": "KILL", "mode": "precise", "backend": "nvml", "driver": "580.159.04",
     "nvmlcheck": "0.1.0", "wall_time": 1764412345.12, "timed_out": false, "timeout_s": 30.0,
     "timeout_reason": null, "polls": 2412, "poll_interval_ns": 41250, "poll_cost_ns": 39800,
     "poll_cost_max_ns": 412000,
     "devices": [{"index": 0, "uuid": "GPU-...", "name": "NVIDIA H200", "pid": 12345, "baseline_used_bytes": 0,
                  "held_bytes": 1610612736, "signal_ns": 0, "last_held_ns": 104100000,
                  "first_clean_ns": 104140000, "off_list_ns": 76000000, "memory_back_ns": 104140000,
                  "waitpid_ns": 123000000, "exit_status": -9}],
     "trace_columns": ["offset_ns", "used_bytes[0]", "process_count[0]"],
     "trace": [[250000, 1610612736, 1], ...]}

* ``run``: position in the study (0-based, warm-ups included); ``repeat``: index among the cell's runs of the same
  kind (warm-up or measured).
* ``signal_ns``: when this GPU's holder was ended, in ns from the run's origin (just before the first signal).
  Every other ``*_ns`` of a device is in ns *from that device's own signal*; ``null`` when not observed
  (``last_held_ns`` is ``null`` when the first poll after the signal was already clean).
* ``first_clean_ns``: first poll of the final run of clean polls (memory back *and* PID off the lists);
  ``memory_back_ns``: first poll with used memory at most baseline + tolerance; ``off_list_ns``: first poll whose
  process lists (all three kinds) no longer show the PID; ``waitpid_ns``: when ``waitpid`` returned (the PID is gone
  from the OS); ``exit_status``: :func:`os.waitstatus_to_exitcode` (negative: the signal that ended it).
* ``poll_interval_ns``/``poll_cost_ns``: median time between polls and median query time; ``poll_cost_max_ns``:
  the longest query (a driver busy reclaiming can make one block). The clean moment lies in
  (``last_held_ns`` minus that poll's query time, ``first_clean_ns``]: the pair bounds it for each run.
* ``trace`` (with ``trace=True``, else ``null``): per poll ``[offset_ns from the run origin, used_bytes per device...,
  process_count per device...]`` in the order of ``devices`` (``null`` where unknown). A poll whose values equal
  both its neighbours' is left out (lossless for a step plot; ``polls`` counts them all).

Added within version 1 (issue 18; older records read back with them ``null``/defaults):

* per device: ``zombie_ns`` (``/proc/PID/stat`` shows the leader a zombie), ``exited_ns`` (the pidfd is readable:
  every thread has exited), ``files_closed_ns`` (no thread has an NVIDIA device file open), all from the signal and
  watched by a thread of their own (:mod:`nvmlcheck._study_phases`); ``phase_resolution_ns`` (phase → the sampling
  window that ends at its time, ``null`` where there is none, as for ``waitpid``); ``unknown`` (phase → why it is
  ``null``); ``holder_steps`` (the holder's own step costs in ns: set-up steps from its ``ready`` line, ``end.*``
  from its ``done`` line). With ``per_gpu`` > 1 a GPU appears once per holder: ``off_list_ns`` and the phases are
  the holder's own, ``memory_back_ns``/``held_bytes`` the GPU's (all its holders).
* per run: ``holder`` (kind), ``holder_count``, ``per_gpu``, ``concurrent`` (``"gpus"``: every GPU's holders ended
  together; ``"none"``: this run had one GPU, the GPUs taking turns).

Within version 1 fields are only added; :func:`load_records` refuses other schemas and newer versions.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, Protocol

from ._study_phases import PROC_PHASES, PhaseWatch, ProcWatcher
from .errors import NvmlCheckError, WaitTimeout
from .model import Fields, Snapshot
from .predicates import (
    DEFAULT_TOLERANCE_BYTES,
    Predicate,
    default_predicate,
    format_bytes,
    memory_back_to,
    no_processes,
    on_devices,
    pids_gone,
)
from .wait import DEFAULT, PRECISE, TracePoint, is_transient, poll_until

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "ENDINGS",
    "MEASURES",
    "RECORD_SCHEMA",
    "RECORD_VERSION",
    "SLEEP_REFERENCE_NS",
    "BaselineNotClean",
    "Concurrency",
    "CudaHolderFactory",
    "DeviceRun",
    "Ending",
    "Holder",
    "HolderError",
    "HolderFactory",
    "PlotUnavailable",
    "RecordFormatError",
    "RunRecord",
    "Stats",
    "StudyConfig",
    "StudyError",
    "StudyProgress",
    "StudyResult",
    "SummaryRow",
    "WarmUp",
    "format_summary",
    "load_records",
    "median_run",
    "parse_ending",
    "percentile",
    "plot_run_trace",
    "plot_time_to_clean",
    "record_writer",
    "run_study",
    "summarize",
    "write_records",
]

#: The ``schema`` of a run record.
RECORD_SCHEMA = "nvmlcheck/reclaim-run"
#: The record format version this module writes (and the newest it reads).
RECORD_VERSION = 1
#: The ritual this instrument replaces: ``sleep 3 && nvidia-smi``.
SLEEP_REFERENCE_NS = 3_000_000_000

#: How a holder is ended: SIGKILL, SIGTERM, ``exit`` on its stdin (exits without freeing), ``free`` (frees, then exits).
Ending = Literal["KILL", "TERM", "exit", "free"]
#: Every ending, in the order the CLI documents them.
ENDINGS: tuple[Ending, ...] = ("KILL", "TERM", "exit", "free")
#: Warm-up policy: one discarded run per (size, ending) cell, one for the whole study, or none.
WarmUp = Literal["per_cell", "once", "none"]
#: ``"gpus"``: every selected GPU's holders end at the same instant; ``"none"``: one GPU per run, in turn.
Concurrency = Literal["gpus", "none"]

_NS = 1_000_000_000


# --- errors ---------------------------------------------------------------------------------------------------------


class StudyError(NvmlCheckError):
    """A study could not go on."""

    __module__ = "nvmlcheck"


class BaselineNotClean(StudyError):
    """The selected GPUs were not clean before a run, so its times would mean nothing. ``culprits`` says what held
    them; ``records`` holds the runs completed before (their JSON Lines were already handed to ``on_record``)."""

    __module__ = "nvmlcheck"

    def __init__(self, culprits: Sequence[str], waited_s: float, records: Sequence[RunRecord] = ()) -> None:
        self.culprits = tuple(culprits)
        self.waited_s = waited_s
        self.records = tuple(records)
        lines = "\n".join(f"  - {c}" for c in self.culprits) or "  - (no detail available)"
        waited = f" after waiting {waited_s:g} s" if waited_s > 0 else ""
        super().__init__(
            f"GPUs not clean at baseline{waited}: refusing to start a run (its times would mean nothing); "
            f"free them first (nvmlcheck snapshot procs):\n{lines}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.culprits, self.waited_s, self.records))


class HolderError(StudyError):
    """A holder process could not be started, did not become ready, or its memory never became visible."""

    __module__ = "nvmlcheck"


class RecordFormatError(ValueError):
    """A JSON Lines file that is not a valid run record file (wrong schema, newer version, bad line)."""


class PlotUnavailable(ImportError):
    """Plotting needs matplotlib: ``pip install 'nvmlcheck[plot]'``."""


def parse_ending(text: str) -> Ending:
    """``"KILL"``, ``"sigkill"``, ``"9"`` → ``"KILL"``; ``"TERM"``/``"15"`` → ``"TERM"``; ``"exit"``, ``"free"``.
    ``ValueError`` otherwise."""
    t = text.strip()
    upper = t.upper().removeprefix("SIG")
    if upper in ("KILL", str(int(signal.SIGKILL))):
        return "KILL"
    if upper in ("TERM", str(int(signal.SIGTERM))):
        return "TERM"
    if t.lower() == "exit":
        return "exit"
    if t.lower() == "free":
        return "free"
    raise ValueError(f"unknown ending {text!r}: use KILL, TERM, exit or free")


# --- holders --------------------------------------------------------------------------------------------------------


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
        from .holder import parse_steps

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
        from .holder import HOLDER_KINDS

        if chunks < 1:
            raise ValueError(f"chunks must be at least 1, got {chunks}")
        if not start_timeout_s > 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s!r}")
        if kind not in HOLDER_KINDS:
            raise ValueError(f"unknown holder kind {kind!r}: one of {', '.join(HOLDER_KINDS)}")
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
            line = _read_line(proc, self.start_timeout_s)
            holder.steps.update(_check_ready(line, proc.pid, nbytes, device))
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


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
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


def _check_ready(line: bytes, pid: int, nbytes: int, device: int) -> dict[str, int]:
    """Check a ``ready PID BYTES DEVICE [STEP=NS ...]`` line; return its steps."""
    from .holder import parse_steps

    parts = line.decode(errors="replace").split()
    expected = ["ready", str(pid), str(nbytes), str(device)]
    if parts[:4] != expected:
        raise HolderError(f"unexpected first line {line!r} (expected {' '.join(expected)!r})")
    return parse_steps(parts[4:])


# --- configuration --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyConfig:
    """What to measure.

    ``sizes``: bytes per holder (one holder per selected GPU per run). ``repeats``: measured runs per (size, ending)
    cell. ``endings``: see :data:`ENDINGS` (``parse_ending`` spellings accepted). ``devices``: NVML indices or UUIDs
    (``None``: every GPU). ``mode``: ``"precise"`` (tight polling loop, one busy core, detection within about two
    query times) or ``"default"`` (the :data:`~nvmlcheck.wait.DEFAULT` policy, ~1.5 ms). ``trace``: keep the per-poll
    trace in each record. ``warmup``: see the module docstring. ``run_timeout_s``: from the signal until every GPU
    is clean and every holder reaped. ``ready_timeout_s``: for the holders' PIDs and memory to show in NVML.
    ``settle_timeout_s``: how long a baseline after the first waits for clean GPUs before refusing.
    ``tolerance_bytes``: "memory back" means at most baseline + this. ``stable_polls``: consecutive clean polls
    that end the observation.

    ``holder``: the holder kind recorded with each run (see :mod:`nvmlcheck.holder`; the factory must start holders
    of this kind, as the default :class:`CudaHolderFactory` made from the config does), ``holder_count`` its count
    (allocations, contexts or streams). ``per_gpu``: holders on each GPU, ended together. ``concurrent``:
    ``"gpus"`` ends the holders of every selected GPU at the same instant; ``"none"`` runs each GPU alone, in turn
    (one record per GPU and planned run). ``phases``: watch the OS-side phases from ``/proc`` (zombie, whole
    process exited, device files closed) in a thread of their own; ``device_files``: the globs of the files that
    count as NVIDIA device files (``None``: ``$NVMLCHECK_DEVICE_FILES`` or the defaults). ``events``: listen for
    NVML events (:mod:`nvmlcheck.events`) during each run and keep every one in its record (``events``; where
    events cannot be had, ``events_reason`` says why); they are recorded, they do not end a run.
    """

    sizes: tuple[int, ...]
    repeats: int = 5
    endings: tuple[Ending, ...] = ("KILL", "TERM")
    devices: tuple[int | str, ...] | None = None
    mode: Literal["precise", "default"] = "precise"
    trace: bool = False
    warmup: WarmUp = "per_cell"
    run_timeout_s: float = 30.0
    ready_timeout_s: float = 60.0
    settle_timeout_s: float = 5.0
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES
    stable_polls: int = 2
    holder: str = "alloc"
    holder_count: int = 1
    per_gpu: int = 1
    concurrent: Concurrency = "gpus"
    device_files: tuple[str, ...] | None = None
    phases: bool = True
    events: bool = False

    def __post_init__(self) -> None:
        from ._proc.devfiles import device_file_patterns
        from .holder import HOLDER_KINDS

        if self.holder not in HOLDER_KINDS:
            raise ValueError(f"unknown holder kind {self.holder!r}: one of {', '.join(HOLDER_KINDS)}")
        sizes = tuple(self.sizes)
        if not sizes:
            raise ValueError("a study needs at least one size")
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ValueError(f"sizes are positive int byte counts, got {s!r}")
            # A context holds no allocation: its "size" is 0, and only its size is 0.
            if (s == 0) != (self.holder == "context"):
                raise ValueError(f"size {s}: the context holder takes size 0 only, every other holder positive sizes")
        for name in ("holder_count", "per_gpu"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.concurrent not in ("gpus", "none"):
            raise ValueError(f"concurrent must be 'gpus' or 'none', got {self.concurrent!r}")
        if self.device_files is not None:
            object.__setattr__(self, "device_files", device_file_patterns(self.device_files))
        endings = tuple(parse_ending(e) for e in self.endings)
        if not endings:
            raise ValueError("a study needs at least one ending (KILL, TERM, exit, free)")
        devices = None if self.devices is None else tuple(self.devices)
        if devices is not None and not devices:
            raise ValueError("empty device selection: name at least one GPU, or None for all")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ValueError(f"repeats must be an int >= 1, got {self.repeats!r}")
        if self.mode not in ("precise", "default"):
            raise ValueError(f"mode must be 'precise' or 'default', got {self.mode!r}")
        if self.warmup not in ("per_cell", "once", "none"):
            raise ValueError(f"warmup must be 'per_cell', 'once' or 'none', got {self.warmup!r}")
        for name in ("run_timeout_s", "ready_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if not (math.isfinite(self.settle_timeout_s) and self.settle_timeout_s >= 0):
            raise ValueError(f"settle_timeout_s must be >= 0, got {self.settle_timeout_s!r}")
        if self.tolerance_bytes < 0:
            raise ValueError(f"tolerance_bytes must be >= 0, got {self.tolerance_bytes}")
        if self.stable_polls < 1:
            raise ValueError(f"stable_polls must be >= 1, got {self.stable_polls}")
        # Frozen: normalise through object.__setattr__ (lists become tuples, endings canonical).
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "endings", endings)
        object.__setattr__(self, "devices", devices)

    def plan(self) -> list[tuple[int, Ending, int, bool]]:
        """The runs in order: ``(size, ending, repeat, warmup)``. Cells run one after another, each preceded by its
        warm-up with ``"per_cell"``; with ``"once"`` the single warm-up uses the first cell."""
        out: list[tuple[int, Ending, int, bool]] = []
        for n, (size, ending) in enumerate((s, e) for s in self.sizes for e in self.endings):
            if self.warmup == "per_cell" or (self.warmup == "once" and n == 0):
                out.append((size, ending, 0, True))
            out.extend((size, ending, r, False) for r in range(self.repeats))
        return out


# --- records --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceRun:
    """One GPU of one run. ``signal_ns`` is from the run origin; every other ``*_ns`` is from this GPU's own signal
    (``None``: not observed). See the module docstring for each field."""

    index: int
    uuid: str
    name: str | None
    pid: int
    baseline_used_bytes: int | None
    held_bytes: int | None
    signal_ns: int
    last_held_ns: int | None
    first_clean_ns: int | None
    off_list_ns: int | None
    memory_back_ns: int | None
    waitpid_ns: int | None
    exit_status: int | None
    zombie_ns: int | None = None
    exited_ns: int | None = None
    files_closed_ns: int | None = None
    # Dicts are left out of the hash (a record stays hashable, as before these fields); equality still compares them.
    phase_resolution_ns: dict[str, int | None] | None = field(default=None, hash=False)
    unknown: dict[str, str] | None = field(default=None, hash=False)
    holder_steps: dict[str, int] | None = field(default=None, hash=False)


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run: what was measured and how precisely. Serialise with :meth:`to_json` (one JSON Lines line)."""

    run: int
    repeat: int
    warmup: bool
    size_bytes: int
    ending: Ending
    mode: str
    backend: str
    driver: str | None
    nvmlcheck: str
    wall_time: float
    timed_out: bool
    timeout_s: float
    timeout_reason: str | None
    polls: int
    poll_interval_ns: int
    poll_cost_ns: int
    devices: tuple[DeviceRun, ...]
    poll_cost_max_ns: int = 0
    trace_columns: tuple[str, ...] | None = None
    trace: tuple[tuple[int | None, ...], ...] | None = None
    holder: str = "alloc"
    holder_count: int = 1
    per_gpu: int = 1
    concurrent: str = "gpus"
    #: Every NVML event seen during the run (``nvmlcheck/event`` documents), with ``StudyConfig.events``; ``None``:
    #: not listened for. Added within version 1 (issue 15).
    events: tuple[dict[str, Any], ...] | None = None
    #: Why events were not (all) heard: the listener's reason (smi backend, NOT_SUPPORTED, ...), or ``None``.
    events_reason: str | None = None

    @property
    def resolution_ns(self) -> int:
        """The sampling period: the larger of the median poll interval and the median query cost."""
        return max(self.poll_interval_ns, self.poll_cost_ns)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (schema ``nvmlcheck/reclaim-run``, version 1)."""
        body = asdict(self)
        body["devices"] = [asdict(d) for d in self.devices]
        body["trace_columns"] = None if self.trace_columns is None else list(self.trace_columns)
        body["trace"] = None if self.trace is None else [list(row) for row in self.trace]
        return {"schema": RECORD_SCHEMA, "version": RECORD_VERSION, **body}

    def to_line(self) -> str:
        """One JSON Lines line (no trailing newline)."""
        return json.dumps(self.to_json(), separators=(",", ":"))

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunRecord:
        """Read a record written by :meth:`to_json`; :class:`RecordFormatError` for another schema or version,
        ``KeyError``/``TypeError`` for a damaged one."""
        schema, version = doc.get("schema"), doc.get("version")
        if schema != RECORD_SCHEMA:
            raise RecordFormatError(f"not a reclamation run record: schema {schema!r} (expected {RECORD_SCHEMA!r})")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise RecordFormatError(f"bad record version {version!r}")
        if version > RECORD_VERSION:
            raise RecordFormatError(
                f"record version {version} is newer than this nvmlcheck reads ({RECORD_VERSION}): upgrade nvmlcheck"
            )
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in doc.items() if k in known}  # fields added later in version 1 are ignored
        device_fields = set(DeviceRun.__dataclass_fields__)
        fields["devices"] = tuple(
            DeviceRun(**{k: v for k, v in d.items() if k in device_fields}) for d in doc["devices"]
        )
        if fields.get("trace_columns") is not None:
            fields["trace_columns"] = tuple(fields["trace_columns"])
        if fields.get("trace") is not None:
            fields["trace"] = tuple(tuple(row) for row in fields["trace"])
        if fields.get("events") is not None:
            fields["events"] = tuple(fields["events"])
        fields["ending"] = parse_ending(str(fields["ending"]))
        return cls(**fields)


def write_records(records: Iterable[RunRecord], path: str | os.PathLike[str]) -> Path:
    """Write ``records`` as JSON Lines to ``path`` (replacing it) and return the path."""
    out = Path(path)
    with out.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(r.to_line() + "\n")
    return out


def load_records(path: str | os.PathLike[str]) -> list[RunRecord]:
    """Read a JSON Lines file of run records (blank lines skipped). Raises :class:`RecordFormatError` naming the file
    and line for anything that is not a version-1 ``nvmlcheck/reclaim-run`` record."""
    records: list[RunRecord] = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if not isinstance(doc, dict):
                    raise RecordFormatError(f"a record is a JSON object, not {type(doc).__name__}")
                records.append(RunRecord.from_json(doc))
            except (RecordFormatError, ValueError, KeyError, TypeError) as exc:
                what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
                raise RecordFormatError(f"{path}:{n}: {what}") from exc
    return records


# --- running --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StudyProgress:
    """Handed to ``progress`` after each run: ``done`` of ``total`` runs, and the record just made."""

    done: int
    total: int
    record: RunRecord


@dataclass(frozen=True, slots=True)
class StudyResult:
    """Every record of a study, warm-ups included, in run order."""

    config: StudyConfig
    records: tuple[RunRecord, ...]

    @property
    def measured(self) -> tuple[RunRecord, ...]:
        """The records that count (warm-ups left out)."""
        return tuple(r for r in self.records if not r.warmup)

    @property
    def timed_out(self) -> bool:
        """Whether any run (warm-ups included) timed out."""
        return any(r.timed_out for r in self.records)

    def summary(self) -> list[SummaryRow]:
        """:func:`summarize` of the records."""
        return summarize(self.records)


def run_study(
    config: StudyConfig,
    *,
    session_factory: Callable[[], Session] | None = None,
    holder_factory: HolderFactory | None = None,
    on_record: Callable[[RunRecord], object] | None = None,
    progress: Callable[[StudyProgress], object] | None = None,
) -> StudyResult:
    """Run every planned run of ``config`` (see the module docstring) and return the records.

    ``session_factory`` opens a session (default :func:`nvmlcheck.open`, backend ``"auto"``; for example
    ``lambda: nvmlcheck.open("nvml")``); it is called twice per run.
    ``holder_factory`` defaults to :class:`CudaHolderFactory`. ``on_record`` gets each record as soon as it exists
    (stream them to a file: nothing is lost if a later run fails); ``progress`` gets a :class:`StudyProgress`.

    Raises :class:`BaselineNotClean` when the GPUs are not clean before a run, :class:`HolderError` when a holder
    fails, and the backend's errors; holders are killed and reaped whatever happens.
    """
    from .session import open as open_session

    sessions: Callable[[], Session] = session_factory if session_factory is not None else open_session
    factory: HolderFactory = (holder_factory if holder_factory is not None
                              else CudaHolderFactory(kind=config.holder, chunks=config.holder_count))
    plan: list[tuple[tuple[int, Ending, int, bool], int | None]] = [(p, None) for p in config.plan()]
    if config.concurrent == "none":  # one GPU per run, in turn: each planned run once on each GPU
        with sessions() as session:
            resolved = session.resolve(config.devices)
            every = resolved if resolved is not None else tuple(range(session.device_count()))
        plan = [(p, index) for p, _ in plan for index in every]
    records: list[RunRecord] = []
    for n, (planned, only) in enumerate(plan):
        try:
            run = _Run(config, session_factory=sessions, factory=factory, number=n, planned=planned, only=only)
            record = run.execute(first=n == 0)
        except BaselineNotClean as exc:
            raise BaselineNotClean(exc.culprits, exc.waited_s, records) from None
        records.append(record)
        if on_record is not None:
            on_record(record)
        if progress is not None:
            progress(StudyProgress(n + 1, len(plan), record))
    return StudyResult(config, tuple(records))


class _Reaper(threading.Thread):
    """Blocks in ``waitpid`` on one holder: the exact moment it is gone from the OS."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(name=f"nvmlcheck-reap-{holder.pid}", daemon=True)
        self.holder = holder
        self.reaped_ns: int | None = None
        self.status: int | None = None

    def run(self) -> None:
        try:
            _, status = os.waitpid(self.holder.pid, 0)
        except ChildProcessError:
            return  # reaped elsewhere: the time is unknown
        self.reaped_ns = time.monotonic_ns()
        self.status = os.waitstatus_to_exitcode(status)
        self.holder.process.returncode = self.status  # Popen must not wait for it again


@dataclass
class _Watch:
    """What the observer has seen of one GPU so far (absolute monotonic ns)."""

    index: int
    pid: int
    memory: Predicate
    off_list: Predicate
    signal_ns: int = 0
    last_held: int | None = None
    first_clean: int | None = None
    off_list_at: int | None = None
    memory_back_at: int | None = None
    off_list_res: int | None = None
    memory_back_res: int | None = None

    def saw(self, t: int, snap: Snapshot | None, prev_start: int | None = None) -> None:
        """A poll that returned at ``t``; the previous poll started at ``prev_start`` (``None``: this is the first,
        and the window starts at the signal)."""
        if snap is None:  # a transient error: nothing known, but no clean run may span it
            self.first_clean = None
            return
        mem, off = self.memory.check(snap), self.off_list.check(snap)
        # The event lies after the previous poll read the driver, which it did after it started: the window.
        window = t - max(self.signal_ns, prev_start if prev_start is not None else self.signal_ns)
        # An unknown answer neither starts nor ends an observation; a known one that contradicts it resets it.
        if off is True and self.off_list_at is None:
            self.off_list_at, self.off_list_res = t, window
        elif off is False:
            self.off_list_at = None
        if mem is True and self.memory_back_at is None:
            self.memory_back_at, self.memory_back_res = t, window
        elif mem is False:
            self.memory_back_at = None
        if mem is False or off is False:
            self.last_held, self.first_clean = t, None
        elif mem is True and off is True:
            if self.first_clean is None:
                self.first_clean = t
        else:
            self.first_clean = None


class _Run:
    """One run, steps (a) to (e) of the module docstring. State lives in attributes so the steps stay small."""

    def __init__(
        self,
        config: StudyConfig,
        *,
        session_factory: Callable[[], Session],
        factory: HolderFactory,
        number: int,
        planned: tuple[int, Ending, int, bool],
        only: int | str | None = None,
    ) -> None:
        self.config = config
        self.only = only  # concurrent="none": this run's one GPU
        self.session_factory = session_factory
        self.factory = factory
        self.number = number
        self.size, self.ending, self.repeat, self.warmup = planned
        self.indices: tuple[int, ...] = ()
        self.holders: list[Holder] = []
        self.reapers: list[_Reaper] = []
        self.watches: list[_Watch] = []
        self.phases: list[PhaseWatch] = []

    def execute(self, *, first: bool) -> RunRecord:
        baseline = self._baseline(0.0 if first else self.config.settle_timeout_s)
        try:
            for index in self.indices:
                for _ in range(self.config.per_gpu):
                    self.holders.append(self.factory.start(index, self.size))
            with self.session_factory() as session:
                ready = self._wait_ready(session, baseline)
                self.reapers = [_Reaper(h) for h in self.holders]
                for r in self.reapers:
                    r.start()  # blocked in waitpid before any holder is ended
                return self._observe(session, baseline, ready)
        finally:
            self._clean_up()

    # (a)
    def _baseline(self, settle_s: float) -> Snapshot:
        with self.session_factory() as session:
            resolved = session.resolve(self.config.devices if self.only is None else (self.only,))
            self.indices = resolved if resolved is not None else tuple(range(session.device_count()))
            if not self.indices:
                raise StudyError(f"the {session.backend_name} backend sees no GPU: nothing to study")
            deadline = time.monotonic() + settle_s
            while True:
                snap = session.snapshot(self.indices, fields=Fields.WAIT)
                for failure in snap.failures:  # a lost or unreadable GPU is a backend error, not a dirty one
                    if not is_transient(failure.error):
                        raise failure.error
                verdict = _baseline_predicate(snap).evaluate(snap)
                if verdict.clean:
                    return snap
                if time.monotonic() >= deadline:
                    raise BaselineNotClean(verdict.reasons, settle_s)
                time.sleep(0.01)

    # (c)
    def _wait_ready(self, session: Session, baseline: Snapshot) -> Snapshot:
        deadline = time.monotonic() + self.config.ready_timeout_s
        while True:
            snap = session.snapshot(self.indices, fields=Fields.WAIT)
            missing = [m for h in self.holders if (m := _not_ready(snap, baseline, h, self._on_gpu(h))) is not None]
            if not missing:
                return snap
            if time.monotonic() >= deadline:
                raise HolderError(
                    f"holders not visible in NVML after {self.config.ready_timeout_s:g} s: " + "; ".join(missing)
                )
            time.sleep(0.002)

    def _on_gpu(self, holder: Holder) -> int:
        """Bytes all this run's holders hold on ``holder``'s GPU (several with ``per_gpu``)."""
        return sum(h.nbytes for h in self.holders if h.device == holder.device)

    # (d) and (e)
    def _observe(self, session: Session, baseline: Snapshot, ready: Snapshot) -> RunRecord:
        config, holders, indices = self.config, self.holders, self.indices
        tol = config.tolerance_bytes
        self.watches = [
            _Watch(h.device, h.pid, on_devices([h.device], memory_back_to(baseline, tol)),
                   on_devices([h.device], pids_gone([h.pid])))
            for h in holders
        ]
        condition = memory_back_to(baseline, tol) & pids_gone([h.pid for h in holders])
        polls = _Polls(self.watches, indices if config.trace else None)
        watcher = self._phase_watcher()
        # Started before the signals: registering costs a few NVML calls that must not fall inside the measurement.
        listener = session.listen() if config.events else None
        wall = time.time()
        polls.origin = time.monotonic_ns()
        for w, h in zip(self.watches, holders, strict=True):
            w.signal_ns = time.monotonic_ns()
            h.end(self.ending)
        if watcher is not None:  # after the signals: their instants stay as close together as they can be
            for pw, w in zip(self.phases, self.watches, strict=True):
                watcher.start_at(pw, w.signal_ns)
            watcher.start()
        reason: str | None = None
        deadline = polls.origin + int(config.run_timeout_s * _NS)
        try:
            try:
                poll_until(
                    lambda: session.snapshot(indices, fields=Fields.WAIT),
                    condition,
                    timeout=max(0.0, (deadline - time.monotonic_ns()) / _NS),
                    policy=PRECISE if config.mode == "precise" else DEFAULT,
                    stable_polls=config.stable_polls,
                    clock=polls.clock,
                    # This thread's CPU only: the default also counts reaped children, and reaping a holder that
                    # spent seconds of CPU in cuInit would stretch the DEFAULT interval at the very moment measured.
                    cpu_clock=time.thread_time_ns,
                    on_poll=polls.on_poll,
                )
            except WaitTimeout as exc:
                reason = "; ".join(exc.culprits) or "not clean before the run timeout"
            for r in self.reapers:
                r.join(max(0.0, (deadline - time.monotonic_ns()) / _NS))
        finally:  # a backend error too: no watcher thread or pidfd outlives its run
            if watcher is not None:
                watcher.stop()
        for r in self.reapers:
            if r.reaped_ns is not None:
                r.holder.read_done()
        unreaped = [r.holder.pid for r in self.reapers if r.reaped_ns is None]
        if unreaped and reason is None:
            reason = f"pid {', '.join(map(str, unreaped))} not reaped (waitpid) before the run timeout"
        record = self._record(wall, polls, baseline, ready, reason)
        if listener is not None:
            record = replace(
                record, events=tuple(e.to_json() for e in listener.events), events_reason=listener.reason
            )
        return record

    def _phase_watcher(self) -> ProcWatcher | None:
        """The ``/proc`` watcher for this run's holders (``None`` with ``phases=False``), each pinned by a pidfd
        while it is still alive."""
        from ._proc.devfiles import device_file_patterns

        if not self.config.phases:
            return None
        self.phases = []
        for h in self.holders:
            pinned, why = ProcWatcher.pin(h.pid)
            pw = PhaseWatch(h.pid, pinned=pinned)
            if why is not None:
                pw.unknown["exited"] = why
            self.phases.append(pw)
        interval = 0.0002 if self.config.mode == "precise" else 0.001
        return ProcWatcher(self.phases, device_file_patterns(self.config.device_files), interval_s=interval)

    def _phase_fields(self, i: int, reaped: int | None) -> dict[str, Any]:
        """The phase times, resolutions and reasons of holder ``i`` (relative to its signal)."""
        w = self.watches[i]
        res: dict[str, int | None] = {"off_list": w.off_list_res, "memory_back": w.memory_back_res,
                                      "waitpid": None}
        unknown: dict[str, str] = {}
        # waitpid blocks: its time is when the thread woke, with no sampling window to report.
        unknown["waitpid_resolution"] = "waitpid blocks until the reap: no sampling window (wake-up latency only)"
        out: dict[str, Any] = {}
        if not self.phases:
            for p in PROC_PHASES:
                out[f"{p}_ns"] = None
                res[p] = None
                unknown[p] = "phases not watched (phases=False)"
        else:
            pw = self.phases[i]
            for p in PROC_PHASES:
                at = pw.at.get(p)
                out[f"{p}_ns"] = None if at is None else at - w.signal_ns
                res[p] = pw.resolution.get(p)
                if at is None:
                    unknown[p] = pw.unknown.get(p) or "not seen before the observation ended"
        for p in ("off_list", "memory_back"):
            if getattr(w, f"{p}_at") is None:
                unknown[p] = "not seen before the observation ended"
        if reaped is None:
            unknown["waitpid"] = "not reaped before the run timeout"
        out["phase_resolution_ns"] = res
        out["unknown"] = unknown
        return out

    def _device_run(self, i: int, baseline: Snapshot, ready: Snapshot, origin: int) -> DeviceRun:
        holder, reaper, w = self.holders[i], self.reapers[i], self.watches[i]
        base = baseline.device(holder.device)
        now = ready.device(holder.device)
        base_used = base.memory.used_bytes if base.memory is not None else None
        held = now.memory.used_bytes - base_used if now.memory is not None and base_used is not None else None

        def rel(t: int | None) -> int | None:
            return None if t is None else t - w.signal_ns

        return DeviceRun(
            index=holder.device, uuid=base.uuid, name=base.name, pid=holder.pid, baseline_used_bytes=base_used,
            held_bytes=held, signal_ns=w.signal_ns - origin, last_held_ns=rel(w.last_held),
            first_clean_ns=rel(w.first_clean), off_list_ns=rel(w.off_list_at), memory_back_ns=rel(w.memory_back_at),
            waitpid_ns=rel(reaper.reaped_ns), exit_status=reaper.status,
            holder_steps=dict(holder.steps), **self._phase_fields(i, reaper.reaped_ns),
        )

    def _record(self, wall: float, polls: _Polls, baseline: Snapshot, ready: Snapshot, reason: str | None) -> RunRecord:
        from . import __version__

        devices = tuple(self._device_run(i, baseline, ready, polls.origin) for i in range(len(self.holders)))
        columns = None
        if self.config.trace:
            idx = [d.index for d in baseline.devices]
            columns = ("offset_ns", *(f"used_bytes[{i}]" for i in idx), *(f"process_count[{i}]" for i in idx))
        return RunRecord(
            run=self.number, repeat=self.repeat, warmup=self.warmup, size_bytes=self.size, ending=self.ending,
            mode=self.config.mode, backend=baseline.backend, driver=baseline.system.driver_version,
            nvmlcheck=__version__, wall_time=wall, timed_out=reason is not None, timeout_s=self.config.run_timeout_s,
            timeout_reason=reason, polls=len(polls.ends), poll_interval_ns=_median_int(polls.intervals()),
            poll_cost_ns=_median_int(polls.costs), poll_cost_max_ns=max(polls.costs, default=0), devices=devices,
            trace_columns=columns,
            trace=tuple(_compact(polls.rows)) if self.config.trace else None,
            holder=self.config.holder, holder_count=self.config.holder_count, per_gpu=self.config.per_gpu,
            concurrent=self.config.concurrent,
        )

    def _clean_up(self) -> None:
        """Whatever happened: no holder outlives its run, and none is left unreaped."""
        for h in self.holders:
            h.kill_quietly()
        for r in self.reapers:
            r.join(10.0)
        reaping = {r.holder.pid for r in self.reapers}
        for h in self.holders:
            if h.pid not in reaping and h.process.returncode is None:
                with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                    h.process.wait(10.0)
            h.close()
        if self.holders:
            self.factory.finish(self.holders)


class _Polls:
    """The observer's per-poll bookkeeping: poll times and costs, the trace, and each GPU's watch."""

    def __init__(self, watches: list[_Watch], trace_indices: tuple[int, ...] | None) -> None:
        self.watches = watches
        self.trace_indices = trace_indices  # the trace's device columns (None: no trace)
        self.origin = 0
        self.start: int | None = None
        self.costs: list[int] = []
        self.ends: list[int] = []
        self.rows: list[tuple[int | None, ...]] = []

    def clock(self) -> int:
        """poll_until's clock; its first reading is the wait's start, which TracePoint offsets are relative to."""
        t = time.monotonic_ns()
        if self.start is None:
            self.start = t
        return t

    def on_poll(self, point: TracePoint) -> None:
        t = (self.start or 0) + point.offset_ns
        prev_start = self.ends[-1] - self.costs[-1] if self.ends else None
        self.costs.append(point.cost_ns)
        self.ends.append(t)
        for w in self.watches:
            w.saw(t, point.snapshot, prev_start)
        if self.trace_indices is not None:
            self.rows.append(self._row(t, point))

    def _row(self, t: int, point: TracePoint) -> tuple[int | None, ...]:
        # By index, not position: a failed poll has no devices, and an unreadable GPU is missing from a snapshot.
        if point.devices == self.trace_indices:
            return (t - self.origin, *point.used_bytes, *point.process_counts)
        where = {index: i for i, index in enumerate(point.devices)}
        pos = [where.get(index) for index in self.trace_indices or ()]
        used = [None if i is None else point.used_bytes[i] for i in pos]
        counts = [None if i is None else point.process_counts[i] for i in pos]
        return (t - self.origin, *used, *counts)

    def intervals(self) -> list[int]:
        return [b - a for a, b in itertools.pairwise(self.ends)]


def _baseline_predicate(snap: Snapshot) -> Predicate:
    # With only the v1 memory call, "used" includes the driver's reserve and no fixed limit can decide (FACTS):
    # require no process, and take that reading as the baseline.
    if any(d.memory is not None and d.memory.used_includes_reserved for d in snap.devices):
        return no_processes()
    return default_predicate()


def _not_ready(snap: Snapshot, baseline: Snapshot, holder: Holder, on_gpu: int | None = None) -> str | None:
    """Why ``holder`` is not visible yet on its GPU in ``snap`` (``None``: it is). ``on_gpu``: the bytes every holder
    of the run holds on that GPU (default: this holder's)."""
    expected = holder.nbytes if on_gpu is None else on_gpu
    try:
        d = snap.device(holder.device)
    except KeyError:
        return f"GPU {holder.device} unreadable"
    procs = d.processes
    if procs is None or all(p.pid != holder.pid for p in procs):
        return f"pid {holder.pid} not listed on GPU {holder.device}"
    base = baseline.device(holder.device).memory
    m = d.memory
    if m is None or base is None:
        return f"GPU {holder.device}: memory unknown"
    if m.used_bytes + m.granularity_bytes <= base.used_bytes + expected:
        return (f"GPU {holder.device}: {format_bytes(m.used_bytes - base.used_bytes)} above the baseline, "
                f"{format_bytes(expected)} expected")
    return None


def _compact(rows: list[tuple[int | None, ...]]) -> list[tuple[int | None, ...]]:
    """Drop rows whose values (all but the offset) equal both neighbours': a step plot of the rest is identical."""
    if len(rows) <= 2:
        return rows
    out = [rows[0]]
    for prev, row, nxt in zip(rows, rows[1:], rows[2:], strict=False):
        if row[1:] != prev[1:] or row[1:] != nxt[1:]:
            out.append(row)
    out.append(rows[-1])
    return out


def _median_int(values: Sequence[int]) -> int:
    return 0 if not values else round(percentile(values, 0.5))


# --- summary --------------------------------------------------------------------------------------------------------


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) by linear interpolation between the closest ranks (numpy's default, "inclusive"):
    position ``(n - 1) * q`` in the sorted values. ``ValueError`` for no values or ``q`` outside 0..1."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be within 0..1, got {q!r}")
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Stats:
    """Order statistics of one measure, in ns: ``n`` values, min, p10, median, p90, max (see :func:`percentile`)."""

    n: int
    min: float
    p10: float
    median: float
    p90: float
    max: float

    @classmethod
    def of(cls, values: Sequence[int]) -> Stats | None:
        """The statistics of ``values`` (``None`` when there are none)."""
        if not values:
            return None
        return cls(len(values), float(min(values)), percentile(values, 0.1), percentile(values, 0.5),
                   percentile(values, 0.9), float(max(values)))


#: The measures a :class:`SummaryRow` reports, with their :class:`DeviceRun` fields and labels.
_MEASURES: tuple[tuple[str, str], ...] = (
    ("memory_back", "memory back"),
    ("off_list", "off the list"),
    ("waitpid", "pid reaped"),
    ("first_clean", "clean"),
)
#: The OS-side phases (added later): printed after the others, and only where a cell has data for them.
_PHASE_MEASURES: tuple[tuple[str, str], ...] = (
    ("zombie", "leader zombie"),
    ("exited", "exited (pidfd)"),
    ("files_closed", "files closed"),
)
#: Every measure a record can be compared on (``nvmlcheck study compare --measure``), in phase order.
MEASURES: tuple[str, ...] = ("zombie", "exited", "files_closed", "off_list", "memory_back", "first_clean", "waitpid")


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One (size, ending) cell: signal → event times over every measured GPU-run that did not time out.

    ``n`` counts GPU-runs (a run on 8 GPUs adds 8); ``runs`` counts measured runs and ``timeouts`` those that timed
    out (left out of the statistics). ``resolution_ns``: the median sampling period of the cell's runs.
    ``sleep_ratio``: how many times longer ``sleep 3`` waits than the median time to clean (``None`` without data).
    """

    size_bytes: int
    ending: str
    n: int
    runs: int
    timeouts: int
    memory_back: Stats | None
    off_list: Stats | None
    waitpid: Stats | None
    first_clean: Stats | None
    resolution_ns: int
    sleep_ratio: float | None
    holder: str = "alloc"
    zombie: Stats | None = None
    exited: Stats | None = None
    files_closed: Stats | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (statistics in ns)."""
        return asdict(self)


def summarize(records: Iterable[RunRecord]) -> list[SummaryRow]:
    """Statistics per (size, ending, holder kind), in order of holder kind, size, then ending, kinds and endings in
    order of first appearance; warm-ups left out."""
    cells: dict[tuple[int, str, str], list[RunRecord]] = {}
    for r in records:
        if not r.warmup:
            cells.setdefault((r.size_bytes, r.ending, r.holder), []).append(r)
    endings = list(dict.fromkeys(e for _, e, _ in cells))
    kinds = list(dict.fromkeys(k for _, _, k in cells))
    every = _MEASURES + _PHASE_MEASURES
    rows = []
    for size, ending, kind in sorted(cells, key=lambda k: (kinds.index(k[2]), k[0], endings.index(k[1]))):
        runs = cells[(size, ending, kind)]
        good = [r for r in runs if not r.timed_out]
        values: dict[str, list[int]] = {m: [] for m, _ in every}
        for r in good:
            for d in r.devices:
                for m, _ in every:
                    v = getattr(d, f"{m}_ns")
                    if v is not None:
                        values[m].append(v)
        stats = {m: Stats.of(values[m]) for m, _ in every}
        clean = stats["first_clean"]
        rows.append(SummaryRow(
            size_bytes=size, ending=ending, n=sum(len(r.devices) for r in good), runs=len(runs),
            timeouts=len(runs) - len(good), memory_back=stats["memory_back"], off_list=stats["off_list"],
            waitpid=stats["waitpid"], first_clean=clean,
            resolution_ns=_median_int([r.resolution_ns for r in runs]),
            sleep_ratio=SLEEP_REFERENCE_NS / clean.median if clean is not None and clean.median > 0 else None,
            holder=kind, zombie=stats["zombie"], exited=stats["exited"], files_closed=stats["files_closed"],
        ))
    return rows


def format_summary(rows: Sequence[SummaryRow]) -> str:
    """A compact table: per cell, signal → memory back / off the list / pid reaped / clean in ms (n, min, p10,
    median, p90, max), the sampling period, and how much longer ``sleep 3`` waits."""
    head = f"{'size':<10}{'ending':<7}{'signal ->':<14}{'n':>4}{'min':>9}{'p10':>9}{'median':>9}{'p90':>9}{'max':>9}"
    lines = ["times in ms from the signal; n = GPU-runs", head]
    kinds = {row.holder for row in rows}
    for row in rows:
        if kinds != {"alloc"}:  # a study of several holder kinds (or not the default one) says which each cell is
            lines.append(f"holder {row.holder}")
        shown = _MEASURES + tuple(m for m in _PHASE_MEASURES if getattr(row, m[0]) is not None)
        for i, (m, label) in enumerate(shown):
            s: Stats | None = getattr(row, m)
            left = f"{format_bytes(row.size_bytes):<10}{row.ending:<7}" if i == 0 else " " * 17
            if s is None:
                lines.append(f"{left}{label:<14}{0:>4}{'-':>9}{'-':>9}{'-':>9}{'-':>9}{'-':>9}")
                continue
            nums = "".join(f"{v / 1e6:>9.1f}" for v in (s.min, s.p10, s.median, s.p90, s.max))
            lines.append(f"{left}{label:<14}{s.n:>4}{nums}")
        ratio = f"sleep 3 waits {row.sleep_ratio:.1f}x the median time to clean" if row.sleep_ratio else "no clean run"
        timeouts = f"; {row.timeouts} of {row.runs} runs timed out" if row.timeouts else ""
        lines.append(f"{' ' * 17}{ratio} (sampling period {row.resolution_ns / 1e6:.3f} ms){timeouts}")
    return "\n".join(lines)


# --- plots ----------------------------------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Any:
    """A matplotlib Figure on an Agg canvas (no pyplot, no global backend change)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise PlotUnavailable(
            f"plots need matplotlib, which is not installed ({exc}): pip install 'nvmlcheck[plot]'"
        ) from None
    fig = Figure(figsize=(width, height), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def plot_time_to_clean(records: Iterable[RunRecord], path: str | os.PathLike[str]) -> Path:
    """PNG: signal → memory back (ms) against size (log x), one colour per ending: every GPU-run as a point, the
    median as a line. Warm-ups and timed-out runs left out. Raises :class:`PlotUnavailable` without matplotlib."""
    kept = [r for r in records if not r.warmup and not r.timed_out]
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    for ending in dict.fromkeys(r.ending for r in kept):
        xs: list[float] = []
        ys: list[float] = []
        medians: list[tuple[float, float]] = []
        for size in sorted({r.size_bytes for r in kept if r.ending == ending}):
            vals = [d.memory_back_ns / 1e6 for r in kept if r.ending == ending and r.size_bytes == size
                    for d in r.devices if d.memory_back_ns is not None]
            xs.extend([size / 2**30] * len(vals))
            ys.extend(vals)
            if vals:
                medians.append((size / 2**30, percentile(vals, 0.5)))
        (line,) = ax.plot([m[0] for m in medians], [m[1] for m in medians], label=f"{ending}: runs and median")
        ax.scatter(xs, ys, s=12, alpha=0.6, color=line.get_color())
    sizes = sorted({r.size_bytes for r in kept})
    if sizes and sizes[0] > 0:  # a context holder's size 0 has no place on a log axis
        ax.set_xscale("log")
    if sizes:  # label the measured sizes themselves, not powers of ten
        ax.set_xticks([s / 2**30 for s in sizes], labels=[f"{s / 2**30:g}" for s in sizes])
        ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    ax.set_xlabel("memory held per GPU (GiB)")
    ax.set_ylabel("signal → memory back (ms)")
    ax.set_ylim(0, max(ax.get_ylim()[1], 1.0) * 1.15)  # room above the highest point for the legend
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    backends = sorted({f"{r.backend}, driver {r.driver}" for r in kept})
    ax.set_title("Time until the driver gives the memory back" + (f"\n{'; '.join(backends)}" if backends else ""),
                 fontsize=10)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out


def plot_run_trace(record: RunRecord, path: str | os.PathLike[str], *, device: int | None = None) -> Path:
    """PNG: used memory (GiB) against time from the signal (ms) for one run, one line per GPU, with the phases of
    ``device`` (default: the run's first GPU) marked: signal, leader zombie, exited (pidfd), device files closed,
    off the list, memory back, pid reaped; each phase's sampling window shaded where the record has one.

    ``ValueError`` when the record has no trace (run with ``trace=True`` / ``--trace``); :class:`PlotUnavailable`
    without matplotlib."""
    if record.trace is None or not record.trace:
        raise ValueError(f"run {record.run} has no trace: run the study with trace=True (--trace)")
    gpus = list(dict.fromkeys(d.index for d in record.devices))  # the trace's columns: one per GPU, not per holder
    n = len(gpus)
    marked = record.devices[0] if device is None else next((d for d in record.devices if d.index == device), None)
    if marked is None:
        raise ValueError(f"GPU {device} is not in run {record.run}")
    fig = _figure(7.0, 4.5)
    ax = fig.add_subplot()
    times = [(row[0] or 0) / 1e6 for row in record.trace]
    for i, index in enumerate(gpus):
        used = [math.nan if row[1 + i] is None else (row[1 + i] or 0) / 2**30 for row in record.trace]
        ax.step(times, used, where="post", label=f"GPU {index}" if n > 1 else "used memory")
    sig = marked.signal_ns / 1e6
    marks = (("signal", 0, "black", "-"), ("leader zombie", marked.zombie_ns, "tab:purple", ":"),
             ("exited (pidfd)", marked.exited_ns, "tab:brown", ":"),
             ("device files closed", marked.files_closed_ns, "tab:gray", ":"),
             ("off the list", marked.off_list_ns, "tab:orange", "--"),
             ("memory back", marked.memory_back_ns, "tab:green", "--"),
             ("pid reaped", marked.waitpid_ns, "tab:red", "--"))
    res = marked.phase_resolution_ns or {}
    keys = {"leader zombie": "zombie", "exited (pidfd)": "exited", "device files closed": "files_closed",
            "off the list": "off_list", "memory back": "memory_back"}
    for label, t, colour, style in marks:
        if t is None:
            continue
        x = sig + t / 1e6
        window = res.get(keys.get(label, ""))
        if window:  # the phase lies in (t - window, t]: shade it, so a wide window cannot pass for a precise time
            ax.axvspan(x - window / 1e6, x, color=colour, alpha=0.12, linewidth=0)
        ax.axvline(x, color=colour, linestyle=style, linewidth=1, label=f"{label} ({t / 1e6:.1f} ms)")
    ax.set_xlabel("time from the signal (ms)")
    ax.set_ylabel("used memory (GiB)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{format_bytes(record.size_bytes)}, {record.ending}, run {record.run} "
                 f"(sampling period {record.resolution_ns / 1e6:.3f} ms)", fontsize=10)
    out = Path(path)
    fig.savefig(out, bbox_inches="tight")
    return out


# --- helpers for callers ------------------------------------------------------------------------------------------


def median_run(records: Iterable[RunRecord], size_bytes: int, ending: str) -> RunRecord | None:
    """The measured run of a cell whose first GPU's time to clean is the median (the one to plot), or ``None``."""
    runs = [r for r in records if not r.warmup and not r.timed_out and r.size_bytes == size_bytes
            and r.ending == ending and r.devices and r.devices[0].first_clean_ns is not None]
    if not runs:
        return None
    runs.sort(key=lambda r: r.devices[0].first_clean_ns or 0)
    return runs[(len(runs) - 1) // 2]


@contextlib.contextmanager
def record_writer(path: str | os.PathLike[str]) -> Iterator[Callable[[RunRecord], None]]:
    """A JSON Lines sink for ``run_study(on_record=...)``: each record is written and flushed as it comes."""
    with Path(path).open("w", encoding="utf-8") as f:

        def write(record: RunRecord) -> None:
            f.write(record.to_line() + "\n")
            f.flush()

        yield write

