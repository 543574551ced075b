"""``nvmlcheck kill`` and ``nvmlcheck holders``.

Targets named without the GPUs (PIDs, ``--match``, ``--container``/``--cgroup``, with ``--tree`` and ``--devices``)
are selected, validated, pinned and signalled with the operating system alone (:func:`signal_first`, run before the
simulation or NVML is loaded), so the driver starts tearing the process down while nvmlcheck opens NVML; a device
selection's syntax is checked before the signal and its existence right after. When the targets depend on what the
GPUs show (``--all-holders``, ``--all-on-gpu``), or the judgement needs the GPUs as they were before the signal
(``--only-targets``), NVML is opened first and nothing is signalled until every input has been checked.
"""

from __future__ import annotations

import sys
import time

from .._proc import signals
from . import _common
from ._common import (
    EXIT_CLEAN,
    EXIT_NOT_CLEAN,
    UsageError,
    hosts_wanted,
    open_session,
    start_events,
    verdict,
    verdict_printed,
    wait_predicate,
)
from ._output import (
    StatusLine,
    human_bytes,
    load_json_output,
    no_signal_words,
    print_json,
    safe,
    safe_lines,
    status_updater,
)

TYPE_CHECKING = False  # typing costs start-up time where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

    from .._proc.selectors import Exclusion
    from .._proc.targets import TargetSet
    from ..holders import Holder, KillSelection
    from ..kill import KillPlan, KillResult, KillTimeout
    from ..session import Session
    from ..wait import WaitOptions


def _selectors(args: argparse.Namespace) -> bool:
    """Whether targets are chosen by a selector (``--match``, ``--container``, ``--cgroup``)."""
    return bool(args.match is not None or args.container is not None or args.cgroup is not None)


def _plain_device(item: int | str) -> bool:
    """A device selector whose syntax alone is checked before the signal: an index, ``cuda:N``/``cuda:all``, or a
    ``GPU-``/``MIG-`` UUID (prefix). Anything else is resolved with NVML before anything is signalled."""
    if isinstance(item, int):
        return True
    return item[:5].lower() == "cuda:" or item[:4].upper() in ("GPU-", "MIG-")


def _early(args: argparse.Namespace) -> bool:
    """Whether the first signal can go out before NVML: targets named without the GPUs, every input's syntax
    checked (argparse, :func:`_select`); the devices' existence is checked right after the signal."""
    if hosts_wanted(args):
        return False  # the PIDs are on the hosts: nothing is signalled here
    if args.all_holders or args.all_on_gpu or args.simulate or args.only_targets:
        return False
    return (bool(args.pids) or _selectors(args)) and all(_plain_device(d) for d in args.devices or ())


def _exclusion(args: argparse.Namespace) -> Exclusion:
    """``--exclude``, each word a PID (ASCII digits) or a pattern (``--match``'s syntax); a bad one is a usage error,
    with nothing signalled."""
    from .._proc import selectors
    from .._text import is_digits

    words = [int(w) if is_digits(w) else w for w in args.exclude or ()]
    try:
        return selectors.check_exclude(words)
    except ValueError as exc:
        raise UsageError(f"{exc}; nothing was signalled") from None


def _select(args: argparse.Namespace) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    """The processes ``--match``/``--container``/``--cgroup`` choose, less ``--exclude``, and those left alone with
    why; a selector's bad syntax is a usage error, with nothing signalled."""
    from .._proc import selectors

    chosen: list[tuple[int, int, str]] = []
    skipped: list[tuple[int, str]] = []
    exclusion = _exclusion(args)
    try:
        parts = []
        if args.match is not None:
            parts.append(selectors.by_match(selectors.check_pattern(args.match)))
        if args.container is not None:
            parts.append(selectors.by_container(selectors.check_container(args.container)))
        if args.cgroup is not None:
            parts.append(selectors.by_container(selectors.check_container(args.cgroup, path_only=True)))
    except ValueError as exc:
        raise UsageError(f"{exc}; nothing was signalled") from None
    for got, left in parts:
        kept, excluded = exclusion.split(got)
        chosen += [c for c in kept if all(c[0] != k[0] for k in chosen)]
        skipped += [s for s in left + excluded if s not in skipped]
    return chosen, skipped


def _nothing_selected(args: argparse.Namespace, skipped: list[tuple[int, str]]) -> str:
    what = " and ".join(f"{flag} {value!r}" for flag, value in (("--match", args.match), ("--container",
                        args.container), ("--cgroup", args.cgroup)) if value is not None)
    alone = "; ".join(f"pid {pid}: {why}" for pid, why in skipped)
    return f"{what} selected no process" + (f" (left alone: {alone})" if alone else "")


def prepare_targets(args: argparse.Namespace, holders: Any = (),
                    left_out: Sequence[tuple[int, str]] = (), selection: KillSelection | None = None
                    ) -> TargetSet | None:
    """Select (selectors), validate and pin every target, show the plan, and with ``--dry-run`` print it and stop
    (:class:`DryRun`, whatever there is to signal: a dry run never asks and never waits), else confirm what a
    selector or ``--all-*`` chose: everything before the first signal, OS only. The plan and the prompt go to
    stderr (stdout is the output alone: one document with ``--json``). ``left_out``: the holders ``--all-*`` did
    not choose, with why (the dry run's document lists them, with ``selection``'s notes and names). ``None``:
    nothing to signal (``--missing-ok``, or the holders found none and nothing else was named)."""
    from .._proc.targets import Refused, prepare

    chosen: list[tuple[int, int, str]] = []
    skipped: list[tuple[int, str]] = []
    if _selectors(args):
        with _common.proc_reading_bound(args):  # every process's command line or cgroup: a read may hang
            chosen, skipped = _select(args)
    holders = list(holders)
    if _selectors(args) and not chosen and not args.pids and not holders and not (args.all_holders or
                                                                                  args.all_on_gpu):
        if not args.missing_ok:
            raise UsageError(_nothing_selected(args, skipped) + "; nothing was signalled (--missing-ok: not an "
                             "error)")
        print(f"nvmlcheck: {_nothing_selected(args, skipped)}", file=sys.stderr)
    sig = signals.number(args.signal)
    if not chosen and not args.pids and not holders:
        if args.dry_run:
            _print_empty_dry_run(sig, args, [*left_out, *skipped], selection)
            verdict_printed(EXIT_CLEAN)
            raise DryRun
        return None
    exclusion = _exclusion(args) if args.exclude else None  # imports the selectors only when asked to
    # An --exclude pattern reads each target's command line (the plan too): a read that never returns (the
    # memory-map lock of a process stuck in the driver) is watched as the selectors' scan is, not waited for.
    with _common.proc_reading_bound(args) if exclusion is not None and exclusion.patterns else _NoBound():
        try:
            found = prepare(args.pids, tree=args.tree, holders=holders, missing_ok=args.missing_ok, found=chosen,
                            exclude=exclusion.why if exclusion else None)
        except Refused as exc:
            from ..kill import _public

            raise _public(exc) from None
    found.left_alone[:0] = skipped
    try:
        if _selectors(args) or args.dry_run:
            with _common.proc_reading_bound(args):
                if args.tree:
                    found.scan_descendants()  # shown as they will be signalled (send_first scans again for late ones)
                _show_plan(found, sig, args)  # --json too: what is confirmed is seen (stderr)
        if args.dry_run:
            _print_dry_run(found, sig, args, left_out=left_out, holders=holders, selection=selection)
            verdict_printed(EXIT_CLEAN)
            raise DryRun
        asked = {pid for pid, _, _ in chosen} | {h.pid for h in holders}  # named too: --yes is for what they chose
        _confirm(sum(t.pid in asked for t in found.items), args.yes)
    except BaseException:
        found.close()
        raise
    return found


class DryRun(Exception):
    """``--dry-run``: the plan is printed and nothing was signalled (exit 0)."""


def signal_first(args: argparse.Namespace) -> None:
    """Select, pin and signal the targets before anything of the GPU side is loaded (kept in ``args.signalled``)."""
    args.signalled = None
    args.signalling_plan = None
    args.dry_run_done = False
    args.selected_nothing = False
    if signals.number(args.signal) in signals.STOP_SIGNALS:  # every form, before anything is read or signalled
        raise UsageError(f"--signal {args.signal}: {signals.stop_refusal(signals.number(args.signal))}")
    if not _early(args):
        return
    try:
        found = prepare_targets(args)
    except DryRun:
        args.dry_run_done = True
        return
    if found is None:
        args.selected_nothing = True  # --missing-ok: cmd_kill waits for the GPUs without selecting again
        return
    from .._proc.targets import Refused

    try:
        found.send_first(signals.number(args.signal), sigkill_if_discarded=args.grace is not None)
    except Refused as exc:  # a descendant's /proc entry could not be read (out of descriptors)
        from ..kill import _public

        found.close()
        raise _public(exc) from None
    args.signalled = found


# --- the plan --------------------------------------------------------------------------------------------------------


def _plan_entries(found: TargetSet, sig: int, holders: Sequence[Holder] = ()) -> list[dict[str, Any]]:
    """One entry per target as it will be signalled: pid, name, how found, command line, container, the first
    signal's fate (why SIGKILL goes at once, else ``None``), and what a holder ``--all-*`` chose holds (``gpus``;
    ``None`` for a target chosen otherwise)."""
    from .._proc import container, fate, procfs

    held = {h.pid: h.gpus for h in holders}
    if held:
        from ..jsonout._values import gpu_use_json
    out = []
    for t in found.items:
        argv = procfs.cmdline(t.pid)
        where = container.container_of(t.pid)
        out.append({
            "pid": t.pid, "name": t.pinned.comm, "found_by": t.found_by, "parent": t.parent,
            "cmdline": list(argv) if argv else None,
            "container": None if where is None else {"kind": where.kind, "id": where.id, "label": where.label(),
                                                     "cgroup": where.cgroup},
            "discarded": fate.fate_of(t.pid, sig),
            "gpus": [gpu_use_json(g) for g in held[t.pid]] if t.pid in held else None,
        })
    return out


def _grace_s(args: argparse.Namespace) -> float | None:
    """``--grace`` as the plan shows it: ``None`` (never), else seconds, ``-0`` read as 0."""
    return None if args.grace is None else args.grace + 0.0  # -0.0 + 0.0 is 0.0


def _show_plan(found: TargetSet, sig: int, args: argparse.Namespace) -> None:
    grace_s = _grace_s(args)
    grace = "never" if grace_s is None else f"{grace_s:g} s"
    escalation = f"SIGKILL after {grace} to what is left"
    if grace_s is not None and args.timeout is not None and grace_s > args.timeout:
        # The kill ends at its timeout, and the grace period's SIGKILL with it: say so, not a SIGKILL never sent.
        escalation = f"no SIGKILL: --timeout {args.timeout:g} s ends the kill before --grace {grace}"
    if sig == signals.SIGKILL:  # nothing to escalate to: "SIGKILL after 5 s" promised a second one never sent
        escalation = "no grace period: SIGKILL cannot be caught"
    print(f"plan: {signals.name(sig)} to {len(found.items)} process{'es' if len(found.items) != 1 else ''} "
          f"({escalation}):", file=sys.stderr)
    for e in _plan_entries(found, sig):
        cmd = " ".join(" ".join(e["cmdline"]).split()) if e["cmdline"] else e["name"]  # one line: no newlines
        origin = e["found_by"] + (f" of {e['parent']}" if e["parent"] else "")
        c = e["container"]
        where = f" [{c['label']}]" if c and (c["kind"] != "cgroup" or args.container or args.cgroup) else ""
        fate = ""
        if e["discarded"]:
            fate = (f" -> SIGKILL at once: {e['discarded']}" if args.grace is not None else
                    f" -> it will not exit: {e['discarded']} (--grace never: no SIGKILL)")
        print(f"  pid {e['pid']} ({origin}){where}: {cmd[:100]}{fate}", file=sys.stderr)
    for pid, why in found.left_alone:
        print(f"  left alone: pid {pid}: {why}", file=sys.stderr)
    for pid in found.missing:
        print(f"  missing: pid {pid} is gone already (--missing-ok)", file=sys.stderr)


def _selection_names(selection: KillSelection | None) -> dict[int, str | None]:
    return {} if selection is None else {h.pid: h.name for h, _ in selection.skipped}


def _print_dry_run(found: TargetSet, sig: int, args: argparse.Namespace, *,
                   left_out: Sequence[tuple[int, str]] = (), holders: Sequence[Holder] = (),
                   selection: KillSelection | None = None) -> None:
    if args.json:
        from ..jsonout import kill_plan_document

        print_json(kill_plan_document(_plan_entries(found, sig, holders), signal_name=signals.name(sig),
                                      tree=args.tree, grace_s=_grace_s(args),
                                      left_alone=[*left_out, *found.left_alone], missing=found.missing,
                                      notes=() if selection is None else selection.notes,
                                      names=_selection_names(selection)))
    else:
        print("dry run: nothing was signalled")


def _print_empty_dry_run(sig: int, args: argparse.Namespace, left_alone: Sequence[tuple[int, str]],
                         selection: KillSelection | None = None) -> None:
    """``--dry-run`` with nothing to signal (``--all-*`` found no holder, ``--missing-ok`` and no match): the empty
    plan; no wait for the GPUs."""
    if args.json:
        from ..jsonout import kill_plan_document

        print_json(kill_plan_document([], signal_name=signals.name(sig), tree=args.tree, grace_s=_grace_s(args),
                                      left_alone=left_alone, missing=[],
                                      notes=() if selection is None else selection.notes,
                                      names=_selection_names(selection)))
        return
    print(f"plan: nothing to signal ({signals.name(sig)} to no process)", file=sys.stderr)
    for pid, why in left_alone:
        print(f"  left alone: pid {pid}: {why}", file=sys.stderr)
    print("dry run: nothing was signalled")


# --- choosing targets with NVML --------------------------------------------------------------------------------------


#: The header of the holders table (also used, with the host in front, by ``--host``).
_HOLDER_HEADER = f"{'pid':>8}  {'user':<10} {'state':<8} {'found by':<19} {'GPUs':<24} command"


def _holder_line(h: Holder) -> str:
    who = f"{h.pid:>8}  {(h.user or '?')[:10]:<10} {(h.state or '?')[:8]:<8} {'+'.join(sorted(h.found_by)):<19}"
    gpus = ", ".join(f"{g.where} {human_bytes(g.used_bytes)}" for g in h.gpus) or "-"
    cmd = " ".join(h.cmdline) if h.cmdline else (h.name or "?")
    flags = f" [{h.daemon_kind}]" if h.daemon_kind else " [daemon]" if h.is_daemon else ""
    flags += f" [{h.relation}]" if h.relation else ""
    # Where it runs, as ready and the kill plan say it (the JSON has it as `container`, with `unknown.container`).
    why_not = h.why_unknown("container") if h.start_ticks is not None else None
    flags += f" [in {h.container}]" if h.container else " [container unknown]" if why_not else ""
    return safe(f"{who} {gpus:<24} {cmd[:80]}{flags}")


def _show_selection(selection: KillSelection) -> None:
    if selection.targets:
        print("to be signalled:", file=sys.stderr)
        for h in selection.targets:
            print("  " + safe(h.describe()), file=sys.stderr)
    for h, why in selection.skipped:
        print(safe(f"  left alone: pid {h.pid} ({h.name or '?'}): {why}"), file=sys.stderr)
    for note in selection.notes:
        print(f"  note: {safe(note)}", file=sys.stderr)


def _confirm(count: int, assume_yes: bool) -> None:
    """Ask on the terminal before signalling ``count`` processes a selector or ``--all-*`` chose (none: no
    question). The prompt goes to stderr, as the plan does: ``input()`` would write it to stdout, into the output
    (``--json``'s document)."""
    if assume_yes or count == 0:
        return
    what = "1 process" if count == 1 else f"{count} processes"
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to kill {what} without --yes (stdin is not a terminal); nothing was signalled")
    sys.stderr.write(f"kill {'this process' if count == 1 else f'these {count} processes'}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()  # "" at the end of input (Ctrl-D): no
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was signalled")


def _plan_with_nvml(args: argparse.Namespace, gpus: Session) -> tuple[KillPlan | None, KillSelection | None]:
    """Check every input (devices, PIDs, the holders to add) with NVML open, then send the first signal."""

    from .._deadline import left_s
    from ..errors import BackendUnavailable
    from ..holders import HoldersIncomplete, select_kill_holders
    from ..kill import KillPlan, baseline_by, resolve_by, setup_deadline

    # The selection's readings (UUIDs, cuda:N, MIG-) and the baseline stop at --timeout from now: a KillTimeout
    # (exit 3) that says nothing was signalled, never a signal sent after a reading overran the deadline.
    began = time.monotonic_ns()
    deadline_ns = setup_deadline(args.timeout, began)
    indices = resolve_by(gpus, args.devices, deadline_ns, time.monotonic_ns, timeout=args.timeout, began=began,
                         signal_name=args.signal)
    if indices is None and gpus.device_count() == 0:
        raise BackendUnavailable(
            f"the {gpus.backend_name} backend sees no GPU: nothing could prove the GPUs clean after the kill, so "
            "nothing was signalled", [f"{gpus.backend_name}: device count 0"])
    selection = None
    if args.all_holders or args.all_on_gpu:
        try:
            # The reading bounds its /proc part itself (a read that never returns, as a holder's command line under
            # the memory-map lock of a process stuck in the driver, is left behind at the deadline; with --timeout 0
            # once it has not returned in 1 s) and, with --timeout 0, its NVML calls by the GPU watchdog from its
            # start. A watchdog over the whole ended a slow scan that moved on 1 s after it began (--timeout 0), and
            # the two there were (GPU and /proc) fired together: two error reports.
            with _reading_bound(args) if args.timeout != 0 else _NoBound():
                # What the selection left of --timeout: used up, a bound still (HoldersIncomplete), never 0.
                left = None if deadline_ns is None else left_s(args.timeout, (time.monotonic_ns() - began) / 1e9)
                selection = select_kill_holders(gpus, args.devices, all_holders=args.all_holders, timeout=left)
        except HoldersIncomplete as exc:  # a selection from part of the holders is never signalled (exit 3)
            raise HoldersIncomplete(args.timeout, f"{exc.reason}; nothing was signalled", exc.found,
                                    exc.unscanned) from None
        if selection.refused is not None:
            raise UsageError(f"refusing --all-on-gpu: {selection.refused}; nothing was signalled")
        with _common.proc_reading_bound(args):  # an --exclude pattern reads each holder's command line again
            selection = _less_excluded(selection, _exclusion(args))
        _show_selection(selection)
        if not selection.targets and not args.pids:
            print("nothing to kill on the selected GPUs", file=sys.stderr)
    if getattr(args, "selected_nothing", False):
        return None, selection  # signal_first's selectors chose nothing (--missing-ok, said so): not read again
    holders = selection.targets if selection is not None else ()
    left_out = [] if selection is None else [(h.pid, why) for h, why in selection.skipped]
    found = prepare_targets(args, holders, left_out, selection)  # confirms what --all-* and the selectors chose, once
    if found is None:
        return None, selection
    plan = KillPlan(found)
    if args.only_targets:
        try:  # what the targets hold at the signal
            args.baseline = baseline_by(gpus, indices, deadline_ns, time.monotonic_ns, timeout=args.timeout,
                                        began=began, signal_name=args.signal)
        except BaseException:
            plan.close()
            raise
    # By number: a real-time signal (SIGRTMIN+1) is no member of signal.Signals. Reachable before it goes: an
    # interrupt between the signal and cmd_kill's holding the plan still reports what each target got.
    args.signalling_plan = plan
    plan.send_first(signals.number(args.signal), sigkill_if_discarded=args.grace is not None)
    return plan, selection


def _less_excluded(selection: KillSelection, exclusion: Exclusion) -> KillSelection:
    """``--all-*``'s selection with the holders ``--exclude`` names moved to those left alone, with why."""
    if not exclusion:
        return selection
    import dataclasses

    # One reading of each command line: two could disagree (a process that rewrites its own), and a holder be
    # both signalled and listed as excluded.
    whys = [(h, exclusion.why(h.pid)) for h in selection.targets]
    kept = [h for h, why in whys if why is None]
    excluded = [(h, why) for h, why in whys if why is not None]
    return dataclasses.replace(selection, targets=tuple(kept), skipped=(*selection.skipped, *excluded))


def _start_events_by_deadline(args: argparse.Namespace, gpus: Session, plan: KillPlan | None) -> None:
    """``--events``' listener, registered within the wait's time (``--timeout`` from the first signal; from now with
    nothing signalled) and, while the grace period runs, by its end: a slow registration must not hold back the
    SIGKILL (a GPU it could not register by then is named in the listener's reason). Under the hung-call watchdog as
    a wait's registration is."""
    import math
    import time

    from .._deadline import hung_after, ns_or_none

    if not getattr(args, "events", False):
        return
    found = plan._set if plan is not None else None
    origin = time.monotonic_ns() if found is None or found.started is None else found.started
    ends = [origin + ns for ns in (None if args.timeout is None else ns_or_none(args.timeout),
                                   None if found is None or found.escalated or args.grace is None
                                   or math.isinf(args.grace) else ns_or_none(args.grace))
            if ns is not None]
    deadline_ns = min(ends, default=None)
    with hung_after(deadline_ns):
        start_events(args, gpus, None if deadline_ns is None else deadline_ns / 1e9)


class _NoBound:
    """No watchdog: ``contextlib.nullcontext`` without importing ``contextlib`` (and the ``collections`` and
    ``functools`` it imports) before a named kill's first signal (tests/reliability/test_cli_launch.py)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _reading_bound(args: argparse.Namespace) -> Any:
    """The watchdog over a reading made before the first signal (the holders to choose, the baseline): a call hung
    in it ends the command (exit 3, nothing signalled) ``--timeout`` + 1 s after the reading began, as a wait's
    would after its deadline; no bound with ``--timeout none``."""
    import time

    from .._deadline import hung_after, ns_or_none

    bound = None if args.timeout is None else ns_or_none(args.timeout)
    return hung_after(None if bound is None else time.monotonic_ns() + bound)


# --- the command -----------------------------------------------------------------------------------------------------


def cmd_kill(args: argparse.Namespace) -> int:
    """Signal, escalate after --grace, wait until every target exited and the GPUs are clean."""
    from ..kill import KillPlan, KillTimeout
    from ..wait import WaitOptions

    if hosts_wanted(args):
        return _on_hosts(args)
    if getattr(args, "dry_run_done", False):
        return EXIT_CLEAN  # the plan is printed; nothing was signalled
    _check_named(args)
    signalled: TargetSet | None = getattr(args, "signalled", None)
    plan = KillPlan(signalled) if signalled is not None else None
    args.baseline = None
    status = StatusLine(sys.stderr, not args.json)
    predicate = wait_predicate(args)
    try:
        with _open_after_signal(args, plan) as gpus:
            if plan is not None:
                _check_gpus_after_signal(args, gpus, plan)
            selection = None
            if plan is None:
                try:
                    plan, selection = _plan_with_nvml(args, gpus)
                except DryRun:
                    return EXIT_CLEAN
            # After the PIDs were checked and signalled (a refusal comes before anything opens or registers, and a
            # slow registration never delays the signal); bounded by the wait's deadline, which counts from it.
            _common._signalled_plan = plan  # a hung reading from now on reports what each target got
            _start_events_by_deadline(args, gpus, plan)
            # The same wait whether there is something to signal or not.
            options = WaitOptions(timeout=args.timeout, stable_polls=args.stable_polls,
                                  on_poll=status_updater(status, _shown(args, plan, predicate), time.monotonic()))
            if plan is None:  # --all-*: nothing to kill; the verdict is a plain wait's, in a kill document
                return _wait_only(args, gpus, predicate, selection, status, options=options)
            load_json_output(args.json)  # while the driver tears the targets down, not after their memory is back
            try:
                result = plan.wait(gpus, grace_s=args.grace, devices=args.devices,
                                   predicate=None if args.only_targets else predicate, options=options,
                                   only_targets=args.baseline)
            except KillTimeout as exc:
                status.clear()
                verdict(EXIT_NOT_CLEAN)
                _print_timeout(args, exc, plan, selection)
                verdict_printed(EXIT_NOT_CLEAN)
                return EXIT_NOT_CLEAN
            finally:
                status.clear()
            verdict(EXIT_CLEAN)
            _print_result(args, result, plan, selection)
            verdict_printed(EXIT_CLEAN)
    except BaseException as exc:
        # plan is None too when interrupted as _plan_with_nvml signalled, before it returned the plan
        code = _after_signal(args, plan if plan is not None else getattr(args, "signalling_plan", None), exc)
        if code is None:
            raise
        return code
    finally:
        _common._signalled_plan = None
        held = plan if plan is not None else getattr(args, "signalling_plan", None)
        if held is not None:
            held.close()
    return EXIT_CLEAN


def _on_hosts(args: argparse.Namespace) -> int:
    """``kill --host``: the command run on each host."""
    from ._hosts import run_hosts

    return run_hosts(args)


def _check_named(args: argparse.Namespace) -> None:
    """Something is named to kill: PIDs, a selector or ``--all-*``."""
    if not (args.pids or args.all_holders or args.all_on_gpu or _selectors(args)):
        raise UsageError("name at least one PID (or --match, --container, --cgroup, --all-holders, --all-on-gpu)")


def _shown(args: argparse.Namespace, plan: KillPlan | None, predicate: Any) -> Any:
    """What the status line judges: as the wait does (``--only-targets``: what the targets held, descendants joining
    as found)."""
    if not (args.only_targets and plan is not None):
        return predicate
    from ..released import targets_released

    found = plan._set
    return targets_released(lambda: [t.pid for t in found.items], args.baseline)


def _after_signal(args: argparse.Namespace, plan: KillPlan | None, exc: BaseException) -> int | None:
    """A kill that ends in an error or an interrupt after its first signal: ``exc`` carries what each target got (the
    error document lists it; the error line prints it); ``None``: raise ``exc``. An interrupt (Ctrl-C, SIGTERM or
    SIGHUP to nvmlcheck) is reported as a bare "interrupted" by the command line, so its records are printed here,
    and a Ctrl-C is reported here (the command line would report a fresh ``KeyboardInterrupt``): its exit code."""
    if plan is None or plan.started_ns is None:
        return None  # nothing was signalled
    from ..kill import kill_records

    if isinstance(exc, KeyboardInterrupt):
        exc = KeyboardInterrupt("interrupted")  # as the command line words it
    if kill_records(exc) is None:
        try:
            exc._nvmlcheck_kill_pids = plan.targets  # type: ignore[attr-defined]
        except AttributeError:  # an exception class with __slots__: the report goes out without them
            return None
    if not args.json and not isinstance(exc, Exception):
        from ._main import _print_kill_records

        print("nvmlcheck: interrupted after the first signal; the targets are left as they are:", file=sys.stderr)
        _print_kill_records(exc)
    if not isinstance(exc, KeyboardInterrupt):
        return None
    from ._main import fail

    return fail(args.json, exc, _common.EXIT_SIGNAL_BASE + signals.SIGINT, label="interrupted")


def _open_after_signal(args: argparse.Namespace, plan: KillPlan | None) -> Session:
    """:func:`open_session`; when the targets were signalled already and no backend opens, finish the kill without
    the GPUs (as :func:`_check_gpus_after_signal`) and raise the error saying so."""
    from ..errors import BackendUnavailable

    try:
        return open_session(args)
    except BackendUnavailable as exc:
        if plan is None:
            raise
        raise BackendUnavailable(exc.message + _after_signal_note(plan, args), list(exc.attempts)) from None


def _after_signal_note(plan: KillPlan, args: argparse.Namespace) -> str:
    left = _finish_without_gpus(plan, args)
    who = ", ".join(f"pid {t.pid}" for t in plan.targets) or "no process"
    fate = "every target exited" if not left else f"still running: {', '.join(map(str, left))}"
    return f" (the targets were signalled before the GPUs were read: {who}; {fate}; the GPUs were not judged)"


def _check_gpus_after_signal(args: argparse.Namespace, gpus: Session, plan: KillPlan) -> None:
    """The targets were signalled before NVML: now check that the GPUs can be judged (the devices exist, the backend
    sees a GPU). If not, still finish the kill (exit, SIGKILL after --grace, bounded by --timeout) and then report
    the error, saying what was signalled: the signal is out, so leaving the targets half-killed helps nobody."""
    import math

    from .._deadline import ns_or_none
    from ..errors import BackendUnavailable, DeadlinePassed

    found = plan._set
    assert found.started is not None
    # Read by the end of the grace period (and --timeout; 0 is one check, which always completes): a slow GPU or
    # nvidia-smi must not hold back the SIGKILL. Cut, the check is the wait's: it escalates when the grace period
    # ends, and reads the selection by its deadline.
    ends = [found.started + ns for ns in (None if args.grace is None or math.isinf(args.grace) else
                                          ns_or_none(args.grace),
                                          None if not args.timeout else ns_or_none(args.timeout))
            if ns is not None]
    try:
        try:
            indices = gpus._resolve(args.devices, min(ends, default=None), found.clock)
        except DeadlinePassed:
            return
        if indices is None and gpus.device_count() == 0:
            raise BackendUnavailable(f"the {gpus.backend_name} backend sees no GPU: nothing can prove the GPUs clean",
                                     [f"{gpus.backend_name}: device count 0"])
    except (ValueError, BackendUnavailable) as exc:
        note = _after_signal_note(plan, args)
        if isinstance(exc, BackendUnavailable):
            raise BackendUnavailable(exc.message + note, list(exc.attempts)) from None
        raise UsageError(f"{exc}{note}") from None


def _finish_without_gpus(plan: KillPlan, args: argparse.Namespace) -> list[int]:
    """Wait for the targets to exit, SIGKILL at --grace, until --timeout; the PIDs still running. Without a timeout
    the exits are awaited :data:`~nvmlcheck.kill.AFTER_KILL_WAIT_S` once nothing more will be sent (the SIGKILL went
    out, or ``--grace never``), as the library's kill does: a target that never exits (SIGTERM ignored under
    ``--grace never``, a D state) used to hold the command forever."""
    import math

    from ..kill import AFTER_KILL_WAIT_S

    found = plan._set
    assert found.started is not None
    grace_ns = None if args.grace is None or math.isinf(args.grace) else int(args.grace * 1e9)
    end = None if args.timeout is None else found.started + int(args.timeout * 1e9)
    while not found.all_exited():
        now = found.clock()
        if grace_ns is not None and now - found.started >= grace_ns and not found.escalated:
            found.escalate()
        if end is None and (found.escalated or grace_ns is None):
            end = now + round(AFTER_KILL_WAIT_S * 1e9)  # nothing more will be sent: awaited for a bounded time
        if end is not None and now >= end:
            break
        if found.tree:
            found.scan_descendants()
        time.sleep(0.005)
    return [t.pid for t in found.alive()]


def _wait_only(args: argparse.Namespace, gpus: Session, predicate: Any, selection: KillSelection | None,
               status: StatusLine, *, options: WaitOptions) -> int:
    """``--all-*`` found nothing to signal: wait for the GPUs as ``wait`` would, and say so as a kill would."""
    from ..errors import WaitTimeout
    from ..jsonout import nothing_to_kill_document, nothing_to_kill_timeout_document
    from ._wait import print_gaps

    kill_fields = {"signal_name": args.signal, "tree": args.tree, "selection": selection}
    try:
        result = gpus.wait_until_clean(predicate=predicate, devices=args.devices, options=options)
    except WaitTimeout as exc:
        status.clear()
        verdict(EXIT_NOT_CLEAN)
        if args.json:
            print_json(nothing_to_kill_timeout_document(exc, **kill_fields))
        else:
            print(safe_lines(exc), file=sys.stderr)
        verdict_printed(EXIT_NOT_CLEAN)
        return EXIT_NOT_CLEAN
    status.clear()
    verdict(EXIT_CLEAN)
    if args.json:
        print_json(nothing_to_kill_document(result, **kill_fields))
    else:
        print(f"clean: nothing to kill, GPUs clean after {result.clean_ns / 1e6:.1f} ms")
    print_gaps(result)
    verdict_printed(EXIT_CLEAN)
    return EXIT_CLEAN


def _print_result(args: argparse.Namespace, result: KillResult, plan: KillPlan,
                  selection: KillSelection | None) -> None:
    from ._wait import print_gaps

    if args.json:
        from ..jsonout import kill_document

        print_json(kill_document(result, plan, selection))
        print_gaps(result.wait)  # on stderr, with --json too, as wait says them
        return

    def ms(v: int | None) -> str:
        return "not seen" if v is None else f"+{v / 1e6:.1f} ms"

    for t in result.pids:
        sent = ", ".join(f"{s.name} {ms(s.sent_ns)}" for s in t.signals) or no_signal_words(t.exited_ns)
        origin = "" if t.found_by == "named" else f", {t.found_by}" + (f" of {t.parent}" if t.parent else "")
        why = f" ({_fate_words(t.discarded, [s.name for s in t.signals])})" if t.discarded else ""
        print(f"pid {t.pid} ({safe(t.name)}{origin}): {sent}{why}, exited {ms(t.exited_ns)}, "
              f"off the GPU process list {ms(t.off_gpu_ns)}")
    _print_aside(plan)
    for line in result.not_ours:
        print(f"  {line}")
    what = "the memory they held back" if result.only_targets else "memory back"
    print(f"clean: every target exited and {what} {ms(result.clean_ns)} (confirmed {ms(result.confirmed_ns)}, "
          f"resolution {result.resolution_ns / 1e6:.2f} ms)")
    print_gaps(result.wait)


def _fate_words(discarded: str, signals: list[str]) -> str:
    """Why the first signal was replaced by SIGKILL, or (``--grace never``) why it did nothing."""
    if signals[:1] == ["SIGKILL"]:
        return f"SIGKILL at once: {discarded}"
    return f"the kernel discards it: {discarded}"


def _print_aside(plan: KillPlan, file: Any = None) -> None:
    """The named PIDs gone already (``--missing-ok``)."""
    for pid in plan.missing:
        print(f"pid {pid}: gone already, nothing to signal (--missing-ok)", file=file or sys.stdout)


def _print_timeout(args: argparse.Namespace, exc: KillTimeout, plan: KillPlan,
                   selection: KillSelection | None) -> None:
    if args.json:
        from ..jsonout import kill_timeout_document

        print_json(kill_timeout_document(exc, plan, selection))
        return
    for t in exc.pids:
        if t.discarded:
            print(f"pid {t.pid} ({safe(t.name)}): {_fate_words(t.discarded, [s.name for s in t.signals])}",
                  file=sys.stderr)
    for pid, why in plan.left_alone:
        if why.startswith("a descendant of"):  # found by --tree during the kill, and not ours to signal
            print(f"pid {pid}: not signalled: {safe(why)}", file=sys.stderr)
    _print_aside(plan, sys.stderr)
    print(safe_lines(exc), file=sys.stderr)
    if exc.tree_hint:
        print("hint: add --tree to kill the targets' descendants too", file=sys.stderr)


def cmd_holders(args: argparse.Namespace) -> int:
    """Every process holding a GPU: NVML's lists joined with open NVIDIA device files."""
    if hosts_wanted(args):
        from ._hosts import run_hosts

        return run_hosts(args)
    # A /proc scan of a host with many processes, or a read that hangs, must not hold the command for good: the
    # reading bounds itself (--timeout; with --timeout 0, one read that does not return in 1 s) and a reading cut
    # is HoldersIncomplete (exit 3), never "no process holds". No watchdog over the whole: with --timeout 0 it cut
    # a slow scan that was moving on 1 s after it began, as a hung read.
    with open_session(args) as gpus:
        holders = gpus.holders(args.devices, timeout=args.timeout)
        verdict(EXIT_CLEAN, answer_is_output=True)
        if args.json:
            from ..jsonout import holders_document

            print_json(holders_document(gpus.backend_name, holders))
        elif not holders:
            print("no process holds a selected GPU (NVML lists) or has an NVIDIA device file open")
        else:
            print(_HOLDER_HEADER)
            for h in holders:
                print(_holder_line(h))
        verdict_printed(EXIT_CLEAN)
    return EXIT_CLEAN
