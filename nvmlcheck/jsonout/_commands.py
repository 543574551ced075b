"""The documents of the CLI's commands, built from what the library returns (docs/cli.md documents each field)."""

from __future__ import annotations

from ._values import document, error_json, holder_json, snapshot_json

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from ..compare import Comparison
    from ..errors import WaitTimeout
    from ..events import ListeningGap
    from ..holders import Holder, KillSelection
    from ..hosts import HostResult
    from ..kill import KillPlan, KillResult, KillTimeout
    from ..model import Snapshot
    from ..selection import Selection, SelectTimeout
    from ..slurm import GateResult, NodeState, ScontrolRun
    from ..study import FitResult, StudyResult, SummaryRow
    from ..verdict import Culprit, ReadyReport
    from ..wait import WaitResult


def snapshot_document(snap: Snapshot) -> dict[str, Any]:
    """The ``nvmlcheck/snapshot`` document: every device, its failures and the system."""
    return document("snapshot", **snapshot_json(snap))


def holders_document(backend: str, holders: Sequence[Holder]) -> dict[str, Any]:
    """The ``nvmlcheck/holders`` document: each process that holds a selected GPU, and how it was found."""
    return document("holders", backend=backend, holders=[holder_json(h) for h in holders])


def wait_document(result: WaitResult) -> dict[str, Any]:
    """The ``nvmlcheck/wait`` document of a wait that ended clean."""
    return document(
        "wait",
        clean=True,
        elapsed_ns=result.elapsed_ns,
        first_clean_ns=result.clean_ns,  # deprecated: clean_ns (version 2 kept it: it goes in version 3)
        clean_ns=result.clean_ns,
        confirmed_ns=result.confirmed_ns,
        last_dirty_ns=result.last_dirty_ns,
        polls=result.polls,
        poll_cost_ns=result.poll_cost_ns,
        interval_ns=result.interval_ns,
        culprits=[],
        holders=[],
        snapshot=snapshot_json(result.snapshot),
        listening_gaps=gaps_json(result.listening_gaps),
    )


def gaps_json(gaps: Sequence[ListeningGap] | None) -> list[dict[str, Any]] | None:
    """``listening_gaps`` (added within ``nvmlcheck/wait``'s and ``nvmlcheck/kill``'s version 2 and
    ``nvmlcheck/ready``'s version 1): when the event listener did not listen to selected GPUs during the wait (``[]``:
    it listened throughout; ``null``: the wait did not listen)."""
    return None if gaps is None else [g.to_json() for g in gaps]


def wait_timeout_document(exc: WaitTimeout, kind: str = "wait", **extra: Any) -> dict[str, Any]:
    """The ``nvmlcheck/wait`` document of a wait that timed out; with ``kind="kill"`` the common part of a kill's,
    ``extra`` its kill fields."""
    return document(
        kind,
        clean=False,
        elapsed_ns=exc.elapsed_ns,
        timeout_s=exc.timeout_s,
        polls=exc.polls,
        culprits=list(exc.culprits),
        holders=holders_json(exc.holders),
        snapshot=None if exc.snapshot is None else snapshot_json(exc.snapshot),
        **extra,
    )


def holders_json(culprits: Sequence[Culprit]) -> list[dict[str, Any]]:
    """Structured culprits (:class:`~nvmlcheck.verdict.Culprit`) as the ``holders`` list of a document."""
    return [c.to_json() for c in culprits]


def ready_document(report: ReadyReport, *, exit_code: int, need_bytes: int | None = None,
                   need_fraction: float | None = None) -> dict[str, Any]:
    """The ``nvmlcheck/ready`` document (version 1): one verdict per GPU, its culprits as lines and as data."""
    return document(
        "ready",
        ready=report.ready,
        needs_operator=report.needs_operator,
        exit_code=exit_code,
        elapsed_ns=report.elapsed_ns,
        polls=report.polls,
        timeout_s=report.timeout_s,
        need_bytes=need_bytes,
        need_fraction=need_fraction,
        gpus=[v.to_json() for v in report.verdicts],
        culprits=list(report.culprits),
        holders=holders_json(report.holders),
        notes=list(report.notes),
        snapshot=None if report.snapshot is None else snapshot_json(report.snapshot),
        listening_gaps=gaps_json(report.listening_gaps),
    )


def left_alone_json(selection: KillSelection | None, plan: KillPlan | None = None) -> list[dict[str, Any]]:
    """The holders ``--all-holders``/``--all-on-gpu`` did not signal, and the processes ``--match``/``--container``
    chose but left alone (``plan``), with why (a kill's ``left_alone``)."""
    out = [] if selection is None else [{"pid": h.pid, "name": h.name, "reason": why} for h, why in selection.skipped]
    if plan is not None:
        from .._proc import procfs

        for pid, why in plan.left_alone:
            st = procfs.read_stat(pid)
            out.append({"pid": pid, "name": None if st is None else st.comm, "reason": why})
    return out


def kill_document(result: KillResult, plan: KillPlan, selection: KillSelection | None) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of a kill that ended clean (``selection``: what ``--all-*`` chose)."""
    return document("kill", **result.to_json(), left_alone=left_alone_json(selection, plan),
                    vanished=list(plan.vanished), holders=[], snapshot=snapshot_json(result.snapshot),
                    listening_gaps=gaps_json(result.wait.listening_gaps))


def kill_timeout_document(exc: KillTimeout, plan: KillPlan, selection: KillSelection | None) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of a kill that timed out (the fields of every timeout's: docs/cli.md)."""
    kill = exc.to_json()
    kill.pop("clean", None)  # the wait's part says it, first
    fields = {"signal": kill.pop("signal"), "tree": plan._set.tree, **kill,
              "left_alone": left_alone_json(selection, plan), "vanished": list(plan.vanished)}
    return wait_timeout_document(exc, "kill", **fields)


def kill_plan_document(
    targets: Sequence[dict[str, Any]], *, signal_name: str, tree: bool, grace_s: float | None,
    left_alone: Sequence[tuple[int, str]], missing: Sequence[int], notes: Sequence[str] = (),
    names: dict[int, str | None] | None = None,
) -> dict[str, Any]:
    """The ``nvmlcheck/kill-plan`` document of ``kill --dry-run``: what would be signalled, nothing was. Each target:
    ``pid``, ``name``, ``found_by``, ``parent``, ``cmdline``, ``container`` (``{kind, id, label, cgroup}`` or
    ``null``), ``discarded`` (why SIGKILL would go at once), ``gpus`` (added in version 1: what a holder
    ``--all-*`` chose holds, as ``nvmlcheck/holders`` gives it; ``null`` for a target chosen otherwise). Each of
    ``left_alone``: ``pid``, ``reason`` and (added) ``name`` (``names``, else its ``comm``; ``null`` when gone).
    ``notes`` (added): what the selection could not read, the device-file rule when stand-ins count."""
    def name_of(pid: int) -> str | None:
        if names is not None and pid in names:
            return names[pid]
        from .._proc import procfs

        st = procfs.read_stat(pid)
        return None if st is None else st.comm

    return document("kill-plan", signal=signal_name, tree=tree, grace_s=grace_s, targets=list(targets),
                    left_alone=[{"pid": pid, "name": name_of(pid), "reason": why} for pid, why in left_alone],
                    missing=list(missing), notes=list(notes))


def nothing_to_kill_document(
    result: WaitResult, *, signal_name: str, tree: bool, selection: KillSelection | None
) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of ``--all-*`` (or ``--missing-ok``) with nothing to signal, whose plain wait
    ended clean: :func:`kill_document`'s fields, with no target, none missing, and the GPUs judged."""
    return document("kill", clean=True, signal=signal_name, tree=tree, pids=[], clean_ns=result.clean_ns,
                    confirmed_ns=result.confirmed_ns, resolution_ns=max(result.interval_ns, result.poll_cost_ns),
                    missing=[], judged="gpus", not_ours=[], left_alone=left_alone_json(selection), vanished=[],
                    holders=[], snapshot=snapshot_json(result.snapshot),
                    listening_gaps=gaps_json(result.listening_gaps))


def nothing_to_kill_timeout_document(
    exc: WaitTimeout, *, signal_name: str, tree: bool, selection: KillSelection | None
) -> dict[str, Any]:
    """The ``nvmlcheck/kill`` document of ``--all-*`` (or ``--missing-ok``) with nothing to signal, whose plain wait
    timed out: :func:`kill_timeout_document`'s fields."""
    return wait_timeout_document(exc, "kill", signal=signal_name, tree=tree, pids=[], tree_hint=[], missing=[],
                                 judged="gpus", left_alone=left_alone_json(selection), vanished=[])


def select_document(
    selection: Selection, *, count: int, format: str, timeout_s: float | None, value: str,
    holder_pid: int | None, owner_pid: int,
) -> dict[str, Any]:
    """The ``nvmlcheck/select`` document of GPUs found; ``lock`` is set when ``selection`` holds locks (then handed
    to ``holder_pid`` until ``owner_pid`` exits)."""
    locks = selection.locks
    lock = None if locks is None else {"dir": str(locks.directory), "uuids": list(locks.uuids),
                                       "holder_pid": holder_pid, "owner_pid": owner_pid}
    selected = [{"index": d.index, "uuid": d.uuid, "name": d.name, "pci_bus_id": d.pci_bus_id}
                for d in selection.devices]
    return document("select", count=count, format=format, timeout_s=timeout_s, found=True, value=value,
                    selected=selected, passed_over=list(selection.passed_over), elapsed_ns=selection.elapsed_ns,
                    polls=selection.polls, lock=lock, holders=[], snapshot=snapshot_json(selection.snapshot))


def select_timeout_document(
    exc: SelectTimeout, *, count: int, format: str, timeout_s: float | None
) -> dict[str, Any]:
    """The ``nvmlcheck/select`` document of a selection that timed out."""
    return document("select", count=count, format=format, timeout_s=timeout_s, found=False, value=None, selected=[],
                    passed_over=list(exc.culprits), elapsed_ns=exc.elapsed_ns, polls=exc.polls, lock=None,
                    holders=holders_json(exc.holders),
                    snapshot=None if exc.snapshot is None else snapshot_json(exc.snapshot))


def hosts_document(command: str, results: Sequence[HostResult], code: int) -> dict[str, Any]:
    """The ``nvmlcheck/hosts`` document (version 1): one verdict over every host, each host's own document."""

    def entry(r: HostResult) -> dict[str, Any]:
        return {
            "host": str(r.host),
            "verdict": r.verdict,
            "exit_code": r.exit_code,
            "via": r.via,
            "note": r.note,
            "elapsed_ns": r.elapsed_ns,
            "document": r.document,
            "error": None if r.error is None else {**error_json(r.error), "kind": r.error.kind, "host": r.error.host},
        }

    def named(verdict: str) -> list[str]:
        return [str(r.host) for r in results if r.verdict == verdict]

    return document("hosts", command=command, exit_code=code, clean=named("clean"), not_clean=named("not-clean"),
                    failed=named("failed"), unhealthy=named("unhealthy"), hosts=[entry(r) for r in results])


def study_reclaim_document(
    result: StudyResult, rows: Sequence[SummaryRow], *, out: str | None, plots: Sequence[str]
) -> dict[str, Any]:
    """The ``nvmlcheck/study-reclaim`` document: the summary and every record (without its trace: ``--out`` keeps
    those)."""
    from ..study import RECORD_SCHEMA, RECORD_VERSION

    timed_out = [r for r in result.records if r.timed_out]
    return document(
        "study-reclaim",
        complete=not timed_out,
        runs=len(result.records),
        measured_runs=len(result.measured),
        timed_out_runs=[r.run for r in timed_out],
        record_schema={"schema": RECORD_SCHEMA, "version": RECORD_VERSION},
        out=out,
        plots=list(plots),
        summary=[row.to_json() for row in rows],
        records=[{**r.to_json(), "trace": None} for r in result.records],
        stopped=result.stopped,
    )


def study_fit_document(result: FitResult, paths: Sequence[str]) -> dict[str, Any]:
    """The ``nvmlcheck/study-fit`` document: the fitted reclaim-time model, what was fitted and kept, its error and
    every cell against it, from the record files ``paths``."""
    return document("study-fit", records=list(paths), **_integer_times(result.to_json()))


def _integer_times(value: Any) -> Any:
    """``value`` with each ``*_ns`` number an integer (rounded): times in a document are integers in ns, while a fit's
    medians and percentiles are computed as floats (``residual_p95_ns`` 2653528.25, ``cells[].measured_ns`` ...)."""
    if isinstance(value, dict):
        return {k: round(v) if k.endswith("_ns") and isinstance(v, float) else _integer_times(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_integer_times(v) for v in value]
    return value


def compare_document(result: Comparison, a: str, b: str) -> dict[str, Any]:
    """The ``nvmlcheck/study-compare`` document with the two record files compared."""
    return {**result.to_json(), "a": a, "b": b}


def demo_document(result: KillResult) -> dict[str, Any]:
    """The ``nvmlcheck/demo`` document: when the demo's child left the OS and the process list, and when the memory
    was back."""
    t = result.pids[0]
    return document(
        "demo",
        pid=t.pid,
        exited_ns=t.exited_ns,
        off_gpu_ns=t.off_gpu_ns,
        clean_ns=result.clean_ns,
        confirmed_ns=result.confirmed_ns,
        resolution_ns=result.resolution_ns,
    )


def error_document(exc: BaseException, exit_code: int) -> dict[str, Any]:
    """The ``nvmlcheck/error`` document of a command that failed with ``exc`` and exits with ``exit_code``; a kill
    that failed after its first signal adds ``pids``, each target's record (:func:`nvmlcheck.kill.kill_records`)."""
    if hasattr(exc, "_nvmlcheck_kill_pids"):
        from ..kill import kill_records

        records = kill_records(exc)
        if records is not None:
            return document("error", error=error_json(exc), exit_code=exit_code, pids=[r.to_json() for r in records])
    return document("error", error=error_json(exc), exit_code=exit_code)


def usage_error_document(message: str, exit_code: int) -> dict[str, Any]:
    """The ``nvmlcheck/error`` document of an argument error (``message`` as argparse words it)."""
    return document("error", error={"type": "UsageError", "message": message}, exit_code=exit_code)


def slurm_document(
    result: GateResult,
    *,
    node: str,
    node_state: NodeState | None,
    node_state_error: str | None,
    reason: str | None,
    scontrol: Sequence[ScontrolRun],
    exit_code: int,
    dry_run: bool,
    timeout_s: float,
) -> dict[str, Any]:
    """The ``nvmlcheck/slurm`` document (version 1) of one ``slurm epilog|prolog|health`` run: the judgement, the
    causes and the drain reason made of them, what was killed or left alone, the node's state as read before acting,
    and every scontrol command (run, or printed under ``--dry-run``). ``timeout_s``: the command's ``--timeout``."""
    return document(
        "slurm",
        **{**result.to_json(), "timeout_s": timeout_s},
        node=node,
        node_state=None if node_state is None else node_state.to_json(),
        node_state_error=node_state_error,
        reason=reason,
        scontrol=[run.to_json() for run in scontrol],
        exit_code=exit_code,
        dry_run=dry_run,
    )
