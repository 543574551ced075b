#!/usr/bin/env python3
"""A fake ``nvidia-smi`` for tests: renders a stub scenario (stubs/README.md, format version 1) the way the real
nvidia-smi 580 prints it. Written independently of nvmlcheck (it imports nothing from it), so the smi backend's
parser is checked against a second reading of the same facts, not against itself.

Scenario: ``$NVMLCHECK_STUB_SCENARIO``. The static state is rendered: ``system``, ``device`` (all keys, including
``unsupported=`` and ``lost=1``) and ``process`` lines (``used=na``, ``holds=``, ``gi=``/``ci=``, ``remove=1``,
``bound=1`` with ``zombie_holds=1``), and the timeline: after the static lines, in file order, each run applies
the ``at ms=T`` lines once T ms have passed since the scenario file was written and the ``at call=N`` lines once N
calls are reached. Each run of this program is a fresh process, so the calls are counted across runs: a run makes
one call (its ``nvmlInit``) and one more per GPU it reports, and sees the lines due at its first call (a line due
later in the run applies from the next). ``race`` and ``quirk`` lines are accepted and ignored (NVML struct details
nvidia-smi does not show). A ``fault`` line on a call whose answer nvidia-smi prints (see ``FAULT_FIELDS``; the MIG
listing's calls print their placeholder where the full ``-q``'s ``MIG Device`` blocks would be) is rendered there,
as the placeholder nvidia-smi prints for its ``code`` (``FAULT_TEXT``), on its ``device`` (all GPUs without one);
``delay_ms`` makes the run answer that much later; in the timeline it holds from its moment on. Counted faults
(``after``, ``count``) count runs: each run that prints the call's answer for a matching GPU counts as one call of
it on that GPU (nvidia-smi makes one per GPU), so ``after=1 count=2`` lets one run through and fails the next two.
The counts (and the calls of ``at call=N``) are kept across runs in ``<scenario>.fake-smi-counts`` beside the
scenario (under a lock: runs may overlap) and restart when the scenario file is written again (its ``at ms=`` clock
restarts then too), as the stub's restart with every load. Faults on other calls are ignored: the older calls a
driver-580 nvidia-smi does not make, those on a MIG device's handle, those of opening (``nvmlInit*``, the count,
the handles, the system versions) and the events. A bound process is listed, and holds memory, exactly while
``/proc/<pid>`` exists and is not a zombie (``list_ms``/``release_ms`` are not
simulated: it is gone at once). Lines are read as the stub reads them: a ``process`` line naming an existing entry
changes only the keys it names, a ``mig`` line naming an existing MIG device replaces it, and a line the stub refuses
at ``nvmlInit`` (an undeclared device, a boolean other than 0/1, a fault on a function the stub does not export, ...)
is refused here, naming the line: one file never loads in one backend and fails in the other.

Supported command lines (as the real one): ``--query-gpu=``, ``--query-compute-apps=``, ``--query-retired-pages=``,
``--query-remapped-rows=`` with ``--format=csv[,noheader][,nounits]``; ``-q -d PIDS``; ``--version``; ``-i``/``--id``
(indices, UUIDs or PCI bus ids, comma-separated).

How it mimics the real output (checked against captures of driver 580.159.04 on an H200):

* Memory is printed in whole MiB rounded UP: the real one prints the driver's 644,939,776 B reservation (615.06 MiB)
  as 616 and 2,712,076,288 B used (2586.44 MiB) as 2587, so floor and round-half-even are both ruled out.
* ``memory.used`` excludes the reservation (NVML v2): used = device ``used`` + what live processes hold;
  free = total - reserved - used.
* Unsupported values print ``[N/A]`` (``$FAKE_SMI_PLACEHOLDER`` overrides, e.g. ``[Not Supported]`` as older drivers).
* In CSV a comma in a process name prints as ``?`` (``$FAKE_SMI_RAW_COMMAS=1`` keeps it, as a driver that did not
  sanitise would); ``-q`` prints names unaltered.
* ``--query-retired-pages`` on a GPU without retirement support prints one placeholder row per cause.
* A ``lost=1`` GPU prints ``Unable to determine the device handle for GPU<bus id>: GPU is lost. ...`` in place of its
  row and the run exits 15 (``$FAKE_SMI_LOST_STYLE=placeholder``: its row prints ``[GPU requires reset]`` everywhere
  but ``index``, exit 0).
* Errors go to stdout with the real texts; an unknown field exits 2 with ``Field "x" is not a valid field to query.``

Test knobs (environment):

* ``FAKE_SMI_DELAY_S``: sleep this long before answering.
* ``FAKE_SMI_HANG=1``: start a child that sleeps (its pid goes to ``$FAKE_SMI_CHILD_PID_FILE``), then sleep forever.
* ``FAKE_SMI_EXIT=<code>``: print the driver's text for 2/4/6/9/18/255 where the real one prints it, exit with the code.
* ``FAKE_SMI_MATCH=<text>``: apply the three knobs above only when an argument contains ``text``.
* ``FAKE_SMI_REFUSE_FIELDS=a,b``: treat these query fields as unknown (an older driver), exit 2.
* ``FAKE_SMI_ARGV_LOG=<path>``: append the arguments as one JSON list per line.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

# Plain dicts keep this file small; the aliases say what each holds.
Dev = dict[str, Any]  # one device line's keys, with defaults filled in
Proc = dict[str, Any]  # one process line
State = dict[str, Any]  # {"system": ..., "devices": [Dev], "processes": [Proc]}
Fmt = dict[str, Any]  # {"noheader": bool, "nounits": bool, "placeholder": str}
Value = int | str | None  # None prints as the placeholder
Cell = tuple[str, str | None, Value]  # (header name, unit, value)

MIB = 1 << 20
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA "
    "driver is installed and running.\n\n"
)
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.159\n"
NO_DEVICES = "No devices were found\n"
NO_PERMISSION = "Failed to initialize NVML: Insufficient Permissions\n"
INIT_UNKNOWN = "Failed to initialize NVML: Unknown Error\n"


class Usage(Exception):
    """Bad command line: exit 2 with this text on stdout."""


# --- scenario --------------------------------------------------------------------------------------------------------

DEVICE_KEYS = {
    "index", "name", "uuid", "pci", "pci.device_id", "pci.subsystem_id", "serial", "minor", "total", "reserved", "used",
    "clock.graphics", "clock.sm", "clock.mem", "clock.video", "max.graphics", "max.sm", "max.mem", "max.video",
    "app.graphics", "app.sm", "app.mem", "app.video", "reasons", "retired", "retired_pending", "remapped",
    "ecc_volatile", "ecc_aggregate", "recovery", "unsupported", "lost", "mig",
}  # fmt: skip
MIG_KEYS = {"device", "index", "gi", "ci", "uuid", "total", "used", "remove"}
PROCESS_KEYS = {
    "device", "kind", "pid", "used", "holds", "gi", "ci", "bound", "release_ms", "list_ms", "zombie_holds", "remove",
}  # fmt: skip


def tokenize(line: str, line_no: int) -> list[str]:
    """Split a scenario line into words; double-quoted values keep spaces, with \\" and \\\\ escapes; # comments."""
    words, cur, i, quoted, have = [], [], 0, False, False
    while i < len(line):
        c = line[i]
        if quoted:
            if c == "\\" and i + 1 < len(line):
                cur.append(line[i + 1])
                i += 1
            elif c == '"':
                quoted = False
            else:
                cur.append(c)
        elif c == '"':
            quoted, have = True, True
        elif c == "#":
            break
        elif c in " \t":  # the stub's separators only: other whitespace (a no-break space) is part of a value
            if cur or have:
                words.append("".join(cur))
            cur, have = [], False
        else:
            cur.append(c)
        i += 1
    if quoted:
        key = "".join(cur).partition("=")[0]
        raise ValueError(f"scenario line {line_no}: unterminated quoted value for {key!r}")
    if cur or have:
        words.append("".join(cur))
    return words


_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|[0-9]+")


def number(text: str, what: str) -> int:
    """A scenario number as the stub reads it: decimal or 0x hex, no sign, no ``_``, at most 64 bits."""
    if _NUMBER.fullmatch(text):
        value = int(text, 16) if text[:2] in ("0x", "0X") else int(text, 10)
        if value < 2**64:
            return value
    raise ValueError(f"{what}={text}: expected a non-negative decimal or 0x hex number (at most 64 bits)")


def flag(key: str, text: str, line_no: int) -> int:
    """A scenario boolean as the stub reads it: exactly ``0`` or ``1``."""
    if text not in ("0", "1"):
        raise ValueError(f"scenario line {line_no}: {key}={text}: expected 0 or 1")
    return int(text)


def stub_functions() -> dict[str, str]:
    """The functions the stub exports (read from ``stub_nvml.c`` next to this file, the source of truth), each with
    its flags (``F_NOFAULT``: cannot carry a fault; ``F_DEVICE``/``F_INDEX``: takes a GPU, so ``device=`` can
    restrict its fault): a fault line the stub refuses is refused here too."""
    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_nvml.c")
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError:  # this file copied away from the stub's source: the names cannot be checked
        return {}
    return {m.group(1): m.group(2) for m in re.finditer(r"^\s*X\((nvml\w+),\s*([^)]*)\)", text, re.M)}


def default_device(i: int) -> Dev:
    return {
        "index": i,
        "name": "NVIDIA H200",
        "uuid": f"GPU-00000000-0000-0000-0000-{i:012x}",
        "pci": f"00000000:{(i + 1) & 0xFF:02X}:00.0",
        "serial": str(1650924060042 + i),
        "minor": i,
        "total": 150754820096,
        "reserved": 644939776,
        "used": 0,
        "clock.graphics": 345, "clock.sm": 345, "clock.mem": 3201, "clock.video": 765,
        "max.graphics": 1980, "max.sm": 1980, "max.mem": 3201, "max.video": 1545,
        "app.graphics": 1980, "app.sm": 1980, "app.mem": 3201, "app.video": 1545,
        "reasons": 0x1,
        "retired": [],
        "retired_pending": 0,
        "remapped": (0, 0, 0, 0),
        "ecc_volatile": 0,
        "ecc_aggregate": 0,
        "recovery": 0,
        # As measured on the H200: page retirement is not supported (Hopper remaps rows instead).
        "unsupported": {"retired_pages", "retired_pending"},
        "lost": 0,
        "mig": 0,
    }  # fmt: skip


def parse_pairs(words: list[str], allowed: set[str], line_no: int) -> dict[str, str]:
    out = {}
    for w in words:
        key, sep, value = w.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"scenario line {line_no}: unknown key {key!r}")
        out[key] = value
    return out


def apply_device(state: State, pairs: dict[str, str], line_no: int) -> None:
    if "index" not in pairs:
        raise ValueError(f"scenario line {line_no}: device: index= is required")
    i = number(pairs["index"], "index")
    devices = state["devices"]
    if i == len(devices):
        devices.append(default_device(i))
    elif i > len(devices):
        raise ValueError(f"scenario line {line_no}: devices must be declared in order (got index {i})")
    dev = devices[i]
    for key, value in pairs.items():
        if key in ("name", "uuid", "pci", "serial"):
            dev[key] = value
        elif key == "retired":
            dev[key] = [parse_retired(p, line_no) for p in value.split(",") if p]
        elif key == "remapped":
            parts = value.split(",")
            if len(parts) != 4:
                raise ValueError(f"scenario line {line_no}: remapped needs 4 numbers")
            dev[key] = tuple(number(p, "remapped") for p in parts)
        elif key == "unsupported":
            dev[key] = {p for p in value.split(",") if p}
        elif key in ("lost", "mig", "retired_pending"):
            dev[key] = flag(key, value, line_no)
        elif key != "index":
            dev[key] = number(value, key)


def parse_retired(text: str, line_no: int) -> tuple[str, int, int | None]:
    cause, _, rest = text.partition(":")
    address, _, stamp = rest.partition("@")
    if cause not in ("sbe", "dbe") or not address:
        raise ValueError(f"scenario line {line_no}: bad retired page {text!r}")
    return (cause, number(address, "address"), number(stamp, "timestamp") if stamp else None)


def check_process(state: State, dev: int, pairs: dict[str, str], line_no: int) -> None:
    """What the stub refuses in a process line is refused here too: one file must not load in one backend and fail
    in the other."""
    if dev >= len(state["devices"]):
        raise ValueError(f"scenario line {line_no}: process device={dev}: no such device "
                         f"({len(state['devices'])} declared)")
    for key in ("bound", "zombie_holds", "remove"):
        if key in pairs:
            flag(key, pairs[key], line_no)
    if pairs.get("remove") == "1" and len(pairs) != 4:
        raise ValueError(f"scenario line {line_no}: process remove=1 takes only device, kind and pid")


def apply_process(state: State, pairs: dict[str, str], line_no: int) -> None:
    for key in ("device", "kind", "pid"):
        if key not in pairs:
            raise ValueError(f"scenario line {line_no}: process needs {key}=")
    if pairs["kind"] not in ("compute", "graphics", "mps"):
        raise ValueError(f"scenario line {line_no}: kind={pairs['kind']}: expected compute, graphics or mps")
    dev, pid = number(pairs["device"], "device"), number(pairs["pid"], "pid")
    check_process(state, dev, pairs, line_no)
    procs = state["processes"]
    same = [p for p in procs if p["device"] == dev and p["kind"] == pairs["kind"] and p["pid"] == pid]
    if pairs.get("remove") == "1":
        for p in same:
            procs.remove(p)
        return
    # A line naming an existing entry changes only the keys it names (stubs/README.md, as the stub does); ``holds``
    # left unset follows ``used``. A new entry starts from the defaults.
    entry = same[0] if same else {"device": dev, "kind": pairs["kind"], "pid": pid, "used": 0, "holds_set": None,
                                  "gi": None, "ci": None, "bound": False, "zombie_holds": False}  # fmt: skip
    if "used" in pairs:
        entry["used"] = None if pairs["used"] == "na" else number(pairs["used"], "used")
    if "holds" in pairs:
        entry["holds_set"] = number(pairs["holds"], "holds")
    for key in ("gi", "ci"):
        if key in pairs:
            entry[key] = number(pairs[key], key)
    for key in ("bound", "zombie_holds"):
        if key in pairs:
            entry[key] = pairs[key] == "1"
    entry["holds"] = entry["holds_set"] if entry["holds_set"] is not None else (entry["used"] or 0)
    if not same:
        procs.append(entry)


def apply_mig(state: State, pairs: dict[str, str], line_no: int) -> None:
    """``mig device=D index=I gi=G ci=C uuid=MIG-... total=B used=B``: MIG device I of GPU D (``remove=1`` drops it)."""
    for key in ("device", "index"):
        if key not in pairs:
            raise ValueError(f"scenario line {line_no}: mig needs {key}=")
    dev, index = number(pairs["device"], "device"), number(pairs["index"], "index")
    if index >= 7:
        raise ValueError(f"scenario line {line_no}: mig index={index}: at most 7 MIG devices a GPU")
    if dev >= len(state["devices"]):
        raise ValueError(f"scenario line {line_no}: mig device={dev}: no such device "
                         f"({len(state['devices'])} declared)")
    if "remove" in pairs:
        flag("remove", pairs["remove"], line_no)
    migs = state["migs"]
    same = [m for m in migs if m["device"] == dev and m["index"] == index]
    if pairs.get("remove") == "1":
        for m in same:
            migs.remove(m)
        return
    # A line naming an existing MIG device replaces it (as the stub does): keys it leaves out take their defaults,
    # not the old device's values.
    uuid = f"MIG-00000000-0000-0000-{dev:04x}-{index:012x}"
    entry = {"device": dev, "index": index, "gi": index + 1, "ci": 0, "uuid": uuid, "total": 0, "used": 0}
    for key, value in pairs.items():
        if key == "uuid":
            entry[key] = value
        elif key not in ("device", "index"):
            entry[key] = number(value, key)
    if entry["used"] > entry["total"]:
        raise ValueError(f"scenario line {line_no}: mig: used={entry['used']} exceeds total={entry['total']}")
    for m in same:
        migs.remove(m)
    migs.append(entry)


# The NVML calls whose sticky faults are rendered, and the scenario keys of what nvidia-smi prints from them.
FAULT_FIELDS = {
    "nvmlDeviceGetMemoryInfo_v2": "memory", "nvmlDeviceGetName": "name",
    "nvmlDeviceGetUUID": "uuid", "nvmlDeviceGetSerial": "serial", "nvmlDeviceGetPciInfo_v3": "pci",
    "nvmlDeviceGetComputeRunningProcesses_v3": "processes",
    "nvmlDeviceGetGraphicsRunningProcesses_v3": "processes", "nvmlDeviceGetMPSComputeRunningProcesses_v3": "processes",
    "nvmlDeviceGetRemappedRows": "remapped",
    # The MIG devices of a GPU in MIG mode, as the full -q lists them (-L's MIG UUIDs are only joined to those).
    "nvmlDeviceGetMaxMigDeviceCount": "mig_devices", "nvmlDeviceGetMigDeviceHandleByIndex": "mig_devices",
    "nvmlDeviceGetMigMode": "mig", "nvmlDeviceGetClockInfo": "clock", "nvmlDeviceGetMaxClockInfo": "max",
    "nvmlDeviceGetApplicationsClock": "app", "nvmlDeviceGetCurrentClocksEventReasons": "reasons",
    "nvmlDeviceGetTotalEccErrors": "ecc", "nvmlDeviceGetFieldValues": "recovery",
    "nvmlDeviceGetRetiredPages_v2": "retired_pages", "nvmlDeviceGetRetiredPagesPendingStatus": "retired_pending",
}  # fmt: skip
# Not rendered: the older calls a driver 580 nvidia-smi does not make (nvmlDeviceGetMemoryInfo, PciInfo_v2, the v1/v2
# process lists), the calls on a MIG device's handle, the handle and count calls, the init and system calls.
# What nvidia-smi prints in place of a value for an NVML return code (3, NOT_SUPPORTED: the placeholder in use).
FAULT_TEXT = {4: "[Insufficient Permissions]", 15: "[GPU is lost]", 16: "[GPU requires reset]"}


FAULT_KEYS = {"fn", "code", "device", "after", "count", "delay_ms"}


def apply_fault(state: State, pairs: dict[str, str], line_no: int) -> None:
    """``fault fn=F code=C device=D after=A count=N delay_ms=T``: what nvidia-smi prints from F on GPU D (every GPU
    without ``device``) reads as C's placeholder, after A calls and for N (0: all following), each T ms late."""
    fn = pairs.get("fn", "")
    functions = stub_functions()  # empty when they cannot be read: then nothing is checked
    if functions and fn not in functions:
        raise ValueError(f"scenario line {line_no}: fault fn={fn}: not a function this stub exports")
    if functions and "F_NOFAULT" in functions[fn]:
        raise ValueError(f"scenario line {line_no}: fault fn={fn}: this function cannot fail")
    if functions and "device" in pairs and "F_DEVICE" not in functions[fn] and "F_INDEX" not in functions[fn]:
        raise ValueError(f"scenario line {line_no}: fault fn={fn}: device= given but the function takes no device")
    key = FAULT_FIELDS.get(fn)
    values = {k: number(pairs[k], k) for k in ("code", "device", "after", "count", "delay_ms")
              if k in pairs}
    if values.get("code", 1) > 2**31 - 1:
        raise ValueError(f"scenario line {line_no}: code={pairs['code']}: out of range (at most {2**31 - 1})")
    if values.get("code") == 0:
        raise ValueError(f"scenario line {line_no}: fault code=0: that is success; leave code= out to answer normally")
    if key is None or ("code" not in values and not values.get("delay_ms")):
        return
    # Its identity across runs: the line's text and how many identical lines came before it (not its number: a
    # line added above it must not hand it another fault's count).
    text = " ".join(f"{k}={pairs[k]}" for k in sorted(pairs))
    ordinal = sum(1 for f in state["faults"] if f["text"] == text)
    state["faults"].append({"key": key, "device": values.get("device"), "code": values.get("code"),
                            "after": values.get("after", 0), "count": values.get("count", 0),
                            "delay_ms": values.get("delay_ms", 0), "text": text, "id": f"{ordinal}:{text}"})


def apply_at(state: State, words: list[str], line_no: int) -> None:
    """``at call=N LINE`` / ``at ms=T LINE``: checked now, as the stub checks the whole file at load (on a copy of
    the state: it changes nothing yet), and kept in ``state["timeline"]`` for :func:`apply_timeline`."""
    if not words or "=" not in words[0]:
        raise ValueError(f"scenario line {line_no}: at needs call=N or ms=T")
    key, _, value = words[0].partition("=")
    if key not in ("call", "ms"):
        raise ValueError(f"scenario line {line_no}: at: expected call= or ms=, not '{key}='")
    if len(words) < 2:
        raise ValueError(f"scenario line {line_no}: at {words[0]}: the line to apply is missing")
    when = number(value, key)
    if key == "call" and when == 0:
        raise ValueError(f"scenario line {line_no}: at call=0: calls are counted from 1")
    apply_step(copy.deepcopy(state), words[1], words[2:], line_no)
    state["timeline"].append((key, when, words[1], words[2:], line_no))


def apply_step(state: State, keyword: str, rest: list[str], line_no: int) -> None:
    """Apply one timeline line (the part after ``at ...``)."""
    if keyword == "device":
        apply_device(state, parse_pairs(rest, DEVICE_KEYS, line_no), line_no)
    elif keyword == "process":
        apply_process(state, parse_pairs(rest, PROCESS_KEYS, line_no), line_no)
    elif keyword == "mig":
        apply_mig(state, parse_pairs(rest, MIG_KEYS, line_no), line_no)
    elif keyword == "fault":  # in force from its moment on (a counted one counts the calls from then, as the stub's)
        apply_fault(state, parse_pairs(rest, FAULT_KEYS, line_no), line_no)
    elif keyword not in ("race", "quirk", "event"):  # nvidia-smi has no events: the line changes nothing
        raise ValueError(f"scenario line {line_no}: at cannot apply {keyword!r}")


def apply_timeline(state: State, calls: int) -> None:
    """Apply the timeline lines due at this run's first call, in file order, after the static ones (as the stub
    applies them after the load). ``at ms=T``: T ms have passed since the scenario file was written (its mtime;
    each run is a new process). ``at call=N``: this run's first call is the N-th or later; ``calls`` is how many
    the earlier runs made (:class:`FaultCounts`: one per run and one per GPU it reports)."""
    if not state["timeline"]:
        return
    age_s = time.time() - os.stat(state["path"]).st_mtime
    for key, when, keyword, rest, line_no in state["timeline"]:
        if (key == "ms" and age_s >= when / 1000.0) or (key == "call" and when <= calls + 1):
            apply_step(state, keyword, rest, line_no)


def apply_system(state: State, pairs: dict[str, str], line_no: int) -> None:
    for key, value in pairs.items():
        state["system"][key] = number(value, "cuda") if key == "cuda" else value


# Scenario keyword -> (its keys, what applies the line).
LINE_KINDS: dict[str, tuple[set[str], Any]] = {
    "system": ({"driver", "nvml", "cuda"}, apply_system),
    "device": (DEVICE_KEYS, apply_device),
    "process": (PROCESS_KEYS, apply_process),
    "mig": (MIG_KEYS, apply_mig),
    "fault": (FAULT_KEYS, apply_fault),
}


def load_scenario(path: str) -> State:
    state: State = {
        "system": {"driver": "580.159.04", "nvml": "13.580.159.04", "cuda": 13000},
        "devices": [],
        "processes": [],
        "migs": [],
        "faults": [],  # the fault lines rendered (apply_fault), in file order
        "timeline": [],  # the at lines: (call or ms, N or T, keyword, words, line number), in file order
        "path": path,  # where the counted faults keep their counts (FaultCounts)
    }
    try:
        with open(path, encoding="utf-8") as f:
            # Lines end at "\n" only (a trailing "\r" is dropped), as the stub reads them: str.splitlines() would
            # also break at \v, \f, \x1c-\x1e, \x85 and U+2028/U+2029, which a quoted value may hold.
            lines = [line.removesuffix("\r") for line in f.read().split("\n")]
    except OSError as exc:  # as the stub's nvmlInit fails: an error that names the file, not a traceback
        raise ValueError(f"cannot read the scenario {path}: {exc.strerror or exc}") from None
    seen_magic = False
    for no, line in enumerate(lines, start=1):
        try:
            seen_magic = load_line(state, line, no, seen_magic)
        except ValueError as exc:  # as the stub names it: the file, the line, the word
            text = str(exc).removeprefix(f"scenario line {no}: ")
            raise ValueError(f"scenario {path} line {no}: {text}") from None
    if not seen_magic:
        raise ValueError(f"scenario {path}: empty file")
    return state


def load_line(state: State, line: str, no: int, seen_magic: bool) -> bool:
    """Read line ``no`` into ``state``; whether the format line was seen (this one or an earlier one)."""
    words = tokenize(line, no)
    if not words:
        return seen_magic
    if not seen_magic:
        if words != ["nvmlcheck-stub-scenario", "1"]:
            raise ValueError(f"scenario line {no}: expected 'nvmlcheck-stub-scenario 1'")
        return True
    keyword, rest = words[0], words[1:]
    if keyword in LINE_KINDS:
        keys, apply = LINE_KINDS[keyword]
        apply(state, parse_pairs(rest, keys, no), no)
    elif keyword == "at":
        apply_at(state, rest, no)
    elif keyword not in ("race", "quirk"):
        raise ValueError(f"scenario line {no}: unknown keyword {keyword!r}")
    return True


# --- live state ----------------------------------------------------------------------------------------------------


def alive(proc: Proc) -> bool:
    """A bound process is there while /proc/<pid> exists and is no zombie (unless zombies hold memory)."""
    if not proc["bound"]:
        return True
    try:
        with open(f"/proc/{proc['pid']}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    status = stat.rsplit(")", 1)[-1].split()[0]
    return status != "Z" or proc["zombie_holds"]


def process_name(pid: int) -> str | None:
    """argv[0] from /proc/<pid>/cmdline, as NVML reports it; None when the process is not visible here."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    first = raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return first or None


def ceil_mib(value: int) -> int:
    return math.ceil(value / MIB)


class FaultCounts:
    """What earlier runs counted, across runs: the calls each counted fault (``after``/``count``) has seen, and the
    NVML calls of every run (``calls``, for ``at call=N``: one per run, its ``nvmlInit``, and one per GPU it reports).
    A JSON file beside the scenario, read and written under an exclusive lock by :meth:`hold`. A scenario with no
    counted fault and no ``at call=`` line needs no count: it reads and writes nothing."""

    def __init__(self, path: str, state: State) -> None:
        self.path = path + ".fake-smi-counts"  # nvmlcheck._sim.session.FAKE_SMI_COUNTS_SUFFIX: a simulation resets it
        self.scenario = path
        self.needed = any(f["after"] or f["count"] for f in state["faults"]) or any(
            key == "call" or keyword == "fault" for key, _, keyword, _, _ in state["timeline"])
        self.seen: dict[str, int] = {}
        self.calls = 0
        self._fd: int | None = None
        self._stamp = ""

    def fires(self, fault: dict[str, Any]) -> bool:
        if not (fault["after"] or fault["count"]):
            return True  # sticky: every call
        calls = self.seen.get(fault["id"], 0) + 1
        self.seen[fault["id"]] = calls
        return calls > fault["after"] and (not fault["count"] or calls <= fault["after"] + fault["count"])

    def hold(self) -> None:
        """Lock the counts and read them (those of an earlier version of the scenario file count for nothing)."""
        if not self.needed:
            return
        import fcntl

        try:
            st = os.stat(self.scenario)
            self._stamp = f"{st.st_dev}:{st.st_ino}:{st.st_mtime_ns}:{st.st_size}"
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ValueError(f"cannot keep the fault counts in {self.path}: {exc.strerror or exc}") from None
        self._fd = fd
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = b""
        while chunk := os.read(fd, 65536):
            raw += chunk
        try:
            saved = json.loads(raw) if raw else {}
        except ValueError:
            saved = {}
        if isinstance(saved, dict) and saved.get("scenario") == self._stamp and isinstance(saved.get("seen"), dict):
            self.seen = {str(k): int(v) for k, v in saved["seen"].items()}
            self.calls = int(saved.get("calls", 0))

    def release(self) -> None:
        """Write the counts back and unlock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            data = json.dumps({"scenario": self._stamp, "seen": self.seen, "calls": self.calls}).encode()
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, data)
        finally:
            os.close(fd)  # the lock goes with it


class View:
    """The scenario's state as nvidia-smi would print it, with live processes resolved."""

    def __init__(self, state: State, counts: FaultCounts) -> None:
        self.system = state["system"]
        self.devices = state["devices"]
        self.processes = [p for p in state["processes"] if alive(p)]
        self.migs: list[dict[str, Any]] = state["migs"]
        self.placeholder = os.environ.get("FAKE_SMI_PLACEHOLDER", "[N/A]")
        self.faults: list[dict[str, Any]] = state["faults"]
        self.counts = counts
        self.gpus_read = 0  # the GPUs this run reports (each one NVML call more, for at call=N)
        self.delay_s = 0.0  # what the faults that fired in this run add to its answer
        self._answers: dict[tuple[int, str], int | None] = {}  # (GPU, key) -> the code it answered in this run

    def failed(self, dev: Dev, key: str) -> str | None:
        """The placeholder nvidia-smi prints for ``key`` of ``dev`` when a fault answers its NVML call. Asked once per
        run for each GPU and key (one NVML call per GPU), however many fields print the answer; a device that is
        not one of the scenario's (a field's probe) makes no call."""
        if not any(d is dev for d in self.devices):
            return None
        if (dev["index"], key) not in self._answers:
            self._answers[(dev["index"], key)] = self._call(dev["index"], key)
        code = self._answers[(dev["index"], key)]
        if code is None:
            return None
        return self.placeholder if code == 3 else FAULT_TEXT.get(code, "[Unknown Error]")

    def _call(self, index: int, key: str) -> int | None:
        """One call of ``key``'s NVML function on GPU ``index``: every matching fault counts it; the delays of those
        that fire add up; the first that fires with a code decides the answer (as the stub does)."""
        code = None
        for fault in self.faults:
            if fault["key"] != key or fault["device"] not in (None, index):
                continue
            if not self.counts.fires(fault):
                continue
            self.delay_s += fault["delay_ms"] / 1000.0
            if code is None:
                code = fault["code"]
        return code


    def used(self, dev: Dev) -> int:
        held: int = sum(p["holds"] for p in self.processes if p["device"] == dev["index"])
        return int(dev["used"]) + held

    def unsupported(self, dev: Dev, *names: str) -> bool:
        return any(n in dev["unsupported"] for n in names)

    def mig_devices(self, dev: Dev) -> list[dict[str, Any]]:
        """The MIG devices of ``dev`` when it is in MIG mode, by index."""
        if not dev["mig"] or self.unsupported(dev, "mig"):
            return []
        return sorted((m for m in self.migs if m["device"] == dev["index"]), key=lambda m: m["index"])

    def mig_used(self, m: dict[str, Any]) -> int:
        """A MIG device's used memory: its own idle use plus what processes in its instance hold."""
        held: int = sum(
            p["holds"]
            for p in self.processes
            if p["device"] == m["device"] and p["gi"] == m["gi"] and (p["ci"] is None or p["ci"] == m["ci"])
        )
        return int(m["used"]) + held

    def procs(self, dev: Dev, kind: str) -> list[Proc]:
        return [p for p in self.processes if p["device"] == dev["index"] and p["kind"] == kind]


# --- CSV fields ----------------------------------------------------------------------------------------------------


def gpu_field(view: View, dev: Dev, name: str) -> Cell:
    """(header name, unit or None, value: int | str | None for a placeholder) of one --query-gpu field."""
    mem = None if view.unsupported(dev, "memory") else dev
    used = view.used(dev)
    free = max(0, dev["total"] - dev["reserved"] - used)
    simple = {
        "index": ("index", None, dev["index"]),
        "count": ("count", None, len(view.devices)),
        "driver_version": ("driver_version", None, view.system["driver"]),
        "pstate": ("pstate", None, "P0"),
        "temperature.gpu": ("temperature.gpu", None, 39),
        "persistence_mode": ("persistence_mode", None, "Enabled"),
        "compute_mode": ("compute_mode", None, "Default"),
    }  # fmt: skip
    if name in simple:
        return simple[name]
    if name == "mig.mode.current":  # (asked only when printed: a counted fault counts the calls made)
        mode = None if view.unsupported(dev, "mig") else "Enabled" if dev["mig"] else "Disabled"
        return name, None, view.failed(dev, "mig") or mode
    ident = {
        "name": "name", "gpu_name": "name", "uuid": "uuid", "gpu_uuid": "uuid",
        "pci.bus_id": "pci", "gpu_bus_id": "pci", "serial": "serial", "gpu_serial": "serial",
    }  # fmt: skip
    if name in ident:
        key = ident[name]
        header = {"pci": "pci.bus_id"}.get(key, key)
        return header, None, view.failed(dev, key) or (None if view.unsupported(dev, key) else dev[key])
    memory = {
        "memory.total": dev["total"], "memory.reserved": dev["reserved"], "memory.used": used, "memory.free": free,
    }  # fmt: skip
    if name in memory:
        return name, "MiB", view.failed(dev, "memory") or (None if mem is None else ceil_mib(memory[name]))
    clock = clock_field(name)
    if clock is not None:
        header, key = clock
        return header, "MHz", view.failed(dev, key.split(".")[0]) or (None if view.unsupported(dev, key) else dev[key])
    if name in ("clocks_event_reasons.active", "clocks_throttle_reasons.active"):
        reasons = None if view.unsupported(dev, "reasons") else f"0x{dev['reasons']:016x}"
        value = view.failed(dev, "reasons") or reasons
        return "clocks_event_reasons.active", None, value
    return health_field(view, dev, name)


CLOCK_GROUPS = {"current": "clock", "max": "max", "applications": "app"}
CLOCK_DOMAINS = {"graphics": "graphics", "gr": "graphics", "sm": "sm", "memory": "mem", "mem": "mem",
                 "video": "video"}  # fmt: skip
# Which clock fields the real --query-gpu offers (no clocks.max.video, no clocks.applications.sm/video).
CLOCK_OFFERED = {
    ("current", "graphics"), ("current", "sm"), ("current", "mem"), ("current", "video"),
    ("max", "graphics"), ("max", "sm"), ("max", "mem"), ("applications", "graphics"), ("applications", "mem"),
}  # fmt: skip


def clock_field(name: str) -> tuple[str, str] | None:
    parts = name.split(".")
    if parts[0] != "clocks":
        return None
    if len(parts) == 2:  # clocks.sm is clocks.current.sm
        parts = ["clocks", "current", parts[1]]
    if len(parts) != 3 or parts[1] not in CLOCK_GROUPS or parts[2] not in CLOCK_DOMAINS:
        return None
    group, domain = parts[1], CLOCK_DOMAINS[parts[2]]
    if (group, domain) not in CLOCK_OFFERED:
        return None
    printed = {"graphics": "graphics", "sm": "sm", "mem": "memory", "video": "video"}[domain]
    return f"clocks.{group}.{printed}", f"{CLOCK_GROUPS[group]}.{domain}"


def health_field(view: View, dev: Dev, name: str) -> Cell:
    sbe = sum(1 for p in dev["retired"] if p[0] == "sbe")
    dbe = sum(1 for p in dev["retired"] if p[0] == "dbe")
    no_retire = view.unsupported(dev, "retired_pages")
    no_remap = view.unsupported(dev, "remapped")
    no_ecc = view.unsupported(dev, "ecc")
    corr, unc, pending, failure = dev["remapped"]
    table = {
        ("retired_pages.single_bit_ecc.count", "retired_pages.sbe"): ("retired_pages.single_bit_ecc.count",
                                                                      None if no_retire else sbe),
        ("retired_pages.double_bit.count", "retired_pages.dbe"): ("retired_pages.double_bit.count",
                                                                  None if no_retire else dbe),
        ("retired_pages.pending",): ("retired_pages.pending", None if view.unsupported(dev, "retired_pending")
                                     else yes_no(dev["retired_pending"])),
        ("remapped_rows.correctable", "remapped_rows.sbe"): ("remapped_rows.correctable", None if no_remap else corr),
        ("remapped_rows.uncorrectable", "remapped_rows.dbe"): ("remapped_rows.uncorrectable",
                                                              None if no_remap else unc),
        ("remapped_rows.pending",): ("remapped_rows.pending", None if no_remap else yes_no(pending)),
        ("remapped_rows.failure",): ("remapped_rows.failure", None if no_remap else yes_no(failure)),
        ("ecc.errors.uncorrected.volatile.total",): ("ecc.errors.uncorrected.volatile.total",
                                                      None if no_ecc else dev["ecc_volatile"]),
        ("ecc.errors.uncorrected.aggregate.total",): ("ecc.errors.uncorrected.aggregate.total",
                                                       None if no_ecc else dev["ecc_aggregate"]),
        ("gpu_recovery_action",): ("gpu_recovery_action", None if view.unsupported(dev, "recovery")
                                   else RECOVERY_WORDS.get(dev["recovery"], str(dev["recovery"]))),
    }  # fmt: skip
    for names, (header, value) in table.items():
        if name in names:
            # A fault on the NVML call behind the field prints its placeholder (a fault comes before "not
            # supported", as in the stub).
            return header, None, view.failed(dev, health_call(header)) or value
    raise KeyError(name)


def health_call(header: str) -> str:
    """The ``FAULT_FIELDS`` key of the NVML call behind a health field."""
    if header == "retired_pages.pending":
        return "retired_pending"
    return {"remapped_rows": "remapped", "retired_pages": "retired_pages", "ecc": "ecc"}.get(
        header.split(".", maxsplit=1)[0], "recovery")


# How nvidia-smi -q and gpu_recovery_action print nvmlDeviceGpuRecoveryAction_t ("None" as captured on driver 580;
# "Reset", "Reboot", "Drain P2P", "Drain and Reset" as printed on faulted GPUs in public reports); other codes: the
# number.
RECOVERY_WORDS = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset"}


def yes_no(v: int) -> str:
    return "Yes" if v else "No"


def cell(value: Value, unit: str | None, fmt: Fmt, placeholder: str) -> str:
    if value is None:
        return placeholder
    if isinstance(value, str) and value.startswith("["):  # a placeholder has no unit, with csv or csv,nounits
        return value
    if unit is not None and not fmt["nounits"]:
        return f"{value} {unit}"
    return str(value)


def header_line(header: list[Cell]) -> str:
    return ", ".join(h + (f" [{u}]" if u else "") for h, u, _ in header)


def row_line(row: list[Cell], fmt: Fmt) -> str:
    return ", ".join(cell(v, u, fmt, fmt["placeholder"]) for _, u, v in row)


def csv_with_header(header: list[Cell], rows: Sequence[list[Cell] | str], fmt: Fmt) -> str:
    out = [] if fmt["noheader"] else [header_line(header)]
    out.extend(row_line(row, fmt) if not isinstance(row, str) else row for row in rows)
    return "".join(line + "\n" for line in out)


def lost_line(dev: Dev) -> str:
    return (
        f"Unable to determine the device handle for GPU{dev['pci']}: GPU is lost. Reboot the system to recover this GPU"
    )


def query_gpu(view: View, devices: list[Dev], fields: list[str], fmt: Fmt) -> tuple[str, int]:
    header = [gpu_field(view, default_device(0), f) for f in fields]
    rows: list[list[Cell] | str] = []
    exit_code = 0
    for dev in devices:
        if not dev["lost"]:
            rows.append([gpu_field(view, dev, f) for f in fields])
        elif os.environ.get("FAKE_SMI_LOST_STYLE") == "placeholder":
            rows.append(", ".join(str(dev["index"]) if h == "index" else "[GPU requires reset]" for h, _, _ in header))
        else:
            rows.append(lost_line(dev))
            exit_code = 15
    return csv_with_header(header, rows, fmt), exit_code


def csv_name(name: str | None) -> str | None:
    if name is None:
        return None
    return name if os.environ.get("FAKE_SMI_RAW_COMMAS") == "1" else name.replace(",", "?")


def app_field(view: View, dev: Dev, proc: Proc, name: str) -> Cell:
    if name in ("process_name", "name"):
        return "process_name", None, csv_name(process_name(proc["pid"])) or "[Not Found]"
    if name in ("used_gpu_memory", "used_memory"):
        return "used_gpu_memory", "MiB", None if proc["used"] is None else ceil_mib(proc["used"])
    if name == "pid":
        return "pid", None, proc["pid"]
    return common_field(view, dev, name)


def common_field(view: View, dev: Dev, name: str) -> Cell:
    table = {"gpu_uuid": dev["uuid"], "gpu_bus_id": dev["pci"], "gpu_name": dev["name"], "gpu_serial": dev["serial"],
             "timestamp": time.strftime("%Y/%m/%d %H:%M:%S.000")}  # fmt: skip
    if name not in table:
        raise KeyError(name)
    return name, None, table[name]


def query_apps(view: View, devices: list[Dev], fields: list[str], fmt: Fmt) -> tuple[str, int]:
    header = [app_field(view, default_device(0), {"pid": 1, "used": 0}, f) for f in fields]
    rows = []
    for dev in devices:
        if view.unsupported(dev, "processes.compute"):
            rows.append([(h, u, dev["uuid"] if h == "gpu_uuid" else None) for h, u, _ in header])
            continue
        rows.extend([app_field(view, dev, p, f) for f in fields] for p in view.procs(dev, "compute"))
    return csv_with_header(header, rows, fmt), 0


def query_retired(view: View, devices: list[Dev], fields: list[str], fmt: Fmt) -> tuple[str, int]:
    def field(dev: Dev, page: tuple[str, int, int | None] | None, name: str) -> Cell:
        if name == "retired_pages.address":
            return name, None, None if page is None else f"0x{page[1]:016x}"
        if name == "retired_pages.timestamp":
            return name, None, None if page is None or page[2] is None else page[2]
        if name == "retired_pages.cause":
            return name, None, {"sbe": "Single Bit ECC", "dbe": "Double Bit ECC"}[page[0] if page else "sbe"]
        return common_field(view, dev, name)

    header = [field(default_device(0), None, f) for f in fields]
    rows = []
    for dev in devices:
        if view.unsupported(dev, "retired_pages"):
            # Placeholder rows, one per cause, as driver 580 prints on Hopper.
            for cause in ("sbe", "dbe"):
                rows.append([field(dev, (cause, 0, None), f) for f in fields])
                rows[-1] = [(h, u, None if h in ("retired_pages.address", "retired_pages.timestamp") else v)
                            for h, u, v in rows[-1]]  # fmt: skip
            continue
        rows.extend([field(dev, page, f) for f in fields] for page in dev["retired"])
    return csv_with_header(header, rows, fmt), 0


def query_remapped(view: View, devices: list[Dev], fields: list[str], fmt: Fmt) -> tuple[str, int]:
    def field(dev: Dev, name: str) -> Cell:
        try:
            return common_field(view, dev, name)
        except KeyError:
            return health_field(view, dev, name)

    header = [field(default_device(0), f) for f in fields]
    rows = [[field(dev, f) for f in fields] for dev in devices]
    return csv_with_header(header, rows, fmt), 0


# --- -q -d PIDS ----------------------------------------------------------------------------------------------------


def kv(indent: int, key: str, value: object, width: int) -> str:
    return f"{' ' * indent}{key:<{width - indent}}: {value}"


def query_pids(view: View, devices: list[Dev], full: bool = False) -> tuple[str, int]:
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        kv(0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y"), 55),
        kv(0, "Driver Version", view.system["driver"], 55),
        kv(0, "CUDA Version", f"{view.system['cuda'] // 1000}.{view.system['cuda'] % 1000 // 10}", 55),
        "",
        kv(0, "Attached GPUs", len(view.devices), 55),
    ]
    exit_code = 0
    for dev in devices:
        if dev["lost"]:
            out.append(lost_line(dev))
            exit_code = 15
            continue
        out.append(f"GPU {dev['pci']}")
        if full:
            out += full_q_sections(view, dev)
        failed = view.failed(dev, "processes")  # -q prints a process list it could not read as one placeholder
        if failed is not None:
            out.append(kv(4, "Processes", "N/A" if failed == view.placeholder else failed, 55))
            continue
        if view.unsupported(dev, "processes.compute", "processes.graphics", "processes.mps"):
            out.append(kv(4, "Processes", "N/A", 55))
            continue
        entries = merged_processes(view, dev)
        if not entries:
            out.append(kv(4, "Processes", "None", 55))
            continue
        out.append("    Processes")
        for e in entries:
            out += [
                kv(8, "GPU instance ID", "N/A" if e["gi"] is None else e["gi"], 42),
                kv(8, "Compute instance ID", "N/A" if e["ci"] is None else e["ci"], 42),
                kv(8, "Process ID", e["pid"], 42),
                kv(12, "Type", e["type"], 42),
                kv(12, "Name", process_name(e["pid"]) or "N/A", 42),
                kv(12, "Used GPU Memory", "N/A" if e["used"] is None else f"{ceil_mib(e['used'])} MiB", 42),
            ]
    out.append("")
    return "".join(line + "\n" for line in out), exit_code


def full_q_sections(view: View, dev: Dev) -> list[str]:
    """The parts of a full ``-q`` GPU block this fake renders: identity, MIG Mode, the MIG Device blocks (in the
    layout of NVIDIA's MIG user guide and the driver-580 ``-q`` captures), FB Memory Usage."""
    mode = "N/A" if view.unsupported(dev, "mig") else ("Enabled" if dev["mig"] else "Disabled")
    used = view.used(dev)
    # The memory call answers for the GPU and its MIG devices alike (the stub checks the parent's unsupported= and
    # faults on a MIG handle too): when it fails, every FB Memory Usage value is its placeholder, never a number.
    failed = view.placeholder if view.unsupported(dev, "memory") else view.failed(dev, "memory")

    def mib(value: int) -> str:
        return failed if failed is not None else f"{ceil_mib(value)} MiB"

    out = [
        kv(4, "Product Name", dev["name"], 55),
        kv(4, "Persistence Mode", "Enabled", 55),
        "    MIG Mode",
        kv(8, "Current", mode, 55),
        kv(8, "Pending", mode, 55),
    ]
    migs = view.mig_devices(dev)
    # Listing them is a call of nvmlDeviceGetMigDeviceHandleByIndex (and of nvmlDeviceGetMaxMigDeviceCount) on a
    # GPU in MIG mode: a fault on it prints its placeholder where the MIG Device blocks would be.
    listing = view.failed(dev, "mig_devices") if dev["mig"] and not view.unsupported(dev, "mig") else None
    if listing is not None:
        out.append(kv(4, "MIG Devices", listing, 55))
        migs = []
    if migs:
        out.append("    MIG Devices")
    for m in migs:
        mu = view.mig_used(m)
        out += [
            "        MIG Device",
            kv(12, "Index", m["index"], 55),
            kv(12, "GPU Instance ID", m["gi"], 55),
            kv(12, "Compute Instance ID", m["ci"], 55),
            "            Device Attributes",
            "                Shared",
            kv(20, "Multiprocessor count", 16, 55),
            kv(20, "Copy Engine count", 1, 55),
            "            FB Memory Usage",
            kv(16, "Total", mib(m["total"]), 55),
            kv(16, "Reserved", mib(0), 55),
            kv(16, "Used", mib(mu), 55),
            kv(16, "Free", mib(max(0, m["total"] - mu)), 55),
        ]
    out += [
        kv(4, "Serial Number", dev["serial"], 55),
        kv(4, "GPU UUID", dev["uuid"], 55),
        "    FB Memory Usage",
        kv(8, "Total", mib(dev["total"]), 55),
        kv(8, "Reserved", mib(dev["reserved"]), 55),
        kv(8, "Used", mib(used), 55),
        kv(8, "Free", mib(max(0, dev["total"] - dev["reserved"] - used)), 55),
    ]
    return out


def list_gpus(view: View, devices: list[Dev]) -> str:
    """``nvidia-smi -L``: one line per GPU, one indented line per MIG device."""
    out = []
    for dev in devices:
        out.append(f"GPU {dev['index']}: {dev['name']} (UUID: {dev['uuid']})")
        for m in view.mig_devices(dev):
            out.append(f"  MIG {1}g.{m['total'] // (1 << 30)}gb     Device  {m['index']}: (UUID: {m['uuid']})")
    return "".join(line + "\n" for line in out)


def merged_processes(view: View, dev: Dev) -> list[dict[str, Any]]:
    """One entry per pid, typed like the real one: C, G, M, M+C, C+G (letters in the order M, C, G)."""
    by_pid: dict[int, dict[str, Any]] = {}
    for kind, letter in (("mps", "M"), ("compute", "C"), ("graphics", "G")):
        for p in view.procs(dev, kind):
            e = by_pid.setdefault(p["pid"], {"pid": p["pid"], "letters": [], "used": p["used"], "gi": p["gi"],
                                             "ci": p["ci"]})  # fmt: skip
            e["letters"].append(letter)
            if e["used"] is None:
                e["used"] = p["used"]
    for e in by_pid.values():
        e["type"] = "+".join(e["letters"])
    return list(by_pid.values())


# --- command line --------------------------------------------------------------------------------------------------


def parse_format(value: str) -> dict[str, bool]:
    parts = value.split(",")
    if parts[0] != "csv" or any(p not in ("noheader", "nounits") for p in parts[1:]):
        raise Usage("Format modifier is not recognized.\n")
    return {"noheader": "noheader" in parts, "nounits": "nounits" in parts}


def select(devices: list[Dev], ids: str | None) -> list[Dev]:
    if ids is None:
        return devices
    chosen = []
    for raw in ids.split(","):
        token = raw.strip()
        for dev in devices:
            matches = token in (str(dev["index"]), dev["uuid"]) or token.upper() == dev["pci"].upper()
            if matches and dev not in chosen:
                chosen.append(dev)
    return chosen


def parse_args(argv: list[str]) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "ids": None,
        "format": None,
        "query": None,
        "fields": None,
        "q": False,
        "d": None,
        "version": False,
        "list": False,
    }
    it = iter(argv)
    for arg in it:
        if arg in ("-i", "--id"):
            opts["ids"] = next(it, "")
        elif arg.startswith(("--id=", "-i=")):
            opts["ids"] = arg.split("=", 1)[1]
        elif arg.startswith("--format="):
            opts["format"] = arg.split("=", 1)[1]
        elif arg.startswith("--query-"):
            kind, _, fields = arg[len("--query-") :].partition("=")
            opts["query"], opts["fields"] = kind, [f.strip() for f in fields.split(",")]
        elif arg in ("-q", "--query"):
            opts["q"] = True
        elif arg in ("-d", "--display"):
            opts["d"] = next(it, "")
        elif arg == "--version":
            opts["version"] = True
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        else:
            raise Usage(f"Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n{arg}\n")
    return opts


def knobs_apply(argv: list[str]) -> bool:
    match = os.environ.get("FAKE_SMI_MATCH")
    return match is None or any(match in a for a in argv)


def apply_knobs(argv: list[str]) -> int | None:
    if not knobs_apply(argv):
        return None
    delay = os.environ.get("FAKE_SMI_DELAY_S")
    if delay:
        time.sleep(float(delay))
    if os.environ.get("FAKE_SMI_HANG") == "1":
        # A child in our process group: the caller's timeout must kill it too, not only us.
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time\nwhile True: time.sleep(3600)"])
        pid_file = os.environ.get("FAKE_SMI_CHILD_PID_FILE")
        if pid_file:
            # Written whole, then renamed: a run killed while writing never leaves an empty file behind.
            with open(f"{pid_file}.{os.getpid()}", "w", encoding="utf-8") as f:
                f.write(f"{child.pid}\n")
            os.replace(f"{pid_file}.{os.getpid()}", pid_file)
        while True:
            time.sleep(3600)
    code = os.environ.get("FAKE_SMI_EXIT")
    if code:
        rc = int(code)
        texts = {4: NO_PERMISSION, 6: NO_DEVICES, 9: NO_DRIVER, 18: MISMATCH, 255: INIT_UNKNOWN}
        if rc == 2:
            first = next((a.split("=", 1)[1].split(",")[0] for a in argv if a.startswith("--query-")), "bogus.field")
            texts[2] = f'Field "{first}" is not a valid field to query.\n\n'
        sys.stdout.write(texts.get(rc, ""))
        if rc not in texts:
            sys.stderr.write(f"fake nvidia-smi: exiting with {rc} as asked\n")
        return rc
    return None


QUERIES = {"gpu": query_gpu, "compute-apps": query_apps, "retired-pages": query_retired,
           "remapped-rows": query_remapped}  # fmt: skip


def check_fields(opts: dict[str, Any], view: View) -> None:
    refused = {f for f in os.environ.get("FAKE_SMI_REFUSE_FIELDS", "").split(",") if f}
    probe = default_device(0)
    for name in opts["fields"]:
        ok = name not in refused
        if ok:
            try:
                if opts["query"] == "gpu":
                    gpu_field(view, probe, name)
                elif opts["query"] == "compute-apps":
                    app_field(view, probe, {"pid": 1, "used": 0}, name)
                elif opts["query"] == "retired-pages":
                    query_retired(view, [], [name], {"noheader": True, "nounits": True, "placeholder": "[N/A]"})
                else:
                    query_remapped(view, [], [name], {"noheader": True, "nounits": True, "placeholder": "[N/A]"})
            except KeyError:
                ok = False
        if not ok:
            raise Usage(f'Field "{name}" is not a valid field to query.\n\n')


def main(argv: list[str]) -> int:
    log = os.environ.get("FAKE_SMI_ARGV_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")
    rc = apply_knobs(argv)
    if rc is not None:
        return rc
    try:
        opts = parse_args(argv)
        path = os.environ.get("NVMLCHECK_STUB_SCENARIO")
        if not path:
            sys.stdout.write(NO_DRIVER)  # no scenario: a machine without a driver, like the stub library
            return 9
        state = load_scenario(path)
        counts = FaultCounts(path, state)
        counts.hold()
        try:
            apply_timeline(state, counts.calls)
            view = View(state, counts)
            text, code = answer(view, opts)
            counts.calls += 1 + view.gpus_read  # its nvmlInit and a handle per GPU reported
        finally:
            counts.release()
        if view.delay_s:  # a fault's delay: after the counts are let go, so an overlapping run is not held up
            time.sleep(view.delay_s)
        sys.stdout.write(text)
        return code
    except Usage as exc:
        sys.stdout.write(str(exc))
        return 2
    except ValueError as exc:
        sys.stderr.write(f"fake nvidia-smi: {exc}\n")
        return 255


def answer(view: View, opts: dict[str, Any]) -> tuple[str, int]:
    """What a run prints, and its exit status (``Usage``: a command line the real one refuses)."""
    if opts["version"]:
        cuda = view.system["cuda"]
        return (
            f"NVIDIA-SMI version  : {view.system['driver']}\nNVML version        : "
            f"{'.'.join(view.system['driver'].split('.')[:2])}\nDRIVER version      : {view.system['driver']}\n"
            f"CUDA Version        : {cuda // 1000}.{cuda % 1000 // 10}\n"
        ), 0
    devices = select(view.devices, opts["ids"])
    view.gpus_read = len(devices)
    if (opts["ids"] is not None and not devices) or not view.devices:
        return NO_DEVICES, 6
    if opts["list"]:
        return list_gpus(view, devices), 0
    if opts["q"]:
        if opts["d"] not in ("PIDS", None):
            raise Usage("this fake supports only -q -d PIDS and a bare -q\n")
        return query_pids(view, devices, full=opts["d"] is None)
    if opts["query"] not in QUERIES or opts["format"] is None:
        raise Usage("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
    fmt = {**parse_format(opts["format"]), "placeholder": view.placeholder}
    check_fields(opts, view)
    return QUERIES[opts["query"]](view, devices, opts["fields"], fmt)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
