"""What a study measures: the ways a holder is ended, the warm-up and concurrency choices, and :class:`StudyConfig`
(validated and normalised when made)."""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from typing import Literal

from ..errors import ArgumentError
from ..predicates import DEFAULT_TOLERANCE_BYTES

__all__ = ["ENDINGS", "Concurrency", "Ending", "StudyConfig", "WarmUp", "parse_ending"]

#: How a holder is ended: SIGKILL, SIGTERM, ``exit`` on its stdin (exits without freeing), ``free`` (frees, then exits).
Ending = Literal["KILL", "TERM", "exit", "free"]
#: Every ending, in the order the CLI documents them.
ENDINGS: tuple[Ending, ...] = ("KILL", "TERM", "exit", "free")
#: Warm-up policy: one discarded run per (size, ending) cell, one for the whole study, or none.
WarmUp = Literal["per_cell", "once", "none"]
#: ``"gpus"``: every selected GPU's holders end at the same instant; ``"none"``: one GPU per run, in turn.
Concurrency = Literal["gpus", "none"]


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
        from .._proc.devfiles import device_file_patterns
        from .child import HOLDER_KINDS

        if self.holder not in HOLDER_KINDS:
            raise ArgumentError(f"unknown holder kind {self.holder!r}: one of {', '.join(HOLDER_KINDS)}")
        sizes = tuple(self.sizes)
        if not sizes:
            raise ArgumentError("a study needs at least one size")
        for s in sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ArgumentError(f"sizes are positive int byte counts, got {s!r}")
            # A context holds no allocation: its "size" is 0, and only its size is 0.
            if (s == 0) != (self.holder == "context"):
                raise ArgumentError(
                    f"size {s}: the context holder takes size 0 only, every other holder positive sizes")
        for name in ("holder_count", "per_gpu"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"{name} must be an int >= 1, got {value!r}")
        if self.concurrent not in ("gpus", "none"):
            raise ArgumentError(f"concurrent must be 'gpus' or 'none', got {self.concurrent!r}")
        if self.device_files is not None:
            object.__setattr__(self, "device_files", device_file_patterns(self.device_files))
        endings = tuple(parse_ending(e) for e in self.endings)
        if not endings:
            raise ArgumentError("a study needs at least one ending (KILL, TERM, exit, free)")
        devices = None if self.devices is None else tuple(self.devices)
        if devices is not None and not devices:
            raise ArgumentError("empty device selection: name at least one GPU, or None for all")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) or self.repeats < 1:
            raise ArgumentError(f"repeats must be an int >= 1, got {self.repeats!r}")
        if self.mode not in ("precise", "default"):
            raise ArgumentError(f"mode must be 'precise' or 'default', got {self.mode!r}")
        if self.warmup not in ("per_cell", "once", "none"):
            raise ArgumentError(f"warmup must be 'per_cell', 'once' or 'none', got {self.warmup!r}")
        for name in ("run_timeout_s", "ready_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ArgumentError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if not (math.isfinite(self.settle_timeout_s) and self.settle_timeout_s >= 0):
            raise ArgumentError(f"settle_timeout_s must be >= 0, got {self.settle_timeout_s!r}")
        if self.tolerance_bytes < 0:
            raise ArgumentError(f"tolerance_bytes must be >= 0, got {self.tolerance_bytes}")
        if self.stable_polls < 1:
            raise ArgumentError(f"stable_polls must be >= 1, got {self.stable_polls}")
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
