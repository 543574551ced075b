"""The C boundary: the only module that calls NVML query functions (library.py makes only init/shutdown calls).

Each method makes one logical query and returns Python values or model objects. A non-zero return code becomes the
most specific :class:`~nvmlcheck.NvmlError` subclass, naming the C symbol and the device; a symbol missing from the
loaded library, :class:`~nvmlcheck.FunctionNotFound`; NVML's "not available" sentinels, ``None``. Values that cannot
be true (PID 0 or above Linux's PID_MAX_LIMIT, bytes above the device total) raise :class:`~nvmlcheck.CorruptData`:
that is what a struct layout mismatch looks like (docs/driver-facts.md). Hot paths (memory and process lists, called
every poll) bind their C functions once and avoid per-call lookups.
"""

from __future__ import annotations

from _thread import _local  # threading.local itself, without importing threading
from collections.abc import Callable

from .. import model
from .._proc import PID_MAX_LIMIT  # NVML reports host PIDs, so nothing above is real
from ..errors import CorruptData, FunctionNotFound, InsufficientSize, NvmlError, codes_in_scope, error_class_for_code
from ..model import Memory, ProcessKind
from ._ffi import ffi as _ffi
from .library import NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, LoadedLibrary

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:  # the health classes are created on first use (model.__getattr__): a wait never reads health
    from typing import Any, NewType

    from ..model import Health, RecoveryAction, RemappedRows, RetiredPage, RetirementCause

    #: An ``nvmlDevice_t`` (an opaque cffi pointer).
    Handle = NewType("Handle", object)
else:

    def Handle(value):
        return value

# cffi's cdata is dynamically typed (struct fields are attributes made at run time).
ffi: Any = _ffi

__all__ = [
    "CLOCK_GRAPHICS",
    "CLOCK_MEM",
    "CLOCK_SM",
    "CLOCK_VIDEO",
    "EVENT_FUNCTIONS",
    "HEALTH_SLOTS",
    "MAX_LIST_ATTEMPTS",
    "PID_MAX_LIMIT",
    "REASON_GIVEN",
    "Handle",
    "NvmlCalls",
    "recovery_action_of",
]

# nvmlClockType_t
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO = 0, 1, 2, 3

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
# Codes whose class has scope "device" (errors.py declares it): the whole device (or NVML) is unusable. For the
# optional reads (clocks, memory health) every other code only makes that one value unknown; memory and process
# lists, which a wait judges, raise on every error. Raw codes, so the per-call path is one set lookup.
_DEVICE_LEVEL_CODES = codes_in_scope("device")
#: NVML_VALUE_NOT_AVAILABLE as an unsigned long long.
NOT_AVAILABLE_U64 = (1 << 64) - 1
#: MIG instance ids outside MIG.
NOT_MIG_U32 = 0xFFFFFFFF
#: Process-list attempts before giving up on a list that keeps growing between calls.
MAX_LIST_ATTEMPTS = 8
# Entries requested on the first process-list call: one call instead of the count-then-fill pair in the common case.
_INITIAL_CAPACITY = 64
# Buffer bytes per requested entry: twice the 24-byte struct, so a driver writing wider entries than declared
# (535.43 wrote 32 bytes) cannot overflow the buffer; the shifted entries are then caught as corrupt.
_HEADROOM = 2

_MEMORY_V2_VERSION = ffi.sizeof("nvmlMemory_v2_t") | (2 << 24)
_STRING_BUFFER = 96  # NVML_DEVICE_NAME_V2_BUFFER_SIZE / UUID_V2 (the largest identity string)
_SERIAL_BUFFER = 30  # NVML_DEVICE_SERIAL_BUFFER_SIZE
_VERSION_BUFFER = 80  # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE / NVML_VERSION


# Parsed once: ffi.new("type string") re-parses the string on every call.
_MEMORY_V2_T = ffi.typeof("nvmlMemory_v2_t *")
_MEMORY_V1_T = ffi.typeof("nvmlMemory_t *")
_UINT_P = ffi.typeof("unsigned int *")
_ULL_P = ffi.typeof("unsigned long long *")
_PROC_V2_ARRAY = ffi.typeof("nvmlProcessInfo_v2_t[]")
_PROC_V1_ARRAY = ffi.typeof("nvmlProcessInfo_v1_t[]")
_ULL_ARRAY = ffi.typeof("unsigned long long[]")
#: A process entry: (pid, used bytes or None, GPU instance id or None, compute instance id or None).
ProcessEntry = tuple[int, "int | None", "int | None", "int | None"]
#: A MIG device: (slot index, MIG UUID, GPU instance id, compute instance id, memory, reasons for what is None).
MigEntry = tuple[int, "str | None", "int | None", "int | None", "Memory | None", dict[str, str]]
#: A query that did not answer but leaves the device readable: (slot, C symbol, nvmlReturn_t code).
Unanswered = tuple[int, str, int]


class _Buffers(_local):
    """Per-thread buffers for the per-poll calls: allocating a cffi struct costs about as much as reading it, and
    cffi releases the GIL during the C call, so a buffer cannot be shared between threads."""

    def __init__(self) -> None:
        self.memory_v2 = ffi.new(_MEMORY_V2_T)
        # Input only: NVML reads it and fills the rest. It must be sizeof | 2<<24; a bare 2 fails on a real driver
        # (docs/driver-facts.md).
        self.memory_v2.version = _MEMORY_V2_VERSION
        self.memory_v1 = ffi.new(_MEMORY_V1_T)
        self.count = ffi.new(_UINT_P)
        self.u32 = ffi.new(_UINT_P)
        self.u64 = ffi.new(_ULL_P)
        self.quad = ffi.new("unsigned int[4]")
        self.enable_state = ffi.new("nvmlEnableState_t *")
        self.field_value = ffi.new("nvmlFieldValue_t[1]")
        self.proc_v2 = ffi.new(_PROC_V2_ARRAY, _INITIAL_CAPACITY * _HEADROOM)
        self.proc_v1 = ffi.new(_PROC_V1_ARRAY, _INITIAL_CAPACITY * _HEADROOM)


def _fail(rc: int, function: str, index: int | None) -> Exception:
    return error_class_for_code(rc)(rc, function, index)


class NvmlCalls:
    """Typed wrappers over one loaded libnvidia-ml. Thread-safe: buffers are allocated per call."""

    def __init__(self, loaded: LoadedLibrary) -> None:
        self._loaded = loaded
        self._buffers = _Buffers()
        sym = loaded.symbols
        self._memory_name = sym.memory
        self._memory_fn = self._bind(sym.memory)
        self.memory_is_v2 = sym.memory == "nvmlDeviceGetMemoryInfo_v2"
        #: ``memory(handle, index) -> Memory``: nvmlDeviceGetMemoryInfo_v2 (total, used, free, reserved), or the v1
        #: call on older drivers, where ``used`` includes the driver's reservation and ``reserved_bytes`` is
        #: ``None``. Bound once to the variant the library has: no per-call branching on the hot path.
        self.memory: Callable[[Handle, int], Memory]
        if self._memory_fn is None:
            self.memory = self._memory_missing
        else:
            self.memory = self._memory_v2 if self.memory_is_v2 else self._memory_v1
        # kind -> (symbol, function, uses the 16-byte v1 struct)
        self._process_fns: dict[ProcessKind, tuple[str, Callable[..., int] | None, bool]] = {}
        for kind in ProcessKind:
            name = sym.processes(kind)
            v1 = bool(name) and not str(name).endswith(("_v2", "_v3"))
            self._process_fns[kind] = (name or _PROCESS_WANTED[kind], self._bind(name), v1)
        self._clock_fns = {n: self._bind_optional(n) for n in _CLOCK_FUNCTIONS}
        self._reasons_fn = self._bind(sym.clock_event_reasons)
        self._health_fns = {n: self._bind_optional(n) for n in _HEALTH_FUNCTIONS}
        # Absent before driver 450 (no MIG): such a library answers "not in MIG mode", never a failure.
        self._mig_fns = {n: self._bind_optional(n) for n in _MIG_FUNCTIONS}
        # Absent from old drivers and from stub builds without them: events are then "not supported", never a failure.
        self._event_fns = {n: self._bind_optional(n) for n in EVENT_FUNCTIONS}

    def _bind(self, name: str | None) -> Callable[..., int] | None:
        return self._loaded.function(name) if name else None

    def _bind_optional(self, name: str) -> Callable[..., int] | None:
        try:
            return self._loaded.function(name)
        except AttributeError:
            return None

    def _require(self, name: str | None, wanted: str, index: int | None = None) -> Callable[..., int]:
        if name is None:
            raise FunctionNotFound(13, wanted, index, f"{self._loaded.path} does not export it (older driver)")
        return self._loaded.function(name)

    def _optional_symbol(self, name: str) -> Callable[..., int]:
        try:
            return self._loaded.function(name)
        except AttributeError:
            raise FunctionNotFound(13, name, None, f"{self._loaded.path} does not export it (older driver)") from None

    # --- system ---------------------------------------------------------------------------------------------------

    def _system_string(self, name: str) -> str:
        buf = ffi.new("char[]", _VERSION_BUFFER)
        rc = self._optional_symbol(name)(buf, _VERSION_BUFFER)
        if rc:
            raise _fail(rc, name, None)
        return str(ffi.string(buf).decode("utf-8", "replace"))

    def driver_version(self) -> str:
        """nvmlSystemGetDriverVersion, e.g. ``"580.159.04"``."""
        return self._system_string("nvmlSystemGetDriverVersion")

    def nvml_version(self) -> str:
        """nvmlSystemGetNVMLVersion, e.g. ``"13.580.159.04"``."""
        return self._system_string("nvmlSystemGetNVMLVersion")

    def cuda_driver_version(self) -> int:
        """nvmlSystemGetCudaDriverVersion_v2 (or the v1 name): 13000 means CUDA 13.0."""
        name = self._loaded.symbols.cuda_driver_version
        fn = self._require(name, "nvmlSystemGetCudaDriverVersion_v2")
        out = ffi.new("int *")
        rc = fn(out)
        if rc:
            raise _fail(rc, str(name), None)
        return int(out[0])

    def device_count(self) -> int:
        """nvmlDeviceGetCount_v2 (or the v1 name)."""
        name = self._loaded.symbols.device_count
        fn = self._require(name, "nvmlDeviceGetCount_v2")
        out = ffi.new("unsigned int *")
        rc = fn(out)
        if rc:
            raise _fail(rc, str(name), None)
        return int(out[0])

    def handle(self, index: int) -> Handle:
        """nvmlDeviceGetHandleByIndex_v2 (or the v1 name), or the handle an early start read for this
        initialisation (:meth:`~nvmlcheck._nvml.library.LoadedLibrary.handle_read_ahead`)."""
        ahead = self._loaded.handle_read_ahead(index)
        if ahead is not None:
            return Handle(ahead)
        name = self._loaded.symbols.handle_by_index
        fn = self._require(name, "nvmlDeviceGetHandleByIndex_v2", index)
        out = ffi.new("nvmlDevice_t *")
        rc = fn(index, out)
        if rc:
            raise _fail(rc, str(name), index)
        return Handle(out[0])

    # --- identity -------------------------------------------------------------------------------------------------

    def _device_string(self, name: str, handle: Handle, index: int, size: int) -> str:
        buf = ffi.new("char[]", size)
        rc = self._optional_symbol(name)(handle, buf, size)
        if rc:
            raise _fail(rc, name, index)
        return str(ffi.string(buf).decode("utf-8", "replace"))

    def name(self, handle: Handle, index: int) -> str:
        """nvmlDeviceGetName, e.g. ``"NVIDIA H200"``."""
        return self._device_string("nvmlDeviceGetName", handle, index, _STRING_BUFFER)

    def uuid(self, handle: Handle, index: int) -> str:
        """nvmlDeviceGetUUID, e.g. ``"GPU-acdc9db5-..."``."""
        return self._device_string("nvmlDeviceGetUUID", handle, index, _STRING_BUFFER)

    def serial(self, handle: Handle, index: int) -> str:
        """nvmlDeviceGetSerial (board serial number)."""
        return self._device_string("nvmlDeviceGetSerial", handle, index, _SERIAL_BUFFER)

    def minor_number(self, handle: Handle, index: int) -> int:
        """nvmlDeviceGetMinorNumber: the N of ``/dev/nvidiaN``."""
        out = ffi.new("unsigned int *")
        rc = self._optional_symbol("nvmlDeviceGetMinorNumber")(handle, out)
        if rc:
            raise _fail(rc, "nvmlDeviceGetMinorNumber", index)
        return int(out[0])

    def pci_bus_id(self, handle: Handle, index: int) -> str:
        """nvmlDeviceGetPciInfo_v3 ``busId``, e.g. ``"00000000:00:06.0"`` (nvidia-smi ``pci.bus_id``)."""
        name = self._loaded.symbols.pci_info
        fn = self._require(name, "nvmlDeviceGetPciInfo_v3", index)
        out = ffi.new("nvmlPciInfo_t *")
        rc = fn(handle, out)
        if rc:
            raise _fail(rc, str(name), index)
        return str(ffi.string(out.busId).decode("ascii", "replace"))

    # --- memory ---------------------------------------------------------------------------------------------------

    def _memory_v2(self, handle: Handle, index: int) -> Memory:
        buf = self._buffers.memory_v2
        rc = self._memory_fn(handle, buf)  # type: ignore[misc]
        if rc:
            if rc == NVML_ERROR_ARGUMENT_VERSION_MISMATCH and buf.version != _MEMORY_V2_VERSION:
                # The version is written once per buffer (it is input only); should anything have changed it,
                # write it again rather than report a mismatch that is ours.
                buf.version = _MEMORY_V2_VERSION
                return self._memory_v2(handle, index)
            raise _fail(rc, "nvmlDeviceGetMemoryInfo_v2", index)
        total, used, free, reserved = buf.total, buf.used, buf.free, buf.reserved
        if used > total or reserved > total:
            raise CorruptData(
                f"used {used} B / reserved {reserved} B exceed total {total} B", "nvmlDeviceGetMemoryInfo_v2", index
            )
        return _new_tuple(Memory, (total, used, free, reserved, False, 1))

    def _memory_v1(self, handle: Handle, index: int) -> Memory:
        buf = self._buffers.memory_v1
        rc = self._memory_fn(handle, buf)  # type: ignore[misc]
        if rc:
            raise _fail(rc, "nvmlDeviceGetMemoryInfo", index)
        total, used, free = buf.total, buf.used, buf.free
        if used > total:
            raise CorruptData(f"used {used} B exceeds total {total} B", "nvmlDeviceGetMemoryInfo", index)
        return _new_tuple(Memory, (total, used, free, None, True, 1))

    def _memory_missing(self, handle: Handle, index: int) -> Memory:
        raise FunctionNotFound(13, "nvmlDeviceGetMemoryInfo_v2", index, "the library exports no memory query")

    # --- processes ------------------------------------------------------------------------------------------------

    def process_symbol(self, kind: ProcessKind) -> str | None:
        """The C symbol answering ``kind``'s process list (``None`` if the library has none)."""
        name, fn, _v1 = self._process_fns[kind]
        return name if fn is not None else None

    def processes(self, handle: Handle, kind: ProcessKind, index: int, total_bytes: int) -> tuple[ProcessEntry, ...]:
        """One process list as ``(pid, used_bytes or None, gpu_instance_id, compute_instance_id)`` tuples.

        One call with a buffer of 64 entries answers the common case (instead of NVML's count-then-fill pair).
        When the list is longer, or grows between NVML's size answer and the fill, the call is retried with a
        larger buffer up to :data:`MAX_LIST_ATTEMPTS` times; the result is never truncated. Entries are validated
        against ``total_bytes`` and PID_MAX_LIMIT.
        """
        name, fn, v1 = self._process_fns[kind]
        if fn is None:
            raise FunctionNotFound(
                13, _PROCESS_WANTED[kind], index, f"{self._loaded.path} exports no {kind.value} process list"
            )
        buffers = self._buffers
        count = buffers.count
        capacity = _INITIAL_CAPACITY
        buf = buffers.proc_v1 if v1 else buffers.proc_v2
        for _attempt in range(MAX_LIST_ATTEMPTS):
            count[0] = capacity
            rc = fn(handle, count, buf)
            if rc == NVML_SUCCESS:
                n = count[0]
                if n == 0:
                    return ()
                if n > capacity:
                    raise CorruptData(f"returned {n} entries into a buffer of {capacity}", name, index)
                return tuple([_entry(buf[i], v1, name, index, total_bytes) for i in range(n)])
            if rc != NVML_ERROR_INSUFFICIENT_SIZE:
                raise _fail(rc, name, index)
            # The list grew (or our first guess was small): room for what NVML said plus slack for more growth.
            needed = count[0]
            capacity = max(capacity * 2, needed + needed // 4 + 8)
            buf = ffi.new(_PROC_V1_ARRAY if v1 else _PROC_V2_ARRAY, capacity * _HEADROOM)
        raise InsufficientSize(
            NVML_ERROR_INSUFFICIENT_SIZE,
            name,
            index,
            f"the process list kept growing across {MAX_LIST_ATTEMPTS} attempts (last size {count[0]}); "
            "refusing to return a truncated list",
        )

    # --- MIG ------------------------------------------------------------------------------------------------------

    def mig_mode(self, handle: Handle, index: int) -> bool:
        """nvmlDeviceGetMigMode's current mode: ``True`` when MIG is enabled. A GPU without MIG (NOT_SUPPORTED) and a
        driver without the symbol (before 450) are ``False``: not in MIG mode. Any other code raises."""
        fn = self._mig_fns["nvmlDeviceGetMigMode"]
        if fn is None:
            return False
        current = ffi.new(_UINT_P)
        pending = ffi.new(_UINT_P)
        rc = fn(handle, current, pending)
        if rc == NVML_ERROR_NOT_SUPPORTED:
            return False
        if rc:
            raise _fail(rc, "nvmlDeviceGetMigMode", index)
        return int(current[0]) == _NVML_DEVICE_MIG_ENABLE

    def mig_devices(self, handle: Handle, index: int) -> list[MigEntry]:
        """The MIG devices of a GPU in MIG mode, one :data:`MigEntry` per populated slot of
        nvmlDeviceGetMaxMigDeviceCount: nvmlDeviceGetMigDeviceHandleByIndex (NOT_FOUND: an empty slot), then on the
        MIG handle nvmlDeviceGetUUID, nvmlDeviceGetGpuInstanceId, nvmlDeviceGetComputeInstanceId and the memory
        query. A MIG handle whose parent (nvmlDeviceGetDeviceHandleFromMigDeviceHandle) is another GPU is corrupt.
        Values a MIG handle does not answer are ``None`` with the reason; a missing enumeration symbol raises
        :class:`~nvmlcheck.FunctionNotFound`."""
        fns = self._mig_fns
        count_fn = fns["nvmlDeviceGetMaxMigDeviceCount"]
        by_index = fns["nvmlDeviceGetMigDeviceHandleByIndex"]
        if count_fn is None or by_index is None:
            missing = "nvmlDeviceGetMaxMigDeviceCount" if count_fn is None else "nvmlDeviceGetMigDeviceHandleByIndex"
            raise FunctionNotFound(13, missing, index, f"{self._loaded.path} does not export it (older driver)")
        count = ffi.new(_UINT_P)
        rc = count_fn(handle, count)
        if rc:
            raise _fail(rc, "nvmlDeviceGetMaxMigDeviceCount", index)
        out: list[MigEntry] = []
        mig = ffi.new("nvmlDevice_t *")
        parent = ffi.new("nvmlDevice_t *")
        u32 = ffi.new(_UINT_P)
        for slot in range(int(count[0])):
            rc = by_index(handle, slot, mig)
            if rc == NVML_ERROR_NOT_FOUND:
                continue  # no MIG device in this slot
            if rc:
                raise _fail(rc, "nvmlDeviceGetMigDeviceHandleByIndex", index)
            mh = Handle(mig[0])
            unknown: dict[str, str] = {}
            up = fns["nvmlDeviceGetDeviceHandleFromMigDeviceHandle"]
            if up is not None and up(mh, parent) == NVML_SUCCESS and parent[0] != handle:
                raise CorruptData(
                    f"MIG device {slot} names another GPU as its parent",
                    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                    index,
                )
            uuid: str | None = None
            try:
                uuid = self.uuid(mh, index)
            except NvmlError as exc:
                unknown["uuid"] = f"nvmlDeviceGetUUID on the MIG handle: {exc}"
            ids: list[int | None] = []
            for name in ("nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId"):
                fn = fns[name]
                rc = fn(mh, u32) if fn is not None else NVML_ERROR_FUNCTION_NOT_FOUND
                if rc:
                    key = "gpu_instance_id" if "Gpu" in name else "compute_instance_id"
                    unknown[key] = f"{name} returned {rc}"
                    ids.append(None)
                else:
                    ids.append(int(u32[0]))
            memory: Memory | None = None
            try:
                memory = self.memory(mh, index)
            except NvmlError as exc:
                unknown["memory"] = f"the memory query on the MIG handle: {exc}"
            out.append((slot, uuid, ids[0], ids[1], memory, unknown))
        return out

    # --- clocks ---------------------------------------------------------------------------------------------------
    # A full snapshot reads 13 clock values and 3 health values. One method each, collecting (slot, symbol, code)
    # for what did not answer instead of raising per value, keeps it measurably cheaper on the stub, where a raise per
    # "not supported" value is most of the cost (docs/performance.md, "Building the model objects").

    def clock_mhz(self, handle: Handle, domain: int, index: int) -> int:
        """nvmlDeviceGetClockInfo: the current clock of ``domain`` (CLOCK_*), MHz."""
        fn = self._clock_fns["nvmlDeviceGetClockInfo"]
        if fn is None:
            raise FunctionNotFound(13, "nvmlDeviceGetClockInfo", index, f"{self._loaded.path} does not export it")
        out = self._buffers.u32
        rc = fn(handle, domain, out)
        if rc:
            raise _fail(rc, "nvmlDeviceGetClockInfo", index)
        return int(out[0])

    def clocks(
        self, handle: Handle, index: int, *, include_max: bool = True, include_applications: bool = True,
        include_reasons: bool = True,
    ) -> tuple[list[int | None], int | None, list[Unanswered]]:
        """Every clock: ``values`` holds current, max and applications clocks (nvmlDeviceGetClockInfo,
        nvmlDeviceGetMaxClockInfo, nvmlDeviceGetApplicationsClock) for graphics, SM, memory and video, in that
        order (12 values, MHz); then the event-reason bitmask (nvmlDeviceGetCurrentClocksEventReasons, or the
        older ...ThrottleReasons name).

        A value that cannot be read is ``None`` and listed in ``unanswered`` as ``(slot, symbol, code)`` (slot 12
        is the reason mask); codes that make the whole device unusable (GPU lost, reset required, ...) raise.
        ``include_max=False`` skips the four max clocks (``None``, not listed): they never change, and each
        nvmlDeviceGetMaxClockInfo call can cost milliseconds (docs/performance.md), so callers read them once.
        ``include_applications=False`` skips the four application clocks the same way (~0.8 ms each), and
        ``include_reasons=False`` the reason mask (its first call in a process costs ~1.4 ms on an H200).
        """
        out = self._buffers.u32
        values: list[int | None] = []
        unanswered: list[Unanswered] = []
        slot = 0
        for name in _CLOCK_FUNCTIONS:
            fn = self._clock_fns[name]
            if (not include_max and name == "nvmlDeviceGetMaxClockInfo") or (
                not include_applications and name == "nvmlDeviceGetApplicationsClock"
            ):
                values.extend((None, None, None, None))
                slot += 4
                continue
            for domain in _CLOCK_DOMAINS:
                rc = fn(handle, domain, out) if fn is not None else NVML_ERROR_FUNCTION_NOT_FOUND
                if rc == NVML_SUCCESS:
                    values.append(int(out[0]))
                elif rc not in _DEVICE_LEVEL_CODES:
                    values.append(None)
                    unanswered.append((slot, name, rc))
                else:
                    raise _fail(rc, name, index)
                slot += 1
        if not include_reasons:
            return values, None, unanswered
        reasons_name = self._loaded.symbols.clock_event_reasons
        reasons: int | None = None
        if reasons_name is None:
            unanswered.append((slot, "nvmlDeviceGetCurrentClocksEventReasons", NVML_ERROR_FUNCTION_NOT_FOUND))
        else:
            name = reasons_name
            mask = self._buffers.u64
            rc = self._reasons_fn(handle, mask)  # type: ignore[misc]
            if rc == NVML_SUCCESS:
                reasons = int(mask[0])
            elif rc not in _DEVICE_LEVEL_CODES:
                unanswered.append((slot, name, rc))
            else:
                raise _fail(rc, name, index)
        return values, reasons, unanswered

    # --- memory health --------------------------------------------------------------------------------------------

    def health(self, handle: Handle, index: int) -> tuple[Health, list[Unanswered]]:
        """The GPU's :class:`~nvmlcheck.model.Health`: retired pages of both causes (nvmlDeviceGetRetiredPages_v2
        with timestamps, or the v1 call), the pending flag (nvmlDeviceGetRetiredPagesPendingStatus), remapped rows
        (nvmlDeviceGetRemappedRows), the uncorrected ECC totals, volatile and aggregate
        (nvmlDeviceGetTotalEccErrors), and the recovery action (nvmlDeviceGetFieldValues with
        NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).

        Each is ``None`` when it cannot be read (Hopper retires no pages: it remaps rows; ECC counters need ECC on;
        the recovery action needs a driver that has the field), listed in ``unanswered`` as ``(slot, symbol,
        code)`` with slot 0 pages, 1 pending, 2 remapped rows, 3 volatile ECC, 4 aggregate ECC, 5 recovery action
        (:data:`HEALTH_SLOTS`); codes that make the whole device unusable raise.
        """
        unanswered: list[Unanswered] = []
        pages: tuple[RetiredPage, ...] | None = None
        name = self._loaded.symbols.retired_pages
        if name is None:
            unanswered.append((0, "nvmlDeviceGetRetiredPages_v2", NVML_ERROR_FUNCTION_NOT_FOUND))
        else:
            found: list[RetiredPage] = []
            for cause in (model.RetirementCause.MULTIPLE_SINGLE_BIT_ECC, model.RetirementCause.DOUBLE_BIT_ECC):
                rc = self._retired_pages(handle, name, cause, index, found)
                if rc:
                    unanswered.append((0, name, rc))
                    break
            else:
                pages = tuple(found)
        pending: bool | None = None
        out = self._buffers.enable_state
        fn = self._health_fns["nvmlDeviceGetRetiredPagesPendingStatus"]
        rc = fn(handle, out) if fn is not None else NVML_ERROR_FUNCTION_NOT_FOUND
        if _answered(rc, 1, "nvmlDeviceGetRetiredPagesPendingStatus", index, unanswered):
            pending = bool(out[0])
        rows: RemappedRows | None = None
        quad = self._buffers.quad
        fn = self._health_fns["nvmlDeviceGetRemappedRows"]
        rc = fn(handle, quad, quad + 1, quad + 2, quad + 3) if fn is not None else NVML_ERROR_FUNCTION_NOT_FOUND
        if _answered(rc, 2, "nvmlDeviceGetRemappedRows", index, unanswered):
            rows = model.RemappedRows(int(quad[0]), int(quad[1]), bool(quad[2]), bool(quad[3]))
        ecc: list[int | None] = [None, None]
        count = self._buffers.u64
        fn = self._health_fns["nvmlDeviceGetTotalEccErrors"]
        for slot, counter in ((3, _NVML_VOLATILE_ECC), (4, _NVML_AGGREGATE_ECC)):
            rc = fn(handle, _NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter, count) if fn is not None else (
                NVML_ERROR_FUNCTION_NOT_FOUND
            )
            if _answered(rc, slot, "nvmlDeviceGetTotalEccErrors", index, unanswered):
                ecc[slot - 3] = int(count[0])
        action = self._recovery_action(handle, index, unanswered)
        return model.Health(pages, pending, rows, ecc[0], ecc[1], action), unanswered

    def _recovery_action(self, handle: Handle, index: int, unanswered: list[Unanswered]) -> RecoveryAction | None:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION through nvmlDeviceGetFieldValues (slot 5). A driver that does not
        know the field answers NOT_SUPPORTED or INVALID_ARGUMENT in the value's own return code: unknown."""
        fn = self._health_fns["nvmlDeviceGetFieldValues"]
        values = self._buffers.field_value
        value = values[0]
        value.fieldId = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
        value.scopeId = 0
        value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
        rc = fn(handle, 1, values) if fn is not None else NVML_ERROR_FUNCTION_NOT_FOUND
        if rc == NVML_SUCCESS:
            rc = value.nvmlReturn
        if not _answered(rc, 5, _RECOVERY_SYMBOL, index, unanswered):
            return None
        action = recovery_action_of(value)
        if isinstance(action, str):
            unanswered.append((5, action, REASON_GIVEN))
            return None
        return action

    def _retired_pages(
        self, handle: Handle, name: str, cause: RetirementCause, index: int, found: list[RetiredPage]
    ) -> int:
        """Append one cause's retired pages to ``found``; returns 0, or the code that left them unknown."""
        fn = self._loaded.function(name)
        v2 = name == "nvmlDeviceGetRetiredPages_v2"
        c_cause = 0 if cause is model.RetirementCause.MULTIPLE_SINGLE_BIT_ECC else 1
        count = self._buffers.count
        capacity = 0
        for _attempt in range(MAX_LIST_ATTEMPTS):
            count[0] = capacity
            addresses = ffi.new(_ULL_ARRAY, max(capacity, 1))
            stamps = ffi.new(_ULL_ARRAY, max(capacity, 1))
            rc = fn(handle, c_cause, count, addresses, stamps) if v2 else fn(handle, c_cause, count, addresses)
            if rc == NVML_SUCCESS:
                n = min(count[0], capacity)
                page = model.RetiredPage
                found.extend(page(int(addresses[i]), cause, int(stamps[i]) if v2 else None) for i in range(n))
                return 0
            if rc == NVML_ERROR_INSUFFICIENT_SIZE:
                capacity = count[0] + 8
                continue
            if rc not in _DEVICE_LEVEL_CODES:
                return int(rc)
            raise _fail(rc, name, index)
        raise InsufficientSize(NVML_ERROR_INSUFFICIENT_SIZE, name, index, "the retired page list kept growing")


#: A received event: (device handle as an integer address, nvmlEventType bits, eventData, gi, ci; ids None outside MIG).
EventRecord = tuple[int, int, int, "int | None", "int | None"]


def handle_address(handle: object) -> int:
    """The address of a device handle: how an event's ``device`` is matched to the handle a listener registered."""
    return int(ffi.cast("uintptr_t", handle))


class EventCalls:
    """The NVML event calls over one loaded library (nvmlEventSetCreate, nvmlDeviceGetSupportedEventTypes,
    nvmlDeviceRegisterEvents, nvmlEventSetWait_v2, nvmlEventSetFree). Every one is optional: :attr:`missing` names
    the first symbol the library lacks (then nothing else may be called)."""

    def __init__(self, calls: NvmlCalls) -> None:
        self._fns = calls._event_fns
        self._path = calls._loaded.path
        self.missing: str | None = next((n for n in EVENT_FUNCTIONS if self._fns[n] is None), None)
        self._data = ffi.new("nvmlEventData_t *")  # used by the one listener thread only

    def _fn(self, name: str) -> Callable[..., int]:
        fn = self._fns[name]
        if fn is None:
            raise FunctionNotFound(13, name, None, f"{self._path} does not export it (older driver)")
        return fn

    def create(self) -> object:
        """nvmlEventSetCreate: a new event set (an opaque cffi pointer)."""
        out = ffi.new("nvmlEventSet_t *")
        rc = self._fn("nvmlEventSetCreate")(out)
        if rc:
            raise _fail(rc, "nvmlEventSetCreate", None)
        return out[0]

    def supported(self, handle: Handle, index: int) -> int:
        """nvmlDeviceGetSupportedEventTypes: the nvmlEventType bits the device can deliver."""
        out = ffi.new(_ULL_P)
        rc = self._fn("nvmlDeviceGetSupportedEventTypes")(handle, out)
        if rc:
            raise _fail(rc, "nvmlDeviceGetSupportedEventTypes", index)
        return int(out[0])

    def register(self, handle: Handle, index: int, mask: int, event_set: object) -> None:
        """nvmlDeviceRegisterEvents: deliver ``mask``'s events of the device to ``event_set``."""
        rc = self._fn("nvmlDeviceRegisterEvents")(handle, mask, event_set)
        if rc:
            raise _fail(rc, "nvmlDeviceRegisterEvents", index)

    def wait(self, event_set: object, timeout_ms: int) -> EventRecord | None:
        """nvmlEventSetWait_v2: the next event, or ``None`` when none came within ``timeout_ms`` (NVML_ERROR_TIMEOUT,
        which NVML also answers when a signal interrupted the wait). Other codes raise."""
        data = self._data
        rc = self._fn("nvmlEventSetWait_v2")(event_set, data, timeout_ms)
        if rc == NVML_ERROR_TIMEOUT:
            return None
        if rc:
            raise _fail(rc, "nvmlEventSetWait_v2", None)
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return (
            handle_address(data.device),
            int(data.eventType),
            int(data.eventData),
            None if gi == NOT_MIG_U32 else gi,
            None if ci == NOT_MIG_U32 else ci,
        )

    def free(self, event_set: object) -> int:
        """nvmlEventSetFree; returns its code (a set that cannot be freed leaves nothing for the caller to do)."""
        return int(self._fn("nvmlEventSetFree")(event_set))


# Memory is a named tuple: tuple.__new__ skips its Python-level __new__ (the poll path builds one per GPU).
_new_tuple = tuple.__new__
_CLOCK_FUNCTIONS = ("nvmlDeviceGetClockInfo", "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetApplicationsClock")
_CLOCK_DOMAINS = (CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO)
_HEALTH_FUNCTIONS = (
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetFieldValues",
)
#: The parts :meth:`NvmlCalls.health` reports by slot in ``unanswered`` (the model's field names).
HEALTH_SLOTS = (
    "retired_pages",
    "retired_pages_pending",
    "remapped_rows",
    "ecc_uncorrected_volatile",
    "ecc_uncorrected_aggregate",
    "recovery_action",
)
# nvml.h: nvmlMemoryErrorType_t, nvmlEccCounterType_t, nvmlValueType_t, the recovery action's field id.
_NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
_NVML_VOLATILE_ECC, _NVML_AGGREGATE_ECC = 0, 1
#: nvmlValueType_t of the integer types, by the union member that holds each: unsigned int, unsigned long, unsigned
#: long long, signed long long, signed int, unsigned short. A double (0) or a type a newer header adds is none of them.
_INTEGER_MEMBERS = {1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
#: The ``code`` of an :data:`Unanswered` whose ``symbol`` is already the whole reason (no NVML code says it).
REASON_GIVEN = -1


def recovery_action_of(value: Any) -> RecoveryAction | str:
    """The :class:`~nvmlcheck.model.RecoveryAction` in an answered ``nvmlFieldValue_t``, or why it cannot be told:
    a value type that is not an integer (the union's bits would read as some action, ``NONE`` for a double's 1.0),
    or an integer outside ``nvmlDeviceGpuRecoveryAction_t``'s 32 bits (masking it could make it ``NONE``)."""
    kind = int(value.valueType)
    member = _INTEGER_MEMBERS.get(kind)
    if member is None:
        return (f"unreadable: {_RECOVERY_SYMBOL} answered a value of type {kind}, not an integer type: which action "
                "the driver asks for cannot be told")
    raw = int(getattr(value.value, member))
    if not 0 <= raw <= 0xFFFFFFFF:
        return (f"unreadable: {_RECOVERY_SYMBOL} answered {raw}, outside the 32-bit nvmlDeviceGpuRecoveryAction_t: "
                "which action the driver asks for cannot be told")
    return model.RecoveryAction(raw)
_RECOVERY_SYMBOL = "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"
_MIG_FUNCTIONS = (
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
)
#: The event symbols, all optional (events.py).
EVENT_FUNCTIONS = (
    "nvmlEventSetCreate",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)
_NVML_DEVICE_MIG_ENABLE = 1
_PROCESS_WANTED = {
    ProcessKind.COMPUTE: "nvmlDeviceGetComputeRunningProcesses_v3",
    ProcessKind.GRAPHICS: "nvmlDeviceGetGraphicsRunningProcesses_v3",
    ProcessKind.MPS: "nvmlDeviceGetMPSComputeRunningProcesses_v3",
}


def _answered(rc: int, slot: int, symbol: str, index: int, unanswered: list[Unanswered]) -> bool:
    """Whether an optional health read succeeded; else note it in ``unanswered``, or raise when ``rc`` makes the
    whole device unusable."""
    if rc == NVML_SUCCESS:
        return True
    if rc in _DEVICE_LEVEL_CODES:
        raise _fail(rc, symbol, index)
    unanswered.append((slot, symbol, rc))
    return False


def _entry(e: Any, v1: bool, name: str, index: int, total_bytes: int) -> ProcessEntry:
    pid = e.pid
    if pid == 0 or pid > PID_MAX_LIMIT:
        raise CorruptData(f"process entry with impossible PID {pid}", name, index)
    used = e.usedGpuMemory
    if used == NOT_AVAILABLE_U64:
        used_bytes: int | None = None
    elif used > total_bytes:
        raise CorruptData(f"PID {pid} reported with {used} B, more than the device's {total_bytes} B", name, index)
    else:
        used_bytes = used
    if v1:
        return (pid, used_bytes, None, None)
    gi, ci = e.gpuInstanceId, e.computeInstanceId
    return (pid, used_bytes, None if gi == NOT_MIG_U32 else gi, None if ci == NOT_MIG_U32 else ci)
