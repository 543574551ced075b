"""The ``nvidia-smi -q`` text parser: ``-q -d PIDS``, and the MIG parts of a full ``-q``.

:func:`parse_pids_query` returns a :class:`PidsListing`: every GPU's compute, graphics and MPS processes (keyed by
PCI bus id; ``Type`` ``C``, ``G``, ``M`` or combinations such as ``M+C``), the driver and CUDA versions of the
header (driver 610's ``KMD Version``/``CUDA UMD Version`` win over the deprecated names), ``Processes : N/A`` as
unknown (never "none"), lost GPUs as :class:`~.text.HandleFailure`, and from a full ``-q`` each GPU's MIG mode and
``MIG Device`` blocks. Process names are kept as printed, commas and all. A line not understood, or a value that
cannot be true, inside one GPU's block fails that GPU alone (``PidsListing.failed``, with the
:class:`~nvmlcheck.SmiParseError` naming the line, or the :class:`~nvmlcheck.CorruptData`); in the header, or a GPU
printed twice, it raises. A MIG block not understood only makes that GPU's MIG devices unknown.
Rules and reasons: docs/backends.md, "How nvidia-smi output is read".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

from ...errors import CorruptData, NvmlCheckError, SmiParseError, error_class_for_code
from ...model import MIB, GpuProcess, Memory, MigDevice, ProcessKind
from .text import (
    GPU_ERROR_LINE,
    PCI_TEXT,
    HandleFailure,
    Unavailable,
    check_pid,
    code_for_message,
    handle_failure_line,
    is_uint,
    normalize_pci_bus_id,
    number_placeholder,
    numbered_lines,
    placeholder,
    strip_deprecation,
)

__all__ = ["PidsListing", "parse_pids_query"]


@dataclass(frozen=True, slots=True)
class PidsListing:
    """``nvidia-smi -q -d PIDS``: the three process lists of each GPU (keyed by normalised PCI bus id), the versions
    its header prints, and devices it could not read. ``unknown`` maps a GPU to the reason its lists could not be read
    (``Processes : N/A``); such a GPU has empty entries in the three mappings, which must not be read as "none"."""

    compute: Mapping[str, tuple[GpuProcess, ...]]
    graphics: Mapping[str, tuple[GpuProcess, ...]]
    mps: Mapping[str, tuple[GpuProcess, ...]]
    driver_version: str | None
    cuda_version: str | None
    failures: tuple[HandleFailure, ...] = ()
    unknown: Mapping[str, str] = field(default_factory=dict)
    #: Header values the driver annotated or withheld (``"CUDA Version"`` -> why it is unknown or marked deprecated).
    notes: Mapping[str, str] = field(default_factory=dict)
    #: GPU (PCI bus id) -> why some of its processes' bytes are ``None`` (WDDM, MIG): the lists still stand.
    bytes_unknown: Mapping[str, str] = field(default_factory=dict)
    #: GPU -> ``MIG Mode`` ``Current`` (full ``-q`` only): True/False, or the reason it is unknown.
    mig_mode: Mapping[str, bool | str] = field(default_factory=dict)
    #: GPU -> its ``MIG Device`` blocks (full ``-q`` only; ``uuid`` and ``processes`` not yet filled).
    mig_devices: Mapping[str, tuple[MigDevice, ...]] = field(default_factory=dict)
    #: GPU -> why its ``MIG Device`` blocks could not be read (they are then left out of ``mig_devices``).
    mig_unknown: Mapping[str, str] = field(default_factory=dict)
    #: GPU -> the error its block raised (a line not understood, an impossible PID or amount), or the NVML error its
    #: ``Processes`` placeholder stands for where NVML's would fail the GPU (``[Insufficient Permissions]``, ``[GPU is
    #: lost]``): that GPU could not be read; it is left out of the three lists, the others still stand.
    failed: Mapping[str, NvmlCheckError] = field(default_factory=dict)



_Q_GPU = re.compile(rf"GPU ({PCI_TEXT})")
_Q_TYPE_LETTERS = {"C": ProcessKind.COMPUTE, "G": ProcessKind.GRAPHICS, "M": ProcessKind.MPS}
_Q_MEMORY = re.compile(r"([0-9]{1,20}) MiB")  # ASCII digits: \d takes any script's, which int() reads as numbers
_Q_KEY = re.compile(r"[A-Za-z][A-Za-z0-9 ./()+-]*")
_Q_ENTRY_LINE = re.compile(r"( +)(GPU instance ID|Compute instance ID|Process ID|Type|Name|Used GPU Memory) *: (.*)")
# Keys only a process entry has (a MIG Device block spells its ids "GPU Instance ID", "Compute Instance ID").
_Q_PROCESS_KEYS: Final = frozenset({"GPU instance ID", "Compute instance ID", "Process ID", "Used GPU Memory"})
# Keys of -q -d PIDS output, accepted without the regular expression (the hot path).
_Q_KNOWN_KEYS: Final = frozenset(
    {"GPU instance ID", "Compute instance ID", "Process ID", "Type", "Name", "Used GPU Memory", "Processes",
     "Timestamp", "Driver Version", "CUDA Version", "Attached GPUs"}
)  # fmt: skip


class _PidsParser:
    """A small state machine over ``nvidia-smi -q`` lines: a header of ``key : value`` lines, then ``GPU <bus id>``
    blocks. Inside a block only the ``Processes`` section is read (its entries start at ``GPU instance ID``, or at
    ``Process ID`` on drivers without MIG fields); other sections (a full ``-q``) are skipped, and the section ends at
    the first line indented no deeper than its own ``Processes`` line."""

    def __init__(self) -> None:
        self.top: dict[str, str] = {}
        self.lists: dict[ProcessKind, dict[str, list[GpuProcess]]] = {k: {} for k in ProcessKind}
        self.unknown: dict[str, str] = {}
        self.failures: list[HandleFailure] = []
        self.gpu: str | None = None
        self.section_indent: int | None = None  # indentation of the open Processes line
        self.seen_section = False  # this GPU block had its Processes line
        self.entry: dict[str, str] = {}
        self.entry_line: tuple[int, str] = (0, "")
        # Where each key of the open entry was read, so an error quotes the offending line, not the entry's first.
        self.entry_lines: dict[str, tuple[int, str]] = {}
        self.notes: dict[str, str] = {}  # header key -> the deprecation note printed beside its value
        self.unknown_bytes: dict[str, Unavailable] = {}  # GPU -> what it printed for a process's bytes
        # MIG (full -q only): "MIG Mode / Current" and the "MIG Device" blocks of each GPU.
        self.mig_mode: dict[str, bool | Unavailable] = {}
        self.mig: dict[str, list[MigDevice]] = {}
        self.mig_bad: dict[str, str] = {}  # GPU -> why its MIG Device blocks could not be read
        self.mig_lines: dict[str, tuple[int, str]] = {}  # where each key of the open MIG Device block was read
        self.title: str | None = None  # the open section title of the GPU block ("MIG Mode", "FB Memory Usage")
        self.title_indent = 0
        self.mig_indent: int | None = None  # indentation of the open "MIG Device" title
        self.mig_entry: dict[str, str] = {}
        self.mig_line: tuple[int, str] = (0, "")
        self.failed: dict[str, NvmlCheckError] = {}  # GPU -> the first error its block raised
        self.whole: SmiParseError | None = None  # an error no single GPU's block explains: the output is refused

    def fail_gpu(self, error: SmiParseError | CorruptData) -> None:
        """Record ``error`` against the open GPU block and drop the entry it was reading; the rest of the block is read
        on, and later errors of the same GPU add nothing. Re-raised outside a block (the header is everyone's) and
        when it is :attr:`whole`'s."""
        if self.gpu is None or error is self.whole:
            raise error
        self.failed.setdefault(self.gpu, error)
        self.entry, self.entry_lines = {}, {}

    def feed(self, no: int, line: str) -> None:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if self.section_indent is not None and indent <= self.section_indent:
            self.section_indent = None
            try:
                self.close_entry()
                self.check_listed(no, line)
            except (SmiParseError, CorruptData) as exc:
                self.fail_gpu(exc)  # and this line is still read (it may open the next GPU's block)
        # Cheap first-character tests keep the regular expressions off the common "key : value" line.
        if stripped[0] == "=" and stripped.startswith("=====") and "NVSMI LOG" in stripped:
            return
        if stripped[0] in "Uu" and stripped[:6].lower() == "unable":
            self.handle_failure(no, line)
            return
        if stripped[0] == "G" and (gpu := _Q_GPU.fullmatch(stripped)) is not None:
            try:
                self.close_gpu(no, line)
            except (SmiParseError, CorruptData) as exc:
                self.fail_gpu(exc)
            self.gpu = normalize_pci_bus_id(gpu.group(1))
            if str(self.gpu) in self.lists[ProcessKind.COMPUTE]:
                # Two blocks for one GPU: the second's lists would be merged into the first's, or hide them. Which of
                # the two is the GPU's own cannot be told (a process name may hold a line break and a GPU line).
                self.whole = SmiParseError(f"GPU {self.gpu} is printed twice", no, line)
                raise self.whole
            for kind in ProcessKind:
                self.lists[kind].setdefault(str(self.gpu), [])
            return
        if stripped[0] == "G" and GPU_ERROR_LINE.fullmatch(stripped) and indent == 0:
            self.handle_failure(no, line)  # "GPU 0000:02:00.0: GPU is lost" in place of the GPU's block
            return
        left, sep, right = stripped.partition(":")
        key = left.rstrip()
        value: str | None = right
        if not sep:
            key, value = stripped, None  # a bare title: "Processes", "FB Memory Usage"
        elif key not in _Q_KNOWN_KEYS and _Q_KEY.fullmatch(key) is None:
            raise SmiParseError("not a 'key : value' line", no, line)
        if key == "Processes" and self.gpu is not None:
            self.open_section(no, line, indent, (value or "").strip())
            return
        if self.gpu is not None and self.section_indent is None and self.gpu_section(no, line, indent, key, value):
            return
        if self.gpu is not None and self.section_indent is None and key in _Q_PROCESS_KEYS:
            # A process's line outside its GPU's Processes section (after the section closed, or after "Processes :
            # None"): skipping it would drop the process from the lists silently. A process name with a line break
            # ends the section early so; such output is refused, never read as fewer processes.
            raise SmiParseError(f"{key!r} outside a Processes section (a process name with a line break?)", no, line)
        if value is None:
            if self.gpu is not None and self.section_indent is None and _Q_KEY.fullmatch(stripped):
                return  # a section title of a full -q: not ours
            raise SmiParseError("not a 'key : value' line", no, line)
        if self.gpu is None:
            # Driver 610 prints "[Deprecated; ...]" beside Driver Version and CUDA Version: keep the value.
            plain, note = strip_deprecation(value.strip())
            self.top[key] = plain
            if note is not None:
                self.notes[key] = note
        elif self.section_indent is not None:
            self.entry_value(no, line, key, value.strip())

    def gpu_section(self, no: int, line: str, indent: int, key: str, value: str | None) -> bool:
        """The MIG parts of a full ``-q`` GPU block: ``MIG Mode`` / ``Current`` and each ``MIG Device`` block
        (``Index``, ``GPU Instance ID``, ``Compute Instance ID``, ``FB Memory Usage``). True when the line was used."""
        if self.mig_indent is not None and indent <= self.mig_indent:
            self.close_mig()
        if self.title is not None and indent <= self.title_indent:
            self.title = None
        if value is None:  # a bare title
            if key == "MIG Device":
                self.close_mig()
                self.mig_indent, self.mig_entry, self.mig_line = indent, {}, (no, line)
                self.mig_lines = {}
                self.title = None  # "MIG Devices" (the enclosing title) must not prefix its keys
                return True
            self.title, self.title_indent = key, indent
            return self.mig_indent is not None
        gpu = str(self.gpu)
        if key == "MIG Devices" and self.mig_indent is None and value.strip() != "None":
            # A placeholder where the MIG Device blocks would be: they could not be listed (NVML's
            # nvmlDeviceGetMigDeviceHandleByIndex failed). As the NVML backend reads that failure: an error of the
            # GPU (lost, reset required) fails it; any other leaves its MIG devices unknown, never an empty list.
            ph = number_placeholder(value.strip())
            error_class = error_class_for_code(code_for_message(ph.text)) if ph is not None else None
            if ph is not None and error_class is not None and error_class.SCOPE == "device":
                code = code_for_message(ph.text)
                self.failed.setdefault(gpu, error_class(code, "nvidia-smi -q", None, ph.reason("MIG Devices")))
            else:
                why = ph.reason("MIG Devices") if ph is not None else f"not understood: {line.strip()!r}"
                self.mig_bad.setdefault(gpu, f"{why} (line {no})")
            return True
        if self.mig_indent is not None:
            path = f"{self.title}/{key}" if self.title is not None else key
            self.mig_entry[path] = value.strip()
            self.mig_lines[path] = (no, line)
            return True
        if self.title == "MIG Mode" and key == "Current":
            mode = value.strip()
            ph = number_placeholder(mode)
            if ph is not None:
                self.mig_mode[gpu] = ph
            elif mode in ("Enabled", "Disabled"):
                self.mig_mode[gpu] = mode == "Enabled"
            else:
                raise SmiParseError(f"MIG Mode Current {mode!r} is not Enabled or Disabled", no, line)
            return True
        return False

    def close_mig(self) -> None:
        if self.mig_indent is None:
            return
        entry, self.mig_entry, self.mig_indent = self.mig_entry, {}, None
        try:
            self.mig_device(entry)
        except SmiParseError as exc:
            # The MIG blocks are not what a wait needs to be correct (the parent is judged without them): a block
            # this parser cannot read makes the GPU's MIG devices unknown, quoting the line, and the snapshot goes on.
            self.mig_bad.setdefault(str(self.gpu), f"{exc.reason} (line {exc.line_no}: {exc.line.strip()!r})")

    def mig_device(self, entry: dict[str, str]) -> None:
        where, self.mig_lines = self.mig_lines, {}
        no, line = self.mig_line
        unknown: dict[str, str] = {}

        def at(key: str) -> tuple[int, str]:
            return where.get(key, (no, line))

        def number(key: str) -> int | None:
            v = entry.get(key)
            if v is None:
                unknown.setdefault(key, f"nvidia-smi -q printed no {key!r} for this MIG device")
                return None
            if is_uint(v):
                return int(v)
            if number_placeholder(v) is not None:
                unknown.setdefault(key, Unavailable(v).reason(f"MIG device {key}"))
                return None
            raise SmiParseError(f"MIG device {key} {v!r} is not a number", *at(key))

        index = number("Index")
        if index is None:
            raise SmiParseError("a MIG Device block without an Index", no, line)
        gi = number("GPU Instance ID")
        ci = number("Compute Instance ID")
        memory: Memory | None = None
        fb = {k.split("/", 1)[1]: v for k, v in entry.items() if k.startswith("FB Memory Usage/")}
        values: dict[str, int | None] = {}
        for part in ("Total", "Used", "Free", "Reserved"):
            v = fb.get(part)
            m = _Q_MEMORY.fullmatch(v) if v is not None else None
            values[part] = int(m.group(1)) * MIB if m is not None else None
            if v is not None and m is None and number_placeholder(v) is None:
                raise SmiParseError(
                    f"MIG device FB Memory Usage {part} {v!r} is not 'N MiB'", *at(f"FB Memory Usage/{part}")
                )
        total, used, free = values["Total"], values["Used"], values["Free"]
        if total is not None and used is not None and free is not None:
            if used > total:
                raise CorruptData(f"MIG device {index} uses {used // MIB} MiB of {total // MIB} MiB", "nvidia-smi -q")
            memory = Memory(total, used, free, values["Reserved"], False, MIB)
        else:
            unknown["memory"] = "nvidia-smi -q printed no FB Memory Usage Total/Used/Free for this MIG device"
        self.mig.setdefault(str(self.gpu), []).append(
            MigDevice(index, None, gi, ci, memory, None, MappingProxyType(unknown))
        )

    def handle_failure(self, no: int, line: str) -> None:
        hf = handle_failure_line(no, line)
        if hf is None:
            raise SmiParseError("not a 'key : value' line", no, line)
        self.failures.append(hf)

    def open_section(self, no: int, line: str, indent: int, value: str) -> None:
        gpu = str(self.gpu)
        if self.seen_section:
            raise SmiParseError(f"GPU {gpu} has two Processes sections", no, line)
        self.seen_section = True
        ph = number_placeholder(value)  # bracketed, or a bare phrase ("Not Supported") as -q prints elsewhere
        if ph is not None:
            code = code_for_message(ph.text)
            error_class = error_class_for_code(code)
            if error_class.SCOPE != "value":
                # As NVML fails a GPU whose process list answers NO_PERMISSION, UNKNOWN, GPU_IS_LOST, ...
                self.failed.setdefault(gpu, error_class(code, "nvidia-smi -q", None, ph.reason("Processes")))
                return
            # The process lists could not be read (not supported here): unknown, not empty.
            self.unknown[gpu] = ph.reason("Processes")
        elif value == "":
            self.section_indent = indent
        elif value != "None":
            raise SmiParseError(f"Processes reads {value!r}", no, line)

    def entry_value(self, no: int, line: str, key: str, value: str) -> None:
        starts_entry = key == "GPU instance ID" or (key == "Process ID" and "Process ID" in self.entry)
        if starts_entry:
            self.close_entry()
        if not self.entry:
            self.entry_line = (no, line)
        # Unknown keys inside an entry are kept but unused: newer drivers add fields (CC protected memory).
        self.entry[key] = value
        self.entry_lines[key] = (no, line)

    def close_entry(self) -> None:
        if not self.entry:
            return
        no, line = self.entry_line
        entry, self.entry = self.entry, {}
        where, self.entry_lines = self.entry_lines, {}

        def at(key: str) -> tuple[int, str]:
            return where.get(key, (no, line))

        for needed in ("Process ID", "Type", "Used GPU Memory"):
            if needed not in entry:
                raise SmiParseError(f"process entry without {needed!r}", no, line)
        if not is_uint(entry["Process ID"]):
            raise SmiParseError(f"Process ID {entry['Process ID']!r} is not a number", *at("Process ID"))
        pid = int(entry["Process ID"])
        check_pid(pid, "nvidia-smi -q -d PIDS")
        letters = entry["Type"].split("+")
        if not letters or any(t not in _Q_TYPE_LETTERS for t in letters) or len(set(letters)) != len(letters):
            raise SmiParseError(f"process Type {entry['Type']!r} is not C, G, M or a '+' combination", *at("Type"))
        used = self.memory(entry["Used GPU Memory"], *at("Used GPU Memory"))
        if used is None:
            # "Not available in WDDM driver model", "N/A" on some MIG setups: unknown, never 0.
            self.unknown_bytes.setdefault(
                str(self.gpu), number_placeholder(entry["Used GPU Memory"]) or Unavailable(entry["Used GPU Memory"])
            )
        name = entry.get("Name")
        if name is not None and placeholder(name) is not None:
            name = None
        gi = self.instance_id(entry.get("GPU instance ID"), *at("GPU instance ID"))
        ci = self.instance_id(entry.get("Compute instance ID"), *at("Compute instance ID"))
        for letter in letters:
            kind = _Q_TYPE_LETTERS[letter]
            self.lists[kind][str(self.gpu)].append(GpuProcess(pid, kind, used, name, gi, ci))

    @staticmethod
    def memory(value: str, no: int, line: str) -> int | None:
        m = _Q_MEMORY.fullmatch(value)
        if m is not None:
            return int(m.group(1)) * MIB
        if number_placeholder(strip_deprecation(value)[0] or value) is not None:
            return None
        raise SmiParseError(f"Used GPU Memory {value!r} is not 'N MiB'", no, line)

    @staticmethod
    def instance_id(value: str | None, no: int, line: str) -> int | None:
        if value is None or number_placeholder(value) is not None:
            return None
        if not is_uint(value):
            raise SmiParseError(f"instance id {value!r} is not a number", no, line)
        return int(value)

    def check_listed(self, no: int, line: str) -> None:
        """A bare ``Processes`` title that closes with no entry under it: nvidia-smi prints ``Processes : None`` for
        none, so the entries were lost (output cut short after the title): an empty list would look idle."""
        gpu = str(self.gpu)
        if gpu not in self.failed and not any(self.lists[kind].get(gpu) for kind in ProcessKind):
            raise SmiParseError(f"GPU {gpu}'s Processes section lists no process (nvidia-smi prints 'Processes : None' "
                                "for none: the output was cut short?)", no, line)

    def close_gpu(self, no: int, line: str) -> None:
        seen_section, self.seen_section = self.seen_section, False
        section_open, self.section_indent = self.section_indent is not None, None
        self.title = None
        try:
            self.close_entry()
            if section_open and self.gpu is not None:
                self.check_listed(no, line)
            self.close_mig()
        finally:
            self.mig_indent, self.mig_entry = None, {}  # nothing of this block may reach the next one
        if self.gpu is not None and not seen_section:
            # -q -d MEMORY has no Processes section: that is "not asked", never "no process".
            raise SmiParseError(f"GPU {self.gpu} has no Processes section", no, line)


def parse_pids_query(text: str) -> PidsListing:
    """Parse ``nvidia-smi -q -d PIDS``: every GPU's compute, graphics and MPS processes (``Type`` ``C``, ``G``,
    ``M``, or combinations such as ``M+C`` and ``C+G``, where the process is listed under each kind), plus the
    ``Driver Version`` and ``CUDA Version`` of the header. ``Processes : None`` is an empty list: nvidia-smi said so.
    A GPU whose block holds a line not understood or an impossible value is in ``failed`` and in none of the lists.
    """
    parser = _PidsParser()
    lines = numbered_lines(text)
    entry_line = _Q_ENTRY_LINE.fullmatch
    for no, line in lines:
        try:
            # Fast lane for the lines of a process entry (most of the output); everything else takes feed().
            m = entry_line(line)
            if m is not None and parser.section_indent is not None and len(m.group(1)) > parser.section_indent:
                key = m.group(2)
                if key == "GPU instance ID" or (key == "Process ID" and "Process ID" in parser.entry):
                    parser.close_entry()
                if not parser.entry:
                    parser.entry_line = (no, line)
                parser.entry[key] = m.group(3).strip()
                parser.entry_lines[key] = (no, line)
                continue
            parser.feed(no, line)
        except (SmiParseError, CorruptData) as exc:
            parser.fail_gpu(exc)  # one GPU's block (re-raised in the header, or when it is the whole output's)
    last_no, last = lines[-1] if lines else (1, "")
    try:
        parser.close_gpu(last_no, last)
    except (SmiParseError, CorruptData) as exc:
        parser.fail_gpu(exc)
    if "Driver Version" not in parser.top and "KMD Version" not in parser.top:
        raise SmiParseError("no 'Driver Version' line: this is not nvidia-smi -q output", 1, text[:80])

    def freeze(kind: ProcessKind) -> Mapping[str, tuple[GpuProcess, ...]]:
        # A failed GPU's list may be cut where its error was: it is not given at all.
        return MappingProxyType({k: tuple(v) for k, v in parser.lists[kind].items() if k not in parser.failed})

    notes: dict[str, str] = {}

    def version(key: str) -> str | None:
        v = parser.top.get(key)
        if v is not None and parser.notes.get(key):
            notes[key] = f"nvidia-smi marks {key} {parser.notes[key]}"
        if v is None:
            return None
        if not v:
            notes[key] = f"nvidia-smi printed only a deprecation note for {key}: {parser.notes.get(key, '')}"
            return None
        ph = number_placeholder(v)
        if ph is not None:
            notes[key] = ph.reason(key)
            return None
        return v

    return PidsListing(
        compute=freeze(ProcessKind.COMPUTE),
        graphics=freeze(ProcessKind.GRAPHICS),
        mps=freeze(ProcessKind.MPS),
        # Driver 610 deprecated "Driver Version"/"CUDA Version" for "KMD Version"/"CUDA UMD Version" (nvidia-smi
        # docs: "to more accurately reflect the source of the version information"): the new names win.
        driver_version=version("KMD Version") or version("Driver Version"),
        cuda_version=version("CUDA UMD Version") or version("CUDA Version"),
        failures=tuple(parser.failures),
        unknown=MappingProxyType(dict(parser.unknown)),
        notes=MappingProxyType(notes),
        mig_mode=MappingProxyType(
            {k: v if isinstance(v, bool) else v.reason("MIG Mode Current") for k, v in parser.mig_mode.items()}
        ),
        mig_devices=MappingProxyType({k: tuple(v) for k, v in parser.mig.items() if k not in parser.mig_bad}),
        mig_unknown=MappingProxyType(dict(parser.mig_bad)),
        bytes_unknown=MappingProxyType(
            {k: v.reason("a process's Used GPU Memory") for k, v in parser.unknown_bytes.items()}
        ),
        failed=MappingProxyType(dict(parser.failed)),
    )
