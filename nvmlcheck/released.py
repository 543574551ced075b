"""Judging only what a kill killed, on a GPU shared with other tenants: the targets' memory is back.

:func:`targets_released` holds on a GPU when none of the targets is on its process lists and its used memory has
fallen by what the targets held in the baseline (a snapshot taken just before the first signal), within the
reporting resolution and a tolerance; memory other tenants allocate or free meanwhile, where they are visible on the
lists, is allowed for. :func:`not_ours` names what was left running. Used by ``kill --only-targets`` and
``kill_and_wait(only_targets=True)``; limits (a tenant of another PID namespace that grows during the kill):
docs/killing.md ("Shared GPUs").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from ._units import format_bytes
from .errors import ArgumentError, ArgumentTypeError
from .model import DeviceState, Snapshot
from .predicates import (
    DEFAULT_TOLERANCE_BYTES,
    Predicate,
    _DevicePredicate,
    _judge_at_most,
    _memory_unknown,
    _Why,
    check_bytes,
)

__all__ = ["not_ours", "targets_released"]


def _listed(d: DeviceState) -> list[tuple[int, int | None, str | None]] | None:
    """``(pid, bytes, name)`` of every process on ``d``'s lists (one entry per PID), ``None`` if a list is unknown."""
    lists = (d.compute_processes, d.graphics_processes, d.mps_processes)
    if any(p is None for p in lists):
        return None
    seen: dict[int, tuple[int, int | None, str | None]] = {}
    for procs in lists:
        for p in procs or ():
            if p.pid not in seen:
                seen[p.pid] = (p.pid, p.used_bytes, p.name)
    return list(seen.values())


class _Base:
    """One GPU in the baseline: used memory, what the targets held there, what the others listed held, and the
    others whose bytes NVML did not report (``unsized``: their PIDs)."""

    __slots__ = ("index", "others", "targets_bytes", "unsized", "used", "why")

    def __init__(self, index: int, used: int | None, targets_bytes: int | None, others: int | None,
                 why: str | None, *, unsized: frozenset[int] = frozenset()) -> None:
        self.index = index
        self.used = used
        self.targets_bytes = targets_bytes
        self.others = others
        self.why = why
        self.unsized = unsized


class _Released(_DevicePredicate):
    __slots__ = ("baseline", "pids", "tolerance")

    def __init__(self, pids: Callable[[], frozenset[int]], baseline: dict[str, _Base], tolerance: int) -> None:
        self.pids = pids
        self.baseline = baseline
        self.tolerance = tolerance

    def _judge(self, d: DeviceState) -> tuple[bool | None, str | None]:
        pids = self.pids()
        listed = _listed(d)
        if listed is not None:
            for pid, held, name in listed:
                if pid in pids:
                    what = "an unknown amount" if held is None else format_bytes(held)
                    return False, f"GPU {d.index}: pid {pid} ({name or 'name unknown'}, a target) still listed, {what}"
        base = self.baseline.get(d.uuid)
        if base is None:
            return None, f"GPU {d.index} ({d.uuid}): not in the baseline snapshot; cannot tell what the targets held"
        if base.used is None or base.targets_bytes is None:
            return None, f"GPU {d.index}: {base.why}"
        m = d.memory
        if m is None:
            return None, _memory_unknown(d).text
        if listed is None:
            return None, f"GPU {d.index}: a process list is unknown; cannot tell the targets from the others"
        gone = sorted(base.unsized - {pid for pid, _, _ in listed})
        if gone:
            # What it held is not in the baseline's figures: the memory it took with it would pass for the targets'.
            return None, (f"GPU {d.index}: pid {gone[0]} left its list holding an amount NVML did not report ('not "
                          "available'); cannot tell its memory from the targets'")
        others_now = sum(b for pid, b, _ in listed if pid not in pids and b is not None)
        # Signed: a tenant that leaves during the kill takes its memory with it, and that must not pass for the
        # targets' (their memory still held, the tenant's back: a drop as large as the targets').
        grown = others_now - base.others if base.others is not None else 0
        allowed = base.used - base.targets_bytes + grown + self.tolerance
        verdict = _judge_at_most(m.used_bytes, 2 * (m.granularity_bytes - 1), allowed)
        if verdict is True:
            return True, None
        back = base.used + grown - m.used_bytes
        text = (f"GPU {d.index}: {format_bytes(max(0, back))} of the {format_bytes(base.targets_bytes)} the targets "
                f"held is back ({format_bytes(m.used_bytes)} used; at most {format_bytes(allowed)} expected)")
        if verdict is None:
            text += ", within the reporting resolution: cannot tell"
        return verdict, text

    def _check_device(self, d: DeviceState) -> bool | None:
        return self._judge(d)[0]

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        truth, text = self._judge(d)
        if truth is not True and text is not None:
            yield _Why(truth, d.index, text)

    def describe(self) -> str:
        return "the targets are off every GPU process list and the memory they held is back"

    def __repr__(self) -> str:
        return f"targets_released({sorted(self.pids())!r})"


def _baseline(snapshot: Snapshot, pids: frozenset[int]) -> dict[str, _Base]:
    out: dict[str, _Base] = {}
    for d in snapshot.devices:
        listed = _listed(d)
        used = None if d.memory is None or d.memory.used_includes_reserved else d.memory.used_bytes
        why = None
        targets_bytes: int | None = 0
        others: int | None = 0
        unsized: set[int] = set()
        if used is None:
            why = ("the baseline's used memory is unknown or includes the driver's reserve (v1 call); cannot tell "
                   "what the targets held")
        if listed is None:
            targets_bytes = others = None
            why = why or "a process list of the baseline is unknown; cannot tell what the targets held"
        else:
            for pid, held, _ in listed:
                if pid in pids:
                    if held is None:
                        targets_bytes = None
                        why = why or (f"NVML does not report what pid {pid} (a target) held ('not available'); "
                                      "cannot tell when it is back")
                    elif targets_bytes is not None:
                        targets_bytes += held
                elif held is None:
                    unsized.add(pid)
                elif others is not None:
                    others += held
        out[d.uuid] = _Base(d.index, used, targets_bytes, others, why, unsized=frozenset(unsized))
    return out


def targets_released(
    pids: Iterable[int] | Callable[[], Iterable[int]],
    baseline: Snapshot,
    *,
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
) -> Predicate:
    """Holds on each GPU when no target is on its process lists and its used memory is at most the baseline's minus
    what the targets held there, plus the change since in what other listed processes hold (less when one left: its
    memory coming back is not the targets'), plus ``tolerance_bytes``
    (and the reporting resolution of both readings). Unknown (``None``) where that cannot be told: a list or the
    memory unreadable, a target's bytes "not available", another process of the baseline whose bytes were "not
    available" gone from the lists (the memory it took with it would pass for the targets'), a GPU absent from the
    baseline, or a v1-only driver.

    ``pids``: the targets, or a callable returning them (a kill with ``tree=True`` adds descendants as it finds
    them: they count as targets from then on). ``baseline``: a snapshot with memory and process lists, taken
    just before the first signal (the targets' holdings are read from it)."""
    tolerance_bytes = check_bytes("tolerance_bytes", tolerance_bytes)
    if not isinstance(baseline, Snapshot):
        raise ArgumentTypeError(f"targets_released() takes the baseline Snapshot taken before the first signal, got "
                                f"{baseline!r}")
    if callable(pids):
        source = pids

        def current() -> frozenset[int]:
            return frozenset(source())

        at_baseline = _checked_pids(current())
    else:
        fixed = _checked_pids(pids)

        def current() -> frozenset[int]:
            return fixed

        at_baseline = fixed
    return _Released(current, _baseline(baseline, at_baseline), tolerance_bytes)


def _checked_pids(pids: object) -> frozenset[int]:
    """The targets as a set of PIDs; an :class:`~nvmlcheck.ArgumentTypeError` or ``ArgumentError`` for anything
    else (a str would be read digit by digit: no target would ever be seen on a list)."""
    if isinstance(pids, str | bytes | int) or not isinstance(pids, Iterable):
        raise ArgumentTypeError(f"targets_released() takes PIDs (an iterable of int: [{pids!r}]), got {pids!r}")
    out = frozenset(pids)
    for pid in out:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ArgumentError(f"a process ID is a positive whole number, got {pid!r}")
    return out


def not_ours(snapshot: Snapshot | None, pids: Iterable[int], *, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES
             ) -> tuple[str, ...]:
    """Lines naming what holds the GPUs of ``snapshot`` besides ``pids``: listed processes, and memory held by no
    visible process (a tenant of another PID namespace) above ``tolerance_bytes``. Memory is called invisible only
    when every list was read and every listed process's bytes are known; a GPU whose lists could not be read says
    so."""
    if snapshot is None:
        return ()
    mine = frozenset(pids)
    lines: list[str] = []
    for d in snapshot.devices:
        listed = _listed(d)
        m = d.memory
        used = None if m is None or m.used_includes_reserved else m.used_bytes
        if listed is None:
            if used is not None and used > tolerance_bytes:
                lines.append(f"GPU {d.index}: {format_bytes(used)} used and a process list could not be read: "
                             "cannot tell whose")
            continue
        known: int | None = 0
        for pid, held, name in listed:
            if held is None:
                known = None  # the rest of the memory may be this process's
            elif known is not None:
                known += held
            if pid not in mine:
                what = "an unknown amount" if held is None else format_bytes(held)
                lines.append(f"GPU {d.index}: pid {pid} ({name or 'name unknown'}) holds {what}: not ours")
        if used is not None and known is not None and used - known > tolerance_bytes:
            lines.append(f"GPU {d.index}: {format_bytes(used - known)} held by no visible process (another "
                         "PID namespace's tenant): not ours")
    return tuple(lines)
