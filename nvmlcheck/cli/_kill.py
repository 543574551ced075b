"""``nvmlcheck kill`` and ``nvmlcheck holders`` (placeholder port; rewritten on the pinned-kill API)."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._common import EXIT_CLEAN, EXIT_NOT_CLEAN, UsageError, open_session, wait_predicate
from ._output import StatusLine, human_bytes, print_json, status_updater
from ._wait import timeout_document

if TYPE_CHECKING:
    import argparse

    from ..model import Snapshot


def _confirm(pids: Sequence[int], snap: Snapshot, assume_yes: bool) -> None:
    lines = [
        f"  GPU {d.index}: pid {p.pid} ({p.name or '?'}) {human_bytes(p.used_bytes)} {p.kind.value}"
        for d in snap.devices
        for p in (d.processes or ())
    ]
    print("processes on the selected GPUs:\n" + "\n".join(lines), file=sys.stderr)
    if assume_yes:
        return
    if not sys.stdin.isatty():
        what = "1 process" if len(pids) == 1 else f"{len(pids)} processes"
        raise UsageError(f"refusing to kill {what} without --yes (stdin is not a terminal)")
    try:
        answer = input("kill this process? [y/N] " if len(pids) == 1 else f"kill these {len(pids)} processes? [y/N] ")
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not confirmed; nothing was signalled")


def cmd_kill(args: argparse.Namespace) -> int:
    from ..errors import WaitTimeout
    from ..kill import kill_and_wait
    from ..model import Fields

    first = signal.Signals[args.signal]
    status = StatusLine(sys.stderr, not args.json)
    with open_session(args) as gpus:
        pids: list[int] = list(args.pids)
        if args.all_on_gpu:
            snap = gpus.snapshot(args.devices, fields=Fields.PROCESSES)
            snap.raise_for_failures()
            found = sorted({p.pid for d in snap.devices for p in (d.processes or ())} - {os.getpid(), os.getppid()})
            if not found:
                print("no process on the selected GPUs", file=sys.stderr)
            else:
                _confirm(found, snap, args.yes)
            pids.extend(pid for pid in found if pid not in pids)
        if not pids:
            raise UsageError("name at least one PID (or --all-on-gpu)")
        predicate = wait_predicate(args)
        try:
            result = kill_and_wait(
                gpus, pids, timeout=args.timeout, grace_s=args.grace if args.grace is not None else 1e9,
                first_signal=first, devices=args.devices, predicate=predicate,
                on_poll=status_updater(status, predicate, time.monotonic()),
            )
        except WaitTimeout as exc:
            status.clear()
            if args.json:
                print_json(timeout_document(exc, "kill", signal=first.name, pids=[{"pid": pid} for pid in pids]))
            else:
                print(str(exc), file=sys.stderr)
            return EXIT_NOT_CLEAN
        finally:
            status.clear()
    if args.json:
        from ..jsonout import document, snapshot_json

        print_json(document(
            "kill", clean=True, signal=result.signal_name,
            pids=[{"pid": t.pid, "killed_ns": t.killed_ns, "exited_ns": t.exited_ns, "off_gpu_ns": t.off_gpu_ns}
                  for t in result.pids],
            clean_ns=result.clean_ns, confirmed_ns=result.confirmed_ns, resolution_ns=result.resolution_ns,
            snapshot=snapshot_json(result.snapshot),
        ))
        return EXIT_CLEAN

    def ms(v: int | None) -> str:
        return "not seen" if v is None else f"+{v / 1e6:.1f} ms"

    for t in result.pids:
        killed = f", SIGKILL {ms(t.killed_ns)}" if t.killed_ns is not None else ""
        print(f"pid {t.pid}: {result.signal_name} +0.0 ms{killed}, exited {ms(t.exited_ns)}, "
              f"off the GPU process list {ms(t.off_gpu_ns)}")
    print(f"clean: memory back {ms(result.clean_ns)} (confirmed {ms(result.confirmed_ns)}, "
          f"resolution {result.resolution_ns / 1e6:.2f} ms)")
    return EXIT_CLEAN


def cmd_holders(args: argparse.Namespace) -> int:
    raise UsageError("holders: not built yet")
