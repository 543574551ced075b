"""Ready, not just clean: one verdict per GPU with its cause, and the structured culprits every timeout carries.

A :class:`GpuVerdict` classes a GPU as ``ready`` or not: ``reclaiming`` (its holders exited, the memory is coming
back; with an ETA), ``held`` (a live holder), ``stuck`` (a holder no signal ends, or memory held with no holder past
the reclaim model's bound), ``unhealthy`` (a health cause or a fatal XID, each with the operator's action),
``short`` (clean, but free < need; or a need beyond what the GPU has with nothing running, whatever else holds
it) or ``unknown`` (a query failed: never ready). Each cause is a :class:`Culprit`
(data: GPU, PID, name, bytes, kind, class, container, action, reason). :class:`Watch` keeps what the polls of one
wait saw (when a teardown began, how fast memory came back); :func:`classify` turns a snapshot into verdicts;
:func:`health_causes` is the one table of health causes and actions; :func:`holders_of` gives a plain wait's
timeout its culprits. ``ready``'s own loop is :mod:`nvmlcheck.readiness`. Decision table and sources: docs/ready.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import reclaim_model
from ._record import record, replace
from ._units import format_bytes
from .model import DeviceState, GpuProcess, Memory, MigDevice, OperatorAction, Snapshot, SystemInfo, unsupported
from .predicates import (
    DEFAULT_MAX_USED_BYTES,
    DEFAULT_MIG_IDLE_BYTES,
    _judge_at_most,
    free_bytes_of,
    instance_view,
    memory_used_at_most,
)

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, Literal

    from ._proc.procfs import ProcStat
    from .errors import GpuFault
    from .events import ListeningGap
    from .holders import Holder
    from .wait import TracePoint

    #: A verdict's class (and a culprit's): see the module docstring and docs/ready.md.
    ReadyClass = Literal["ready", "reclaiming", "held", "stuck", "unhealthy", "short", "unknown"]
else:

    def __getattr__(name: str) -> object:
        # ReadyClass, the typing.Literal, made on first use: typing is not loaded otherwise (docs/performance.md).
        if name == "ReadyClass":
            from typing import Literal

            value = globals()["ReadyClass"] = Literal[CLASSES]  # the same members as the declaration above
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLASSES",
    "NEEDS_OPERATOR",
    "Culprit",
    "GpuVerdict",
    "ReadyClass",
    "ReadyReport",
    "Watch",
    "classify",
    "health_causes",
    "holders_of",
    "mig_units",
]

#: The classes, least severe first: a GPU's class is that of its most severe culprit.
CLASSES: tuple[ReadyClass, ...] = ("ready", "short", "reclaiming", "held", "unknown", "stuck", "unhealthy")
#: The classes waiting cannot end: an operator has to act (``nvmlcheck ready`` exits 5).
NEEDS_OPERATOR: frozenset[str] = frozenset({"stuck", "unhealthy"})
_SEVERITY = {c: i for i, c in enumerate(CLASSES)}
_NO_SYSTEM = SystemInfo(None, None, None)

# Operator actions: a GPU's are NVIDIA's words (:class:`nvmlcheck.model.OperatorAction`: the XID catalogue's
# resolution buckets and NVML's recovery actions); a process's are nvmlcheck's.
RESET_GPU = OperatorAction.RESET_GPU.value
NODE_REBOOT = OperatorAction.NODE_REBOOT.value
STOP_HOLDER = "STOP_HOLDER"  #: end the holder (``nvmlcheck kill PID``) or let it finish
REAP_ZOMBIE = "REAP_ZOMBIE"  #: its parent must reap it (end the parent)
WAIT = "WAIT"  #: the driver is giving the memory back: wait for it

# What to do, in words, per GPU action (the hint after a health cause's text).
_ACTION_HINTS = {
    "RESET_GPU": "nvidia-smi -r -i {i} once its processes are gone, or reboot",
    "DRAIN_P2P": "let peer-to-peer traffic drain, then read the recovery action again",
    "DRAIN_AND_RESET": "let peer-to-peer traffic drain, then nvidia-smi -r -i {i}",
    "BUS_RESET": "reset the GPU's PCIe bus",
    "RECOVER_IMEX_DOMAIN": "recover the IMEX domain",
    "NODE_REBOOT": "reboot the node",
    "CONTACT_SUPPORT": "service the GPU (RMA): a reset does not help",
}


def _action_severity(action: str | None) -> int:
    """An operator action's :attr:`~nvmlcheck.model.OperatorAction.severity`; -1 for a process's (``STOP_HOLDER``,
    ``WAIT``, ...) and none."""
    try:
        return OperatorAction(action).severity
    except ValueError:
        return -1




# --- values -----------------------------------------------------------------------------------------------------


@record
class Culprit:
    """One thing that keeps a GPU from being ready, as data.

    ``gpu``: NVML index (``None``: not tied to one GPU). ``class_``: the :data:`ReadyClass` it puts the GPU in
    (``"class"`` in JSON). ``kind``: ``"compute"``/``"graphics"``/``"mps"`` for a listed process, ``"device-file"``
    for a process found by its open device files only, else what the cause is (``"memory"``, a health cause's code
    such as ``"row-remap-pending"``, ``"xid"``, ``"capacity"``, ``"capacity-limit"``, ``"query"``, ``"unconfirmed"``,
    ``"predicate"``: a wait's own predicate refused the GPU on what no rule here sees, ...). ``pid``, ``name``,
    ``used_bytes``, ``state`` (``/proc`` state word) and ``container`` (label: ``"lxc/129"``, ``"docker 3f2a…"``)
    describe a process culprit (``None`` where unknown or not a process). ``action``: what an
    operator does: for a GPU an :class:`~nvmlcheck.model.OperatorAction` value (``RESET_GPU``, ``NODE_REBOOT``,
    ``CONTACT_SUPPORT``, ...), for a process ``STOP_HOLDER``, ``REAP_ZOMBIE`` or ``WAIT``; ``None``: nothing to do
    but wait or ask for less.
    ``reason``: the cause in words, without the GPU (:meth:`describe` adds it).
    ``mig_uuid``, ``gpu_instance_id``, ``compute_instance_id``: the MIG instance the cause is in, on a GPU in MIG
    mode (a process's instance, or the instance judged alone: ``--devices MIG-...``); ``None`` for a cause of the
    whole GPU (a health cause, a GPU that could not be read), outside MIG, or where the id is unknown. A holder on
    an instance is told apart from one on the whole GPU by ``gpu_instance_id`` not being ``None``.
    """

    gpu: int | None
    class_: ReadyClass
    kind: str
    reason: str
    pid: int | None = None
    name: str | None = None
    used_bytes: int | None = None
    state: str | None = None
    container: str | None = None
    action: str | None = None
    mig_uuid: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    @property
    def on_instance(self) -> bool:
        """Whether the cause is in one MIG instance (its UUID or GPU-instance id is known), not the whole GPU."""
        return self.mig_uuid is not None or self.gpu_instance_id is not None

    @property
    def where(self) -> str:
        """The GPU it is on, with its MIG instance: ``"GPU 0"``, ``"GPU 0 MIG (GI 2, CI 0, MIG-...)"``; ``""``
        when tied to no GPU."""
        if self.gpu is None:
            return ""
        return f"GPU {self.gpu} {self.instance}" if self.on_instance else f"GPU {self.gpu}"

    @property
    def instance(self) -> str:
        """Its MIG instance in words, ``"MIG (GI 2, CI 0, MIG-...)"``; ``""`` when it is not on one."""
        if not self.on_instance:
            return ""
        gi = "?" if self.gpu_instance_id is None else self.gpu_instance_id
        ci = "?" if self.compute_instance_id is None else self.compute_instance_id
        uuid = f", {self.mig_uuid}" if self.mig_uuid else ""
        return f"MIG (GI {gi}, CI {ci}{uuid})"

    def describe(self) -> str:
        """The reason with its GPU (and MIG instance): ``"GPU 1: held by pid 4123 (python3) in lxc/129, 8.0 GiB"``,
        ``"GPU 0 MIG (GI 2, CI 0, MIG-...): held by pid 4242 (python3), 1.0 GiB"``."""
        return self.reason if self.gpu is None else f"{self.where}: {self.reason}"

    def to_json(self) -> dict[str, Any]:
        """The culprit in JSON documents (``holders`` of ``nvmlcheck/wait``, ``kill``, ``select``, ``ready``)."""
        return {
            "gpu": self.gpu,
            "class": self.class_,
            "kind": self.kind,
            "pid": self.pid,
            "name": self.name,
            "used_bytes": self.used_bytes,
            "state": self.state,
            "container": self.container,
            "action": self.action,
            "reason": self.reason,
            "mig_uuid": self.mig_uuid,
            "gpu_instance_id": self.gpu_instance_id,
            "compute_instance_id": self.compute_instance_id,
        }


@record
class GpuVerdict:
    """The verdict on one GPU (or one MIG instance: ``label`` names it).

    ``class_``: ``"ready"`` or why not (its most severe culprit's class); ``culprits``: every cause found.
    ``used_bytes``, ``total_bytes``, ``free_bytes`` (total - reserved - used) and ``need_bytes`` (``None``: no need
    given) from the last reading. ``eta_ns``: for ``reclaiming``, the expected time from the verdict until the memory
    is back (the reclaim model's figure from when the teardown was first seen; once that has passed while memory
    is still coming back, the observed release rate extrapolated; ``None`` once it has passed with none of it back:
    no time can be promised); ``eta_error_ns``: the ETA's ± when it is the reclaim model's figure (the model's
    ``error_ns``, its fit's largest residual; ``None`` for the observed rate extrapolated, which has no error
    measured); ``eta_beyond``: why the model's figure is not backed by its data (more contexts or memory than any run
    it was fitted to, another GPU model, a driver not measured: :meth:`~nvmlcheck.reclaim_model.ReclaimModel.beyond`),
    ``None`` within it; ``stuck_after_ns``: how long memory may stay held
    with no live holder before it is called stuck (:mod:`nvmlcheck.reclaim_model`). ``free_in``: on a GPU in MIG
    mode selected whole with a need, the MIG instance the need was judged in (a CUDA process runs in one: the first
    that has it free, else the one with the most free), whose free memory ``free_bytes`` then is (``None``: the
    GPU's own).
    """

    index: int
    uuid: str | None
    label: str
    class_: ReadyClass
    culprits: tuple[Culprit, ...] = ()
    used_bytes: int | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    need_bytes: int | None = None
    eta_ns: int | None = None
    stuck_after_ns: int | None = None
    free_in: str | None = None
    eta_error_ns: int | None = None
    eta_beyond: str | None = None

    @property
    def ready(self) -> bool:
        """Whether the next job can start on it now."""
        return self.class_ == "ready"

    @property
    def needs_operator(self) -> bool:
        """Whether waiting cannot make it ready (``unhealthy`` or ``stuck``)."""
        return self.class_ in NEEDS_OPERATOR

    @property
    def beyond_capacity(self) -> bool:
        """Whether the need exceeds what this GPU has with nothing running (a ``capacity-limit`` culprit): no wait
        can make it ready; ask for less or choose another GPU."""
        return any(c.kind == "capacity-limit" for c in self.culprits)

    @property
    def actions(self) -> tuple[str, ...]:
        """The culprits' actions, most severe first (by class, then by :attr:`OperatorAction.severity
        <nvmlcheck.model.OperatorAction.severity>`: a fatal XID's reset after a remap failure's service), without
        repeats."""
        ordered = sorted(self.culprits, key=lambda c: (-_SEVERITY[c.class_], -_action_severity(c.action)))
        return tuple(dict.fromkeys(c.action for c in ordered if c.action))

    def line(self) -> str:
        """One line for a person: ``GPU 1: held by pid 4123 (python3) in lxc/129, 8.0 GiB``."""
        if self.ready:
            free = "" if self.free_bytes is None else f" ({format_bytes(self.free_bytes)} free"
            if free and self.free_in is not None:  # one MIG instance's: the whole GPU's is no job's to use
                free += f" in {self.free_in}"
            if free:
                free += "" if self.need_bytes is None else f", {format_bytes(self.need_bytes)} needed"
                free += ")"
            return f"{self.label}: ready{free}"
        ordered = sorted(self.culprits, key=lambda c: -_SEVERITY[c.class_])
        whole = self.label == f"GPU {self.index}"  # a whole GPU: a culprit in one of its instances says which

        def said(c: Culprit) -> str:
            reason = f"{c.reason}, on {c.instance}" if whole and c.on_instance else c.reason
            return reason if c.class_ == self.class_ else f"{c.class_}: {reason}"

        text = "; ".join(said(c) for c in ordered)
        head = "" if self.class_ == "held" else f"{self.class_}: "
        eta = ""
        if self.class_ == "reclaiming":
            eta = ("; overdue: none of it has come back yet" if self.eta_ns is None else
                   f"; back in ~{self.eta_ns / 1e6:.0f} ms")
            if self.eta_ns is not None:
                eta += (" (from the release rate so far)" if self.eta_error_ns is None else
                        f" (model error up to {self.eta_error_ns / 1e6:.0f} ms)")
            if self.eta_beyond is not None:
                eta += f"; the model's figure is {self.eta_beyond}"
        return f"{self.label}: {head}{text}{eta}"

    def to_json(self) -> dict[str, Any]:
        """The verdict in the ``nvmlcheck/ready`` document."""
        return {
            "index": self.index,
            "uuid": self.uuid,
            "label": self.label,
            "class": self.class_,
            "ready": self.ready,
            "used_bytes": self.used_bytes,
            "total_bytes": self.total_bytes,
            "free_bytes": self.free_bytes,
            "free_in": self.free_in,
            "need_bytes": self.need_bytes,
            "eta_ns": self.eta_ns,
            "eta_error_ns": self.eta_error_ns,
            "eta_beyond": self.eta_beyond,
            "stuck_after_ns": self.stuck_after_ns,
            "beyond_capacity": self.beyond_capacity,
            "actions": list(self.actions),
            "culprits": [c.to_json() for c in self.culprits],
            "line": self.line(),
        }


@record
class ReadyReport:
    """What ``ready`` found: one :class:`GpuVerdict` per selected GPU (or MIG instance).

    ``ready``: every one is ready (never for none). ``needs_operator``: one is ``unhealthy`` or ``stuck`` (waiting
    cannot help). ``snapshot``: the last reading judged; ``elapsed_ns``: from the call to the verdict; ``polls``:
    readings taken; ``timeout_s``: the bound asked for (``None``: none). ``notes``: what was not judged and why
    (health values the GPUs do not support, events that could not be had): never a refusal.
    ``listening_gaps``: the times the event listener did not listen to the selected GPUs while ``ready`` waited
    (:class:`~nvmlcheck.events.ListeningGap`; each is a note too): ``()`` it listened throughout, ``None`` none
    listened.
    """

    verdicts: tuple[GpuVerdict, ...]
    snapshot: Snapshot | None
    elapsed_ns: int
    polls: int
    timeout_s: float | None
    notes: tuple[str, ...] = ()
    listening_gaps: tuple[ListeningGap, ...] | None = None

    @property
    def ready(self) -> bool:
        """Whether every selected GPU is ready (``False`` when none was judged)."""
        return bool(self.verdicts) and all(v.ready for v in self.verdicts)

    @property
    def needs_operator(self) -> bool:
        """Whether a GPU is unhealthy or stuck: waiting cannot make the selection ready."""
        return any(v.needs_operator for v in self.verdicts)

    @property
    def beyond_capacity(self) -> bool:
        """Whether a GPU can never give the need (:attr:`GpuVerdict.beyond_capacity`): no wait can make the
        selection ready."""
        return any(v.beyond_capacity for v in self.verdicts)

    @property
    def holders(self) -> tuple[Culprit, ...]:
        """Every culprit of every GPU (the structured form of :attr:`culprits`)."""
        return tuple(c for v in self.verdicts for c in v.culprits)

    @property
    def culprits(self) -> tuple[str, ...]:
        """Every culprit as a line (``GPU 1: held by pid 4123 ...``), named as its verdict is (``GPU 0 MIG 1 (GI 2,
        CI 0, MIG-...): ...`` for a MIG instance)."""
        # The verdict's label names an instance judged alone; a holder's own instance on a whole GPU is the
        # culprit's to name.
        return tuple(f"{v.label}: {c.reason}" if c.gpu == v.index and (not c.on_instance or v.label != f"GPU {v.index}")
                     else c.describe() for v in self.verdicts for c in v.culprits)


# --- health -----------------------------------------------------------------------------------------------------


def health_causes(d: DeviceState) -> tuple[Culprit, ...]:
    """The health causes of device ``d`` (read with ``Fields.HEALTH``: :meth:`nvmlcheck.model.Health.causes`), each
    an ``unhealthy`` culprit with the operator's action; an unreadable health value that the device does support
    is an ``unknown`` one. Values the device does not support (``None`` with a "not supported" reason) are no
    cause."""
    out: list[Culprit] = []
    i = d.index
    if d.health is not None:
        asked = d.health.recovery_action
        for cause in d.health.causes():
            action = cause.action.value
            hint = _ACTION_HINTS.get(action, "").format(i=i)
            if cause.code == "recovery-action" and asked is not None and asked.name.startswith("ACTION_"):
                # A code this version cannot name: the strongest action, without claiming what it does not know.
                hint = (f"a recovery action nvmlcheck does not know: read it with nvidia-smi -q -i {i} (GPU Recovery "
                        "Action) and the driver's documentation before servicing the GPU")
            out.append(Culprit(i, "unhealthy", cause.code, f"{cause.text} [{action}: {hint}]" if hint else
                               f"{cause.text} [{action}]", action=action))
    for key, why in sorted(d.unknown.items()):
        if key.split(".", 1)[0] == "health" and not unsupported(why):
            read = ("was not read (a reading without Fields.HEALTH)" if why == "not requested" else
                    f"could not be read ({why})")
            out.append(Culprit(i, "unknown", "query", f"{key} {read}; health unknown is never "
                               "ready"))
    return tuple(out)


def fault_culprit(fault: GpuFault) -> Culprit:
    """A fatal event (XID 79, 48, ...) that stopped a wait, as an ``unhealthy`` culprit with its action: the XID
    table's (:data:`nvmlcheck.events.XID_TABLE`, from NVIDIA's catalogue), else a reset."""
    action = RESET_GPU
    if fault.xid is not None:
        from .events import xid_info

        known = xid_info(fault.xid).action
        if known is not None:
            action = known.value
    what = f"XID {fault.xid}" if fault.xid is not None else fault.kind.replace("_", "-")
    return Culprit(fault.index, "unhealthy", "xid" if fault.xid is not None else fault.kind,
                   f"{what}: {fault.meaning}", action=action)


def error_culprit(index: int, error: BaseException) -> Culprit:
    """A GPU that could not be read: ``unhealthy`` when the error says it needs a reset or a reboot (lost,
    reset required), else ``unknown`` (never ready)."""
    from .errors import GpuLost, GpuRequiresReset

    if isinstance(error, GpuLost):
        return Culprit(index, "unhealthy", "query", f"the GPU is lost ({error}): reboot the node", action=NODE_REBOOT)
    if isinstance(error, GpuRequiresReset):
        return Culprit(index, "unhealthy", "query", f"the GPU needs a reset ({error}): nvidia-smi -r -i {index}",
                       action=RESET_GPU)
    return Culprit(index, "unknown", "query", f"could not be read: {error}")


# --- what the polls saw -----------------------------------------------------------------------------------------


class _Track:
    """One GPU's history in a :class:`Watch`."""

    __slots__ = ("contexts", "last_ns", "last_used", "pid_states", "since_ns", "start_bytes")

    def __init__(self) -> None:
        self.since_ns: int | None = None  # when memory was first seen held with no live holder (this episode)
        self.start_bytes = 0  # used then
        self.contexts = 1  # processes exiting then (teardowns are serialised: reclaim_model)
        self.last_ns: int | None = None
        self.last_used: int | None = None
        self.pid_states: dict[int, tuple[str, int]] = {}  # pid -> (state letter or "-" for absent, first seen)


class Watch:
    """What the polls of one wait saw, per GPU (by UUID): when its memory was first seen held with no live holder
    (the teardown's start), how much and how many contexts then, and since when each listed PID has been a zombie,
    in D state or absent from ``/proc``. Feed it every poll (:meth:`observe`, or :meth:`on_poll` as a wait's
    ``on_poll``); :func:`classify` reads it. ``read_state(pid)`` is the ``/proc`` state letter (``None``: no such
    process here); injectable for tests."""

    def __init__(
        self,
        *,
        max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
        read_state: Callable[[int], str | None] | None = None,
    ) -> None:
        self.max_used_bytes = max_used_bytes
        self.read_state = read_state if read_state is not None else _proc_state
        self._tracks: dict[str, _Track] = {}
        self.last_full: Snapshot | None = None
        self.observed = 0

    def track(self, d: DeviceState) -> _Track:
        """The history of device ``d`` (created empty)."""
        t = self._tracks.get(d.uuid)
        if t is None:
            t = self._tracks[d.uuid] = _Track()
        return t

    def state_since(self, d: DeviceState, pid: int, now_ns: int) -> tuple[str | None, int]:
        """``pid``'s ``/proc`` state letter (``None``: not visible here) and since when it has been in it."""
        state = self.read_state(pid)
        key = state or "-"
        t = self.track(d)
        seen = t.pid_states.get(pid)
        if seen is None or seen[0] != key:
            t.pid_states[pid] = (key, now_ns)
            return state, now_ns
        return state, seen[1]

    def observe(self, snapshot: Snapshot, now_ns: int, *, partial: bool = False) -> None:
        """Record one poll's snapshot taken at ``now_ns`` (``partial``: memory only, the probe's)."""
        self.observed += 1
        if not partial:
            self.last_full = snapshot
        for whole in snapshot.devices:
            # A GPU, and each of its MIG instances as ``ready`` judges one selected by UUID (its own track).
            for d in (whole, *(instance_view(whole, i) for i in whole.mig_devices or () if i.uuid is not None)):
                self._observe_one(d, now_ns, partial=partial)

    def _observe_one(self, d: DeviceState, now_ns: int, *, partial: bool) -> None:
        m = d.memory
        t = self.track(d)
        if m is not None:
            t.last_ns, t.last_used = now_ns, m.used_bytes
            if d.mig_mode:  # the MIG rule: per instance, with its idle allowance
                held = _memory_judgement(d, self.max_used_bytes) is False
            else:
                held = not m.used_includes_reserved and m.used_bytes > self.max_used_bytes
            if partial:
                if not held:
                    t.since_ns = None
                return
            procs = d.processes
            if procs is None:
                return
            pids = {p.pid for p in procs}
            live = [pid for pid in pids if self.state_since(d, pid, now_ns)[0] not in (None, "Z", "X")]
            for gone in set(t.pid_states) - pids:
                del t.pid_states[gone]
            if held and not live:
                if t.since_ns is None:
                    t.since_ns, t.start_bytes, t.contexts = now_ns, m.used_bytes, max(1, len(pids))
            else:
                t.since_ns = None

    def teardown_age_ns(self, now_ns: int) -> int | None:
        """How long the oldest teardown seen is in progress at ``now_ns``: memory held with no live holder since
        (``None``: none)."""
        ages = [now_ns - t.since_ns for t in self._tracks.values() if t.since_ns is not None]
        return max(ages) if ages else None

    def exited_age_ns(self, now_ns: int) -> int | None:
        """How long the oldest listed PID seen a zombie or in D state (what can be ``stuck`` with a holder listed)
        has been so at ``now_ns`` (``None``: none)."""
        ages = [now_ns - since for t in self._tracks.values() for key, since in t.pid_states.values()
                if key in ("Z", "X", "D")]
        return max(ages) if ages else None

    def on_poll(self, clock: Callable[[], int]) -> Callable[[TracePoint], None]:
        """A wait's ``on_poll`` that observes every poll, stamped with ``clock``."""

        def on_poll(point: TracePoint) -> None:
            if point.snapshot is not None:
                self.observe(point.snapshot, clock(), partial=point.partial)

        return on_poll


def _read_stat(pid: int) -> ProcStat | None:
    """``procfs.read_stat(pid)``, imported here: only a holder needs it, and a one-shot on a ready GPU has none."""
    from ._proc import procfs

    return procfs.read_stat(pid)


def _proc_state(pid: int) -> str | None:
    from ._proc import procfs

    st = _read_stat(pid)
    return None if st is None else procfs.state_of(st)  # a main thread gone while others run is no zombie


def _container(pid: int) -> str | None:
    """The container label of ``pid`` (``None``: none, or not visible here)."""
    from ._proc.container import container_of

    c = container_of(pid)
    return None if c is None else c.label()


# --- classification ---------------------------------------------------------------------------------------------


def classify(
    snapshot: Snapshot | None,
    *,
    now_ns: int,
    watch: Watch | None = None,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    need_bytes: int | None = None,
    need_fraction: float | None = None,
    health: Snapshot | None = None,
    faults: Sequence[GpuFault] = (),
    errors: Mapping[int, BaseException] | None = None,
    unlisted: Sequence[Holder] = (),
    unlisted_unknown: str | None = None,
    units: Sequence[DeviceState] | None = None,
    container: Callable[[int], str | None] | None = None,
    judge_health: bool = True,
) -> tuple[GpuVerdict, ...]:
    """One :class:`GpuVerdict` per device of ``snapshot`` (or per ``units``: MIG instance views), judged at
    ``now_ns`` (on the clock ``watch`` was fed with).

    Clean means no listed process and at most ``max_used_bytes`` used (the wait's rule); capacity means free =
    total - reserved - used at least ``need_bytes`` or ``need_fraction`` of the total. ``health``: a snapshot read
    with ``Fields.HEALTH`` (default: ``snapshot``'s own health; a GPU among its failures is judged by that error, a
    GPU it lacks is ``unknown``: health not read is never ready); ``faults``: fatal events on these GPUs; ``errors``:
    per GPU index, the error that made it unreadable; ``unlisted``: processes with NVIDIA device files open that are
    on no GPU's list (a GPU whose memory is held with an empty list is ``held`` while one lives, not ``stuck``);
    ``unlisted_unknown``: why that list is incomplete (a scan cut short by a deadline, or one that failed): memory
    held with an empty list past the bound and no holder found is then ``unknown`` with that reason, never ``stuck``
    (nothing proves that no process holds it). ``container(pid)`` labels a holder's container (default:
    ``/proc/PID/cgroup`` and its PID namespace). ``judge_health=False``: health is not judged at all (a wait's
    timeout: :func:`holders_of`); else a GPU whose health was not read (a snapshot without ``Fields.HEALTH``) is
    ``unknown``, never ready.
    """
    label_of = container if container is not None else _container
    devices = tuple(units) if units is not None else (snapshot.devices if snapshot is not None else ())
    driver = snapshot.system.driver_version if snapshot is not None else None
    model = reclaim_model.model_for(driver)
    health_of = {d.index: d for d in (health.devices if health is not None else devices)}
    errs = dict(errors or {})
    uuids: dict[int, str | None] = {}
    if snapshot is not None:
        for failure in snapshot.failures:
            errs.setdefault(failure.index, failure.error)
            uuids[failure.index] = failure.uuid
    if health is not None:
        # A GPU the health reading could not read has unknown health (lost: unhealthy), never the judged
        # snapshot's unrequested health read as "nothing to say".
        for failure in health.failures:
            errs.setdefault(failure.index, failure.error)
            uuids.setdefault(failure.index, failure.uuid)
    ctx = _Ctx(now=now_ns, watch=watch, model=model, max_used=max_used_bytes, need_bytes=need_bytes,
               need_fraction=need_fraction, unlisted=unlisted, unlisted_unknown=unlisted_unknown, label_of=label_of)
    out: list[GpuVerdict] = []
    seen: set[int] = set()
    for d in devices:
        seen.add(d.index)
        culprits = [fault_culprit(f) for f in faults if f.index == d.index]
        if judge_health:
            culprits += _health_of_one(d.index, health_of.get(d.index), errs)
        error = errs.get(d.index)
        if error is not None:
            culprits.append(error_culprit(d.index, error))
        out.append(_classify_one(d, ctx, culprits))
    for index, err in sorted(errs.items()):
        if index not in seen:
            culprits = [error_culprit(index, err), *(fault_culprit(f) for f in faults if f.index == index)]
            out.append(_verdict(index, uuids.get(index), f"GPU {index}", culprits))
            seen.add(index)
    for f in faults:
        if f.index not in seen:
            out.append(_verdict(f.index, f.uuid, f"GPU {f.index}", [fault_culprit(f)]))
            seen.add(f.index)
    # In GPU index order: an unreadable GPU 1 came after GPU 7, where a reader of its line does not look (stable:
    # the MIG instances of one GPU keep their order).
    return tuple(sorted(out, key=lambda v: v.index))


def _health_of_one(index: int, read: DeviceState | None, errs: Mapping[int, BaseException]) -> tuple[Culprit, ...]:
    """The health culprits of GPU ``index`` from its health reading ``read``; none read and no error: unknown."""
    if read is not None:
        return health_causes(read)
    if index in errs:
        return ()  # the error says why (error_culprit)
    return (Culprit(index, "unknown", "query", "health was not read; health unknown is never ready"),)


class _Ctx:
    """What every GPU of one classification shares (a slotted class: a named tuple class costs a one-shot's import
    ~0.15 ms on an H200)."""

    __slots__ = ("label_of", "max_used", "model", "need_bytes", "need_fraction", "now", "unlisted", "unlisted_unknown",
                 "watch")

    def __init__(
        self, *, now: int, watch: Watch | None, model: reclaim_model.ReclaimModel, max_used: int,
        need_bytes: int | None, need_fraction: float | None, unlisted: Sequence[Holder],
        unlisted_unknown: str | None, label_of: Callable[[int], str | None],
    ) -> None:  # fmt: skip
        self.now = now
        self.watch = watch
        self.model = model
        self.max_used = max_used
        self.need_bytes = need_bytes
        self.need_fraction = need_fraction
        self.unlisted = unlisted
        self.unlisted_unknown = unlisted_unknown
        self.label_of = label_of


def _verdict(index: int, uuid: str | None, label: str, culprits: list[Culprit], **fields: Any) -> GpuVerdict:
    worst: ReadyClass = "ready"
    for c in culprits:
        if _SEVERITY[c.class_] > _SEVERITY[worst]:
            worst = c.class_
    if worst != "reclaiming":
        fields["eta_ns"] = fields["eta_error_ns"] = fields["eta_beyond"] = None
    if worst not in ("reclaiming", "stuck"):
        fields["stuck_after_ns"] = None
    return GpuVerdict(index, uuid, label, worst, tuple(culprits), **fields)


def _label(d: DeviceState) -> str:
    if d.mig_mode and d.mig_devices is not None and len(d.mig_devices) == 1 and d.mig_devices[0].uuid == d.uuid:
        return f"GPU {d.index} {d.mig_devices[0].label}"
    return f"GPU {d.index}"


def _classify_one(d: DeviceState, ctx: _Ctx, culprits: list[Culprit]) -> GpuVerdict:
    """The verdict on ``d``: ``culprits`` (faults, health, read errors) plus what its processes, memory and
    capacity say."""
    i, now, m = d.index, ctx.now, d.memory
    track = ctx.watch.track(d) if ctx.watch is not None else None
    episode = track is not None and track.since_ns is not None
    # The teardown: since when memory has been held with no live holder (this reading, without history).
    since = track.since_ns if track is not None and track.since_ns is not None else now
    # The figure the memory rule judges (a MIG instance's, not the parent's): what a teardown gives back.
    start_bytes = track.start_bytes if track is not None and episode else (
        0 if m is None else sum(u.used_bytes for _, u in _held_parts(d, m, ctx.max_used)))
    procs = d.processes
    listed = _distinct(procs if procs is not None else
                       (*(d.compute_processes or ()), *(d.graphics_processes or ()), *(d.mps_processes or ())))
    contexts = track.contexts if track is not None and episode else max(1, len(listed))
    bound = ctx.model.stuck_after_ns(contexts, max(0, start_bytes))
    first = len(culprits)  # those before are the GPU's (faults, health, read errors), never one instance's
    culprits += _process_culprits(d, listed, ctx, bound)
    culprits += _unknown_lists(d)
    culprits += _memory_culprits(d, ctx, since, bound)
    view = _viewed_instance(d)
    if view is not None:  # one instance judged alone (--devices MIG-...): what it found is that instance's
        culprits[first:] = [c if c.on_instance else _in_instance(c, view) for c in culprits[first:]]
    eta = eta_error = eta_beyond = None
    if any(c.class_ == "reclaiming" for c in culprits):
        eta = max(0, since + ctx.model.expected_ns(contexts, max(0, start_bytes)) - now)
        eta_error = ctx.model.error_ns
        eta_beyond = ctx.model.beyond(contexts, max(0, start_bytes), gpu=d.name)
        if eta == 0 and track is not None and track.since_ns is not None and m is not None:
            released, elapsed = start_bytes - m.used_bytes, now - track.since_ns
            # Overdue and still coming back: the observed rate extrapolated. Overdue and none of it back: no rate to
            # extrapolate, no time to promise (0 would say "back now").
            eta = max(1, round(m.used_bytes * elapsed / released)) if released > 0 and elapsed > 0 else None
            eta_error = eta_beyond = None  # not the model's figure
    need = None
    judged: MigDevice | None = None  # the MIG instance the need was judged in, on a GPU in MIG mode selected whole
    instances = _whole_mig(d)
    if instances == ():
        culprits.append(Culprit(i, "short", "capacity-limit", "in MIG mode with no MIG instance: no CUDA job can run "
                                f"on it (create MIG instances, or turn MIG mode off: nvidia-smi -i {i} -mig 0)"))
    elif instances and (ctx.need_bytes is not None or ctx.need_fraction is not None):
        # A CUDA process runs in one MIG instance: the need is judged per instance, not against the whole GPU.
        need, found, judged = _mig_capacity(d, instances, ctx.need_bytes, ctx.need_fraction, clean=not culprits)
        culprits += found
    elif _instances_unknown(d) is not None:
        # In MIG mode (or maybe: its mode unread) with the instances unknown: the whole GPU's free memory is not
        # what a job gets, so whether the need fits cannot be told (never "ready" on the parent's figure); and
        # with no need, whether any CUDA job can run there (none can in MIG mode with no instance: short) cannot
        # either. select passes over such a GPU for the same reason.
        if ctx.need_bytes is not None or ctx.need_fraction is not None:
            culprits.append(Culprit(i, "unknown", "capacity", f"whether the need fits is unknown: "
                                    f"{_instances_unknown(d)}; a CUDA job runs in one MIG instance, not the whole GPU"))
        else:
            culprits.append(Culprit(i, "unknown", "capacity", f"whether a CUDA job can run on it is unknown: "
                                    f"{_instances_unknown(d)}; in MIG mode a CUDA job runs in one MIG instance, and "
                                    "with none there none can"))
    elif m is not None and (ctx.need_bytes is not None or ctx.need_fraction is not None):
        need = ctx.need_bytes if ctx.need_fraction is None else _ceil(ctx.need_fraction * m.total_bytes)
        beyond = [] if need is None else _beyond_capacity(d, m, need, ctx.need_fraction)
        if beyond:  # whatever else holds it: no wait can make this GPU ready
            culprits += beyond
        elif not culprits and need is not None:
            culprits += _capacity_culprits(d, m, need, ctx.need_fraction)
    free = None if m is None else free_bytes_of(m)[0]
    if judged is not None and judged.memory is not None:  # the need was judged against this instance's free memory
        free = free_bytes_of(judged.memory)[0]
    return _verdict(i, d.uuid, _label(d), culprits, used_bytes=None if m is None else m.used_bytes,
                    total_bytes=None if m is None else m.total_bytes, free_bytes=free, need_bytes=need, eta_ns=eta,
                    stuck_after_ns=bound, free_in=None if judged is None else judged.label, eta_error_ns=eta_error,
                    eta_beyond=eta_beyond)


def _viewed_instance(d: DeviceState) -> MigDevice | None:
    """The MIG instance ``d`` stands for when it is one instance judged as a device
    (:func:`~nvmlcheck.predicates.instance_view`: its only MIG device has its UUID), else ``None``."""
    migs = d.mig_devices
    if d.mig_mode and migs is not None and len(migs) == 1 and migs[0].uuid == d.uuid:
        return migs[0]
    return None


def _in_instance(c: Culprit, m: MigDevice) -> Culprit:
    return replace(c, mig_uuid=m.uuid, gpu_instance_id=m.gpu_instance_id, compute_instance_id=m.compute_instance_id)


def _instance_fields(d: DeviceState, p: GpuProcess) -> dict[str, Any]:
    """A process culprit's MIG fields: the instance ``p`` runs in (its UUID where ``d``'s MIG devices name it)."""
    if p.gpu_instance_id is None:
        return {}
    m = d.mig_device_of(p) if d.mig_devices else None
    return {"mig_uuid": None if m is None else m.uuid, "gpu_instance_id": p.gpu_instance_id,
            "compute_instance_id": p.compute_instance_id}


def _unknown_lists(d: DeviceState) -> list[Culprit]:
    out = []
    for kind in ("compute", "graphics", "mps"):
        if getattr(d, f"{kind}_processes") is None:
            why = d.why_unknown(f"processes.{kind}") or "not read"
            out.append(Culprit(d.index, "unknown", "query", f"{kind} process list unknown ({why})"))
    return out


def _memory_culprits(d: DeviceState, ctx: _Ctx, since: int, bound: int) -> list[Culprit]:
    """The memory rule: unknown, undecidable, or held with an empty process list (:func:`_unheld_memory`)."""
    m = d.memory
    if m is None:
        return [Culprit(d.index, "unknown", "query", f"memory use unknown ({d.why_unknown('memory') or 'not read'})")]
    judged = _memory_judgement(d, ctx.max_used)
    if judged is None:
        if m.used_includes_reserved:
            return [Culprit(d.index, "unknown", "memory", "the driver only has the v1 memory call, whose 'used' counts "
                            "its reserve: no fixed limit can tell idle from busy", used_bytes=m.used_bytes)]
        # The figures the rule could not decide on (on a GPU in MIG mode, its instances'), not always the parent's.
        parts, limit = _judged_memory(d, m, ctx.max_used)
        undecided = [(inst, used) for inst, used in parts
                     if _judge_at_most(used.used_bytes, used.granularity_bytes - 1, limit) is None] or parts
        used_bytes = sum(u.used_bytes for _, u in undecided)
        what = (f"{format_bytes(used_bytes)} used{_where(d, undecided)} is within the reporting resolution of the "
                f"{format_bytes(limit)} limit" + (" (with the MIG idle allowance)" if d.mig_mode else ""))
        return [_on(d, undecided, Culprit(d.index, "unknown", "memory", what, used_bytes=used_bytes))]
    if judged is False and d.processes == ():
        return _unheld_memory(d, m, ctx, since, bound)
    return []


def _judged_memory(d: DeviceState, m: Memory, max_used: int) -> tuple[list[tuple[MigDevice | None, Memory]], int]:
    """The memory figures the memory rule judges on ``d`` and the limit it holds them to, as
    ``predicates.memory_used_at_most`` does: on a GPU in MIG mode each instance's (all known) or else the parent's,
    held to the limit + the MIG idle allowance; otherwise the GPU's own."""
    if not d.mig_mode:
        return [(None, m)], max_used
    allowed = max_used + DEFAULT_MIG_IDLE_BYTES
    instances = d.mig_devices or ()
    known = [(i, i.memory) for i in instances if i.memory is not None and not i.memory.used_includes_reserved]
    if instances and len(known) == len(instances):
        return list(known), allowed
    return [(None, m)], allowed


def _held_parts(d: DeviceState, m: Memory, max_used: int) -> list[tuple[MigDevice | None, Memory]]:
    """The figures the memory rule found over its limit (the GPU's own where none is, as a fallback)."""
    parts, limit = _judged_memory(d, m, max_used)
    return [(i, u) for i, u in parts if _judge_at_most(u.used_bytes, u.granularity_bytes - 1, limit) is False] or parts


def _where(d: DeviceState, parts: Sequence[tuple[MigDevice | None, Memory]]) -> str:
    """" in MIG 0 (GI 1, CI 0, MIG-...) and MIG 1 (...)" for the figures of several instances of a GPU judged whole
    ("" for the GPU's own figure, one instance's (:func:`_on` gives the culprit its MIG fields, which its line
    names) or an instance judged alone (its label names it))."""
    names = [i.label for i, _ in parts if i is not None]
    if len(names) < 2 or _viewed_instance(d) is not None:
        return ""
    return " in " + " and ".join(names)


def _on(d: DeviceState, parts: Sequence[tuple[MigDevice | None, Memory]], c: Culprit) -> Culprit:
    """``c`` placed in the one instance its figure is of (its MIG fields), else as it is."""
    if len(parts) == 1 and parts[0][0] is not None and _viewed_instance(d) is None:
        return _in_instance(c, parts[0][0])
    return c


def _beyond_capacity(d: DeviceState, m: Memory, need: int, fraction: float | None) -> list[Culprit]:
    """A ``short`` culprit of kind ``capacity-limit`` when ``need`` exceeds what the GPU has with nothing running
    (total - the driver's reserve; the total where the reserve is unknown), beyond the figures' resolution."""
    unit = m.granularity_bytes - 1
    reserved = None if m.used_includes_reserved else m.reserved_bytes
    most = m.total_bytes - (reserved or 0)
    if need <= most + (1 if reserved is None else 2) * unit:
        return []
    of = _of_total(m, fraction)
    where = ("its total; the driver's reserve is not known" if reserved is None else
             f"{format_bytes(m.total_bytes)} total, {format_bytes(reserved)} reserved by the driver")
    needed, at_most = _apart(need, most)
    return [Culprit(d.index, "short", "capacity-limit", f"{needed} needed{of} can never be free on this "
                    f"GPU: at most {at_most} with nothing running ({where})", used_bytes=m.used_bytes)]


def _apart(a: int, b: int) -> tuple[str, str]:
    """Two byte counts as a person reads them, in exact bytes where the rounded figures would look the same
    ("139.8 GiB needed ... at most 139.8 GiB" said nothing)."""
    x, y = format_bytes(a), format_bytes(b)
    return (x, y) if x != y or a == b else (f"{a:,} B", f"{b:,} B")


def _whole_mig(d: DeviceState) -> tuple[MigDevice, ...] | None:
    """The MIG devices of a GPU in MIG mode judged whole (``None``: not in MIG mode, its instances unknown, or ``d``
    is one instance's view)."""
    if d.mig_mode is not True or d.mig_devices is None:
        return None
    if len(d.mig_devices) == 1 and d.mig_devices[0].uuid == d.uuid:
        return None
    return d.mig_devices


def _instances_unknown(d: DeviceState) -> str | None:
    """Why the memory a job on GPU ``d`` gets is unknown for want of MIG facts: in MIG mode with its instances
    unread, or its MIG mode unread (a reason under ``"mig"``); ``None`` when known (or ``d`` is one instance)."""
    if d.mig_mode is True and d.mig_devices is None:
        why = d.why_unknown("mig_devices") or "not read"
        return f"it is in MIG mode and its MIG instances could not be read ({why})"
    if d.mig_mode is None and "mig" in d.unknown and not unsupported(d.unknown["mig"]):
        # Not one the tool does not have (an nvidia-smi older than MIG, whose driver has none): judged as before MIG.
        return f"its MIG mode could not be read ({d.unknown['mig']})"
    return None


def _mig_capacity(d: DeviceState, instances: tuple[MigDevice, ...], need_bytes: int | None,
                  fraction: float | None, *, clean: bool) -> tuple[int | None, list[Culprit], MigDevice | None]:
    """The need on a GPU in MIG mode selected whole, judged per instance (a CUDA process runs in one): met when one
    instance has it free; ``capacity-limit`` when none could ever hold it; else (on a clean GPU) ``short``, or
    ``unknown`` when an instance's memory is unknown or within the figures' resolution. The need in bytes (of the
    instance with the most free, for a fraction), the culprits, and the instance judged (the first with the need
    free, else the one with the most free; ``None`` when no instance's memory is known)."""
    known = [(inst, inst.memory) for inst in instances if inst.memory is not None]
    doubtful = len(known) < len(instances)
    best: tuple[int, int, MigDevice] | None = None  # (free, need, instance) with the most free
    never = True
    for inst, m in known:
        need = need_bytes if fraction is None else _ceil(fraction * m.total_bytes)
        assert need is not None
        free, slack = free_bytes_of(m)
        if free - slack >= need:
            return need, [], inst
        if not _beyond_capacity(d, m, need, fraction):
            never = False
        doubtful = doubtful or free + slack >= need
        if best is None or free > best[0]:
            best = free, need, inst
    needed = format_bytes(need_bytes or 0) if fraction is None else f"{fraction * 100:g}% of each instance's total"
    judged = None if best is None else best[2]
    if never and not doubtful:
        most = max((m.total_bytes - (m.reserved_bytes or 0) for _, m in known), default=0)
        needed, at_most = _apart(need_bytes, most) if fraction is None and need_bytes else (needed,
                                                                                              format_bytes(most))
        return None if best is None else best[1], [Culprit(
            d.index, "short", "capacity-limit", f"{needed} needed can never be free in one MIG instance of this GPU "
            f"(a CUDA process runs in one): the largest has at most {at_most} with nothing running")], judged
    if not clean:
        return None if best is None else best[1], [], judged
    if doubtful or best is None:
        return None if best is None else best[1], [Culprit(
            d.index, "unknown", "capacity", f"whether a MIG instance has {needed} free is unknown (an instance's "
            "memory is unknown, or within the reporting resolution of the need)")], judged
    free, need, inst = best
    most_free = format_bytes(free)
    if fraction is None:
        needed, most_free = _apart(need, free)
    return need, [Culprit(d.index, "short", "capacity", f"clean, but no MIG instance has {needed} free (a CUDA "
                          f"process runs in one): the most is {most_free}, in {inst.label}")], inst


def _of_total(m: Memory, fraction: float | None) -> str:
    return "" if fraction is None else f" ({fraction * 100:g}% of {format_bytes(m.total_bytes)})"


def _capacity_culprits(d: DeviceState, m: Memory, need: int, fraction: float | None) -> list[Culprit]:
    free, slack = free_bytes_of(m)
    if free + slack < need:
        of = _of_total(m, fraction)
        free_text, need_text = _apart(free, need)
        return [Culprit(d.index, "short", "capacity", f"clean, but {free_text} free, {need_text} needed{of}",
                        used_bytes=m.used_bytes)]
    if free - slack < need:
        return [Culprit(d.index, "unknown", "capacity", f"{format_bytes(free)} free is within the reporting "
                        f"resolution of the {format_bytes(need)} needed")]
    return []


def _ceil(x: float) -> int:
    n = int(x)
    return n if n >= x else n + 1


def _distinct(procs: Iterable[GpuProcess]) -> list[GpuProcess]:
    """One entry per PID (a process listed under two kinds shares one context: the largest figure)."""
    by_pid: dict[int, GpuProcess] = {}
    for p in procs:
        seen = by_pid.get(p.pid)
        if seen is None or (p.used_bytes or 0) > (seen.used_bytes or 0):
            by_pid[p.pid] = p
    return list(by_pid.values())


def _memory_judgement(d: DeviceState, max_used: int) -> bool | None:
    """The wait's memory rule on this one device (MIG allowance included): ``False`` held, ``None`` cannot tell."""
    alone = Snapshot("-", 0, 0, 0.0, _NO_SYSTEM, (replace(d, compute_processes=(), graphics_processes=(),
                                                          mps_processes=()),))
    return memory_used_at_most(max_used).check(alone)


def _process_culprits(d: DeviceState, listed: list[GpuProcess], ctx: _Ctx, bound: int) -> list[Culprit]:
    """Each listed process: held (alive), reclaiming (exited, within ``bound``), stuck (a zombie or in D state past
    it), or held by a process not visible here (still listed past it)."""
    out: list[Culprit] = []
    i, now = d.index, ctx.now
    for p in listed:
        if ctx.watch is not None:
            state, since = ctx.watch.state_since(d, p.pid, now)
        else:
            state, since = _proc_state(p.pid), now
        word = _state_word(state)
        short = os.path.basename(p.name) if p.name else None  # the program, as holders name it
        name = short or "name unknown"
        held = "an unknown amount" if p.used_bytes is None else format_bytes(p.used_bytes)
        its = "memory (an unknown amount)" if p.used_bytes is None else held  # "its 8.0 GiB", never "its an unknown"
        age = now - since
        common: dict[str, Any] = {"pid": p.pid, "name": short, "used_bytes": p.used_bytes, "state": word,
                                  **_instance_fields(d, p)}
        if state is None:
            if age <= bound:
                out.append(Culprit(i, "reclaiming", p.kind.value, f"pid {p.pid} ({name}) is not in /proc: it "
                                   f"exited and its {its} is coming back, or it runs in another PID namespace",
                                   action=WAIT, **common))
            else:
                out.append(Culprit(i, "held", p.kind.value, f"held by pid {p.pid} ({name}), {held}, listed for "
                                   f"{age / 1e9:.1f} s but not visible from this PID namespace (NVML reports PIDs of "
                                   "another namespace on older drivers)", action=STOP_HOLDER, **common))
            continue
        where = ctx.label_of(p.pid)
        common["container"] = where
        inside = f" in {where}" if where else ""
        if state in ("Z", "X"):
            if age <= bound:
                out.append(Culprit(i, "reclaiming", p.kind.value, f"pid {p.pid} ({name}){inside} exited (zombie); "
                                   f"its {its} is coming back", action=WAIT, **common))
            else:
                parent = _parent(p.pid)
                whose = "its parent" if parent is None else f"its parent (pid {parent})"  # never "pid None"
                out.append(Culprit(i, "stuck", p.kind.value, f"pid {p.pid} ({name}){inside} is a zombie still "
                                   f"holding {held} after {age / 1e9:.1f} s: {whose} must reap it "
                                   "(end the parent), else reset the GPU", action=REAP_ZOMBIE, **common))
            continue
        if state == "D" and age > bound:
            out.append(Culprit(i, "stuck", p.kind.value, f"pid {p.pid} ({name}){inside} holds {held} in "
                               f"uninterruptible sleep (D) for {age / 1e9:.1f} s: no signal takes effect until its "
                               "kernel call returns; reboot if it stays", action=NODE_REBOOT, **common))
            continue
        out.append(Culprit(i, "held", p.kind.value, f"held by pid {p.pid} ({name}){inside}, {held}",
                           action=STOP_HOLDER, **common))
    return out


def _state_word(state: str | None) -> str | None:
    """The word for a ``/proc/PID/stat`` state letter (``None`` stays ``None``)."""
    if state is None:
        return None
    from ._proc import procfs

    return procfs.STATE_WORDS.get(state, state)


def _parent(pid: int) -> int | None:
    st = _read_stat(pid)
    return None if st is None else st.ppid


def _unheld_memory(d: DeviceState, m: Memory, ctx: _Ctx, since: int, bound: int) -> list[Culprit]:
    """Memory held with an empty process list: a process on no list holds it (held), the teardown is still within
    the reclaim model's bound (reclaiming), or it is past it (stuck)."""
    i = d.index
    # The figure the memory rule judged: on a GPU in MIG mode the instances' over their limit, not the parent's
    # (which may read 0 B while an instance holds 10 GiB).
    parts = _held_parts(d, m, ctx.max_used)
    used_bytes = sum(u.used_bytes for _, u in parts)
    held = format_bytes(used_bytes) + _where(d, parts)
    out: list[Culprit] = []
    for h in ctx.unlisted:
        if h.is_daemon or h.relation is not None or h.start_ticks is None or h.state in ("zombie", "dead"):
            continue
        if h.gpu_device_files == ():  # only nvidiactl, UVM or capabilities open: it holds no GPU's memory
            continue
        where = h.container or ctx.label_of(h.pid)
        inside = f" in {where}" if where else ""
        files = ", ".join(h.device_files or ()) or "NVIDIA device files"
        out.append(Culprit(i, "held", "device-file", f"{held} used with no process listed; pid {h.pid} "
                           f"({h.name or 'name unknown'}){inside} has {files} open and is on no GPU list (a process "
                           "of another PID namespace, or one the driver does not list)", pid=h.pid, name=h.name,
                           state=h.state, container=where, action=STOP_HOLDER))
    if out:
        return [_on(d, parts, c) for c in out]
    # One culprit per figure judged (each instance over its limit on a GPU in MIG mode, with its MIG fields).
    return [_on(d, [part], _teardown(d, part[1].used_bytes, ctx, since, bound)) for part in parts]


def _teardown(d: DeviceState, used_bytes: int, ctx: _Ctx, since: int, bound: int) -> Culprit:
    """``used_bytes`` held with no holder found: reclaiming within the bound, past it stuck (or unknown when
    whether a process on no list holds it is unknown)."""
    i, held, age = d.index, format_bytes(used_bytes), ctx.now - since
    if age <= bound:
        return Culprit(i, "reclaiming", "memory", f"{held} used with no process listed: the driver is giving it back",
                       used_bytes=used_bytes, action=WAIT)
    if ctx.unlisted_unknown is not None:
        return Culprit(i, "unknown", "memory", f"{held} held with no process listed for {age / 1e9:.1f} s, past the "
                       f"{bound / 1e9:.1f} s a reclaim can take, but whether a process on no list holds it is "
                       f"unknown: {ctx.unlisted_unknown}", used_bytes=used_bytes)
    return Culprit(i, "stuck", "memory", f"{held} held with no holder for {age / 1e9:.1f} s, past the "
                   f"{bound / 1e9:.1f} s a reclaim can take: reset the GPU (nvidia-smi -r -i {i}) or reboot",
                   used_bytes=used_bytes, action=RESET_GPU)


def holders_of(
    snapshot: Snapshot | None,
    *,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    devices: Iterable[int] | None = None,
    units: Sequence[DeviceState] | None = None,
) -> tuple[Culprit, ...]:
    """The culprits of a wait that timed out on ``snapshot`` (what :attr:`nvmlcheck.WaitTimeout.holders` holds):
    each listed process (``held``, or ``reclaiming`` when it has exited) with its container, memory held with no
    process, unreadable GPUs. Judged without history, so nothing is ``stuck`` by age alone. ``devices``: only the
    GPUs with these NVML indices (those the wait's predicate refused: :func:`nvmlcheck.predicates.blamed_devices`;
    ``None``: every GPU of ``snapshot``). ``units``: what is judged, when a wait selected MIG instances
    (:func:`mig_units`): each selected instance alone, never the processes of another instance of its GPU."""
    if snapshot is None:
        return ()
    verdicts = classify(snapshot, now_ns=time.monotonic_ns(), max_used_bytes=max_used_bytes, units=units,
                        judge_health=False)
    chosen = None if devices is None else frozenset(devices)
    return tuple(c for v in verdicts if chosen is None or v.index in chosen for c in v.culprits)



def mig_units(predicate: object, snapshot: Snapshot) -> tuple[DeviceState, ...] | None:
    """What a wait with ``predicate`` judges in ``snapshot`` when it selected MIG instances by UUID (``on_devices``
    with ``MIG-...``, as ``--devices MIG-...`` gives): each GPU selected whole as itself, each selected instance as
    its own device (:func:`~nvmlcheck.predicates.instance_view`). ``None`` when it selected no MIG instance."""
    whole: set[int] = set()
    mig: set[str] = set()
    todo = [predicate]
    while todo:  # the predicate's tree: on_devices nodes say what is selected
        p = todo.pop()
        whole |= getattr(p, "indices", frozenset())
        mig |= getattr(p, "mig_uuids", frozenset())
        todo.extend(getattr(p, "parts", ()))
        inner = getattr(p, "inner", None)
        if inner is not None:
            todo.append(inner)
    if not mig:
        return None
    out: list[DeviceState] = []
    for d in snapshot.devices:
        chosen = [m for m in d.mig_devices or () if m.uuid is not None and m.uuid in mig]
        if d.index in whole or not chosen:
            out.append(d)
        else:
            out.extend(instance_view(d, m) for m in chosen)
    return tuple(out)
