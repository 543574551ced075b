"""Composable predicates that decide whether a :class:`~nvmlcheck.model.Snapshot` is "clean".

A predicate is a small immutable object, combined with ``&``, ``|`` and ``~``::

    p = on_devices([0, 1], no_processes() & memory_used_at_most(16 * MIB))
    verdict = p.evaluate(snapshot)   # satisfied: True, False or None (cannot tell); reasons: one line per GPU

Entry points: the constructors (:func:`no_processes`, :func:`pids_gone`, :func:`memory_used_at_most`,
:func:`memory_back_to`, :func:`memory_free_at_least` (capacity, for ``ready``), :func:`on_devices`,
:func:`default_predicate`, :func:`always`, :func:`never`),
:class:`Predicate` (``evaluate`` with reasons, ``check`` without text for the poller) and :class:`Verdict`.
Three-valued (Kleene) logic, unknown devices and the default's limits: docs/waiting.md ("Predicates", "Unknown:
three-valued logic", "MIG: clean per instance").
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType

from ._record import record, replace
from ._text import printable
from ._units import MAX_BYTES, format_bytes
from .errors import ArgumentError, ArgumentTypeError
from .model import (
    MIB,
    DeviceFailure,
    DeviceState,
    GpuProcess,
    Memory,
    MigDevice,
    ProcessKind,
    Snapshot,
    unknown_key,
)

__all__ = [
    "ALL_KINDS",
    "DEFAULT_MAX_USED_BYTES",
    "DEFAULT_MIG_IDLE_BYTES",
    "DEFAULT_TOLERANCE_BYTES",
    "MIB",
    "DevicePredicate",
    "Predicate",
    "SnapshotPredicate",
    "Verdict",
    "always",
    "blamed_devices",
    "default_predicate",
    "format_bytes",
    "instance_view",
    "free_bytes_of",
    "memory_back_to",
    "memory_free_at_least",
    "memory_used_at_most",
    "never",
    "no_processes",
    "on_devices",
    "pids_gone",
]

#: Every process kind: compute, graphics and MPS.
ALL_KINDS: tuple[ProcessKind, ...] = (ProcessKind.COMPUTE, ProcessKind.GRAPHICS, ProcessKind.MPS)
#: The default predicate's limit on used memory. An idle GPU reads 0 with the v2 memory call; 16 MiB leaves room for
#: nvidia-smi's whole-MiB rounding (docs/waiting.md, 'What "clean" means by default').
DEFAULT_MAX_USED_BYTES = 16 * MIB
#: The default slack of :func:`memory_back_to` above the baseline.
DEFAULT_TOLERANCE_BYTES = 16 * MIB
#: What a GPU in MIG mode may read used with no process, above the limit: the driver keeps MIG bookkeeping in the
#: GPU's memory (public captures: docs/driver-facts.md). A CUDA context alone takes hundreds of MiB, so this
#: allowance cannot hide a process. Applied per MIG instance when the instances' memory is known, else to the parent.
DEFAULT_MIG_IDLE_BYTES = 64 * MIB

# Why an idle GPU does not read 0 with the v1 memory call: it counts the driver's reservation (docs/driver-facts.md).
_V1_HINT = (
    "this driver only offers nvmlDeviceGetMemoryInfo (v1), whose 'used' includes the driver's reserved memory "
    "(about 615 MiB on an H200), so no fixed limit can tell idle from busy; take a snapshot while the GPU is idle "
    "and use memory_back_to(baseline)"
)
# Why memory can be held with an empty process list: PID namespaces, exiting processes (docs/driver-facts.md).
_NO_VISIBLE_PROCESS = "with no visible process (PID namespace or a process that already exited)"


# --- verdicts ---------------------------------------------------------------------------------------------------


@record
class Verdict:
    """The answer of a predicate about one snapshot.

    ``satisfied`` is ``True``, ``False`` or ``None`` (cannot tell); ``reasons`` says in words why the predicate is
    not satisfied (empty when it is). ``bool(verdict)`` is :attr:`clean`.
    """

    satisfied: bool | None
    reasons: tuple[str, ...] = ()

    @property
    def clean(self) -> bool:
        """``True`` only when the predicate is known to hold."""
        return self.satisfied is True

    @property
    def unknown(self) -> bool:
        """``True`` when the predicate cannot be decided from this snapshot."""
        return self.satisfied is None

    def __bool__(self) -> bool:
        return self.satisfied is True


# The two private values below are plain slotted classes: built on every poll (a frozen dataclass's __init__ costs
# several times more) and made at import for every one-shot (a named tuple class costs ~0.15 ms there on an H200).
class _Why:
    """One reason: whether it makes the answer ``False`` or unknown (``None``), the GPU it is about, the text."""

    __slots__ = ("device", "text", "truth")

    def __init__(self, truth: bool | None, device: int | None, text: str) -> None:
        self.truth = truth
        self.device = device
        self.text = text


class _Scope:
    """The part of a snapshot a predicate judges (narrowed by :func:`on_devices`); ``snapshot``: the one it is part
    of, when known (a :class:`SnapshotPredicate` is handed that snapshot, narrowed to this part)."""

    __slots__ = ("devices", "failures", "missing", "snapshot")

    def __init__(
        self,
        devices: tuple[DeviceState, ...],
        failures: tuple[DeviceFailure, ...],
        missing: tuple[int | str, ...] = (),
        snapshot: Snapshot | None = None,
    ) -> None:
        self.devices = devices
        self.failures = failures
        self.missing = missing
        self.snapshot = snapshot


def _scope_of(snapshot: Snapshot) -> _Scope:
    try:
        return _Scope(snapshot.devices, snapshot.failures, (), snapshot)
    except AttributeError:
        raise ArgumentTypeError(f"a predicate judges a Snapshot (Session.snapshot()), got {snapshot!r}") from None


def _sorted_reasons(whys: Iterable[_Why]) -> tuple[str, ...]:
    """Reasons grouped by GPU index (device-less reasons last), in their original order within a GPU, deduplicated
    (``a & b`` both report an unreadable device)."""
    ordered = sorted(whys, key=lambda w: (w.device is None, w.device or 0))
    return tuple(dict.fromkeys(w.text for w in ordered))


# --- the base class ---------------------------------------------------------------------------------------------


class Predicate(abc.ABC):
    """A condition on a snapshot. Combine with ``&``, ``|`` and ``~`` (docs/waiting.md explains the
    three-valued logic). Predicates are immutable and can be shared between threads and waits.

    Using ``and``/``or``/``not`` on predicates is a mistake (Python would use their truth value), so ``bool()`` of a
    predicate raises :class:`TypeError`.
    """

    __slots__ = ()
    # nvmlcheck's own predicates set each attribute once, in __init__: one object is shared by every wait and thread
    # (always() is a single one), so changing it afterwards is refused. A tool author's subclass is left alone.
    _FROZEN = True

    def __setattr__(self, name: str, value: object) -> None:
        if self._FROZEN:
            try:
                object.__getattribute__(self, name)
            except AttributeError:  # not set yet: __init__ (or unpickling) sets it
                pass
            else:
                raise AttributeError(f"{type(self).__name__.lstrip('_')} is immutable: build a new predicate")
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if self._FROZEN:
            raise AttributeError(f"{type(self).__name__.lstrip('_')} is immutable: build a new predicate")
        object.__delattr__(self, name)

    def check(self, snapshot: Snapshot) -> bool | None:
        """``True``, ``False`` or ``None`` (unknown), without building reason texts (fast: the poller's path)."""
        return self._check(_scope_of(snapshot))

    def evaluate(self, snapshot: Snapshot) -> Verdict:
        """The verdict on ``snapshot``, with reasons when it is not satisfied."""
        scope = _scope_of(snapshot)
        truth = self._check(scope)
        if truth is True:
            return Verdict(True)
        return Verdict(truth, _sorted_reasons(self._explain(scope)))

    def __call__(self, snapshot: Snapshot) -> Verdict:
        """Same as :meth:`evaluate`."""
        return self.evaluate(snapshot)

    @abc.abstractmethod
    def _check(self, scope: _Scope) -> bool | None:
        """The three-valued answer on ``scope``."""

    @abc.abstractmethod
    def _explain(self, scope: _Scope) -> list[_Why]:
        """Why ``_check(scope)`` is not ``True`` (only called then). Each reason is tagged with whether it makes
        the answer ``False`` or unknown, so ``~`` can keep the unknown ones."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What the predicate asks for, in words (``"no compute, graphics or MPS process"``)."""

    def __str__(self) -> str:
        return self.describe()

    def __and__(self, other: Predicate) -> Predicate:
        if not isinstance(other, Predicate):
            return NotImplemented
        return _And(_flatten(_And, (self, other)))

    def __or__(self, other: Predicate) -> Predicate:
        if not isinstance(other, Predicate):
            return NotImplemented
        return _Or(_flatten(_Or, (self, other)))

    def __invert__(self) -> Predicate:
        return _Not(self)

    def __bool__(self) -> bool:
        raise ArgumentTypeError("a predicate has no truth value: combine predicates with &, | and ~, not and/or/not")


def _flatten(kind: type[_And] | type[_Or], parts: Iterable[Predicate]) -> tuple[Predicate, ...]:
    out: list[Predicate] = []
    for p in parts:
        out.extend(p.parts if isinstance(p, kind) else (p,))
    return tuple(out)


# --- combinators ------------------------------------------------------------------------------------------------


class _And(Predicate):
    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Predicate, ...]) -> None:
        self.parts = parts

    def _check(self, scope: _Scope) -> bool | None:
        result: bool | None = True
        for p in self.parts:
            v = p._check(scope)
            if v is False:
                return False
            if v is None:
                result = None
        return result

    def _explain(self, scope: _Scope) -> list[_Why]:
        out: list[_Why] = []
        for p in self.parts:
            if p._check(scope) is not True:
                out.extend(p._explain(scope))
        return out

    def describe(self) -> str:
        return " and ".join(_paren(p, _Or) for p in self.parts)

    def __repr__(self) -> str:
        return " & ".join(_paren_repr(p, _Or) for p in self.parts)


class _Or(Predicate):
    __slots__ = ("parts",)

    def __init__(self, parts: tuple[Predicate, ...]) -> None:
        self.parts = parts

    def _check(self, scope: _Scope) -> bool | None:
        result: bool | None = False
        for p in self.parts:
            v = p._check(scope)
            if v is True:
                return True
            if v is None:
                result = None
        return result

    def _explain(self, scope: _Scope) -> list[_Why]:
        # Not satisfied means no alternative holds: every part's reasons are relevant.
        out: list[_Why] = []
        for p in self.parts:
            out.extend(p._explain(scope))
        return out

    def describe(self) -> str:
        return " or ".join(_paren(p, _And) for p in self.parts)

    def __repr__(self) -> str:
        return " | ".join(_paren_repr(p, _And) for p in self.parts)


class _Not(Predicate):
    __slots__ = ("inner",)

    def __init__(self, inner: Predicate) -> None:
        self.inner = inner

    def _check(self, scope: _Scope) -> bool | None:
        v = self.inner._check(scope)
        return None if v is None else not v

    def _explain(self, scope: _Scope) -> list[_Why]:
        if self.inner._check(scope) is None:
            # Still unknown under negation: keep only the reasons that made it unknown; the inner predicate's
            # "False" reasons describe things that are *good* for ~p and would mislead.
            return [w for w in self.inner._explain(scope) if w.truth is None]
        return [_Why(False, None, f"{self.inner.describe()}: this holds, and the predicate asks for the opposite (~)")]

    def __invert__(self) -> Predicate:
        return self.inner  # ~~p is p, with p's own (more precise) reasons

    def describe(self) -> str:
        return f"not ({self.inner.describe()})"

    def __repr__(self) -> str:
        inner = repr(self.inner)
        return f"~{inner}" if not isinstance(self.inner, _And | _Or) else f"~({inner})"


def _paren(p: Predicate, other: type[Predicate]) -> str:
    return f"({p.describe()})" if isinstance(p, other) else p.describe()


def _paren_repr(p: Predicate, other: type[Predicate]) -> str:
    return f"({p!r})" if isinstance(p, other) else repr(p)


class _Const(Predicate):
    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = value

    def _check(self, scope: _Scope) -> bool | None:
        return self.value

    def _explain(self, scope: _Scope) -> list[_Why]:
        return [_Why(False, None, "never() is never satisfied")]

    def describe(self) -> str:
        return "always" if self.value else "never"

    def __repr__(self) -> str:
        return "always()" if self.value else "never()"


_ALWAYS = _Const(True)
_NEVER = _Const(False)


def always() -> Predicate:
    """Always satisfied, whatever the snapshot holds (even unreadable devices: the poller still refuses polls with
    device failures). The neutral element of ``&``."""
    return _ALWAYS


def never() -> Predicate:
    """Never satisfied. The neutral element of ``|``."""
    return _NEVER


# --- device predicates ------------------------------------------------------------------------------------------


class _DevicePredicate(Predicate):
    """A predicate that must hold on every device of the scope (Kleene "and" over devices)."""

    __slots__ = ()

    @abc.abstractmethod
    def _check_device(self, d: DeviceState) -> bool | None: ...

    @abc.abstractmethod
    def _explain_device(self, d: DeviceState) -> Iterator[_Why]: ...

    def _check(self, scope: _Scope) -> bool | None:
        # Unreadable, missing or no devices: unknown, unless a readable device already says False.
        result: bool | None = None if (scope.failures or scope.missing or not scope.devices) else True
        check = self._check_device
        for d in scope.devices:
            v = check(d)
            if v is False:
                return False
            if v is None:
                result = None
        return result

    def _explain(self, scope: _Scope) -> list[_Why]:
        out: list[_Why] = []
        for d in scope.devices:
            out.extend(self._explain_device(d))
        out.extend(_Why(None, f.index, f.describe()) for f in scope.failures)
        out.extend(_missing(scope))
        if not scope.devices and not scope.failures and not scope.missing:
            out.append(_Why(None, None, "no GPU in the snapshot: nothing to judge, so not clean"))
        return out


def _missing(scope: _Scope) -> list[_Why]:
    """The reasons of the selected GPUs a scope lacks (each makes the answer unknown)."""
    out = []
    for m in scope.missing:
        what = f"GPU {m}" if isinstance(m, int) else f"GPU {m!r}"
        out.append(_Why(None, m if isinstance(m, int) else None, f"{what}: selected but not in the snapshot"))
    return out


# --- predicates of your own -------------------------------------------------------------------------------------


def _answer(owner: Predicate, method: str, value: object) -> bool | None:
    """A subclass's answer, checked: ``True``, ``False`` or ``None``. Anything else (``1``, a numpy bool, a
    :class:`Verdict`) is refused, not read by its truth value: a truthy non-answer would be a false "clean"."""
    if value is True or value is False or value is None:
        return value
    raise ArgumentTypeError(
        f"{type(owner).__name__}.{method}() must return True, False or None (cannot tell), got {value!r}")


def _texts(reasons: Iterable[str] | str) -> list[str]:
    """A subclass's reasons as lines: one ``str`` returned instead of a list is one line, not one per character."""
    return [reasons] if isinstance(reasons, str) else [str(t) for t in reasons]


def _label(d: DeviceState) -> str:
    """``GPU 0``, or ``GPU 0 MIG 1 (GI 2, CI 0, MIG-...)`` for one MIG instance judged as a device
    (:func:`instance_view`)."""
    migs = d.mig_devices
    if migs and len(migs) == 1 and migs[0].uuid is not None and migs[0].uuid == d.uuid:
        return f"GPU {d.index} {migs[0].label}"
    return f"GPU {d.index}"


class DevicePredicate(_DevicePredicate):
    """Base class of a predicate of your own that judges each GPU on its own: implement :meth:`check_device` and
    :meth:`describe`, and :meth:`reasons_device` for reasons better than the default.

    It holds when it holds on every selected GPU, as the built-in device predicates do: a GPU that could not be read,
    a selected GPU missing from the snapshot, or a snapshot with no GPU make it unknown (``None``), unless a readable
    GPU answers ``False``. It combines with ``&``, ``|``, ``~`` and :func:`on_devices` (a ``MIG-...`` selector hands
    it that instance as a device: :func:`instance_view`), and every wait takes it as ``predicate=``. Keep it
    immutable (waits and threads share it) and cheap: the poller calls :meth:`check_device` for every GPU on every
    poll. docs/waiting.md, "Predicates of your own", has an example.
    """

    __slots__ = ()
    _FROZEN = False  # the subclass's own business

    @abc.abstractmethod
    def check_device(self, device: DeviceState) -> bool | None:
        """``True`` (holds on this GPU), ``False`` (does not) or ``None`` (cannot tell: a value it needs is unknown,
        ``None`` in the model, as the process lists are in the memory-only polls a wait makes between full ones).
        Any other value raises :class:`~nvmlcheck.ArgumentTypeError`, never read as a truth value."""

    def reasons_device(self, device: DeviceState) -> Iterable[str]:
        """Why :meth:`check_device` is not ``True`` on ``device``, one line per cause; called only then (a
        :class:`Verdict`'s reasons, a timeout's message). Each line is prefixed with the GPU (``"GPU 0: "``). By
        default one line made from :meth:`describe`."""
        return ()

    def _check_device(self, d: DeviceState) -> bool | None:
        return _answer(self, "check_device", self.check_device(d))

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        truth = self._check_device(d)
        if truth is True:
            return
        where = _label(d)
        texts = _texts(self.reasons_device(d))
        if not texts:
            texts = [f"not {self.describe()}" if truth is False else f"cannot tell whether {self.describe()}"]
        for text in texts:
            yield _Why(truth, d.index, f"{where}: {text}")


class SnapshotPredicate(Predicate):
    """Base class of a predicate of your own that judges a snapshot as a whole (a number of idle GPUs, a total over
    GPUs, a condition outside the GPUs): implement :meth:`check_snapshot` and :meth:`describe`, and
    :meth:`reasons_snapshot` for reasons better than the default.

    Under :func:`on_devices` the snapshot it is handed holds only the selected GPUs (and their failures); a selected
    GPU missing from the snapshot makes it unknown without asking it. Its reasons are tied to no GPU, so a timeout
    may blame every GPU. A wait never ends clean on a poll with an unreadable GPU, whatever it answers;
    ``select_clean`` judges each GPU alone, on a snapshot of that GPU. Keep it immutable and cheap: the poller calls
    :meth:`check_snapshot` on every poll.
    """

    __slots__ = ()
    _FROZEN = False  # the subclass's own business

    @abc.abstractmethod
    def check_snapshot(self, snapshot: Snapshot) -> bool | None:
        """``True``, ``False`` or ``None`` (cannot tell) for ``snapshot``; any other value raises
        :class:`~nvmlcheck.ArgumentTypeError`."""

    def reasons_snapshot(self, snapshot: Snapshot) -> Iterable[str]:
        """Why :meth:`check_snapshot` is not ``True``, one line per cause; called only then. By default one line
        made from :meth:`describe`."""
        return ()

    def _snapshot_of(self, scope: _Scope) -> Snapshot | None:
        whole = scope.snapshot
        if whole is None or scope.missing:
            return None
        if scope.devices is whole.devices and scope.failures is whole.failures:
            return whole
        return replace(whole, devices=scope.devices, failures=scope.failures)  # narrowed by on_devices

    def _check(self, scope: _Scope) -> bool | None:
        snap = self._snapshot_of(scope)
        return None if snap is None else _answer(self, "check_snapshot", self.check_snapshot(snap))

    def _explain(self, scope: _Scope) -> list[_Why]:
        snap = self._snapshot_of(scope)
        if snap is None:
            return _missing(scope) or [_Why(None, None, f"no snapshot to judge {self.describe()!r} on")]
        truth = _answer(self, "check_snapshot", self.check_snapshot(snap))
        if truth is True:
            return []
        texts = _texts(self.reasons_snapshot(snap))
        if not texts:
            texts = [f"not {self.describe()}" if truth is False else f"cannot tell whether {self.describe()}"]
        return [_Why(truth, None, text) for text in texts]


def _process_list_unknown(d: DeviceState, kind: ProcessKind) -> _Why:
    why = d.why_unknown(unknown_key("processes", kind)) or "no reason recorded; was Fields.PROCESSES read?"
    return _Why(None, d.index, f"GPU {d.index}: {kind.value} process list unknown ({why})")


def _holder_text(p: GpuProcess) -> str:
    name = printable(p.name) if p.name else "name unknown"  # a process names itself: no control characters
    held = format_bytes(p.used_bytes) if p.used_bytes is not None else "an unknown amount (NVML: not available)"
    return f"pid {p.pid} ({name}) holds {held}"


def _kinds_arg(kinds: Iterable[ProcessKind | str] | ProcessKind | str) -> tuple[ProcessKind, ...]:
    if isinstance(kinds, str):  # ProcessKind is a str enum too
        kinds = (kinds,)
    try:
        out = tuple(dict.fromkeys(ProcessKind(k) for k in kinds))
    except (ValueError, TypeError):
        names = ", ".join(repr(k.value) for k in ProcessKind)
        raise ArgumentError(f"no_processes() takes process kinds ({names} or ProcessKind members), got "
                            f"{kinds!r}") from None
    if not out:
        raise ArgumentError("no_processes() needs at least one process kind")
    return out


class _NoProcesses(_DevicePredicate):
    __slots__ = ("kinds",)

    def __init__(self, kinds: tuple[ProcessKind, ...]) -> None:
        self.kinds = kinds

    def _check(self, scope: _Scope) -> bool | None:
        if self.kinds != ALL_KINDS:
            return super()._check(scope)
        # Inlined for the poller's hot path (every poll, every device).
        result: bool | None = None if (scope.failures or scope.missing or not scope.devices) else True
        for d in scope.devices:
            c, g, m = d.compute_processes, d.graphics_processes, d.mps_processes
            if c or g or m:
                return False
            if d.mig_devices and _mig_processes(d, self.kinds):
                return False
            if c is None or g is None or m is None:
                result = None
        return result

    def _check_device(self, d: DeviceState) -> bool | None:
        result: bool | None = True
        for kind in self.kinds:
            procs = d.processes_of(kind)
            if procs is None:
                result = None
            elif procs:
                return False
        if d.mig_devices and _mig_processes(d, self.kinds):
            return False
        return result

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        seen: set[tuple[int, ProcessKind]] = set()
        for kind in self.kinds:
            procs = d.processes_of(kind)
            if procs is None:
                yield _process_list_unknown(d, kind)
                continue
            for p in procs:
                seen.add((p.pid, p.kind))
                yield _Why(False, d.index, f"{_where(d, p)}: {_holder_text(p)} ({kind.value})")
        for mig, p in _mig_processes(d, self.kinds):
            if (p.pid, p.kind) not in seen:  # listed on the instance only (NVML's per-instance lists)
                yield _Why(False, d.index, f"GPU {d.index} {mig.label}: {_holder_text(p)} ({p.kind.value})")

    def describe(self) -> str:
        return f"no {_kinds_words(self.kinds)} process"

    def __repr__(self) -> str:
        if self.kinds == ALL_KINDS:
            return "no_processes()"
        return f"no_processes(kinds={tuple(k.value for k in self.kinds)!r})"


def _mig_processes(d: DeviceState, kinds: tuple[ProcessKind, ...]) -> list[tuple[MigDevice, GpuProcess]]:
    """Processes listed on a MIG instance of ``d`` (of the given kinds)."""
    return [(m, p) for m in d.mig_devices or () for p in m.processes or () if p.kind in kinds]


def _mig_lists_pid(d: DeviceState, pids: frozenset[int]) -> bool:
    """Whether a MIG instance of ``d`` lists one of ``pids`` (its own list: NVML's per-instance lists may hold a
    process the parent's lists do not)."""
    return any(p.pid in pids for m in d.mig_devices or () for p in m.processes or ())


def _where(d: DeviceState, p: GpuProcess) -> str:
    """``GPU 0``, or ``GPU 0 MIG 1 (GI 2, CI 0, MIG-...)`` for a process attributed to a MIG instance."""
    mig = d.mig_device_of(p) if d.mig_devices else None
    if mig is not None:
        return f"GPU {d.index} {mig.label}"
    if p.gpu_instance_id is not None:
        ci = "?" if p.compute_instance_id is None else p.compute_instance_id
        return f"GPU {d.index} MIG instance (GI {p.gpu_instance_id}, CI {ci})"
    return f"GPU {d.index}"


def _kinds_words(kinds: tuple[ProcessKind, ...]) -> str:
    names = ["MPS" if k is ProcessKind.MPS else k.value for k in kinds]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class _PidsGone(_DevicePredicate):
    __slots__ = ("pids",)

    def __init__(self, pids: frozenset[int]) -> None:
        self.pids = pids

    def _check(self, scope: _Scope) -> bool | None:
        # Inlined for the poller's hot path (kill_and_wait polls with it); same rules as _check_device.
        result: bool | None = None if (scope.failures or scope.missing or not scope.devices) else True
        pids = self.pids
        for d in scope.devices:
            for procs in (d.compute_processes, d.graphics_processes, d.mps_processes):
                if procs is None:
                    result = None
                    continue
                for p in procs:
                    if p.pid in pids:
                        return False
            if d.mig_devices and _mig_lists_pid(d, pids):
                return False
        return result

    def _check_device(self, d: DeviceState) -> bool | None:
        result: bool | None = True
        pids = self.pids
        for kind in ALL_KINDS:
            procs = d.processes_of(kind)
            if procs is None:
                result = None  # a watched pid may hide in the list we could not read
            elif any(p.pid in pids for p in procs):
                return False
        # A MIG instance's own list counts as no_processes() counts it: a PID listed there alone is not gone.
        if d.mig_devices and _mig_lists_pid(d, pids):
            return False
        return result

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        seen: set[tuple[int, ProcessKind]] = set()
        for kind in ALL_KINDS:
            procs = d.processes_of(kind)
            if procs is None:
                yield _process_list_unknown(d, kind)
                continue
            for p in procs:
                if p.pid in self.pids:
                    seen.add((p.pid, p.kind))
                    yield _Why(False, d.index, f"{_where(d, p)}: {_holder_text(p)} ({kind.value}), still listed")
        for mig, p in _mig_processes(d, ALL_KINDS):
            if p.pid in self.pids and (p.pid, p.kind) not in seen:  # listed on the instance only
                yield _Why(False, d.index, f"GPU {d.index} {mig.label}: {_holder_text(p)} ({p.kind.value}), "
                           "still listed")

    def describe(self) -> str:
        if not self.pids:
            return "no PID given (holds wherever the process lists are read)"
        noun = "pid" if len(self.pids) == 1 else "pids"
        return f"{noun} {', '.join(map(str, sorted(self.pids)))} gone from every GPU process list"

    def __repr__(self) -> str:
        return f"pids_gone({sorted(self.pids)!r})"


def _judge_at_most(used: int, slack: int, limit: int) -> bool | None:
    """Is the true value at most ``limit``? A value reported at granularity g is within g-1 bytes of the truth
    (whether nvidia-smi rounds or truncates its whole MiB), so a reading that close to the limit cannot decide."""
    if used + slack <= limit:
        return True
    if used - slack > limit:
        return False
    return None


def _memory_unknown(d: DeviceState) -> _Why:
    why = d.why_unknown("memory") or "no reason recorded; was Fields.MEMORY read?"
    return _Why(None, d.index, f"GPU {d.index}: memory use unknown ({why})")


def _nothing_listed(d: DeviceState) -> bool:
    return d.processes == ()


class _MemoryAtMost(_DevicePredicate):
    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def _check(self, scope: _Scope) -> bool | None:
        # Inlined for the poller's hot path; same rules as _check_device.
        result: bool | None = None if (scope.failures or scope.missing or not scope.devices) else True
        limit = self.limit
        for d in scope.devices:
            m = d.memory
            if m is None or m.used_includes_reserved:
                result = None
                continue
            if d.mig_mode:
                v = _mig_memory(d, m, limit)[0]
                if v is False:
                    return False
                if v is None:
                    result = None
                continue
            slack = m.granularity_bytes - 1
            if m.used_bytes + slack <= limit:
                continue
            if m.used_bytes - slack > limit:
                return False
            result = None
        return result

    def _check_device(self, d: DeviceState) -> bool | None:
        m = d.memory
        if m is None or m.used_includes_reserved:
            return None
        if d.mig_mode:
            return _mig_memory(d, m, self.limit)[0]
        return _judge_at_most(m.used_bytes, m.granularity_bytes - 1, self.limit)

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        m = d.memory
        if m is None:
            yield _memory_unknown(d)
            return
        if m.used_includes_reserved:
            yield _Why(None, d.index, f"GPU {d.index}: cannot judge {format_bytes(m.used_bytes)} used: {_V1_HINT}")
            return
        if d.mig_mode:
            yield from _mig_memory(d, m, self.limit)[1]
            return
        verdict = _judge_at_most(m.used_bytes, m.granularity_bytes - 1, self.limit)
        if verdict is None:
            yield _Why(
                None,
                d.index,
                f"GPU {d.index}: {format_bytes(m.used_bytes)} used is within the {format_bytes(m.granularity_bytes)} "
                f"reporting resolution of the {format_bytes(self.limit)} limit; cannot tell which side it is on",
            )
        elif verdict is False:
            used, limit = _two_sizes(m.used_bytes, self.limit)
            if _nothing_listed(d):
                text = f"GPU {d.index}: {used} used {_NO_VISIBLE_PROCESS}; clean means at most {limit}"
            else:
                text = f"GPU {d.index}: {used} used, above the {limit} limit"
            yield _Why(False, d.index, text)

    def describe(self) -> str:
        return f"used memory at most {format_bytes(self.limit)}"

    def __repr__(self) -> str:
        return f"memory_used_at_most({self.limit})"


def _mig_memory(d: DeviceState, parent: Memory, limit: int) -> tuple[bool | None, list[_Why]]:
    """The memory rule on a GPU in MIG mode (docs/waiting.md, "MIG"): each instance's ``used`` at most ``limit`` +
    :data:`DEFAULT_MIG_IDLE_BYTES` when every instance's memory is known (the parent's figure is then not judged:
    it also counts the driver's MIG overhead); otherwise the parent's ``used`` at most the same. Reasons name the
    instance."""
    allowed = limit + DEFAULT_MIG_IDLE_BYTES
    instances = d.mig_devices or ()
    per_instance = bool(instances) and all(
        i.memory is not None and not i.memory.used_includes_reserved for i in instances
    )
    parts: list[tuple[str, Memory]]
    if per_instance:
        parts = [(f"GPU {d.index} {i.label}", i.memory) for i in instances if i.memory is not None]
    else:
        parts = [(f"GPU {d.index} (MIG mode)", parent)]
    result: bool | None = True
    whys: list[_Why] = []
    for where, m in parts:
        v = _judge_at_most(m.used_bytes, m.granularity_bytes - 1, allowed)
        if v is False:
            result = False
            used, lim = _two_sizes(m.used_bytes, allowed)
            tail = f" {_NO_VISIBLE_PROCESS}" if _nothing_listed(d) else ""
            whys.append(
                _Why(
                    False,
                    d.index,
                    f"{where}: {used} used{tail}; clean means at most {lim} (the limit + the MIG idle allowance)",
                )
            )
        elif v is None:
            if result is True:
                result = None
            whys.append(
                _Why(
                    None,
                    d.index,
                    f"{where}: {format_bytes(m.used_bytes)} used is within the reporting resolution of the "
                    f"{format_bytes(allowed)} MIG limit; cannot tell which side it is on",
                )
            )
    return result, whys


def free_bytes_of(m: Memory) -> tuple[int, int]:
    """What a next job can allocate on a GPU with memory ``m``, and the reporting slack of that figure:
    ``(free, slack)`` with free = total - reserved - used. With only the v1 call (``used`` already counts the
    driver's reserve) free = total - used; with the reserve unknown, the ``free`` the backend reported. ``slack`` is
    how far the true value may lie from ``free`` (nvidia-smi reports whole MiB: one unit per term)."""
    unit = m.granularity_bytes - 1
    if m.used_includes_reserved:
        return m.total_bytes - m.used_bytes, 2 * unit
    if m.reserved_bytes is None:
        return m.free_bytes, unit
    return m.total_bytes - m.reserved_bytes - m.used_bytes, 3 * unit


class _MemoryFreeAtLeast(_DevicePredicate):
    __slots__ = ("fraction", "need")

    def __init__(self, need: int | None, fraction: float | None) -> None:
        self.need = need
        self.fraction = fraction

    def need_of(self, m: Memory) -> int:
        """The bytes needed on a GPU with memory ``m`` (a fraction is of its total)."""
        if self.fraction is None:
            assert self.need is not None
            return self.need
        return math.ceil(self.fraction * m.total_bytes)

    def _check_device(self, d: DeviceState) -> bool | None:
        m = d.memory
        if m is None:
            return None
        free, slack = free_bytes_of(m)
        need = self.need_of(m)
        if free - slack >= need:
            return True
        if free + slack < need:
            return False
        return None

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        m = d.memory
        if m is None:
            yield _memory_unknown(d)
            return
        truth = self._check_device(d)
        if truth is True:
            return
        free, _ = free_bytes_of(m)
        need = self.need_of(m)
        of = "" if self.fraction is None else f" ({self.fraction * 100:g}% of {format_bytes(m.total_bytes)})"
        if truth is None:
            yield _Why(None, d.index, f"GPU {d.index}: {format_bytes(free)} free is within the reporting resolution "
                                      f"of the {format_bytes(need)} needed{of}; cannot tell which side it is on")
            return
        free_text, need_text = _two_sizes(free, need)
        yield _Why(False, d.index, f"GPU {d.index}: {free_text} free, {need_text} needed{of}")

    def describe(self) -> str:
        if self.fraction is not None:
            return f"free memory at least {self.fraction:g} of the total"
        assert self.need is not None
        return f"free memory at least {format_bytes(self.need)}"

    def __repr__(self) -> str:
        if self.fraction is not None:
            return f"memory_free_at_least(fraction={self.fraction!r})"
        return f"memory_free_at_least({self.need})"


class _MemoryBackTo(_DevicePredicate):
    __slots__ = ("baseline", "tolerance")

    def __init__(self, baseline: Mapping[str, tuple[int, Memory | None, str | None]], tolerance: int) -> None:
        self.baseline = baseline  # uuid -> (index at baseline, memory, why unknown)
        self.tolerance = tolerance

    def _limits(self, d: DeviceState) -> tuple[Memory, Memory] | None:
        entry = self.baseline.get(d.uuid)
        m = d.memory
        if entry is None or entry[1] is None or m is None:
            return None
        base = entry[1]
        if base.used_includes_reserved != m.used_includes_reserved:
            return None
        return m, base

    def _check_device(self, d: DeviceState) -> bool | None:
        pair = self._limits(d)
        if pair is None:
            return None
        m, base = pair
        slack = (m.granularity_bytes - 1) + (base.granularity_bytes - 1)
        return _judge_at_most(m.used_bytes, slack, base.used_bytes + self.tolerance)

    def _explain_device(self, d: DeviceState) -> Iterator[_Why]:
        entry = self.baseline.get(d.uuid)
        m = d.memory
        if entry is None:
            yield _Why(None, d.index, f"GPU {d.index} ({d.uuid}): not in the baseline snapshot; cannot compare")
            return
        if entry[1] is None:
            why = entry[2] or "not read"
            yield _Why(None, d.index, f"GPU {d.index}: the baseline has no memory reading ({why}); cannot compare")
            return
        if m is None:
            yield _memory_unknown(d)
            return
        base = entry[1]
        if base.used_includes_reserved != m.used_includes_reserved:
            yield _Why(
                None,
                d.index,
                f"GPU {d.index}: the baseline and this snapshot measure 'used' differently (one includes the driver's "
                "reserved memory, the other does not: different backends or drivers?); cannot compare",
            )
            return
        slack = (m.granularity_bytes - 1) + (base.granularity_bytes - 1)
        limit = base.used_bytes + self.tolerance
        verdict = _judge_at_most(m.used_bytes, slack, limit)
        if verdict is True:
            return
        base_text = f"the baseline {format_bytes(base.used_bytes)} + {format_bytes(self.tolerance)} tolerance"
        if verdict is None:
            yield _Why(
                None,
                d.index,
                f"GPU {d.index}: {format_bytes(m.used_bytes)} used is within the reporting resolution of "
                f"{base_text}; cannot tell which side it is on",
            )
            return
        over = format_bytes(m.used_bytes - base.used_bytes)
        tail = f" {_NO_VISIBLE_PROCESS}" if _nothing_listed(d) else ""
        yield _Why(
            False,
            d.index,
            f"GPU {d.index}: {format_bytes(m.used_bytes)} used, {over} above {base_text}{tail}",
        )

    def describe(self) -> str:
        return f"used memory back to the baseline (+ {format_bytes(self.tolerance)})"

    def __repr__(self) -> str:
        return f"memory_back_to(<baseline of {len(self.baseline)} GPUs>, tolerance_bytes={self.tolerance})"


class _OnDevices(Predicate):
    __slots__ = ("indices", "inner", "mig_uuids", "selectors", "uuids")

    def __init__(self, selectors: tuple[int | str, ...], inner: Predicate) -> None:
        self.selectors = selectors
        self.indices = frozenset(s for s in selectors if isinstance(s, int))
        # UUIDs are hex: compared in any case (``mig-…``/``gpu-…`` as the session's selectors are), in capitals.
        self.uuids = frozenset(s.upper() for s in selectors if isinstance(s, str))
        # MIG device UUIDs select one instance of a GPU in MIG mode (``--devices MIG-...``).
        self.mig_uuids = frozenset(u for u in self.uuids if u.startswith("MIG-"))
        self.inner = inner

    def _missing(self, found: set[int | str]) -> tuple[int | str, ...]:
        """The selectors that name nothing in ``found`` (indices, and UUIDs in capitals)."""
        return tuple(s for s in self.selectors if (s.upper() if isinstance(s, str) else s) not in found)

    def _selected(self, index: int, uuid: str | None) -> bool:
        return index in self.indices or (uuid is not None and uuid.upper() in self.uuids)

    def _narrow_mig(self, scope: _Scope, devices: tuple[DeviceState, ...]) -> _Scope:
        """The scope with each selected MIG device as a device of its own (:func:`instance_view`); a MIG UUID
        found on no GPU of the snapshot is missing (unknown, never clean)."""
        views: list[DeviceState] = []
        found: set[int | str] = {d.index for d in devices} | {d.uuid.upper() for d in devices if d.uuid is not None}
        for d in scope.devices:
            for m in d.mig_devices or ():
                if m.uuid is not None and m.uuid.upper() in self.mig_uuids:
                    views.append(instance_view(d, m))
                    found.add(m.uuid.upper())
        failures = tuple(f for f in scope.failures if self._selected(f.index, f.uuid))
        found |= {f.index for f in failures} | {f.uuid.upper() for f in failures if f.uuid is not None}
        return _Scope((*devices, *views), failures, self._missing(found), scope.snapshot)

    def _narrow(self, scope: _Scope) -> _Scope:
        devices = tuple(d for d in scope.devices if self._selected(d.index, d.uuid))
        if self.mig_uuids:
            return self._narrow_mig(scope, devices)
        failures = tuple(f for f in scope.failures if self._selected(f.index, f.uuid))
        if len(devices) + len(failures) == len(self.selectors):
            return _Scope(devices, failures, (), scope.snapshot)  # the common case: every selector found once
        found: set[int | str] = {d.index for d in devices} | {d.uuid.upper() for d in devices if d.uuid is not None}
        found |= {f.index for f in failures} | {f.uuid.upper() for f in failures if f.uuid is not None}
        return _Scope(devices, failures, self._missing(found), scope.snapshot)

    def _check(self, scope: _Scope) -> bool | None:
        return self.inner._check(self._narrow(scope))

    def _explain(self, scope: _Scope) -> list[_Why]:
        return self.inner._explain(self._narrow(scope))

    def describe(self) -> str:
        which = ", ".join(str(s) for s in self.selectors)
        return f"on GPU {which}: {self.inner.describe()}"

    def __repr__(self) -> str:
        return f"on_devices({list(self.selectors)!r}, {self.inner!r})"


def instance_view(d: DeviceState, m: MigDevice) -> DeviceState:
    """MIG device ``m`` of GPU ``d`` as a device of its own, for judging one instance: its UUID, its memory, the
    processes that run in it (from its own lists, else the parent's, filtered by instance ids). The index stays the
    parent's, so reasons read ``GPU 0 MIG 1 (GI 2, CI 0, MIG-...)``."""

    unknown = dict(d.unknown)

    def only(kind: ProcessKind, procs: tuple[GpuProcess, ...] | None) -> tuple[GpuProcess, ...] | None:
        doubtful = [p for p in procs or () if _maybe_in(d, m, p)]
        if doubtful:
            # A process of the parent's list this instance may run (an instance id unread): its list is unknown,
            # never empty for want of an id.
            p = doubtful[0]
            unknown[unknown_key("processes", kind)] = (
                f"pid {p.pid} has no MIG instance id: it may run in {m.label}" if p.gpu_instance_id is None else
                f"pid {p.pid} (GI {p.gpu_instance_id}) may run in {m.label}, whose GPU-instance id is unknown: "
                f"{m.unknown.get('gpu_instance_id', 'not read')}")
            return None
        if m.processes is not None:
            return tuple(p for p in m.processes if p.kind is kind)
        return None if procs is None else tuple(p for p in procs if m.owns(p))

    if m.memory is None:
        unknown["memory"] = m.unknown.get("memory", f"the memory of {m.label} was not read")
    return replace(
        d,
        uuid=m.uuid or d.uuid,
        memory=m.memory,
        compute_processes=only(ProcessKind.COMPUTE, d.compute_processes),
        graphics_processes=only(ProcessKind.GRAPHICS, d.graphics_processes),
        mps_processes=only(ProcessKind.MPS, d.mps_processes),
        unknown=MappingProxyType(unknown),
        mig_mode=True,
        mig_devices=(m,),
    )


def _maybe_in(d: DeviceState, m: MigDevice, p: GpuProcess) -> bool:
    """Whether process ``p`` of GPU ``d``'s lists may run in its MIG device ``m`` although ``m`` does not own it: an
    instance id is unknown on one side, and no instance whose id is known owns it."""
    if m.owns(p) or (p.gpu_instance_id is not None and m.gpu_instance_id is not None):
        return False
    if p.gpu_instance_id is None:
        return True
    return not any(n is not m and n.gpu_instance_id is not None and n.owns(p) for n in d.mig_devices or ())


# --- public constructors ----------------------------------------------------------------------------------------


def no_processes(kinds: Iterable[ProcessKind | str] | ProcessKind | str = ALL_KINDS) -> Predicate:
    """No process of the given kinds (default: compute, graphics and MPS) on any selected device.

    Unknown when a list of a requested kind could not be read. An empty process list alone does not mean the
    memory is back (docs/driver-facts.md: the list can empty before ``used`` returns); combine with a memory
    predicate, as :func:`default_predicate` does.
    """
    return _NoProcesses(_kinds_arg(kinds))


def pids_gone(pids: Iterable[int]) -> Predicate:
    """None of ``pids`` appears in any process list (compute, graphics, MPS) of any selected device.

    Unknown when a list could not be read (the pid could be in it). Older drivers report host PIDs
    (docs/driver-facts.md): inside a PID namespace pass host PIDs.
    """
    if isinstance(pids, str | bytes | int) or not isinstance(pids, Iterable):  # a str would be read digit by digit
        raise ArgumentTypeError(f"pids_gone() takes PIDs (an iterable of int: [{pids!r}]), got {pids!r}")
    try:
        chosen = frozenset(pids)
    except TypeError:  # an unhashable PID (a list in the list)
        raise ArgumentTypeError(f"pids_gone() takes PIDs (an iterable of int), got {pids!r}") from None
    from ._proc import PID_MAX_LIMIT

    for pid in chosen:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ArgumentError(f"not a process ID: {pid!r} (a process ID is a positive whole number)")
        if pid > PID_MAX_LIMIT:  # no process list can hold it: the predicate would hold at once
            # One wording with the command line's and the kill's refusals ("not a process ID: ...").
            raise ArgumentError(f"not a process ID: {pid!r} (a process ID is at most {PID_MAX_LIMIT}, Linux's "
                                "PID_MAX_LIMIT)")
    return _PidsGone(chosen)


def memory_used_at_most(limit_bytes: int) -> Predicate:
    """``used`` memory is at most ``limit_bytes`` on every selected device.

    nvidia-smi reports whole MiB (:attr:`Memory.granularity_bytes`): a reading within one unit of the limit cannot
    decide and is unknown. On drivers with only the v1 memory call (:attr:`Memory.used_includes_reserved`) ``used``
    includes the driver's reserve, so this predicate refuses to guess and is unknown there; use
    :func:`memory_back_to` with a baseline taken while the GPU was idle.
    """
    return _MemoryAtMost(_non_negative_bytes("limit_bytes", limit_bytes))


def memory_back_to(baseline: Snapshot, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES) -> Predicate:
    """``used`` memory is at most the baseline's ``used`` plus ``tolerance_bytes``, per device (matched by UUID).

    Take ``baseline`` while the GPUs are idle. Works on v1-only drivers (both readings include the same reserve).
    Unknown for a device absent from the baseline, or when the two readings measure ``used`` differently.
    """
    tol = _non_negative_bytes("tolerance_bytes", tolerance_bytes)
    if not isinstance(baseline, Snapshot):
        raise ArgumentTypeError(f"memory_back_to() takes a Snapshot taken while the GPUs were idle, got {baseline!r}")
    table = {d.uuid: (d.index, d.memory, d.why_unknown("memory")) for d in baseline.devices}
    return _MemoryBackTo(table, tol)


def memory_free_at_least(need_bytes: int | None = None, *, fraction: float | None = None) -> Predicate:
    """Capacity: on every selected device a next job can allocate ``need_bytes``, or ``fraction`` of the device's
    total (as vLLM's ``gpu_memory_utilization`` asks for), judged against free = total - reserved - used
    (:func:`free_bytes_of`). Give exactly one of the two; ``fraction`` in (0, 1].

    Unknown when the memory is unknown, or the free figure lies within nvidia-smi's whole-MiB resolution of the
    need. It says nothing about processes: ``ready`` combines it with the clean predicate (docs/ready.md).
    """
    if (need_bytes is None) == (fraction is None):
        raise ArgumentError("memory_free_at_least() takes need_bytes or fraction, exactly one of them")
    if fraction is not None:
        return _MemoryFreeAtLeast(None, check_fraction("fraction", fraction))
    assert need_bytes is not None
    return _MemoryFreeAtLeast(_non_negative_bytes("need_bytes", need_bytes), None)


def on_devices(devices: Iterable[int | str], predicate: Predicate) -> Predicate:
    """Judge ``predicate`` on the selected devices only: NVML indices (``int``) or UUIDs (``str``). A MIG device
    UUID (``MIG-...``) selects that one instance of a GPU in MIG mode: its processes and its memory.

    A selected device that is missing from the snapshot makes the answer unknown (not clean).
    """
    if isinstance(devices, str | bytes) or not isinstance(devices, Iterable):
        # A str would be read character by character (each a UUID no GPU has: a wait that can never end clean).
        raise ArgumentTypeError(f"on_devices() takes a list of GPU indices or UUIDs ([{devices!r}]), got {devices!r}")
    selectors = tuple(dict.fromkeys(devices))
    for s in selectors:
        if isinstance(s, bool) or not isinstance(s, int | str) or (isinstance(s, int) and s < 0):
            raise ArgumentError(f"on_devices() takes GPU indices (int >= 0) or UUIDs (str), got {s!r}")
        if isinstance(s, str) and s[:5].lower() == "cuda:":
            # A predicate has no environment to read CUDA_VISIBLE_DEVICES from: resolve the selector first.
            raise ArgumentError(f"on_devices() takes NVML indices or UUIDs, not {s!r}: turn CUDA selectors into "
                             "indices with Session.resolve() first")
    if not selectors:
        raise ArgumentError("on_devices() needs at least one device")
    judged = check_predicate(predicate, "on_devices()'s predicate")
    if judged is None:
        raise ArgumentTypeError("on_devices() needs the predicate to judge the devices by, got None")
    return _OnDevices(selectors, judged)


def default_predicate(
    *,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    baseline: Snapshot | None = None,
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES,
    devices: Iterable[int | str] | None = None,
) -> Predicate:
    """What "clean" means by default: no process of any kind, and ``used`` at most 16 MiB, on every device.

    With ``baseline`` (an idle snapshot) the memory test becomes :func:`memory_back_to` instead: this is how to
    judge on drivers that only have the v1 memory call, where the fixed limit cannot decide. ``devices`` narrows the
    judgement with :func:`on_devices`.
    """
    _non_negative_bytes("tolerance_bytes", tolerance_bytes)  # checked whether or not a baseline uses it
    _non_negative_bytes("max_used_bytes", max_used_bytes)  # by its own name (memory_used_at_most says limit_bytes)
    memory = memory_back_to(baseline, tolerance_bytes) if baseline is not None else memory_used_at_most(max_used_bytes)
    predicate = no_processes() & memory
    return on_devices(devices, predicate) if devices is not None else predicate


def blamed_devices(predicate: Predicate, snapshot: Snapshot) -> frozenset[int] | None:
    """The NVML indices of the GPUs ``predicate`` is not satisfied on in ``snapshot``, from its reasons, with the
    snapshot's unreadable GPUs (a wait is never clean with one); ``frozenset()`` when it holds, ``None`` when a
    reason is tied to no GPU (then every GPU may be to blame). What a wait's timeout names as holders
    (:attr:`nvmlcheck.WaitTimeout.holders`): only the GPUs its own predicate refused."""
    return _Judged(predicate, snapshot).blamed()


def _held_reasons(predicate: Predicate, snapshot: Snapshot) -> tuple[str, ...]:
    """The reasons that make ``predicate`` ``False`` on ``snapshot``, without those of what it could not tell: a
    wait's memory-only probe says what it saw held, not that it did not read the process lists."""
    scope = _scope_of(snapshot)
    return _sorted_reasons(w for w in predicate._explain(scope) if w.truth is False)


class _Judged:
    """One judgement of a snapshot with its reasons, read by everything a wait's timeout says of it (the message,
    the GPUs to blame, the holders): a predicate of one's own may be slow, and after the deadline it is asked once,
    not once per use."""

    __slots__ = ("snapshot", "truth", "whys")

    def __init__(self, predicate: Predicate, snapshot: Snapshot) -> None:
        scope = _scope_of(snapshot)
        self.snapshot = snapshot
        self.truth = predicate._check(scope)
        self.whys: list[_Why] = [] if self.truth is True else predicate._explain(scope)

    def verdict(self) -> Verdict:
        """What :meth:`Predicate.evaluate` answers."""
        return Verdict(True) if self.truth is True else Verdict(self.truth, _sorted_reasons(self.whys))

    def blamed(self) -> frozenset[int] | None:
        """What :func:`blamed_devices` answers."""
        out = {f.index for f in self.snapshot.failures}
        if self.truth is True:
            return frozenset(out)
        for why in self.whys:
            device = getattr(why, "device", None)  # a subclass's own reasons may carry none
            if not isinstance(device, int) or isinstance(device, bool):
                return None
            out.add(device)
        return frozenset(out)

    def device_reasons(self) -> list[tuple[int, bool | None, str]]:
        """The reasons tied to one GPU: (its NVML index, ``False`` when the reason makes the answer ``False``,
        ``None`` when it could not tell, the text with its ``GPU N: ``). Empty when the predicate holds."""
        out = []
        for why in self.whys:
            device = getattr(why, "device", None)
            if isinstance(device, int) and not isinstance(device, bool):
                out.append((device, why.truth, why.text))
        return out


def check_predicate(predicate: object, name: str = "predicate") -> Predicate | None:
    """``predicate`` when it is a :class:`Predicate` (or ``None``); else :class:`~nvmlcheck.ArgumentTypeError`
    naming it: every call that takes one checks it before it reads, signals or waits."""
    if predicate is None or isinstance(predicate, Predicate):
        return predicate
    raise ArgumentTypeError(
        f"{name} must be a nvmlcheck Predicate (no_processes(), memory_used_at_most(...), ..., combined with &, | "
        f"and ~; or your own DevicePredicate or SnapshotPredicate) or None, got {predicate!r}"
    )


def check_fraction(name: str, value: float) -> float:
    """A fraction of a GPU's total in (0, 1] (a ``TypeError`` or ``ValueError`` naming ``name`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(f"{name} must be a number in (0, 1], got {value!r}")
    if not (0.0 < value <= 1.0):
        raise ArgumentError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def check_bytes(name: str, value: int) -> int:
    """A byte count >= 0 (a ``TypeError`` or ``ValueError`` naming ``name`` otherwise): for callers that take one
    under their own keyword (``ready``'s ``max_used_bytes``)."""
    return _non_negative_bytes(name, value)


def _non_negative_bytes(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{name} must be an int number of bytes, got {value!r}")
    if value < 0:
        raise ArgumentError(f"{name} must be >= 0, got {value}")
    if value >= MAX_BYTES:
        raise ArgumentError(f"{name} must be below 2**64 (what NVML counts), got {value}")
    return value


# --- formatting -------------------------------------------------------------------------------------------------


def _two_sizes(a: int, b: int) -> tuple[str, str]:
    """Two sizes that must look different when they differ (16 MiB + 1 B is not "16.0 MiB")."""
    fa, fb = format_bytes(a), format_bytes(b)
    if fa == fb and a != b:
        return f"{a:,} B", f"{b:,} B"
    return fa, fb
