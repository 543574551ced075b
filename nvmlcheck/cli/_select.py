"""``nvmlcheck select``: wait until K GPUs are clean and print them for ``CUDA_VISIBLE_DEVICES`` (exit 0), or say why
not at the timeout (exit 1).

:func:`cmd_select` opens a session and calls :func:`nvmlcheck.selection.select_clean` on ``--devices``
(``cuda:N`` included); with ``--lock`` it hands the locks to a holder process that keeps them until the owner PID
exits (:meth:`nvmlcheck.locks.LockSet.hold_until`). Output formats and locking: docs/cuda.md, "nvmlcheck select"
and "Locks".
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

from ._common import EXIT_CLEAN, EXIT_NOT_CLEAN, UsageError, open_session, verdict, verdict_printed, wait_predicate
from ._output import print_json, safe, safe_lines
from ._parser import typed

if TYPE_CHECKING:
    import argparse

    from ..cudamap import CudaMapping
    from ..locks import Owner
    from ..selection import Selection, SelectTimeout
    from ..session import Session


def _value(fmt: str, selection: Selection, mapping: CudaMapping | None) -> str:
    if fmt == "uuid":
        return ",".join(selection.uuids)
    if fmt == "index":
        return ",".join(map(str, selection.indices))
    assert mapping is not None
    return mapping.visible_value(selection.indices)


def _owner(args: argparse.Namespace) -> tuple[Owner, str]:
    """Whose life the locks last: the process that ran nvmlcheck (in `GPUS=$(nvmlcheck select ...)` that is the
    launch script's shell, which may `exec` the server), unless --lock-pid names another; and how to name it in a
    message. Pinned before any wait (its exit ends the wait, and the holder waits for that very process): a process
    that is gone or has exited (a zombie) would end the locks at once."""
    from ..locks import pin_owner

    owner: int
    if args.lock_pid is not None:
        owner, what = int(args.lock_pid), f"--lock-pid {args.lock_pid}"
    else:
        owner, what = os.getppid(), f"the parent process (PID {os.getppid()})"
        if owner == 0:
            # nsenter, `docker exec`, `kubectl exec`: the parent lives outside this PID namespace and has no PID here,
            # so no process here can stand for it.
            raise UsageError("--lock: nvmlcheck's parent process is outside this PID namespace (started through "
                             "nsenter, docker exec or kubectl exec), so nothing here ends with it; name the process "
                             "whose exit ends the locks with --lock-pid PID (for example $$ of the launch script)")
    if owner < 1:
        raise UsageError(f"{what}: {owner} is not a process ID; name the process whose exit ends the locks with "
                         "--lock-pid PID")
    if owner == 1:
        raise UsageError(f"{what}: PID 1 never exits (init); name the process whose exit ends the locks with "
                         "--lock-pid PID")
    try:
        return pin_owner(owner), what
    except ProcessLookupError as exc:
        raise UsageError(f"{what}: {exc}") from None


def _cuda_mapping(gpus: Session, deadline_s: float | None, count: int = 1, option: str = "--wait") -> CudaMapping:
    """The session's CUDA numbering, its identity read stopped at ``deadline_s`` (``time.monotonic``; one call late
    at most): when it passes, a :class:`~nvmlcheck.SelectTimeout` naming it (exit 1, as with ``--format index``: the
    GPUs were not found within ``--wait``; not a backend failure). ``count``: the GPUs asked for; ``option``: the
    option as the user typed it (``--wait`` or ``--timeout``)."""
    if deadline_s is None:
        return gpus.cuda_mapping()
    from .._deadline import read_by
    from ..cudamap import cuda_mapping
    from ..model import Fields
    from ..selection import SelectTimeout

    snap = read_by(gpus.backend, None, Fields(0), int(deadline_s * 1e9))
    if snap is None:
        # Elapsed 0: the caller counts the time since the command started (_not_found).
        raise SelectTimeout(0.0, 0, ["--format cuda: the GPUs' identities (for CUDA's numbering) were not read "
                                     f"within {option}"], count=count)
    return cuda_mapping(snap.devices, os.environ, unreadable=[f.index for f in snap.failures])


def count_first(args: argparse.Namespace) -> None:
    """Before anything is opened (``_main.EARLY``): how many GPUs, ``--count K`` or ``K`` alone (the same number if
    both), into ``args.count``; a usage error otherwise."""
    given = [n for n in (args.count, args.count_word) if n is not None]
    if not given:
        raise UsageError("select needs how many GPUs: --count K (or K alone, as in `nvmlcheck select 2`)")
    if len(set(given)) > 1:
        raise UsageError(f"--count {args.count} and {args.count_word} disagree: give how many GPUs once")
    args.count = int(given[0])


def cmd_select(args: argparse.Namespace) -> int:
    """Select with the CLI's predicate; with ``--lock``, hand the locks to a holder that outlives this process."""
    lock = args.lock or args.lock_pid is not None
    if not lock:
        return _select(args, None, "")
    pinned, what = _owner(args)
    with pinned:
        return _select(args, pinned, what)


def _not_found(args: argparse.Namespace, late: SelectTimeout, started: float, waiting: float | None = None) -> int:
    """Say why ``--count`` GPUs were not found (exit 1): the --wait asked for, and the time from the command's start
    to the end of the search, the open included. ``waiting``: when the search (whose ``elapsed_ns`` ends at its
    deadline) began on ``time.monotonic``; ``None``: the timeout came now (``late.elapsed_ns`` 0). Not the time of
    the print: the message built after the deadline is no part of the wait."""
    from ..jsonout import select_timeout_document
    from ..selection import SelectTimeout

    opened_ns = max(0, round(((time.monotonic() if waiting is None else waiting) - started) * 1e9))
    exc = SelectTimeout(args.wait or 0.0, late.elapsed_ns + opened_ns, late.culprits, late.snapshot,
                        late.polls, count=late.count, clean=late.clean)
    verdict(EXIT_NOT_CLEAN)
    if args.json:
        print_json(select_timeout_document(exc, count=args.count, format=args.format, timeout_s=args.wait))
    else:
        print(f"nvmlcheck: {safe_lines(exc)}", file=sys.stderr)
    verdict_printed(EXIT_NOT_CLEAN)
    return EXIT_NOT_CLEAN


def _select(args: argparse.Namespace, pinned: Owner | None, what: str) -> int:
    """:func:`cmd_select` once the owner is pinned (``None``: no locks)."""
    from ..errors import NoSuchProcess
    from ..jsonout import select_document
    from ..selection import SelectTimeout

    lock = pinned is not None
    owner = os.getppid() if pinned is None else pinned.pid
    args.timeout = args.wait  # open_session bounds nvmlInit by the command's own timeout
    predicate = wait_predicate(args)
    started = time.monotonic()
    with open_session(args) as gpus:
        mapping = None
        if args.format == "cuda":
            # Refuse before waiting (maybe for minutes) when the numbers cannot be told: CUDA_DEVICE_ORDER unset on
            # a host with mixed GPU models. Read within --wait, as everything else.
            try:
                mapping = _cuda_mapping(gpus, None if not args.wait else started + args.wait, args.count,
                                        typed(args, "wait", "--wait"))
            except SelectTimeout as late:
                return _not_found(args, late, started)
            mapping.visible_value(())
        # --wait used up by opening: a check bounded by it, not a whole one (that is --wait 0).
        from .._deadline import left_s

        waiting = time.monotonic()
        timeout = left_s(args.wait, waiting - started)
        try:
            selection = gpus.select_clean(
                args.count, timeout=timeout, predicate=predicate, devices=args.devices,
                stable_polls=args.stable_polls, lock=lock, owner=pinned, health=not args.no_health,
            )
        except NoSuchProcess as gone:
            # The owner exited during the wait: the refusal of an owner gone at the start (exit 2); select_clean
            # took nothing or let go of it.
            raise UsageError(f"{what}: {gone}") from None
        except SelectTimeout as late:
            return _not_found(args, late, started, waiting)
        value = _value(args.format, selection, mapping)
        holder = None
        if selection.locks is not None:
            assert pinned is not None
            try:
                holder = selection.locks.hold_until(pinned)
            except ProcessLookupError as gone:  # it exited after the last poll: the same refusal
                raise UsageError(f"{what}: {gone}") from None
        verdict(EXIT_CLEAN, answer_is_output=True)  # the GPUs chosen are the answer: unread, it is not given
        if selection.locks is not None and not args.json:
            print(f"nvmlcheck: locked GPU {', '.join(map(str, selection.indices))} until PID {owner} exits "
                  f"(holder PID {holder}, {safe(selection.locks.directory)})", file=sys.stderr)
        try:
            if args.json:
                print_json(select_document(selection, count=args.count, format=args.format, timeout_s=args.wait,
                                           value=value, holder_pid=holder, owner_pid=owner))
            else:
                print(value)
            sys.stdout.flush()
        except BaseException:
            # The answer was not delivered (stdout closed, disk full, a signal or Ctrl-C while writing): nobody will
            # use these GPUs, so their locks must not outlive this command (exit 141, 128 + the signal, or the
            # write's error follows).
            if selection.locks is not None and holder is not None:
                selection.locks.end_holder()
            raise
        verdict_printed(EXIT_CLEAN)
    return EXIT_CLEAN
