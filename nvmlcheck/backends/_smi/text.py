"""What every nvidia-smi output shares: its lines, placeholders, deprecation notes, bus ids and lost-GPU lines.

Pure functions over text, no I/O; the CSV engine (:mod:`.table`) and the ``-q`` parser (:mod:`.pids`) both build on
them. A placeholder (``[N/A]``, ``[Not Supported]``, any other ``[Words]``, bare ``N/A``, and ``-q``'s unbracketed
phrases where a number belongs) becomes an :class:`Unavailable` whose :meth:`~Unavailable.reason` goes into
``DeviceState.unknown``; it is never read as 0. Text whose last line has no newline was cut short and is refused.
A line such as ``Unable to determine the device handle for GPU ...`` becomes a :class:`HandleFailure`: that GPU could
not be read, the others still were. docs/backends.md ("How nvidia-smi output is read") gives the reasons.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from ..._proc import PID_MAX_LIMIT
from ...errors import CorruptData, SmiParseError
from .._busid import canonical_bus_id

__all__ = [
    "GPU_ERROR_LINE",
    "PCI_TEXT",
    "PID_MAX_LIMIT",
    "PLACEHOLDER_MEANINGS",
    "HandleFailure",
    "Unavailable",
    "check_pid",
    "code_for_message",
    "handle_failure_line",
    "has_handle_failure",
    "is_uint",
    "normalize_pci_bus_id",
    "number_placeholder",
    "numbered_lines",
    "placeholder",
    "strip_deprecation",
]

#: What each placeholder nvidia-smi prints means; the text goes into ``DeviceState.unknown``.
PLACEHOLDER_MEANINGS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "[N/A]": "not available on this GPU or driver",
        "N/A": "not available on this GPU or driver",
        "[Not Supported]": "not supported by this GPU or driver",
        "[Unknown Error]": "the driver returned an unknown error",
        "[Insufficient Permissions]": "insufficient permissions; run as root or a user allowed to query the GPU",
        "[GPU requires reset]": "the GPU requires a reset (nvidia-smi -r) or a reboot",
        "[GPU is lost]": "the GPU fell off the bus or stopped answering",
    }
)

# A bracketed phrase a newer driver may print in place of a value; read as unknown, never as a value.
_OTHER_PLACEHOLDER = re.compile(r"\[[A-Za-z][A-Za-z0-9 ./'-]*\]")

# The unbracketed placeholders of ``-q`` text, found where a number belongs: Windows (WDDM) and WSL2 print
# ``Used GPU Memory : Not available in WDDM driver model`` (NVIDIA/nvidia-docker#1458), other drivers
# ``Not Supported``/``Not available``. Only consulted for cells that must be numbers, so a process *named*
# "Not available" is never misread.
_BARE_PLACEHOLDER = re.compile(
    r"(?:Not available|Not Available|Not Supported|Unknown Error|Insufficient Permissions|GPU requires reset"
    r"|GPU is lost|Deprecated)\b.*"
)

# A deprecation note beside a value (driver 610 ``-q``: ``CUDA Version : 13.2 [Deprecated; ...]``): the value
# before it still stands; the note is dropped.
_DEPRECATION_NOTE = re.compile(r"\s*\[Deprecated\b[^\]]*\]\s*$", re.IGNORECASE)


@functools.lru_cache(maxsize=256)  # the same few bus ids come back every poll
def normalize_pci_bus_id(text: str) -> str | None:
    """``0000:02:00.0`` / ``00000000:02:00.0`` -> ``00000000:02:00.0`` (upper-case hex), ``None`` if not a bus id.

    nvidia-smi prints an 8-digit domain in CSV and ``-q``, a 4-digit one in some error messages. The NVML backend
    spells its ``busId`` the same way (:func:`~nvmlcheck.backends._busid.canonical_bus_id`).
    """
    return canonical_bus_id(text)


def numbered_lines(text: str) -> list[tuple[int, str]]:
    """Non-blank lines with their 1-based numbers, ``\\r`` removed, and a byte-order mark before the first (a Windows
    shell behind a prefix, PowerShell, writes one). Refuses text whose last line has no newline."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if text and not text.endswith("\n"):
        last_no = text.count("\n") + 1
        raise SmiParseError("output ends without a newline: it was cut short", last_no, text.rsplit("\n", 1)[-1])
    # Split on "\n" only: str.splitlines() would also break a process name at \x1c, \x85 or \u2028.
    raw_lines = text.split("\n")
    if "\r" in text:
        raw_lines = [raw[:-1] if raw.endswith("\r") else raw for raw in raw_lines]
    return [(no, line) for no, line in enumerate(raw_lines, start=1) if line and not line.isspace()]


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A placeholder nvidia-smi printed instead of a value (``[N/A]``, ``[Not Supported]``, ...)."""

    text: str

    def reason(self, what: str) -> str:
        """A sentence for ``DeviceState.unknown``: the field, what nvidia-smi printed, and what it means."""
        meaning = PLACEHOLDER_MEANINGS.get(self.text)
        if meaning is None:
            low = self.text.lower()
            if "wddm" in low:
                meaning = "the Windows display driver model (WDDM, also under WSL2) does not report it"
            elif "deprecated" in low:
                meaning = "this driver deprecated the field and prints no value"
            else:
                meaning = "nvidia-smi printed no value"
        return f"nvidia-smi printed {self.text} for {what}: {meaning}"


def placeholder(cell: str) -> Unavailable | None:
    """The placeholder ``cell`` is (``[N/A]``, ``[Not Supported]``, another ``[Words]``, bare ``N/A``), or ``None``."""
    # Hot path (every cell): a value that does not start like a placeholder costs one comparison.
    if not cell or (cell[0] != "[" and cell != "N/A"):
        return None
    if cell in PLACEHOLDER_MEANINGS or _OTHER_PLACEHOLDER.fullmatch(cell):
        return Unavailable(cell)
    return None


def number_placeholder(cell: str) -> Unavailable | None:
    """A placeholder where a number belongs: the bracketed ones, and the bare phrases of ``-q`` text (``Not
    available in WDDM driver model``). Only called once the cell failed to read as a number."""
    ph = placeholder(cell)
    if ph is None and cell and _BARE_PLACEHOLDER.fullmatch(cell):
        return Unavailable(cell)
    return ph


def strip_deprecation(value: str) -> tuple[str, str | None]:
    """``"13.2 [Deprecated; see ...]"`` -> ``("13.2", "[Deprecated; see ...]")``: the value without the note newer
    drivers print beside it, and the note (``None`` when there was none)."""
    if "eprecated" not in value:  # cheap test first: almost every value has no note
        return value, None
    m = _DEPRECATION_NOTE.search(value)
    if m is None:
        return value, None
    return value[: m.start()].strip(), m.group(0).strip()


PCI_TEXT = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}\.[0-9A-Fa-f]"
# "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover this GPU",
# and its other spellings in published captures: "GPU0000:07:00.0" without the space, "Unable to detect ...", a
# 3-digit domain ("000:07:00.0"), no message at all; also the short "GPU 0000:02:00.0: GPU is lost".
_DEVICE_HANDLE_ERROR = re.compile(
    rf"Unable to (?:determine|detect) (?:the )?device handle for (?:GPU)? ?({PCI_TEXT})(?:\s*:\s*(.*))?",
    re.IGNORECASE,
)
GPU_ERROR_LINE = re.compile(rf"GPU ?({PCI_TEXT})\s*:\s*(\S.*)")


def handle_failure_line(no: int, line: str) -> HandleFailure | None:
    """A device-handle error line as a :class:`HandleFailure`, or ``None`` when ``line`` is not one."""
    stripped = line.strip()
    m = _DEVICE_HANDLE_ERROR.fullmatch(stripped) if stripped[:6].lower() == "unable" else None
    if m is None and stripped.startswith("GPU"):
        m = GPU_ERROR_LINE.fullmatch(stripped)
    if m is None:
        return None
    pci = normalize_pci_bus_id(m.group(1))
    message = (m.group(2) or "").strip() or "nvidia-smi could not get a handle for it"
    return HandleFailure(no, line, pci, None, f"GPU {pci or m.group(1)}: {message}", code_for_message(message))


def has_handle_failure(text: str) -> bool:
    """Whether nvidia-smi output names a GPU it could not read (any spelling): the others were still printed."""
    low = text.lower()
    return "device handle for" in low or GPU_ERROR_LINE.search(text) is not None


@dataclass(frozen=True, slots=True)
class HandleFailure:
    """A line such as ``Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost...`` (or a row whose
    UUID is a placeholder): nvidia-smi could not read that device at all. ``code`` is the NVML return code the text
    names (15 lost, 16 reset required, 4 no permission, 3 not supported, 999 otherwise).

    A row that could not be read (a cell that is no value, a value that cannot be true) is one too: ``error`` is the
    :class:`~nvmlcheck.SmiParseError` or :class:`~nvmlcheck.CorruptData` it raised, and ``index``/``uuid`` what of
    the row could still be read to tell whose it is (``None`` when nothing could: then no GPU can be told apart from
    it)."""

    line_no: int
    line: str
    pci_bus_id: str | None
    index: int | None
    message: str
    code: int
    uuid: str | None = None
    error: SmiParseError | CorruptData | None = None


def code_for_message(message: str) -> int:
    """The NVML return code an error text names (15 lost, 16 reset required, 4 no permission, 6 not found, 3 not
    supported: nvidia-smi prints ``[N/A]`` or ``[Not Supported]`` where NVML answered NOT_SUPPORTED)."""
    low = message.lower()
    if low.strip("[] ") in ("n/a", "not supported"):
        return 3
    if "lost" in low:
        return 15
    if "reset" in low:
        return 16
    if "permission" in low:
        return 4
    if "not found" in low:
        return 6
    return 999


def is_uint(text: str) -> bool:
    """Whether ``text`` is a whole number ``int()`` reads (ASCII digits only, at most 20)."""
    # isdigit() alone accepts "²" and other Unicode digits that int() refuses; isascii() rules them out.
    return text.isdigit() and text.isascii() and len(text) <= 20


def check_pid(pid: int, where: str) -> None:
    """Refuse a PID no Linux host hands out: what a mis-parsed or corrupt process line looks like."""
    if pid <= 0 or pid > PID_MAX_LIMIT:
        raise CorruptData(f"process id {pid} is impossible (valid: 1..{PID_MAX_LIMIT})", where)
