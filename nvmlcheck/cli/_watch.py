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

from .._deadline import ns_or_none
from ._common import EXIT_BACKEND, EXIT_CLEAN, open_session
from ._output import safe, write_whole

if TYPE_CHECKING:
    import argparse
    from typing import Any

    from ..events import ListeningGap

#: How long one wait for events lasts: bounds how late ``--for`` ends (Ctrl-C and SIGTERM interrupt it at once).
_SLICE_S = 0.25


def cmd_watch(args: argparse.Namespace) -> int:
    """Print each event of the selected GPUs as it arrives; flush every line (a pipe reader sees it at once)."""
    from . import _output

    # stdout is JSON Lines: an error document that ends the stream (Ctrl-C, SIGTERM, a bad --devices, no backend),
    # printed by the command line's error path, is one line too.
    _output.JSON_LINES = bool(args.json)
    code = _watch(args)
    _output.JSON_LINES = False  # ended without an error document
    return code


def _watch(args: argparse.Namespace) -> int:
    with open_session(args) as gpus:
        indices = gpus.resolve(args.devices)
        wanted = None if indices is None else frozenset(indices)
        began_ns = time.monotonic_ns()
        began = began_ns / 1e9
        bound_ns = None if args.duration is None else ns_or_none(args.duration)
        if bound_ns is None:
            listener = gpus.listen()
        else:
            # Registered within --for: a registration call that hangs (a wedged driver) ends the command at its
            # end (exit 3, the call named), not whenever the driver answers.
            listener = gpus._listen(began_ns + bound_ns, time.monotonic_ns, bounded=False)
        unheard = _no_events(args, listener, gpus.backend.name)
        if unheard is not None:
            return _unavailable(args, unheard)
        # Some GPUs only: say which of the selected ones are not watched, once (not the others: a fleet operator
        # watching GPU 0 has no use for GPU 5's reason).
        left_out = {i: why for i, why in listener.device_reasons.items() if wanted is None or i in wanted}
        why_not = _left_out(left_out, args.duration)
        covered = sorted(listener.covered if wanted is None else listener.covered & wanted)
        if not covered:  # the selected GPUs have no events (the others do): nothing would ever be printed
            return _unavailable(args, f"events: no selected GPU is listened to ({why_not or 'none covered'})")
        if why_not is not None:
            print(f"nvmlcheck: events: not listened to: {safe(why_not)}", file=sys.stderr)
        if not args.json:
            # Status on stderr (stdout is the events alone): a quiet GPU prints nothing for hours, so say it listens.
            until = f"for {args.duration:g} s" if args.duration is not None else "until Ctrl-C"
            print(f"nvmlcheck watch: listening to {_gpus(covered)} {until}", file=sys.stderr, flush=True)
        end = None if args.duration is None else began + args.duration
        seen = printed = 0
        # The GPUs never registered were said above; every other gap since the command began is said (one that
        # opened and ended while the listener started too).
        gaps = _Gaps(args, {g.seq: True for g in listener.gaps(wanted) if g.cause == "unregistered"})
        while end is None or time.monotonic() < end:
            left = _SLICE_S if end is None else max(0.0, min(_SLICE_S, end - time.monotonic()))
            events, seen = listener.next_events(seen, left)
            for ev in events:
                if wanted is not None and ev.index not in wanted:
                    continue
                printed += 1
                write_whole((_line(ev.to_json()) if args.json else safe(ev.line())) + "\n", stream=True)
            # Recovering or stalled: it listens again once the call in flight returns. Said as it happens and when
            # it ends: before, watch was silent meanwhile, and an operator read the silence as a quiet GPU.
            gaps.say(listener.gaps(wanted, began_ns))
            if listener.state not in ("running", "recovering", "stalled"):
                return _unavailable(args, f"events: {listener.reason or 'the listener stopped'}")
            if not (listener.kept if wanted is None else listener.kept & wanted):
                # Every selected GPU dropped (lost, ...) while others are still listened to: it went on for ever
                # listening to nothing it was asked for. As at the start: exit 3.
                dropped = {i: why for i, why in listener.device_reasons.items() if wanted is None or i in wanted}
                return _unavailable(args, "events: no selected GPU is listened to any more "
                                          f"({_left_out(dropped, None) or 'none left'})")
    if not args.json:
        print(f"nvmlcheck watch: {printed} event{'' if printed == 1 else 's'} in {args.duration:g} s", file=sys.stderr)
    return EXIT_CLEAN


#: ``schema`` of ``watch --json``'s line for a time the listener did not listen (and the line when it listens
#: again); its version. docs/events.md, "nvmlcheck watch".
LISTENING_SCHEMA = "nvmlcheck/listening"
LISTENING_SCHEMA_VERSION = 1


class _Gaps:
    """Says each :class:`~nvmlcheck.events.ListeningGap` once when it opens and once when it ends (a gap that opened
    and ended between two looks is said both ways at once: none is missed, however short)."""

    def __init__(self, args: argparse.Namespace, said: dict[int, bool]) -> None:
        self.args = args
        self.said = said  # gap seq -> whether its end was said

    def say(self, gaps: tuple[ListeningGap, ...]) -> None:
        for gap in gaps:
            ended_said = self.said.get(gap.seq)
            if ended_said is None:
                self._write(gap, ended=False)
            if gap.ended_ns is not None and not ended_said:
                self._write(gap, ended=True)
            self.said[gap.seq] = gap.ended_ns is not None

    def _write(self, gap: ListeningGap, *, ended: bool) -> None:
        at_ns = gap.ended_ns if ended and gap.ended_ns is not None else gap.began_ns
        wall = time.time() - (time.monotonic_ns() - at_ns) / 1e9
        if self.args.json:
            doc = {"schema": LISTENING_SCHEMA, "version": LISTENING_SCHEMA_VERSION,
                   "listening": ended, **gap.to_json(), "time_ns": at_ns, "wall_time": wall}
            if not ended:
                doc["ended_ns"] = doc["lasted_s"] = None  # as it was when it began
            write_whole(_line(doc) + "\n", stream=True)
            return
        millis = int(wall % 1 * 1000)
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{millis:03d}Z"
        gpus = _gpus(list(gap.indices)) if gap.indices else "every GPU"
        if ended:
            lasted = gap.lasted_s() or 0.0
            took = f"{lasted * 1e3:.1f} ms" if lasted < 1 else f"{lasted:.1f} s"
            text = f"{when} listening again to {gpus} after {took} not listening ({gap.cause})"
        else:
            text = f"{when} NOT listening to {gpus} ({gap.cause}): {gap.why}; an XID meanwhile is not heard"
        print(f"nvmlcheck watch: {safe(text)}", file=sys.stderr, flush=True)


def _no_events(args: argparse.Namespace, listener: Any, backend: str) -> str | None:
    """Why there is nothing to watch (``None``: the listener runs)."""
    if listener.state == "starting":
        # --for ran out while the registration was still running (a --for shorter than registering takes, or a
        # wedged driver): nothing was watched. The listener's reason speaks to waits, which poll meanwhile.
        return (f"events: --for {args.duration:g} s ended before the GPUs were registered for events: "
                f"{_in_flight(listener.reason)}; nothing was watched")
    if listener.active:
        return None
    if backend == "smi":  # the listener's reason speaks of waits, which poll instead; watch cannot
        return ("events: the smi backend has none (nvidia-smi cannot deliver them): nothing to watch; events need "
                "the NVML backend (--backend nvml)")
    return f"events: {listener.reason}"


def _line(doc: dict[str, Any]) -> str:
    """One JSON Lines line: compact, and marked ``"simulated": true`` on simulated GPUs as every document is."""
    import json

    from . import _output

    return json.dumps(_output.marked_simulated(doc) if _output.SIMULATED else doc, separators=(",", ":"))


def _unavailable(args: argparse.Namespace, message: str) -> int:
    """Events cannot be had (or stopped): exit 3, with an ``nvmlcheck/error`` document as the last line under
    ``--json`` (stdout stays JSON Lines), and the reason on stderr."""
    if args.json:
        from ..errors import NvmlCheckError
        from ..jsonout import error_document

        print(_line(error_document(NvmlCheckError(message), EXIT_BACKEND)), flush=True)
    print(f"nvmlcheck: {safe(message)}", file=sys.stderr)
    return EXIT_BACKEND


#: A GPU's reason when the deadline of the call that started the listener came before its turn: for watch, --for.
_CUT = "the deadline of the wait that started the listener came first"


def _left_out(reasons: dict[int, str], duration: float | None) -> str | None:
    """The GPUs not listened to and why, one clause per reason (``GPUs 1-63: ...``, not 63 copies of it); a
    registration cut by the deadline is said as --for's."""
    by_reason: dict[str, list[int]] = {}
    for i, reason in sorted(reasons.items()):
        why = reason if duration is None else reason.replace(_CUT, f"--for {duration:g} s ended first")
        by_reason.setdefault(why, []).append(i)
    return "; ".join(f"{_gpus(indices)}: {why}" for why, indices in by_reason.items()) or None


def _in_flight(reason: str | None) -> str:
    """The call a registration still waits on and the GPUs not registered, from a ``"starting"`` listener's reason
    (which goes on to say what waits do meanwhile: not watch's concern)."""
    text = reason or "the registration had not finished"
    text = text.split(": ", 1)[1] if text.startswith("registration had not finished") and ": " in text else text
    return text.split("; waits poll", 1)[0]


def _gpus(indices: list[int]) -> str:
    """``GPU 3``, ``GPUs 0, 2``, ``GPUs 0-63`` (consecutive runs as ranges: 64 GPUs are one short line)."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    words = [str(r[0]) if len(r) == 1 else f"{r[0]}, {r[1]}" if len(r) == 2 else f"{r[0]}-{r[-1]}" for r in runs]
    return f"GPU {indices[0]}" if len(indices) == 1 else f"GPUs {', '.join(words)}"
