"""``nvmlcheck wait``: poll until the GPUs are clean (exit 0) or the timeout passes (exit 1)."""

from __future__ import annotations

import sys
import time

from ._common import (
    EXIT_CLEAN,
    EXIT_NOT_CLEAN,
    hosts_wanted,
    open_session,
    start_events,
    verdict,
    verdict_printed,
    wait_predicate,
)
from ._output import StatusLine, load_json_output, plural, print_json, safe, safe_lines, status_updater

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    import argparse

    from ..wait import WaitResult


def cmd_wait(args: argparse.Namespace) -> int:
    """Wait with the CLI's predicate; the status line shows on a terminal only."""
    from .._deadline import hung_after, left_s
    from ..errors import WaitTimeout

    if hosts_wanted(args):
        from ._hosts import run_hosts

        return run_hosts(args)
    predicate = wait_predicate(args)
    status = StatusLine(sys.stderr, not args.json)
    started = time.monotonic()
    # Imported before the session opens, while the early thread is still in nvmlInit (as ready's readiness).
    from .. import wait  # noqa: F401

    load_json_output(args.json)
    with open_session(args) as gpus:
        deadline = None if args.timeout is None else started + args.timeout
        # The registration bounds itself between two calls; one that never returns is the watchdog's, as in the wait.
        with hung_after(None if deadline is None else round(deadline * 1e9)):
            start_events(args, gpus, deadline)
        # --timeout bounds the whole command: the open (whose nvmlInit it bounded) comes out of it; used up, it is
        # still a bound (the library's answer for that time), never 0, which is one check judged alone.
        waiting = time.monotonic()
        timeout = left_s(args.timeout, waiting - started)
        try:
            result = gpus.wait_until_clean(
                timeout,
                predicate,
                devices=args.devices,
                policy="precise" if args.precise else None,
                stable_polls=args.stable_polls,
                on_poll=status_updater(status, predicate, time.monotonic()),
            )
        except WaitTimeout as late:
            status.clear()
            # Report the timeout asked for and the time from the command's start to the wait's end, the open
            # included: the wait's elapsed_ns ends at its deadline, not after the message was built and the holders
            # explained (a module import, /proc reads: work after the deadline, which is no overrun of it).
            opened_ns = round((waiting - started) * 1e9)
            # The wait's holders (those of the GPUs its predicate refused: --max-used, --devices) go along; only a
            # document shows them.
            exc = WaitTimeout(args.timeout, late.elapsed_ns + max(0, opened_ns), late.culprits, late.snapshot,
                              late.polls, holders=late.holders if args.json else None, held=late.held)
            verdict(EXIT_NOT_CLEAN)
            if args.json:
                from ..jsonout import wait_timeout_document

                print_json(wait_timeout_document(exc))
            else:
                print(safe_lines(exc), file=sys.stderr)
            verdict_printed(EXIT_NOT_CLEAN)
            return EXIT_NOT_CLEAN
        finally:
            status.clear()
        verdict(EXIT_CLEAN)  # clean whether or not anyone reads it (docs/cli.md, "Exit codes")
        _print_clean(args, result)
        verdict_printed(EXIT_CLEAN)  # before the session closes: nvmlShutdown is teardown the kernel does anyway
    return EXIT_CLEAN


def _print_clean(args: argparse.Namespace, result: WaitResult) -> None:
    if args.json:
        from ..jsonout import wait_document

        print_json(wait_document(result))
    else:
        n = len(result.snapshot.devices)
        print(
            f"clean: {plural(n, 'GPU')} after {result.clean_ns / 1e6:.1f} ms "
            f"(confirmed at {result.elapsed_ns / 1e6:.1f} ms, {plural(result.polls, 'poll')}, "
            f"{result.poll_cost_ns / 1e3:.0f} µs per poll)"
        )
    print_gaps(result)


def print_gaps(result: WaitResult) -> None:
    """A line on stderr for each time the event listener did not listen during a wait that ended clean (``wait``,
    and ``kill``'s wait)."""
    for gap in result.listening_gaps or ():
        # The listener recovered, stalled, dropped a GPU or had not registered during the wait: a fatal XID then
        # went unheard. A GPU never registered was said when the listener started (--events' notice).
        if gap.cause != "unregistered":
            print(f"nvmlcheck: events: {safe(gap.line())}", file=sys.stderr)
