"""The scenario language of the stub libnvidia-ml: :class:`Scenario` writes the text file the stub (and the fake
nvidia-smi) read, validating every value; the format is ``stubs/README.md`` (version 1)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..errors import ArgumentError, ArgumentTypeError
from .symbols import DEVICE_FUNCTIONS, NVML_FUNCTIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..model import ProcessKind

__all__ = [
    "CLOCK_DOMAINS",
    "DEVICE_FIELDS",
    "EVENT_KINDS",
    "PROCESS_KINDS",
    "UNSUPPORTED_FIELDS",
    "ClockDomain",
    "EventKindName",
    "ProcessKindName",
    "Scenario",
    "TimelineStep",
]

# How a scenario spells a process kind; nvmlcheck.ProcessKind (the model's enum, a str) is accepted as well.
ProcessKindName = Literal["compute", "graphics", "mps"]
ClockDomain = Literal["graphics", "sm", "mem", "video"]

#: Process kinds of the scenario format (``process kind=``).
PROCESS_KINDS: tuple[ProcessKindName, ...] = ("compute", "graphics", "mps")
#: Clock domains, in nvmlClockType_t order (graphics 0, sm 1, mem 2, video 3).
CLOCK_DOMAINS: tuple[ClockDomain, ...] = ("graphics", "sm", "mem", "video")

#: Field names accepted by ``unsupported=`` (their calls return NVML_ERROR_NOT_SUPPORTED).
UNSUPPORTED_FIELDS: frozenset[str] = frozenset(
    {"name", "uuid", "serial", "minor", "pci", "memory", "reasons", "retired_pages", "retired_pending", "remapped"}
    | {"mig", "events", "ecc", "recovery"}
    | {f"processes.{kind}" for kind in PROCESS_KINDS}
    | {f"{group}.{domain}" for group in ("clock", "max", "app") for domain in CLOCK_DOMAINS}
)

_U64_MAX = 2**64 - 1
_U32_MAX = 2**32 - 1
_INT_MAX = 2**31 - 1


def _quote(value: str) -> str:
    """A scenario value: bare when it can be, else double-quoted with ``\\"`` and ``\\\\`` escapes."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ArgumentError(f"scenario values cannot contain newlines or NUL bytes: {value!r}")
    if value and not any(c in value for c in ' \t"#\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _check_int(name: str, value: object, maximum: int = _U64_MAX, minimum: int = 0) -> int:
    """``value`` as a plain int, checked. Callers render the returned int, never ``value``: a subclass of int (an
    IntEnum, a numpy-like wrapper) may format itself as anything, and the scenario must say what was checked."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be an int, not {type(value).__name__}")
    value = int.__index__(value)  # the plain int, whatever the subclass's __str__/__format__/__int__ say
    if value < minimum:
        raise ArgumentError(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise ArgumentError(f"{name} must be <= {maximum}, got {value}")
    return value


def _check_str(name: str, value: object, max_bytes: int) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name} must be a str, not {type(value).__name__}")
    value = str.__getitem__(value, slice(None)) if type(value) is not str else value  # a plain str (see _check_int)
    if len(value.encode()) > max_bytes:
        raise ArgumentError(f"{name} is longer than {max_bytes} bytes (NVML's buffer): {value!r}")
    _quote(value)
    return value


def _check_text(name: str, value: object, max_bytes: int, *, empty: bool = True) -> str:
    """A string NVML reports that nvidia-smi prints too (a name, serial, version): no whitespace at either end, which
    nvidia-smi's columns cannot carry (its reader strips it, NVML's keeps it: the backends would disagree); empty
    only where ``empty``."""
    text = _check_str(name, value, max_bytes)
    if text != text.strip():
        raise ArgumentError(f"{name} cannot begin or end with whitespace (nvidia-smi's output loses it, so the two "
                            f"backends would read different values): {text!r}")
    if not text and not empty:
        raise ArgumentError(f"{name} cannot be empty (no driver reports an empty one; NVML would read '' where "
                            "nvidia-smi reads nothing)")
    return text


def _check_kind(kind: object) -> str:
    name = getattr(kind, "value", kind)  # nvmlcheck.ProcessKind.COMPUTE is "compute"
    for known in PROCESS_KINDS:
        if isinstance(name, str) and name == known:
            return known  # the constant, not a str subclass that might render itself otherwise
    raise ArgumentError(f"unknown process kind {kind!r}; expected one of {PROCESS_KINDS}")


_PCI_BUS_ID = re.compile(r"([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,8})\.([0-9A-Fa-f]{1,8})")


def _check_pci(value: object) -> str:
    text = _check_str("pci_bus_id", value, 31)
    match = _PCI_BUS_ID.fullmatch(text)
    if not match:
        raise ArgumentError(f"pci_bus_id must look like 00000000:06:00.0 (hex domain:bus:device.function): {text!r}")
    _domain, bus, device, function = (int(part, 16) for part in match.groups())
    if bus > 0xFF or device > 0x1F or function > 7:
        raise ArgumentError(f"pci_bus_id out of range (bus <= ff, device <= 1f, function <= 7): {text!r}")
    return text


# What NVML reports (GPU-8-4-4-4-12 hex digits; MIG-... or, before driver 470, MIG-GPU-<uuid>/<gi>/<ci>), loosely:
# the same shapes nvidia-smi's reader accepts, so that both backends read a scenario's UUIDs alike.
_GPU_UUID = re.compile(r"GPU-[0-9A-Za-z-]+")
_MIG_UUID = re.compile(r"MIG-[0-9A-Za-z/-]+")


def _check_uuid(name: str, value: object, mig: bool) -> str:
    text = _check_str(name, value, 95)
    pattern, example = (_MIG_UUID, "MIG-5f0a0000-0000-5000-8000-000000000000") if mig else (
        _GPU_UUID, "GPU-acdc9db5-97f7-57e3-53d2-3061aececeec")
    if pattern.fullmatch(text) is None:
        raise ArgumentError(f"{name} must look like {example} (letters, digits and '-' after the prefix, as NVML "
                            f"writes them; nvidia-smi's reader refuses other forms): {text!r}")
    return text


def _default_uuid(key: tuple[int, ...]) -> str:
    """The stub's default UUID of a GPU (``(index,)``) or MIG device (``(device, index)``): stubs/README.md."""
    if len(key) == 1:
        return f"GPU-00000000-0000-0000-0000-{key[0]:012x}"
    return f"MIG-00000000-0000-0000-{key[0]:04x}-{key[1]:012x}"


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


#: Keyword arguments of :meth:`Scenario.add_device` / ``set_device`` and the scenario keys they write.
DEVICE_FIELDS: Mapping[str, str] = {
    "name": "name",
    "uuid": "uuid",
    "serial": "serial",
    "pci_bus_id": "pci",
    "pci_device_id": "pci.device_id",
    "pci_subsystem_id": "pci.subsystem_id",
    "minor": "minor",
    "total_bytes": "total",
    "reserved_bytes": "reserved",
    "used_bytes": "used",
    "clocks_mhz": "clock.<domain>",
    "max_clocks_mhz": "max.<domain>",
    "app_clocks_mhz": "app.<domain>",
    "clock_event_reasons": "reasons",
    "retired_pages": "retired",
    "retired_pending": "retired_pending",
    "remapped_rows": "remapped",
    "ecc_uncorrected_volatile": "ecc_volatile",
    "ecc_uncorrected_aggregate": "ecc_aggregate",
    "recovery_action": "recovery",
    "unsupported": "unsupported",
    "lost": "lost",
    "mig": "mig",
    "event_types": "event_types",
}


#: The event kinds :meth:`TimelineStep.raise_event` names (``nvmlEventType`` bits 0x8, 0x1, 0x2, 0x4, 0x10, 0x80,
#: then 0x100 to 0x8000 in this order); any other type is given as a number.
EVENT_KINDS = ("xid", "sbe", "dbe", "pstate", "clock", "power", "mig", "sbe_storm", "dram_retirement",
               "dram_retirement_failure", "nonfatal_poison", "fatal_poison", "gpu_unavailable", "recovery_action")
EventKindName = Literal["xid", "sbe", "dbe", "pstate", "clock", "power", "mig", "sbe_storm", "dram_retirement",
                        "dram_retirement_failure", "nonfatal_poison", "fatal_poison", "gpu_unavailable",
                        "recovery_action"]


def _event_bits(name: str, value: object, *, allow_zero: bool = False) -> int:
    """``nvmlEventType`` bits: an int (not a bool), 64 bits at most; nonzero unless ``allow_zero``."""
    bits = _check_int(name, value, _U64_MAX)
    if not bits and not allow_zero:
        raise ArgumentError(f"{name} must name at least one event type bit, got 0")
    return bits


def _render_device_fields(fields: Mapping[str, object]) -> list[str]:
    """Map the keyword arguments of :meth:`Scenario.add_device` to ``key=value`` strings, validating them."""
    out: list[str] = []
    for name, value in fields.items():
        if name == "name":
            out.append("name=" + _quote(_check_text(name, value, 63)))
        elif name == "uuid":
            out.append("uuid=" + _quote(_check_uuid(name, value, mig=False)))
        elif name == "serial":
            out.append("serial=" + _quote(_check_text(name, value, 29)))
        elif name == "pci_bus_id":
            out.append("pci=" + _check_pci(value))
        elif name == "pci_device_id":
            out.append(f"pci.device_id={_check_int(name, value, _U32_MAX):#x}")
        elif name == "pci_subsystem_id":
            out.append(f"pci.subsystem_id={_check_int(name, value, _U32_MAX):#x}")
        elif name == "minor":
            out.append(f"minor={_check_int(name, value, _U32_MAX)}")
        elif name in ("total_bytes", "reserved_bytes", "used_bytes"):
            out.append(f"{name.removesuffix('_bytes')}={_check_int(name, value)}")
        elif name in ("clocks_mhz", "max_clocks_mhz", "app_clocks_mhz"):
            group = {"clocks_mhz": "clock", "max_clocks_mhz": "max", "app_clocks_mhz": "app"}[name]
            if not isinstance(value, Mapping):
                raise ArgumentTypeError(f"{name} must be a mapping of clock domain to MHz, e.g. {{'sm': 1980}}")
            for domain, mhz in value.items():
                if domain not in CLOCK_DOMAINS:
                    raise ArgumentError(f"{name}: unknown clock domain {domain!r}; expected one of {CLOCK_DOMAINS}")
                out.append(f"{group}.{domain}={_check_int(f'{name}[{domain!r}]', mhz, _U32_MAX)}")
        elif name == "clock_event_reasons":
            out.append(f"reasons={_check_int(name, value):#x}")
        elif name == "event_types":
            out.append(f"event_types={_event_bits(name, value):#x}")
        elif name == "retired_pages":
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise ArgumentTypeError("retired_pages must be a sequence of (cause, address, timestamp) tuples")
            pages: list[str] = []
            for page in value:
                if not isinstance(page, tuple) or len(page) != 3:
                    raise ArgumentTypeError(
                        f"retired_pages entries are (cause, address, timestamp) tuples, got {page!r}")
                cause, address, timestamp = page
                if not isinstance(cause, str) or cause not in ("sbe", "dbe"):
                    raise ArgumentError(f"retired page cause must be 'sbe' or 'dbe', got {cause!r}")
                pages.append(
                    f"{'sbe' if cause == 'sbe' else 'dbe'}:{_check_int('retired page address', address):#x}"
                    f"@{_check_int('retired page timestamp', timestamp)}"
                )
            out.append("retired=" + _quote(",".join(pages)))
        elif name == "retired_pending":
            out.append(f"retired_pending={int(_check_bool(name, value))}")
        elif name == "remapped_rows":
            if not isinstance(value, tuple) or len(value) != 4:
                raise ArgumentTypeError("remapped_rows must be a tuple (correctable, uncorrectable, pending, failure)")
            labels = ("correctable", "uncorrectable", "pending", "failure")
            numbers = [
                _check_int(f"remapped_rows {label}", int(v) if isinstance(v, bool) else v, _U32_MAX)
                for label, v in zip(labels, value, strict=True)
            ]
            out.append("remapped=" + ",".join(map(str, numbers)))
        elif name in ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"):
            out.append(f"{DEVICE_FIELDS[name]}={_check_int(name, value)}")
        elif name == "recovery_action":
            out.append(f"recovery={_check_int(name, int(value) if isinstance(value, int) else value, _U32_MAX)}")
        elif name == "unsupported":
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise ArgumentTypeError("unsupported must be an iterable of field names, e.g. ('retired_pages',)")
            items = list(value)
            wrong = [n for n in items if not isinstance(n, str)]
            if wrong:
                raise ArgumentTypeError(f"unsupported field names must be str, got {wrong[0]!r}")
            names = list(dict.fromkeys(_check_str("unsupported field", n, 255) for n in items))
            bad = [n for n in names if n not in UNSUPPORTED_FIELDS]
            if bad:
                raise ArgumentError(f"unknown unsupported field(s) {bad}; known: {sorted(UNSUPPORTED_FIELDS)}")
            out.append("unsupported=" + _quote(",".join(names)))
        elif name in ("lost", "mig"):
            out.append(f"{name}={int(_check_bool(name, value))}")
        else:
            raise ArgumentTypeError(f"unknown device field {name!r}; known: {sorted(DEVICE_FIELDS)}")
    return out


class _Changes:
    """The changes a scenario line can make; shared by :class:`Scenario` (initial state) and :class:`TimelineStep`."""

    def _emit(self, line: str) -> None:
        raise NotImplementedError

    def _device_count(self) -> int:
        raise NotImplementedError

    def _uuids(self) -> dict[tuple[int, ...], str]:
        """The UUID each GPU (``(index,)``) and MIG device (``(device, index)``) has set explicitly so far."""
        raise NotImplementedError

    def _claim_uuid(self, key: tuple[int, ...], uuid: str | None) -> None:
        """Refuse ``uuid`` for ``key`` when another GPU or MIG device has it (set, or the stub's default): no host has
        two devices of one UUID, and the backends would not agree on one (NVML lists both, nvidia-smi's reader
        refuses the second row). ``None``: ``key`` keeps (or gets) its default."""
        uuids = self._uuids()
        wanted = uuid if uuid is not None else uuids.get(key, _default_uuid(key))
        gpus = [(i,) for i in range(self._device_count())]
        migs = [k for k in uuids if len(k) == 2]
        for other in dict.fromkeys([*gpus, *migs]):
            if other != key and uuids.get(other, _default_uuid(other)) == wanted:
                what = f"GPU {other[0]}" if len(other) == 1 else f"MIG device {other[1]} of GPU {other[0]}"
                raise ArgumentError(f"UUID {wanted} is already {what}'s: every GPU and MIG device needs its own")
        uuids[key] = wanted

    def _mig_ids(self) -> dict[tuple[int, int], tuple[int, int]]:
        """The (GPU instance, compute instance) ids of each MIG device ``(device, index)`` declared so far."""
        raise NotImplementedError

    def _claim_mig_ids(self, key: tuple[int, int], gi: int, ci: int) -> None:
        """Refuse ``gi``/``ci`` for MIG device ``key`` when another MIG device of the GPU has them: a pair names one
        MIG device, and the backends would count the processes of the instance on both (and list them twice)."""
        ids = self._mig_ids()
        for other, pair in ids.items():
            if other != key and other[0] == key[0] and pair == (gi, ci):
                raise ArgumentError(f"MIG device {other[1]} of GPU {key[0]} already has gi={gi} ci={ci}: every MIG "
                                    "device of a GPU is its own (GPU instance, compute instance) pair")
        ids[key] = (gi, ci)

    def _mig_capable(self) -> set[int]:
        """The GPUs given ``mig=True`` so far (in the initial state or any timeline step)."""
        raise NotImplementedError

    def _check_mig_gpu(self, device: int, what: str) -> None:
        """Refuse ``what`` on a GPU that no call so far put in MIG mode: the stub and nvidia-smi would accept it and
        never show it (a MIG device answers only while its GPU has ``mig=1``)."""
        if device not in self._mig_capable():
            raise ArgumentError(f"{what}: GPU {device} is not in MIG mode; give it mig=True first "
                                f"(set_device({device}, mig=True), in the initial state or in the timeline step "
                                "that turns MIG on)")

    def _check_device(self, device: object, what: str = "device") -> int:
        index = _check_int(what, device, _U32_MAX)
        if index >= self._device_count():
            raise ArgumentError(f"{what} {index} does not exist (the scenario has {self._device_count()} device(s))")
        return index

    def set_device(self, index: int, **fields: object) -> None:
        """Change fields of an existing device (same keyword arguments as :meth:`Scenario.add_device`)."""
        index = self._check_device(index, "device index")
        rendered = _render_device_fields(fields)
        if "uuid" in fields:
            self._claim_uuid((index,), _check_str("uuid", fields["uuid"], 95))
        if fields.get("mig") is True:
            self._mig_capable().add(index)
        self._emit(" ".join([f"device index={index}", *rendered]))

    def add_process(
        self,
        device: int,
        pid: int,
        kind: ProcessKind | ProcessKindName = "compute",
        used_bytes: int | None = 0,
        *,
        holds_bytes: int | None = None,
        bound: bool = False,
        release_ms: int = 0,
        list_ms: int = 0,
        zombie_holds: bool = False,
        gi: int | None = None,
        ci: int | None = None,
    ) -> None:
        """Add a process to a device's list (or change the entry with the same device, kind and pid).

        Args:
            device: device index.
            pid: the PID NVML reports (4_000_000..4_194_304 are safe fakes; above 4_194_304 are impossible PIDs).
            kind: ``"compute"``, ``"graphics"`` or ``"mps"`` (which process-list call reports it), or a
                :class:`nvmlcheck.ProcessKind`.
            used_bytes: ``usedGpuMemory``; ``None`` for NVML's "not available" sentinel (``used=na``).
            holds_bytes: what the process adds to the device's used memory (default: ``used_bytes``, 0 when None).
            bound: tie the entry to the real process ``pid``: listed while it lives (see README).
            release_ms: with ``bound``: ms after its exit is noticed until its memory is released.
            list_ms: with ``bound``: ms after its exit is noticed until it leaves the list.
            zombie_holds: with ``bound``: an unreaped zombie still counts as alive.
            gi, ci: MIG GPU / compute instance ids (default 0xFFFFFFFF, "not MIG").
        """
        dev = self._check_device(device)
        parts = [
            f"process device={dev}",
            f"kind={_check_kind(kind)}",
            f"pid={_check_int('pid', pid, _U32_MAX)}",
            "used=na" if used_bytes is None else f"used={_check_int('used_bytes', used_bytes, _U64_MAX - 1)}",
        ]
        if holds_bytes is not None:
            parts.append(f"holds={_check_int('holds_bytes', holds_bytes)}")
        if gi is not None:
            parts.append(f"gi={_check_int('gi', gi, _U32_MAX)}")
        if ci is not None:
            parts.append(f"ci={_check_int('ci', ci, _U32_MAX)}")
        _check_bool("bound", bound)
        _check_bool("zombie_holds", zombie_holds)
        release_ms = _check_int("release_ms", release_ms)
        list_ms = _check_int("list_ms", list_ms)
        if bound:
            parts.append(f"bound=1 release_ms={release_ms} list_ms={list_ms}")
            if zombie_holds:
                parts.append("zombie_holds=1")
        elif release_ms or list_ms or zombie_holds:
            raise ArgumentError("release_ms, list_ms and zombie_holds need bound=True")
        self._emit(" ".join(parts))

    def add_mig_device(
        self,
        device: int,
        index: int,
        *,
        gi: int | None = None,
        ci: int = 0,
        uuid: str | None = None,
        total_bytes: int = 0,
        used_bytes: int = 0,
    ) -> None:
        """Add (or change) MIG device ``index`` (0..6) of GPU ``device``; it answers while the GPU has ``mig=True``,
        which an earlier call must have given it (in the initial state or a timeline step). Its ``gi``/``ci`` pair
        must not be another MIG device's of the GPU.

        Args:
            gi, ci: its GPU / compute instance ids (default ``index + 1`` and 0); processes added with the same
                ``gi`` (and ``ci``) run in it: listed on the parent, their ``holds`` counted in its memory too.
            uuid: its ``MIG-...`` UUID (default ``MIG-00000000-0000-0000-<device>-<index>``).
            total_bytes, used_bytes: its memory (``used_bytes``: what it reads with no process).
        """
        idx = _check_int("index", index, 6)
        dev = self._check_device(device)
        self._check_mig_gpu(dev, "add_mig_device")
        ci = _check_int("ci", ci, _U32_MAX)
        parts = [f"mig device={dev} index={idx}", f"ci={ci}"]
        if gi is not None:
            gi = _check_int("gi", gi, _U32_MAX)
            parts.append(f"gi={gi}")
        if uuid is not None:
            parts.append("uuid=" + _quote(_check_uuid("uuid", uuid, mig=True)))
        total = _check_int("total_bytes", total_bytes)
        used = _check_int("used_bytes", used_bytes)
        if used > total:
            raise ArgumentError(f"used_bytes {used} exceeds total_bytes {total}")
        parts.append(f"total={total} used={used}")
        # A line naming an existing MIG device replaces it, its ids and UUID too; a refused one changes nothing.
        ids, uuids = self._mig_ids(), self._uuids()
        kept_ids, kept_uuid = ids.pop((dev, idx), None), uuids.pop((dev, idx), None)
        try:
            self._claim_mig_ids((dev, idx), idx + 1 if gi is None else gi, ci)
            self._claim_uuid((dev, idx), uuid)
        except ArgumentError:
            ids.pop((dev, idx), None)
            uuids.pop((dev, idx), None)
            if kept_ids is not None:
                ids[(dev, idx)] = kept_ids
            if kept_uuid is not None:
                uuids[(dev, idx)] = kept_uuid
            raise
        self._emit(" ".join(parts))

    def remove_mig_device(self, device: int, index: int) -> None:
        """Destroy MIG device ``index`` of GPU ``device`` (nothing happens if there is none)."""
        dev, idx = self._check_device(device), _check_int("index", index, 6)
        self._uuids().pop((dev, idx), None)
        self._mig_ids().pop((dev, idx), None)
        self._emit(f"mig device={dev} index={idx} remove=1")

    def remove_process(self, device: int, pid: int, kind: ProcessKind | ProcessKindName = "compute") -> None:
        """Remove the entry with that device, kind and pid (nothing happens if there is none)."""
        self._emit(
            f"process device={self._check_device(device)} kind={_check_kind(kind)} "
            f"pid={_check_int('pid', pid, _U32_MAX)} remove=1"
        )

    def fault(
        self,
        fn: str,
        code: int | None = None,
        *,
        device: int | None = None,
        after: int = 0,
        count: int = 0,
        delay_ms: int = 0,
    ) -> None:
        """Make calls to ``fn`` fail (``code``) and/or hang (``delay_ms``).

        The first ``after`` matching calls pass; the next ``count`` (0: all following, a sticky fault) sleep
        ``delay_ms`` and return ``code`` (``None``: answer normally after the delay). ``device`` restricts the
        fault to one device (functions with a device handle or index only).
        """
        if fn not in NVML_FUNCTIONS:
            raise ArgumentError(f"fault: {fn!r} is not a function the stub exports (see NVML_FUNCTIONS)")
        if fn == "nvmlErrorString":
            raise ArgumentError("fault: nvmlErrorString cannot fail (it returns a string, not a code)")
        parts = [f"fault fn={fn}"]
        if code is not None:
            parts.append(f"code={_check_int('code', code, _INT_MAX, minimum=1)}")
        if device is not None:
            if fn not in DEVICE_FUNCTIONS:  # (nvmlDeviceGetGpuInstanceId & co. take a MIG device's handle)
                raise ArgumentError(f"fault: {fn} takes no GPU's handle or index, so device= cannot restrict it")
            parts.append(f"device={self._check_device(device)}")
        for key, value in (("after", after), ("count", count), ("delay_ms", delay_ms)):
            number = _check_int(key, value)
            if number:
                parts.append(f"{key}={number}")
        if code is None and not delay_ms:
            raise ArgumentError("fault: give code= (the error to return) and/or delay_ms= (how long to hang)")
        self._emit(" ".join(parts))

    def race(self, device: int, kind: ProcessKind | ProcessKindName, grow: int, count: int = 1) -> None:
        """After each of the first ``count`` (0: every) list calls of ``kind`` on ``device``, add ``grow``
        synthetic 1 MiB processes (negative: remove from the end): the two-call INSUFFICIENT_SIZE race."""
        grow = _check_int("grow", grow, 2**63 - 1, -(2**63 - 1))
        self._emit(
            f"race device={self._check_device(device)} kind={_check_kind(kind)} grow={grow} "
            f"count={_check_int('count', count)}"
        )

    def quirk(self, proc_struct: Literal["535.43", "none"] = "535.43") -> None:
        """Driver quirks. ``proc_struct="535.43"``: the ``_v3`` process calls write 32-byte entries."""
        if not isinstance(proc_struct, str) or proc_struct not in ("535.43", "none"):
            raise ArgumentError(f"quirk proc_struct must be '535.43' or 'none', got {proc_struct!r}")
        self._emit(f"quirk proc_struct={'535.43' if proc_struct == '535.43' else 'none'}")


@dataclass
class TimelineStep(_Changes):
    """Changes applied at one point of the timeline (``at call=N`` / ``at ms=T``); made by :meth:`Scenario.at_call`
    and :meth:`Scenario.at_ms`. Every method records one line; devices cannot be added here."""

    scenario: Scenario
    prefix: str

    def _emit(self, line: str) -> None:
        self.scenario._emit(f"{self.prefix} {line}")

    def raise_event(
        self,
        device: int,
        kind: EventKindName | int = "xid",
        *,
        xid: int = 0,
        data: int = 0,
        gi: int | None = None,
        ci: int | None = None,
    ) -> None:
        """Raise an NVML event on ``device`` at this point of the timeline (``event device=D type=T data=X``).

        Event sets created before it and registered for one of its type bits on ``device`` receive it from
        ``nvmlEventSetWait_v2``. ``kind``: a name of :data:`EVENT_KINDS` (``"mig"`` is a MIG configuration change),
        or the ``nvmlEventType`` bits as a number, delivered as they are (a type nvmlcheck has no name for, two
        types in one record; 0, no bit at all, goes to every set registered on the device). ``xid`` is the XID
        code (``eventData``) of an ``"xid"`` event, ``data`` the raw ``eventData`` of any other; ``gi``/``ci``
        the MIG instance it is attributed to (default none: ``0xFFFFFFFF``). A device reports the types of
        ``event_types=`` supported (default sbe, dbe, pstate, xid and clock: give ``event_types`` to receive the
        others); one with ``unsupported=("events",)`` answers NOT_SUPPORTED to the event calls instead.
        """
        if isinstance(kind, str):
            if kind not in EVENT_KINDS:
                raise ArgumentError(f"event kind must be one of {', '.join(EVENT_KINDS)} or the type bits as a "
                                    f"number, got {kind!r}")
            type_: str = kind
        else:
            type_ = f"{_event_bits('event kind', kind, allow_zero=True):#x}"
        parts = [f"event device={self._check_device(device)} type={type_}"]
        if xid and data:
            raise ArgumentError("give xid= (an 'xid' event's code) or data= (any other's eventData), not both")
        if xid:
            if kind != "xid":
                raise ArgumentError("xid= is only meaningful for an 'xid' event (data= is any other's eventData)")
            parts.append(f"data={_check_int('xid', xid, _U64_MAX)}")
        if data:
            if kind == "xid":
                raise ArgumentError("an 'xid' event's eventData is its code: give xid=")
            parts.append(f"data={_check_int('data', data, _U64_MAX)}")
        if gi is not None:
            parts.append(f"gi={_check_int('gi', gi, _U32_MAX)}")
        if ci is not None:
            parts.append(f"ci={_check_int('ci', ci, _U32_MAX)}")
        self._emit(" ".join(parts))

    def _device_count(self) -> int:
        return self.scenario.device_count

    def _uuids(self) -> dict[tuple[int, ...], str]:
        return self.scenario._uuids()

    def _mig_ids(self) -> dict[tuple[int, int], tuple[int, int]]:
        return self.scenario._mig_ids()

    def _mig_capable(self) -> set[int]:
        return self.scenario._mig_capable()


@dataclass
class _Built:
    """What a :class:`Scenario`'s methods have built: its lines, in order, and the bookkeeping that checks the next
    call (devices declared, UUIDs and MIG instance ids taken, GPUs put in MIG mode)."""

    lines: list[str] = field(default_factory=list)
    devices: int = 0
    uuid_of: dict[tuple[int, ...], str] = field(default_factory=dict)
    mig_ids_of: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    mig_gpus: set[int] = field(default_factory=set)

    def copy(self) -> _Built:
        """A copy that shares nothing this one changes."""
        return _Built(list(self.lines), self.devices, dict(self.uuid_of), dict(self.mig_ids_of), set(self.mig_gpus))


@dataclass
class Scenario(_Changes):
    """Builds a scenario file (format version 1, ``stubs/README.md``) for the stub libnvidia-ml.

    Lines are rendered in the order the methods are called. Device keyword arguments carry units in their names
    and map to scenario keys as :data:`DEVICE_FIELDS` says:

    ``name``, ``uuid``, ``serial`` (str; ``name``, ``serial``, ``driver`` and ``nvml`` without whitespace at either
    end, which nvidia-smi cannot print, and ``driver``/``nvml`` not empty); ``pci_bus_id``
    (``"00000000:06:00.0"``); ``pci_device_id``, ``pci_subsystem_id``, ``minor`` (int); ``total_bytes``,
    ``reserved_bytes``, ``used_bytes`` (int; ``used_bytes`` is memory used by things other than the listed
    processes); ``clocks_mhz``, ``max_clocks_mhz``,
    ``app_clocks_mhz`` (mapping of ``"graphics"``/``"sm"``/``"mem"``/``"video"`` to MHz); ``clock_event_reasons``
    (bit mask); ``retired_pages`` (sequence of ``(cause, address, timestamp)``, cause ``"sbe"`` or ``"dbe"``);
    ``retired_pending`` (bool); ``remapped_rows`` (``(correctable, uncorrectable, pending, failure)``);
    ``ecc_uncorrected_volatile``, ``ecc_uncorrected_aggregate`` (uncorrected ECC totals); ``recovery_action``
    (``nvmlDeviceGpuRecoveryAction_t``: an int or a :class:`nvmlcheck.RecoveryAction`);
    ``unsupported`` (field names, see :data:`UNSUPPORTED_FIELDS`; the default of the stub is
    ``("retired_pages", "retired_pending")`` as on a real H200, so pass ``unsupported=()`` to see retired pages);
    ``lost`` (bool); ``event_types`` (the ``nvmlEventType`` bits ``nvmlDeviceGetSupportedEventTypes`` reports and
    registration accepts; default sbe, dbe, pstate, xid and clock, ``0x1f``). Omitted fields keep the stub's
    defaults: an idle H200.

    Invalid arguments raise ``ValueError`` (bad values) or ``TypeError`` (wrong types) naming the problem.
    """

    driver: str = "580.159.04"
    nvml: str = "13.580.159.04"
    cuda: int = 13000
    # What the methods built. An init field (keyword-only, private) so that every copy carries it:
    # dataclasses.replace() (and copy.replace) make a copy through __init__ with the init fields alone, and lost the
    # lines, devices and UUIDs when they were init=False (a replaced scenario rendered no device). __post_init__
    # takes a copy of it, so the original and its replacement never share it either.
    _built: _Built = field(default_factory=_Built, kw_only=True, repr=False)
    # The file every change is written to as it is made (the pytest plugin's nvml_scenario_path), or None.
    _kept_in: Path | None = field(default=None, init=False, repr=False, compare=False)

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__(name, value)
        if name in ("driver", "nvml", "cuda") and getattr(self, "_kept_in", None) is not None:
            self._keep()

    def __getstate__(self) -> dict[str, object]:
        """For copy and pickle: a copy is a scenario of its own, written to no file of the original's, with lines
        and bookkeeping of its own (``copy.copy`` once shared them: a line added to the copy was the original's too)."""
        state = dict(self.__dict__)
        state["_built"] = self._built.copy()
        state["_kept_in"] = None
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        """From copy and pickle; a pickle of an earlier release kept the bookkeeping in five fields of its own."""
        state = dict(state)
        if "_built" not in state:
            old = _Built()
            for name in ("lines", "devices", "uuid_of", "mig_ids_of", "mig_gpus"):
                if f"_{name}" in state:
                    setattr(old, name, state.pop(f"_{name}"))
            state["_built"] = old
        state.setdefault("_kept_in", None)
        self.__dict__.update(state)

    def __post_init__(self) -> None:
        self._built = self._built.copy()  # dataclasses.replace() hands over the original's: this one's is its own
        self.driver = _check_text("driver", self.driver, 79, empty=False)
        self.nvml = _check_text("nvml", self.nvml, 79, empty=False)
        self.cuda = _check_int("cuda", self.cuda, _INT_MAX)

    @classmethod
    def h200(cls, devices: int = 1) -> Scenario:
        """Idle H200s as measured (driver 580.159.04): 150,754,820,096 B total, 644,939,776 B reserved, 0 used,
        clocks graphics/sm/mem/video 345/345/3201/765 MHz (max 1980/1980/3201/1545), no processes."""
        _check_int("devices", devices, 4096)
        scenario = cls()
        for _ in range(devices):
            scenario.add_device(
                name="NVIDIA H200",
                total_bytes=150_754_820_096,
                reserved_bytes=644_939_776,
                used_bytes=0,
                clocks_mhz={"graphics": 345, "sm": 345, "mem": 3201, "video": 765},
                max_clocks_mhz={"graphics": 1980, "sm": 1980, "mem": 3201, "video": 1545},
            )
        return scenario

    @property
    def device_count(self) -> int:
        """Devices declared so far."""
        return self._built.devices

    def _emit(self, line: str) -> None:
        self._built.lines.append(line)
        if self._kept_in is not None:
            self._keep()

    def _keep_in(self, path: Path | None) -> None:
        """Write the scenario to ``path`` now and again after every change (``None``: stop): a test that changes
        ``nvml_scenario`` after the fixtures wrote it changes the file the stub reads at its next ``nvmlInit``."""
        object.__setattr__(self, "_kept_in", path)
        if path is not None:
            self._keep()

    def _keep(self) -> None:
        assert self._kept_in is not None
        write_scenario_text(self._kept_in, self.render())

    def _device_count(self) -> int:
        return self._built.devices

    def _uuids(self) -> dict[tuple[int, ...], str]:
        return self._built.uuid_of

    def _mig_ids(self) -> dict[tuple[int, int], tuple[int, int]]:
        return self._built.mig_ids_of

    def _mig_capable(self) -> set[int]:
        return self._built.mig_gpus

    def add_device(self, **fields: object) -> int:
        """Declare the next device (index 0, 1, ...) and return its index. Fields: see the class docstring."""
        rendered = _render_device_fields(fields)
        index = self._built.devices
        self._built.devices += 1
        try:
            self._claim_uuid((index,), _check_str("uuid", fields["uuid"], 95) if "uuid" in fields else None)
        except ArgumentError:
            self._built.devices -= 1
            raise
        if fields.get("mig") is True:
            self._built.mig_gpus.add(index)
        self._emit(" ".join([f"device index={index}", *rendered]))
        return index

    def at_call(self, n: int) -> TimelineStep:
        """Changes applied just before the ``n``-th NVML call (1-based, counted from the init that loaded the
        scenario; every exported NVML function counts but the five event calls)."""
        return TimelineStep(self, f"at call={_check_int('call', n, minimum=1)}")

    def at_ms(self, t: int) -> TimelineStep:
        """Changes applied at the first NVML call made ``t`` ms or more after the scenario was loaded."""
        return TimelineStep(self, f"at ms={_check_int('ms', t)}")

    def render(self) -> str:
        """The scenario file's text."""
        driver = _check_text("driver", self.driver, 79, empty=False)
        nvml = _check_text("nvml", self.nvml, 79, empty=False)
        system = f"system driver={_quote(driver)} nvml={_quote(nvml)} cuda={_check_int('cuda', self.cuda, _INT_MAX)}"
        return "\n".join(["nvmlcheck-stub-scenario 1", system, *self._built.lines]) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`render` to ``path`` (UTF-8, replaced atomically) and return it as a Path."""
        return write_scenario_text(path, self.render())


def write_scenario_text(path: str | os.PathLike[str], text: str) -> Path:
    """Replace the scenario file at ``path`` with ``text`` atomically: a stub loading it in another process (an
    ``nvmlInit`` in the program under test) never reads half a file."""
    import tempfile

    out = Path(path)
    if out.is_dir():  # else the rename fails, after a temporary file was made next to the directory
        import errno

        raise IsADirectoryError(errno.EISDIR, "a scenario is written to a file, not a directory", str(out))
    fd, tmp = tempfile.mkstemp(prefix=".scenario.", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchmod(f.fileno(), 0o644)  # as a plain write would leave it (mkstemp makes 0600): others may read it
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


