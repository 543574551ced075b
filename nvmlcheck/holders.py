"""Who holds the GPUs: every process on an NVML process list, joined with every process that has an NVIDIA device
file open, each described from ``/proc`` (state, owner, command line, PID namespaces, ancestry).

>>> import nvmlcheck as nc
>>> with nc.open() as gpus:                                   # doctest: +SKIP
...     for h in gpus.holders():
...         print(h.pid, sorted(h.found_by), h.state, h.name, [g.used_bytes for g in h.gpus])

NVML names the GPU and the bytes but, on older drivers inside a PID namespace, a host PID that may be another local
process; a device file proves a local process holds *a* GPU but not which one (every CUDA process opens every
``/dev/nvidiaN``). :func:`select_kill_holders` therefore kills an NVML PID only when the local process of that
number has an NVIDIA device file open (a character device of NVIDIA's majors: :mod:`nvmlcheck._proc.devfiles`;
tests name stand-ins with ``device_files=`` or run on the simulator). Rationale and limits: docs/killing.md.
"""

from __future__ import annotations

import _thread
import math
import os
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from ._proc import devfiles, procfs
from ._text import printable
from .errors import ArgumentError, ArgumentTypeError, NvmlCheckError
from .model import DeviceState, GpuProcess, MigDevice, Snapshot
from .predicates import DEFAULT_MAX_USED_BYTES, format_bytes

if TYPE_CHECKING:
    from .session import DeviceSelector, Session

__all__ = [
    "AGENTS",
    "DAEMONS",
    "DEFAULT_DEVICE_FILES",
    "EXPLAIN_BUDGET_S",
    "HUNG_READ_S",
    "RECHECK_S",
    "daemon_kind",
    "GpuUse",
    "Holder",
    "HoldersIncomplete",
    "KillSelection",
    "explain_unseen_holders",
    "memory_held_unseen",
    "timeout_explanation",
    "find_holders",
    "select_kill_holders",
]

DEFAULT_DEVICE_FILES = devfiles.DEFAULT_DEVICE_FILES

#: Programs that hold the GPU by design and are never chosen by :func:`select_kill_holders` unless asked: NVIDIA's
#: persistence, fabric-manager and power daemons, and display servers and compositors. Recognised by the program
#: they run, not by what they call themselves (:func:`daemon_kind`).
DAEMONS: frozenset[str] = frozenset(
    {
        "nvidia-persistenced",
        "nv-fabricmanager",
        "nvidia-powerd",
        "Xorg",
        "X",
        "Xwayland",
        "gnome-shell",
        "kwin_wayland",
        "kwin_x11",
        "sway",
        "weston",
        "mutter",
        "gamescope",
    }
)

#: Monitoring and cluster agents: they open the GPUs to read them (DCGM's host engine and exporter, the Kubernetes
#: device plugin, whose end deregisters the node's GPUs, GPU feature discovery, nvtop, nvidia-smi in a loop). Left
#: alone by ``--all-holders`` as daemons are, unless named.
AGENTS: frozenset[str] = frozenset(
    {
        "nv-hostengine",
        "dcgm-exporter",
        "nvidia-device-plugin",
        "gpu-feature-discovery",
        "nvtop",
        "nvidia-smi",
    }
)

Source = Literal["nvml", "device-file"]

#: The inode of the initial PID namespace (``PROC_PID_INIT_INO``): ``/proc/self/ns/pid`` of a process outside any
#: container. Only there are NVML's PIDs this process's numbering whatever the driver.
INITIAL_PID_NAMESPACE_INODE = 0xEFFFFFFC
#: Why a holder's ``/proc`` fields are unknown when no process of its PID is here (one that is there but cannot be
#: read, under ``hidepid=1``, says so instead).
_NOT_HERE = "no process with this PID in this PID namespace (exited, or NVML reports a PID of another namespace)"
#: How long the device-file scan that explains a timed-out wait may take, after the deadline: one slow poll.
EXPLAIN_BUDGET_S = 0.2
#: How long after a suspect process list it is read again: a process that has just exited stays on NVML's list for
#: about 0.1 s (docs/driver-facts.md), which is no evidence of another numbering.
RECHECK_S = 0.3
#: What is left of a positive timeout that has been used up: the least positive timeout (a reading cut at its first
#: check), never 0, which asks for one complete reading.
_USED_UP_S = 1e-9


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU (or MIG instance) a holder is listed on by NVML: ``kinds`` (compute, graphics, MPS), ``used_bytes``
    over them (``None`` when NVML reports "not available", with ``why_unknown``).

    On a GPU in MIG mode, the instance it runs in: ``gpu_instance_id``/``compute_instance_id`` (as NVML lists the
    process), ``mig_index`` and ``mig_uuid`` (the MIG device that runs it: ``MIG 1``, ``MIG-...``); one entry per
    instance. Each is ``None`` outside MIG mode; in MIG mode, ``None`` where it is not known, and
    ``why_instance_unknown`` says why (``None``: every one is known, or the GPU is not in MIG mode). ``uuid`` is the
    GPU's, or the instance's when a ``MIG-`` UUID selected it."""

    index: int
    uuid: str
    kinds: tuple[str, ...]
    used_bytes: int | None
    why_unknown: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    mig_index: int | None = None
    mig_uuid: str | None = None
    why_instance_unknown: str | None = None

    @property
    def where(self) -> str:
        """``GPU 0``, or ``GPU 0 MIG 1`` (``GPU 0 GI 2`` when only the GPU-instance id is known)."""
        if self.mig_index is not None:
            return f"GPU {self.index} MIG {self.mig_index}"
        if self.gpu_instance_id is not None:
            ci = f" CI {self.compute_instance_id}" if self.compute_instance_id is not None else ""
            return f"GPU {self.index} GI {self.gpu_instance_id}{ci}"
        return f"GPU {self.index}"


@dataclass(frozen=True, slots=True)
class Holder:
    """A process that holds a GPU, as seen from this PID namespace.

    ``found_by``: ``"nvml"`` (on a GPU process list) and/or ``"device-file"`` (has an NVIDIA device file open here).
    ``gpus``: the NVML entries (empty when found by device file only: a device file cannot say which GPU).
    ``state``: ``"running"``, ``"sleeping"``, ``"zombie"``, ``"uninterruptible"`` (D), ... ``uid``/``user``,
    ``cmdline``, ``nspid`` (``NSpid`` of ``/proc/PID/status``: this PID in each nested namespace, outermost first),
    ``ancestry`` (parent PIDs, nearest first) and ``start_ticks`` describe the local process of that PID; each is
    ``None`` when unknown, and :attr:`unknown` says why. ``relation``: ``"self"`` or ``"ancestor"`` of this process.
    ``is_daemon``: it runs one of :data:`DAEMONS` or :data:`AGENTS` (``daemon_kind`` says which: ``"daemon"`` or
    ``"agent"``). ``gpu_device_files``: the per-GPU device files (``/dev/nvidiaN``) among ``device_files``; a process
    with only ``nvidiactl`` or UVM open holds no GPU. (NVML's own clients are no such process: on an H200,
    ``nvidia-smi -l 1`` and ``dmon`` held ``/dev/nvidia0`` too; monitors are spared as :data:`AGENTS`.)
    ``container``: the label of the container or cgroup it runs in (``"lxc/129"``, ``"docker 3f2a1b2c3d4e"``;
    :func:`nvmlcheck._proc.container.container_of`), ``None`` when it runs in none (the root cgroup, in this PID
    namespace) or when it cannot be told: :attr:`unknown` then says why, under ``"container"`` (not visible here,
    its cgroup file unreadable, exiting on cgroup v1, ...). A container a user's own cgroups name is labelled as
    that user's claim (``"podman 3f2a1b2c3d4e (user 1000)"``).
    """

    pid: int
    found_by: frozenset[str]
    gpus: tuple[GpuUse, ...]
    name: str | None
    state: str | None
    uid: int | None
    user: str | None
    cmdline: tuple[str, ...] | None
    nspid: tuple[int, ...] | None
    ancestry: tuple[int, ...] | None
    device_files: tuple[str, ...] | None
    is_daemon: bool
    relation: Literal["self", "ancestor"] | None
    start_ticks: int | None
    unknown: tuple[tuple[str, str], ...] = ()
    gpu_device_files: tuple[str, ...] | None = None
    daemon_kind: Literal["daemon", "agent"] | None = None
    container: str | None = None

    @property
    def used_bytes(self) -> int | None:
        """Bytes over every GPU it is listed on (``None`` if any is unknown or it is on no list)."""
        if not self.gpus or any(g.used_bytes is None for g in self.gpus):
            return None
        return sum(g.used_bytes or 0 for g in self.gpus)

    @property
    def visible_here(self) -> bool:
        """Whether the local process of this PID is proven to hold a GPU (has an NVIDIA device file open)."""
        return "device-file" in self.found_by

    def why_unknown(self, field: str) -> str | None:
        """Why ``field`` is ``None`` (``None`` when it is known)."""
        return dict(self.unknown).get(field)

    def describe(self) -> str:
        """One line: ``pid 123 (python3, zombie) in lxc/129 holds 4.0 GiB on GPU 0``."""
        bits = [printable(self.name) if self.name else "name unknown"]
        if self.state not in (None, "running", "sleeping"):
            bits.append(str(self.state))
        on = ", ".join(
            f"{format_bytes(g.used_bytes) if g.used_bytes is not None else 'an unknown amount'} on {g.where}"
            for g in self.gpus
        )
        where = f"holds {on}" if on else f"has {', '.join(self.device_files or ('NVIDIA device files',))} open"
        why_not = self.why_unknown("container") if self.start_ticks is not None else None  # not here: said above
        inside = (f" in {printable(self.container)}" if self.container else
                  f" in unknown container ({printable(why_not)})" if why_not else "")
        return f"pid {self.pid} ({', '.join(bits)}){inside} {where}"


class HoldersIncomplete(NvmlCheckError, TimeoutError):
    """The holders could not all be read within the time given (``timeout``): a ``/proc`` scan of a host with many
    processes or descriptors, a ``/proc`` read that hangs (a process's command line is read under its memory map's
    lock), a slow GPU. What holds the GPUs is then **unknown**, never "nothing": ``found`` holds the holders read
    before the cut (each whole, the list not), ``unscanned`` counts the processes whose open files were not read
    (``None``: the scan itself was not reached), ``reason`` says what was cut."""

    __module__ = "nvmlcheck"

    def __init__(self, timeout_s: float, reason: str, found: Sequence[Holder] = (), unscanned: int | None = None
                 ) -> None:
        self.timeout_s = timeout_s
        self.reason = reason
        self.found: tuple[Holder, ...] = tuple(found)
        self.unscanned = unscanned
        within = f" within {timeout_s:g} s" if timeout_s else ""  # 0: one complete reading, which one read stopped
        super().__init__(f"the holders could not all be read{within}: {reason}; what holds the GPUs is unknown "
                         "(not none)")


def holder_list(items: object, what: str) -> list[Holder]:
    """``items`` read once into a list of :class:`Holder` (what :func:`select_kill_holders` and a kill take), or an
    :class:`~nvmlcheck.ArgumentTypeError` that starts with ``what``: a bare Holder, a str or bytes (its characters),
    a non-iterable, or an item that is no Holder (PIDs: they go in ``pids``)."""
    if isinstance(items, Holder):
        raise ArgumentTypeError(f"{what}, not a bare Holder: give [holder]")
    if isinstance(items, str | bytes | bytearray):
        raise ArgumentTypeError(f"{what}, not a {type(items).__name__}: {items!r}")
    try:
        given: list[object] = list(items)  # type: ignore[call-overload]  # any iterable; TypeError for the rest
    except TypeError:
        raise ArgumentTypeError(f"{what}, not {_shown(items)}") from None
    out: list[Holder] = []
    for h in given:
        if not isinstance(h, Holder):
            pids = "; PIDs go in pids" if isinstance(h, int) and not isinstance(h, bool) else ""
            raise ArgumentTypeError(f"{what}: an item is a Holder, not {_shown(h)}{pids}")
        out.append(h)
    return out


def _shown(value: object) -> str:
    """``value`` and its type, for a message (a long repr cut)."""
    text = repr(value)
    return f"{text if len(text) <= 80 else text[:77] + '...'} ({type(value).__name__})"


def _cut(timeout: float | None, what: str) -> str:
    """Why a holders reading bounded by ``timeout`` was cut while ``what`` was read: a timeout a caller's setup used
    up (handed on as the least positive one) is said as such, not as a reading still running."""
    from ._deadline import USED_UP_S

    if timeout is not None and 0 < timeout <= USED_UP_S:
        return (f"the timeout was used up before {what} could be read (opening the GPUs and reading the selection "
                "took it)")
    return f"{what} were still being read"


def _one_complete(timeout: float | None) -> bool:
    """Whether ``timeout`` (checked) asks for one complete reading: 0, or a time that rounds to 0 ns."""
    from ._deadline import ns_or_none

    return timeout is not None and ns_or_none(timeout) == 0


def _time_limit(timeout: float | None, clock: Callable[[], int]) -> int | None:
    """The deadline (on ``clock``) of a holders reading given ``timeout`` seconds (``None``, ``inf``: none). ``0``
    (or a timeout that rounds to 0 ns) is one complete reading, as a wait's ``timeout=0`` is one check that always
    completes (docs/waiting.md): no deadline, not one that has passed already."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"timeout is None or a number of seconds, not {timeout!r}")
    if not timeout >= 0:  # NaN fails the comparison
        raise ArgumentError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    from ._deadline import ns_or_none

    bound = ns_or_none(timeout)
    if not bound:
        return None  # 0: one complete reading
    now = clock()
    if isinstance(now, bool) or not isinstance(now, int):  # time.monotonic (float s) read as ns: 30 s -> 950 years
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"clock must return integer nanoseconds (as time.monotonic_ns does), got {now!r}")
    return now + bound


@dataclass(frozen=True, slots=True)
class KillSelection:
    """What ``--all-on-gpu`` / ``--all-holders`` would kill (``targets``) and what it leaves alone, each with the
    reason (``skipped``: daemons, this process and its ancestors, NVML PIDs with no process or no NVIDIA device file
    here), plus ``notes`` (what could not be read, the device-file rule when stand-ins count). ``refused``: why the
    whole selection is refused (``targets`` is then empty): NVML's process lists cannot be proven to number
    processes as this PID namespace does, so a PID on a selected GPU's list may name a process of another GPU."""

    targets: tuple[Holder, ...]
    skipped: tuple[tuple[Holder, str], ...]
    notes: tuple[str, ...] = ()
    refused: str | None = None


def _user(uid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return None


def _basename(cmd: tuple[str, ...] | None) -> str | None:
    return os.path.basename(cmd[0]) if cmd else None


def _kind_of(name: str) -> Literal["daemon", "agent"] | None:
    return "agent" if name in AGENTS else "daemon" if name in DAEMONS else None


def daemon_kind(comm: str | None, cmd: tuple[str, ...] | None,
                exe: tuple[str, int, int] | None) -> Literal["daemon", "agent"] | None:
    """Whether a process runs one of :data:`DAEMONS` or :data:`AGENTS`, judged by the program it runs, not by the
    name it gives itself: ``exe`` (:func:`nvmlcheck._proc.procfs.executable`) must be a file root owns and no one
    else may write, named so, and ``comm`` must agree (cut to 15 characters). Setting ``argv[0]`` (or ``comm``) to
    ``nvidia-persistenced`` exempts nothing. Where ``exe`` cannot be read (another user's process, which this one
    cannot signal anyway) the names of ``argv[0]`` and ``comm`` are all there is."""
    if exe is not None:
        path, uid, mode = exe
        base = os.path.basename(path.removesuffix(" (deleted)"))
        kind = _kind_of(base)
        if kind is None or uid != 0 or mode & 0o022 or comm != base[:15]:
            return None
        return kind
    argv0 = _basename(cmd)
    if argv0 is not None and _kind_of(argv0) is not None:
        return _kind_of(argv0)
    return next((_kind_of(d) for d in DAEMONS | AGENTS if comm == d[:15]), None)


def describe_process(
    pid: int,
    *,
    found_by: frozenset[str],
    gpus: tuple[GpuUse, ...] = (),
    device_files: tuple[str, ...] | None = None,
    gpu_device_files: tuple[str, ...] | None = None,
    me: tuple[int, tuple[int, ...]] | None = None,
) -> Holder:
    """A :class:`Holder` for ``pid`` from ``/proc`` (fields ``None`` with a reason where it cannot be read)."""
    unknown: list[tuple[str, str]] = []
    why = _NOT_HERE
    try:
        st = procfs.read_stat(pid, strict=True)
    except procfs.ProcUnreadable as exc:  # hidepid=1, or out of descriptors: there, but not readable
        st, why = None, f"{exc.strerror} (/proc mounted with hidepid, or not permitted)"
    status = procfs.read_status(pid) if st is not None else None
    cmd = procfs.cmdline(pid) if st is not None else None
    if st is None:
        for f in ("name", "state", "uid", "cmdline", "nspid", "ancestry", "start_ticks", "container"):
            unknown.append((f, why))
    uid = status.uid if status is not None else None
    user = _user(uid) if uid is not None else None
    if st is not None and uid is None:
        unknown.append(("uid", "/proc/PID/status unreadable"))
    if uid is not None and user is None:
        unknown.append(("user", f"uid {uid} has no entry in the user database"))
    nspid = status.nspid if status is not None else None
    if st is not None and nspid is None:
        unknown.append(("nspid", "the kernel prints no NSpid line (before 4.1)"))
    if st is not None and cmd is None:
        unknown.append(("cmdline", "/proc/PID/cmdline unreadable"))
    if device_files is None and st is not None:
        unknown.append(("device_files", "its open files cannot be read (not permitted)"))
    where, why_not = _container_label(pid) if st is not None else (None, None)
    if why_not is not None:
        unknown.append(("container", why_not))
    my_pid, my_ancestors = me if me is not None else (os.getpid(), procfs.ancestors())
    relation: Literal["self", "ancestor"] | None = None
    if pid == my_pid:
        relation = "self"
    elif pid in my_ancestors:
        relation = "ancestor"
    name = (_basename(cmd) or (st.comm if st is not None else None)) if cmd or st is not None else None
    kind = daemon_kind(st.comm, cmd, procfs.executable(pid)) if st is not None else None
    return Holder(
        pid=pid,
        found_by=found_by,
        gpus=gpus,
        name=name,
        state=None if st is None else procfs.STATE_WORDS.get(procfs.state_of(st), st.state),  # Z, threads live: runs
        uid=uid,
        user=user,
        cmdline=cmd,
        nspid=nspid,
        ancestry=None if st is None else procfs.ancestors(pid),
        device_files=device_files,
        is_daemon=kind is not None,
        relation=relation,
        start_ticks=None if st is None else st.start_ticks,
        unknown=tuple(unknown),
        gpu_device_files=gpu_device_files if device_files is not None else None,
        daemon_kind=kind,
        container=where,
    )


def _container_label(pid: int) -> tuple[str | None, str | None]:
    """The label of ``pid``'s container (``None``: none), and why it cannot be told (``None``: it can)."""
    from ._proc.container import UNKNOWN, container_of

    c = container_of(pid)
    if c is not None and c.kind == UNKNOWN:
        return None, c.id
    if c is None and procfs.read_stat(pid) is None:
        return None, "it exited while it was read"  # not "in none": its cgroup was never read
    return (None if c is None else c.label()), None


def _instance(d: DeviceState, p: GpuProcess) -> tuple[MigDevice | None, str | None]:
    """The MIG device of GPU ``d`` (in MIG mode) that runs process ``p``, or ``None`` and why it cannot be told."""
    if d.mig_devices is None:
        return None, d.why_unknown("mig_devices") or "the GPU's MIG devices could not be read"
    owners = [m for m in d.mig_devices if m.owns(p) or (m.processes is not None and p in m.processes)]
    if len(owners) == 1:
        return owners[0], None
    if p.gpu_instance_id is None:
        return None, "NVML lists the process with no GPU-instance id"
    if owners:
        return None, (f"{len(owners)} MIG devices of GPU-instance {p.gpu_instance_id} may run it (no compute-instance "
                      "id)")
    return None, f"no MIG device of GPU-instance {p.gpu_instance_id} was read"


def _gpu_uses(snapshot: Snapshot, devices: Collection[int] | None) -> dict[int, list[GpuUse]]:
    out: dict[int, list[GpuUse]] = {}
    for d in snapshot.devices:
        if devices is not None and d.index not in devices:
            continue
        # One entry per process and MIG instance (a process may run in two instances of one GPU: their bytes add).
        per_use: dict[tuple[int, int | None, int | None], list[GpuProcess]] = {}
        for p in d.processes or ():
            per_use.setdefault((p.pid, p.gpu_instance_id, p.compute_instance_id), []).append(p)
        for (pid, gi, ci), entries in per_use.items():
            kinds = tuple(dict.fromkeys(p.kind.value for p in entries))
            known = [p.used_bytes for p in entries if p.used_bytes is not None]
            # One process listed under two kinds shares one context: the largest figure, not the sum.
            used = max(known) if len(known) == len(entries) else None
            why = None if used is not None else "NVML reports 'not available' (WDDM, some MIG or container setups)"
            mig, why_not = _instance(d, entries[0]) if d.mig_mode or gi is not None else (None, None)
            out.setdefault(pid, []).append(GpuUse(
                d.index, d.uuid, kinds, used, why, gpu_instance_id=gi, compute_instance_id=ci,
                mig_index=None if mig is None else mig.index, mig_uuid=None if mig is None else mig.uuid,
                why_instance_unknown=why_not if mig is None else (
                    None if mig.uuid is not None else mig.unknown.get("uuid", "the MIG device's UUID was not read"))))
    return out


def find_holders(
    snapshot: Snapshot | None,
    *,
    devices: Collection[int] | None = None,
    device_files: Sequence[str] | str | None = None,
    timeout: float | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
) -> tuple[Holder, ...]:
    """Every process holding a GPU: those on the process lists of ``snapshot`` (restricted to ``devices``, NVML
    indices), joined by PID with those that have an NVIDIA device file open (always all of them: a device file
    cannot say which GPU). ``snapshot=None``: the device-file scan alone, with no NVML at all. ``device_files``:
    globs of stand-in files that count too, for tests where there is no NVIDIA device (else the simulator's, if one
    runs, else none: :func:`nvmlcheck._proc.devfiles.device_rule`). Sorted by PID.

    ``timeout``: seconds the ``/proc`` scan and the reading of each holder may take (``None``: no bound; ``0``: one
    complete reading, as a wait's ``timeout=0`` is one check that always completes), checked
    between two processes (on ``clock``, integer ns); when it passes first, :class:`HoldersIncomplete` (a
    ``TimeoutError``) says so, with what was read: a cut scan is never a short or an empty list. A ``/proc`` read
    that blocks (a command line is read under its process's memory-map lock, which a process stuck in the driver
    can hold for good) is left behind in a worker thread at the deadline, and with ``timeout=0`` once it has not
    returned in :data:`HUNG_READ_S`; ``None`` reads in the caller's thread (as does an injected ``clock``)."""
    from .errors import ArgumentTypeError

    if snapshot is not None and not isinstance(snapshot, Snapshot):
        raise ArgumentTypeError(f"snapshot is a Snapshot (Session.snapshot()) or None, not {type(snapshot).__name__}")
    if devices is not None:
        if isinstance(devices, str | bytes) or not isinstance(devices, Collection) or any(
                isinstance(i, bool) or not isinstance(i, int) for i in devices):
            raise ArgumentTypeError(f"devices is None or a collection of NVML indices (int), not {devices!r}")
        if snapshot is None:
            raise ArgumentError("devices restricts the process lists of a snapshot: with snapshot=None there are "
                                "none (a device file cannot say which GPU)")
    return _find_holders(snapshot, devices, device_files, deadline_ns=_time_limit(timeout, clock), clock=clock,
                         timeout_s=math.inf if timeout is None else float(timeout))


def _find_holders(snapshot: Snapshot | None, devices: Collection[int] | None,
                  device_files: Sequence[str] | str | None, *, deadline_ns: int | None, clock: Callable[[], int],
                  timeout_s: float) -> tuple[Holder, ...]:
    """:func:`find_holders` by ``deadline_ns`` on ``clock`` (``None``: no bound); ``timeout_s`` for the error
    (``0``: one complete reading, each ``/proc`` read bounded by :data:`HUNG_READ_S`)."""
    foreign = procfs.foreign_numbering()
    if foreign is not None:
        # /proc numbers processes as another PID namespace does: joined by PID with NVML's lists (this namespace's
        # numbering on current drivers), each holder would be described from another process's /proc entry, and
        # the PIDs shown would name other processes here. Unknown, never another process's name and owner.
        raise NvmlCheckError(f"the holders cannot be read here: {foreign}; what holds the GPUs is unknown (not "
                             "none)")
    nvml = _gpu_uses(snapshot, devices) if snapshot is not None else {}

    def work(progress: _Progress) -> tuple[Holder, ...]:
        fds = devfiles.scan(device_files, deadline_ns=deadline_ns, clock=clock, progress=progress.scanning)
        if fds.unscanned:
            raise HoldersIncomplete(timeout_s, f"{fds.unscanned} processes were not scanned for NVIDIA device files",
                                    (), fds.unscanned)
        return _described(nvml, fds, deadline_ns, clock, timeout_s, progress=progress)

    return _bounded(work, deadline_ns=deadline_ns, clock=clock, timeout_s=timeout_s)


#: How long one ``/proc`` read of a holders reading with ``timeout=0`` (one complete reading: no deadline) may take
#: before it counts as hung and the reading is :class:`HoldersIncomplete`: a read takes microseconds, but
#: ``/proc/PID/cmdline`` (and ``environ``) are read under the process's memory-map lock, which a process stuck in
#: the kernel (in the driver, D state) can hold for good (``ps`` hangs there too). A slow scan that moves on is never
#: cut. As long as a wait may run past its deadline before it counts as stuck in a call (``_deadline.HUNG_AFTER_NS``).
HUNG_READ_S = 1.0
_HUNG_READ_NS = 1_000_000_000
#: What a cut adds: why a /proc read may not return.
_BLOCKS = ("a /proc read that blocks: a process stuck in the kernel (D state, in the driver) holds the lock it is "
           "read under; `ps` hangs there too")


class _Progress:
    """Where a ``/proc`` reading running in a worker thread is, for the caller's thread that bounds it
    (:func:`_bounded`): ``at`` is one tuple (phase, what is being read, done, total, since when on
    ``time.monotonic_ns``), replaced whole so that the other thread never reads half an update; ``found``: the
    holders read whole so far."""

    __slots__ = ("at", "bounded", "found", "left_behind")

    def __init__(self, bounded: bool = False) -> None:
        # (phase, pid, done, total, since): the words are made only for a cut (a scan reads hundreds of processes).
        self.at: tuple[str, int | str | None, int, int | None, int] = ("scan", None, 0, None, time.monotonic_ns())
        self.found: list[Holder] = []
        self.left_behind = False  # set by the caller's thread when it gave up: the worker stops at its next step
        self.bounded = bounded  # in a worker: a process an earlier worker is stuck on is not read again

    def scanning(self, pid: str, done: int, total: int) -> None:
        self._step("scan", pid, done, total)

    def describing(self, pid: int, done: int, total: int) -> None:
        self._step("describe", pid, done, total)

    def _step(self, phase: str, pid: int | str, done: int, total: int) -> None:
        if self.left_behind:
            raise _LeftBehind
        self.at = (phase, pid, done, total, time.monotonic_ns())
        if self.bounded and _STUCK and _STUCK.get(int(pid)) == phase:
            raise _StillStuck


#: The processes an earlier bounded reading left its worker behind in, blocked in a ``/proc`` read (PID -> the
#: phase it was read in). A later bounded reading does not read them again (each would leave one more thread, and
#: its descriptor, blocked for as long as the lock is held: a caller polling the holders would pile them up): it is
#: incomplete at once, saying so. Cleared when that read returns.
_STUCK: dict[int, str] = {}


class _StillStuck(Exception):
    """Raised in a worker at a process an earlier worker is still blocked on (:data:`_STUCK`)."""


class _LeftBehind(Exception):
    """Ends a worker's reading whose caller gave up on it (nobody reads its answer any more; never seen by a
    caller): a read that came back stops there."""


def _bounded(work: Callable[[_Progress], tuple[Holder, ...]], *, deadline_ns: int | None, clock: Callable[[], int],
             timeout_s: float) -> tuple[Holder, ...]:
    """``work`` (a ``/proc`` reading that reports its progress) in a worker thread that the caller's waits for until
    ``deadline_ns`` at most (or, with ``timeout_s`` 0, until one read has taken :data:`HUNG_READ_S`): a read that
    blocks (no thread can interrupt it) then leaves the worker behind, and the caller gets
    :class:`HoldersIncomplete` with the holders read whole, never a short list. In this thread when nothing bounds
    it (``timeout=None``) or on a test's clock (a test's time is not the thread's, as ``_deadline.hung_after``)."""
    # No deadline from a timeout given (0, or one that rounds to 0 ns): one complete reading, each read bounded.
    stall_ns = _HUNG_READ_NS if deadline_ns is None and not math.isinf(timeout_s) else None
    if clock is not time.monotonic_ns or (deadline_ns is None and stall_ns is None):
        return work(_Progress())
    progress = _Progress(bounded=True)
    result: list[tuple[Holder, ...]] = []
    error: list[BaseException] = []
    finished = _thread.allocate_lock()
    finished.acquire()

    def run() -> None:
        try:
            result.append(work(progress))
        except _StillStuck:
            error.append(_cut_reading(progress.at, tuple(progress.found), timeout_s, hung=True, earlier=True))
        except BaseException as exc:  # handed to the caller's thread, which raises it
            error.append(exc)
        finally:
            if progress.left_behind:  # the read it was left behind in has returned: it may be read again
                _STUCK.pop(int(progress.at[1] or 0), None)
            finished.release()

    try:
        _thread.start_new_thread(run, ())
    except RuntimeError:  # no thread can be started (out of memory or of threads): read in this one, unbounded
        return work(_Progress())
    try:
        while True:
            at = progress.at
            ends = [e for e in (deadline_ns, None if stall_ns is None else at[4] + stall_ns) if e is not None]
            left_ns = min(ends) - time.monotonic_ns()
            if finished.acquire(True, min(max(left_ns, 0) / 1e9, _thread.TIMEOUT_MAX)):
                break
            if time.monotonic_ns() < min(ends) or progress.at is not at:
                continue  # woken early, or the reading moved on
            raise _cut_reading(progress.at, tuple(progress.found), timeout_s,
                               hung=deadline_ns is None or time.monotonic_ns() < deadline_ns)
    except BaseException:  # cut, or interrupted (Ctrl-C): the worker stops at its next step, unread
        progress.left_behind = True
        if progress.at[1] is not None:
            _STUCK[int(progress.at[1])] = progress.at[0]
        if finished.acquire(False):  # it came back meanwhile: nothing is stuck (its own end ran first)
            _STUCK.pop(int(progress.at[1] or 0), None)
        raise
    if error:
        raise error[0]
    return result[0]


def _cut_reading(at: tuple[str, int | str | None, int, int | None, int], found: tuple[Holder, ...],
                 timeout_s: float, *, hung: bool, earlier: bool = False) -> HoldersIncomplete:
    """The :class:`HoldersIncomplete` of a reading left behind in ``at`` (``hung``: one read took
    :data:`HUNG_READ_S`, else the deadline came; ``earlier``: not read, as an earlier reading's read of it is still
    blocked)."""
    phase, pid, done, total, since_ns = at
    what = ("the list of processes (/proc)" if pid is None else f"pid {pid}'s open files (/proc/{pid}/fd)"
            if phase == "scan" else f"pid {pid}'s /proc entries (stat, status, command line, cgroup)")
    in_it_s = (time.monotonic_ns() - since_ns) / 1e9
    # A read takes microseconds: one that has taken a tenth of a second is blocked, not slow.
    why = f" ({_BLOCKS})" if hung or in_it_s >= 0.1 else ""
    when = (f"{what} were not read: an earlier reading's read of them has not returned yet" if earlier else
            f"reading {what} has not returned after {HUNG_READ_S:g} s" if hung else
            f"the deadline came while {what} were being read (for {in_it_s:.3f} s){why}")
    if hung:
        when += why
    if phase == "scan":
        unscanned = None if total is None else total - done
        cut = ("the processes were not scanned for NVIDIA device files (their list was not read)" if unscanned is None
               else f"{unscanned} processes were not scanned for NVIDIA device files")
        return HoldersIncomplete(timeout_s, f"{cut}: {when}", (), unscanned)
    return HoldersIncomplete(timeout_s, f"{(total or 0) - done} of the {total} holders found were not read (state, "
                             f"owner, command line, container): {when}", found, 0)


def _described(nvml: dict[int, list[GpuUse]], fds: devfiles.FdScan, deadline_ns: int | None,
               clock: Callable[[], int], timeout_s: float, *, progress: _Progress | None = None) -> tuple[Holder, ...]:
    me = (os.getpid(), procfs.ancestors())
    out: list[Holder] = [] if progress is None else progress.found
    pids = sorted(set(nvml) | set(fds.holders))
    for done, pid in enumerate(pids):
        if progress is not None:
            progress.describing(pid, done, len(pids))
        if deadline_ns is not None and clock() >= deadline_ns:
            raise HoldersIncomplete(timeout_s, f"{len(pids) - done} of the {len(pids)} holders found were not read "
                                    "(state, owner, command line, container)", out, 0)
        found: set[str] = set()
        if pid in nvml:
            found.add("nvml")
        if pid in fds.holders:
            found.add("device-file")
        files = fds.holders.get(pid, () if pid not in fds.unreadable else None)
        gpu_files = fds.gpu_files.get(pid, ())
        if pid in nvml and pid not in fds.holders and pid not in fds.unreadable:
            # Read again, now: the scan may have listed /proc before this process started (a CUDA process NVML
            # lists by now), and "no device file" would be said of files never read (and cannot be proven to hold
            # a GPU, for a kill). None: gone, or its files cannot be read.
            kinds = devfiles.kinds_of(pid, fds.rule)
            files = None if kinds is None else tuple(sorted(kinds))
            gpu_files = () if kinds is None else tuple(sorted(p for p, k in kinds.items() if k == "gpu"))
            if files:
                found.add("device-file")
        out.append(describe_process(pid, found_by=frozenset(found), gpus=tuple(nvml.get(pid, ())),
                                    device_files=files, gpu_device_files=gpu_files, me=me))
    return tuple(out)


def select_kill_holders(
    source: Session | Sequence[Holder],
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    *,
    all_holders: bool,
    include_daemons: bool = False,
    device_files: Sequence[str] | str | None = None,
    timeout: float | None = None,
) -> KillSelection:
    """The holders ``kill --all-on-gpu`` (``all_holders=False``: NVML PIDs) or ``--all-holders`` (also processes
    found only by a device file) may signal, and the rest with the reason. ``source``: an open session (its
    :meth:`~nvmlcheck.Session.holders` on ``devices`` is read) or holders already found. A ``MIG-`` UUID in
    ``devices`` selects that instance: the processes that run in it, never those of its GPU's other instances.

    Never chosen: this process and its ancestors; daemons and monitoring agents (:data:`DAEMONS`, :data:`AGENTS`,
    recognised by the program they run: :func:`daemon_kind`) unless ``include_daemons``; a process found by device
    files with no per-GPU one open (only ``nvidiactl``, UVM: it holds no GPU); an NVML PID
    whose local process has no NVIDIA device file open (NVML may report a PID of another namespace, which here names
    an unrelated process); a process whose files cannot be read; a zombie (already exited: no signal frees it).
    ``device_files``: stand-in globs, as for :func:`find_holders`; when stand-ins count, a note says so (the
    kill's plan prints it).

    ``all_holders=False`` chooses by GPU, which needs NVML's PIDs to be this namespace's: every PID on any GPU's list
    (read again after :data:`RECHECK_S` if not) must name a local process with an NVIDIA device file open (or a
    zombie). Otherwise nothing is chosen and :attr:`KillSelection.refused` says why: an older driver in a container
    reports host PIDs, and a host PID may be the local PID of a CUDA process on another GPU (every CUDA process has
    every ``/dev/nvidiaN`` open, so the device file alone does not tell).

    ``timeout``: seconds every reading of a session's holders may take together (``None``: no bound; ``0``: one
    complete reading of each; checked, and moot, for holders already found); when it
    passes first, :class:`HoldersIncomplete`: a selection made from part of the holders is never offered.
    """
    from .errors import ArgumentTypeError
    from .session import Session

    for flag, value in (("all_holders", all_holders), ("include_daemons", include_daemons)):
        if not isinstance(value, bool):  # a truthy "no" must not widen the selection
            raise ArgumentTypeError(f"{flag} is True or False, not {value!r}")
    _time_limit(timeout, time.monotonic_ns)  # checked whatever the source: a bad timeout is never ignored
    if not isinstance(source, Session):
        source = holder_list(source, "source is an open Session or a sequence of Holder (Session.holders(), "
                             "find_holders())")
    notes: list[str] = []
    rule = devfiles.device_rule(device_files)
    if not rule.is_default:
        notes.append(f"device files: {rule.describe()}")
    if isinstance(source, Session):
        holders, elsewhere, suspects = _session_holders(source, devices, all_holders, device_files, timeout)
    else:
        if devices is not None:
            raise ArgumentError("devices selects GPUs of a session; holders already found are taken as they are")
        holders, elsewhere = source, {}
        suspects = [why for _, why in _unproven(holders)] if not all_holders else []
    if suspects:
        refused = _numbering_refusal(suspects)
        return KillSelection((), tuple((h, "not signalled: " + refused) for h in holders), tuple(notes), refused)
    never = _never_signalled()
    targets: list[Holder] = []
    skipped: list[tuple[Holder, str]] = []
    for h in holders:
        why = _left_alone(h, all_holders=all_holders, include_daemons=include_daemons, never=never,
                          elsewhere=elsewhere.get(h.pid))
        if why is None:
            targets.append(h)
        else:
            skipped.append((h, why))
    return KillSelection(tuple(targets), tuple(skipped), tuple(notes))


def _session_holders(
    source: Session,
    devices: Iterable[DeviceSelector] | DeviceSelector | None,
    all_holders: bool,
    device_files: Sequence[str] | str | None,
    timeout: float | None,
) -> tuple[Sequence[Holder], dict[int, str], list[str]]:
    """:func:`select_kill_holders`'s reading of a session: the selected GPUs' holders, the PIDs only unselected GPUs
    (or MIG instances) list (pid -> where), and why NVML's numbering is not proven this namespace's (when
    ``all_holders`` is false), all within ``timeout`` (:class:`HoldersIncomplete` past it)."""
    from ._deadline import hung_after
    from .errors import DeadlinePassed

    clock = time.monotonic_ns
    deadline_ns = _time_limit(timeout, clock)

    def left() -> float | None:
        # A timeout used up is the least positive one (a reading bounded by it), never 0 (one complete reading).
        return None if deadline_ns is None else max(_USED_UP_S, (deadline_ns - clock()) / 1e9)

    if devices is not None and not isinstance(devices, int | str):
        devices = list(devices)  # read twice with MIG UUIDs: resolved, then their instances' holders
    suspects: list[str] = []
    source._check_open()
    try:
        # timeout=0 has no deadline: an NVML call hung here ends the command line as a wait's one check would (the
        # GPU watchdog, if one is installed, 1 s on), as in Session.holders.
        with hung_after(clock() if _one_complete(timeout) else None):
            # A cuda:N that is a MIG instance (CUDA_VISIBLE_DEVICES=MIG-...) selects that instance, as its MIG- UUID
            # does: never every tenant of its GPU.
            devices = source._instance_selectors(devices, deadline_ns, clock)
            indices = source._resolve(devices, deadline_ns, clock)
    except DeadlinePassed:
        raise HoldersIncomplete(math.inf if timeout is None else float(timeout),
                                _cut(timeout, "the GPUs named by the selection")) from None
    try:
        every = source.holders(None, device_files=device_files, timeout=left())  # the proof looks at every GPU
        if not all_holders and _unproven(every):
            remaining = None if deadline_ns is None else max(0.0, (deadline_ns - clock()) / 1e9)
            time.sleep(RECHECK_S if remaining is None else min(RECHECK_S, remaining))
            again = source.holders(None, device_files=device_files, timeout=left())
            still = {pid for pid, _ in _unproven(again)}
            suspects = [why for pid, why in _unproven(every) if pid in still]
            every = again
        holders: Sequence[Holder] = _restricted(every, indices)
        elsewhere = _only_elsewhere(every, indices)
        if devices is not None and any(isinstance(i, str) and i.startswith("MIG-") for i in _listed(devices)):
            # A MIG UUID names one instance: its own processes only, never those of its GPU's other instances.
            holders, elsewhere = _in_instances(every, source.holders(devices, device_files=device_files,
                                                                     timeout=left()), elsewhere)
    except HoldersIncomplete as exc:  # named with the caller's timeout, not what was left of it
        raise HoldersIncomplete(math.inf if timeout is None else float(timeout), exc.reason, exc.found,
                                exc.unscanned) from None
    return holders, elsewhere, suspects


def _never_signalled() -> Callable[[int], str | None]:
    """Why a PID may never be signalled (PID 1, this process, an ancestor, ...): the kill's own refusals
    (:func:`nvmlcheck._proc.targets.refusal`), so that a selection leaves such a holder alone instead of proposing
    it and having the whole kill refused (run through ``nsenter`` or ``docker exec``, PID 1 is no ancestor)."""
    from ._proc.targets import refusal

    limit, me = procfs.pid_max(), os.getpid()
    try:
        lineage = procfs.ancestors(strict=True)
    except procfs.ProcUnreadable:
        lineage = procfs.ancestors()  # the kill's own check, strict, refuses then; the selection says what it can
    return lambda pid: refusal(pid, limit, me, lineage)


def _left_alone(h: Holder, *, all_holders: bool, include_daemons: bool,
                never: Callable[[int], str | None], elsewhere: str | None = None) -> str | None:
    """Why ``h`` is not chosen (``None``: it is). ``elsewhere``: where it is listed when only unselected GPUs (or MIG
    instances) list it."""
    if h.relation == "self":
        return "this process"
    if h.relation == "ancestor":
        return "an ancestor of this process"
    refused = never(h.pid)
    if refused is not None:
        return refused
    if h.is_daemon and not include_daemons:
        what = "monitoring agent" if h.daemon_kind == "agent" else "daemon"
        return f"{what} ({printable(h.name)}); name its PID to kill it"
    if not all_holders and "nvml" not in h.found_by and elsewhere:
        return f"{elsewhere}, not selected (--devices)"
    if not all_holders and "nvml" not in h.found_by:
        return "not on a GPU process list (found by its device files only; --all-holders kills it)"
    if "nvml" not in h.found_by and h.gpu_device_files == () and h.device_files:
        return (f"holds no GPU: only {', '.join(h.device_files)} open, no per-GPU device file and on no GPU process "
                "list (NVML's own clients, monitors)")
    unread = h.why_unknown("start_ticks")
    if h.start_ticks is None and unread not in (None, _NOT_HERE):
        return f"it cannot be read here: {unread}"
    if h.start_ticks is None:
        return "no process with this PID here (it exited, or NVML numbers processes as another PID namespace does)"
    if h.device_files is None:
        return "its open files cannot be read, so it cannot be proven to hold a GPU"
    if not h.device_files:
        return ("no NVIDIA device file open: the local process with this PID cannot be proven to be the one NVML "
                "lists (NVML may report a PID of another namespace)")
    if h.state == "zombie":
        return "a zombie: it has exited already; its parent has to reap it"
    return None


def _unproven(holders: Iterable[Holder]) -> list[tuple[int, str]]:
    """The NVML-listed PIDs that do not name a GPU holder here: no process of that PID, or one with no NVIDIA
    device file open (not a zombie; one whose files cannot be read is no evidence either way)."""
    out: list[tuple[int, str]] = []
    for h in holders:
        if "nvml" not in h.found_by:
            continue
        on = ", ".join(g.where for g in h.gpus)
        unread = h.why_unknown("start_ticks")
        if h.start_ticks is None and unread not in (None, _NOT_HERE):
            out.append((h.pid, f"pid {h.pid} (on {on}) cannot be read here ({unread})"))
        elif h.start_ticks is None:
            out.append((h.pid, f"pid {h.pid} (on {on}) names no process here"))
        elif h.device_files == () and h.state != "zombie":
            name = printable(h.name) if h.name else "a process"
            out.append((h.pid, f"pid {h.pid} (on {on}) names {name}, which has no NVIDIA device file open"))
    return out


def _nested_pid_namespace() -> bool | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino != INITIAL_PID_NAMESPACE_INODE
    except OSError:
        return None


def _numbering_refusal(suspects: Sequence[str]) -> str:
    nested = _nested_pid_namespace()
    where = (" (this process runs in a PID namespace of its own, where older drivers report host PIDs)" if nested
             else "")
    return (f"NVML's process lists cannot be proven to number processes as this PID namespace does{where}: "
            f"{'; '.join(suspects)}; a PID on a selected GPU's list could then name a process of another GPU. "
            "Name the PIDs to kill, or use --all-holders (every process with an NVIDIA device file open)")


def _only_elsewhere(holders: Iterable[Holder], indices: Collection[int] | None) -> dict[int, str]:
    """PID → where it is listed (``on GPU 1 and GPU 2's process list``), for holders listed only on GPUs outside
    ``indices``."""
    if indices is None:
        return {}
    return {h.pid: f"on {' and '.join(g.where for g in h.gpus)}'s process list"
            for h in holders if h.gpus and not any(g.index in indices for g in h.gpus)}


def _listed(devices: Iterable[DeviceSelector] | DeviceSelector) -> list[DeviceSelector]:
    return [devices] if isinstance(devices, int | str) else list(devices)


def _in_instances(every: Sequence[Holder], selected: Sequence[Holder], elsewhere: dict[int, str]
                  ) -> tuple[list[Holder], dict[int, str]]:
    """``every`` holder restricted to those ``selected`` lists on a GPU (the selection's MIG instances and whole
    GPUs, :meth:`~nvmlcheck.Session.holders`), each with those entries; a holder listed only outside them kept only
    if a device file found it, with where it is listed in ``elsewhere``."""
    chosen = {h.pid: h.gpus for h in selected if h.gpus}
    out: list[Holder] = []
    where = dict(elsewhere)
    for h in every:
        if h.pid in chosen:
            out.append(replace(h, gpus=chosen[h.pid]))
            continue
        if h.gpus:
            # The instance by name where it is known (GPU 0 MIG 1), else the GPU whose other instance runs it.
            gpus = " and ".join(g.where if g.where != f"GPU {g.index}" else f"a MIG instance of GPU {g.index}"
                                for g in h.gpus)
            where[h.pid] = f"in {gpus}"
        if "device-file" in h.found_by:
            out.append(replace(h, gpus=(), found_by=frozenset({"device-file"})))
    return out, where


def _restricted(holders: Iterable[Holder], indices: Collection[int] | None) -> list[Holder]:
    """``holders`` as :func:`find_holders` with ``devices=indices`` gives them: NVML entries of other GPUs left out,
    a holder listed only there kept only if a device file found it."""
    if indices is None:
        return list(holders)
    out: list[Holder] = []
    for h in holders:
        gpus = tuple(g for g in h.gpus if g.index in indices)
        if gpus == h.gpus:
            out.append(h)
        elif gpus:
            out.append(replace(h, gpus=gpus))
        elif "device-file" in h.found_by:
            out.append(replace(h, gpus=(), found_by=frozenset({"device-file"})))
    return out


def explain_unseen_holders(
    snapshot: Snapshot | None = None, *, device_files: Sequence[str] | str | None = None,
    budget_s: float | None = None, scan: bool = True,
) -> list[str]:
    """Lines that explain memory held with no (visible) process: processes with an NVIDIA device file open that are
    on no process list of ``snapshot``, and holders no signal can end (zombies, uninterruptible sleep). Empty when
    the scan finds nothing to say. ``budget_s``: how long the ``/proc/*/fd`` scan may take (``None``: to the end),
    and reading what it found as long again; what is left unread (processes not scanned, a ``/proc`` read that
    blocks) is said in a line. ``scan=False``: only the listed processes' states are read (no scan of every
    process's files)."""
    foreign = procfs.foreign_numbering()
    if foreign is not None:  # every line would describe another process than the PID it names (find_holders)
        return [f"the processes that hold the GPUs cannot be described here: {foreign}"]
    listed = {p.pid for d in (snapshot.devices if snapshot is not None else ()) for p in (d.processes or ())}
    lines: list[str] = []
    deadline = None if budget_s is None else time.monotonic_ns() + round(budget_s * 1e9)

    def work(progress: _Progress) -> tuple[Holder, ...]:
        fds = (devfiles.scan(device_files, deadline_ns=deadline, progress=progress.scanning) if scan else
               devfiles.FdScan({}, (), devfiles.device_rule(device_files), {}))
        pids = sorted(set(fds.holders) | listed)
        me = (os.getpid(), procfs.ancestors())  # once, not per process
        for done, pid in enumerate(pids):
            progress.describing(pid, done, len(pids))
            line = _unseen_line(describe_process(pid, found_by=frozenset(), device_files=fds.holders.get(pid),
                                                 me=me), listed, snapshot is not None)
            if line is not None:
                lines.append(line)
        if fds.unreadable and snapshot is not None:
            lines.append(f"{len(fds.unreadable)} processes' open files could not be read (not permitted): run as "
                         "root to see every holder")
        if fds.unscanned:
            lines.append(f"{fds.unscanned} processes were not scanned for NVIDIA device files: the scan is bounded "
                         f"to {budget_s:g} s after the timeout (run `nvmlcheck holders` to see every holder)")
        return ()

    try:
        # Bounded as a holders reading is: a read that blocks (the command line of a process stuck in the driver,
        # the very holder a D-state line is about) must not hold a timed-out wait's report for good.
        # The scan stops itself at the budget; describing what it found (microseconds each) gets as long again
        # (at least EXPLAIN_BUDGET_S: a budget of 0 stops the scan, not the reading of the processes listed).
        _bounded(work, deadline_ns=None if deadline is None else deadline + round(max(budget_s or 0, EXPLAIN_BUDGET_S)
                                                                                  * 1e9),
                 clock=time.monotonic_ns, timeout_s=budget_s or math.inf)
    except HoldersIncomplete as exc:
        return [*lines, f"the /proc reading that explains it was cut ({exc.reason}): it is bounded to {budget_s:g} s "
                "after the timeout (run `nvmlcheck holders` to see every holder)"]
    return lines


def _unseen_line(h: Holder, listed: Collection[int], judged: bool) -> str | None:
    """What :func:`explain_unseen_holders` says of ``h`` (``None``: nothing). ``judged``: a snapshot's lists were
    given (a holder on none of them is said)."""
    if h.start_ticks is None:
        return None
    who = f"pid {h.pid} ({printable(h.name) if h.name else 'name unknown'})"
    if h.state == "zombie":
        parent = h.ancestry[0] if h.ancestry else None
        return (f"{who} is a zombie: it has exited but its parent (pid {parent}) has not reaped it; no signal frees "
                "what it still holds")
    if h.state == "uninterruptible":
        return (f"{who} is in uninterruptible sleep (D): no signal takes effect until its kernel call returns (a "
                "driver operation may be stuck)")
    if h.pid not in listed and judged:
        files = ", ".join(h.device_files or ())
        return (f"{who} has {files} open but is on no GPU process list (a process of another PID namespace's "
                "numbering, or one the driver does not list)")
    return None


def memory_held_unseen(snapshot: Snapshot | None, *, limit_bytes: int = DEFAULT_MAX_USED_BYTES) -> bool:
    """Whether a GPU of ``snapshot`` holds more than ``limit_bytes`` while its process lists are known and empty."""
    for d in snapshot.devices if snapshot is not None else ():
        m = d.memory
        if d.processes == () and m is not None and not m.used_includes_reserved and m.used_bytes > limit_bytes:
            return True
    return False


def timeout_explanation(snapshot: Snapshot | None) -> list[str]:
    """What a wait that timed out should add to its culprits: with memory held and no process listed, every line of
    :func:`explain_unseen_holders` (its scan takes at most :data:`EXPLAIN_BUDGET_S`: the wait's deadline has passed
    already); otherwise only the listed holders no signal ends (zombies, uninterruptible sleep), read from their own
    ``/proc`` entries."""
    unseen = memory_held_unseen(snapshot)
    try:
        # With every byte's holder listed, only the listed processes' states can add to the message (a zombie, D
        # state): read those, not every process's files, after the deadline.
        lines = explain_unseen_holders(snapshot, budget_s=EXPLAIN_BUDGET_S, scan=unseen)
    except OSError:
        return []
    if unseen:
        return lines
    return [line for line in lines if "zombie" in line or "uninterruptible" in line]
