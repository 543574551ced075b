"""``nvmlcheck slurm epilog | prolog | health``: the Slurm gate of :mod:`nvmlcheck.slurm`, as slurmd runs it.

One deadline (``--timeout``) covers everything, opening NVML and the scontrol calls included: the GPU part gets what
is left after a reserve for scontrol. A node whose GPUs are not ready is drained with a reason naming the cause;
``health`` also returns to service an idle node that nvmlcheck drained, once its GPUs are ready again. Exit codes
(docs/slurm.md): 0 ready (health: the node is as the findings say: in service, or drained, by this run or anyone),
1 not ready (drained, or would be; health: unhealthy and the node not drained), 2 usage, 3 no backend (drained too).
Nothing goes to stdout but ``--json``'s document and ``--dry-run``'s commands; one line to stderr when not ready
(slurmd logs it). ``--record FILE`` appends the ``nvmlcheck/slurm`` document as one line.
"""

from __future__ import annotations

import sys
import time

from ._common import EXIT_BACKEND, EXIT_CLEAN, EXIT_NOT_CLEAN, UsageError, open_session, verdict_printed
from ._output import print_json

TYPE_CHECKING = False  # typing costs start-up time where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from .. import slurm
    from ..slurm import GateResult, NodeState, Scontrol, ScontrolRun, SlurmJob

#: The part of ``--timeout`` kept for scontrol (drain, resume): this fraction, at most :data:`_SCONTROL_MAX_S`.
_SCONTROL_SHARE = 0.2
_SCONTROL_MAX_S = 5.0


def cmd_slurm(args: argparse.Namespace) -> int:
    from .. import slurm

    start = time.monotonic_ns()
    deadline = start + int(args.timeout * 1e9)
    gpu_deadline = deadline - int(min(_SCONTROL_MAX_S, args.timeout * _SCONTROL_SHARE) * 1e9)
    job, node = _job_and_node(args)
    scontrol = slurm.Scontrol(args.scontrol, dry_run=args.dry_run, echo=None if args.json else print)
    gate = _Gate(args, node, scontrol, deadline)
    command = args.slurm_command
    if args.record or args.json:
        # The record of a gate that slurmd interrupts must be out within its 10 ms before SIGKILL: nothing of it
        # is imported then (import json and the document's module now, which finish() needs anyway).
        import json  # noqa: F401

        from .. import jsonout  # noqa: F401
    progress = slurm.GateProgress(command, job)
    try:
        with _recording_first(gate, progress):
            return _run_gate(args, gate, progress, job, start=start, gpu_deadline=gpu_deadline)
    except BaseException as exc:
        signum = _signal_of(exc)
        if signum is None:
            raise
        return gate.interrupted(progress, signum)


class _recording_first:
    """While the gate runs, SIGTERM, SIGHUP and SIGINT write its record before anything else, in the handler itself,
    then go on as they would (the exception that :func:`cmd_slurm` turns into :meth:`_Gate.interrupted`). slurmd's
    SIGKILL follows its SIGTERM by 10 ms: the record used to wait for the exception to unwind the wait, the kill and
    the NVML session first, and on a loaded machine the SIGKILL came before it (1 run in 5 with the cores busy).
    A signal while the verdict's own record is being written is left to it (the verdict stands); one that comes
    while the handler writes is ignored. Handlers that are not Python's (the default, ignored) are left as they are,
    and outside the main thread nothing is changed."""

    SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")

    def __init__(self, gate: _Gate, progress: slurm.GateProgress) -> None:
        self.gate, self.progress = gate, progress
        self.previous: dict[int, Any] = {}
        self.writing = False

    def _handler(self, signum: int, frame: Any) -> None:
        if self.writing or self.gate.finishing:
            return
        self.writing = True
        try:
            self.gate.record_interrupt(self.progress, signum)
        except Exception:  # the signal must still end the run as it asks; interrupted() tries again
            pass
        finally:
            self.writing = False
        self.previous[signum](signum, frame)

    def __enter__(self) -> None:
        from .._proc import signals

        for name in self.SIGNALS:
            sig = getattr(signals, name)
            try:
                current = signals.get_handler(sig)
                if callable(current):
                    self.previous[sig] = current
                    signals.set_handler(sig, self._handler)
            except ValueError:  # not the main thread
                break

    def __exit__(self, *exc: object) -> None:
        from .._proc import signals

        for sig, handler in self.previous.items():
            signals.set_handler(sig, handler)


def _signal_of(exc: BaseException) -> int | None:
    """The signal that ``exc`` stands for: Ctrl-C's SIGINT, or the SIGTERM/SIGHUP of :mod:`._signals`."""
    from .._proc import signals
    from ._signals import Terminated

    if isinstance(exc, Terminated):
        return exc.signum
    return signals.SIGINT if isinstance(exc, KeyboardInterrupt) else None


def _run_gate(args: argparse.Namespace, gate: _Gate, progress: slurm.GateProgress, job: SlurmJob, *, start: int,
              gpu_deadline: int) -> int:
    from .. import slurm

    command = args.slurm_command
    devices = [str(d) for d in args.devices] if args.devices else None
    if command != "health" and not devices and not job.gpus:
        # A job without GPUs: nothing to judge, and NVML is not even opened (CPU partitions pay nothing).
        result = slurm.GateResult(command, job, (), True, (), time.monotonic_ns() - start, args.timeout)
        return gate.finish(result, EXIT_CLEAN)
    if command == "health":
        progress.stage = "reading the node's state"
        gate.read_state()
    progress.stage = "opening the GPU backend"
    try:
        session = open_session(_with_timeout(args, max(0.0, (gpu_deadline - time.monotonic_ns()) / 1e9)))
    except Exception as exc:
        from ..errors import NvmlCheckError

        if not isinstance(exc, NvmlCheckError):
            raise
        first = slurm.clean_text(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        cause = slurm.Cause("unavailable", f"no GPU backend: {first[:120]}")
        result = slurm.GateResult(command, job, (), False, (cause,), time.monotonic_ns() - start, args.timeout)
        gate.drain(result)
        return gate.finish(result, EXIT_BACKEND)
    with session:
        timeout_s = _left_s(gpu_deadline)
        if command == "epilog":
            result = slurm.epilog(session, job, timeout_s=timeout_s, grace_s=args.grace, max_used_bytes=args.max_used,
                                  devices=devices, device_files=args.device_files, kill=not args.dry_run,
                                  gpu_ids=args.gpu_ids, progress=progress)
        elif command == "prolog":
            result = slurm.prolog(session, job, timeout_s=timeout_s, max_used_bytes=args.max_used, devices=devices,
                                  gpu_ids=args.gpu_ids, progress=progress)
        else:
            result = slurm.health(session, timeout_s=timeout_s, devices=devices, max_used_bytes=args.max_used,
                                  progress=progress)
            if result.ready and gate.may_resume():
                # Drained by nvmlcheck and idle (no job can start on it): ready again means clean too, not only
                # healthy. One short check: the periodic run comes back.
                timeout_s = min(1.0, _left_s(gpu_deadline))
                result = slurm.health(session, timeout_s=timeout_s, devices=devices, clean=True,
                                      max_used_bytes=args.max_used, progress=progress)
                if result.ready:
                    gate.result = result
                    progress.stage = "returning the node to service"
                    gate.resume()
                return gate.finish(result, EXIT_CLEAN)  # not clean yet: it stays drained, as it should
        if result.ready:
            return gate.finish(result, EXIT_CLEAN)
        gate.result = result
        progress.stage = "draining the node"
        run = gate.drain(result)
    if command == "health":
        # slurmd reruns a failing health program at start-up and does not register the node until it exits 0: a
        # node drained, by this run, earlier with the reason or by someone else, is as it should be (docs/slurm.md).
        return gate.finish(result, EXIT_CLEAN if (run is not None and run.ok) or gate.kept_drained(result) else
                           EXIT_NOT_CLEAN)
    return gate.finish(result, EXIT_NOT_CLEAN)


def _job_and_node(args: argparse.Namespace) -> tuple[SlurmJob, str]:
    """The job from the environment and the node to drain, or a :class:`UsageError`: a malformed ``SLURM_*``
    variable, a prolog or epilog run outside Slurm with no GPU named (it would judge nothing and say ready), not one
    node's name, an empty ``--scontrol`` or ``--record`` (a wrapper's unset variable: never "the
    default", silently)."""
    from .. import slurm

    for option, value in (("--scontrol", args.scontrol), ("--record", args.record)):
        if value is not None and not value.strip():
            raise UsageError(f"{option} {value!r}: an empty path")
    try:
        job = slurm.job_from_env()
        if args.slurm_command != "health":
            slurm.check_run_by_slurm(job, args.devices, f"nvmlcheck slurm {args.slurm_command}")
        return job, slurm.node_name(args.node)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _left_s(deadline_ns: int) -> float:
    """Seconds left until ``deadline_ns``, at least 1 ns: the library reads ``timeout_s=0`` as one check that always
    completes (its readings unbounded), while here a spent budget must stay one: a hung GPU then ends the gate."""
    return max(1e-9, (deadline_ns - time.monotonic_ns()) / 1e9)


def _with_timeout(args: argparse.Namespace, timeout_s: float) -> argparse.Namespace:
    """``args`` with ``timeout`` replaced (open_session bounds nvmlInit by it)."""
    import argparse as ap

    return ap.Namespace(**{**vars(args), "timeout": timeout_s})


class _Gate:
    """The node side of one run: its state, the scontrol calls, and the record at the end."""

    def __init__(self, args: argparse.Namespace, node: str, scontrol: Scontrol, deadline: int) -> None:
        self.args = args
        self.node = node
        self.scontrol = scontrol
        self.deadline = deadline
        self.state: NodeState | None = None
        self.state_error: str | None = None
        self._read = False
        self.result: GateResult | None = None  # the verdict, once the gate has one (a drain or resume follows)
        self.finishing = False  # finish() is writing the verdict's record: a signal now leaves it to it
        self._finished: int | None = None  # the exit code, once finish() has written the verdict's record
        self._interrupt: tuple[GateResult, int] | None = None  # the interrupted result and code, once recorded

    def read_state(self) -> NodeState | None:
        """The node's state and reason, read once (at most 2 s, and half of what is left of the deadline: a drain
        may follow); ``None`` when scontrol fails."""
        if not self._read:
            self._read = True
            now = time.monotonic_ns()
            try:
                self.state = self.scontrol.node(self.node, deadline_ns=min(now + (self.deadline - now) // 2,
                                                                           now + 2_000_000_000))
            except OSError as exc:
                self.state_error = str(exc)
        return self.state

    def may_resume(self) -> bool:
        s = self.state
        return s is not None and s.drained and s.ours and s.base == "IDLE" and not self.args.no_resume

    def already(self, result: GateResult) -> bool:
        from ..slurm import drain_reason

        s = self.state
        return s is not None and s.drained and bool(result.causes) and s.reason == drain_reason(result.causes)

    def kept_drained(self, result: GateResult) -> bool:
        """Whether the node was found drained (or draining) so that no drain of this run is needed: with the result's
        reason already, or by someone else (their reason is kept, as NHC does)."""
        s = self.state
        return s is not None and s.drained and (not s.ours or self.already(result))

    def drain(self, result: GateResult) -> ScontrolRun | None:
        """Drain with the result's reason; not with ``--no-drain``, nor when :meth:`kept_drained`."""
        from ..slurm import drain_reason

        if self.args.no_drain:
            return None
        self.read_state()
        if self.kept_drained(result):
            return None
        return self.scontrol.drain(self.node, drain_reason(result.causes), deadline_ns=self.deadline)

    def resume(self) -> None:
        self.scontrol.resume(self.node, deadline_ns=self.deadline)

    def record_interrupt(self, progress: slurm.GateProgress, signum: int) -> None:
        """The record of a run ended by ``signum``, written once: what the gate had found (its verdict, when it had
        one and was draining or resuming; else :meth:`GateProgress.result`). Called by the signal's handler before
        anything unwinds (:class:`_recording_first`), and by :meth:`interrupted` where no handler did; nothing
        when the verdict's own record is being written."""
        from dataclasses import replace

        from .._proc import signals
        from ._common import EXIT_SIGNAL_BASE

        if self.finishing or self._interrupt is not None:
            return
        name = signals.name(signum)
        code = EXIT_SIGNAL_BASE + signum
        if self.result is not None:
            result = replace(self.result, interrupted=name)
        else:
            result = progress.result(name, timeout_s=self.args.timeout)
        self._interrupt = (result, code)
        if self.args.record:
            _append(self.args.record, self._document(result, code))

    def interrupted(self, progress: slurm.GateProgress, signum: int) -> int:
        """The gate was ended by ``signum`` (slurmd's SIGTERM at PrologEpilogTimeout, Ctrl-C): what it found so far
        goes to the record first of all (slurmd's SIGKILL follows its SIGTERM by 10 ms: the signal's handler wrote
        it already, :meth:`record_interrupt`); then, when it had found something wrong and time is left before the
        deadline, the node is drained with the reason made of it (an interruption alone drains nothing: slurmd
        drains a node whose Prolog or Epilog it ended; and the drain or resume of a finished verdict that was cut is
        not redone); then the ``--json`` document and the line on stderr. The exit code is 128 + ``signum``, as a
        shell reports it; once the verdict's record is written, the verdict's own."""
        if self._finished is not None:
            # The verdict was decided and its record written: the signal came while it was being printed. The
            # verdict stands (as the command line's rule for a verdict decided before its output).
            return self._finished
        self.record_interrupt(progress, signum)
        if self._interrupt is None:  # cut while the verdict's record was being written: nothing more to say
            from ._common import EXIT_SIGNAL_BASE

            return EXIT_SIGNAL_BASE + signum
        result, code = self._interrupt
        found = [c for c in result.causes if not c.text.startswith("interrupted by ")]
        if self.result is None and found and time.monotonic_ns() < self.deadline:
            try:
                self.drain(result)
            except Exception as exc:  # an interrupted gate still reports what it found
                print(f"nvmlcheck slurm: the drain after the interrupt failed: {exc}", file=sys.stderr)
        self._say(result, self._document(result, code), code)
        return code

    def _document(self, result: GateResult, code: int) -> dict[str, Any]:
        from ..jsonout import slurm_document
        from ..slurm import drain_reason

        reason = drain_reason(result.causes) if result.causes else None
        return slurm_document(result, node=self.node, node_state=self.state, node_state_error=self.state_error,
                              reason=reason, scontrol=self.scontrol.runs, exit_code=code, dry_run=self.args.dry_run,
                              timeout_s=self.args.timeout)

    def finish(self, result: GateResult, code: int) -> int:
        self.finishing = True  # a signal meanwhile leaves the verdict's record to be written (_recording_first)
        try:
            doc = self._document(result, code)
            if self.args.record:
                _append(self.args.record, doc)
            self._finished = code
        finally:
            self.finishing = False
        self._say(result, doc, code)
        return code

    def _say(self, result: GateResult, doc: dict[str, Any], code: int) -> None:
        from ..slurm import REASON_PREFIX

        args = self.args
        reason = doc["reason"]
        if args.json:
            print_json(doc)
        if reason is not None:
            # slurmd logs a failing Prolog/Epilog's output: one line, the reason.
            print(f"nvmlcheck slurm {args.slurm_command}: {reason.removeprefix(REASON_PREFIX).strip()}",
                  file=sys.stderr)
        verdict_printed(code)


def _append(path: str, doc: dict[str, Any]) -> None:
    """One JSON line, written with one ``write`` on an ``O_APPEND`` descriptor (concurrent runs do not interleave).
    Only to a regular file: opened without blocking, so a FIFO (no reader: the open would wait forever, past slurmd's
    timeout) or a device put where the record goes is refused, with a message, and the run ends as it would."""
    import json
    import os
    import stat

    line = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file")
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        print(f"nvmlcheck slurm: cannot write the record to {path}: {exc}", file=sys.stderr)
