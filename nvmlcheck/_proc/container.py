"""The container (or cgroup) a process runs in, read from ``/proc/PID/cgroup`` and its PID namespace.

:func:`parse_cgroup` is the pure parser (cgroup v1 and v2 text → :class:`Container`); :func:`container_of` reads one
process; :func:`members` lists every process of one container (``kill --container``). Recognised: docker,
containerd (and nerdctl), cri-o, podman, LXC/Proxmox, Kubernetes pods, Slurm jobs, systemd units; any other non-root
cgroup is kind ``"cgroup"``; a process in the root cgroup but another PID namespace is kind ``"pidns"``; one whose
container cannot be told (its cgroup file unreadable, its PID namespace not readable, an exiting process on cgroup
v1, text that contradicts itself) is kind ``"unknown"``, the reason its ID: never guessed, never taken for "none".
What a user's own cgroups (``user@UID.service``) name is that user's claim (:attr:`Container.user`). A runtime's
monitor (LXC's, podman's or cri-o's conmon, a Slurm step daemon) is marked ``monitor`` and is no member of its
container. No ``re``, no dataclasses at run time: ``kill --container`` reads this before its first signal.
Recognised path forms and their sources: docs/killing.md.
"""

from __future__ import annotations

import errno
import os

from .._record import light_tuple
from .._text import is_digits, printable
from . import procfs

TYPE_CHECKING = False  # no typing before a signal: start-up cost where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from dataclasses import dataclass

__all__ = [
    "CONTAINER_KINDS", "UNKNOWN", "Container", "ContainerSpec", "container_of", "members", "parse_cgroup", "parse_spec",
]

#: The kinds that are containers proper (a runtime's); ``systemd``, ``slurm``, ``cgroup`` and ``pidns`` are not.
CONTAINER_KINDS = frozenset({"docker", "containerd", "cri-o", "podman", "container", "lxc", "kubernetes"})

#: The kind of a process whose container cannot be told; its ``id`` says why.
UNKNOWN = "unknown"

_HEX = frozenset("0123456789abcdef")
#: The kinds whose ID is a runtime's 64-hex container ID (``"container"``: under a pod, runtime not named).
_RUNTIMES = ("docker", "containerd", "cri-o", "podman", "container")


if TYPE_CHECKING:

    @dataclass(frozen=True, slots=True)
    class Container:
        """Where one process runs.

        ``kind``: ``"docker"``, ``"containerd"``, ``"cri-o"``, ``"podman"``, ``"lxc"``, ``"kubernetes"``,
        ``"systemd"``, ``"slurm"``, ``"cgroup"`` (any other cgroup), ``"pidns"`` (root cgroup, another PID
        namespace) or ``"unknown"`` (:data:`UNKNOWN`: it cannot be told). ``id``: the full runtime ID, ``"129"`` for
        ``lxc/129``, the pod UID, the unit name, the Slurm job ID, the cgroup path, the namespace inode, or (kind
        ``"unknown"``) why it cannot be told. ``cgroup``: the process's cgroup path (the v2 line, else the v1
        hierarchy that was read; ``""`` when none was read). ``pidns_inode``: inode of ``/proc/PID/ns/pid``
        (``None``: unread). ``nested``: ``(kind, id)`` of what else the path names, outermost first (a pod's
        container, a unit inside an LXC container). ``monitor``: the runtime's own process for that container (LXC
        monitor, conmon, Slurm step daemon), not a member of it. ``user``: the UID whose systemd user manager
        (``user@UID.service``, delegated to that user) holds the cgroup that names it: there the user names cgroups
        as it likes, so kind and ID are that user's claim (rootless podman, docker and LXC live there; a Slurm job
        never does, and is not believed there); ``None``: outside any.
        """

        kind: str
        id: str
        cgroup: str
        pidns_inode: int | None = None
        nested: tuple[tuple[str, str], ...] = ()
        monitor: bool = False
        user: int | None = None

        def label(self) -> str:
            """Short text for humans: ``"docker 3f2a1b2c3d4e"``, ``"lxc/129"``, ``"pod <uid>"``,
            ``"unknown container (<why>)"``; ``" (user 1000)"`` added for a :attr:`user`'s claim. Safe to print:
            control characters of a cgroup's name are escaped (:func:`nvmlcheck._text.printable`); :attr:`cgroup`
            and :attr:`id` stay exact."""
            ...

        def names(self) -> tuple[tuple[str, str], ...]:
            """Every ``(kind, id)`` the path names: the container's own first, then :attr:`nested`."""
            ...

        @property
        def is_container(self) -> bool:
            """Whether a container runtime made it (:data:`CONTAINER_KINDS`)."""
            ...

else:

    class Container(light_tuple("Container", "kind id cgroup pidns_inode nested monitor user", (None, (), False, None),
                                  __name__)):
        __slots__ = ()

        def label(self) -> str:
            return printable(_label(self.kind, self.id) + (" monitor" if self.monitor else "")
                             + (f" (user {self.user})" if self.user is not None else ""))

        def names(self):
            return ((self.kind, self.id), *self.nested)

        @property
        def is_container(self):
            return self.kind in CONTAINER_KINDS


def _label(kind: str, ident: str) -> str:
    if kind in _RUNTIMES:
        return f"{kind} {ident[:12]}"
    if kind == "lxc":
        return f"lxc/{ident}"
    if kind == "kubernetes":
        return f"pod {ident}"
    if kind == "slurm":
        return f"slurm job {ident}"
    if kind == "pidns":
        return f"pid namespace {ident}"
    if kind == UNKNOWN:
        return f"unknown container ({ident})"
    return f"{kind} {ident}"


# --- the parser ------------------------------------------------------------------------------------------------------


def _is_hex(s: str, least: int = 12, most: int = 64) -> bool:
    return least <= len(s) <= most and not (set(s) - _HEX)


def _pod_uid(s: str) -> str | None:
    """A pod UID as Kubernetes prints it (``_`` of systemd slice names back to ``-``), or ``None``."""
    s = s.replace("_", "-")
    if _is_hex(s, 32, 32):  # a static pod's UID is a config hash
        return s
    parts = s.split("-")
    if [len(p) for p in parts] == [8, 4, 4, 4, 12] and _is_hex("".join(parts), 32, 32):
        return s
    return None


#: Prefixes of ``<prefix><id>.scope`` (systemd cgroup driver) and kind, monitor.
_SCOPES = (
    ("docker-", "docker", False),
    ("cri-containerd-", "containerd", False),
    ("nerdctl-", "containerd", False),
    ("crio-conmon-", "cri-o", True),
    ("crio-", "cri-o", False),
    ("libpod-conmon-", "podman", True),
    ("libpod-", "podman", False),
)


def _runtime(name: str, parent: str | None, kube: bool) -> tuple[str, str, bool] | None:
    """A container runtime's cgroup: ``<prefix><id>.scope`` (systemd driver) or ``<parent>/<id>`` (cgroupfs)."""
    base = name[:-6] if name.endswith(".scope") else name
    for prefix, kind, monitor in _SCOPES:  # crio-<id> under the cgroupfs driver has no .scope
        if base.startswith(prefix) and _is_hex(base[len(prefix):], 64, 64):
            return kind, base[len(prefix):], monitor
    if not _is_hex(name, 64, 64):
        return None
    if parent in ("docker", "moby"):
        return "docker", name, False
    if parent == "libpod_parent":
        return "podman", name, False
    if kube:  # cgroupfs driver: /kubepods/burstable/pod<uid>/<id>, the runtime unnamed
        return "container", name, False
    return None


def _pod(name: str, kube: bool) -> tuple[str, str, bool] | None:
    """A Kubernetes pod: ``kubepods-<qos>-pod<uid>.slice`` (systemd driver) or ``pod<uid>`` under ``kubepods``."""
    if name.startswith("kubepods") and "-pod" in name and name.endswith(".slice"):
        uid = _pod_uid(name[name.rindex("-pod") + 4 : -6])
    elif name.startswith("pod") and kube:
        uid = _pod_uid(name[3:])
    else:
        return None
    return None if uid is None else ("kubernetes", uid, False)


def _lxc(name: str, parent: str | None) -> tuple[str, str, bool] | None:
    """LXC: ``lxc/NAME`` (LXC 3, Proxmox), ``lxc.payload.NAME`` (LXC 4+); monitors ``lxc.monitor.NAME`` and
    ``lxc.monitor/NAME`` (Proxmox)."""
    if parent in ("lxc", "lxc.payload"):
        return "lxc", name, False
    if parent == "lxc.monitor":
        return "lxc", name, True
    for prefix, monitor in (("lxc.payload.", False), ("lxc.monitor.", True)):
        if name.startswith(prefix) and len(name) > len(prefix):
            return "lxc", name[len(prefix):], monitor
    return None


def _component(name: str, parent: str | None, grandparent: str | None, kube: bool) -> tuple[str, str, bool] | None:
    """``(kind, id, monitor)`` named by one path component (its parent, grandparent and whether a ``kubepods``
    component came before it, for context), or ``None``."""
    got = _runtime(name, parent, kube) or _pod(name, kube) or _lxc(name, parent)
    if got is not None:
        return got
    if name.startswith("job_") and is_digits(name[4:]) and (
        # <node>_slurmstepd.scope: a Slurm built for several slurmd per host (and a few sites' default)
        parent == "slurmstepd.scope" or (parent or "").endswith("_slurmstepd.scope")
        or (parent is not None and parent.startswith("uid_") and (grandparent or "").startswith("slurm"))
    ):
        return "slurm", name[4:], False
    if name.endswith((".service", ".scope")):
        return "systemd", name, False
    return None


def _user_manager(name: str) -> int | None:
    """The UID of ``user@UID.service`` (systemd's per-user manager, whose subtree is delegated to that user)."""
    uid = name[5:-8] if name.startswith("user@") and name.endswith(".service") else ""
    return int(uid) if is_digits(uid) else None


def classify(path: str) -> tuple[str, str, tuple[tuple[str, str], ...], bool, int | None] | None:
    """``(kind, id, nested, monitor, user)`` for one cgroup path, or ``None`` for the root (``"/"``).

    The outermost container (runtime, pod, LXC, Slurm job) wins and whatever else the path names goes to ``nested``;
    without one, the innermost systemd unit; else kind ``"cgroup"`` with the path as its ID. ``user``: the UID of
    the ``user@UID.service`` above the winner (that user's own cgroups: its claim, :attr:`Container.user`)."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return None
    found: list[tuple[str, str]] = []
    monitor = False
    strong: int | None = None
    delegated: int | None = None  # the first user@UID.service: below it, the user names cgroups as it likes
    user: int | None = None
    kube = False  # a kubepods component came before: kept as it goes, a path may be 2,000 components deep
    for i, name in enumerate(parts):
        got = _component(name, parts[i - 1] if i > 0 else None, parts[i - 2] if i > 1 else None, kube)
        kube = kube or name.startswith("kubepods")
        if got is None or (got[0] == "slurm" and delegated is not None):  # slurmstepd never runs jobs there
            continue
        kind, ident, mon = got
        if strong is None and kind != "systemd":
            strong, user = len(found), delegated
        found.append((kind, ident))
        monitor = monitor or mon
        # Slurm: the step daemon lives in job_N/step_M/slurm (v2) — Slurm's own process, not the job's.
        if kind == "slurm" and len(parts) > i + 2 and parts[i + 2] == "slurm":
            monitor = True
        if delegated is None:
            delegated = _user_manager(name)
    if not found:
        return "cgroup", "/" + "/".join(parts), (), False, None
    if strong is None:
        kind, ident = found[-1]  # the innermost unit: app.scope inside user@1000.service
        return kind, ident, tuple(found[:-1]), False, None
    kind, ident = found[strong]
    return kind, ident, tuple(found[:strong] + found[strong + 1:]), monitor, user


#: v1 hierarchies in the order they are trusted to place a process (systemd's own first: every process has it).
_V1_ORDER = ("name=systemd", "pids", "memory", "cpu,cpuacct", "cpu", "devices", "freezer", "cpuset", "blkio")


#: How long a cgroup path the kernel prints (``PATH_MAX - 1``): a longer one is cut there, in the middle of a name
#: that may be another cgroup's whole name (``/a/ddd…`` cut to ``/a/d``), so it is kept only to its last ``/``.
_PATH_CUT = 4095


def cgroup_paths(text: str) -> dict[str, str]:
    """``/proc/PID/cgroup`` as hierarchy → path: ``""`` for the v2 line, else the v1 controller list
    (``"memory"``, ``"cpu,cpuacct"``, ``"name=systemd"``). Malformed lines are skipped; the `` (deleted)`` the kernel
    appends to a removed cgroup of the v2 hierarchy (of that one only) is dropped; a path the kernel cut at
    ``PATH_MAX`` ends in ``/…`` after the last whole name."""
    return _placements(text)[0]


def _placements(text: str, known: frozenset[str] | None = None) -> tuple[dict[str, str], str | None]:
    """:func:`cgroup_paths`, and why the text cannot be trusted (``None``: it can). The kernel prints each hierarchy
    once; a second line for one is forged (a cgroup named with a newline, refused only since Linux 4.13): which line
    is the kernel's cannot be told. ``known``: the hierarchies (``ID:controllers``) this host has (every process's
    file lists the same ones, :func:`_known`): a line for another is forged too (a fresh ID and controller name)."""
    out: dict[str, str] = {}
    twice: list[str] = []
    foreign: list[str] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3 or not fields[2].startswith("/"):
            continue
        if known is not None and f"{fields[0]}:{fields[1]}" not in known:
            foreign.append(f"{fields[0]}:{fields[1]}")
        path = fields[2]
        if fields[:2] == ["0", ""] and path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        if len(path) >= _PATH_CUT:  # cut mid-name: keep the ancestors it proves, mark the rest unknown
            path = path[: path.rindex("/")] + "/…"
        if fields[1] in out:
            twice.append(fields[1] or "the v2 hierarchy")
        out[fields[1]] = path
    why = f"/proc/PID/cgroup names {', '.join(twice)} twice: a cgroup name forges a line" if twice else None
    if foreign and why is None:
        why = (f"/proc/PID/cgroup names hierarchy {printable(', '.join(foreign))}, which this host does not have: a "
               "cgroup name forges a line")
    return out, why


def _known(proc: str) -> frozenset[str] | None:
    """The hierarchies (``ID:controllers``) of this host, from this process's own ``/proc/self/cgroup`` (``None``:
    unreadable, nothing checked)."""
    text = procfs.read_cgroup("self", proc)
    if text is None:
        return None
    return frozenset(":".join(f[:2]) for f in (line.split(":", 2) for line in text.splitlines())
                     if len(f) == 3 and f[2].startswith("/"))


def parse_cgroup(text: str, known: frozenset[str] | None = None) -> Container | None:
    """The container that ``/proc/PID/cgroup`` text names (``pidns_inode`` left ``None``), or ``None`` when every
    line is the root cgroup. The container proper (a runtime's, a pod, LXC, a Slurm job) that a line names wins, the
    v2 line tried first (a hybrid host's v2 line may say only the runtime's unit while v1 names the container); else
    the first non-root placement (a systemd unit, any cgroup), v2 first. Kind ``"unknown"`` (:data:`UNKNOWN`) when
    the text contradicts itself: two lines of one hierarchy, a line for a hierarchy not in ``known`` (this host's,
    when given), or hierarchies that name different containers."""
    paths, forged = _placements(text, known)
    if forged is not None:
        return Container(UNKNOWN, forged, "")
    ordered = [k for k in ("", *_V1_ORDER) if k in paths] + sorted(k for k in paths if k and k not in _V1_ORDER)
    first: Container | None = None
    strong: list[tuple[str, Container]] = []
    for key in ordered:
        path = paths[key]
        got = classify(path)
        if got is None:
            continue
        c = Container(got[0], got[1], path, None, got[2], got[3], got[4])
        if c.kind not in ("cgroup", "systemd"):
            strong.append((key, c))
        elif first is None:
            first = c
    named = {(c.kind, c.id, c.user) for _, c in strong}
    if len(named) > 1:
        which = "; ".join(f"{key or 'v2'}: {c.label()}" for key, c in strong)
        return Container(UNKNOWN, f"its cgroup hierarchies name different containers ({which})", "")
    return strong[0][1] if strong else first


def container_of(pid: int | str, proc: str = "/proc") -> Container | None:
    """Where ``pid`` runs, or ``None`` when it is in the root cgroup of this host (or of this cgroup namespace) and in
    this process's PID namespace, or when it is gone (it exited). Kind ``"unknown"`` (:data:`UNKNOWN`, the reason
    its ID) when that cannot be told: ``/proc/PID/cgroup`` unreadable for another reason than the process being gone
    (``hidepid``, out of descriptors, a path longer than the kernel prints), a process in the root cgroup whose
    PID namespace cannot be read (another user's: its inode needs ptrace access) nor told from its ``NSpid``, or an
    exiting process (a zombie, one tearing its GPU context down) whose v1 hierarchies the kernel prints as ``/``
    and whose v2 line names no container."""
    try:
        text = procfs.read_cgroup(pid, proc, strict=True)
    except procfs.ProcUnreadable as exc:
        return Container(UNKNOWN, str(exc.strerror), "")
    if text is None:
        return None
    c = parse_cgroup(text, _known(proc))
    if (c is None or c.kind in ("cgroup", "systemd")) and any(cgroup_paths(text)):
        st = procfs.read_stat(pid, proc)
        if st is None:
            return None  # gone
        if st.flags & procfs.PF_EXITING:  # its v1 lines say "/" whatever its cgroups were: a hybrid host's v2 line
            # would name only the runtime's unit (containerd.service) of a docker container's process
            return Container(UNKNOWN, "exiting: its cgroup v1 placement reads as /", "")
    ino = procfs.pidns_inode(pid, proc)
    if c is not None:
        return c._replace(pidns_inode=ino)  # type: ignore[attr-defined, no-any-return]
    mine = procfs.pidns_inode("self", proc)
    root = cgroup_paths(text).get("", "/")
    if ino is not None and mine is not None:
        return None if ino == mine else Container("pidns", str(ino), root, ino)
    return _pidns_from_nspid(pid, proc, root)


def _pidns_from_nspid(pid: int | str, proc: str, root: str) -> Container | None:
    """Whether a root-cgroup process whose namespace inode cannot be read shares this one's PID namespace, from the
    ``NSpid`` lines (readable by anyone; one entry: the namespace of this ``/proc``): ``None`` when both have one
    entry, else an unknown container saying what is known."""
    theirs = procfs.read_status(pid, proc)
    if theirs is None:
        return None  # gone
    own = procfs.read_status("self", proc)
    own_depth = len(own.nspid) if own is not None and own.nspid else None
    if theirs.nspid and own_depth == 1:
        if len(theirs.nspid) == 1:
            return None  # both in the PID namespace of this /proc: the same one
        return Container(UNKNOWN, f"another PID namespace, whose inode cannot be read ({proc}/{pid}/ns/pid: not "
                                  "permitted)", root)
    return Container(UNKNOWN, f"its PID namespace cannot be read ({proc}/{pid}/ns/pid: not permitted)", root)


# --- selecting by container ------------------------------------------------------------------------------------------


if TYPE_CHECKING:

    @dataclass(frozen=True, slots=True)
    class ContainerSpec:
        """A parsed ``--container``/``--cgroup`` argument: ``kind`` is a container kind, ``"id"`` (a runtime ID or
        its prefix, of any runtime), ``"unit"`` (a path component), ``"path"`` (a cgroup path, itself or below)
        or ``"dir"`` (a cgroup directory under a mounted hierarchy)."""

        kind: str
        value: str

else:
    ContainerSpec = light_tuple("ContainerSpec", "kind value", module=__name__)


def _named_spec(s: str, low: str) -> ContainerSpec | None:
    """The forms with a kind word or shape: ``lxc/``, ``slurm/``, ``job_``, pod UIDs, ``pidns:``, ``docker:``."""
    if low.startswith("lxc/") and low[4:] and "/" not in low[4:]:
        return ContainerSpec("lxc", s[4:])
    for prefix in ("slurm/", "slurm:", "job_"):
        if low.startswith(prefix) and is_digits(low[len(prefix):]):
            return ContainerSpec("slurm", low[len(prefix):])
    for prefix in ("pod/", "pod:", "pod", ""):
        uid = _pod_uid(low[len(prefix):]) if low.startswith(prefix) else None
        # 32 hex digits alone are an ID prefix; "_" is how a systemd slice spells the UID's "-"
        if uid is not None and (prefix or "-" in low or "_" in low):
            return ContainerSpec("kubernetes", uid)
    for prefix in ("pidns:", "pid:["):
        if low.startswith(prefix) and is_digits(low[len(prefix):].rstrip("]")):
            return ContainerSpec("pidns", low[len(prefix):].rstrip("]"))
    for runtime in _RUNTIMES:
        if low.startswith((runtime + ":", runtime + "/")):
            rest = low[len(runtime) + 1:]
            if not _is_hex(rest):
                raise _argument_error(f"{s!r}: a {runtime} container ID is 12 to 64 hex digits")
            return ContainerSpec(runtime, rest)
    return None


def parse_spec(spec: str) -> ContainerSpec:
    """Check a container selector's syntax (no ``/proc`` read). Raises ValueError with the accepted forms."""
    s = spec.strip()
    if s.startswith("/"):  # a cgroup's name may end in spaces: "/jobs/run " is not "/jobs/run" (nor what is below it)
        s = spec.lstrip()
    low = s.lower()
    if not s:
        raise _argument_error("an empty container selector")
    named = _named_spec(s, low)
    if named is not None:
        return named
    if _is_hex(low):
        return ContainerSpec("id", low)
    if s.startswith("/"):
        norm = "/" + "/".join(p for p in s.split("/") if p and p != ".")  # "/sys/fs/cgroup/memory/." is the root
        if ".." in norm.split("/"):
            raise _argument_error(f"{spec!r}: a cgroup path may not contain '..'")
        if norm in ("/", "/sys/fs/cgroup"):
            raise _argument_error(f"{spec!r} is a root cgroup: it holds every process of the host")
        return ContainerSpec("dir" if norm.startswith("/sys/fs/cgroup/") else "path", norm)
    if s.endswith((".service", ".scope", ".slice")) and "/" not in s:
        return ContainerSpec("unit", s)
    if _is_hex(low, 1, 11):
        raise _argument_error(f"{spec!r}: a container ID prefix needs at least 12 hex digits (docker ps prints 12)")
    raise _argument_error(
        f"{spec!r} is not a container: give a docker/containerd/podman/cri-o ID (12 to 64 hex digits), lxc/NAME, a "
        "pod UID, slurm/JOBID or job_JOBID, a systemd unit (NAME.service, .scope, .slice), pidns:INODE, or a cgroup "
        "path (/docker/…, /sys/fs/cgroup/…)")


def _matches(spec: ContainerSpec, c: Container | None, paths: dict[str, str]) -> tuple[str, str] | None:
    """The full ID ``spec`` matched and where it sits (``None``: no match). A path or unit matches on any hierarchy;
    an ID never names a monitor. Where: for a unit, an LXC name or a Slurm job (names that are not unique: the host
    and each container have their own ``nginx.service``, an LXC container may hold one of the same name), the cgroup
    path through the component that names it; else ``""`` (a runtime ID or pod UID names one container)."""
    if spec.kind == "path":
        below = spec.value.rstrip("/") + "/"
        got = next((p for p in paths.values() if p == spec.value or p.startswith(below)), None)
        return None if got is None else (got, "")
    if spec.kind == "unit":
        places = [_unit_place(spec.value, p) for p in paths.values()]
        place = next((p for p in places if p is not None), None)
        return None if place is None else (spec.value, place)
    if c is None or c.monitor or c.kind == UNKNOWN:
        return None
    for kind, ident in c.names():
        if spec.kind == "id":
            if kind in _RUNTIMES and ident.startswith(spec.value):
                return ident, ""
            if kind == "kubernetes" and ident == spec.value:
                return ident, ""
        elif kind == spec.kind and (ident == spec.value or (kind in _RUNTIMES and ident.startswith(spec.value))):
            return ident, (_place(c.cgroup, kind, ident) if kind in ("lxc", "slurm") else "")
    return None


def _unit_place(unit: str, path: str) -> str | None:
    """``path`` through its first component named ``unit``, or ``None``."""
    parts = path.split("/")
    return "/".join(parts[: parts.index(unit) + 1]) if unit in parts else None


def _place(path: str, kind: str, ident: str) -> str:
    """``path`` through the first component that names ``(kind, ident)`` (as :func:`classify` reads it)."""
    parts = [p for p in path.split("/") if p]
    kube = False
    for i, name in enumerate(parts):
        got = _component(name, parts[i - 1] if i > 0 else None, parts[i - 2] if i > 1 else None, kube)
        kube = kube or name.startswith("kubepods")
        if got is not None and got[:2] == (kind, ident):
            return "/" + "/".join(parts[: i + 1])
    return path


def _member_of(spec: ContainerSpec, text: str | None, known: frozenset[str] | None = None
               ) -> tuple[str, int | None, str] | None:
    """The full ID ``spec`` matched in one ``/proc/PID/cgroup`` text, the user whose claim it is
    (:attr:`Container.user`) and where it sits (:func:`_matches`), or ``None``: no match, or no text."""
    if text is None:
        return None
    paths, forged = _placements(text, known)
    if forged is not None:
        return None  # which line is the kernel's cannot be told: no proof of membership
    c = parse_cgroup(text)
    got = _matches(spec, c, paths)
    if got is None:
        return None
    return got[0], (c.user if c is not None and spec.kind not in ("path", "unit") else None), got[1]


def _doubt(spec: ContainerSpec, text: str | None, known: frozenset[str] | None = None) -> str | None:
    """Why a process that ``spec`` did not take may be a member all the same (``None``: it is not one): a line of its
    cgroup text names what ``spec`` names, but the text cannot be trusted (forged, or hierarchies that name different
    containers). Such a process is left alone, never signalled unproven, and said so: not silently left running."""
    if text is None:
        return None
    _, forged = _placements(text, known)
    c = parse_cgroup(text)
    why = forged if forged is not None else (c.id if c is not None and c.kind == UNKNOWN else None)
    if why is None:
        return None
    for line in text.splitlines():  # each line alone, the forged ones too
        one, _ = _placements(line)
        got = classify(next(iter(one.values()), "/"))
        alone = None if got is None else Container(got[0], got[1], "", None, got[2], got[3], got[4])
        if one and _matches(spec, alone, one) is not None:
            return why
    return None


def _note_doubt(spec: ContainerSpec, pid: int, text: str | None, doubtful: list[tuple[int, str]] | None,
                known: frozenset[str] | None) -> None:
    """Add ``pid`` to ``doubtful``, with why, when it may be a member that cannot be proven one (:func:`_doubt`)."""
    why = _doubt(spec, text, known) if doubtful is not None else None
    if doubtful is not None and why is not None:
        doubtful.append((pid, f"it may be in {printable(_spec_text(spec))}, but its container cannot be told "
                              f"({printable(why)}): not signalled unproven"))


def _read_for_members(pid: int, proc: str, spec: ContainerSpec) -> str | None:
    """``/proc/PID/cgroup`` read exactly (:func:`procfs.read_cgroup`), ``None`` when gone or not permitted (another
    user's under ``hidepid``: not this user's to signal either). Any other failure (out of descriptors or memory)
    raises ValueError: a member left out would be left running, the kill said done."""
    try:
        return procfs.read_cgroup(pid, proc, strict=True, exact=True)
    except procfs.ProcUnreadable as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            return None
        raise _argument_error(f"whether pid {pid} is in {spec.kind} {spec.value!r} cannot be told: "
                              f"{exc.strerror}") from None


def _dir_members(root: str) -> list[int]:
    """The PIDs in ``cgroup.procs`` of ``root`` and every cgroup below it. A cgroup removed while it is read (its
    processes gone with it) is passed over; any other failure to list or read one raises ValueError: its processes
    would be left running, the kill said done (they were passed over, silently)."""
    out: list[int] = []

    def failed(exc: OSError) -> None:
        if exc.errno not in (errno.ENOENT, errno.ENODEV):
            raise _argument_error(f"the processes of {exc.filename} cannot be told: {exc.strerror}")

    for dirpath, _dirs, files in os.walk(root, onerror=failed):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(f"{dirpath}/cgroup.procs", "rb") as f:
                raw = f.read()
        except OSError as exc:
            failed(exc)
            continue
        try:
            out.extend(int(p) for p in raw.split())
        except ValueError:
            raise _argument_error(f"{dirpath}/cgroup.procs: not a list of PIDs") from None
    return out


def _not_own_namespace(parsed: ContainerSpec, proc: str) -> None:
    """``pidns:INODE`` of this process's own PID namespace is refused as a root cgroup is: it holds every process this
    one can see (kernel threads, the shell that runs it and that shell's other children)."""
    if parsed.kind == "pidns" and parsed.value == str(procfs.pidns_inode("self", proc)):
        raise _argument_error(f"pidns:{parsed.value} is this process's own PID namespace: it holds every process this "
                              "one can see; give another namespace's inode (stat -L -c %i /proc/PID/ns/pid of a "
                              "process inside it)")


def members(spec: str | ContainerSpec, proc: str = "/proc",
            doubtful: list[tuple[int, str]] | None = None) -> list[tuple[int, int]]:
    """``(pid, start_ticks)`` of every process (of this PID namespace's view) whose container matches ``spec``, by
    PID; monitors (LXC's, conmon, Slurm's step daemon) are left out unless a path or unit names them. Raises
    ValueError for a bad selector, an ID prefix that names two containers, or a process whose cgroup file cannot be
    read (out of descriptors: it may be a member). Processes that exit while the list is read, and those whose
    files this user may not read, are left out; the caller pins each one (its start time is its identity). A
    process that may be a member but whose container cannot be told (its cgroup text forged or contradicting
    itself) is left out too, and added to ``doubtful`` with why."""
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    if parsed.kind == "dir":
        if not os.path.isfile(f"{parsed.value}/cgroup.procs"):
            raise _argument_error(f"{parsed.value}: not a cgroup directory (no cgroup.procs)")
        # The real path's parent: a symlink (v1's cpu -> cpu,cpuacct) must not hide a hierarchy's root.
        if not os.path.isfile(f"{os.path.dirname(os.path.realpath(parsed.value))}/cgroup.procs"):
            raise _argument_error(f"{parsed.value} is a root cgroup: it holds every process of the host")
        pids = sorted(set(_dir_members(parsed.value)))
    else:
        _not_own_namespace(parsed, proc)
        pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
    # Each process's start time (its identity) is read before its membership and again after: the same both times,
    # the membership read was that process's, not one that took its PID meanwhile (a kill pins what this returns).
    before: dict[int, int] = {}
    known = _known(proc)
    full: set[tuple[str, int | None, str]] = set()
    for pid in pids:
        first = procfs.read_stat(pid, proc)
        if first is None or first.pid != pid:
            continue
        if parsed.kind == "pidns":  # the namespace, whatever the cgroup
            if not _in_pidns(pid, proc, int(parsed.value)):
                continue
        elif parsed.kind != "dir":
            # Exact: a path typed with bytes that are not UTF-8 must match those bytes, not every name that reads
            # as U+FFFD (nor a name copied from printed text with U+FFFD in it).
            text = _read_for_members(pid, proc, parsed)
            got = _member_of(parsed, text, known)
            if got is None:
                _note_doubt(parsed, pid, text, doubtful, known)
                continue
            full.add(got)
        before[pid] = first.start_ticks
    if parsed.kind == "dir":  # the listing read again, after the start times
        listed = set(_dir_members(parsed.value))
        before = {pid: ticks for pid, ticks in before.items() if pid in listed}
    if parsed.kind != "path" and len(full) > 1:
        _ambiguous(parsed, full)
    return _still_the_same(before, proc)


def _spec_text(spec: ContainerSpec) -> str:
    """A parsed selector as a user would type it (``lxc/129``, ``slurm/42``, the ID, the path)."""
    if spec.kind in ("lxc", "slurm"):
        return f"{spec.kind}/{spec.value}"
    if spec.kind == "kubernetes":
        return f"pod {spec.value}"
    if spec.kind == "pidns":
        return f"pidns:{spec.value}"
    if spec.kind in _RUNTIMES:
        return f"{spec.kind}:{spec.value}"
    return spec.value


#: ioctl ``NS_GET_PARENT`` (``_IO(0xb7, 0x2)``, Linux 4.9): a descriptor of a PID namespace's parent.
_NS_GET_PARENT = 0xB702


def _in_pidns(pid: int, proc: str, inode: int) -> bool:
    """Whether ``pid`` is in the PID namespace ``inode``: its own, or one nested in it (a sandbox, a container inside
    the container: its processes are that namespace's too, and die with its init). Only its own namespace was
    taken, so a selection of the namespace left the nested ones running."""
    try:
        fd = os.open(f"{proc}/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False  # gone, or not permitted: not proven
    try:
        for _ in range(34):  # PID namespaces nest 32 deep at most
            if os.fstat(fd).st_ino == inode:
                return True
            import fcntl

            try:
                parent = fcntl.ioctl(fd, _NS_GET_PARENT)
            except OSError:  # EPERM: above this process's own namespace; ENOTTY: not a namespace (or an old kernel)
                return False
            os.close(fd)
            fd = parent
        return False
    finally:
        os.close(fd)


def _still_the_same(before: dict[int, int], proc: str) -> list[tuple[int, int]]:
    """``(pid, start_ticks)`` of each process of ``before`` whose start time reads the same again."""
    out: list[tuple[int, int]] = []
    for pid, ticks in before.items():
        st = procfs.read_stat(pid, proc)
        if st is not None and st.start_ticks == ticks:
            out.append((pid, ticks))
    return out


def _ambiguous(parsed: ContainerSpec, full: set[tuple[str, int | None, str]]) -> None:
    """Refuse a selector that names two containers or cgroups: two IDs with one prefix, one ID claimed in a user's
    own cgroups too (a user names them as it likes: which is the one meant cannot be told), or one name (a unit, an
    LXC name, a Slurm job) in two places (the host's ``nginx.service`` and a container's)."""
    if len({i for i, _, _ in full}) > 1:
        hint = "give more of the ID"
    elif len({u for _, u, _ in full}) > 1:
        hint = ("the same name in a user's own cgroups (user@UID.service) is that user's claim: give the cgroup path "
                "(--cgroup)")
    else:
        places = sorted({p for _, _, p in full})
        shown = ", ".join(places[:4]) + (f", and {len(places) - 4} more" if len(places) > 4 else "")
        raise _argument_error(f"{parsed.value!r} names {len(places)} cgroups ({printable(shown)}): one name in several "
                              "places (the host's, a container's, a user's own); give the cgroup path (--cgroup)")
    names = printable(", ".join(sorted(f"{i[:16]}{'…' if len(i) > 16 else ''}" + ("" if u is None else f" (user {u})")
                                       for i, u in {(i, u) for i, u, _ in full})))
    raise _argument_error(f"{parsed.value!r} names {len({(i, u) for i, u, _ in full})} containers ({names}): {hint}")


def _argument_error(message: str) -> Exception:
    """nvmlcheck's ArgumentError (a ValueError); :mod:`nvmlcheck.errors` is imported only when one is raised."""
    from ..errors import ArgumentError

    return ArgumentError(message)
