"""The CSV queries: ``--query-gpu``, ``--query-compute-apps``, ``--query-retired-pages``, ``--query-remapped-rows``.

Each parser takes the text nvidia-smi printed (with or without a header and units) and returns plain records:
:class:`GpuRecord` per GPU row (memory, clocks, page and row counts, MIG mode, each part ``None`` with a reason in
``unknown`` when a placeholder stood in it), :class:`ProcessListing`, :class:`RetiredListing`, or remapped rows per
GPU. A row whose UUID is a placeholder is a :class:`~.text.HandleFailure`. Values that parse but cannot be true
(used > total, an impossible PID) raise :class:`~nvmlcheck.CorruptData`. No I/O and no
:class:`~nvmlcheck.model.DeviceState`: :mod:`nvmlcheck.backends._smi_state` assembles those.
Rules and reasons: docs/backends.md, "How nvidia-smi output is read".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ...errors import CorruptData, SmiParseError, error_class_for_code
from ...model import (
    MIB,
    ClockEventReason,
    Clocks,
    ClockSet,
    GpuProcess,
    Memory,
    ProcessKind,
    RecoveryAction,
    RemappedRows,
    RetiredPage,
    RetirementCause,
    unknown_key,
)
from .aliases import COMPUTE_APPS_ALIASES, QUERY_GPU_ALIASES, REMAPPED_ROWS_ALIASES, RETIRED_PAGES_ALIASES
from .table import HEX, UUID_TEXT, Cells, Row, Table, known, parse_table
from .text import HandleFailure, Unavailable, check_pid, code_for_message, is_uint, placeholder, strip_deprecation

__all__ = [
    "GpuRecord",
    "ProcessListing",
    "RetiredListing",
    "parse_compute_apps",
    "parse_recovery_action",
    "parse_query_gpu",
    "parse_remapped_rows",
    "parse_retired_pages",
]


@dataclass(slots=True)  # not frozen: built for every GPU every poll, and frozen __init__ costs (treat as read-only)
class GpuRecord:
    """One ``--query-gpu`` row, converted. Parts whose columns were not asked for are ``None`` without a reason;
    parts that could not be read are ``None`` with the reason in ``unknown`` (dotted model paths).

    ``retired_sbe``/``retired_dbe`` are ``retired_pages.sbe``/``.dbe`` (page counts, to decide whether the retired
    pages need to be listed at all).
    """

    line_no: int
    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    driver_version: str | None
    memory: Memory | None
    clocks: Clocks | None
    retired_sbe: int | None
    retired_dbe: int | None
    retired_pending: bool | None
    remapped_rows: RemappedRows | None
    unknown: Mapping[str, str]
    #: ``mig.mode.current``: True Enabled, False Disabled or not supported (``[N/A]``), None not asked or unknown.
    mig_mode: bool | None = None
    #: ``ecc.errors.uncorrected.volatile.total`` / ``.aggregate.total`` and ``gpu_recovery_action`` (issue 22).
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    recovery_action: RecoveryAction | None = None


_MEMORY_COLUMNS = ("memory.total", "memory.used", "memory.free")
_CLOCK_DOMAINS = (("graphics", "graphics_mhz"), ("sm", "sm_mhz"), ("memory", "memory_mhz"), ("video", "video_mhz"))
#: The ECC totals of :class:`~nvmlcheck.model.Health` and their ``--query-gpu`` fields.
ECC_COLUMNS: Final = (
    ("ecc_uncorrected_volatile", "ecc.errors.uncorrected.volatile.total"),
    ("ecc_uncorrected_aggregate", "ecc.errors.uncorrected.aggregate.total"),
)
#: How nvidia-smi spells each recovery action (``-q`` "GPU Recovery Action", ``gpu_recovery_action``; the words of
#: XID 154's message too), lower-cased with ``_`` as a space. Driver 580 prints ``None`` on a healthy GPU.
_RECOVERY_WORDS: Final = MappingProxyType(
    {
        "none": RecoveryAction.NONE,
        "reset": RecoveryAction.GPU_RESET,
        "gpu reset": RecoveryAction.GPU_RESET,
        "gpu reset required": RecoveryAction.GPU_RESET,
        "reboot": RecoveryAction.NODE_REBOOT,
        "node reboot": RecoveryAction.NODE_REBOOT,
        "node reboot required": RecoveryAction.NODE_REBOOT,
        "drain p2p": RecoveryAction.DRAIN_P2P,
        "drain and reset": RecoveryAction.DRAIN_AND_RESET,
        "recover imex domain": RecoveryAction.RECOVER_IMEX_DOMAIN,
        "bus reset": RecoveryAction.BUS_RESET,
        "system reboot": RecoveryAction.SYSTEM_REBOOT,
    }
)


def parse_recovery_action(text: str) -> RecoveryAction | None:
    """The :class:`~nvmlcheck.model.RecoveryAction` nvidia-smi printed (``None``, ``Reset``, ``Drain P2P``,
    ``GPU_RESET``, a number, ...); ``None`` for a spelling this version does not know."""
    words = " ".join(text.replace("_", " ").lower().split())
    action = _RECOVERY_WORDS.get(words) or _RECOVERY_WORDS.get(words.removeprefix("gpu recovery action "))
    if action is None and is_uint(words) and int(words) <= 0xFFFFFFFF:  # ASCII digits: str.isdigit() took "²"
        # A number beyond nvmlDeviceGpuRecoveryAction_t's 32 bits is none: masked, 4294967296 read as NONE (healthy).
        action = RecoveryAction(int(words))
    return action


_REMAPPED_COLUMNS = (
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
)


def parse_query_gpu(
    text: str, requested: Sequence[str] | None = None, *, header: bool = True
) -> tuple[tuple[GpuRecord, ...], tuple[HandleFailure, ...]]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,nounits]``.

    ``index`` and ``uuid`` must be among the columns. A row whose UUID is a placeholder (``[GPU requires reset]``)
    becomes a :class:`HandleFailure`, as do ``Unable to determine the device handle`` lines, and a row that cannot be
    read (a cell that is no value, a value that cannot be true, the wrong number of columns): its failure carries the
    error and whatever of its index and UUID could be read, so that GPU alone fails (as with NVML) and the others still
    report. A second row for one index or one UUID is refused (:class:`~nvmlcheck.SmiParseError`), and so is a
    damaged row that claims a GPU another row reads.
    """
    table = parse_table(text, QUERY_GPU_ALIASES, requested, header=header, keep_bad_rows=True)
    for needed in ("index", "uuid"):
        if not table.has(needed):
            raise SmiParseError(f"--query-gpu output lacks the {needed} column", 1, "")
    records: list[GpuRecord] = []
    failures = list(table.failures)
    damaged: list[HandleFailure] = [_damaged_row(table, row, exc) for row, exc in table.bad_rows]
    seen: set[int | str] = set()
    for row in table.rows:
        cells = Cells(table, row)
        try:
            index = cells.uint("index")
            uuid = cells.uuid("uuid")
        except SmiParseError as exc:
            damaged.append(_damaged_row(table, row, exc))
            continue
        _check_owner(cells, index, uuid, seen)
        if isinstance(index, Unavailable):
            # That GPU could not be enumerated: a failure, tied to its GPU by the UUID where that reads.
            owner = uuid if isinstance(uuid, str) else None
            why, code = f"its index reads {index.text}", code_for_message(index.text)
            failures.append(HandleFailure(row.line_no, row.line, None, None, why, code, owner))
            continue
        if isinstance(uuid, Unavailable):
            pci = cells.pci("pci.bus_id") if table.has("pci.bus_id") else None
            failures.append(
                HandleFailure(
                    row.line_no,
                    row.line,
                    pci if isinstance(pci, str) else None,
                    index,
                    f"its UUID reads {uuid.text}",
                    code_for_message(uuid.text),
                )
            )
            continue
        failing = _failing_placeholder(table, cells)
        if failing is not None:
            # What NVML's answer would make a failure of the GPU (a lost GPU; memory unreadable for want of
            # permission, or an unknown error) fails it here too: a wait on it ends at once, or retries, as with NVML.
            column, ph = failing
            message = f"{column} reads {ph.text}: {ph.reason(column)}"
            failures.append(HandleFailure(row.line_no, row.line, None, index, message, code_for_message(ph.text), uuid))
            continue
        try:
            records.append(_gpu_record(table, cells, index, uuid))
        except (SmiParseError, CorruptData) as exc:
            failures.append(_damaged_row(table, row, exc, index, uuid))  # its index and UUID were checked above
    for hf in damaged:
        # A damaged row that names a GPU another row reads: nvidia-smi contradicts itself about that GPU.
        for key in (hf.index, hf.uuid):
            if key is not None and key in seen:
                raise SmiParseError(f"a damaged second row for GPU {key}", hf.line_no, hf.line)
            if key is not None:
                seen.add(key)
    return tuple(records), (*failures, *damaged)


# Columns read by the one NVML call whose failure fails the GPU (nvmlDeviceGetMemoryInfo_v2): a wait judges them.
_JUDGED_COLUMNS: Final = frozenset({"memory.total", "memory.used", "memory.free", "memory.reserved"})


def _failing_placeholder(table: Table, cells: Cells) -> tuple[str, Unavailable] | None:
    """The first placeholder of the row that stands for an NVML error failing the whole GPU, with its column: one of
    device scope anywhere (``[GPU is lost]``, ``[GPU requires reset]``), or any but "not supported" in a column a wait
    judges (``[Insufficient Permissions]``, ``[Unknown Error]``). Others leave their value ``None`` with the reason."""
    for column in table.columns:
        ph = placeholder(cells.raw(column.name))
        if ph is None:
            continue
        scope = error_class_for_code(code_for_message(ph.text)).SCOPE
        if scope == "device" or (scope == "read" and column.name in _JUDGED_COLUMNS):
            return column.name, ph
    return None


def _check_owner(cells: Cells, index: int | Unavailable, uuid: str | Unavailable, seen: set[int | str]) -> None:
    """Refuse a row whose index or UUID a row before it named (``seen``, updated)."""
    # One row per GPU: a second row for an index or a UUID would make one GPU's reading another's.
    for key in (index, uuid):
        if key in seen:
            raise cells.fail(f"a second row for GPU {key}")
        if not isinstance(key, Unavailable):
            seen.add(key)


def _damaged_row(
    table: Table, row: Row, error: SmiParseError | CorruptData, index: int | None = None, uuid: str | None = None
) -> HandleFailure:
    """A row that could not be read, as the failure of whichever GPU its index or UUID still names."""
    if index is None:
        raw = table.leading_cell(row, "index")
        index = int(raw) if raw is not None and is_uint(raw) else None
    if uuid is None:
        raw = table.leading_cell(row, "uuid")
        uuid = raw if raw is not None and UUID_TEXT.fullmatch(raw) else None
    reason = error.reason if isinstance(error, SmiParseError) else error.message
    return HandleFailure(row.line_no, row.line, None, index, f"its row could not be read: {reason}", 999, uuid, error)


def _optional_text(table: Table, cells: Cells, name: str, key: str, unknown: dict[str, str]) -> str | None:
    if not table.has(name):
        return None
    value = cells.pci(name) if name == "pci.bus_id" else cells.text(name)
    if isinstance(value, str) and name == "driver_version":
        value = strip_deprecation(value)[0] or value  # driver 610 marks it deprecated in -q; keep the number
    return value if known(value, name, unknown, key) and isinstance(value, str) else None


def _gpu_record(table: Table, cells: Cells, index: int, uuid: str) -> GpuRecord:
    unknown: dict[str, str] = {}
    memory = _memory(table, cells, index, unknown) if table.has("memory.used") else None
    clocks = _clocks(table, cells, unknown) if table.has("clocks.current.sm") else None
    sbe = dbe = None
    pending = None
    remapped = None
    if table.has("retired_pages.single_bit_ecc.count"):
        s = _count(cells, "retired_pages.single_bit_ecc.count", 32)
        d = _count(cells, "retired_pages.double_bit.count", 32)
        ok_s = known(s, "retired_pages.single_bit_ecc.count", unknown, "health.retired_pages")
        ok_d = known(d, "retired_pages.double_bit.count", unknown, "health.retired_pages")
        if ok_s and ok_d and isinstance(s, int) and isinstance(d, int):
            sbe, dbe = s, d
    if table.has("retired_pages.pending"):
        p = cells.flag("retired_pages.pending")
        known(p, "retired_pages.pending", unknown, "health.retired_pages_pending")
        pending = p if isinstance(p, bool) else None
    if table.has("remapped_rows.correctable"):
        remapped = _remapped(cells, unknown)
    ecc, recovery = _ecc_and_recovery(table, cells, unknown)
    mig_mode: bool | None = None
    if table.has("mig.mode.current"):
        mode = cells.flag("mig.mode.current")
        if isinstance(mode, bool):
            mig_mode = mode
        elif mode.text in ("[N/A]", "N/A", "[Not Supported]"):
            mig_mode = False  # a GPU without MIG: nvmlDeviceGetMigMode's NOT_SUPPORTED
        else:
            unknown["mig"] = mode.reason("mig.mode.current")
    return GpuRecord(
        line_no=cells.row.line_no,
        index=index,
        uuid=uuid,
        name=_optional_text(table, cells, "name", "name", unknown),
        pci_bus_id=_optional_text(table, cells, "pci.bus_id", "pci_bus_id", unknown),
        serial=_optional_text(table, cells, "serial", "serial", unknown),
        driver_version=_optional_text(table, cells, "driver_version", "driver_version", unknown),
        memory=memory,
        clocks=clocks,
        retired_sbe=sbe,
        retired_dbe=dbe,
        retired_pending=pending,
        remapped_rows=remapped,
        unknown=MappingProxyType(unknown),
        mig_mode=mig_mode,
        ecc_uncorrected_volatile=ecc.get("ecc_uncorrected_volatile"),
        ecc_uncorrected_aggregate=ecc.get("ecc_uncorrected_aggregate"),
        recovery_action=recovery,
    )


def _ecc_and_recovery(
    table: Table, cells: Cells, unknown: dict[str, str]
) -> tuple[dict[str, int | None], RecoveryAction | None]:
    """The uncorrected ECC totals (by Health attribute) and the recovery action, where they were asked for."""
    ecc: dict[str, int | None] = {}
    for attr, column in ECC_COLUMNS:
        if table.has(column):
            v = _count(cells, column, 64)
            ecc[attr] = v if known(v, column, unknown, unknown_key("health", attr)) and isinstance(v, int) else None
    recovery: RecoveryAction | None = None
    if table.has("gpu_recovery_action"):
        text = cells.text("gpu_recovery_action")
        if known(text, "gpu_recovery_action", unknown, "health.recovery_action") and isinstance(text, str):
            recovery = parse_recovery_action(text)
            if recovery is None:
                unknown["health.recovery_action"] = (
                    f"nvidia-smi printed gpu_recovery_action {text!r}, which this version of nvmlcheck does not know"
                )
    return ecc, recovery


_BYTES_MAX: Final = (1 << 64) - 1
_MHZ_MAX: Final = (1 << 32) - 1


def _memory(table: Table, cells: Cells, index: int, unknown: dict[str, str]) -> Memory | None:
    # Every present cell is converted (and so checked) before any is judged: garbage in one column is refused even
    # when a placeholder in another makes the whole part unknown.
    values = {n: cells.mib_bytes(n) for n in (*_MEMORY_COLUMNS, "memory.reserved") if table.has(n)}
    absent = [name for name in _MEMORY_COLUMNS if name not in values]
    if absent:
        unknown["memory"] = f"{', '.join(absent)} not asked for"
        return None
    for name in _MEMORY_COLUMNS:
        known(values[name], name, unknown, "memory")
    total, used, free = (values[name] for name in _MEMORY_COLUMNS)
    if not (isinstance(total, int) and isinstance(used, int) and isinstance(free, int)):
        return None
    reserved: int | None = None
    # memory.reserved arrived with the v2 memory semantics (driver 510); when it cannot be asked for, memory.used is
    # the v1 figure that counts the driver's reservation.
    includes_reserved = "memory.reserved" not in values
    if not includes_reserved:
        r = values["memory.reserved"]
        if known(r, "memory.reserved", unknown, "memory.reserved_bytes") and isinstance(r, int):
            reserved = r
    if total == 0:
        # No GPU has no memory, and its 0 MiB used would make it look idle: as the NVML backend reads it, corrupt.
        raise CorruptData("memory.total 0 MiB: a GPU with no memory at all is not a reading", "nvidia-smi --query-gpu",
                          index)
    if total > _BYTES_MAX:
        # NVML's total is a 64-bit count of bytes: 20 digits of MiB that pass as a number are still no memory size.
        raise CorruptData(f"memory.total {total // MIB} MiB is more than 2^64 bytes", "nvidia-smi --query-gpu", index)
    if used > total or free > total or (reserved is not None and reserved > total):
        raise CorruptData(
            f"memory.used {used // MIB} MiB / memory.free {free // MIB} MiB / memory.reserved "
            f"{'?' if reserved is None else reserved // MIB} MiB exceed memory.total {total // MIB} MiB",
            "nvidia-smi --query-gpu",
            index,
        )
    return Memory(total, used, free, reserved, used_includes_reserved=includes_reserved, granularity_bytes=MIB)


# Clock fields --query-gpu does not offer at all (driver 580's --help-query-gpu); NVML has them.
_SMI_LACKS: Final = frozenset({"clocks.max.video", "clocks.applications.sm", "clocks.applications.video"})
_EVENT_REASONS_KEY: Final = unknown_key("clocks", "event_reasons")


def _clock_set(table: Table, cells: Cells, group: str, unknown: dict[str, str]) -> ClockSet:
    values: dict[str, int | None] = {}
    for domain, attr in _CLOCK_DOMAINS:
        name = f"clocks.{group}.{domain}"
        key = unknown_key("clocks", f"{group}.{attr}")
        if not table.has(name):
            values[attr] = None
            unknown[key] = (
                f"nvidia-smi --query-gpu has no {name} field" if name in _SMI_LACKS else f"{name} was not asked for"
            )
            continue
        v = cells.uint(name)
        if isinstance(v, int) and v > _MHZ_MAX:
            # NVML's clocks are 32-bit: a number beyond is a misread, not a clock.
            raise CorruptData(f"{name} {v} MHz is more than 2^32 - 1", "nvidia-smi --query-gpu")
        values[attr] = v if known(v, name, unknown, key) and isinstance(v, int) else None
    return ClockSet(**values)


def _clocks(table: Table, cells: Cells, unknown: dict[str, str]) -> Clocks:
    current = _clock_set(table, cells, "current", unknown)
    # The current clocks are also read through Clocks.sm_mhz and friends: give those paths the same reasons.
    for _, attr in _CLOCK_DOMAINS:
        current_key = unknown_key("clocks", f"current.{attr}")
        if current_key in unknown:
            unknown[unknown_key("clocks", attr)] = unknown[current_key]
    reasons: ClockEventReason | None = None
    if table.has("clocks_event_reasons.active"):
        mask = cells.hex("clocks_event_reasons.active")
        if known(mask, "clocks_event_reasons.active", unknown, _EVENT_REASONS_KEY) and isinstance(mask, int):
            reasons = ClockEventReason(mask)
    else:
        unknown[_EVENT_REASONS_KEY] = "clocks_event_reasons.active was not asked for"
    return Clocks(
        current=current,
        max=_clock_set(table, cells, "max", unknown),
        applications=_clock_set(table, cells, "applications", unknown),
        event_reasons=reasons,
    )


def _count(cells: Cells, name: str, bits: int) -> int | Unavailable:
    """A count NVML holds in ``bits`` bits (the remapped rows and retired page counts 32, the ECC totals 64): a
    number beyond is a misread, refused as "-1" is, never a count that raises or hides a cause."""
    v = cells.uint(name)
    if isinstance(v, int) and v >> bits:
        raise cells.fail(f"{name}: {v} is more than NVML's {bits}-bit counter holds")
    return v


def _remapped(cells: Cells, unknown: dict[str, str]) -> RemappedRows | None:
    corr = _count(cells, "remapped_rows.correctable", 32)
    unc = _count(cells, "remapped_rows.uncorrectable", 32)
    pending = cells.flag("remapped_rows.pending")
    failure = cells.flag("remapped_rows.failure")
    ok = True
    for name, v in zip(_REMAPPED_COLUMNS, (corr, unc, pending, failure), strict=True):
        ok = known(v, name, unknown, "health.remapped_rows") and ok
    if not ok:
        return None
    assert isinstance(corr, int) and isinstance(unc, int)
    assert isinstance(pending, bool) and isinstance(failure, bool)
    return RemappedRows(correctable=corr, uncorrectable=unc, pending=pending, failure=failure)


@dataclass(frozen=True, slots=True)
class ProcessListing:
    """Processes by GPU (UUID for CSV, PCI bus id for ``-q``), in the order nvidia-smi printed them.

    ``unattributed`` is set when a row could not be tied to a GPU (its UUID or PID a placeholder, or a damaged row
    whose UUID cannot be read): then no GPU's list can be trusted to be complete, and the caller reports every list
    as unknown with this reason. ``failed`` maps a GPU to the error of a row of its own that could not be read (an
    impossible PID, a cell that is no value): that GPU could not be read, and it has no entry in ``by_gpu``.
    """

    by_gpu: Mapping[str, tuple[GpuProcess, ...]]
    unattributed: str | None = None
    failed: Mapping[str, SmiParseError | CorruptData] = field(default_factory=dict)


_APPS_REQUIRED = ("gpu_uuid", "pid", "used_gpu_memory")


def parse_compute_apps(text: str, requested: Sequence[str] | None = None, *, header: bool = True) -> ProcessListing:
    """Parse ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_gpu_memory --format=csv[,nounits]``.

    ``used_gpu_memory`` ``[N/A]`` (WDDM, some MIG and container setups) becomes ``used_bytes=None``, never 0. A header
    with no rows means "no compute process" (nvidia-smi said so); with ``header=False`` empty output means the same.
    """
    table = parse_table(text, COMPUTE_APPS_ALIASES, requested, header=header, keep_bad_rows=True)
    for needed in _APPS_REQUIRED:
        if not table.has(needed):
            raise SmiParseError(f"--query-compute-apps output lacks the {needed} column", 1, "")
    by_gpu: dict[str, list[GpuProcess]] = {}
    unattributed: str | None = None
    failed: dict[str, SmiParseError | CorruptData] = {}
    damaged: list[tuple[Row, SmiParseError | CorruptData, str | None]] = [
        (row, exc, table.leading_cell(row, "gpu_uuid")) for row, exc in table.bad_rows
    ]
    for row in table.rows:
        cells = Cells(table, row)
        try:
            uuid = cells.uuid("gpu_uuid")
        except SmiParseError as exc:
            damaged.append((row, exc, None))
            continue
        try:
            pid = cells.uint("pid")
            used = cells.mib_bytes("used_gpu_memory")
            name = cells.text("process_name") if table.has("process_name") else None
            if isinstance(pid, int):
                check_pid(pid, "nvidia-smi --query-compute-apps")
        except (SmiParseError, CorruptData) as exc:
            damaged.append((row, exc, uuid if isinstance(uuid, str) else None))
            continue
        if isinstance(uuid, Unavailable) or isinstance(pid, Unavailable):
            bad = uuid if isinstance(uuid, Unavailable) else pid
            assert isinstance(bad, Unavailable)
            unattributed = f"line {row.line_no}: " + bad.reason("a compute process's gpu_uuid or pid")
            continue
        proc = GpuProcess(
            pid=pid,
            kind=ProcessKind.COMPUTE,
            used_bytes=None if isinstance(used, Unavailable) else used,
            name=name if isinstance(name, str) else None,
        )
        by_gpu.setdefault(uuid, []).append(proc)
    for row, error, owner in damaged:
        if owner is None or UUID_TEXT.fullmatch(owner) is None:
            # Whose process it was cannot be told: it may be on any GPU, whose list would then look shorter.
            reason = error.reason if isinstance(error, SmiParseError) else error.message
            unattributed = f"line {row.line_no} could not be read and names no GPU ({reason})"
        else:
            failed.setdefault(owner, error)
    return ProcessListing(
        MappingProxyType({k: tuple(v) for k, v in by_gpu.items() if k not in failed}),
        unattributed,
        MappingProxyType(failed),
    )


_CAUSES: Final[Mapping[str, RetirementCause]] = MappingProxyType(
    {"Single Bit ECC": RetirementCause.MULTIPLE_SINGLE_BIT_ECC, "Double Bit ECC": RetirementCause.DOUBLE_BIT_ECC}
)


@dataclass(frozen=True, slots=True)
class RetiredListing:
    """Retired pages by GPU UUID. ``unsupported`` maps a UUID to the reason its pages cannot be listed (nvidia-smi
    prints placeholder rows, one per cause, where retirement is not supported, as on Hopper)."""

    by_gpu: Mapping[str, tuple[RetiredPage, ...]]
    unsupported: Mapping[str, str]


def parse_retired_pages(text: str, requested: Sequence[str] | None = None, *, header: bool = True) -> RetiredListing:
    """Parse ``nvidia-smi --query-retired-pages=gpu_uuid,retired_pages.address,retired_pages.timestamp,
    retired_pages.cause --format=csv``. Addresses are hex or decimal; a timestamp that is not a whole number is kept
    as ``None`` (the model's "not available"). A row that cannot be read makes its GPU's pages unknown (in
    ``unsupported``, with the line), as NVML leaves one health value unknown; a row naming no GPU is refused."""
    table = parse_table(text, RETIRED_PAGES_ALIASES, requested, header=header, keep_bad_rows=True)
    for needed in ("gpu_uuid", "retired_pages.address", "retired_pages.cause"):
        if not table.has(needed):
            raise SmiParseError(f"--query-retired-pages output lacks the {needed} column", 1, "")
    pages: dict[str, list[RetiredPage]] = {}
    unsupported: dict[str, str] = {}
    damaged: dict[str, str] = {}  # GPU -> why one of its rows could not be read
    for row, error in table.bad_rows:
        owner = table.leading_cell(row, "gpu_uuid")
        if owner is None or UUID_TEXT.fullmatch(owner) is None:
            raise error
        damaged.setdefault(owner, f"nvidia-smi --query-retired-pages line {row.line_no}: {error.reason}")
    for row in table.rows:
        cells = Cells(table, row)
        uuid = cells.uuid("gpu_uuid")
        if isinstance(uuid, Unavailable):
            raise cells.fail("a retired page row without a GPU UUID")
        try:
            cause, address = _cause(cells), _address(cells)
        except SmiParseError as exc:
            damaged.setdefault(uuid, f"nvidia-smi --query-retired-pages line {row.line_no}: {exc.reason}")
            continue
        if isinstance(address, Unavailable):
            unsupported[uuid] = address.reason("retired_pages.address")
            continue
        stamp: int | None = None
        if table.has("retired_pages.timestamp"):
            # NVML's raw value when nvidia-smi prints a number; a date text (format not documented) stays unknown
            # rather than being converted with a guessed time zone.
            raw_stamp = cells.raw("retired_pages.timestamp")
            stamp = int(raw_stamp) if is_uint(raw_stamp) else None
        pages.setdefault(uuid, []).append(RetiredPage(address, cause, stamp))
    for uuid in unsupported:
        if uuid in pages:
            raise SmiParseError(f"GPU {uuid} lists retired pages and placeholder rows", 1, "")
    for uuid, why in damaged.items():
        pages.pop(uuid, None)  # a list with a row missing is no list
        unsupported[uuid] = why
    return RetiredListing(
        MappingProxyType({k: tuple(v) for k, v in pages.items()}), MappingProxyType(dict(unsupported))
    )


def _cause(cells: Cells) -> RetirementCause:
    text = cells.text("retired_pages.cause")
    if isinstance(text, Unavailable) or text not in _CAUSES:
        raise cells.fail(f"retired_pages.cause {cells.raw('retired_pages.cause')!r} is not a known cause")
    return _CAUSES[text]


def _address(cells: Cells) -> int | Unavailable:
    cell = cells.raw("retired_pages.address")
    ph = placeholder(cell)
    if ph is not None:
        return ph
    if HEX.fullmatch(cell):
        return int(cell, 16)
    if is_uint(cell):
        return int(cell)
    raise cells.fail(f"retired_pages.address {cell!r} is not an address")


def parse_remapped_rows(
    text: str, requested: Sequence[str] | None = None, *, header: bool = True
) -> Mapping[str, RemappedRows | str]:
    """Parse ``nvidia-smi --query-remapped-rows=gpu_uuid,remapped_rows.correctable,remapped_rows.uncorrectable,
    remapped_rows.pending,remapped_rows.failure --format=csv``, keyed by ``gpu_uuid`` (or ``gpu_bus_id`` when that is
    the identifying column). A GPU whose values are placeholders maps to the reason. The backend reads the same
    fields through ``--query-gpu``; this is for callers that ran the dedicated query."""
    table = parse_table(text, REMAPPED_ROWS_ALIASES, requested, header=header)
    key_column = "gpu_uuid" if table.has("gpu_uuid") else "gpu_bus_id"
    for needed in (key_column, *_REMAPPED_COLUMNS):
        if not table.has(needed):
            raise SmiParseError(f"--query-remapped-rows output lacks the {needed} column", 1, "")
    out: dict[str, RemappedRows | str] = {}
    for row in table.rows:
        cells = Cells(table, row)
        key = cells.uuid(key_column) if key_column == "gpu_uuid" else cells.pci(key_column)
        if isinstance(key, Unavailable):
            raise cells.fail(f"a remapped rows row without {key_column}")
        unknown: dict[str, str] = {}
        rows = _remapped(cells, unknown)
        out[key] = rows if rows is not None else unknown["health.remapped_rows"]
    return MappingProxyType(out)
