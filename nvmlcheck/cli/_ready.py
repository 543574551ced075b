"""``nvmlcheck ready``: one verdict per GPU (exit 0 ready, 1 not ready yet, 5 an operator is needed).

:func:`cmd_ready` opens a session and calls :meth:`nvmlcheck.Session.ready` (:mod:`nvmlcheck.readiness`) with
``--need``, ``--timeout``, ``--max-used``, ``--stable-polls`` and ``--devices``; it prints one line per GPU (or the
``nvmlcheck/ready`` document) and the summary. ``--host``/``--hosts`` run it on each host. The decision table:
docs/ready.md; the options: docs/cli.md.
"""

from __future__ import annotations

import sys
import time

from ._common import (
    EXIT_CLEAN,
    EXIT_NOT_CLEAN,
    EXIT_UNHEALTHY,
    hosts_wanted,
    open_session,
    verdict,
    verdict_printed,
)
from ._output import StatusLine, load_json_output, plural, print_json, safe

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    import argparse

    from ..verdict import ReadyReport
    from ..wait import TracePoint


def exit_code_of(report: ReadyReport) -> int:
    """0 ready, 5 when a GPU needs an operator (unhealthy or stuck), else 1."""
    if report.ready:
        return EXIT_CLEAN
    return EXIT_UNHEALTHY if report.needs_operator else EXIT_NOT_CLEAN


def cmd_ready(args: argparse.Namespace) -> int:
    """Judge the selected GPUs; the status line shows on a terminal only, while waiting."""
    from .._record import replace
    from .._waitoptions import WaitOptions

    if hosts_wanted(args):
        from ._hosts import run_hosts

        return run_hosts(args)
    need_bytes, need_fraction = args.need if args.need is not None else (None, None)
    status = StatusLine(sys.stderr, not args.json)
    started = time.monotonic()

    def on_poll(point: TracePoint) -> None:
        if status.enabled and point.snapshot is not None:
            used = point.total_used_bytes
            held = "?" if used is None else f"{used / (1 << 30):.1f} GiB"
            status.update(f"waiting for ready {time.monotonic() - started:5.1f} s · {held} used")

    # Imported before the session opens, while the early thread is still in nvmlInit: after it, they would add
    # milliseconds to the one-shot (docs/performance.md, "One-shot checks").
    from .. import readiness  # noqa: F401

    load_json_output(args.json)
    with open_session(args) as gpus:
        # --timeout bounds the whole command: the open (whose nvmlInit it bounded) comes out of it; used up, it is
        # still a bound (the library's answer for that time), never 0, which is one check judged alone.
        from .._deadline import left_s

        waiting = time.monotonic()
        timeout = left_s(args.timeout, waiting - started)
        try:
            report = gpus.ready(
                args.devices, need_bytes=need_bytes, need_fraction=need_fraction, max_used_bytes=args.max_used,
                timeout=timeout, events=not args.no_events,
                options=WaitOptions(stable_polls=args.stable_polls, on_poll=on_poll),
            )
        finally:
            status.clear()
        # The time from the command's start to the end of ready's own reading, the open included (as wait reports a
        # timeout): not the verdicts' judging and the message after it, which are no waiting.
        report = replace(report, timeout_s=args.timeout,
                         elapsed_ns=round((waiting - started) * 1e9) + report.elapsed_ns)
        code = exit_code_of(report)
        verdict(code)  # before printing: a failed write cannot change it (ready is a verdict, as wait's clean is)
        if args.json:
            from ..jsonout import ready_document

            print_json(ready_document(report, exit_code=code, need_bytes=need_bytes, need_fraction=need_fraction))
        else:
            for v in report.verdicts:
                print(safe(v.line()))  # process names and container labels are anyone's text: no terminal escapes
            print(_summary(report))
            for note in report.notes:
                if note.startswith("events: "):
                    # GPUs whose XIDs were not heard, as wait --events says (the document's notes say it too).
                    print(f"nvmlcheck: {safe(note)}", file=sys.stderr)
        verdict_printed(code)  # before the session closes: nvmlShutdown is teardown the kernel does anyway
    return code


def _summary(report: ReadyReport) -> str:
    n = len(report.verdicts)
    ok = sum(v.ready for v in report.verdicts)
    took = f"{report.elapsed_ns / 1e6:.1f} ms, {plural(report.polls, 'poll')}"
    if report.ready:
        return f"ready: {plural(n, 'GPU')} ({took})"
    word = "needs an operator" if report.needs_operator else "not ready"
    return f"{word}: {ok} of {plural(n, 'GPU')} ready ({took})"
