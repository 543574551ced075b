"""Choose clean GPUs: wait until ``count`` GPUs are clean (no process, memory at idle) and say which.

What ``nvmlcheck select`` runs (``export CUDA_VISIBLE_DEVICES=$(nvmlcheck select --count 2 --wait 600)``). A GPU is
chosen only when the same predicate as :meth:`Session.wait_until_clean` holds on it alone, never by free memory or
utilisation; with ``lock=True`` the chosen GPUs are locked (:mod:`nvmlcheck.locks`) and GPUs locked by others are
passed over, so racing launch scripts get disjoint sets. Entry points: :func:`select_clean` (also
``Session.select_clean``), :class:`Selection`, :class:`SelectTimeout`. Options and examples: docs/cuda.md,
"nvmlcheck select".

>>> import nvmlcheck as nc
>>> with nc.open() as gpus:                                     # doctest: +SKIP
...     chosen = gpus.select_clean(2, timeout=600)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import (
    ArgumentError,
    ArgumentTypeError,
    BackendUnavailable,
    DeadlinePassed,
    NoSuchProcess,
    NvmlCheckError,
    WaitTimeout,
)
from .model import DeviceState, Fields, Snapshot

if TYPE_CHECKING:
    from .locks import LockSet, Owner
    from .predicates import Predicate
    from .session import DeviceSelector, Session
    from .verdict import Culprit

__all__ = ["SelectTimeout", "Selection", "select_clean"]

#: Seconds between polls while waiting: choosing GPUs is not a race against a reclaim measured in ms, and a long
#: ``--wait`` should cost next to nothing (an NVML pass and an nvidia-smi run cost: docs/performance.md).
DEFAULT_INTERVAL_S = {"nvml": 0.05, "smi": 0.5}


@dataclass(frozen=True, slots=True)
class Selection:
    """What :func:`select_clean` chose.

    ``devices``: the chosen GPUs (lowest NVML index first), as read in the last poll. ``snapshot``: that poll, every
    candidate included. ``elapsed_ns``, ``polls``: how long it took and how many polls. ``locks``: the
    :class:`~nvmlcheck.locks.LockSet` held on them (``lock=True``), else ``None``. ``passed_over``: why the other
    candidates were not chosen at the last poll (busy, locked by another process, unreadable), one line each.
    """

    devices: tuple[DeviceState, ...]
    snapshot: Snapshot
    elapsed_ns: int
    polls: int
    locks: LockSet | None = None
    passed_over: tuple[str, ...] = ()

    @property
    def indices(self) -> tuple[int, ...]:
        """NVML indices of the chosen GPUs (nvidia-smi's numbering)."""
        return tuple(d.index for d in self.devices)

    @property
    def uuids(self) -> tuple[str, ...]:
        """UUIDs of the chosen GPUs (also a valid ``CUDA_VISIBLE_DEVICES`` value, comma-joined)."""
        return tuple(d.uuid for d in self.devices)


class SelectTimeout(WaitTimeout):
    """Fewer than ``count`` GPUs were clean (and unlocked, with ``lock=True``) when the deadline passed.

    Besides :class:`~nvmlcheck.WaitTimeout`'s fields (``culprits``: why each candidate was passed over at the last
    poll): ``count``, the number asked for, and ``clean``, the NVML indices that were clean and free then.
    """

    __module__ = "nvmlcheck"

    def __init__(
        self,
        timeout_s: float,
        elapsed_ns: int,
        culprits: Sequence[str],
        snapshot: Snapshot | None = None,
        polls: int = 0,
        *,
        count: int = 1,
        clean: Sequence[int] = (),
        holders: Sequence[Culprit] | None = None,
    ) -> None:
        super().__init__(timeout_s, elapsed_ns, culprits, snapshot, polls, holders=holders)
        self.count = count
        self.clean: tuple[int, ...] = tuple(clean)
        lines = "\n".join(f"  - {c}" for c in self.culprits) or "  - (no detail available)"
        noun = "poll" if polls == 1 else "polls"
        free = ", ".join(map(str, self.clean)) or "none"
        self.args = (f"not enough clean GPUs: {len(self.clean)} of the {count} asked for after "
                     f"{elapsed_ns / 1e9:.3f} s (timeout {timeout_s:g} s, {polls} {noun}; clean and free: {free}); "
                     f"passed over:\n{lines}",)

    def __str__(self) -> str:
        return str(self.args[0])


def _rebuild(args: tuple[Any, ...], kwargs: dict[str, Any]) -> SelectTimeout:
    """Loads a :class:`SelectTimeout` pickled by nvmlcheck 0.1.0 (its constructor's arguments; since then every
    exception pickles through ``errors._rebuild``): without this name such a pickle did not load at all."""
    return SelectTimeout(*args, **kwargs)


def _one_device(snap: Snapshot, device: DeviceState) -> Snapshot:
    # Predicates judge a snapshot; a snapshot of this device alone makes "clean on every device" mean "this one".
    return dataclasses.replace(snap, devices=(device,), failures=())


def select_clean(
    session: Session,
    count: int,
    *,
    timeout: float | None = 0.0,
    predicate: Predicate | None = None,
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    stable_polls: int = 1,
    lock: bool = False,
    lock_dir: str | Path | None = None,
    interval: float | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], object] = time.sleep,
    owner: int | Owner | None = None,
    health: bool = True,
) -> Selection:
    """Wait until ``count`` of the candidate GPUs are clean and healthy, and return them (lowest NVML index first).

    ``timeout`` in seconds: ``0`` (default) checks once, ``None`` waits forever. ``predicate`` is judged on each
    GPU alone (default :func:`~nvmlcheck.default_predicate`: no process of any kind, at most 16 MiB used).
    ``devices``: the candidates (any selection :meth:`Session.resolve` takes,
    ``"cuda:all"`` included; default every GPU). ``stable_polls``: consecutive clean polls a GPU needs (default 1:
    choosing an idle GPU is not timing a reclaim). ``lock``: also take each chosen GPU's advisory lock
    (:mod:`nvmlcheck.locks`, in ``lock_dir`` or the default directory), passing over GPUs locked by others; the
    locks are in :attr:`Selection.locks` and last until released, handed over, or this process exits.
    ``interval``: seconds between polls (default 0.05 with NVML, 0.5 with nvidia-smi). ``clock``/``sleep``: for
    tests. ``owner``: a process (a PID, or a :class:`~nvmlcheck.locks.Owner` pinned earlier) for whom the GPUs are
    chosen, typically the one :meth:`LockSet.hold_until <nvmlcheck.locks.LockSet.hold_until>` will be given: it is
    checked before each poll and once more before returning, and once it has exited the wait ends. ``health``
    (default ``True``): also read each GPU's health and pass over one with a cause ``ready`` refuses it for
    (a pending row remap or page retirement, a remap failure, volatile uncorrectable ECC errors, a recovery action:
    docs/ready.md), or whose health could not be read though the GPU supports it; ``False`` judges the predicate
    only. A GPU in MIG mode, or whose MIG mode could not be read, is always passed over (CUDA never sees it whole;
    the mode of the GPUs about to be chosen is read once more, so one put in MIG mode during the session counts),
    and a ``MIG-`` selector in ``devices``
    (or a ``cuda:N`` that names a MIG instance: ``CUDA_VISIBLE_DEVICES=MIG-...``) is an
    :class:`~nvmlcheck.ArgumentError`: select chooses whole GPUs.

    Raises :class:`SelectTimeout` (a :class:`~nvmlcheck.WaitTimeout`) naming why each GPU was passed over;
    ``ValueError`` when ``count`` is below 1 or above the number of candidates; :class:`~nvmlcheck.locks.LockDirError`
    when the lock directory or a lock file cannot be used safely (nothing stays locked then);
    :class:`~nvmlcheck.NoSuchProcess` (a ``ProcessLookupError``) when ``owner`` is not running at the start or exits
    during the wait (nothing stays locked then).
    """
    from ._waitoptions import _check_seconds, _timeout_ns
    from .predicates import check_predicate, default_predicate

    check_predicate(predicate)
    for name, flag in (("lock", lock), ("health", health)):
        if not isinstance(flag, bool):
            # lock="no" (a non-empty string) took the locks; health=0 (or None) passed over nothing unhealthy.
            raise ArgumentTypeError(f"{name} must be True or False, got {flag!r}")
    if interval is not None:
        # A number of seconds from 0 to 1e9, as a policy's interval (True, read as 1 s, is a type error): 1e300 or
        # 10**400 overflowed time.sleep at the first pause, and a string was a ValueError.
        _check_seconds("interval", interval)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ArgumentError(f"count must be an integer >= 1, got {count!r}")
    if isinstance(stable_polls, bool) or not isinstance(stable_polls, int) or stable_polls < 1:
        raise ArgumentError(f"stable_polls must be an integer >= 1, got {stable_polls!r}")
    timeout_ns = _timeout_ns(timeout)
    items: list[DeviceSelector] = []
    if devices is not None:
        items = [devices] if isinstance(devices, int | str) else list(devices)
        devices = items  # read twice: checked here, then resolved
    if any(isinstance(i, str) and i[:4].upper() == "MIG-" for i in items):
        # resolve() would widen an instance to its whole GPU, which select would then print.
        raise ArgumentError("select chooses whole GPUs, not MIG instances: drop the MIG- selectors (a GPU in MIG "
                            "mode is passed over; wait or ready judge an instance named by its MIG- UUID)")
    started = clock()
    selected = _resolve(session, devices, timeout=timeout, timeout_ns=timeout_ns, start=started, clock=clock,
                        count=count)
    total = session.device_count() if selected is None else len(selected)
    if count > total:
        where = "this host has" if selected is None else "the selection has"
        twice = ""
        if selected is not None and len(items) > total:
            # `--devices 0,cuda:0` names GPU 0 twice: say so, rather than leave "has 1" to a user who listed two.
            twice = (f" ({len(items)} selectors name GPU {', '.join(map(str, selected))}: a GPU named twice, as 0 "
                     "and cuda:0 or its UUID, counts once)")
        raise ArgumentError(f"asked for {count} clean GPU(s) but {where} {total}{twice}")
    pred = predicate if predicate is not None else default_predicate()
    pause = DEFAULT_INTERVAL_S.get(session.backend_name, 0.5) if interval is None else float(interval)
    directory: Path | None = None
    if lock:
        from .locks import lock_dir as default_lock_dir
        from .locks import prepare_lock_dir

        directory = default_lock_dir() if lock_dir is None else prepare_lock_dir(lock_dir)
    pin: Owner | None = None
    if owner is not None:
        from .locks import Owner, pin_owner

        pin = owner if isinstance(owner, Owner) else pin_owner(owner)
    try:
        return _poll(session, count=count, timeout=timeout, timeout_ns=timeout_ns, selected=selected, pred=pred,
                     stable_polls=stable_polls, directory=directory, pause=pause, clock=clock, sleep=sleep, pin=pin,
                     health=health, start=started)
    finally:
        if pin is not None and pin is not owner:
            pin.close()


def _resolve(session: Session, devices: Iterable[DeviceSelector] | DeviceSelector | None, *, timeout: float | None,
             timeout_ns: int | None, start: int, clock: Callable[[], int], count: int) -> tuple[int, ...] | None:
    """The candidates' indices, their readings (a UUID, ``cuda:N``: an nvidia-smi run, a slow GPU) stopped at the
    deadline and counted in it (one check, ``timeout`` 0, always completes): a :class:`SelectTimeout` when the
    deadline came first."""
    from .errors import DeadlinePassed

    bound = None if not timeout_ns else start + timeout_ns
    try:
        if devices is not None:
            expanded = session._instance_selectors(devices, bound, clock)
            # MIG- selectors were refused above: one here is what a cuda:N names.
            if any(isinstance(i, str) and i[:4].upper() == "MIG-"
                   for i in ([expanded] if isinstance(expanded, int | str) else expanded or ())):
                # As for a MIG- selector: resolve() would widen the instance to its whole GPU, which select would
                # then print (and lock) for a job that sees only the instance.
                import os

                raise ArgumentError("select chooses whole GPUs, not MIG instances: a cuda:N selector names a MIG "
                                    f"instance here (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})"
                                    "; wait or ready judge that instance")
        return session._resolve(devices, bound, clock)
    except DeadlinePassed:
        raise SelectTimeout(0.0 if timeout is None else float(timeout), clock() - start, (
            "no poll finished before the deadline: the GPUs named by the selection were still being read (a slow "
            "or hung GPU, or nvidia-smi)",), None, 0, count=count) from None


def _owner_gone(pin: Owner, polls: int) -> NoSuchProcess:
    noun = "poll" if polls == 1 else "polls"
    return NoSuchProcess(f"process {pin.pid} exited while GPUs were being chosen for it (after {polls} {noun}): "
                         "locks held until it exits would end now; nothing is locked")


def _poll(
    session: Session,
    *,
    count: int,
    timeout: float | None,
    timeout_ns: int | None,
    selected: tuple[int, ...] | None,
    pred: Predicate,
    stable_polls: int,
    directory: Path | None,
    pause: float,
    clock: Callable[[], int],
    sleep: Callable[[float], object],
    pin: Owner | None,
    health: bool,
    start: int,
) -> Selection:
    """:func:`select_clean`'s loop, its arguments checked."""
    from ._deadline import Deadline
    from .wait import _no_poll_line, is_transient

    backend = session.backend
    deadline = None if timeout_ns is None else start + timeout_ns
    # As a wait does: the deadline goes down to the backend (a pass stops between queries, an nvidia-smi run gets the
    # time left), except for timeout=0, which is one complete check; a transient error is retried, not raised.
    cut = Deadline(deadline, clock) if deadline is not None and timeout_ns else None
    streak: dict[str, int] = {}
    polls = 0
    last: Snapshot | None = None
    # What the last complete poll found: a poll cut at the deadline or failing transiently keeps it.
    why: list[str] = []
    eligible: list[DeviceState] = []
    busy: list[str] = []
    patience: list[float | None] = [None]  # the default wait for another select's choice, until one is in vain
    fields = Fields.WAIT | Fields.HEALTH if health else Fields.WAIT
    rechecked = False  # a poll run at once after a chosen GPU was found in MIG mode (_entered_mig)
    while True:
        if pin is not None and pin.exited():
            raise _owner_gone(pin, polls)
        try:
            snap: Snapshot | None = backend.snapshot(selected, fields, deadline=cut)
        except DeadlinePassed:
            snap = None
            if last is None:
                why = [_no_poll_line(timeout)]
        except NvmlCheckError as exc:
            if not is_transient(exc):
                raise
            snap = None
            if last is None:
                why = [f"no poll succeeded (the last failed; retried until the deadline): {exc}"]
        if snap is not None:
            polls += 1
            last = snap
            why, eligible = _judge(snap, pred, streak, stable_polls, health=health)
            chosen, locks, busy = _choose(eligible, count, directory, patience)
            why.extend(busy)
            if chosen is not None and _entered_mig(backend, chosen, locks, why, eligible):
                chosen = None
                if not rechecked:  # judged again at once, once (the next poll reads their MIG state)
                    rechecked = True
                    continue
            if chosen is not None:
                if pin is not None and pin.exited():
                    if locks is not None:
                        locks.release()
                    raise _owner_gone(pin, polls)
                return Selection(tuple(chosen), snap, clock() - start, polls, locks, tuple(why))
        now = clock()
        if deadline is not None and now >= deadline:
            free = [d.index for d in eligible if not any(b.startswith(f"GPU {d.index}:") for b in busy)]
            raise SelectTimeout(0.0 if timeout is None else float(timeout), now - start, why, last, polls,
                                count=count, clean=free, holders=_passed_over_holders(last, free, health))
        wait_s = pause if deadline is None else min(pause, (deadline - now) / 1e9)
        sleep(max(0.0, wait_s))


def _entered_mig(backend: Any, chosen: Sequence[DeviceState], locks: LockSet | None, why: list[str],
                 eligible: list[DeviceState]) -> bool:
    """Whether a GPU about to be chosen entered MIG mode (or its mode cannot be read now) since the session read
    it: a poll reads the mode again only while it is on (:meth:`NvmlBackend.mig_entered
    <nvmlcheck.backends.nvml.NvmlBackend.mig_entered>`), and such a GPU, idle, was handed out as a whole GPU,
    which CUDA never sees. The locks taken are released; ``why`` says which, and they leave ``eligible``."""
    check = getattr(backend, "mig_entered", None)
    if check is None:  # nvidia-smi reads the mode at every run
        return False
    entered = check([d.index for d in chosen])
    if not entered:
        return False
    if locks is not None:
        locks.release()
    eligible[:] = [d for d in eligible if d.index not in entered]
    why.extend(f"GPU {i}: entered MIG mode (or its MIG mode cannot be read) since it was first read: judged "
               "again" for i in entered)
    return True


def _judge(
    snap: Snapshot, pred: Predicate, streak: dict[str, int], stable_polls: int, *, health: bool = False
) -> tuple[list[str], list[DeviceState]]:
    """(why GPUs are passed over, the GPUs clean (and, with ``health``, without a health cause) for
    ``stable_polls`` polls in a row) for one poll; ``streak`` counts each GPU's clean polls in a row and is
    updated."""
    from .model import unsupported
    from .verdict import health_causes

    if not snap.devices and not snap.failures:
        raise BackendUnavailable(f"the {snap.backend} backend sees no GPU: nothing to select",
                                 [f"{snap.backend}: device count 0"])
    why: list[str] = [f"GPU {f.index}: could not be read: {f.error}" for f in snap.failures]
    eligible: list[DeviceState] = []
    for d in snap.devices:
        if d.mig_mode:
            # CUDA sees one MIG device of such a GPU, never the whole GPU: its index or UUID exported to
            # CUDA_VISIBLE_DEVICES would not give a job this GPU (docs/cuda.md, "The mapping rules").
            streak[d.uuid] = 0
            why.append(f"GPU {d.index}: in MIG mode: CUDA cannot use it as one GPU (select chooses whole GPUs; wait "
                       "and ready judge an instance named by its MIG- UUID)")
            continue
        if d.mig_mode is None and "mig" in d.unknown and not unsupported(d.unknown["mig"]):
            # Read and failed: it may be in MIG mode, and a job given it whole might see one instance, or nothing
            # (never "free" when that cannot be told; the CUDA numbering refuses it too). A state built without
            # reading the mode (no reason), or by a tool that has no MIG (an nvidia-smi older than MIG: its driver
            # has none), is judged as before MIG.
            streak[d.uuid] = 0
            why.append(f"GPU {d.index}: its MIG mode is unknown ({d.unknown['mig']}): whether CUDA can use it as one "
                       "GPU cannot be told")
            continue
        verdict = pred.evaluate(_one_device(snap, d))
        # A GPU that needs a reset (or whose health cannot be told) is as unusable as a busy one: the same causes as
        # ``ready``'s, from the one health model.
        sick = health_causes(d) if health else ()
        streak[d.uuid] = streak.get(d.uuid, 0) + 1 if verdict.clean and not sick else 0
        if sick:
            why.extend(c.describe() for c in sick)
        elif not verdict.clean:
            why.extend(verdict.reasons or (f"GPU {d.index}: not clean ({pred.describe()})",))
        elif streak[d.uuid] < stable_polls:
            why.append(f"GPU {d.index}: clean for {streak[d.uuid]} of {stable_polls} polls")
        else:
            eligible.append(d)
    return why, eligible


def _choose(
    eligible: list[DeviceState], count: int, directory: Path | None, patience: list[float | None] | None = None
) -> tuple[list[DeviceState] | None, LockSet | None, list[str]]:
    """The first ``count`` eligible GPUs, locked when ``directory`` is given; (None, None, reasons) when too few.
    ``patience``: ``[seconds]`` to wait for another select's choice (:func:`nvmlcheck.locks.choosing`; ``[None]``:
    its default), set to 0 once a wait was in vain, so that a select stopped mid-choice, or a file held on purpose,
    costs one wait, not one per poll."""
    if directory is None:
        return (eligible[:count] if len(eligible) >= count else None), None, []
    from .locks import LockSet, choosing, recorded_holder, try_lock

    locks = LockSet([], directory)
    chosen: list[DeviceState] = []
    busy: list[str] = []
    try:
        # One select at a time: racers cannot split the free GPUs between them.
        with choosing(directory, None if patience is None else patience[0]) as one_at_a_time:
            if not one_at_a_time and patience is not None:
                patience[0] = 0.0
            for d in eligible:
                if len(chosen) == count:
                    break
                held = try_lock(d.uuid, directory)
                if held is None:
                    busy.append(f"GPU {d.index}: locked by another process "
                                f"({recorded_holder(d.uuid, directory)})")
                    continue
                locks.locks += (held,)
                chosen.append(d)
    except BaseException:  # a lock file that cannot be used (LockDirError): keep none of those taken
        locks.release()
        raise
    if len(chosen) < count:
        # Not enough: give back what was taken, so that two racers wanting 2 of 3 GPUs cannot each sit on one.
        locks.release()
        return None, None, busy
    return chosen, locks, busy


def _passed_over_holders(
    last: Snapshot | None, free: Sequence[int], health: bool = False
) -> tuple[Culprit, ...] | None:
    """What held the candidates that were not clean and free at the timeout (:attr:`SelectTimeout.holders`): not
    those the predicate found clean (a GPU within a laxer limit is no holder's); with ``health``, each passed-over
    GPU's health causes too. ``None`` (judged from the snapshot when asked) with no snapshot."""
    if last is None:
        return None
    from .verdict import health_causes, holders_of

    passed = [d for d in last.devices if d.index not in free]
    found = holders_of(last, devices=[d.index for d in passed])
    if not health:
        return found
    sick = [c for d in passed for c in health_causes(d)]
    return tuple(sorted((*found, *sick), key=lambda c: -1 if c.gpu is None else c.gpu))  # stable: per GPU
