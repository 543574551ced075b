"""Who holds the GPUs: every process on an NVML process list, joined with every process that has an NVIDIA device
file open, each described from ``/proc`` (state, owner, command line, PID namespaces, ancestry).

>>> import nvmlcheck as nc
>>> with nc.open() as gpus:                                   # doctest: +SKIP
...     for h in gpus.holders():
...         print(h.pid, sorted(h.found_by), h.state, h.name, [g.used_bytes for g in h.gpus])

NVML names the GPU and the bytes but, on older drivers inside a PID namespace, a host PID that may be another local
process; a device file proves a local process holds *a* GPU but not which one (every CUDA process opens every
``/dev/nvidiaN``). :func:`select_kill_holders` therefore kills an NVML PID only when the local process of that
number has a device file open. Device-file patterns: :func:`nvmlcheck._proc.devfiles.device_file_patterns`
(``$NVMLCHECK_DEVICE_FILES``). Rationale and limits: docs/killing.md.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ._proc import devfiles, procfs
from .model import Snapshot
from .predicates import DEFAULT_MAX_USED_BYTES, format_bytes

if TYPE_CHECKING:
    from .session import DeviceSelector, Session

__all__ = [
    "DAEMONS",
    "DEFAULT_DEVICE_FILES",
    "GpuUse",
    "Holder",
    "KillSelection",
    "explain_unseen_holders",
    "memory_held_unseen",
    "timeout_explanation",
    "find_holders",
    "select_kill_holders",
]

DEFAULT_DEVICE_FILES = devfiles.DEFAULT_DEVICE_FILES

#: Programs that hold the GPU by design and are never chosen by :func:`select_kill_holders` unless asked: NVIDIA's
#: persistence, fabric-manager, DCGM host-engine and power daemons, and display servers and compositors.
DAEMONS: frozenset[str] = frozenset(
    {
        "nvidia-persistenced",
        "nv-fabricmanager",
        "nv-hostengine",
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

Source = Literal["nvml", "device-file"]


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU a holder is listed on by NVML: ``kinds`` (compute, graphics, MPS), ``used_bytes`` summed over them
    (``None`` when NVML reports "not available", with ``why_unknown``)."""

    index: int
    uuid: str
    kinds: tuple[str, ...]
    used_bytes: int | None
    why_unknown: str | None = None


@dataclass(frozen=True, slots=True)
class Holder:
    """A process that holds a GPU, as seen from this PID namespace.

    ``found_by``: ``"nvml"`` (on a GPU process list) and/or ``"device-file"`` (has an NVIDIA device file open here).
    ``gpus``: the NVML entries (empty when found by device file only: a device file cannot say which GPU).
    ``state``: ``"running"``, ``"sleeping"``, ``"zombie"``, ``"uninterruptible"`` (D), ... ``uid``/``user``,
    ``cmdline``, ``nspid`` (``NSpid`` of ``/proc/PID/status``: this PID in each nested namespace, outermost first),
    ``ancestry`` (parent PIDs, nearest first) and ``start_ticks`` describe the local process of that PID; each is
    ``None`` when unknown, and :attr:`unknown` says why. ``relation``: ``"self"`` or ``"ancestor"`` of this process.
    ``container``: the label of the container or cgroup it runs in (``"lxc/129"``, ``"docker 3f2a1b2c3d4e"``;
    :func:`nvmlcheck._proc.container.container_of`), ``None`` when it runs in none or is not visible here.
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
        bits = [self.name or "name unknown"]
        if self.state not in (None, "running", "sleeping"):
            bits.append(str(self.state))
        on = ", ".join(
            f"{format_bytes(g.used_bytes) if g.used_bytes is not None else 'an unknown amount'} on GPU {g.index}"
            for g in self.gpus
        )
        where = f"holds {on}" if on else f"has {', '.join(self.device_files or ('NVIDIA device files',))} open"
        inside = f" in {self.container}" if self.container else ""
        return f"pid {self.pid} ({', '.join(bits)}){inside} {where}"


@dataclass(frozen=True, slots=True)
class KillSelection:
    """What ``--all-on-gpu`` / ``--all-holders`` would kill (``targets``) and what it leaves alone, each with the
    reason (``skipped``: daemons, this process and its ancestors, NVML PIDs not visible from this PID namespace),
    plus ``notes`` on what could not be read."""

    targets: tuple[Holder, ...]
    skipped: tuple[tuple[Holder, str], ...]
    notes: tuple[str, ...] = ()


def _user(uid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return None


def _basename(cmd: tuple[str, ...] | None) -> str | None:
    return os.path.basename(cmd[0]) if cmd else None


def _is_daemon(comm: str | None, cmd: tuple[str, ...] | None) -> bool:
    base = _basename(cmd)
    if base in DAEMONS:
        return True
    # comm is cut to 15 characters ("nvidia-persiste").
    return comm is not None and any(comm == d[:15] for d in DAEMONS)


def describe_process(
    pid: int,
    *,
    found_by: frozenset[str],
    gpus: tuple[GpuUse, ...] = (),
    device_files: tuple[str, ...] | None = None,
    me: tuple[int, tuple[int, ...]] | None = None,
) -> Holder:
    """A :class:`Holder` for ``pid`` from ``/proc`` (fields ``None`` with a reason where it cannot be read)."""
    unknown: list[tuple[str, str]] = []
    st = procfs.read_stat(pid)
    status = procfs.read_status(pid) if st is not None else None
    cmd = procfs.cmdline(pid) if st is not None else None
    if st is None:
        why = "no process with this PID in this PID namespace (exited, or NVML reports a PID of another namespace)"
        for f in ("name", "state", "uid", "cmdline", "nspid", "ancestry", "start_ticks"):
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
    my_pid, my_ancestors = me if me is not None else (os.getpid(), procfs.ancestors())
    relation: Literal["self", "ancestor"] | None = None
    if pid == my_pid:
        relation = "self"
    elif pid in my_ancestors:
        relation = "ancestor"
    name = (_basename(cmd) or (st.comm if st is not None else None)) if cmd or st is not None else None
    return Holder(
        pid=pid,
        found_by=found_by,
        gpus=gpus,
        name=name,
        state=None if st is None else procfs.STATE_WORDS.get(st.state, st.state),
        uid=uid,
        user=user,
        cmdline=cmd,
        nspid=nspid,
        ancestry=None if st is None else procfs.ancestors(pid),
        device_files=device_files,
        is_daemon=_is_daemon(st.comm if st is not None else None, cmd),
        relation=relation,
        start_ticks=None if st is None else st.start_ticks,
        unknown=tuple(unknown),
        container=_container_label(pid) if st is not None else None,
    )


def _container_label(pid: int) -> str | None:
    from ._proc.container import container_of

    c = container_of(pid)
    return None if c is None else c.label()


def _gpu_uses(snapshot: Snapshot, devices: Collection[int] | None) -> dict[int, list[GpuUse]]:
    out: dict[int, list[GpuUse]] = {}
    for d in snapshot.devices:
        if devices is not None and d.index not in devices:
            continue
        per_pid: dict[int, list[tuple[str, int | None]]] = {}
        for p in d.processes or ():
            per_pid.setdefault(p.pid, []).append((p.kind.value, p.used_bytes))
        for pid, entries in per_pid.items():
            kinds = tuple(dict.fromkeys(k for k, _ in entries))
            known = [b for _, b in entries if b is not None]
            # One process listed under two kinds shares one context: the largest figure, not the sum.
            used = max(known) if len(known) == len(entries) else None
            why = None if used is not None else "NVML reports 'not available' (WDDM, some MIG or container setups)"
            out.setdefault(pid, []).append(GpuUse(d.index, d.uuid, kinds, used, why))
    return out


def find_holders(
    snapshot: Snapshot | None,
    *,
    devices: Collection[int] | None = None,
    device_files: Sequence[str] | str | None = None,
) -> tuple[Holder, ...]:
    """Every process holding a GPU: those on the process lists of ``snapshot`` (restricted to ``devices``, NVML
    indices), joined by PID with those that have a device file open (always all of them: a device file cannot say
    which GPU). ``snapshot=None``: the device-file scan alone, with no NVML at all. Sorted by PID."""
    nvml = _gpu_uses(snapshot, devices) if snapshot is not None else {}
    fds = devfiles.scan(device_files)
    me = (os.getpid(), procfs.ancestors())
    out: list[Holder] = []
    for pid in sorted(set(nvml) | set(fds.holders)):
        found: set[str] = set()
        if pid in nvml:
            found.add("nvml")
        if pid in fds.holders:
            found.add("device-file")
        files = fds.holders.get(pid, () if pid not in fds.unreadable else None)
        if pid in nvml and pid not in fds.holders and pid not in fds.unreadable:
            files = () if procfs.read_stat(pid) is not None else None
        out.append(describe_process(pid, found_by=frozenset(found), gpus=tuple(nvml.get(pid, ())),
                                    device_files=files, me=me))
    return tuple(out)


def select_kill_holders(
    source: Session | Sequence[Holder],
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    *,
    all_holders: bool,
    include_daemons: bool = False,
    device_files: Sequence[str] | str | None = None,
) -> KillSelection:
    """The holders ``kill --all-on-gpu`` (``all_holders=False``: NVML PIDs) or ``--all-holders`` (also processes
    found only by a device file) may signal, and the rest with the reason. ``source``: an open session (its
    :meth:`~nvmlcheck.Session.holders` on ``devices`` is read) or holders already found.

    Never chosen: this process and its ancestors; daemons (:data:`DAEMONS`) unless ``include_daemons``; an NVML PID
    whose local process has no NVIDIA device file open (NVML may report a PID of another namespace, which here names
    an unrelated process); a process whose files cannot be read; a zombie (already exited: no signal frees it).
    """
    from .session import Session

    elsewhere: dict[int, list[int]] = {}
    if isinstance(source, Session):
        holders: Sequence[Holder] = source.holders(devices, device_files=device_files)
        if devices is not None:
            elsewhere = _listed_elsewhere(source, devices)
    else:
        if devices is not None:
            raise ValueError("devices selects GPUs of a session; holders already found are taken as they are")
        holders = source
    targets: list[Holder] = []
    skipped: list[tuple[Holder, str]] = []
    for h in holders:
        if h.relation == "self":
            skipped.append((h, "this process"))
        elif h.relation == "ancestor":
            skipped.append((h, "an ancestor of this process"))
        elif h.is_daemon and not include_daemons:
            skipped.append((h, f"a daemon ({h.name}); include daemons to kill it"))
        elif "nvml" not in h.found_by and h.pid in elsewhere:
            where = " and ".join(f"GPU {i}'s" for i in elsewhere[h.pid])
            skipped.append((h, f"on {where} process list, not selected (--devices)"))
        elif not all_holders and "nvml" not in h.found_by:
            skipped.append((h, "not on a GPU process list (found by its device files only; --all-holders kills it)"))
        elif h.start_ticks is None:
            skipped.append((h, "not visible from this PID namespace: no process with this PID here"))
        elif h.device_files is None:
            skipped.append((h, "its open files cannot be read, so it cannot be proven to hold a GPU"))
        elif not h.device_files:
            skipped.append(
                (h, "not visible from this PID namespace: the local process with this PID has no NVIDIA device "
                    "file open (NVML may report a PID of another namespace)")
            )
        elif h.state == "zombie":
            skipped.append((h, "a zombie: it has exited already; its parent has to reap it"))
        else:
            targets.append(h)
    return KillSelection(tuple(targets), tuple(skipped))


def _listed_elsewhere(session: Session, devices: Iterable[DeviceSelector] | DeviceSelector) -> dict[int, list[int]]:
    """PID → the unselected GPUs whose process lists name it (one read of every GPU's lists; empty if unreadable)."""
    from .model import Fields

    selected = set(session.resolve(devices) or ())
    out: dict[int, list[int]] = {}
    snap = session.snapshot(None, fields=Fields.PROCESSES)
    for d in snap.devices:
        if d.index not in selected:
            for p in d.processes or ():
                if d.index not in out.setdefault(p.pid, []):
                    out[p.pid].append(d.index)
    return out


def explain_unseen_holders(
    snapshot: Snapshot | None = None, *, device_files: Sequence[str] | str | None = None
) -> list[str]:
    """Lines that explain memory held with no (visible) process: processes with an NVIDIA device file open that are
    on no process list of ``snapshot``, and holders no signal can end (zombies, uninterruptible sleep). Empty when
    the scan finds nothing to say."""
    listed = {p.pid for d in (snapshot.devices if snapshot is not None else ()) for p in (d.processes or ())}
    lines: list[str] = []
    fds = devfiles.scan(device_files)
    pids = sorted(set(fds.holders) | listed)
    me = (os.getpid(), procfs.ancestors())  # once, not per process
    for pid in pids:
        h = describe_process(pid, found_by=frozenset(), device_files=fds.holders.get(pid), me=me)
        if h.start_ticks is None:
            continue
        who = f"pid {pid} ({h.name or 'name unknown'})"
        if h.state == "zombie":
            parent = h.ancestry[0] if h.ancestry else None
            lines.append(f"{who} is a zombie: it has exited but its parent (pid {parent}) has not reaped it; no "
                         "signal frees what it still holds")
        elif h.state == "uninterruptible":
            lines.append(f"{who} is in uninterruptible sleep (D): no signal takes effect until its kernel call "
                         "returns (a driver operation may be stuck)")
        elif pid not in listed and snapshot is not None:
            files = ", ".join(h.device_files or ())
            lines.append(f"{who} has {files} open but is on no GPU process list (a process of another PID "
                         "namespace's numbering, or one the driver does not list)")
    if fds.unreadable and snapshot is not None:
        lines.append(f"{len(fds.unreadable)} processes' open files could not be read (not permitted): run as root "
                     "to see every holder")
    return lines


def memory_held_unseen(snapshot: Snapshot | None, *, limit_bytes: int = DEFAULT_MAX_USED_BYTES) -> bool:
    """Whether a GPU of ``snapshot`` holds more than ``limit_bytes`` while its process lists are known and empty."""
    for d in snapshot.devices if snapshot is not None else ():
        m = d.memory
        if d.processes == () and m is not None and not m.used_includes_reserved and m.used_bytes > limit_bytes:
            return True
    return False


def timeout_explanation(snapshot: Snapshot | None) -> list[str]:
    """What a wait that timed out should add to its culprits: with memory held and no process listed, every line of
    :func:`explain_unseen_holders`; otherwise only the holders no signal ends (zombies, uninterruptible sleep)."""
    try:
        lines = explain_unseen_holders(snapshot)
    except OSError:
        return []
    if memory_held_unseen(snapshot):
        return lines
    return [line for line in lines if "zombie" in line or "uninterruptible" in line]
