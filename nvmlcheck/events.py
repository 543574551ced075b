"""NVML events: a listener thread that hears XID errors, ECC errors and clock/power changes as they happen.

>>> import nvmlcheck as nc
>>> with nc.open() as gpus:                                  # doctest: +SKIP
...     listener = gpus.listen()                             # one thread per session, started on demand
...     gpus.wait_until_clean(timeout=30.0)                  # aborts with GpuFault on XID 79, 48, ...

Entry points: :class:`EventListener` (made by :meth:`~nvmlcheck.Session.listen`, stopped by ``close``),
:class:`GpuEvent`, :data:`XID_TABLE` / :func:`xid_info` (which XIDs are fatal) and :func:`check_fatal`, which waits
call before each poll. Without events (old library, NOT_SUPPORTED, no permission, the smi backend) the listener says
why and waits only poll. Registration, the wait slice, fork() and the XID sources: docs/events.md.
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import GpuFault, NoPermission, NotSupported, NvmlCheckError, NvmlError, Uninitialized
from .model import OperatorAction

__all__ = [
    "EVENT_SCHEMA",
    "EVENT_SCHEMA_VERSION",
    "FATAL_KINDS",
    "WAIT_SLICE_MS",
    "XID_TABLE",
    "EventKind",
    "EventListener",
    "EventTarget",
    "GpuEvent",
    "ListeningGap",
    "XidInfo",
    "xid_info",
]

#: ``schema`` of an event's JSON document (``nvmlcheck watch --json``, study records).
EVENT_SCHEMA = "nvmlcheck/event"
#: Its version.
EVENT_SCHEMA_VERSION = 1
#: The longest single ``nvmlEventSetWait_v2``: bounds how long :meth:`EventListener.stop` (a session's close) waits
#: for the thread, since the call cannot be interrupted. Short: 100 ms added ~100 ms to every ``--events`` command
#: (issue 27); a slice costs one call, so 10 ms is 100 calls a second while listening (docs/events.md).
WAIT_SLICE_MS = 10
#: How long a wait, ``ready`` or ``kill`` waits for the listener's registration before it polls without it (it
#: takes ~11 ms on an H200; a wedged driver can hang ``nvmlDeviceRegisterEvents``): the wait then uses the listener
#: once it runs (state ``"starting"`` until then), and waits that follow do not wait for it again.
START_WAIT_S = 1.0
#: How long :meth:`EventListener.stop` waits for a thread stuck in ``nvmlEventSetWait_v2`` (a wedged driver) before
#: leaving it behind (a daemon thread; the set is then not freed under it).
STOP_TIMEOUT_S = 5.0
#: How many events a listener keeps (:attr:`EventListener.events`): a ``watch`` or a session that listens for weeks
#: hears clock events every few seconds, and kept them all. The oldest are forgotten beyond it; fatal events are kept
#: apart, every one, for waits (:meth:`EventListener.fatal`).
MAX_KEPT_EVENTS = 100_000
#: How many fatal events a listener keeps per GPU for waits (:meth:`EventListener.fatal`). A GPU in an XID storm (an
#: NVLink XID 74 every few milliseconds) made the list, and the scan every poll of every wait made of it, grow without
#: bound. Beyond it the oldest half is forgotten: a wait that began before them still finds a later fatal event.
MAX_KEPT_FATAL_PER_GPU = 1_000
#: How long one ``nvmlEventSetWait_v2`` (a :data:`WAIT_SLICE_MS` call) may go without returning before the listener
#: says ``"stalled"`` instead of ``"running"``: a wedged driver can hang the call, and the state said "running" while
#: nothing was heard. Far above a slice, so that a thread the scheduler or the GIL keeps waiting is not called so.
STALLED_AFTER_S = 1.0
#: How many times the listener asks a GPU after a wait error when the GPU's answer is a transient error
#: (``NVML_ERROR_UNKNOWN``, ``NOT_READY``, ``IN_USE``, ...: ``TRANSIENT`` in :mod:`nvmlcheck.errors`) before it stops
#: listening to it: one such answer dropped a healthy GPU for the life of the listener.
RECOVERY_ATTEMPTS = 3
#: The pause between two of those attempts (or :meth:`EventListener.stop`, whichever comes first).
RECOVERY_RETRY_S = 0.01
#: How many :class:`ListeningGap` records a listener keeps (:meth:`EventListener.gaps`): a driver that stalls every
#: few minutes for weeks must not grow the list without bound. Beyond it the oldest ended ones are forgotten.
MAX_KEPT_GAPS = 1_000


class EventKind(enum.Enum):
    """What an NVML event reports (its ``nvmlEventType`` bit). ``UNKNOWN``: a type nvmlcheck has no name for (a newer
    driver's); the event keeps its raw bits in :attr:`GpuEvent.event_type` and is recorded, never dropped."""

    SINGLE_BIT_ECC = "single_bit_ecc"
    DOUBLE_BIT_ECC = "double_bit_ecc"
    PSTATE = "pstate"
    XID = "xid"
    CLOCK = "clock"
    POWER_SOURCE = "power_source"
    #: GPU or compute instances were created or destroyed: what is on the GPU changed, not its health. Recorded; a
    #: wait's next poll reads the GPU's MIG devices again (each poll of a GPU in MIG mode does).
    MIG_CONFIG = "mig_config"
    SINGLE_BIT_ECC_STORM = "single_bit_ecc_storm"
    DRAM_RETIREMENT = "dram_retirement"
    DRAM_RETIREMENT_FAILURE = "dram_retirement_failure"
    NONFATAL_POISON = "nonfatal_poison"
    FATAL_POISON = "fatal_poison"
    GPU_UNAVAILABLE = "gpu_unavailable"
    GPU_RECOVERY_ACTION = "gpu_recovery_action"
    UNKNOWN = "unknown"


# nvml.h's nvmlEventType* bits (and nvmlEventMigConfigChange).
_KIND_BITS: dict[int, EventKind] = {
    0x1: EventKind.SINGLE_BIT_ECC,
    0x2: EventKind.DOUBLE_BIT_ECC,
    0x4: EventKind.PSTATE,
    0x8: EventKind.XID,
    0x10: EventKind.CLOCK,
    0x80: EventKind.POWER_SOURCE,
    0x100: EventKind.MIG_CONFIG,
    0x200: EventKind.SINGLE_BIT_ECC_STORM,
    0x400: EventKind.DRAM_RETIREMENT,
    0x800: EventKind.DRAM_RETIREMENT_FAILURE,
    0x1000: EventKind.NONFATAL_POISON,
    0x2000: EventKind.FATAL_POISON,
    0x4000: EventKind.GPU_UNAVAILABLE,
    0x8000: EventKind.GPU_RECOVERY_ACTION,
}
#: Every type the listener asks for (masked by what each GPU supports): every type nvmlcheck can name.
WANTED_MASK = sum(_KIND_BITS)
# The kinds that can stop a wait (XID, single- and double-bit ECC): registered alone when the full mask is refused.
_CRITICAL_MASK = 0x1 | 0x2 | 0x8
_XID_BIT = 0x8
# The types asked for before nvml.h's newer ones were (ECC, P-state, XID, clock, power source), with MIG changes, then
# without: a GPU that reports a newer type supported but refuses it keeps the ones it delivered before.
_CLASSIC_MASK = 0x1 | 0x2 | 0x4 | 0x8 | 0x10 | 0x80
_MIG_CONFIG_BIT = 0x100
#: The kinds that stop a wait whatever their data (an XID stops it when :data:`XID_TABLE` calls it fatal): a
#: double-bit ECC error (as XID 48); a *fatal* poison error, NVML's name for an uncontained one (the XID catalogue
#: resolves the uncontained ECC error, XID 95, by a GPU reset; the contained one, XID 94, by restarting the
#: application: ``nonfatal_poison`` is recorded); and a GPU that NVML calls unavailable. Until the fourth round of
#: 2026-12-02 the last two were recorded only, on the assumption that the next poll fails on such a GPU: nothing
#: promises that a GPU NVML calls unavailable or poisoned still answers no memory query, and a wait called it clean.
FATAL_KINDS = frozenset({EventKind.DOUBLE_BIT_ECC, EventKind.FATAL_POISON, EventKind.GPU_UNAVAILABLE})
_MEANINGS = {
    EventKind.SINGLE_BIT_ECC: "single-bit (corrected) ECC error",
    EventKind.DOUBLE_BIT_ECC: "double-bit (uncorrectable) ECC error",
    EventKind.PSTATE: "performance state changed",
    EventKind.CLOCK: "clocks changed",
    EventKind.POWER_SOURCE: "power source changed",
    EventKind.XID: "XID error",
    EventKind.MIG_CONFIG: "MIG configuration changed (instances created or destroyed): its MIG devices are read again",
    EventKind.SINGLE_BIT_ECC_STORM: "single-bit ECC error storm",
    EventKind.DRAM_RETIREMENT: "DRAM retirement event (row remapping or page retirement)",
    EventKind.DRAM_RETIREMENT_FAILURE: "DRAM retirement failed",
    EventKind.NONFATAL_POISON: "non-fatal poison error",
    EventKind.FATAL_POISON: "fatal (uncontained) poison error: the GPU needs a reset",
    EventKind.GPU_UNAVAILABLE: "GPU unavailable: NVML says it cannot be used",
    EventKind.GPU_RECOVERY_ACTION: "GPU recovery action changed (read Health.recovery_action)",
}


@dataclass(frozen=True)
class XidInfo:
    """One XID code: what it means and whether it stops a wait (``fatal``: the GPU cannot become clean without an
    operator: reset, reboot or service). Not fatal: recorded only (application errors, informational events).

    ``bucket``: the "Resolution Bucket (Immediate Action)" of NVIDIA's XID catalogue, verbatim (``RESTART_APP``,
    ``RESET_GPU``, ``RESTART_BM``, ``WORKFLOW_XID_48``, ...; ``""`` for a code the catalogue does not list).
    ``action``: what an operator does, as a :class:`~nvmlcheck.OperatorAction`; ``None`` for a code nvmlcheck does
    not know, and for one whose action the catalogue decides by a subcode that NVML's event does not carry (XIDs 144,
    145, 146 and 149: :attr:`depends_on_subcode`). ``fatal`` is exactly "waiting cannot help":
    ``not action.waiting_helps`` (``False`` without an action: nvmlcheck does not guess a fault).
    """

    code: int
    meaning: str
    fatal: bool
    bucket: str = ""
    action: OperatorAction | None = None
    #: The catalogue's action depends on the message's subcode (intrInfo, errorStatus), which only the kernel log
    #: carries: the event alone cannot say. The GPU's recovery action (``Health.recovery_action``, which ``ready``
    #: reads again after every XID) says what the driver wants.
    depends_on_subcode: bool = False


_library: Any = None  # nvmlcheck._nvml.library, once _fork_generation imported it


def _fork_generation() -> int:
    """``_nvml.library.fork_generation()``, its module imported on first use and not at the top: it loads cffi's
    backend, which a Python without cffi lacks, and the nvidia-smi backend's listener
    (:meth:`EventListener.unavailable`, for ``watch`` and ``wait --events``) needs no NVML. Kept after that: a wait
    asks before every poll."""
    global _library
    if _library is None:
        from ._nvml import library

        _library = library
    return int(_library.fork_generation())


def _x(code: int, meaning: str, bucket: str, action: OperatorAction) -> tuple[int, XidInfo]:
    return code, XidInfo(code, meaning, not action.waiting_helps, bucket, action)


def _by_subcode(code: int, meaning: str) -> tuple[int, XidInfo]:
    return code, XidInfo(code, meaning, False, "WORKFLOW_NVLINK5_ERR", None, depends_on_subcode=True)


_A = OperatorAction
#: XIDs nvmlcheck knows, each checked against NVIDIA's XID catalogue for Ampere and newer GPUs ("Analyzing Xid Errors
#: with the Xid Catalog", https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, read 2026-12-01 and
#: again 2026-12-02 with its "XID 144-150 Decode" table): ``bucket`` is the catalogue's immediate action; ``action``
#: what it comes to for an operator. Fatal ones are those the catalogue resolves by an operator: a GPU reset, a node
#: or VM reboot (RESET_GPU, RESTART_BM, RESTART_VM, and the workflows of 48 and 74, whose text says "a GPU reset or
#: node reboot is needed"), hands on the board (CHECK_MECHANICALS) or a service call (CONTACT_SUPPORT); RESTART_APP
#: and IGNORE are recorded only. XIDs 144-150 (WORKFLOW_NVLINK5_ERR) are classed by their decode table: 147 and 148
#: are IGNORE for every subcode, 150 RESET_GPU for every one; 144, 145, 146 and 149 differ by subcode and are
#: recorded with no action (:attr:`XidInfo.depends_on_subcode`). docs/events.md is the table with its reasoning.
XID_TABLE: dict[int, XidInfo] = dict(
    (
        _x(13, "graphics engine exception (an application fault: bad kernel, out-of-range access)", "RESTART_APP",
           _A.RESTART_APP),
        _x(31, "GPU memory page fault (an application's illegal address)", "RESTART_APP", _A.RESTART_APP),
        _x(43, "GPU stopped processing: the channel was reset after an application fault", "IGNORE", _A.IGNORE),
        _x(45, "preemptive cleanup of a channel after an earlier error or a killed process", "WORKFLOW_XID_45",
           _A.IGNORE),
        _x(46, "GPU stopped processing (timeout)", "RESET_GPU", _A.RESET_GPU),
        _x(48, "double-bit (uncorrectable) ECC error in GPU memory", "WORKFLOW_XID_48", _A.RESET_GPU),
        _x(54, "auxiliary power is not connected to the GPU board (it runs at reduced clocks)", "CHECK_MECHANICALS",
           _A.CHECK_MECHANICALS),
        _x(62, "internal micro-controller halt", "RESET_GPU", _A.RESET_GPU),
        _x(63, "ECC page retirement or row remapping recorded; a GPU reset activates it", "IGNORE", _A.IGNORE),
        _x(64, "ECC page retirement or row remapping failed", "RESET_GPU", _A.RESET_GPU),
        _x(74, "NVLink error", "WORKFLOW_NVLINK_ERR", _A.RESET_GPU),
        _x(79, "GPU has fallen off the bus", "RESTART_BM", _A.NODE_REBOOT),
        _x(92, "high single-bit ECC error rate", "IGNORE", _A.IGNORE),
        _x(94, "contained ECC error: the affected application was stopped, the GPU keeps running", "RESTART_APP",
           _A.RESTART_APP),
        _x(95, "uncontained ECC error: every application on the GPU is affected", "RESET_GPU", _A.RESET_GPU),
        _x(109, "context switch timeout", "RESET_GPU", _A.RESET_GPU),
        _x(110, "security fault error", "RESET_GPU", _A.RESET_GPU),
        _x(119, "GSP RPC timeout: the GPU System Processor stopped answering", "RESET_GPU", _A.RESET_GPU),
        _x(120, "GSP error: the GPU System Processor reported a fatal error", "RESET_GPU", _A.RESET_GPU),
        _x(136, "NVLink link training failed", "RESET_GPU", _A.RESET_GPU),
        _x(140, "unrecovered ECC error", "RESET_GPU", _A.RESET_GPU),
        _x(142, "NVENC3 (video encoder) error", "CONTACT_SUPPORT", _A.CONTACT_SUPPORT),
        _x(143, "GPU initialization error", "RESET_GPU", _A.RESET_GPU),
        _by_subcode(144, "NVLink (NVLink 5) SAW error: a reset or nothing, by its subcode (see the recovery action)"),
        _by_subcode(145, "NVLink (NVLink 5) RLW error: a reset, an application restart or nothing, by its subcode "
                         "(see the recovery action)"),
        _by_subcode(146, "NVLink (NVLink 5) TLW error: a reset or nothing, by its subcode (see the recovery action)"),
        _x(147, "NVLink (NVLink 5) TREX error", "WORKFLOW_NVLINK5_ERR", _A.IGNORE),
        _x(148, "NVLink (NVLink 5) NVLPW_CTRL error", "WORKFLOW_NVLINK5_ERR", _A.IGNORE),
        _by_subcode(149, "NVLink (NVLink 5) NETIR error (link down, bit error rate, ...): mostly a reset, by its "
                         "subcode (see the recovery action)"),
        _x(150, "NVLink (NVLink 5) MSE error (degraded, or its watchdog fired)", "WORKFLOW_NVLINK5_ERR", _A.RESET_GPU),
        _x(151, "key rotation error (confidential computing)", "RESTART_VM", _A.NODE_REBOOT),
        _x(154, "GPU recovery action changed (see nvidia-smi -q for the action required)", "XID_154", _A.IGNORE),
        _x(155, "NVLink software-defined error (a link taken down)", "RESET_GPU", _A.RESET_GPU),
        _x(156, "resource retirement event", "RESET_GPU", _A.RESET_GPU),
        _x(157, "resource retirement failed: no spare resources left (workloads may run on)", "IGNORE", _A.IGNORE),
        _x(158, "GPU fatal timeout", "RESET_GPU", _A.RESET_GPU),
        _x(159, "CHI non-data error on the chip-to-chip (C2C) link: with UVM in use (CUDA uses it) the GPU needs a "
                "reset", "CHECK_UVM", _A.RESET_GPU),
        _x(999, "an XID NVML could not identify", "", _A.IGNORE),
    )
)  # fmt: skip


def xid_info(code: int) -> XidInfo:
    """What ``code`` means; a code outside :data:`XID_TABLE` is recorded, not fatal (its meaning says so)."""
    known = XID_TABLE.get(code)
    if known is not None:
        return known
    return XidInfo(code, f"XID {code} (not in nvmlcheck's table: see NVIDIA's XID catalogue)", False)


@dataclass(frozen=True)
class GpuEvent:
    """One NVML event.

    ``index``/``uuid`` name the GPU; ``kind`` what happened; ``xid`` the XID code of an :attr:`EventKind.XID`
    event (else ``None``); ``time_ns`` when the listener received it (``time.monotonic_ns``) and ``wall_time`` the
    same moment in ``time.time`` seconds; ``gpu_instance_id``/``compute_instance_id`` the MIG instance an XID is
    attributed to (``None`` outside MIG); ``event_type``/``event_data`` NVML's raw fields.
    """

    index: int
    uuid: str | None
    kind: EventKind
    xid: int | None
    time_ns: int
    wall_time: float
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    event_type: int = 0
    event_data: int = 0

    @property
    def fatal(self) -> bool:
        """Whether this event stops a wait: a double-bit ECC event, a fatal poison or GPU unavailable event
        (:data:`FATAL_KINDS`), or an XID :data:`XID_TABLE` calls fatal."""
        if self.kind in FATAL_KINDS:
            return True
        return self.kind is EventKind.XID and self.xid is not None and xid_info(self.xid).fatal

    @property
    def meaning(self) -> str:
        """A human sentence for the event."""
        if self.kind is EventKind.XID and self.xid is not None:
            return xid_info(self.xid).meaning
        if self.kind is EventKind.UNKNOWN:
            return f"event type {self.event_type:#x} (not known to nvmlcheck), data {self.event_data}"
        return _MEANINGS[self.kind]

    def fault(self) -> GpuFault:
        """This event as the :class:`~nvmlcheck.GpuFault` a wait raises."""
        return GpuFault(
            self.index, self.uuid, self.kind.value, self.xid, self.meaning,
            time_ns=self.time_ns, wall_time=self.wall_time,
        )

    def to_json(self) -> dict[str, Any]:
        """The ``nvmlcheck/event`` version 1 document."""
        return {
            "schema": EVENT_SCHEMA,
            "version": EVENT_SCHEMA_VERSION,
            "index": self.index,
            "uuid": self.uuid,
            "kind": self.kind.value,
            "xid": self.xid,
            "meaning": self.meaning,
            "fatal": self.fatal,
            "time_ns": self.time_ns,
            "wall_time": self.wall_time,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
            "event_type": self.event_type,
            "event_data": self.event_data,
        }

    def line(self) -> str:
        """One line for a terminal."""
        millis = int(self.wall_time % 1 * 1000)
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.wall_time)) + f".{millis:03d}Z"
        what = f"XID {self.xid}" if self.xid is not None else self.kind.value
        if self.kind is EventKind.UNKNOWN:
            what = f"event type {self.event_type:#x}"
        gi, ci = self.gpu_instance_id, self.compute_instance_id
        mig = "" if gi is None else f" (GI {gi}, CI {ci})"
        verdict = " FATAL" if self.fatal else ""
        return f"{when} GPU {self.index}{mig}{verdict} {what}: {self.meaning}"


#: What a :class:`ListeningGap` was: the registration had not returned when the caller went on without it
#: (``"starting"``); the listener was asking the GPUs again after a wait error (``"recovering"``);
#: ``nvmlEventSetWait_v2`` had not returned for :data:`STALLED_AFTER_S` (``"stalled"``); the GPU was dropped by a
#: recovery (``"dropped"``), never registered (``"unregistered"``), or the listener failed (``"failed"``).
GAP_CAUSES = ("starting", "recovering", "stalled", "dropped", "unregistered", "failed")


@dataclass(frozen=True)
class ListeningGap:
    """A time during which the listener heard nothing from some GPUs (:meth:`EventListener.gaps`): a fatal XID
    then was not heard, and a wait or ``ready`` that ran meanwhile relied on its polls alone.

    ``seq`` names the gap (its begin and its end are the same ``seq``); ``cause`` is one of :data:`GAP_CAUSES`;
    ``indices`` the GPUs not listened to (``()``: every GPU, for a listener that never knew its GPUs, the smi
    backend's); ``began_ns``/``ended_ns`` on the listener's clock (``time.monotonic_ns``, as event times), ``ended_ns``
    ``None`` while it lasts (a dropped, unregistered or failed GPU's never ends); ``why`` in words.
    """

    seq: int
    cause: str
    indices: tuple[int, ...]
    began_ns: int
    ended_ns: int | None
    why: str

    def lasted_s(self, now_ns: int | None = None) -> float | None:
        """How long it lasted (to ``now_ns`` while it lasts; ``None`` then without ``now_ns``)."""
        end = self.ended_ns if self.ended_ns is not None else now_ns
        return None if end is None else max(0, end - self.began_ns) / 1e9

    def line(self) -> str:
        """One line for a person: ``events not listened to on GPUs 0, 1 for 1.3 s (recovering: ...)``."""
        lasted = self.lasted_s()
        span = ("(still not)" if lasted is None else f"for {lasted * 1e3:.1f} ms" if lasted < 1
                else f"for {lasted:.1f} s")
        return f"events not listened to on {_gpu_words(self.indices)} {span}: {self.cause}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        """Its fields as a JSON object (``listening_gaps`` of ``nvmlcheck/wait`` and ``nvmlcheck/ready``; a gap line of
        ``nvmlcheck watch --json``)."""
        return {"seq": self.seq, "cause": self.cause, "gpus": list(self.indices), "began_ns": self.began_ns,
                "ended_ns": self.ended_ns, "lasted_s": self.lasted_s(), "why": self.why}


def _gpu_words(indices: Sequence[int]) -> str:
    if not indices:
        return "every GPU"
    return ("GPU " if len(indices) == 1 else "GPUs ") + ", ".join(str(i) for i in indices)


@dataclass(frozen=True)
class EventTarget:
    """A GPU to register: its index, device handle, UUID and whether it is in MIG mode (``None``: unknown)."""

    index: int
    handle: object
    uuid: str | None
    mig_mode: bool | None = False


@dataclass
class _Registration:
    covered: dict[int, tuple[int, str | None]] = field(default_factory=dict)  # handle address -> (index, uuid)
    reasons: dict[int, str] = field(default_factory=dict)
    masks: dict[int, int] = field(default_factory=dict)  # handle address -> the mask it was registered for
    done: set[int] = field(default_factory=set)  # the GPU indices whose registration has an answer
    targets: dict[int, EventTarget] = field(default_factory=dict)  # handle address -> its target (registered ones)
    call: tuple[str, int | None] | None = None  # the call in flight: (function, GPU index or None)


@dataclass
class _Recovery:
    """The listener's recovery after a wait error (state ``"recovering"``): why, and the call in flight."""

    why: str  # "nvmlEventSetWait_v2 failed: ..."
    transient: bool = False  # the wait's error was a transient one (TRANSIENT)
    call: tuple[str, int | None] | None = None  # (function, GPU index or None); None between calls


class _GivenUp(Exception):
    """stop() (or a fork) gave the recovering thread up: it makes no further NVML call."""


class EventListener:
    """Listens for NVML events on a set of GPUs in one daemon thread. Made by :meth:`nvmlcheck.Session.listen`.

    :attr:`state` is ``"new"``, ``"starting"`` (its registration had not finished by the deadline of the call that
    started it: :attr:`reason` names the call in flight and the GPUs not registered), ``"running"``,
    ``"recovering"`` (the wait call failed and the thread is asking each GPU again and registering the others on a
    new set: nothing is listened to meanwhile, :attr:`reason` names the call in flight, and a call that hangs, a GPU
    falling off the bus, leaves it so), ``"unsupported"`` (no GPU could be registered: :attr:`reason` says why),
    ``"stalled"`` (running, but its ``nvmlEventSetWait_v2`` has not returned for :data:`STALLED_AFTER_S`: nothing is
    heard until it does; :attr:`reason` says so), ``"failed"`` (the wait call failed: :attr:`reason`), or
    ``"stopped"``. The latest events received
    are kept, at most :data:`MAX_KEPT_EVENTS` (:attr:`events`), and every fatal one apart; :meth:`next_events`
    streams them; :meth:`fatal` and :meth:`sleep` serve waits.
    """

    def __init__(
        self,
        source: Any,
        targets: Sequence[EventTarget],
        address: Callable[[object], int],
        *,
        unavailable: Mapping[int, str] | None = None,
        wait_slice_ms: int = WAIT_SLICE_MS,
    ) -> None:
        self._source = source
        self._targets = tuple(targets)
        self._address = address
        self._slice = wait_slice_ms
        self._clock = time.monotonic_ns  # for the slice a TIMEOUT answered early leaves (_run)
        self._cond = threading.Condition()
        self._events: list[GpuEvent] = []
        self._forgotten = 0  # events received before self._events[0] (beyond MAX_KEPT_EVENTS)
        # Fatal events apart, per GPU index, in the order received (so by time_ns): a wait checks them before every
        # poll, which must not scan every clock event heard, nor every fatal event of another GPU.
        self._fatal_by_gpu: dict[int, list[GpuEvent]] = {}
        self._state = "new"
        self._reason: str | None = None
        self._preset = dict(unavailable or {})  # GPUs left out before registration (identity unreadable)
        self._device_reasons: dict[int, str] = dict(self._preset)
        self._covered: dict[int, tuple[int, str | None]] = {}
        self._masks: dict[int, int] = {}  # handle address -> the mask it is registered for (a rebuilt set's)
        self._targets_by_address: dict[int, EventTarget] = {}  # handle address -> its target (registered ones)
        self._reg: _Registration | None = None  # the registration in progress (read by reason while "starting")
        self._recovery: _Recovery | None = None  # the recovery in progress (read by reason while "recovering")
        self._wait_began: int | None = None  # when the wait call in flight began (on self._clock), else None
        self._blameless = 0  # wait errors in a row that no GPU answered itself (each given a new set)
        # The times some GPUs were not listened to (gaps), for waits to say so afterwards and `watch` as they happen.
        self._gaps: list[ListeningGap] = []
        self._gap_seq = 0
        self._started_ns = 0  # when start() began (on self._clock): an unregistered GPU's gap begins there
        self._start_gap: ListeningGap | None = None  # open while the caller went on without the registration
        self._rec_gap: ListeningGap | None = None  # open while recovering
        self._stall_seq: int | None = None  # the seq of the stall in flight, once gaps() or the thread named it
        self._registered = threading.Event()  # set when the registration has an answer (or stop() gave it up)
        self._overdue = False  # start() stopped waiting for the registration (its deadline came first)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: object | None = None
        # The fork a listener over no library (the nvidia-smi backend's) notices: none, it owns no thread nor set.
        self._generation = 0 if source is None else _fork_generation()

    @classmethod
    def unavailable(cls, reason: str) -> EventListener:
        """A listener that never listens, in state ``"unsupported"`` with ``reason`` (the nvidia-smi backend)."""
        listener = cls(None, (), lambda _h: 0)
        return listener._unsupported(reason)

    # --- state ----------------------------------------------------------------------------------------------------

    def _forked(self) -> bool:
        if self._source is None or self._generation == _fork_generation():
            return False
        # A forked child: the thread is gone and the event set belongs to the parent's NVML state. Forget both;
        # freeing the set here would act on state this process does not own. The lock may have been held by the
        # parent's listener thread at fork time: a new one.
        self._generation = _fork_generation()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = None
        self._set = None
        if self._state in ("running", "starting", "recovering"):
            self._state = "stopped"
            self._reason = "inherited across fork(): the listener thread does not survive it; start a new one"
        return True

    @property
    def state(self) -> str:
        """``"new"``, ``"starting"``, ``"running"``, ``"recovering"``, ``"stalled"``, ``"unsupported"``, ``"failed"``
        or ``"stopped"``."""
        self._forked()
        state = self._state
        if state == "running" and self._stalled_s() is not None:
            return "stalled"
        return state

    def _stalled_s(self) -> float | None:
        """How long the wait call in flight has gone without returning, when that is :data:`STALLED_AFTER_S` or
        more; else ``None``."""
        began = self._wait_began
        if began is None:
            return None
        took = (self._clock() - began) / 1e9
        return took if took >= STALLED_AFTER_S else None

    @property
    def active(self) -> bool:
        """Whether the thread is listening now (events can stop a wait)."""
        return self.state == "running"

    @property
    def reason(self) -> str | None:
        """Why the listener is not (or no longer) listening, or covers only some GPUs; ``None`` when it is fine."""
        self._forked()
        with self._cond:
            if self._state == "starting":
                return self._starting_reason()
            if self._state == "recovering":
                return self._recovering_reason()
            stalled = self._stalled_s() if self._state == "running" else None
            if stalled is not None:
                gpus = ", ".join(str(i) for i in sorted(i for i, _ in self._covered.values())) or "none"
                return (f"stalled: {self._stall_words(stalled)} (GPUs not listened to meanwhile: {gpus}); waits poll "
                        "without events until it returns")
            if self._reason is None and self._device_reasons and self._state == "running":
                return "events not listened to on " + "; ".join(
                    f"GPU {i}: {why}" for i, why in sorted(self._device_reasons.items())
                )
            return self._reason

    @property
    def device_reasons(self) -> dict[int, str]:
        """Per GPU index: why it is not registered (NOT_SUPPORTED, no permission, MIG, a registration that had not
        returned by the deadline, ...) or no longer listened to (its GPU lost, ...)."""
        self._forked()  # before the lock: in a child it may be the parent's, held by its thread at fork time
        with self._cond:
            if self._state == "starting":
                return self._pending_reasons()
            reasons = dict(self._device_reasons)
            if self._state == "recovering":
                flight = self._recovering_flight()
                for index, _uuid in self._covered.values():
                    reasons.setdefault(index, f"not listened to while the listener recovers ({flight})")
            stalled = self._stalled_s() if self._state == "running" else None
            if stalled is not None:
                for index, _uuid in self._covered.values():
                    reasons.setdefault(index, f"not listened to: {self._stall_words(stalled)}")
            return reasons

    def _stall_words(self, stalled_s: float) -> str:
        return f"nvmlEventSetWait_v2 has not returned for {stalled_s:.1f} s (a call is {self._slice} ms at most)"

    # --- gaps: when GPUs were not listened to (lock held in each) -------------------------------------------------

    def _next_seq(self) -> int:
        self._gap_seq += 1
        return self._gap_seq

    def _open_gap(self, cause: str, indices: Iterable[int], why: str, began_ns: int | None = None) -> ListeningGap:
        gap = ListeningGap(self._next_seq(), cause, tuple(sorted(set(indices))),
                           self._clock() if began_ns is None else began_ns, None, why)
        self._keep_gap(gap)
        return gap

    def _keep_gap(self, gap: ListeningGap) -> None:
        self._gaps.append(gap)
        if len(self._gaps) > MAX_KEPT_GAPS:
            ended = [g for g in self._gaps if g.ended_ns is not None]
            drop = {g.seq for g in ended[: len(self._gaps) - MAX_KEPT_GAPS // 2]}
            self._gaps = [g for g in self._gaps if g.seq not in drop]
        self._cond.notify_all()

    def _close_gap(self, gap: ListeningGap | None, ended_ns: int | None = None, *,
                   indices: Iterable[int] | None = None) -> None:
        """End ``gap`` (now, or at ``ended_ns``); ``indices``: on those GPUs only (the others' gap goes on as
        another one: a GPU a recovery dropped is not listened to again)."""
        if gap is None:
            return
        end = self._clock() if ended_ns is None else ended_ns
        on = gap.indices if indices is None else tuple(sorted(set(indices)))
        self._gaps = [ListeningGap(g.seq, g.cause, on, g.began_ns, end, g.why) if g.seq == gap.seq else g
                      for g in self._gaps]
        self._cond.notify_all()

    def _replace_gap(self, gap: ListeningGap, cause: str, why: str) -> None:
        """``gap`` goes on as ``cause`` (the same seq, still open): a recovery that ended the listener."""
        self._gaps = [ListeningGap(g.seq, cause, g.indices, g.began_ns, None, why) if g.seq == gap.seq else g
                      for g in self._gaps]
        self._cond.notify_all()

    def _covered_indices(self) -> list[int]:
        return [i for i, _ in self._covered.values()]

    def gaps(self, indices: Iterable[int] | None = None, since_ns: int = 0) -> tuple[ListeningGap, ...]:
        """The times GPUs of ``indices`` (``None``: any) were not listened to, at or after ``since_ns`` (on the
        listener's clock, ``time.monotonic_ns``: a wait passes when it began), oldest first, each narrowed to the
        GPUs asked about: a registration that had not returned when the caller went on without it, a recovery after
        a wait error, a stalled ``nvmlEventSetWait_v2`` (the one in flight too, ``ended_ns`` ``None``), a GPU
        dropped, never registered, or a listener that failed. A wait or ``ready`` that ran meanwhile heard no fatal
        event of those GPUs then: its result says so (``listening_gaps``) instead of reading as if it had."""
        wanted = None if indices is None else frozenset(indices)
        self._forked()
        with self._cond:
            found = list(self._gaps)
            if self._state == "unsupported" and not found:
                found.append(ListeningGap(0, "unregistered", (), self._started_ns, None,
                                          self._reason or "events unavailable"))
            stalled = self._stalled_s() if self._state == "running" else None
            began = self._wait_began
            if stalled is not None and began is not None:
                if self._stall_seq is None:
                    self._stall_seq = self._next_seq()
                found.append(ListeningGap(self._stall_seq, "stalled", tuple(sorted(self._covered_indices())), began,
                                          None, self._stall_words(stalled)))
        out: list[ListeningGap] = []
        for g in found:
            if g.ended_ns is not None and g.ended_ns < since_ns:
                continue
            if wanted is None:
                out.append(g)
                continue
            narrowed = tuple(i for i in g.indices if i in wanted) if g.indices else tuple(sorted(wanted))
            if narrowed:
                out.append(ListeningGap(g.seq, g.cause, narrowed, g.began_ns, g.ended_ns, g.why))
        return tuple(sorted(out, key=lambda g: (g.began_ns, g.seq)))

    def _in_flight(self, tense: str = "has") -> str:
        """What the registration waits on, in words (lock held, state "starting"): ``"nvmlDeviceRegisterEvents on
        GPU 0 has not returned"``; ``tense`` ``"had"`` for the past."""
        reg = self._reg
        call = None if reg is None else reg.call
        if call is None:
            return f"the registration {tense} not begun"
        fn, index = call
        return (fn if index is None else f"{fn} on GPU {index}") + f" {tense} not returned"

    def _pending_reasons(self) -> dict[int, str]:
        """``device_reasons`` while "starting": the answers so far, and why for each GPU not answered (lock held)."""
        reg = self._reg
        reasons = dict(self._preset if reg is None else reg.reasons)
        done = set() if reg is None else reg.done | {i for i, _ in reg.covered.values()}
        flight = self._in_flight("had")
        for t in self._targets:
            if t.index not in done and t.index not in reasons:
                reasons[t.index] = f"not registered: {flight} by the deadline of the call that started the listener"
        return reasons

    def _starting_reason(self) -> str:
        reg = self._reg
        covered = sorted(i for i, _ in reg.covered.values()) if reg is not None else []
        waiting = sorted(i for i, why in self._pending_reasons().items() if why.startswith("not registered: "))
        listed = ", ".join(str(i) for i in waiting) or "none"
        so_far = ", ".join(str(i) for i in covered) or "none"
        return (f"registration had not finished by the deadline of the call that started the listener: "
                f"{self._in_flight()} (GPUs not registered: {listed}; registered so far: {so_far}); "
                "waits poll without events until it returns")

    def _recovering_flight(self) -> str:
        """What the recovery waits on, in words (lock held, state "recovering")."""
        rec = self._recovery
        call = None if rec is None else rec.call
        if call is None:
            return "asking each GPU of the set again"
        fn, index = call
        return (fn if index is None else f"{fn} on GPU {index}") + " has not returned"

    def _recovering_reason(self) -> str:
        rec = self._recovery
        why = "nvmlEventSetWait_v2 failed" if rec is None else rec.why
        gpus = ", ".join(str(i) for i in sorted(i for i, _ in self._covered.values())) or "none"
        return (f"recovering after {why}: {self._recovering_flight()} (GPUs not listened to meanwhile: {gpus}); "
                "waits poll without events until it returns")

    @property
    def covered(self) -> frozenset[int]:
        """The GPU indices registered for events and listened to (none while ``"recovering"`` or ``"stalled"``)."""
        if self._state == "recovering" or (self._state == "running" and self._stalled_s() is not None):
            return frozenset()
        return frozenset(i for i, _ in self._covered.values())

    @property
    def kept(self) -> frozenset[int]:
        """The GPU indices the listener has not given up: registered, and listened to or to be listened to again
        once a recovery or a stalled call returns (:attr:`covered` is empty meanwhile). ``watch`` ends when none of
        its GPUs is left, rather than listen to nothing for ever."""
        self._forked()
        with self._cond:
            if self._state not in ("running", "recovering"):
                return frozenset()
            return frozenset(i for i, _ in self._covered.values())

    @property
    def events(self) -> tuple[GpuEvent, ...]:
        """The events received so far, in order: the latest of them, at most :data:`MAX_KEPT_EVENTS`."""
        self._forked()
        with self._cond:
            return tuple(self._events)

    @property
    def thread(self) -> threading.Thread | None:
        """The listener thread (``None`` before :meth:`start` and after :meth:`stop`)."""
        return self._thread

    # --- lifecycle ------------------------------------------------------------------------------------------------

    def start(self, deadline_ns: int | None = None, clock: Callable[[], int] = time.monotonic_ns, *,
              patience_s: float | None = None) -> EventListener:
        """Register the GPUs and start listening. Never raises for "events not available": the state and
        :attr:`reason` say so. Returns ``self``. The registration runs in the listener's thread; this call waits for
        it. ``deadline_ns`` (on ``clock``): the call that starts it has a deadline. A GPU whose turn comes after it
        is not registered (its reason says so); and when a registration call has not returned by then (a wedged
        driver: ``nvmlEventSetCreate`` or ``nvmlDeviceRegisterEvents`` can hang, on the first GPU too), this returns
        at the deadline all the same, in state ``"starting"``: :attr:`reason` names the call in flight and the GPUs
        not registered, and the listener runs once the call returns. The time left is read once on ``clock`` and
        waited out on the real one. ``patience_s``: wait for the registration no longer than that either (a wait
        passes :data:`START_WAIT_S`: it polls meanwhile, and uses the listener once it runs)."""
        self._forked()
        if self._state != "new":
            return self
        src = self._source
        if src.missing is not None:
            return self._unsupported(f"the library does not export {src.missing} (an older driver)")
        left_ns = None if deadline_ns is None else deadline_ns - clock()
        reg = _Registration(reasons=dict(self._preset))
        with self._cond:
            self._reg = reg
            self._state = "starting"
            self._started_ns = self._clock()
        thread = threading.Thread(target=self._run, args=(reg, deadline_ns, clock), name="nvmlcheck events",
                                  daemon=True)
        self._thread = thread
        thread.start()
        wait_s = None if left_ns is None else max(0.0, left_ns / 1e9)
        if patience_s is not None:
            wait_s = patience_s if wait_s is None else min(wait_s, patience_s)
        try:
            self._registered.wait(None if wait_s is None else min(wait_s, threading.TIMEOUT_MAX))
        finally:
            # Not registered by the deadline (or the caller interrupted, KeyboardInterrupt): stop() does not wait
            # for a call that had not returned by then.
            self._overdue = not self._registered.is_set()
            with self._cond:
                if self._overdue and self._state == "starting":
                    # The caller goes on without the listener from here: a gap until the registration returns.
                    pending = [t.index for t in self._targets if t.index not in self._preset]
                    self._start_gap = self._open_gap("starting", pending, self._starting_reason())
        return self

    def _register_all(self, reg: _Registration, deadline_ns: int | None, clock: Callable[[], int]) -> object | None:
        """The listener thread's first part: create the set and register each GPU, saying in ``reg`` (under the
        lock: :attr:`reason` reads it meanwhile) which call is in flight. Returns the set once running, else
        ``None`` (its state says why)."""
        src = self._source
        with self._cond:
            reg.call = ("nvmlEventSetCreate", None)
        try:
            event_set = self._retrying(src.create)
        except NvmlCheckError as exc:
            with self._cond:
                reg.call = None
                if self._state == "starting":
                    self._unsupported(f"nvmlEventSetCreate: {exc}{_asked(exc)}")
                    self._thread = None  # it ends here: nothing listens
                self._cond.notify_all()
            return None
        for t in self._targets:
            if self._stop.is_set():
                break
            if deadline_ns is not None and reg.covered and clock() >= deadline_ns:
                with self._cond:
                    reg.reasons[t.index] = ("not registered: the deadline of the wait that started the listener "
                                            "came first")
                continue
            why = self._register(src, t, event_set, reg)
            with self._cond:
                reg.done.add(t.index)
                if why is not None:
                    reg.reasons[t.index] = why
        return self._publish(reg, event_set)

    def _publish(self, reg: _Registration, event_set: object) -> object | None:
        """The registration's answer: running on the GPUs registered, or unsupported with why; ``None`` (and the
        set freed) when not running. A listener stopped meanwhile keeps its state; the set is left to NVML's
        shutdown (:meth:`stop` may have returned before this, and the session closed NVML since)."""
        with self._cond:
            reg.call = None
            if self._state != "starting":
                # stop() gave the thread up (the set is left to NVML's shutdown: it may have run since).
                self._cond.notify_all()
                return None
            if self._stop.is_set():
                # stop() is joining this thread: it frees the set.
                self._set = event_set
                self._cond.notify_all()
                return None
            self._device_reasons = dict(reg.reasons)
            self._close_gap(self._start_gap)
            self._start_gap = None
            for index, why in sorted(reg.reasons.items()):
                self._open_gap("unregistered", [index], why, self._started_ns)
            if reg.covered:
                self._covered = dict(reg.covered)
                self._masks = dict(reg.masks)
                self._targets_by_address = dict(reg.targets)
                self._set = event_set
                self._state = "running"
                self._cond.notify_all()
                return event_set
            detail = "; ".join(f"GPU {i}: {w}" for i, w in sorted(reg.reasons.items())) or "no GPU selected"
            self._unsupported(f"no GPU can deliver events ({detail})")
            self._thread = None  # it ends here: nothing listens
            self._cond.notify_all()
        with contextlib.suppress(NvmlCheckError):
            self._source.free(event_set)
        return None

    def _register(self, src: Any, t: EventTarget, event_set: object, reg: _Registration) -> str | None:
        mig = " (the GPU is in MIG mode)" if t.mig_mode else ""
        try:
            with self._cond:
                reg.call = ("nvmlDeviceGetSupportedEventTypes", t.index)
            mask = self._retrying(functools.partial(src.supported, t.handle, t.index)) & WANTED_MASK
            if not mask & _CRITICAL_MASK:
                # Clock or P-state events alone cannot stop a wait: counted as listened to, the GPU looked covered
                # (no reason said) while no XID of it could ever be heard.
                kinds = ", ".join(k.value for b, k in _KIND_BITS.items() if mask & b) or "none"
                return f"it delivers no XID or ECC events (nvmlDeviceGetSupportedEventTypes: {kinds})"
            with self._cond:
                reg.call = ("nvmlDeviceRegisterEvents", t.index)
            registered = self._register_narrowing(src, t, mask, event_set)
        except (NotSupported, NoPermission) as exc:
            return f"{exc.function}: {exc.CODE_NAME}{mig}"
        except NvmlError as exc:
            return f"{exc.function}: {exc.CODE_NAME} ({exc.code}){mig}{_asked(exc)}"
        address = self._address(t.handle)
        with self._cond:
            reg.covered[address] = (t.index, t.uuid)
            reg.masks[address] = registered
            reg.targets[address] = t
        return None

    def _retrying(self, call: Callable[[], Any]) -> Any:
        """``call()``, asked again after a transient error (``TRANSIENT``: ``NVML_ERROR_UNKNOWN``, ``NOT_READY``,
        ...), :data:`RECOVERY_ATTEMPTS` times in all, :data:`RECOVERY_RETRY_S` apart: one such answer during the
        registration left a healthy GPU (or every GPU, from ``nvmlEventSetCreate``) without events for the life of
        the listener. The last error is raised, with how many times it was asked (``_asked`` says it)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except NvmlCheckError as err:
                if not err.TRANSIENT or attempt >= RECOVERY_ATTEMPTS or self._stop.is_set():
                    err.recovery_attempts = attempt  # type: ignore[attr-defined]
                    raise
            self._pause(RECOVERY_RETRY_S)

    def _register_narrowing(self, src: Any, t: EventTarget, mask: int, event_set: object) -> int:
        """Register ``mask``; where NVML refuses it with NOT_SUPPORTED (it names no type: any one it lacks refuses
        the whole mask, although reported supported), ask again without nvml.h's newer types (with MIG changes, then
        without), then for the kinds that stop a wait, then for XIDs alone (XID 48 reports a double-bit error too),
        before giving the GPU up. Returns the mask registered."""
        tried: set[int] = set()
        classic = mask & _CLASSIC_MASK
        for narrowed in (mask, classic | mask & _MIG_CONFIG_BIT, classic, mask & _CRITICAL_MASK, mask & _XID_BIT):
            if not narrowed or narrowed in tried:
                continue
            tried.add(narrowed)
            try:
                self._retrying(functools.partial(src.register, t.handle, t.index, narrowed, event_set))
                return narrowed
            except NotSupported as exc:
                refused = exc
        raise refused

    def _unsupported(self, why: str) -> EventListener:
        self._state = "unsupported"
        self._reason = why
        if self._start_gap is not None:
            self._close_gap(self._start_gap)
            self._start_gap = None
        return self

    def stop(self) -> None:
        """Stop the thread (within one wait slice) and free the event set. Idempotent. A listener still
        ``"starting"`` (a registration call that had not returned by its deadline) is not waited for: the thread
        ends when the call returns, and the set is left to NVML's shutdown."""
        if self._forked():
            return
        self._stop.set()
        with self._cond:
            if self._state == "starting" and self._overdue:
                self._state = "stopped"
                self._reason = (f"stopped while registering ({self._in_flight('had')}): the listener thread ends "
                                "when the call returns")
                self._thread = None
                self._registered.set()
                self._cond.notify_all()
                return
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_TIMEOUT_S)
            if thread.is_alive():
                # nvmlEventSetWait_v2 did not return (a wedged driver): freeing the set under it could crash. Leave
                # both; the thread ends at its next return, NVML's shutdown takes the set.
                self._thread, self._set = None, None
                with self._cond:
                    if self._state == "starting":
                        where = f"its registration ({self._in_flight('had')})"
                    elif self._state == "recovering":
                        where = f"its recovery ({self._recovering_flight().replace('has not', 'had not')})"
                    else:
                        where = "nvmlEventSetWait_v2"
                    self._state = "stopped"
                    self._reason = f"the listener thread did not return from {where} in {STOP_TIMEOUT_S:g} s"
                    self._cond.notify_all()
                return
        self._thread = None
        event_set, self._set = self._set, None
        if event_set is not None:
            # An error leaves nothing to do: NVML shut down meanwhile takes the set with it.
            with contextlib.suppress(NvmlCheckError):
                self._source.free(event_set)
        with self._cond:
            if self._state in ("running", "new", "starting", "recovering"):
                # "new": stopped before it started. It stayed "new", so a later start() registered and started a
                # thread that saw the stop flag and ended at once, leaving "running" (active) with nothing listening.
                self._state = "stopped"
            self._cond.notify_all()

    def _run(self, reg: _Registration, deadline_ns: int | None, clock: Callable[[], int]) -> None:
        event_set: object | None = None
        try:
            event_set = self._register_all(reg, deadline_ns, clock)
            self._registered.set()
            if event_set is not None:
                self._listen_on(event_set)
        except Exception as exc:
            # Anything else ends the thread too (a record it cannot decode, MemoryError): a listener left "running"
            # with no thread would have waits count on events that never come and `watch` wait for ever. Said by
            # the state and reason (`watch` prints it), not by a thread traceback on stderr.
            self._failed(f"the listener thread died: {type(exc).__name__}: {exc}; waits poll without events",
                         self._set)
        finally:
            self._registered.set()

    def _listen_on(self, event_set: object) -> None:
        src, stop, slice_ms, clock = self._source, self._stop, self._slice, self._clock
        slice_ns = slice_ms * 1_000_000
        while not stop.is_set():
            began = clock()
            self._wait_began = began  # read by state and reason: a call that does not return is said (stalled)
            try:
                got = src.wait(event_set, slice_ms)
            except NvmlCheckError as exc:
                self._stall_ended(began)
                # One GPU of the set lost (GpuLost), NVML re-initialised under us (Uninitialized), Unknown: the
                # GPUs that answer an error themselves are dropped and the others listened to on a new set.
                kept = self._without_failing(event_set, exc)
                if kept is None:
                    return
                event_set = kept
                continue
            except BaseException:
                self._wait_began = None
                raise
            self._stall_ended(began)
            self._blameless = 0  # the set answered: its error, if any, is over
            if got is None:
                # NVML_ERROR_TIMEOUT. It also answers so at once when a signal interrupts the call; a call that
                # answers at once again and again spun this thread at a full core (the stub with a TIMEOUT
                # fault: 0.98 CPU s a second). The rest of the slice is waited out here; events queue meanwhile.
                left_ns = slice_ns - (clock() - began)
                if left_ns > slice_ns // 2:
                    self._pause(left_ns / 1e9)
                continue
            self._received(*got)

    def _stall_ended(self, began: int) -> None:
        """After a wait call that began at ``began``: one that took :data:`STALLED_AFTER_S` or more (the listener
        said ``"stalled"``) is kept as a gap, under the lock, before the call is said returned (``_wait_began``
        cleared): a wait reading the gaps in between saw the stall neither in flight nor kept, and said its GPUs
        listened to. Free of the lock otherwise: this runs after every slice."""
        took = self._clock() - began
        if took < STALLED_AFTER_S * 1e9:
            self._wait_began = None
            return
        with self._cond:
            seq, self._stall_seq = self._stall_seq, None
            gap = ListeningGap(self._next_seq() if seq is None else seq, "stalled",
                               tuple(sorted(self._covered_indices())), began, began + took,
                               f"nvmlEventSetWait_v2 did not return for {took / 1e9:.1f} s (a call is {self._slice} "
                               "ms at most); events that came meanwhile were received when it returned")
            self._keep_gap(gap)
            self._wait_began = None

    def _without_failing(self, event_set: object, exc: NvmlCheckError) -> object | None:
        """After ``nvmlEventSetWait_v2`` failed with ``exc``: ask each GPU of the set (its supported event types);
        those that fail are no longer listened to (their reason says why) and the others are registered again on a
        new set, which is returned. ``None`` (the listener failed, its reason says why) when NVML was re-initialised,
        when no GPU answers an error itself (nothing to blame: the set is no use), or when none is left.

        Meanwhile the state is ``"recovering"`` and :attr:`reason` names the call in flight: a probe of a GPU falling
        off the bus can hang, and the state said ``"running"`` while nothing listened. A transient answer (a
        ``TRANSIENT`` error) is asked again, :data:`RECOVERY_ATTEMPTS` times in all, before the GPU is dropped."""
        said = str(exc)
        wait_failed = said if said.startswith("nvmlEventSetWait_v2") else f"nvmlEventSetWait_v2 failed: {said}"
        if isinstance(exc, Uninitialized):
            self._failed(f"{wait_failed}; waits poll without events", event_set)
            return None
        rec = _Recovery(wait_failed, exc.TRANSIENT)
        with self._cond:
            if self._state != "running":
                return None
            self._state = "recovering"
            self._recovery = rec
            self._rec_gap = self._open_gap("recovering", self._covered_indices(), wait_failed)
            self._cond.notify_all()
        try:
            return self._rebuild(event_set, rec)
        except _GivenUp:
            # stop() gave the thread up meanwhile (a call of the recovery hung): it touches nothing more; the sets
            # are left to NVML's shutdown (it may have run since).
            return None

    def _recovery_call(self, rec: _Recovery, fn: str, index: int | None, call: Callable[[], Any]) -> Any:
        """``call()``, named in ``rec`` while in flight (:attr:`reason` says it); :class:`_GivenUp` instead when
        stop() gave the thread up. A transient error is asked again (:data:`RECOVERY_ATTEMPTS` in all); the last
        error is raised, with how many times it was asked in its ``recovery_attempts``."""
        attempt = 0
        while True:
            attempt += 1
            with self._cond:
                if self._state != "recovering":
                    raise _GivenUp
                rec.call = (fn, index)
            try:
                return call()
            except NvmlCheckError as err:
                if not err.TRANSIENT or attempt >= RECOVERY_ATTEMPTS:
                    err.recovery_attempts = attempt  # type: ignore[attr-defined]
                    raise
            finally:
                with self._cond:
                    rec.call = None
            self._pause(RECOVERY_RETRY_S)

    def _rebuild(self, event_set: object, rec: _Recovery) -> object | None:
        wait_failed = rec.why
        src = self._source
        covered = dict(self._covered)
        dropped: dict[int, str] = {}  # GPU index -> why
        for address, (index, _uuid) in covered.items():
            handle = self._targets_by_address[address].handle
            try:
                self._recovery_call(rec, "nvmlDeviceGetSupportedEventTypes", index,
                                    functools.partial(src.supported, handle, index))
            except NvmlCheckError as probe:
                dropped[index] = f"no longer listened to: {wait_failed}; then {probe}{_asked(probe)}"
        if not dropped:
            # Nothing to blame: the set is no use. A transient error (NVML_ERROR_UNKNOWN once) is given a new set
            # with every GPU, RECOVERY_ATTEMPTS times in a row at most; it ended listening on every GPU at once.
            self._blameless += 1
            if not rec.transient or self._blameless >= RECOVERY_ATTEMPTS:
                again = (f"; {self._blameless} times in a row, on a new set each time" if self._blameless > 1
                         else "")
                self._failed(f"{wait_failed} (no GPU of the set answers an error itself{again}); waits poll without "
                             "events", event_set)
                return None
        kept = {a: v for a, v in covered.items() if v[0] not in dropped}
        new_set: object | None = None
        if kept:
            try:
                new_set = self._recovery_call(rec, "nvmlEventSetCreate", None, src.create)
            except NvmlCheckError as err:
                blamed = _listed(dropped) or "no GPU of the set answers an error itself"
                self._failed(f"{wait_failed} ({blamed}), and nvmlEventSetCreate for the other GPUs: "
                             f"{err}{_asked(err)}; waits poll without events", event_set)
                return None
            for address, (index, _uuid) in list(kept.items()):
                handle, mask = self._targets_by_address[address].handle, self._masks[address]
                try:
                    self._recovery_call(rec, "nvmlDeviceRegisterEvents", index,
                                        functools.partial(src.register, handle, index, mask, new_set))
                except NvmlCheckError as err:
                    dropped[index] = (f"no longer listened to: {wait_failed}; registering it again then: "
                                      f"{err}{_asked(err)}")
                    del kept[address]
        if not kept:
            if new_set is not None:
                with contextlib.suppress(NvmlCheckError, _GivenUp):
                    self._recovery_call(rec, "nvmlEventSetFree", None, functools.partial(src.free, new_set))
            self._failed(f"{wait_failed}: no GPU is listened to any more ({_listed(dropped)}); waits poll without "
                         "events", event_set)
            return None
        # The old set keeps answering the error (the lost GPU stays registered in it): freed before the listener
        # says "running" again, so that a free that hangs leaves it "recovering", not "running" with nothing heard.
        # Events of the kept GPUs queue in the new set meanwhile.
        with contextlib.suppress(NvmlCheckError):
            self._recovery_call(rec, "nvmlEventSetFree", None, functools.partial(src.free, event_set))
        with self._cond:
            if self._state != "recovering":
                return None
            self._set = new_set
            self._covered = kept
            self._device_reasons.update(dropped)
            self._state = "running"
            self._recovery = None
            rec_gap, self._rec_gap = self._rec_gap, None
            # Listening again on the GPUs kept alone; a dropped one's gap goes on, as "dropped", from the same start
            # (it said "listening again" to every GPU of the set, the dropped one too).
            self._close_gap(rec_gap, indices=[i for i, _ in kept.values()])
            for index, why in sorted(dropped.items()):
                self._open_gap("dropped", [index], why, None if rec_gap is None else rec_gap.began_ns)
            self._cond.notify_all()
        return new_set

    def _pause(self, seconds: float) -> None:
        """Wait out what is left of a slice, or until :meth:`stop`."""
        self._stop.wait(seconds)

    def _failed(self, why: str, event_set: object | None) -> None:
        """The thread's end on an error: say why, and free the set here. The session replaces a failed listener
        without stopping it, so nothing else would: each failure left an event set (and NVML's registrations, which
        keep queueing events into it) behind for the life of the process."""
        with self._cond:
            if self._state == "stopped":
                # stop() gave the thread up (a registration that had not returned): its state and set stay as said.
                self._cond.notify_all()
                return
            self._state = "failed"
            self._reason = why
            rec_gap, self._rec_gap = self._rec_gap, None
            if rec_gap is not None:
                self._replace_gap(rec_gap, "failed", why)  # it never listened again: one gap, from its start
            else:
                self._open_gap("failed", self._covered_indices(), why)
            self._cond.notify_all()
        if event_set is not None and self._set is event_set:
            self._set = None  # stop() joins this thread before it reads the set: it frees nothing twice
            with contextlib.suppress(NvmlCheckError):
                self._source.free(event_set)

    def _received(self, address: int, etype: int, data: int, gi: int | None, ci: int | None) -> None:
        """One record of ``nvmlEventSetWait_v2``: an event per type bit nvmlcheck names, and one ``UNKNOWN`` event
        for the bits it does not (a newer driver's type, or none at all) with the raw bits: never dropped.

        Stamped under the lock that :meth:`fatal` and :meth:`sleep` read under: an event is received when it is
        recorded. Stamped before it, an event a wait's last check missed (the check ran between the stamp and the
        recording) carried a time before that check: the record said a fatal event had come, and the wait called
        the GPU clean all the same."""
        with self._cond:
            now_ns, wall = time.monotonic_ns(), time.time()
            index, uuid = self._covered.get(address, (-1, None))
            got: list[GpuEvent] = []
            for bit, kind in _KIND_BITS.items():
                if etype & bit:
                    xid = int(data) if kind is EventKind.XID else None
                    got.append(GpuEvent(index, uuid, kind, xid, now_ns, wall, gi, ci, etype, data))
            unnamed = etype & ~WANTED_MASK
            if unnamed or not got:
                got.append(GpuEvent(index, uuid, EventKind.UNKNOWN, None, now_ns, wall, gi, ci, etype, data))
            for ev in got:
                self._events.append(ev)
                if ev.fatal:
                    kept = self._fatal_by_gpu.setdefault(ev.index, [])
                    kept.append(ev)
                    if len(kept) > MAX_KEPT_FATAL_PER_GPU:
                        del kept[: len(kept) - MAX_KEPT_FATAL_PER_GPU // 2]
            if len(self._events) > MAX_KEPT_EVENTS:
                # Forget down to half the bound at once: one list shift per MAX_KEPT_EVENTS / 2 events.
                drop = len(self._events) - MAX_KEPT_EVENTS // 2
                del self._events[:drop]
                self._forgotten += drop
            self._cond.notify_all()

    # --- for waits and watchers -----------------------------------------------------------------------------------

    def fatal(self, indices: Iterable[int] | None = None, since_ns: int = 0) -> GpuEvent | None:
        """The first fatal event received at or after ``since_ns`` (``time.monotonic_ns``) on one of ``indices``
        (``None``: any GPU), or ``None``."""
        wanted = None if indices is None else frozenset(indices)
        self._forked()  # before the lock: in a child it may be the parent's, held by its thread at fork time
        with self._cond:
            return self._first_fatal(wanted, since_ns)

    def _first_fatal(self, wanted: frozenset[int] | None, since_ns: int) -> GpuEvent | None:
        first: GpuEvent | None = None
        for index, kept in self._fatal_by_gpu.items():
            if wanted is not None and index not in wanted:
                continue
            at = bisect.bisect_left(kept, since_ns, key=_event_time)  # each list is in time_ns order
            if at < len(kept) and (first is None or kept[at].time_ns < first.time_ns):
                first = kept[at]
        return first

    def sleep(self, seconds: float, indices: Iterable[int] | None = None, since_ns: int = 0) -> bool:
        """Sleep up to ``seconds``, waking at once when a fatal event on ``indices`` arrives; returns whether one
        did. A wait passes this as its ``sleep``, so a fault ends the wait's sleep instead of waiting it out."""
        wanted = None if indices is None else frozenset(indices)
        self._forked()
        with self._cond:
            return self._cond.wait_for(lambda: self._first_fatal(wanted, since_ns) is not None, max(0.0, seconds))

    def next_events(self, after: int, timeout_s: float | None) -> tuple[list[GpuEvent], int]:
        """Events after the first ``after`` ones received, waiting up to ``timeout_s`` (``None``: until one comes or
        the listener stops) when there are none yet. Returns them and the new ``after`` (the count received so far).
        A reader more than :data:`MAX_KEPT_EVENTS` behind gets the kept ones only."""
        self._forked()
        with self._cond:
            # "starting": a registration that had not returned by its deadline may return yet; "recovering": the
            # rebuilt set may listen again.
            self._cond.wait_for(lambda: self._forgotten + len(self._events) > after
                                or self._state not in ("running", "starting", "recovering"), timeout_s)
            new = self._events[max(0, after - self._forgotten):]
            return list(new), self._forgotten + len(self._events)


def _asked(err: BaseException) -> str:
    """`` (asked N times)`` for an error the recovery asked again (a transient one), else ``""``."""
    attempts = getattr(err, "recovery_attempts", 1)
    return f" (asked {attempts} times: a transient error each time)" if attempts > 1 else ""


def _listed(reasons: Mapping[int, str]) -> str:
    return "; ".join(f"GPU {i}: {why}" for i, why in sorted(reasons.items()))


def _event_time(ev: GpuEvent) -> int:
    return ev.time_ns


def check_fatal(listener: EventListener | None, indices: Iterable[int] | None, since_ns: int) -> None:
    """Raise :class:`~nvmlcheck.GpuFault` for the first fatal event on ``indices`` since ``since_ns``."""
    if listener is None:
        return
    ev = listener.fatal(indices, since_ns)
    if ev is not None:
        raise ev.fault()
