"""The observer's bookkeeping during one run: the reaper thread (``waitpid``), what each holder's GPU looked like
poll by poll (:class:`Watch`), the poll times, costs and trace (:class:`Polls`), and the readiness and baseline
checks around them. Every time is taken when a poll's query *returned* (docs/study-records.md)."""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from .._units import format_bytes
from ..model import Snapshot
from ..predicates import Predicate, default_predicate, no_processes
from ..wait import TracePoint
from .holders import Holder
from .phases import PROC_PHASES, PhaseWatch

__all__ = ["Polls", "Reaper", "Watch", "baseline_predicate", "compact", "not_ready", "phase_fields", "set_up_only"]


class Reaper(threading.Thread):
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
class Watch:
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


def phase_fields(w: Watch, pw: PhaseWatch | None, reaped: int | None) -> dict[str, Any]:
    """The phase times, resolutions and reasons of one holder (relative to its signal): ``w`` its NVML watch, ``pw``
    its ``/proc`` phases (``None``: not watched), ``reaped`` when ``waitpid`` returned."""
    res: dict[str, int | None] = {"off_list": w.off_list_res, "memory_back": w.memory_back_res,
                                  "waitpid": None}
    unknown: dict[str, str] = {}
    # waitpid blocks: its time is when the thread woke, with no sampling window to report.
    unknown["waitpid_resolution"] = "waitpid blocks until the reap: no sampling window (wake-up latency only)"
    out: dict[str, Any] = {}
    if pw is None:
        for p in PROC_PHASES:
            out[f"{p}_ns"] = None
            res[p] = None
            unknown[p] = "phases not watched (phases=False)"
    else:
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


class Polls:
    """The observer's per-poll bookkeeping: poll times and costs, the trace, and each GPU's watch."""

    def __init__(self, watches: list[Watch], trace_indices: tuple[int, ...] | None) -> None:
        self.watches = watches
        self.trace_indices = trace_indices  # the trace's device columns (None: no trace)
        self.origin = 0
        self.start: int | None = None
        self.costs: list[int] = []
        self.ends: list[int] = []
        self.rows: list[tuple[int | None, ...]] = []
        #: Each GPU's used bytes at the latest poll that read it (a later stage's ``held_at_signal_bytes``).
        self.last_used: dict[int, int | None] = {}

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
        for index, used in zip(point.devices, point.used_bytes, strict=False):
            self.last_used[index] = used
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
        """The times between consecutive polls, ns."""
        return [b - a for a, b in itertools.pairwise(self.ends)]


def baseline_predicate(snap: Snapshot) -> Predicate:
    """What "clean at baseline" means on ``snap``'s driver: :func:`default_predicate`, or no process at all."""
    # With only the v1 memory call, "used" includes the driver's reserve and no fixed limit can decide
    # (docs/driver-facts.md): require no process, and take that reading as the baseline.
    if any(d.memory is not None and d.memory.used_includes_reserved for d in snap.devices):
        return no_processes()
    return default_predicate()


def set_up_only(snap: Snapshot, allowed: frozenset[int]) -> list[str]:
    """Why ``snap``'s GPUs hold more than the set-up's own processes (``allowed``: an MPS server); empty when they
    do not. A list that could not be read, or a GPU that could not be, is a reason too (unknown is not clean)."""
    from ..model import ProcessKind

    reasons = [f"GPU {f.index}: {f.describe()}" for f in snap.failures]
    for d in snap.devices:
        for kind in ProcessKind:
            procs = d.processes_of(kind)
            if procs is None:
                reasons.append(f"GPU {d.index}: {kind.value} process list unknown")
                continue
            reasons.extend(f"GPU {d.index}: pid {p.pid} ({p.name or 'name unknown'}) is listed ({kind.value})"
                           for p in procs if p.pid not in allowed)
    return reasons


def not_ready(snap: Snapshot, baseline: Snapshot, holder: Holder, on_gpu: int | None = None) -> str | None:
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


def compact(rows: list[tuple[int | None, ...]]) -> list[tuple[int | None, ...]]:
    """Drop rows whose values (all but the offset) equal both neighbours': a step plot of the rest is identical."""
    if len(rows) <= 2:
        return rows
    out = [rows[0]]
    for prev, row, nxt in zip(rows, rows[1:], rows[2:], strict=False):
        if row[1:] != prev[1:] or row[1:] != nxt[1:]:
            out.append(row)
    out.append(rows[-1])
    return out
