"""The values nvmlcheck reports: frozen, slotted dataclasses shared by every backend.

Conventions:

* Units live in names: ``used_bytes``, ``sm_mhz``, ``taken_ns``. Bytes everywhere; nvidia-smi's MiB values are
  converted and their granularity recorded in :attr:`Memory.granularity_bytes`.
* Unknown is ``None``, never ``0``. Every ``None`` that stands for "could not be read" has a reason in
  :attr:`DeviceState.unknown`, keyed by the dotted field path (``"clocks.sm_mhz"``, ``"health.retired_pages"``,
  ``"processes.graphics"``); :meth:`DeviceState.why_unknown` reads it.
* Both backends (NVML and nvidia-smi) return these same types; only :attr:`Snapshot.backend` tells them apart.

Where each field comes from, in each backend: docs/backends.md.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType

from ._record import field, record, replace

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, NamedTuple, TypeVar

    _T = TypeVar("_T")
else:
    from ._record import NamedTuple

if TYPE_CHECKING:  # offered here (in __all__), created on first use (__getattr__ below); `X as X` re-exports
    from ._clocks import ClockEventReason as ClockEventReason  # noqa: PLC0414
    from ._clocks import Clocks as Clocks  # noqa: PLC0414
    from ._clocks import ClockSet as ClockSet  # noqa: PLC0414
    from ._readings import Health as Health  # noqa: PLC0414
    from ._readings import HealthCause as HealthCause  # noqa: PLC0414
    from ._readings import MemoryHealth as MemoryHealth  # noqa: PLC0414
    from ._readings import OperatorAction as OperatorAction  # noqa: PLC0414
    from ._readings import RecoveryAction as RecoveryAction  # noqa: PLC0414
    from ._readings import RemappedRows as RemappedRows  # noqa: PLC0414
    from ._readings import RetiredPage as RetiredPage  # noqa: PLC0414
    from ._readings import RetirementCause as RetirementCause  # noqa: PLC0414

__all__ = [
    "GIB",
    "MIB",
    "ClockEventReason",
    "ClockSet",
    "Clocks",
    "DeviceFailure",
    "DeviceState",
    "Fields",
    "GpuProcess",
    "Health",
    "HealthCause",
    "Memory",
    "MemoryHealth",
    "MigDevice",
    "OperatorAction",
    "attribute_processes",
    "ProcessKind",
    "RecoveryAction",
    "RemappedRows",
    "RetiredPage",
    "RetirementCause",
    "Snapshot",
    "SystemInfo",
]

# Clocks (._clocks) and health (._readings), with their enums, are created on first use: a wait reads neither and
# a ready no clocks, and creating their classes at import cost a one-shot check milliseconds (docs/performance.md,
# "One-shot checks").
_READINGS = {
    "ClockEventReason": "_clocks", "ClockSet": "_clocks", "Clocks": "_clocks", "Health": "_readings",
    "HealthCause": "_readings", "MemoryHealth": "_readings", "OperatorAction": "_readings",
    "RecoveryAction": "_readings", "RemappedRows": "_readings", "RetiredPage": "_readings",
    "RetirementCause": "_readings",
}  # fmt: skip


if not TYPE_CHECKING:  # type checkers see the names through the import above

    def __getattr__(name: str) -> Any:
        home = _READINGS.get(name)
        if home == "_clocks":
            from . import _clocks as module
        elif home is not None:
            from . import _readings as module
        else:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(module, name)
        globals()[name] = value
        return value


#: One mebibyte (2**20 bytes), the unit nvidia-smi reports memory in.
MIB = 1 << 20
#: One gibibyte (2**30 bytes): ``16 * nc.GIB`` is what ``--max-used 16GiB`` (or ``16G``) means.
GIB = 1 << 30

_EMPTY: Mapping[str, str] = MappingProxyType({})


def _rebuild(cls: type[_T], values: tuple[Any, ...]) -> _T:
    """Unpickle a model object whose ``unknown`` reasons were pickled as a plain dict."""
    return cls(*(MappingProxyType(v) if isinstance(v, _PickledReasons) else v for v in values))


class _PickledReasons(dict[str, str]):
    """A reasons mapping on its way through pickle (MappingProxyType itself does not pickle)."""


class _ReasonsPickle:
    """Mixin: pickle the ``unknown`` mapping as a dict and restore it read-only."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        names: tuple[str, ...] = type(self).__record_fields__  # type: ignore[attr-defined]
        values = tuple(
            _PickledReasons(v) if isinstance(v, MappingProxyType) else v for v in (getattr(self, n) for n in names)
        )
        return (_rebuild, (type(self), values))


class ProcessKind(str, enum.Enum):
    """Which NVML process list a process came from."""

    COMPUTE = "compute"  #: nvmlDeviceGetComputeRunningProcesses; nvidia-smi --query-compute-apps
    GRAPHICS = "graphics"  #: nvmlDeviceGetGraphicsRunningProcesses
    MPS = "mps"  #: nvmlDeviceGetMPSComputeRunningProcesses


class Fields(enum.Flag):
    """What a snapshot reads. Identity (name, UUID, PCI bus id, ...) is always included.

    Driver time per GPU on an H200 (docs/performance.md): ``MEMORY`` ~5 µs, ``PROCESSES`` ~17 µs (three lists),
    ``HEALTH`` ~2 µs, ``CURRENT_CLOCKS`` a few µs: the current clock speeds (``CLOCK_SPEEDS``) and their event
    reasons (``CLOCK_REASONS``); ``CLOCK_LIMITS`` (the max and application clocks) ~3.3 ms (the four application
    clocks, ~0.83 ms each; the max clocks cost ~5.8 ms once per device and are cached); ``CLOCKS`` is all three
    (any of them reads the current speeds too: the model's :class:`Clocks` is built around them). A process's first
    call of each costs milliseconds more (``HEALTH`` ~4 ms, the speeds ~2.8 ms, the reasons ~1.4 ms, the limits
    ~12 ms on an H200): a view that shows MHz only asks for ``CLOCK_SPEEDS``. The poller asks for ``WAIT``
    (``MEMORY | PROCESSES``) only; a loop over :meth:`Session.snapshot` should too, rather than its default ``ALL``.
    """

    MEMORY = 1
    PROCESSES = 2
    CLOCK_SPEEDS = 4  # the bit CURRENT_CLOCKS (and CLOCKS before it) had before each split
    HEALTH = 8
    CLOCK_LIMITS = 16
    CLOCK_REASONS = 32
    CURRENT_CLOCKS = CLOCK_SPEEDS | CLOCK_REASONS
    CLOCKS = CURRENT_CLOCKS | CLOCK_LIMITS
    ALL = MEMORY | PROCESSES | CLOCKS | HEALTH
    #: What :func:`wait_until_clean` reads each poll.
    WAIT = MEMORY | PROCESSES


@record
class SystemInfo(_ReasonsPickle):
    """Host-wide facts.

    ``driver_version``: nvmlSystemGetDriverVersion / nvidia-smi ``driver_version``.
    ``nvml_version``: nvmlSystemGetNVMLVersion (``None`` from nvidia-smi).
    ``cuda_driver_version``: nvmlSystemGetCudaDriverVersion_v2 as an int (12040 = 12.4), ``None`` if unknown.
    """

    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: int | None
    unknown: Mapping[str, str] = field(default_factory=lambda: _EMPTY, compare=False)


class Memory(NamedTuple):
    """Device memory (nvmlDeviceGetMemoryInfo_v2; nvidia-smi ``memory.total/used/free/reserved``).

    ``used_includes_reserved`` is ``True`` when only the v1 call exists: then ``used_bytes`` counts the driver's
    reservation (hundreds of MiB: docs/driver-facts.md) and an idle GPU does not read 0. ``granularity_bytes`` is
    1 for NVML and 1 MiB for nvidia-smi, whose values are whole MiB.

    A named tuple rather than a dataclass (like :class:`GpuProcess`): it is built on every poll, and a tuple is
    built in a third of the time, which keeps the typed memory query faster than nvidia-ml-py's untyped one
    (docs/performance.md). It is immutable and compares by value.
    """

    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None
    used_includes_reserved: bool = False
    granularity_bytes: int = 1


class GpuProcess(NamedTuple):
    """One entry of a device's process list.

    ``used_bytes`` is ``None`` when NVML reports "not available" (WDDM, some MIG and container setups), never 0.
    ``name`` comes from ``/proc/<pid>/cmdline`` when the process is visible from here (or from nvidia-smi's
    ``process_name``), else ``None``. ``gpu_instance_id``/``compute_instance_id`` are ``None`` outside MIG.
    """

    pid: int
    kind: ProcessKind
    used_bytes: int | None
    name: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@record
class MigDevice(_ReasonsPickle):
    """One MIG device (a compute instance of a GPU instance) of a GPU in MIG mode.

    ``index``: nvmlDeviceGetMigDeviceHandleByIndex's index (nvidia-smi ``-q`` ``MIG Device`` ``Index``).
    ``uuid``: ``MIG-...`` (nvmlDeviceGetUUID on the MIG handle; ``None`` where nvidia-smi does not print it).
    ``gpu_instance_id`` / ``compute_instance_id``: nvmlDeviceGetGpuInstanceId / nvmlDeviceGetComputeInstanceId
    (``-q`` ``GPU Instance ID`` / ``Compute Instance ID``). ``memory``: nvmlDeviceGetMemoryInfo on the MIG handle
    (``-q`` ``FB Memory Usage`` of the MIG device): the instance's own share. ``processes``: every process of the
    parent's lists whose instance ids are this device's (a process is attributed to its instance), ``None`` when
    the parent's lists are unknown. A process's ``used_bytes`` may be ``None`` on MIG ("not available"), never 0.
    Anything ``None`` has its reason in ``unknown``.
    """

    index: int
    uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory: Memory | None
    processes: tuple[GpuProcess, ...] | None
    unknown: Mapping[str, str] = field(default_factory=lambda: _EMPTY, compare=False)

    @property
    def label(self) -> str:
        """How messages name it: ``MIG 0 (GI 1, CI 0, MIG-...)``."""
        gi = "?" if self.gpu_instance_id is None else self.gpu_instance_id
        ci = "?" if self.compute_instance_id is None else self.compute_instance_id
        uuid = f", {self.uuid}" if self.uuid else ""
        return f"MIG {self.index} (GI {gi}, CI {ci}{uuid})"

    def owns(self, p: GpuProcess) -> bool:
        """Whether process ``p`` (from the parent's lists) runs in this instance: its GPU-instance id is this one's,
        and so is its compute-instance id when both are known."""
        if p.gpu_instance_id is None or p.gpu_instance_id != self.gpu_instance_id:
            return False
        return (
            p.compute_instance_id is None
            or self.compute_instance_id is None
            or (p.compute_instance_id == self.compute_instance_id)
        )


def attribute_processes(
    mig_devices: tuple[MigDevice, ...], processes: tuple[GpuProcess, ...] | None
) -> tuple[MigDevice, ...]:
    """``mig_devices`` with ``processes`` set from the parent's list: each process goes to the instance it runs in
    (both backends list a MIG GPU's processes on the parent, with instance ids). ``processes`` ``None`` (unknown)
    leaves each device's processes ``None`` with that reason; so does a process listed with no GPU-instance id, and
    a device whose own id is unknown, where the parent lists any process: which instance runs it cannot be told."""
    unplaced = processes is not None and any(p.gpu_instance_id is None for p in processes)
    out: list[MigDevice] = []
    for m in mig_devices:
        if processes is None:
            why = m.unknown.get("processes", "the parent GPU's process lists are unknown")
        elif processes and m.gpu_instance_id is None:
            why = "its GPU-instance id is unknown: which of the parent GPU's processes run in it cannot be told"
        elif unplaced:
            why = "a process on the parent GPU's lists has no GPU-instance id: which instance runs it cannot be told"
        else:
            out.append(replace(m, processes=tuple(p for p in processes if m.owns(p))))
            continue
        out.append(replace(m, processes=None, unknown=MappingProxyType({**m.unknown, "processes": why})))
    return tuple(out)


@record
class DeviceState(_ReasonsPickle):
    """Everything read from one device in one pass.

    Identity: ``index`` (NVML enumeration order, nvidia-smi ``index``), ``name``, ``uuid``, ``pci_bus_id``,
    ``serial``, ``minor_number`` (``/dev/nvidia<minor>``).

    Live: ``memory``, the three process lists, ``clocks``, ``health``. A part that was not requested
    (see :class:`Fields`) or could not be read is ``None`` with a reason in ``unknown``.

    MIG (added in issue 11; both default to ``None`` = not read, so older constructors keep working):
    ``mig_mode`` is nvmlDeviceGetMigMode's current mode (nvidia-smi ``mig.mode.current``): ``True`` enabled,
    ``False`` disabled or not supported by the GPU, ``None`` unknown (reason under ``"mig"``). ``mig_devices`` are
    its MIG devices when enabled (``()`` when none are created or MIG is off). In MIG mode ``memory`` is the whole
    GPU's, which counts the driver's MIG overhead (an idle H100 reads ~59 MiB used with no process), and the three
    process lists hold every instance's processes with their instance ids.
    """

    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    minor_number: int | None
    memory: Memory | None
    compute_processes: tuple[GpuProcess, ...] | None
    graphics_processes: tuple[GpuProcess, ...] | None
    mps_processes: tuple[GpuProcess, ...] | None
    clocks: Clocks | None
    health: Health | None
    unknown: Mapping[str, str] = field(default_factory=lambda: _EMPTY, compare=False)
    mig_mode: bool | None = None
    mig_devices: tuple[MigDevice, ...] | None = None

    def mig_device_of(self, p: GpuProcess) -> MigDevice | None:
        """The MIG device process ``p`` runs in, when this GPU is in MIG mode and its instance is known."""
        for m in self.mig_devices or ():
            if m.owns(p):
                return m
        return None

    @property
    def processes(self) -> tuple[GpuProcess, ...] | None:
        """All processes of every kind, or ``None`` when any of the three lists is unknown.

        A process using the GPU for compute and graphics appears once per kind. On a GPU in MIG mode, a process
        listed on one of its MIG devices but on none of the GPU's own lists (NVML can list processes per MIG
        handle) is included too, after them: every reader of "what is listed on this GPU" (holders, a kill's
        "off every list", ready) sees it.
        """
        c, g, m = self.compute_processes, self.graphics_processes, self.mps_processes
        if c is None or g is None or m is None:
            return None
        every = c + g + m
        if self.mig_devices:
            seen = {(p.pid, p.kind) for p in every}
            extra = tuple(p for d in self.mig_devices for p in d.processes or () if (p.pid, p.kind) not in seen)
            if extra:
                return every + tuple(dict.fromkeys(extra))  # one entry each, should two instances list it
        return every

    def processes_of(self, kind: ProcessKind | str) -> tuple[GpuProcess, ...] | None:
        """The process list of one kind (``None`` when unknown): a :class:`ProcessKind`, or its value
        (``"compute"``, ``"graphics"``, ``"mps"``); :class:`~nvmlcheck.ArgumentError` for anything else."""
        if kind is ProcessKind.COMPUTE:
            return self.compute_processes
        if kind is ProcessKind.GRAPHICS:
            return self.graphics_processes
        if kind is ProcessKind.MPS:
            return self.mps_processes
        # A plain "compute" is not the member (identity): it was answered with the MPS list.
        try:
            member = ProcessKind(kind)
        except ValueError:
            from .errors import ArgumentError

            raise ArgumentError(f"a process kind is 'compute', 'graphics' or 'mps' (or a ProcessKind), got "
                                f"{kind!r}") from None
        return self.processes_of(member)

    def why_unknown(self, path: str) -> str | None:
        """Why the field at dotted ``path`` (``"memory"``, ``"clocks.sm_mhz"``, ``"processes.graphics"``) is ``None``;
        ``None`` when it is known. A whole part's reason also answers for its fields."""
        reason = self.unknown.get(path)
        if reason is None and "." in path:
            reason = self.unknown.get(path.split(".", 1)[0])
        return reason


# Words of the reasons a backend records for a value the device does not have: errors.py's NotSupported and
# FunctionNotFound ("not supported: ...", "not available: ..."), nvidia-smi's placeholders ("[N/A]", "[Not
# Supported]"), a field an older nvidia-smi does not know ("this nvidia-smi does not know the field ...": the
# recovery action before driver 565). Unsupported health is no refusal (a Hopper GPU retires no pages: it remaps
# rows). A part that was "not requested" is no such reason: health never read is unknown, never ready.
_UNSUPPORTED_WORDS = ("not supported", "not available", "[n/a]", "does not know the field")


def unsupported(why: str) -> bool:
    """Whether an ``unknown`` reason says the device or driver does not have the value (rather than that reading
    it failed)."""
    low = why.lower()
    return any(w in low for w in _UNSUPPORTED_WORDS)


def unknown_key(part: str, name: str | enum.Enum) -> str:
    """The :attr:`DeviceState.unknown` key of one field of a part, as :meth:`DeviceState.why_unknown` reads it:
    ``unknown_key("processes", ProcessKind.MPS)`` is ``"processes.mps"``; an enum member stands for its value."""
    return f"{part}.{name.value if isinstance(name, enum.Enum) else name}"


@record
class DeviceFailure:
    """A device that could not be read in this snapshot (lost, no permission, ...); the others still report."""

    index: int
    uuid: str | None
    error: Exception

    def describe(self) -> str:
        """One line for messages: ``"GPU 1 (GPU-…): could not be read: <error>"``."""
        uuid = f" ({self.uuid})" if self.uuid else ""
        return f"GPU {self.index}{uuid}: could not be read: {self.error}"


@record
class Snapshot:
    """One consistent pass over the selected devices.

    ``taken_ns`` is ``time.monotonic_ns()`` when the pass started and ``duration_ns`` how long it took;
    ``wall_time`` is ``time.time()`` at the start. ``backend`` is ``"nvml"`` or ``"smi"``. Devices that could not be
    read appear in ``failures``, never as idle devices.
    """

    backend: str
    taken_ns: int
    duration_ns: int
    wall_time: float
    system: SystemInfo
    devices: tuple[DeviceState, ...]
    failures: tuple[DeviceFailure, ...] = ()

    def device(self, index: int) -> DeviceState:
        """The state of the device with NVML index ``index``; :class:`~nvmlcheck.NoSuchDevice` (a ``KeyError``) if it
        is not in this snapshot, or is in :attr:`failures` (the message says why it could not be read, the GPU's error
        is its ``__cause__``); :class:`~nvmlcheck.ArgumentTypeError` when ``index`` is not an int (``True`` and
        ``1.0`` are not GPU 1)."""
        if isinstance(index, bool) or not isinstance(index, int):
            from .errors import ArgumentTypeError

            raise ArgumentTypeError(f"a GPU index is an int, got {index!r} (a UUID: look it up in Snapshot.devices)")
        for d in self.devices:
            if d.index == index:
                return d
        from .errors import NoSuchDevice

        for f in self.failures:
            if f.index == index:  # in the snapshot, but with no state to return: say why, not "not in it"
                raise NoSuchDevice(f"GPU {index} has no state in this snapshot: {f.describe()}") from f.error
        raise NoSuchDevice(f"GPU {index} is not in this snapshot (devices: {[d.index for d in self.devices]})")

    def raise_for_failures(self) -> None:
        """Raise the first device failure, if any (its original exception)."""
        if self.failures:
            raise self.failures[0].error


def fast_constructor(cls: type[_T]) -> Callable[..., _T]:
    """A keyword-only constructor for a frozen slotted record or dataclass that skips the generated ``__init__``.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; writing the slots directly
    costs less than half as much. Backends build a ``DeviceState`` per GPU and a ``Snapshot`` per poll, and the
    difference is about a fifth of a wait poll on the stub (docs/performance.md, "Building the model objects").
    Every field is a required keyword argument, so reordering the class's fields changes nothing and a missing or
    misspelt one raises ``TypeError``. No defaults, no validation.
    """
    names: tuple[str, ...] | None = getattr(cls, "__record_fields__", None)
    if names is None:  # a dataclass that is not a record
        import dataclasses

        names = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
    body = "\n".join(f"    _set_{n}(o, {n})" for n in names)
    source = f"def make(*, {', '.join(names)}):\n    o = _new(_cls)\n{body}\n    return o\n"
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for n in names:
        namespace[f"_set_{n}"] = cls.__dict__[n].__set__
    exec(source, namespace)
    make: Callable[..., _T] = namespace["make"]
    make.__qualname__ = f"fast_constructor({cls.__name__})"
    return make
