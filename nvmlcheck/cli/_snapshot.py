"""``nvmlcheck snapshot``: the devices (default) or their processes, once."""

from __future__ import annotations

import sys

from ._common import EXIT_BACKEND, EXIT_CLEAN, hosts_wanted, open_session, verdict, verdict_printed
from ._output import device_table, load_json_output, print_json, process_table

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    import argparse

    from ..model import Fields


def snapshot_fields(args: argparse.Namespace) -> Fields:
    """What the view reads: a table reads what it shows (the max and application clocks and the health reads cost
    an H200 one-shot ~15 ms: docs/performance.md, "One-shot checks"); the JSON document has every field. The early
    NVML thread warms the same reads, judged from the raw words (``_common._slow_first_reads``): change both."""
    from ..model import Fields

    if args.json:
        return Fields.ALL
    if args.view == "procs":
        return Fields.PROCESSES
    return Fields.MEMORY | Fields.PROCESSES | Fields.CLOCK_SPEEDS  # not the event reasons: 1.4 ms, not shown


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Read the selected GPUs once; exit 3 when one could not be read or none is seen."""
    from ..errors import BackendUnavailable

    if hosts_wanted(args):
        from ._hosts import run_hosts

        return run_hosts(args)
    fields = snapshot_fields(args)
    # The reading classes, made while nvmlInit runs rather than after it.
    if fields & fields.CLOCKS:
        from .. import _clocks  # noqa: F401
    if fields & fields.HEALTH:
        from .. import _readings  # noqa: F401
    load_json_output(args.json)
    with open_session(args) as gpus:
        snap = gpus.snapshot(args.devices, fields=fields)
        if not snap.devices and not snap.failures:
            raise BackendUnavailable(f"the {snap.backend} backend sees no GPU", [f"{snap.backend}: device count 0"])
        code = EXIT_BACKEND if snap.failures else EXIT_CLEAN
        verdict(code, answer_is_output=True)
        if args.json:
            from ..jsonout import snapshot_document

            print_json(snapshot_document(snap))
        elif args.view == "procs":
            process_table(snap, sys.stdout)
        else:
            device_table(snap, sys.stdout)
        verdict_printed(code)
    return code
