"""Kill named processes and wait until the GPUs are verified clean, timing each phase.

:func:`kill_and_wait` sends SIGTERM (or another signal) to the PIDs it is given, escalates to SIGKILL after a grace
period, watches each PID leave the OS and the NVML process lists, and then waits with the normal poller until the
memory is back. It never signals a PID it was not given, and refuses PID 0/1, itself and its parent.

The phases are reported separately because they differ on a real driver: on an H200 the memory of a killed process
often returns *before* its parent can reap it, and the process list empties ~30 ms *before* the memory is back
(FACTS.md), so "the PID is gone" is not "the GPU is clean".
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .errors import BackendUnavailable, NvmlCheckError
from .model import Snapshot
from .predicates import Predicate, default_predicate, pids_gone
from .session import DeviceSelector, Session
from .wait import PollPolicy, TracePoint, WaitResult

__all__ = ["KillError", "KillResult", "PidTimes", "kill_and_wait", "pid_exited"]


class KillError(NvmlCheckError):
    """A PID cannot be signalled: refused (0, 1, this process, its parent), no such process (ESRCH), or not
    permitted (EPERM: another user's or another container's process)."""

    __module__ = "nvmlcheck"

    def __init__(self, pid: int, reason: str) -> None:
        self.pid = pid
        self.reason = reason
        super().__init__(f"cannot signal PID {pid}: {reason}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.pid, self.reason))


@dataclass(frozen=True, slots=True)
class PidTimes:
    """What happened to one PID, as offsets in ns from the first signal (``None``: not observed).

    ``killed_ns``: when SIGKILL was sent (``None`` if the first signal sufficed). ``exited_ns``: first poll that found
    the process gone or a zombie (its GPU file descriptors are closed then). ``off_gpu_ns``: first poll whose process
    lists no longer showed it.
    """

    pid: int
    killed_ns: int | None
    exited_ns: int | None
    off_gpu_ns: int | None


@dataclass(frozen=True, slots=True)
class KillResult:
    """Per-phase times of :func:`kill_and_wait`, in ns from the first signal, and the final wait's result.

    ``clean_ns``: when the GPUs were first seen clean (the wait's ``first_clean_ns`` translated to this origin);
    ``confirmed_ns``: when that was confirmed. ``resolution_ns``: the poll period, the uncertainty of each time.
    """

    signal_name: str
    started_ns: int
    pids: tuple[PidTimes, ...]
    clean_ns: int
    confirmed_ns: int
    resolution_ns: int
    wait: WaitResult

    @property
    def snapshot(self) -> Snapshot:
        """The last snapshot (clean)."""
        return self.wait.snapshot


def pid_exited(pid: int) -> bool:
    """Whether ``pid`` no longer runs: gone, or a zombie waiting to be reaped (its files, and so its GPU memory
    handles, are closed by then). Reaps it when it is our own child."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass  # not our child: ask /proc
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself contain ") ".
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state in (b"Z", b"X")


def _validate(pids: Iterable[int]) -> tuple[int, ...]:
    out: list[int] = []
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int):
            raise TypeError(f"a PID is an int, not {pid!r}")
        if pid <= 1:
            raise KillError(pid, "PIDs 0 and 1 (and negative process groups) are never signalled")
        if pid == os.getpid():
            raise KillError(pid, "that is this process")
        if pid == os.getppid():
            raise KillError(pid, "that is this process's parent")
        if pid not in out:
            out.append(pid)
    if not out:
        raise ValueError("no PID given")
    return tuple(out)


def _send(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig``; ``False`` if the process is already gone (a race we accept after the first signal)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        raise KillError(pid, "not permitted (EPERM): another user's process, or one in another container") from None
    return True


def kill_and_wait(
    session: Session,
    pids: Iterable[int],
    *,
    timeout: float | None = 30.0,
    grace_s: float = 5.0,
    first_signal: signal.Signals = signal.SIGTERM,
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    predicate: Predicate | None = None,
    policy: PollPolicy | str | float | None = None,
    stable_polls: int = 2,
    on_poll: Callable[[TracePoint], object] | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], object] = time.sleep,
) -> KillResult:
    """Signal ``pids``, escalate to SIGKILL after ``grace_s``, then wait until the selected GPUs are clean.

    ``timeout`` bounds the whole operation (seconds from the first signal; ``None``: no bound). The clean condition
    is ``predicate`` (default: :func:`~nvmlcheck.predicates.default_predicate`) and the PIDs being off every process
    list. Raises :class:`KillError` before signalling anything if a PID is refused, does not exist (ESRCH) or
    cannot be signalled (EPERM), and :class:`~nvmlcheck.BackendUnavailable` if the backend sees no GPU;
    :class:`~nvmlcheck.WaitTimeout` if the GPUs are not clean in time.
    """
    targets = _validate(pids)
    if not grace_s >= 0:  # also rejects NaN
        raise ValueError(f"grace_s must be >= 0, got {grace_s!r}")
    indices = session.resolve(devices)
    if indices is None and session.device_count() == 0:
        # The wait would refuse zero GPUs after the signals went out; refuse before anything is signalled.
        raise BackendUnavailable(
            f"the {session.backend_name} backend sees no GPU: nothing could prove the GPUs clean after the kill, "
            "so nothing was signalled",
            [f"{session.backend_name}: device count 0"],
        )
    for pid in targets:  # check every PID before signalling any: all or nothing
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise KillError(pid, "no such process (ESRCH)") from None
        except PermissionError:
            raise KillError(pid, "not permitted (EPERM): another user's process, or one in another container") from None

    start = clock()
    for pid in targets:
        _send(pid, first_signal)
    killed: dict[int, int] = {}
    exited: dict[int, int] = {}
    off_gpu: dict[int, int] = {}
    grace_end = start + int(grace_s * 1e9)

    def observe(point: TracePoint) -> None:
        # Runs after every poll of the wait below: one loop times every phase and escalates on time.
        now = clock()
        for pid in targets:
            if pid not in exited and pid_exited(pid):
                exited[pid] = now - start
        snap = point.snapshot
        if snap is not None and not snap.failures and all(d.processes is not None for d in snap.devices):
            seen = {p.pid for d in snap.devices for p in (d.processes or ())}
            for pid in targets:
                if pid not in off_gpu and pid not in seen:
                    off_gpu[pid] = now - start
        if now >= grace_end and first_signal != signal.SIGKILL:
            for pid in targets:
                if pid not in exited and pid not in killed:
                    killed[pid] = now - start
                    _send(pid, signal.SIGKILL)
        if on_poll is not None:
            on_poll(point)

    condition = (predicate if predicate is not None else default_predicate()) & pids_gone(targets)
    result = session.wait_until_clean(
        timeout,
        condition,
        devices=indices,
        policy=policy,
        stable_polls=stable_polls,
        on_poll=observe,
        clock=clock,
        sleep=sleep,
    )
    resolution = max(result.interval_ns, result.poll_cost_ns)
    times = tuple(PidTimes(pid, killed.get(pid), exited.get(pid), off_gpu.get(pid)) for pid in targets)
    return KillResult(
        signal_name=first_signal.name,
        started_ns=start,
        pids=times,
        clean_ns=result.started_ns + result.first_clean_ns - start,
        confirmed_ns=result.confirmed_ns - start,
        resolution_ns=resolution,
        wait=result,
    )

