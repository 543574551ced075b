"""The runner: :func:`run_study` runs the planned runs one after another (within its time budget); each run
(``_Run``) takes a baseline, starts the holders, waits until NVML shows them, ends them (in stages, for an IPC group)
and observes until the GPUs are clean (steps (a) to (e) of docs/study-records.md)."""

from __future__ import annotations

import contextlib
import itertools
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._units import format_bytes
from ..errors import ArgumentError, WaitTimeout
from ..model import Fields, Snapshot
from ..predicates import Predicate, memory_back_to, on_devices, pids_gone
from ..wait import DEFAULT, PRECISE, is_transient, poll_until
from .config import Cell, PlannedRun, StudyConfig, _n
from .errors import BaselineNotClean, HolderError, StudyError, StudySkipped
from .holders import CudaHolderFactory, Holder, HolderFactory, HolderSpec, start_holders
from .observer import Polls, Reaper, Watch, baseline_predicate, compact, not_ready, phase_fields, set_up_only
from .phases import PhaseWatch, ProcWatcher, watch_phases
from .records import DeviceRun, RunRecord
from .summary import SummaryRow, median_int, summarize

if TYPE_CHECKING:
    from ..session import Session

__all__ = ["StudyProgress", "StudyResult", "run_study"]

_NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class StudyProgress:
    """Handed to ``progress`` after each run: ``done`` of ``total`` runs, and the record just made."""

    done: int
    total: int
    record: RunRecord


@dataclass(frozen=True, slots=True)
class StudyResult:
    """Every record of a study, warm-ups included, in run order. ``stopped``: why the study ended before its plan
    did (its time budget), or ``None``."""

    config: StudyConfig
    records: tuple[RunRecord, ...]
    stopped: str | None = None

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
    """Run every planned run of ``config`` (docs/study-records.md describes one run) and return the records.

    ``session_factory`` opens a session (default :func:`nvmlcheck.open`, backend ``"auto"``; for example
    ``lambda: nvmlcheck.open("nvml")``); it is called twice per run.
    ``holder_factory`` defaults to :class:`CudaHolderFactory`. ``on_record`` gets each record as soon as it exists
    (stream them to a file: nothing is lost if a later run fails); ``progress`` gets a :class:`StudyProgress`.

    Raises :class:`BaselineNotClean` when the GPUs are not clean before a run, :class:`HolderError` when a holder
    fails, and the backend's errors; holders are killed and reaped whatever happens.
    """
    from ..session import open as open_session

    sessions: Callable[[], Session] = session_factory if session_factory is not None else open_session
    factory: HolderFactory = (holder_factory if holder_factory is not None
                              else CudaHolderFactory(kind=config.holder, chunks=config.holder_count))
    with sessions() as session:
        resolved = session.resolve(config.devices)
        every = resolved if resolved is not None else tuple(range(session.device_count()))
        _check_room(config, session.snapshot(list(every), fields=Fields.MEMORY))
    if config.holder == "nccl" and len(every) < 2:
        raise StudySkipped(f"an NCCL communicator needs two or more GPUs; {len(every)} selected "
                           f"({', '.join(map(str, every)) or 'none'})")
    plan: list[tuple[PlannedRun, int | None]] = [(p, None) for p in config.runs()]
    if config.concurrent == "none":  # one GPU per run, in turn: each planned run once on each GPU
        plan = [(p, index) for p, _ in plan for index in every]
    hooks: Any = factory
    records: list[RunRecord] = []
    budget = _Budget(config.budget_s)
    stopped: str | None = None
    try:
        if getattr(hooks, "prepare", None) is not None:
            hooks.prepare(every)
        for n, (planned, only) in enumerate(plan):
            stopped = budget.refuse(planned.cell, n, len(plan))
            if stopped is not None:
                break
            t0 = time.monotonic()
            try:
                run = _Run(config, session_factory=sessions, factory=factory, number=n, planned=planned, only=only)
                record = run.execute(first=n == 0)
            except BaselineNotClean as exc:
                raise BaselineNotClean(exc.culprits, exc.waited_s, records) from None
            budget.took(planned.cell, time.monotonic() - t0)
            records.append(record)
            if on_record is not None:
                on_record(record)
            if progress is not None:
                progress(StudyProgress(n + 1, len(plan), record))
    finally:
        if getattr(hooks, "close", None) is not None:
            hooks.close()
    return StudyResult(config, tuple(records), stopped)


def _check_room(config: StudyConfig, snap: Snapshot) -> None:
    """Refuse, before any holder starts, a size no selected GPU can hold with nothing running (its total less the
    driver's reserve): its holders would never show their memory, and the run would fail after its ready timeout."""
    largest = max((p.cell.size_bytes for p in config.runs()), default=0)
    need = largest * config.per_gpu
    for d in snap.devices:
        m = d.memory
        if m is None:
            continue  # unknown: the holders' ready timeout still bounds it
        room = m.total_bytes - (m.reserved_bytes or 0)
        if need > room:
            # Named as the caller spells the options (--sizes, --per-gpu on the command line: spelled_as).
            raise ArgumentError(f"{_n('sizes')} {format_bytes(largest)} with {_n('per_gpu')} {config.per_gpu}: "
                                f"{format_bytes(need)} per GPU is more than GPU {d.index} can hold with nothing "
                                f"running ({format_bytes(room)})")


class _Budget:
    """A study's time budget: no run starts past it, nor one the cell's previous run says would end past it."""

    def __init__(self, budget_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget_s = budget_s
        self.clock = clock
        self.start = clock()
        self.last: dict[Cell, float] = {}

    def took(self, cell: Cell, seconds: float) -> None:
        self.last[cell] = seconds

    def refuse(self, cell: Cell, n: int, total: int) -> str | None:
        """Why run ``n`` (of ``total``) may not start, or ``None``."""
        if self.budget_s is None:
            return None
        elapsed = self.clock() - self.start
        need = self.last.get(cell, 0.0)
        if elapsed + need <= self.budget_s:
            return None
        return (f"time budget of {self.budget_s:g} s: stopped after {n} of {total} runs at {elapsed:.1f} s (the "
                f"next run would need about {need:.1f} s)")


class _Run:
    """One run, steps (a) to (e) of docs/study-records.md. State lives in attributes so the steps stay small."""

    def __init__(
        self,
        config: StudyConfig,
        *,
        session_factory: Callable[[], Session],
        factory: HolderFactory,
        number: int,
        planned: PlannedRun,
        only: int | str | None = None,
    ) -> None:
        self.config = config
        self.only = only  # concurrent="none": this run's one GPU
        self.session_factory = session_factory
        self.factory = factory
        self.number = number
        self.cell = planned.cell
        self.size, self.ending, self.repeat, self.warmup = (planned.cell.size_bytes, planned.cell.ending,
                                                             planned.repeat, planned.warmup)
        self.spec = HolderSpec(kind=config.holder, nbytes=self.size, count=config.holder_count,
                               pinned_bytes=self.cell.pinned_bytes, pin_mode=config.pin_mode,
                               importers=self.cell.importers, first=self.cell.first)
        self.stages: list[list[int]] = []
        self.held_at_signal: dict[int, int | None] = {}
        self.indices: tuple[int, ...] = ()
        self.holders: list[Holder] = []
        self.reapers: list[Reaper] = []
        self.watches: list[Watch] = []
        self.phases: list[PhaseWatch] = []

    def execute(self, *, first: bool) -> RunRecord:
        baseline = self._baseline(0.0 if first else self.config.settle_timeout_s)
        try:
            self.holders = start_holders(self.factory, self.indices, self.spec, self.config.per_gpu)
            with self.session_factory() as session:
                ready = self._wait_ready(session, baseline)
                self.reapers = [Reaper(h) for h in self.holders]
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
            hook: Any = getattr(self.factory, "baseline_pids", None)
            allowed: frozenset[int] = hook() if hook is not None else frozenset()
            while True:
                snap = session.snapshot(self.indices, fields=Fields.WAIT)
                for failure in snap.failures:  # a lost or unreadable GPU is a backend error, not a dirty one
                    if not is_transient(failure.error):
                        raise failure.error
                if allowed:  # the set-up's own processes (an MPS server) are part of the baseline
                    reasons = set_up_only(snap, allowed)
                else:
                    verdict = baseline_predicate(snap).evaluate(snap)
                    reasons = [] if verdict.clean else list(verdict.reasons)
                if not reasons:
                    return snap
                if time.monotonic() >= deadline:
                    raise BaselineNotClean(reasons, settle_s)
                time.sleep(0.01)

    # (c)
    def _wait_ready(self, session: Session, baseline: Snapshot) -> Snapshot:
        deadline = time.monotonic() + self.config.ready_timeout_s
        while True:
            snap = session.snapshot(self.indices, fields=Fields.WAIT)
            missing = [m for h in self.holders if (m := not_ready(snap, baseline, h, self._on_gpu(h))) is not None]
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
            Watch(h.device, h.pid, on_devices([h.device], memory_back_to(baseline, tol)),
                   on_devices([h.device], pids_gone([h.pid])))
            for h in holders
        ]
        condition = memory_back_to(baseline, tol) & pids_gone([h.pid for h in holders])
        polls = Polls(self.watches, indices if config.trace else None)
        watcher = self._phase_watcher()
        # Started before the signals: registering costs a few NVML calls that must not fall inside the measurement.
        listener = session.listen() if config.events else None
        self.stages = self._stages()
        wall = self._end_first_stage(polls, watcher, ready, baseline)
        deadline = polls.origin + int(config.run_timeout_s * _NS)
        stager = _Stager(self, polls, baseline, watcher, deadline) if len(self.stages) > 1 else None
        if stager is not None:
            stager.start()
        try:
            reason = self._poll(session, condition, polls, deadline)
        finally:  # a backend error too: no watcher or stager thread, nor pidfd, outlives its run
            if stager is not None:
                stager.stop()
            if watcher is not None:
                watcher.stop()
        if stager is not None and stager.failed is not None and reason is None:
            reason = stager.failed
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

    def _end_first_stage(self, polls: Polls, watcher: ProcWatcher | None, ready: Snapshot,
                         baseline: Snapshot) -> float:
        """End the first stage's holders (the run's origin is just before), start the ``/proc`` watcher; the wall
        time of the origin."""
        for i in self.stages[0]:
            self.held_at_signal[i] = _above(ready, baseline, self.holders[i].device)
        wall = time.time()
        polls.origin = time.monotonic_ns()
        for i in self.stages[0]:
            self.watches[i].signal_ns = time.monotonic_ns()
            self.holders[i].end(self.ending)
        if watcher is not None:  # after the signals: their instants stay as close together as they can be
            for i in self.stages[0]:
                watcher.start_at(self.phases[i], self.watches[i].signal_ns)
            watcher.start()
        return wall

    def _poll(self, session: Session, condition: Predicate, polls: Polls, deadline: int) -> str | None:
        """Poll until clean (or the deadline), then wait for the reapers; why the run timed out, or ``None``."""
        reason: str | None = None
        try:
            poll_until(
                lambda: session.snapshot(self.indices, fields=Fields.WAIT),
                condition,
                timeout=max(0.0, (deadline - time.monotonic_ns()) / _NS),
                policy=PRECISE if self.config.mode == "precise" else DEFAULT,
                stable_polls=self.config.stable_polls,
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
        return reason

    def _stages(self) -> list[list[int]]:
        """The holders (by position) ended together, stage by stage: an IPC group's first side, then the other;
        every other run ends all its holders in one stage."""
        everyone = list(range(len(self.holders)))
        if self.spec.kind != "ipc" or not self.cell.importers:
            return [everyone]
        exporters = [i for i in everyone if self.holders[i].role != "importer"]
        importers = [i for i in everyone if self.holders[i].role == "importer"]
        return [exporters, importers] if self.cell.first != "importers" else [importers, exporters]

    def _phase_watcher(self) -> ProcWatcher | None:
        """The ``/proc`` watcher for this run's holders (``None`` with ``phases=False``)."""
        if not self.config.phases:
            return None
        self.phases, watcher = watch_phases([h.pid for h in self.holders], precise=self.config.mode == "precise",
                                            device_files=self.config.device_files)
        return watcher

    def _device_run(self, i: int, baseline: Snapshot, ready: Snapshot, origin: int) -> DeviceRun:
        holder, reaper, w = self.holders[i], self.reapers[i], self.watches[i]
        base = baseline.device(holder.device)
        now = ready.device(holder.device)
        base_used = base.memory.used_bytes if base.memory is not None else None
        held = now.memory.used_bytes - base_used if now.memory is not None and base_used is not None else None

        ended = w.signal_ns != 0  # a later stage is never ended when the one before it was not reaped in time

        def rel(t: int | None) -> int | None:
            return None if t is None or not ended else t - w.signal_ns

        phases = phase_fields(w, self.phases[i] if self.phases else None, reaper.reaped_ns)
        if not ended:
            phases.update({f"{p}_ns": None for p in ("zombie", "exited", "files_closed")})
            phases["unknown"] = {"signal": "never ended: the stage before it was not reaped before the run timeout"}
        return DeviceRun(
            index=holder.device, uuid=base.uuid, name=base.name, pid=holder.pid, baseline_used_bytes=base_used,
            held_bytes=held, signal_ns=w.signal_ns - origin if ended else 0, last_held_ns=rel(w.last_held),
            first_clean_ns=rel(w.first_clean), off_list_ns=rel(w.off_list_at), memory_back_ns=rel(w.memory_back_at),
            waitpid_ns=rel(reaper.reaped_ns), exit_status=reaper.status,
            holder_steps=dict(holder.steps), role=holder.role, held_at_signal_bytes=self.held_at_signal.get(i),
            **phases,
        )

    def _record(self, wall: float, polls: Polls, baseline: Snapshot, ready: Snapshot, reason: str | None) -> RunRecord:
        from .. import __version__

        devices = tuple(self._device_run(i, baseline, ready, polls.origin) for i in range(len(self.holders)))
        columns = None
        if self.config.trace:
            idx = [d.index for d in baseline.devices]
            columns = ("offset_ns", *(f"used_bytes[{i}]" for i in idx), *(f"process_count[{i}]" for i in idx))
        return RunRecord(
            run=self.number, repeat=self.repeat, warmup=self.warmup, size_bytes=self.size, ending=self.ending,
            mode=self.config.mode, backend=baseline.backend, driver=baseline.system.driver_version,
            nvmlcheck=__version__, wall_time=wall, timed_out=reason is not None, timeout_s=self.config.run_timeout_s,
            timeout_reason=reason, polls=len(polls.ends), poll_interval_ns=median_int(polls.intervals()),
            poll_cost_ns=median_int(polls.costs), poll_cost_max_ns=max(polls.costs, default=0), devices=devices,
            trace_columns=columns,
            trace=tuple(compact(polls.rows)) if self.config.trace else None,
            holder=self.config.holder, holder_count=self.config.holder_count, per_gpu=self.config.per_gpu,
            concurrent=self.config.concurrent, pinned_bytes=self.cell.pinned_bytes,
            pin_mode=self.config.pin_mode if self.config.holder == "pinned" else None,
            importers=self.cell.importers, first=self.cell.first,
            stage_gap_s=self.config.stage_gap_s if len(self.stages) > 1 else None,
            **simulated_by(self.factory),
        )

    def _clean_up(self) -> None:
        """Whatever happened: no holder outlives its run, and none is left unreaped."""
        for h in self.holders:
            h.kill_quietly()
        reaping = set()
        for r in self.reapers:
            # An interrupt (Ctrl-C) can come while the reapers are being started: one not started (or not yet seen
            # started) cannot be joined, and its holder is waited for here instead (whichever waits first reaps it;
            # the other gets ECHILD), never left a zombie, nor the interrupt turned into a RuntimeError.
            try:
                r.join(10.0)
            except RuntimeError:
                continue
            reaping.add(r.holder.pid)
        for h in self.holders:
            if h.pid not in reaping and h.process.returncode is None:
                with contextlib.suppress(ChildProcessError, subprocess.TimeoutExpired):
                    h.process.wait(10.0)
            h.close()
        if self.holders:
            self.factory.finish(self.holders)


def simulated_by(factory: object) -> dict[str, Any]:
    """A record's ``simulated``, ``simulation`` and ``simulated_reason`` from the holder factory, which says whether it
    simulates (``simulated``: ``True`` for :class:`~nvmlcheck.study.stub_holder.StubHolderFactory`, whose
    ``simulation`` says what, ``False`` for :class:`CudaHolderFactory`); one that does not say leaves it unknown."""
    simulated = getattr(factory, "simulated", None)
    if not isinstance(simulated, bool):
        return {"simulated": None, "simulation": None,
                "simulated_reason": f"the holder factory ({type(factory).__name__}) does not say whether it simulates "
                                    "(no 'simulated' attribute)"}
    what = getattr(factory, "simulation", None) if simulated else None
    return {"simulated": simulated, "simulation": what if isinstance(what, str) else None, "simulated_reason": None}


def _above(snap: Snapshot, baseline: Snapshot, index: int) -> int | None:
    """GPU ``index``'s used memory in ``snap`` above its baseline (``None``: unknown)."""
    try:
        now, base = snap.device(index).memory, baseline.device(index).memory
    except KeyError:
        return None
    return None if now is None or base is None else now.used_bytes - base.used_bytes


class _Stager(threading.Thread):
    """Ends a run's later stages: once every holder of a stage is reaped, waits ``stage_gap_s`` and ends the next
    stage, recording what the GPU still held just before (``held_at_signal``). ``failed`` says why it stopped
    early (a stage not reaped before the run's deadline)."""

    def __init__(self, run: _Run, polls: Polls, baseline: Snapshot, watcher: ProcWatcher | None,
                 deadline_ns: int) -> None:
        super().__init__(name="nvmlcheck-study-stages", daemon=True)
        self.run_ = run
        self.polls = polls
        self.baseline = baseline
        self.watcher = watcher
        self.deadline_ns = deadline_ns
        self.failed: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        r = self.run_
        for done, nxt in itertools.pairwise(r.stages):
            for i in done:
                r.reapers[i].join(max(0.0, (self.deadline_ns - time.monotonic_ns()) / _NS))
            if any(r.reapers[i].reaped_ns is None for i in done):
                self.failed = "a stage was not reaped before the run timeout: the next stage was never ended"
                return
            if self._stop_event.wait(r.config.stage_gap_s):
                return
            for i in nxt:
                h = r.holders[i]
                used = self.polls.last_used.get(h.device)
                base = self.baseline.device(h.device).memory
                r.held_at_signal[i] = None if used is None or base is None else used - base.used_bytes
            for i in nxt:
                r.watches[i].signal_ns = time.monotonic_ns()
                r.holders[i].end(r.ending)
            if self.watcher is not None:
                for i in nxt:
                    self.watcher.start_at(r.phases[i], r.watches[i].signal_ns)

    def stop(self) -> None:
        """The observation ended: end no further stage, and wait for the thread."""
        self._stop_event.set()
        self.join(10.0)
