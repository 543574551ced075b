"""The OS-side phases of a holder's end (``zombie``, ``exited``, ``files_closed``), watched from ``/proc`` by a
thread of its own while the study's observer polls NVML: an NVML query can block for as long as the driver tears a
context down, and checks made between polls would inherit that as their resolution.

Each phase's time is taken when the check that first saw it *returned*; its resolution is the window since the
previous check of the same phase started. What each phase means: docs/study-records.md.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._proc.devfiles import _matcher, device_file_patterns
from .._proc.pin import Pinned, pidfd_available
from .._proc.procfs import read_stat

__all__ = ["PROC_PHASES", "PhaseWatch", "ProcWatcher", "files_closed", "leader_zombie", "watch_phases"]

#: The phases watched here, in the order they normally happen.
PROC_PHASES: tuple[str, ...] = ("zombie", "exited", "files_closed")


def leader_zombie(pid: int, proc: str = "/proc") -> bool:
    """Whether the leader of ``pid`` is a zombie (or already gone: reaped implies it was one)."""
    st = read_stat(pid, proc)
    return st is None or st.state in ("Z", "X")


def _any_match(fd_dir: str, match: re.Pattern[str]) -> bool | None:
    """Whether any descriptor in ``fd_dir`` links to a matching file, stopping at the first (``None``: unreadable)."""
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    for name in names:
        try:
            if match.match(os.readlink(f"{fd_dir}/{name}")):
                return True
        except OSError:
            continue  # closed meanwhile
    return False


def files_closed(pid: int, patterns: Sequence[str] | re.Pattern[str], proc: str = "/proc") -> bool | None:
    """Whether no thread of ``pid`` has a matching file open (``True`` also once it is gone); ``None`` when a
    thread's descriptors cannot be read (not permitted): unknown.

    Stops at the first matching descriptor: while the process holds its files (most of a sampling run) one
    readlink or a few answer, instead of every descriptor of every thread."""
    match = patterns if isinstance(patterns, re.Pattern) else _matcher(patterns)
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return True  # gone (reaped): nothing is open
    unknown = False
    for tid in tids:
        found = _any_match(f"{proc}/{pid}/task/{tid}/fd", match)
        if found is None:
            # The thread exited meanwhile (normal), or we may not read it (then we cannot know).
            if os.path.exists(f"{proc}/{pid}/task/{tid}"):
                unknown = True
            continue
        if found:
            return False
    return None if unknown else True


@dataclass
class PhaseWatch:
    """One holder's OS-side phases: absolute monotonic ns when first seen (``at``), the resolution of each
    (``resolution``), and why a phase is unknown (``unknown``)."""

    pid: int
    signal_ns: int = 0
    pinned: Pinned | None = None
    at: dict[str, int] = field(default_factory=dict)
    resolution: dict[str, int] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    last_start: dict[str, int] = field(default_factory=dict)
    #: Set by :meth:`ProcWatcher.start_at`: a holder of a later stage is not sampled before its own signal (a phase
    #: "seen" while it still runs would be no phase of its end).
    armed: bool = False

    def pending(self) -> list[str]:
        """The phases neither seen nor known to be unobservable."""
        return [p for p in PROC_PHASES if p not in self.at and p not in self.unknown]


class ProcWatcher(threading.Thread):
    """Samples every :class:`PhaseWatch` until each phase is seen (or :meth:`stop`).

    ``patterns``: the device-file globs (:func:`nvmlcheck._proc.devfiles.device_file_patterns`). ``interval_s``: the
    sleep between rounds (the resolution is about this plus a round's cost). ``clock`` and ``checks`` are injectable
    for tests: ``checks`` maps a phase to ``f(watch) -> bool | None`` (``None``: cannot tell now).
    """

    def __init__(
        self,
        watches: Sequence[PhaseWatch],
        patterns: Sequence[str],
        *,
        interval_s: float = 0.0002,
        clock: Callable[[], int] = time.monotonic_ns,
        checks: dict[str, Callable[[PhaseWatch], bool | None]] | None = None,
    ) -> None:
        super().__init__(name="nvmlcheck-proc-phases", daemon=True)
        self.watches = list(watches)
        self.patterns = tuple(patterns)
        match = _matcher(self.patterns)  # compiled once, and a bad pattern fails now, not in the thread
        self.interval_s = interval_s
        self.clock = clock
        self.checks = checks if checks is not None else {
            "zombie": lambda w: leader_zombie(w.pid),
            "exited": lambda w: w.pinned.exited() if w.pinned is not None else None,
            "files_closed": lambda w: files_closed(w.pid, match),
        }
        self.rounds = 0
        self._stop_event = threading.Event()

    @staticmethod
    def pin(pid: int) -> tuple[Pinned | None, str | None]:
        """A pidfd on ``pid`` for the ``exited`` phase, or ``None`` and why (call while the process is alive)."""
        if not pidfd_available():
            return None, "no pidfd on this kernel or Python (os.pidfd_open): whole-process exit not observable"
        try:
            return Pinned.open(pid, mode="pidfd"), None
        except OSError as exc:
            return None, f"pidfd_open({pid}) failed: {exc}"

    def start_at(self, watch: PhaseWatch, signal_ns: int) -> None:
        """Record ``watch``'s signal time (the start of every phase's first window)."""
        watch.signal_ns = signal_ns
        watch.armed = True
        for p in PROC_PHASES:
            watch.last_start.setdefault(p, signal_ns)

    def sample(self) -> bool:
        """One round over every pending phase; ``True`` while something is still pending."""
        self.rounds += 1
        busy = False
        for w in self.watches:
            if not w.armed:
                busy = True  # its stage has not been ended yet
                continue
            # Latest phase first: a round that sees a later phase then also sees the earlier ones (they happened
            # before it), so the recorded times keep the phases' order instead of depending on where a round
            # happened to be when the process exited.
            for phase in reversed(w.pending()):
                t0 = self.clock()
                seen = self.checks[phase](w)
                t1 = self.clock()
                if seen:
                    w.at[phase] = t1
                    w.resolution[phase] = t1 - w.last_start.get(phase, w.signal_ns)
                else:
                    w.last_start[phase] = t0
                    busy = True
        return busy

    def run(self) -> None:
        while not self._stop_event.is_set() and self.sample():
            self._stop_event.wait(self.interval_s)

    def stop(self) -> None:
        """Stop sampling; phases not seen by then stay unseen (the caller records why)."""
        self._stop_event.set()
        if self.is_alive():
            self.join(5.0)
        if not self.is_alive():
            # One last look: the observation may end (clean, reaped) between two rounds; what is true now is
            # recorded with its honest window (since the previous check), not lost.
            self.sample()
        for w in self.watches:
            if w.pinned is not None:
                w.pinned.close()


def watch_phases(
    pids: Sequence[int], *, precise: bool, device_files: Sequence[str] | None
) -> tuple[list[PhaseWatch], ProcWatcher]:
    """One :class:`PhaseWatch` per PID, each pinned by a pidfd while it is still alive (call before the signals),
    and the (not yet started) watcher over them. ``precise``: sample every 0.2 ms instead of every 1 ms;
    ``device_files``: the device-file globs (``None``: ``/dev/nvidia*``)."""
    watches = []
    for pid in pids:
        pinned, why = ProcWatcher.pin(pid)
        pw = PhaseWatch(pid, pinned=pinned)
        if why is not None:
            pw.unknown["exited"] = why
        watches.append(pw)
    interval = 0.0002 if precise else 0.001
    return watches, ProcWatcher(watches, device_file_patterns(device_files), interval_s=interval)
