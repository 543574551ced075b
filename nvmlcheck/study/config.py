"""What a study measures: the ways a holder is ended, the warm-up and concurrency choices, and :class:`StudyConfig`
(validated and normalised when made), whose sweeps give the :class:`Cell` of each planned run (:class:`PlannedRun`)."""

from __future__ import annotations

import contextlib
import contextvars
import math
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from ..errors import ArgumentError
from ..predicates import DEFAULT_TOLERANCE_BYTES

__all__ = ["ENDINGS", "ZERO_SIZE_KINDS", "Cell", "Concurrency", "Ending", "IpcFirst", "PinMode", "PlannedRun",
           "StudyConfig", "WarmUp", "parse_ending"]

#: How a holder is ended: SIGKILL, SIGTERM, ``exit`` on its stdin (exits without freeing), ``free`` (frees, then exits).
Ending = Literal["KILL", "TERM", "exit", "free"]
#: Every ending, in the order the CLI documents them.
ENDINGS: tuple[Ending, ...] = ("KILL", "TERM", "exit", "free")
#: Warm-up policy: one discarded run per (size, ending) cell, one for the whole study, or none.
WarmUp = Literal["per_cell", "once", "none"]
#: ``"gpus"``: every selected GPU's holders end at the same instant; ``"none"``: one GPU per run, in turn.
Concurrency = Literal["gpus", "none"]
#: Which side of a CUDA IPC group (holder ``ipc``) is ended first; the other is ended ``stage_gap_s`` after the first
#: side was reaped.
IpcFirst = Literal["exporter", "importers"]
#: How a ``pinned`` holder pins host memory: ``cuMemHostAlloc`` or ``cuMemHostRegister`` of mapped memory.
PinMode = Literal["alloc", "register"]
#: Holder kinds that may hold no device memory (size 0); ``context`` holds none, always.
ZERO_SIZE_KINDS: tuple[str, ...] = ("context", "pinned", "nccl")
#: The most importers an IPC group may have (each is a process with its own context).
MAX_IMPORTERS = 16
#: The most runs a study plans (warm-ups counted): more is a typo, not a study (a run takes about a second).
MAX_RUNS = 1_000_000


@dataclass(frozen=True, slots=True)
class Cell:
    """One condition of a study: device bytes per holder, the ending, pinned host bytes per holder (``pinned``),
    importers per exporter and which side ends first (``ipc``; ``first`` is ``None`` for every other kind and for an
    exporter alone)."""

    size_bytes: int
    ending: Ending
    pinned_bytes: int = 0
    importers: int = 0
    first: IpcFirst | None = None


@dataclass(frozen=True, slots=True)
class PlannedRun:
    """One planned run: its cell, its index among the cell's runs of its kind, and whether it is a warm-up."""

    cell: Cell
    repeat: int
    warmup: bool


#: How :class:`StudyConfig`'s errors name its fields: the fields' own names (``run_timeout_s``) for a caller of the
#: library; the options a user typed (``--run-timeout``) under :func:`spelled_as`, which the command line uses.
_SPELLING: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("nvmlcheck_study_spelling",
                                                                                      default=None)


@contextlib.contextmanager
def spelled_as(names: Mapping[str, str]) -> Iterator[None]:
    """Within it, a :class:`StudyConfig` refused names each field as ``names`` spells it (``{"run_timeout_s":
    "--run-timeout"}``): an error must name what its reader wrote, not a field they never saw."""
    token = _SPELLING.set(names)
    try:
        yield
    finally:
        _SPELLING.reset(token)


def _n(field: str) -> str:
    """``field`` as the caller spells it (:func:`spelled_as`)."""
    names = _SPELLING.get()
    return field if names is None else names.get(field, field)


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
    raise ArgumentError(f"unknown ending {text!r}: use KILL, TERM, exit or free")


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyConfig:
    """What to measure.

    ``sizes``: bytes per holder (one holder per selected GPU per run). ``repeats``: measured runs per (size, ending)
    cell. ``endings``: see :data:`ENDINGS` (``parse_ending`` spellings accepted). ``devices``: NVML indices or UUIDs
    (``None``: every GPU). ``mode``: ``"precise"`` (tight polling loop, one busy core, detection within about two
    query times) or ``"default"`` (the :data:`~nvmlcheck.wait.DEFAULT` policy, ~1.5 ms). ``trace``: keep the
    per-poll trace in each record. ``warmup``: see :data:`WarmUp` (docs/study-records.md says why).
    ``run_timeout_s``: from the signal until every GPU is clean and every holder reaped. ``ready_timeout_s``: for
    the holders' PIDs and memory to show in NVML. ``settle_timeout_s``: how long a baseline after the first waits
    for clean GPUs before refusing. ``tolerance_bytes``: "memory back" means at most baseline + this.
    ``stable_polls``: consecutive clean polls that end the observation.

    ``holder``: the holder kind recorded with each run (see :mod:`nvmlcheck.study.child`; the factory must start
    holders of this kind, as the default :class:`CudaHolderFactory` made from the config does), ``holder_count`` its
    count (allocations, contexts or streams). ``per_gpu``: holders on each GPU, ended together. ``concurrent``:
    ``"gpus"`` ends the holders of every selected GPU at the same instant; ``"none"`` runs each GPU alone, in turn
    (one record per GPU and planned run). ``phases``: watch the OS-side phases from ``/proc`` (zombie, whole process
    exited, device files closed) in a thread of their own; ``device_files``: the globs of the files that count as
    NVIDIA device files in the study's own holders (``None``: ``/dev/nvidia*``). ``events``: listen for NVML events
    (:mod:`nvmlcheck.events`) during each run and keep every one in its record (``events``; where events cannot be
    had, ``events_reason`` says why); they are recorded, they do not end a run.

    Third edition (issue 26): ``pinned`` (swept) pinned host bytes per holder (holder ``pinned``; ``pin_mode``
    ``"alloc"`` or ``"register"``); ``importers`` (swept) importer processes beside each exporter (holder ``ipc``),
    ``first`` (swept) which side of such a group is ended first and ``stage_gap_s`` how long after that side was
    reaped the other is ended. ``budget_s``: start no run once this many seconds have passed since the study began,
    nor one that the cell's previous run says would end past it (the study stops early, with what it has;
    ``None``: no budget). A study plans every combination of sizes, pinned bytes, importers, orders and endings
    (:meth:`runs`).
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
    pinned: tuple[int, ...] = (0,)
    pin_mode: PinMode = "alloc"
    importers: tuple[int, ...] = (0,)
    first: tuple[IpcFirst, ...] = ("exporter",)
    stage_gap_s: float = 0.3
    budget_s: float | None = None

    def __post_init__(self) -> None:
        from .._proc.devfiles import device_file_patterns
        from .child import HOLDER_KINDS

        if self.holder not in HOLDER_KINDS:
            raise ArgumentError(f"{_n('holder')}: unknown holder kind {self.holder!r}: one of "
                                f"{', '.join(HOLDER_KINDS)}")
        sizes = tuple(self.sizes)
        if not sizes:
            raise ArgumentError(f"{_n('sizes')}: a study needs at least one size")
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ArgumentError(f"{_n('sizes')} are positive int byte counts, got {s!r}")
            # A context holds no allocation: its "size" is 0; a few kinds may hold no device memory either.
            if self.holder == "context" and s != 0:
                raise ArgumentError(f"{_n('sizes')} {s}: the context holder takes size 0 only, every other holder "
                                    "positive sizes")
            if s == 0 and self.holder not in ZERO_SIZE_KINDS:
                raise ArgumentError(f"{_n('sizes')} 0: the {self.holder} holder takes positive sizes (the context "
                                    "holder takes size 0 only; the pinned and nccl holders may hold no device memory)")
        for name in ("holder_count", "per_gpu"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"{_n(name)} must be an int >= 1, got {value!r}")
        if self.concurrent not in ("gpus", "none"):
            raise ArgumentError(f"{_n('concurrent')} must be 'gpus' or 'none', got {self.concurrent!r}")
        if self.device_files is not None:
            try:
                object.__setattr__(self, "device_files", device_file_patterns(self.device_files))
            except ValueError as exc:
                raise ArgumentError(f"{_n('device_files')}: {exc}") from None
        try:
            endings = tuple(parse_ending(e) for e in self.endings)
        except ValueError as exc:
            raise ArgumentError(f"{_n('endings')}: {exc}") from None
        if not endings:
            raise ArgumentError(f"{_n('endings')}: a study needs at least one ending (KILL, TERM, exit, free)")
        devices = None if self.devices is None else tuple(self.devices)
        if devices is not None and not devices:
            raise ArgumentError(f"{_n('devices')}: empty device selection: name at least one GPU, or None for all")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ArgumentError(f"{_n('repeats')} must be an int >= 1, got {self.repeats!r}")
        if self.mode not in ("precise", "default"):
            raise ArgumentError(f"{_n('mode')} must be 'precise' or 'default', got {self.mode!r}")
        if self.warmup not in ("per_cell", "once", "none"):
            raise ArgumentError(f"{_n('warmup')} must be 'per_cell', 'once' or 'none', got {self.warmup!r}")
        self._check_bounds()
        # Frozen: normalise through object.__setattr__ (lists become tuples, endings canonical).
        # A value swept twice (--sizes 1GiB,1GiB) ran its cell twice over: 2 x --repeats runs in one cell, each
        # repeat number twice. Once each, in order, as pinned, importers and first are.
        object.__setattr__(self, "sizes", tuple(dict.fromkeys(sizes)))
        object.__setattr__(self, "endings", tuple(dict.fromkeys(endings)))
        object.__setattr__(self, "devices", devices)
        self._check_sweeps()

    def _check_bounds(self) -> None:
        """The timeouts, the tolerance and the stable polls."""
        for name in ("run_timeout_s", "ready_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ArgumentError(f"{_n(name)} must be a finite number of seconds > 0, got {value!r}")
        if not (math.isfinite(self.settle_timeout_s) and self.settle_timeout_s >= 0):
            raise ArgumentError(f"{_n('settle_timeout_s')} must be >= 0, got {self.settle_timeout_s!r}")
        if self.tolerance_bytes < 0:
            raise ArgumentError(f"{_n('tolerance_bytes')} must be >= 0, got {self.tolerance_bytes}")
        if self.stable_polls < 1:
            raise ArgumentError(f"{_n('stable_polls')} must be >= 1, got {self.stable_polls}")

    def _check_sweeps(self) -> None:
        """The third edition's fields (issue 26), normalised to tuples."""
        pinned, importers, first = tuple(self.pinned), tuple(self.importers), tuple(self.first)
        for name, values in (("pinned", pinned), ("importers", importers)):
            if not values:
                raise ArgumentError(f"{_n(name)} needs at least one value (0 for none)")
            for v in values:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ArgumentError(f"{_n(name)} values are int counts >= 0, got {v!r}")
        if any(pinned) and self.holder != "pinned":
            raise ArgumentError(f"{_n('pinned')} (pinned host memory) needs the pinned holder ({_n('holder')} "
                                f"pinned), not {self.holder!r}")
        if any(importers) and self.holder != "ipc":
            raise ArgumentError(f"{_n('importers')} needs the ipc holder ({_n('holder')} ipc), not {self.holder!r}")
        if max(importers) > MAX_IMPORTERS:
            raise ArgumentError(f"{_n('importers')}: at most {MAX_IMPORTERS} importers per exporter, got "
                                f"{max(importers)}")
        if not first or any(f not in ("exporter", "importers") for f in first):
            raise ArgumentError(f"{_n('first')} must name 'exporter' and/or 'importers', got {first!r}")
        if self.pin_mode not in ("alloc", "register"):
            raise ArgumentError(f"{_n('pin_mode')} must be 'alloc' or 'register', got {self.pin_mode!r}")
        gap = self.stage_gap_s
        if isinstance(gap, bool) or not isinstance(gap, int | float) or not math.isfinite(gap) or gap < 0:
            raise ArgumentError(f"{_n('stage_gap_s')} must be a finite number of seconds >= 0, got {gap!r}")
        if self.holder == "ipc" and max(importers) > 0 and gap >= self.run_timeout_s:
            # The run's timeout counts from the first side's signal: the other side would be ended after it, so
            # every run of two sides would time out, each for the same reason.
            raise ArgumentError(f"{_n('stage_gap_s')} ({gap:g} s) must be shorter than {_n('run_timeout_s')} "
                                f"({self.run_timeout_s:g} s), which counts from the first side's signal: the "
                                "other side would never be ended before the run times out")
        budget = self.budget_s
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int | float)
                                   or not math.isfinite(budget) or budget <= 0):
            raise ArgumentError(f"{_n('budget_s')} must be a finite number of seconds > 0 (or None), got {budget!r}")
        if self.holder in ("ipc", "nccl") and self.per_gpu != 1:
            raise ArgumentError(f"the {self.holder} holder starts its own group: {_n('per_gpu')} must be 1")
        if self.holder == "nccl" and self.concurrent != "gpus":
            raise ArgumentError(f"an NCCL communicator spans the selected GPUs: {_n('concurrent')} must be 'gpus'")
        object.__setattr__(self, "pinned", tuple(dict.fromkeys(pinned)))
        object.__setattr__(self, "importers", tuple(dict.fromkeys(importers)))
        object.__setattr__(self, "first", tuple(dict.fromkeys(first)))
        # Counted before any plan is built: a mistyped --repeats 1000000000 built a list of every run until the
        # memory ran out, before the first run.
        planned = len(self.sizes) * len(self.pinned) * len(self.importers) * len(self.first) * len(self.endings) * (
            self.repeats + 1)
        if planned > MAX_RUNS:
            raise ArgumentError(f"the study would plan about {planned:,} runs ({_n('repeats')} {self.repeats:,} of "
                                f"each condition), more than {MAX_RUNS:,} (at ~1 s a run, {MAX_RUNS // 86400} days): "
                                "fewer repeats or conditions")

    def cells(self) -> list[Cell]:
        """Every condition, in order: size, pinned bytes, importers, which side first, ending."""
        out: list[Cell] = []
        for size in self.sizes:
            for pinned in self.pinned:
                for k in self.importers:
                    orders: tuple[IpcFirst | None, ...] = self.first if self.holder == "ipc" and k > 0 else (None,)
                    for first in orders:
                        out.extend(Cell(size, e, pinned, k, first) for e in self.endings)
        return out

    def runs(self) -> list[PlannedRun]:
        """The runs in order. Cells run one after another, each preceded by its warm-up with ``"per_cell"``; with
        ``"once"`` the single warm-up uses the first cell."""
        out: list[PlannedRun] = []
        for n, cell in enumerate(self.cells()):
            if self.warmup == "per_cell" or (self.warmup == "once" and n == 0):
                out.append(PlannedRun(cell, 0, True))
            out.extend(PlannedRun(cell, r, False) for r in range(self.repeats))
        return out

    def plan(self) -> list[tuple[int, Ending, int, bool]]:
        """:meth:`runs` as ``(size, ending, repeat, warmup)`` tuples (the second edition's view of a plan)."""
        return [(r.cell.size_bytes, r.cell.ending, r.repeat, r.warmup) for r in self.runs()]
