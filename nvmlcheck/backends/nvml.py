"""The NVML backend: libnvidia-ml through cffi (:mod:`nvmlcheck._nvml.calls`), building model objects.

Identity (handle, name, UUID, PCI bus id, serial, minor number, total memory) is read once per device and cached;
live values (memory, processes, clocks, health) are read on every snapshot. What a device does not support is
``None`` with a reason; errors that make a device unreadable (lost, no permission, corrupt data) put it in
:attr:`Snapshot.failures` so the other devices still report.

A snapshot given a :class:`~nvmlcheck.wait.Deadline` checks it before every query of the pass but the first (each
identity value, memory, each process list, clocks and health as one query each, each device) and abandons the pass
with :class:`~nvmlcheck.errors.DeadlinePassed` once it has come: a wait overruns its deadline by at most one NVML
call. A re-init inside the pass gets at most the time left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType

from .. import model
from .._nvml import library
from .._nvml.calls import _RECOVERY_SYMBOL as RECOVERY_SYMBOL
from .._nvml.calls import HEALTH_SLOTS, REASON_GIVEN, EventCalls, Handle, NvmlCalls, handle_address
from ..errors import (
    ArgumentError,
    CorruptData,
    DeadlinePassed,
    GpuLost,
    NvmlCheckError,
    NvmlError,
    SessionClosed,
    Timeout,
    Uninitialized,
    Unknown,
    code_name,
    error_class_for_code,
)
from ..model import (
    DeviceFailure,
    DeviceState,
    Fields,
    GpuProcess,
    Memory,
    MigDevice,
    ProcessKind,
    Snapshot,
    SystemInfo,
    attribute_processes,
    fast_constructor,
    unknown_key,
)
from . import DEFAULT_INIT_TIMEOUT_S, MIN_INIT_TIMEOUT_S, init_timeout_for  # re-exported: their old home
from ._busid import canonical_bus_id

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from .._deadline import Deadline
    from ..events import EventListener
    from ..model import ClockEventReason, Clocks, Health

__all__ = ["DEFAULT_INIT_TIMEOUT_S", "MIN_INIT_TIMEOUT_S", "NvmlBackend", "init_timeout_for", "process_name"]

# Reads of one snapshot when NVML answers UNINITIALIZED: the first, then after each re-init of our own. A read that
# another thread's re-init pulled NVML from under (LoadedLibrary.reinit_epoch moved) does not count: it joins that
# re-init and reads again. Counting those too once failed a healthy GPU's wait now and then (issue 12).
_READ_ATTEMPTS = 3
# Reads disturbed by other threads' re-inits, at most, before the error is reported anyway: each one means a
# re-init started during that read, so only a driver failing continuously gets near it.
_DISTURBED_READS = 64

#: A pass's deadline check, called before each query (see _Gate).
_GateFn = Callable[[], None]


def _no_gate() -> None:
    """No deadline: every query runs."""


class _Gate:
    """The deadline check of one pass: before every query but the first, so a pass always makes progress and ends
    at most one query after the deadline."""

    __slots__ = ("check", "opened")

    def __init__(self, deadline: Deadline) -> None:
        self.check = deadline.check
        self.opened = False

    def __call__(self) -> None:
        if self.opened:
            self.check()
        else:
            self.opened = True


NOT_REQUESTED = "not requested"
_NO_MIG: tuple[MigDevice, ...] = ()
_V1_MEMORY = (
    "this driver has only nvmlDeviceGetMemoryInfo (v1): used_bytes includes the driver's reserved memory and "
    "reserved_bytes is unknown"
)


def process_name(pid: int) -> str | None:
    """argv[0] of ``pid`` from ``/proc/<pid>/cmdline`` (or ``comm`` for kernel threads), ``None`` when the process is
    not visible from here (another PID namespace, already gone, no permission).

    NVML reports host PIDs; inside a container the same number may name another process, so this is best effort.
    """
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(4096)
        first = raw.split(b"\0", 1)[0]
        if first:
            return first.decode("utf-8", "replace")
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().strip().decode("utf-8", "replace") or None
    except OSError:
        return None


# (symbol, code) -> reason: the same few unanswered slots repeat on every poll, and a lookup is cheaper than a format.
_CODE_REASONS: dict[tuple[str, int], str] = {
    # A driver older than the recovery action's field (565) answers INVALID_ARGUMENT for its id
    # (NvmlCalls._recovery_action): the driver does not have the value, no read failed. Said as unsupported, so that
    # `ready` notes it instead of refusing every GPU of such a driver (docs/health.md).
    (RECOVERY_SYMBOL, 2): (  # NVML_ERROR_INVALID_ARGUMENT
        f"not supported: this driver does not know the field ({RECOVERY_SYMBOL} returned NVML_ERROR_INVALID_ARGUMENT)"
    ),
}


def _code_reason(symbol: str, code: int) -> str:
    """Why a value is unknown after ``symbol`` returned ``code`` (the raw-code twin of :func:`_reason`)."""
    if code == REASON_GIVEN:  # the call answered, but not with a value that can be trusted: the symbol says why
        return symbol
    key = (symbol, code)
    reason = _CODE_REASONS.get(key)
    if reason is None:
        why = error_class_for_code(code).WHY_UNKNOWN
        reason = why.format(function=symbol) if why else f"unreadable: {symbol} returned {code_name(code)} ({code})"
        if len(_CODE_REASONS) < 512:  # bounded, whatever codes a driver invents
            _CODE_REASONS[key] = reason
    return reason


def _reason(exc: NvmlError) -> str:
    """Why a value is unknown after ``exc``: its class's wording (errors.py), else the error's message."""
    why = exc.WHY_UNKNOWN
    return why.format(function=exc.function) if why else f"unreadable: {exc}"


# Private values of this backend: plain classes rather than dataclasses, which cost a one-shot check ~0.5 ms each to
# create at import (docs/performance.md, "One-shot checks").
class _Identity:
    """What a device's first read learns and every later one reuses. ``mig_mode``: nvmlDeviceGetMigMode, read with
    the identity (changing it needs a GPU reset, so the poll path pays nothing for it on a GPU without MIG); ``None``
    (unknown) carries its reason under ``"mig"`` in ``unknown``."""

    __slots__ = ("handle", "mig_mode", "minor_number", "name", "pci_bus_id", "serial", "unknown", "uuid")

    def __init__(
        self, *, handle: Handle, uuid: str, name: str | None, pci_bus_id: str | None, serial: str | None,
        minor_number: int | None, unknown: Mapping[str, str], mig_mode: bool | None = False,
    ) -> None:  # fmt: skip
        self.handle = handle
        self.uuid = uuid
        self.name = name
        self.pci_bus_id = pci_bus_id
        self.serial = serial
        self.minor_number = minor_number
        self.unknown = unknown
        self.mig_mode = mig_mode


class _Plan:
    """What one Fields value reads; hashed by identity (one plan per Fields value: _PLANS)."""

    __slots__ = ("clock_limits", "clock_reasons", "clocks", "health", "memory", "not_requested", "processes")

    def __init__(
        self, memory: bool, processes: bool, clocks: bool, health: bool, not_requested: Mapping[str, str], *,
        clock_limits: bool = True, clock_reasons: bool = True,
    ) -> None:
        self.memory = memory
        self.processes = processes
        self.clocks = clocks  # the current speeds (the limits with clock_limits, the event reasons with clock_reasons)
        self.clock_limits = clock_limits
        self.clock_reasons = clock_reasons
        self.health = health
        self.not_requested = not_requested


def _plan(fields: Fields) -> _Plan:
    skipped = {}
    for flag, key in ((Fields.MEMORY, "memory"), (Fields.CLOCKS, "clocks"), (Fields.HEALTH, "health")):
        if not fields & flag:
            skipped[key] = NOT_REQUESTED
    if not fields & Fields.PROCESSES:
        skipped.update({unknown_key("processes", k): NOT_REQUESTED for k in ProcessKind})
    limits = bool(fields & Fields.CLOCK_LIMITS)
    reasons = bool(fields & Fields.CLOCK_REASONS)
    if fields & Fields.CLOCKS and not limits:
        skipped.update({key: NOT_REQUESTED for key in _CLOCK_SLOT_KEYS[4:12]})
    if fields & Fields.CLOCKS and not reasons:
        skipped[_CLOCK_SLOT_KEYS[12]] = NOT_REQUESTED
    return _Plan(
        bool(fields & Fields.MEMORY),
        bool(fields & Fields.PROCESSES),
        bool(fields & Fields.CLOCKS),
        bool(fields & Fields.HEALTH),
        MappingProxyType(skipped),
        clock_limits=limits,
        clock_reasons=reasons,
    )


# Fields values are few; computing the plan (enum.Flag arithmetic costs microseconds) once each keeps polls cheap.
_PLANS: dict[Fields, _Plan] = {}
_KINDS = tuple(ProcessKind)
_PROCESS_KEYS = tuple(unknown_key("processes", k) for k in _KINDS)
_NO_BOUND = 1 << 63  # before any memory read: no total to check process entries against
#: Why a listed process's ``used_bytes`` is ``None``: NVML said NVML_VALUE_NOT_AVAILABLE for it.
_USED_NOT_AVAILABLE = ("NVML reports NVML_VALUE_NOT_AVAILABLE for a process's used GPU memory (Windows WDDM, some "
                       "MIG and container setups)")
_new_tuple = tuple.__new__  # GpuProcess is a named tuple; this skips its Python-level __new__
# Per GPU and per poll: the frozen dataclasses' own __init__ costs more than twice as much (docs/performance.md,
# "Building the model objects"). Keyword-only, like the classes' own constructors.
_make_device = fast_constructor(DeviceState)
_make_snapshot = fast_constructor(Snapshot)
# The unknown keys of the slots NvmlCalls.clocks and .health report unanswered (they do not raise per value:
# docs/performance.md, "Building the model objects").
_CLOCK_SLOT_KEYS = (
    *(
        unknown_key("clocks", f"{part}.{key}")
        for part in ("current", "max", "applications")
        for key in ("graphics_mhz", "sm_mhz", "memory_mhz", "video_mhz")
    ),
    unknown_key("clocks", "event_reasons"),
)
_HEALTH_SLOT_KEYS = tuple(unknown_key("health", k) for k in HEALTH_SLOTS)
_REASON_FLAGS: dict[int, ClockEventReason] = {}


def _event_reasons(mask: int) -> ClockEventReason:
    # Building an IntFlag costs far more than a dict lookup; masks repeat, so keep each one built.
    flag = _REASON_FLAGS.get(mask)
    if flag is None:
        flag = _REASON_FLAGS[mask] = model.ClockEventReason(mask)
    return flag


class NvmlBackend:
    """Reads GPUs through libnvidia-ml.

    ``library_path`` overrides the default names (and ``$NVMLCHECK_LIBNVML``, which names only the stub). Opening
    initialises NVML (shared reference count per process); :meth:`close` releases it. ``init_timeout_s`` bounds
    ``nvmlInit`` (``None``: no bound); a hung init raises :class:`~nvmlcheck.Timeout`. After ``fork()`` the child
    re-initialises on its first snapshot.

    Recovery: a call answering NVML_ERROR_UNINITIALIZED (NVML lost its initialisation, or another thread is
    re-initialising) makes the snapshot re-initialise NVML (unless another session just did) and read again, up to
    twice more; a read that another thread's re-init disturbed (one ran during it) joins that re-init and is read
    again without counting. NVML_ERROR_UNKNOWN (which can stick
    after hours, nvidia-docker #1671) is reported in that snapshot, and the next snapshot re-initialises NVML first.
    A re-init that fails raises its error from that snapshot (``Unknown`` and ``Timeout`` are transient in a wait),
    and the next snapshot tries again.
    """

    name = "nvml"

    def __init__(self, library_path: str | None = None, init_timeout_s: float | None = DEFAULT_INIT_TIMEOUT_S) -> None:
        if init_timeout_s is not None and not (init_timeout_s > 0 and init_timeout_s != float("inf")):
            raise ArgumentError(f"init_timeout_s must be a positive number of seconds or None, got {init_timeout_s!r}")
        if isinstance(library_path, str) and "\x00" in library_path:  # cffi refuses it with a bare TypeError
            raise ArgumentError(f"library_path holds a NUL character, which no path can: {library_path!r}")
        self._init_timeout_s = init_timeout_s
        self._loaded = library.load(library_path)
        # Bound before the init is waited for: in a one-shot check that wait is the early thread's nvmlInit, which
        # this work then overlaps (binding the C functions needs the library, not an initialised NVML).
        self._calls = NvmlCalls(self._loaded)
        self._loaded.acquire(init_timeout_s)
        self._closed = False
        self._generation = library.fork_generation()
        self._init_generation = self._loaded.init_generation
        # Set after an "Unknown Error": the init generation under which it was seen; the next read re-initialises
        # unless another session did so since.
        self._reinit_due: int | None = None
        self._identities: dict[int, _Identity] = {}
        # The UUID each index had when first read, kept across re-inits (which renumber GPUs: _identity).
        self._first_uuids: dict[int, str] = {}
        # Total memory per device, from the first successful memory read: the bound process entries are checked
        # against (a process cannot hold more than the device has).
        self._totals: dict[int, int] = {}
        self._reasons_cache: dict[tuple[int, _Plan], Mapping[str, str]] = {}
        # index -> (max graphics/SM/memory/video MHz, why any is unknown): static, read on the first clock read.
        self._max_clocks: dict[int, tuple[list[int | None], list[tuple[int, str, int]]]] = {}
        self._last_fields: Fields | None = None
        self._last_plan = _plan(Fields.ALL)
        self._system: SystemInfo | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def library_path(self) -> str:
        """The libnvidia-ml this backend loaded."""
        return self._loaded.path

    @property
    def symbols(self) -> library.Symbols:
        """Which versioned symbol answers each capability (see :class:`nvmlcheck._nvml.library.Symbols`)."""
        return self._loaded.symbols

    def close(self) -> None:
        """Release this backend's NVML reference (the last one shuts NVML down). Idempotent."""
        if not self._closed:
            self._closed = True
            if self._generation == library.fork_generation():
                # A backend inherited over fork() and never used in the child holds no reference here.
                self._loaded.release()

    def _check_open(self, deadline: Deadline | None = None) -> None:
        if self._closed:
            raise SessionClosed("this nvmlcheck session is closed")
        if self._generation != library.fork_generation():
            # A forked child: NVML must be initialised again here, and handles re-read.
            self._loaded.acquire(self._init_timeout_s)
            self._generation = library.fork_generation()
            self._forget_devices()
        due = self._reinit_due
        if due is not None:
            self._reinit(due, deadline)
            self._reinit_due = None
        if self._init_generation != self._loaded.init_generation:
            self._forget_devices()  # NVML was initialised again (here or by another session): handles are stale

    def _forget_devices(self) -> None:
        self._init_generation = self._loaded.init_generation
        self._identities.clear()
        self._totals.clear()
        self._reasons_cache.clear()
        self._max_clocks.clear()

    def _reinit(self, seen_generation: int, deadline: Deadline | None) -> None:
        """Re-initialise NVML, waiting at most the init timeout and, in a wait, the time left before its deadline
        (running out of the latter abandons the pass: DeadlinePassed, not a Timeout to report)."""
        limit = self._init_timeout_s
        if deadline is not None:
            left = deadline.remaining_s()
            if limit is None or left < limit:
                try:
                    self._loaded.reinit(seen_generation, left)
                except Timeout as exc:
                    if exc.code == 10 and exc.function == self._loaded.symbols.init and deadline.expired():
                        raise DeadlinePassed(f"re-initialising NVML: {exc}") from exc
                    raise
                return
        self._loaded.reinit(seen_generation, limit)

    def _recover(self, errors: Iterable[BaseException], generation: int, deadline: Deadline | None = None) -> bool:
        """After calls made under init ``generation`` failed with ``errors``: re-initialise NVML now (and return
        True: read again) when one says NVML is not initialised; plan a re-init before the next read when one is
        NVML's "Unknown Error".

        ``generation`` must be read before the calls: another thread may have re-initialised since, and then this
        one only re-reads (re-initialising again would pull NVML from under every other reader, and so on)."""
        errors = tuple(errors)
        if any(isinstance(e, Uninitialized) for e in errors):
            self._reinit(generation, deadline)
            self._reinit_due = None
            self._forget_devices()
            return True
        if any(isinstance(e, Unknown) for e in errors):
            self._reinit_due = generation
        return False

    # --- events ---------------------------------------------------------------------------------------------------

    def event_listener(self) -> EventListener:
        """A new, unstarted :class:`~nvmlcheck.events.EventListener` for every GPU this backend sees. Reads the
        identity of each GPU (cached, as a snapshot would) in this thread; a GPU whose identity cannot be read is
        left out, with its reason."""
        from ..events import EventListener, EventTarget

        self._check_open()
        targets: list[EventTarget] = []
        unreadable: dict[int, str] = {}
        for index in range(self._calls.device_count()):
            try:
                ident = self._identities.get(index) or self._identity(index)
            except NvmlCheckError as exc:
                unreadable[index] = f"its identity could not be read: {exc}"
                continue
            targets.append(EventTarget(index, ident.handle, ident.uuid, ident.mig_mode))
        return EventListener(EventCalls(self._calls), targets, handle_address, unavailable=unreadable)

    # --- system ---------------------------------------------------------------------------------------------------

    def system(self) -> SystemInfo:
        """Driver, NVML and CUDA driver versions (read once; they cannot change while the library is loaded)."""
        self._check_open()
        if self._system is None:
            unknown: dict[str, str] = {}
            values: dict[str, object] = {}
            for key, getter in (
                ("driver_version", self._calls.driver_version),
                ("nvml_version", self._calls.nvml_version),
                ("cuda_driver_version", self._calls.cuda_driver_version),
            ):
                try:
                    values[key] = getter()
                except NvmlError as exc:
                    if exc.SCOPE != "value":
                        raise
                    values[key] = None
                    unknown[key] = _reason(exc)
            self._system = SystemInfo(
                values["driver_version"],  # type: ignore[arg-type]
                values["nvml_version"],  # type: ignore[arg-type]
                values["cuda_driver_version"],  # type: ignore[arg-type]
                MappingProxyType(unknown),
            )
        return self._system

    def device_count(self) -> int:
        """nvmlDeviceGetCount_v2."""
        self._check_open()
        attempts = _Attempts(self._loaded)
        while True:
            generation = attempts.start()
            try:
                return self._calls.device_count()
            except (Uninitialized, Unknown) as exc:
                if attempts.final((exc,)) or not self._recover((exc,), generation):
                    raise

    # --- snapshot -------------------------------------------------------------------------------------------------

    def snapshot(
        self, indices: Sequence[int] | None = None, fields: Fields = Fields.ALL, *, deadline: Deadline | None = None
    ) -> Snapshot:
        """Read ``indices`` (all devices when ``None``) in one pass; see :class:`~nvmlcheck.Snapshot`.

        ``deadline``: stop between two queries once it has come (module docstring), raising
        :class:`~nvmlcheck.errors.DeadlinePassed`.
        """
        self._check_open(deadline)
        gate: _GateFn = _no_gate if deadline is None else _Gate(deadline)
        attempts = _Attempts(self._loaded)
        while True:
            generation = attempts.start()
            try:
                snap = self._read(indices, fields, gate)
            except (Uninitialized, Unknown) as exc:
                if attempts.final((exc,)) or not self._recover((exc,), generation, deadline):
                    raise
                continue
            if not snap.failures:
                return snap
            errors = tuple(f.error for f in snap.failures)
            if attempts.final(errors) or not self._recover(errors, generation, deadline):
                return snap

    def mig_entered(self, indices: Sequence[int]) -> tuple[int, ...]:
        """Of GPUs ``indices``, those this session read as not in MIG mode that are in it now, or whose mode cannot
        be read now: nvmlDeviceGetMigMode once each. Their identity is updated, so that every later snapshot reads
        their MIG state. A snapshot reads the mode again only while it is on or unknown (a GPU entering MIG mode is
        judged whole by a wait: stricter, never a false clean); select asks this before it hands GPUs out as whole
        ones, which CUDA never sees of a GPU in MIG mode."""
        self._check_open()
        out: list[int] = []
        for index in indices:
            ident = self._identities.get(index)
            if ident is None or ident.mig_mode is not False:
                continue
            try:
                mode = self._calls.mig_mode(ident.handle, index)
            except NvmlError as exc:  # a lost GPU too: the next snapshot says so
                ident.mig_mode = None
                ident.unknown = MappingProxyType({**ident.unknown, "mig": _reason(exc)})
            else:
                if not mode:
                    continue
                ident.mig_mode = True
            self._reasons_cache.clear()
            out.append(index)
        return tuple(out)

    def _read(self, indices: Sequence[int] | None, fields: Fields, gate: _GateFn = _no_gate) -> Snapshot:
        wall = time.time()
        start = time.monotonic_ns()
        if self._system is None:
            gate()
            self.system()
        system = self._system
        assert system is not None
        if fields is self._last_fields:  # identity check: hashing an enum.Flag runs Python code
            plan = self._last_plan
        else:
            plan = _PLANS.get(fields) or _PLANS.setdefault(fields, _plan(fields))
            self._last_fields, self._last_plan = fields, plan
        if indices is None:
            gate()
            indices = range(self._calls.device_count())
        devices: list[DeviceState] = []
        failures: list[DeviceFailure] = []
        for index in indices:
            ident = self._identities.get(index)
            try:
                if ident is None:
                    ident = self._identity(index, gate)
                devices.append(self._state(index, ident, plan, gate))
            except NvmlCheckError as exc:
                failures.append(DeviceFailure(index, ident.uuid if ident else None, exc))
        end = time.monotonic_ns()
        return _make_snapshot(
            backend="nvml",
            taken_ns=start,
            duration_ns=end - start,
            wall_time=wall,
            system=system,
            devices=tuple(devices),
            failures=tuple(failures),
        )

    def _identity(self, index: int, gate: _GateFn = _no_gate) -> _Identity:
        calls = self._calls
        gate()
        handle = calls.handle(index)
        gate()
        uuid = calls.uuid(handle, index)  # required: it is how devices are matched across backends and tools
        first = self._first_uuids.setdefault(index, uuid)
        if uuid != first:
            # NVML numbers GPUs anew at each init: after a re-init with a GPU gone (fallen off the bus), index N
            # names the next GPU. Reading it as GPU N could call a busy GPU clean.
            raise GpuLost(15, str(self._loaded.symbols.handle_by_index), index,
                          detail=f"GPU {index} was {first} when this session first read it; after NVML was "
                          f"initialised again index {index} is {uuid}: that GPU is no longer enumerated (fallen off "
                          f"the bus, or reset), and GPU {index} is not read as another one")
        unknown: dict[str, str] = {}
        values: dict[str, object] = {}
        for key, getter in (
            ("name", calls.name),
            ("pci_bus_id", calls.pci_bus_id),
            ("serial", calls.serial),
            ("minor_number", calls.minor_number),
        ):
            gate()
            try:
                values[key] = getter(handle, index)
            except NvmlError as exc:
                if exc.SCOPE != "value" and key != "serial":
                    raise
                # Serial numbers are often restricted (NO_PERMISSION) on consumer boards: unknown, not fatal.
                values[key] = None
                unknown[key] = _reason(exc)
        bus_id = values["pci_bus_id"]
        if bus_id is not None:
            # One spelling on both backends (nvidia-smi prints 00000000:0A:00.0; a driver may fill busId with the
            # legacy 0000:0a:00.0): two readings of one GPU compare equal.
            values["pci_bus_id"] = canonical_bus_id(str(bus_id))
            if values["pci_bus_id"] is None:
                raise CorruptData(f"busId {bus_id!r} is not a PCI bus id", str(self._loaded.symbols.pci_info), index)
        gate()
        mig_mode: bool | None
        try:
            mig_mode = calls.mig_mode(handle, index)
        except NvmlError as exc:
            if exc.SCOPE == "device":  # MIG is optional: only a lost GPU, no driver, ... fails the device
                raise
            mig_mode = None
            unknown["mig"] = _reason(exc)
        # A live read reports any error; the total is only the bound process entries are checked against.
        gate()
        try:  # noqa: SIM105  (contextlib would cost a one-shot ~1 ms of imports on an H200: docs/performance.md)
            self._totals[index] = calls.memory(handle, index).total_bytes
        except NvmlCheckError:
            pass
        ident = _Identity(
            handle=handle,
            uuid=uuid,
            name=values["name"],  # type: ignore[arg-type]
            pci_bus_id=values["pci_bus_id"],  # type: ignore[arg-type]
            serial=values["serial"],  # type: ignore[arg-type]
            minor_number=values["minor_number"],  # type: ignore[arg-type]
            unknown=MappingProxyType(unknown),
            mig_mode=mig_mode,
        )
        self._identities[index] = ident
        return ident

    def _state(self, index: int, ident: _Identity, plan: _Plan, gate: _GateFn = _no_gate) -> DeviceState:
        # The poll path (memory + three process lists): no per-call closures or dicts unless something is unknown.
        calls = self._calls
        handle = ident.handle
        unknown: dict[str, str] | None = None

        memory: Memory | None = None
        if plan.memory:
            gate()
            try:
                memory = calls.memory(handle, index)
            except NvmlError as exc:
                unknown = _note(unknown, "memory", exc)
            else:
                if memory.total_bytes == 0:
                    # No GPU has no memory (a buffer the call left zeroed, a struct layout mismatch), and its 0 bytes
                    # used would make it look idle. (A MIG instance's own reading is read elsewhere.)
                    raise CorruptData("total 0 B: a GPU with no memory at all is not a reading",
                                      str(self._loaded.symbols.memory), index)
                self._totals[index] = memory.total_bytes
                if memory.used_includes_reserved:
                    unknown = _add(unknown, "memory.reserved_bytes", _V1_MEMORY)

        lists: list[tuple[GpuProcess, ...] | None] = [None, None, None]
        if plan.processes:
            total = self._totals.get(index, _NO_BOUND)
            for slot, kind in enumerate(_KINDS):
                gate()
                try:
                    raw = calls.processes(handle, kind, index, total)
                except NvmlError as exc:
                    unknown = _note(unknown, _PROCESS_KEYS[slot], exc)
                    continue
                lists[slot] = (
                    tuple([_new_tuple(GpuProcess, (p, kind, u, process_name(p), gi, ci)) for p, u, gi, ci in raw])
                    if raw
                    else ()
                )
                if raw and any(e[1] is None for e in raw):  # every None has its reason, as nvidia-smi's N/A does
                    unknown = _add(unknown, "processes.used_bytes", _USED_NOT_AVAILABLE)

        clocks = health = None
        if plan.clocks or plan.health:
            extra: dict[str, str] = {}
            if plan.clocks:
                gate()
                clocks = self._clocks(handle, index, extra, plan.clock_limits, plan.clock_reasons)
            if plan.health:
                gate()
                health = self._health(handle, index, extra)
            if extra:
                unknown = {**(unknown or {}), **extra}

        mig_mode, mig_devices, unknown = self._mig_state(index, ident, plan, lists, unknown=unknown, gate=gate)

        if unknown is None:
            reasons = self._base_reasons(index, ident, plan)
        else:
            reasons = MappingProxyType({**ident.unknown, **plan.not_requested, **unknown})
        return _make_device(
            index=index,
            uuid=ident.uuid,
            name=ident.name,
            pci_bus_id=ident.pci_bus_id,
            serial=ident.serial,
            minor_number=ident.minor_number,
            memory=memory,
            compute_processes=lists[0],
            graphics_processes=lists[1],
            mps_processes=lists[2],
            clocks=clocks,
            health=health,
            unknown=reasons,
            mig_mode=mig_mode,
            mig_devices=mig_devices,
        )

    def _mig_state(
        self, index: int, ident: _Identity, plan: _Plan, lists: list[tuple[GpuProcess, ...] | None], *,
        unknown: dict[str, str] | None, gate: _GateFn,
    ) -> tuple[bool | None, tuple[MigDevice, ...] | None, dict[str, str] | None]:
        """The MIG mode and devices of one poll, with ``unknown`` added to (``None``: nothing unknown yet)."""
        handle = ident.handle
        mig_mode = ident.mig_mode
        if mig_mode is not False and (plan.memory or plan.processes):
            # Read again while on: a GPU that left MIG mode (a reset) judged with the MIG idle allowance read 60 MiB
            # held with no process as clean. A GPU that enters MIG mode is judged as a whole GPU until the next
            # session: stricter (no allowance), never a false clean. Read again while unknown too: one failed read
            # at the identity made the mode unknown for the whole session (select passed the GPU over for good).
            gate()
            try:
                mig_mode = self._calls.mig_mode(handle, index)
            except NvmlError as exc:
                if exc.SCOPE == "device":
                    raise
                mig_mode = None  # judged as before MIG, with the reason
                unknown = _add(unknown, "mig", _reason(exc))
            if mig_mode is False:
                ident.mig_mode = False
            if mig_mode is not None and "mig" in ident.unknown:  # known now: the identity's failure is history
                ident.mig_mode = mig_mode
                ident.unknown = MappingProxyType({k: v for k, v in ident.unknown.items() if k != "mig"})
                self._reasons_cache.clear()
        mig_devices: tuple[MigDevice, ...] | None = _NO_MIG if mig_mode is False else None
        if mig_mode and (plan.memory or plan.processes):
            gate()
            try:
                mig_devices = self._mig_devices(handle, index, lists)
            except NvmlError as exc:
                if exc.SCOPE == "device":
                    raise
                unknown = _add(unknown, "mig_devices", _reason(exc))
        return mig_mode, mig_devices, unknown

    def _mig_devices(
        self, handle: Handle, index: int, lists: list[tuple[GpuProcess, ...] | None]
    ) -> tuple[MigDevice, ...]:
        """The MIG devices of a GPU in MIG mode, each with the parent's processes that run in it (NVML lists a MIG
        GPU's processes on the parent handle, with their instance ids)."""
        devices = tuple(
            MigDevice(slot, uuid, gi, ci, memory, None, MappingProxyType(why))
            for slot, uuid, gi, ci, memory, why in self._calls.mig_devices(handle, index)
        )
        every = None if any(x is None for x in lists) else tuple(p for procs in lists for p in procs or ())
        return attribute_processes(devices, every)

    def _base_reasons(self, index: int, ident: _Identity, plan: _Plan) -> Mapping[str, str]:
        """What is unknown on a device when every requested read succeeded (cached: it only depends on these)."""
        key = (index, plan)
        reasons = self._reasons_cache.get(key)
        if reasons is None:
            reasons = MappingProxyType({**ident.unknown, **plan.not_requested})
            self._reasons_cache[key] = reasons
        return reasons

    def _clocks(
        self, handle: Handle, index: int, unknown: dict[str, str], limits: bool = True, reasons: bool = True
    ) -> Clocks:
        cached = self._max_clocks.get(index)
        values, mask, unanswered = self._calls.clocks(
            handle, index, include_max=limits and cached is None, include_applications=limits,
            include_reasons=reasons,
        )
        # Without limits (reasons), the max and application clocks (the event reasons) stay None: the plan's reasons
        # say "not requested".
        if limits and cached is None:
            # Max clocks are a property of the board: read once per device (each call costs milliseconds on some
            # drivers: docs/performance.md).
            cached = self._max_clocks[index] = (values[4:8], [u for u in unanswered if 4 <= u[0] < 8])
        elif limits and cached is not None:
            values[4:8] = cached[0]
            unanswered.extend(cached[1])
        for slot, symbol, code in unanswered:
            unknown[_CLOCK_SLOT_KEYS[slot]] = _code_reason(symbol, code)
        event_reasons = None if mask is None else _event_reasons(mask)
        clock_set = model.ClockSet
        return model.Clocks(clock_set(*values[0:4]), clock_set(*values[4:8]), clock_set(*values[8:12]), event_reasons)

    def _health(self, handle: Handle, index: int, unknown: dict[str, str]) -> Health:
        health, unanswered = self._calls.health(handle, index)
        for slot, symbol, code in unanswered:
            unknown[_HEALTH_SLOT_KEYS[slot]] = _code_reason(symbol, code)
        return health


class _Attempts:
    """Counts the reads of one snapshot for recovery (see _READ_ATTEMPTS): a read that failed with "Uninitialized"
    while another thread's re-init had NVML shut down (one was running when the read began, or one began during it)
    is retried without counting, so threads sharing a session never see each other's re-inits as errors."""

    __slots__ = ("busy", "counted", "disturbed", "epoch", "loaded")

    def __init__(self, loaded: library.LoadedLibrary) -> None:
        self.loaded = loaded
        self.counted = 0
        self.disturbed = 0
        self.epoch = 0
        self.busy = False

    def start(self) -> int:
        """Before a read: note the re-init state and return the init generation the read runs under."""
        loaded = self.loaded
        self.epoch = loaded.reinit_epoch
        self.busy = loaded.reinit_in_progress
        return loaded.init_generation

    def final(self, errors: Iterable[BaseException]) -> bool:
        """After a failed read: whether it was the last one allowed (report its errors instead of recovering)."""
        moved = self.busy or self.loaded.reinit_epoch != self.epoch
        if moved and any(isinstance(e, Uninitialized) for e in errors):
            self.disturbed += 1
            return self.disturbed > _DISTURBED_READS
        self.counted += 1
        return self.counted >= _READ_ATTEMPTS


def _note(unknown: dict[str, str] | None, key: str, exc: NvmlError) -> dict[str, str]:
    """Record why ``key`` is unknown, or re-raise when the error makes the whole device unreadable."""
    if exc.SCOPE != "value":
        raise exc
    return _add(unknown, key, _reason(exc))


def _add(unknown: dict[str, str] | None, key: str, reason: str) -> dict[str, str]:
    if unknown is None:
        unknown = {}
    unknown[key] = reason
    return unknown
