"""The runner: :func:`run_study` runs the planned runs one after another; each run (``_Run``) takes a baseline,
starts the holders, waits until NVML shows them, ends them and observes until the GPUs are clean (steps (a) to (e)
of docs/study-records.md)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..errors import WaitTimeout
from ..model import Fields, Snapshot
from ..predicates import memory_back_to, on_devices, pids_gone
from ..wait import DEFAULT, PRECISE, is_transient, poll_until
from .config import Ending, StudyConfig
from .errors import BaselineNotClean, HolderError, StudyError
from .holders import CudaHolderFactory, Holder, HolderFactory
from .observer import Polls, Reaper, Watch, baseline_predicate, compact, not_ready, phase_fields
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


class _Run:
    """One run, steps (a) to (e) of docs/study-records.md. State lives in attributes so the steps stay small."""

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
        self.reapers: list[Reaper] = []
        self.watches: list[Watch] = []
        self.phases: list[PhaseWatch] = []

    def execute(self, *, first: bool) -> RunRecord:
        baseline = self._baseline(0.0 if first else self.config.settle_timeout_s)
        try:
            for index in self.indices:
                for _ in range(self.config.per_gpu):
                    self.holders.append(self.factory.start(index, self.size))
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
            while True:
                snap = session.snapshot(self.indices, fields=Fields.WAIT)
                for failure in snap.failures:  # a lost or unreadable GPU is a backend error, not a dirty one
                    if not is_transient(failure.error):
                        raise failure.error
                verdict = baseline_predicate(snap).evaluate(snap)
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

        def rel(t: int | None) -> int | None:
            return None if t is None else t - w.signal_ns

        return DeviceRun(
            index=holder.device, uuid=base.uuid, name=base.name, pid=holder.pid, baseline_used_bytes=base_used,
            held_bytes=held, signal_ns=w.signal_ns - origin, last_held_ns=rel(w.last_held),
            first_clean_ns=rel(w.first_clean), off_list_ns=rel(w.off_list_at), memory_back_ns=rel(w.memory_back_at),
            waitpid_ns=rel(reaper.reaped_ns), exit_status=reaper.status,
            holder_steps=dict(holder.steps),
            **phase_fields(w, self.phases[i] if self.phases else None, reaper.reaped_ns),
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
