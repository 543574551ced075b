"""``nvmlcheck watch``: stream NVML events as lines or JSON Lines until interrupted (or ``--for`` seconds).

:func:`cmd_watch` starts the session's :class:`~nvmlcheck.events.EventListener` and prints each
:class:`~nvmlcheck.events.GpuEvent` as it arrives (``nvmlcheck/event`` documents under ``--json``); it exits 3 when
events cannot be had (the smi backend, a library or GPU without them). The listener and the XID table:
docs/events.md, "nvmlcheck watch".
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from ._common import EXIT_BACKEND, EXIT_CLEAN, open_session
from ._output import safe

if TYPE_CHECKING:
    import argparse

#: How long one wait for events lasts: bounds how late ``--for`` ends (Ctrl-C and SIGTERM interrupt it at once).
_SLICE_S = 0.25


def cmd_watch(args: argparse.Namespace) -> int:
    """Print each event of the selected GPUs as it arrives; flush every line (a pipe reader sees it at once)."""
    import json

    with open_session(args) as gpus:
        indices = gpus.resolve(args.devices)
        wanted = None if indices is None else frozenset(indices)
        listener = gpus.listen()
        if not listener.active:
            print(f"nvmlcheck: events: {safe(listener.reason)}", file=sys.stderr)
            return EXIT_BACKEND
        if listener.reason is not None:  # some GPUs only: say which are not watched, once
            print(f"nvmlcheck: events: {safe(listener.reason)}", file=sys.stderr)
        covered = sorted(listener.covered if wanted is None else listener.covered & wanted)
        if not covered:  # the selected GPUs have no events (the others do): nothing would ever be printed
            print(f"nvmlcheck: events: no selected GPU is listened to ({safe(listener.reason or 'none covered')})",
                  file=sys.stderr)
            return EXIT_BACKEND
        if not args.json:
            # Status on stderr (stdout is the events alone): a quiet GPU prints nothing for hours, so say it listens.
            until = f"for {args.duration:g} s" if args.duration is not None else "until Ctrl-C"
            print(f"nvmlcheck watch: listening to {_gpus(covered)} {until}", file=sys.stderr, flush=True)
        end = None if args.duration is None else time.monotonic() + args.duration
        seen = printed = 0
        while end is None or time.monotonic() < end:
            left = _SLICE_S if end is None else max(0.0, min(_SLICE_S, end - time.monotonic()))
            events, seen = listener.next_events(seen, left)
            for ev in events:
                if wanted is not None and ev.index not in wanted:
                    continue
                printed += 1
                print(json.dumps(ev.to_json(), separators=(",", ":")) if args.json else safe(ev.line()), flush=True)
            if listener.state != "running":
                print(f"nvmlcheck: events: {safe(listener.reason or 'the listener stopped')}", file=sys.stderr)
                return EXIT_BACKEND
    if not args.json:
        print(f"nvmlcheck watch: {printed} event{'' if printed == 1 else 's'} in {args.duration:g} s", file=sys.stderr)
    return EXIT_CLEAN


def _gpus(indices: list[int]) -> str:
    return f"GPU {indices[0]}" if len(indices) == 1 else f"GPUs {', '.join(map(str, indices))}"
