"""``nvmlcheck kill`` and ``nvmlcheck holders``.

Named PIDs are validated, pinned and signalled with the operating system alone (:func:`signal_first`, run before
the simulation or NVML is loaded), so the driver starts tearing the process down while nvmlcheck opens NVML. When
the targets depend on what the GPUs show (``--all-holders``, ``--all-on-gpu``) or a device selection must be checked
first (``--devices``), NVML is opened first and nothing is signalled until every input has been checked.
"""

from __future__ import annotations

import sys
import time

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
from ._output import StatusLine, human_bytes, print_json, status_updater

TYPE_CHECKING = False  # typing costs start-up time where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from .._proc.targets import TargetSet
    from ..holders import Holder, KillSelection
    from ..kill import KillPlan, KillResult, KillTimeout
    from ..session import Session
    from ..wait import WaitOptions


def _early(args: argparse.Namespace) -> bool:
    """Whether the first signal can go out before NVML: named PIDs only, every input already checked by argparse."""
    if hosts_wanted(args):
        return False  # the PIDs are on the hosts: nothing is signalled here
    return bool(args.pids) and not (args.all_holders or args.all_on_gpu or args.devices or args.simulate)


def signal_first(args: argparse.Namespace) -> None:
    """Pin and signal the named PIDs before anything of the GPU side is loaded (kept in ``args.signalled``)."""
    args.signalled = None
    if not _early(args):
        return
    import signal

    from .._proc.targets import Refused, prepare

    try:
        found = prepare(args.pids, tree=args.tree)
        found.send_first(signal.Signals[args.signal])
    except Refused as exc:
        from ..kill import KillError

        raise KillError(exc.pid, exc.reason) from None  # type: ignore[arg-type]
    args.signalled = found


# --- choosing targets with NVML --------------------------------------------------------------------------------------


#: The header of the holders table (also used, with the host in front, by ``--host``).
_HOLDER_HEADER = f"{'pid':>8}  {'user':<10} {'state':<8} {'found by':<19} {'GPUs':<24} command"


def _holder_line(h: Holder) -> str:
    who = f"{h.pid:>8}  {(h.user or '?')[:10]:<10} {(h.state or '?')[:8]:<8} {'+'.join(sorted(h.found_by)):<19}"
    gpus = ", ".join(f"GPU {g.index} {human_bytes(g.used_bytes)}" for g in h.gpus) or "-"
    cmd = " ".join(h.cmdline) if h.cmdline else (h.name or "?")
    flags = " [daemon]" if h.is_daemon else ""
    flags += f" [{h.relation}]" if h.relation else ""
    return f"{who} {gpus:<24} {cmd[:80]}{flags}"


def _show_selection(selection: KillSelection) -> None:
    if selection.targets:
        print("to be signalled:", file=sys.stderr)
        for h in selection.targets:
            print("  " + h.describe(), file=sys.stderr)
    for h, why in selection.skipped:
        print(f"  left alone: pid {h.pid} ({h.name or '?'}): {why}", file=sys.stderr)
    for note in selection.notes:
        print(f"  note: {note}", file=sys.stderr)


def _confirm(count: int, assume_yes: bool) -> None:
    if assume_yes:
        return
    what = "1 process" if count == 1 else f"{count} processes"
    if not sys.stdin.isatty():
        raise UsageError(f"refusing to kill {what} without --yes (stdin is not a terminal); nothing was signalled")
    try:
        answer = input(f"kill {'this process' if count == 1 else f'these {count} processes'}? [y/N] ")
    except EOFError:  # Ctrl-D: no
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was signalled")


def _plan_with_nvml(args: argparse.Namespace, gpus: Session) -> tuple[KillPlan | None, KillSelection | None]:
    """Check every input (devices, PIDs, the holders to add) with NVML open, then send the first signal."""
    import signal

    from ..errors import BackendUnavailable
    from ..holders import select_kill_holders
    from ..kill import prepare_kill

    indices = gpus.resolve(args.devices)
    if indices is None and gpus.device_count() == 0:
        raise BackendUnavailable(
            f"the {gpus.backend_name} backend sees no GPU: nothing could prove the GPUs clean after the kill, so "
            "nothing was signalled", [f"{gpus.backend_name}: device count 0"])
    selection = None
    if args.all_holders or args.all_on_gpu:
        selection = select_kill_holders(gpus, indices, all_holders=args.all_holders)
        if selection.refused is not None:
            raise UsageError(f"refusing --all-on-gpu: {selection.refused}; nothing was signalled")
        _show_selection(selection)
        if selection.targets:
            _confirm(len(selection.targets), args.yes)
        elif not args.pids:
            print("nothing to kill on the selected GPUs", file=sys.stderr)
    holders = selection.targets if selection is not None else ()
    if not args.pids and not holders:
        return None, selection
    plan = prepare_kill(args.pids, tree=args.tree, holders=holders)
    plan.send_first(signal.Signals[args.signal])
    return plan, selection


# --- the command -----------------------------------------------------------------------------------------------------


def cmd_kill(args: argparse.Namespace) -> int:
    """Signal, escalate after --grace, wait until every target exited and the GPUs are clean."""
    from ..kill import KillPlan, KillTimeout
    from ..wait import WaitOptions

    if hosts_wanted(args):
        from ._hosts import run_hosts

        return run_hosts(args)
    if not (args.pids or args.all_holders or args.all_on_gpu):
        raise UsageError("name at least one PID (or --all-holders / --all-on-gpu)")
    signalled: TargetSet | None = getattr(args, "signalled", None)
    plan = KillPlan(signalled) if signalled is not None else None
    status = StatusLine(sys.stderr, not args.json)
    predicate = wait_predicate(args)
    try:
        with open_session(args) as gpus:
            start_events(args, gpus)
            selection = None
            if plan is None:
                plan, selection = _plan_with_nvml(args, gpus)
            # The same wait whether there is something to signal or not.
            options = WaitOptions(timeout=args.timeout, stable_polls=args.stable_polls,
                                  on_poll=status_updater(status, predicate, time.monotonic()))
            if plan is None:  # --all-*: nothing to kill; the verdict is a plain wait's, in a kill document
                return _wait_only(args, gpus, predicate, selection, status, options=options)
            try:
                result = plan.wait(gpus, grace_s=args.grace, devices=args.devices, predicate=predicate,
                                   options=options)
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
    finally:
        if plan is not None:
            plan.close()
    return EXIT_CLEAN


def _wait_only(args: argparse.Namespace, gpus: Session, predicate: Any, selection: KillSelection | None,
               status: StatusLine, *, options: WaitOptions) -> int:
    """``--all-*`` found nothing to signal: wait for the GPUs as ``wait`` would, and say so as a kill would."""
    from ..errors import WaitTimeout
    from ..jsonout import nothing_to_kill_document, nothing_to_kill_timeout_document

    kill_fields = {"signal_name": args.signal, "tree": args.tree, "selection": selection}
    try:
        result = gpus.wait_until_clean(predicate=predicate, devices=args.devices, options=options)
    except WaitTimeout as exc:
        status.clear()
        verdict(EXIT_NOT_CLEAN)
        if args.json:
            print_json(nothing_to_kill_timeout_document(exc, **kill_fields))
        else:
            print(str(exc), file=sys.stderr)
        verdict_printed(EXIT_NOT_CLEAN)
        return EXIT_NOT_CLEAN
    status.clear()
    verdict(EXIT_CLEAN)
    if args.json:
        print_json(nothing_to_kill_document(result, **kill_fields))
    else:
        print(f"clean: nothing to kill, GPUs clean after {result.first_clean_ns / 1e6:.1f} ms")
    verdict_printed(EXIT_CLEAN)
    return EXIT_CLEAN


def _print_result(args: argparse.Namespace, result: KillResult, plan: KillPlan,
                  selection: KillSelection | None) -> None:
    if args.json:
        from ..jsonout import kill_document

        print_json(kill_document(result, plan, selection))
        return

    def ms(v: int | None) -> str:
        return "not seen" if v is None else f"+{v / 1e6:.1f} ms"

    for t in result.pids:
        sent = ", ".join(f"{s.name} {ms(s.sent_ns)}" for s in t.signals) or "no signal (had exited)"
        origin = "" if t.found_by == "named" else f", {t.found_by}" + (f" of {t.parent}" if t.parent else "")
        print(f"pid {t.pid} ({t.name}{origin}): {sent}, exited {ms(t.exited_ns)}, "
              f"off the GPU process list {ms(t.off_gpu_ns)}")
    print(f"clean: every target exited and memory back {ms(result.clean_ns)} (confirmed {ms(result.confirmed_ns)}, "
          f"resolution {result.resolution_ns / 1e6:.2f} ms)")


def _print_timeout(args: argparse.Namespace, exc: KillTimeout, plan: KillPlan,
                   selection: KillSelection | None) -> None:
    if args.json:
        from ..jsonout import kill_timeout_document

        print_json(kill_timeout_document(exc, plan, selection))
        return
    print(str(exc), file=sys.stderr)
    if exc.tree_hint:
        print("hint: add --tree to kill the targets' descendants too", file=sys.stderr)


def cmd_holders(args: argparse.Namespace) -> int:
    """Every process holding a GPU: NVML's lists joined with open NVIDIA device files."""
    if hosts_wanted(args):
        from ._hosts import run_hosts

        return run_hosts(args)
    with open_session(args) as gpus:
        holders = gpus.holders(args.devices)
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
