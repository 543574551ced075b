"""Slurm: nvmlcheck as the GPU gate between jobs (``nvmlcheck slurm epilog | prolog | health``).

:func:`job_from_env` reads the job from the environment slurmd gives a Prolog or Epilog. :func:`epilog` kills what
the ended job left on its GPUs (its cgroup; or, for a process that left it, its environment and user; never another
job's) and waits until those GPUs are ready; :func:`prolog` only waits; :func:`health` judges the GPUs' health. Each
returns a :class:`GateResult` whose :class:`Cause` list names what is wrong; :func:`drain_reason` makes the node's
drain reason of it and :class:`Scontrol` drains, resumes and reads the node, every run bounded by a deadline.
:func:`await_ready` is the one readiness judgement (clean, then healthy) all three use. Slurm's contract (exit codes,
environment, timeouts), the reasons and the configuration: docs/slurm.md.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._deadline import ns_or_none
from ._text import is_digits
from ._units import format_bytes
from .errors import ArgumentError, NvmlCheckError
from .predicates import DEFAULT_MAX_USED_BYTES

if TYPE_CHECKING:
    from ._proc.child import Child
    from .holders import Holder
    from .kill import PidTimes
    from .model import Fields, Snapshot
    from .session import Session
    from .verdict import Culprit
    from .wait import TracePoint

__all__ = [
    "REASON_PREFIX",
    "Cause",
    "GateProgress",
    "GateResult",
    "NodeState",
    "Readiness",
    "NodeNotFound",
    "Scontrol",
    "ScontrolError",
    "ScontrolRun",
    "SlurmJob",
    "await_ready",
    "cause_of",
    "check_node_name",
    "check_run_by_slurm",
    "clean_text",
    "drain_reason",
    "epilog",
    "gpu_label",
    "health",
    "health_causes",
    "job_from_env",
    "job_gpu_indices",
    "job_processes",
    "mig_units",
    "node_name",
    "parse_gpu_list",
    "parse_node_line",
    "prolog",
]

#: Every drain reason nvmlcheck sets starts with this; ``health`` returns to service only nodes whose reason does.
REASON_PREFIX = "nvmlcheck:"
#: A drain reason is cut to this many characters (``sinfo -R`` shows the start; the record keeps every cause).
MAX_REASON_CHARS = 200

CauseKind = Literal["held", "reclaiming", "stuck", "unhealthy", "unknown", "short", "unavailable"]
Command = Literal["epilog", "prolog", "health"]


# --- the job, from Slurm's environment --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """A job as a Prolog or Epilog sees it. ``id``/``uid``/``user``: ``SLURM_JOB_ID``, ``SLURM_JOB_UID``,
    ``SLURM_JOB_USER`` (``None`` when unset, as for the HealthCheckProgram). ``gpus``: the job's GPUs on this node:
    Slurm's GPU IDs as text (each GPU's place in slurmd's list, which gres.conf orders; :func:`job_gpu_indices` finds
    their NVML indices) or UUIDs, ``()`` for a job without GPUs; ``gpus_from``: the variable they
    were read from (``None``: none named any). ``node``: ``SLURMD_NODENAME``."""

    id: str | None
    uid: int | None
    user: str | None
    node: str | None
    gpus: tuple[str, ...]
    gpus_from: str | None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "uid": self.uid, "user": self.user, "node": self.node, "gpus": list(self.gpus),
                "gpus_from": self.gpus_from}


# A GPU's UUID, a MIG instance's, or an instance as drivers before R470 name it: MIG-<GPU UUID>/<GI id>/<CI id>.
_UUID = re.compile(r"GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z-]+(?:/[0-9]+/[0-9]+)?")
# GRES as scontrol show job -d prints it (and sites copy into the environment): gpu[:TYPE][:COUNT](IDX:0-1,3), one
# or more, comma-separated; IDX:N/A is none.
_GRES_ITEM = r"gpu(?::[A-Za-z0-9_.\-]+)*\(IDX:([0-9,\-]*|N/A)\)"
_GRES_LIST = re.compile(rf"{_GRES_ITEM}(?:,{_GRES_ITEM})*")
_GRES_IDX = re.compile(_GRES_ITEM)

#: The highest GPU ID: Slurm's GPU ID is a device minor number (``/dev/nvidiaN``), and NVIDIA GPUs are minors
#: 0-253 (254 is ``nvidia-modeset``, 255 ``nvidiactl``). It also bounds how long a GPU list may be.
MAX_GPU_ID = 253
_MAX_GPU_IDS = MAX_GPU_ID + 1


def parse_gpu_list(text: str, variable: str) -> tuple[str, ...]:
    """``"0,1,3"``, ``"0-3,6"`` or UUIDs (``GPU-…``, ``MIG-…``, ``MIG-GPU-…/GI/CI``) as a list of IDs, in order, each
    once; also GRES as ``scontrol show job -d`` prints it, ``gpu:h200:2(IDX:0,2)`` (its IDX lists). ``""`` and
    Slurm's ``NoDevFiles`` (GRES without device files) are no GPU. ``ArgumentError`` (a ``ValueError``) naming
    ``variable`` otherwise, and for an ID beyond :data:`MAX_GPU_ID` or more than ``MAX_GPU_ID + 1`` items: each is
    refused before anything is built (``0-100000000`` would be a list of 10**8 IDs)."""
    text = text.strip()
    if not text or text == "NoDevFiles":
        return ()
    if "(IDX:" in text and len(text) <= 4096:
        if not _GRES_LIST.fullmatch(text):
            raise ArgumentError(f"${variable}={_shown(text)}: not GRES of the form gpu[:TYPE][:COUNT](IDX:LIST)")
        lists = [m.group(1) for m in _GRES_IDX.finditer(text) if m.group(1) not in ("", "N/A")]
        return tuple(dict.fromkeys(g for ids in lists for g in parse_gpu_list(ids, variable)))
    if text.count(",") >= _MAX_GPU_IDS:
        raise ArgumentError(f"${variable}={_shown(text)}: more than {_MAX_GPU_IDS} GPUs (a host has at most "
                            f"{_MAX_GPU_IDS}: /dev/nvidia0-{MAX_GPU_ID})")
    out: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        first, dash, last = item.partition("-")
        if is_digits(item):
            out.append(str(_gpu_id(item, text, variable)))
        elif dash and is_digits(first) and is_digits(last):
            low, high = _gpu_id(first, text, variable), _gpu_id(last, text, variable)
            if low > high:
                raise ArgumentError(f"${variable}={_shown(text)}: {item!r} is an empty range")
            out.extend(str(i) for i in range(low, high + 1))
        elif _UUID.fullmatch(item):
            out.append(item)
        else:
            raise ArgumentError(f"${variable}={_shown(text)}: {item!r} is not a GPU index, range or UUID")
    return tuple(dict.fromkeys(out))


def _gpu_id(digits: str, text: str, variable: str) -> int:
    """``digits`` (ASCII, checked by the caller) as a GPU ID, refused beyond :data:`MAX_GPU_ID`; its length is
    checked first, so that a number of a million digits is never converted."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(MAX_GPU_ID)) or int(significant) > MAX_GPU_ID:
        raise ArgumentError(f"${variable}={_shown(text)}: GPU {_shown(digits, 20)} is beyond /dev/nvidia"
                            f"{MAX_GPU_ID} (a GPU ID is a device minor number, 0-{MAX_GPU_ID})")
    return int(significant)


def _shown(text: str, limit: int = 80) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters: an environment value can be 128 KiB."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


def job_from_env(env: Mapping[str, str] | None = None) -> SlurmJob:
    """The job slurmd describes in ``env`` (default ``os.environ``). Its GPUs come from ``SLURM_JOB_GPUS`` (Slurm's
    GPU IDs: ``/dev/nvidiaN`` where gres.conf lists ``/dev/nvidia0..N`` in order, NVML's index with
    ``AutoDetect=nvml``: see docs/slurm.md and :func:`job_gpu_indices`), else ``CUDA_VISIBLE_DEVICES``; where
    ``CUDA_VISIBLE_DEVICES`` holds UUIDs only (MIG instances), they are read instead: they name the GPU exactly.
    ``ArgumentError`` (a ``ValueError``, naming the variable) for a malformed value, and where those UUIDs are not
    as many as ``SLURM_JOB_GPUS``'s IDs (one list or the other would leave a GPU of the job unjudged)."""
    env = os.environ if env is None else env
    gpus: tuple[str, ...] = ()
    source = None
    for variable in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        if variable in env:
            gpus = parse_gpu_list(env[variable], variable)
            if gpus:
                source = variable
                break
    if source == "SLURM_JOB_GPUS" and env.get("CUDA_VISIBLE_DEVICES"):
        # UUIDs name a GPU whatever gres.conf's numbering: slurmd puts them there for MIG instances (and for every
        # GPU with gres.conf's env_uuid), where SLURM_JOB_GPUS has only its numbers.
        try:
            named = parse_gpu_list(env["CUDA_VISIBLE_DEVICES"], "CUDA_VISIBLE_DEVICES")
        except ArgumentError:
            named = ()
        if named and all(_UUID.fullmatch(g) for g in named):
            if len(named) != len(gpus):
                # slurmd writes both from the job's one allocation: as many UUIDs as IDs. Where they disagree, one
                # list would leave a GPU of the other unjudged (and called ready); which is right cannot be told.
                raise ArgumentError(
                    f"$SLURM_JOB_GPUS={_shown(env['SLURM_JOB_GPUS'])} names {len(gpus)} GPU(s) and "
                    f"$CUDA_VISIBLE_DEVICES={_shown(env['CUDA_VISIBLE_DEVICES'])} {len(named)} UUID(s): which are "
                    "the job's cannot be told (name them with --devices)")
            gpus, source = named, "CUDA_VISIBLE_DEVICES"
    uid_text = env.get("SLURM_JOB_UID")
    if uid_text is not None and not is_digits(uid_text.strip()):
        raise ArgumentError(f"$SLURM_JOB_UID={uid_text!r} is not a user ID")
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None
    if job_id is not None and not is_digits(job_id.strip()):
        raise ArgumentError(f"$SLURM_JOB_ID={job_id!r} is not a job ID")
    return SlurmJob(
        id=None if job_id is None else job_id.strip(),
        uid=None if uid_text is None else int(uid_text),
        user=env.get("SLURM_JOB_USER") or None,
        node=env.get("SLURMD_NODENAME") or None,
        gpus=gpus,
        gpus_from=source,
    )


# --- causes and the drain reason -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cause:
    """One reason the node's GPUs are not ready: a :class:`~nvmlcheck.verdict.Culprit` of ``ready`` (its class is
    ``kind``: ``"held"``, ``"reclaiming"``, ``"stuck"``, ``"unhealthy"``, ``"unknown"``), or ``"unavailable"`` (no
    backend). ``text``: the sentence for the drain reason, without the prefix. ``action``: what an operator does, in
    ``ready``'s words (``STOP_HOLDER``, ``WAIT``, ``REAP_ZOMBIE``, ``RESET_GPU``, ``NODE_REBOOT``,
    ``CONTACT_SUPPORT``, ...; ``None``: nothing named). ``gpu``: the GPU's NVML index (``nvidia-smi -i``), which
    the text names too; where its minor number differs (Slurm's GPU ID, ``/dev/nvidiaN``), the text names both:
    ``GPU 0 (/dev/nvidia1)``."""

    kind: CauseKind
    text: str
    gpu: int | None = None
    pid: int | None = None
    name: str | None = None
    used_bytes: int | None = None
    action: str | None = None
    container: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "gpu": self.gpu, "pid": self.pid, "name": self.name,
                "used_bytes": self.used_bytes, "action": self.action, "container": self.container}


def clean_text(text: str) -> str:
    """One line, no control characters: Slurm stores the reason as given and ``sinfo`` prints it raw."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


#: The order of causes in a drain reason: what needs an operator first (a reset is the most specific thing to do).
_REASON_ORDER = {"unhealthy": 0, "stuck": 1, "held": 2, "reclaiming": 3, "unknown": 4, "short": 5, "unavailable": 6}


def drain_reason(causes: Sequence[Cause]) -> str:
    """The node's drain reason: ``"nvmlcheck: "`` and the first causes, joined with ``"; "``, cut to
    :data:`MAX_REASON_CHARS` with ``"(+N more)"`` for those left out. Unhealthy GPUs come first, then stuck, held,
    reclaiming, unknown, unavailable. Never ending with ``"``: scontrol drops a reason's last double quote (Slurm
    22.05), and the reason Slurm keeps must be this one (a node drained with it is not drained again)."""
    if not causes:
        raise ArgumentError("a drain reason needs at least one cause")
    ranked = sorted(causes, key=lambda c: _REASON_ORDER[c.kind])
    texts = [clean_text(c.text) for c in ranked]
    for shown in range(len(texts), 0, -1):
        more = len(texts) - shown
        reason = f"{REASON_PREFIX} " + "; ".join(texts[:shown]) + (f" (+{more} more)" if more else "")
        if len(reason) <= MAX_REASON_CHARS:
            return reason[:-1] + "'" if reason.endswith('"') else reason
    tail = f" (+{len(texts) - 1} more)" if len(texts) > 1 else ""
    return f"{REASON_PREFIX} " + texts[0][: MAX_REASON_CHARS - len(REASON_PREFIX) - 2 - len(tail) - 1] + "…" + tail


def _seconds(ns: int) -> str:
    s = ns / 1e9
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


#: The drain reason's words for the health causes (codes of :meth:`nvmlcheck.model.Health.causes`); any other
#: culprit keeps ``ready``'s own sentence.
_SHORT = {
    "row-remap-pending": "row remap pending, reset needed",
    "row-remap-failure": "row remap failed, service needed",
    "retired-pages-pending": "page retirement pending, reset needed",
    "ecc-uncorrected-volatile": "uncorrectable ECC errors, reset needed",
}
#: The words for a GPU that could not be read and needs an operator (:func:`nvmlcheck.verdict.error_culprit`), by its
#: action: its culprit's sentence carries NVML's whole message, which would take the reason's 200 characters.
_SHORT_QUERY = {"NODE_REBOOT": "GPU lost, node reboot needed", "RESET_GPU": "GPU requires a reset, reset needed"}


def cause_of(c: Culprit, *, after_ns: int | None = None, killed: Mapping[int, PidTimes] | None = None,
             minors: Mapping[int, int] | None = None) -> Cause:
    """A culprit of ``ready`` as a drain-reason cause: ``GPU 3 held by pid 4123 (python3) 8.0 GiB after 30 s``,
    ``GPU 1: row remap pending, reset needed``. ``after_ns``: how long the gate waited; ``killed``: what the epilog
    signalled, so that a survivor is named as one; ``minors``: each GPU's minor number by NVML index, so that a GPU
    whose ``/dev/nvidiaN`` is not its index is named by both (:func:`gpu_label`)."""
    gpu = gpu_label(c.gpu, minors) if c.gpu is not None else "GPUs"
    after = "" if after_ns is None else f" after {_seconds(after_ns)}"
    size = "" if c.used_bytes is None else f" {format_bytes(c.used_bytes)}"
    if c.class_ in ("unhealthy", "unknown", "short") or (c.pid is None and c.class_ not in ("reclaiming", "stuck")):
        short = _SHORT_QUERY.get(c.action or "") if c.kind == "query" and c.class_ == "unhealthy" else None
        text = f"{gpu}: {short or _SHORT.get(c.kind) or c.reason.split(' [', 1)[0]}"
    elif c.pid is None:
        what = "still coming back" if c.class_ == "reclaiming" else "held by no process"
        text = f"{gpu}:{size} {what}{after}"
    else:
        who = f"pid {c.pid} ({c.name})" if c.name else f"pid {c.pid}"
        where = f" in {c.container}" if c.container and not c.container.startswith("cgroup ") else ""
        extra = ""
        if c.state == "zombie":
            extra = " (a zombie)"
        elif c.state == "uninterruptible":
            extra = " (in D state)"
        elif killed and c.pid in killed and killed[c.pid].killed_ns is not None:
            extra = " (survived SIGKILL)"
        if c.class_ == "reclaiming" and not extra:
            text = f"{gpu}:{size} of exited {who}{where} still coming back{after}"
        else:
            text = f"{gpu} held by {who}{where}{size}{extra}{after}"
    kind: CauseKind = c.class_ if c.class_ != "ready" else "unknown"
    return Cause(kind, text, c.gpu, c.pid, c.name, c.used_bytes, c.action, c.container)


def gpu_label(index: int, minors: Mapping[int, int] | None = None) -> str:
    """``"GPU 0"``, or ``"GPU 0 (/dev/nvidia1)"`` where the GPU's minor number (``minors[index]``) is not its NVML
    index: an operator resets by one and Slurm names the other, and must not take one for the other."""
    minor = None if minors is None else minors.get(index)
    return f"GPU {index}" if minor is None or minor == index else f"GPU {index} (/dev/nvidia{minor})"


def _minors(snapshot: Snapshot | None) -> dict[int, int]:
    """Each GPU's minor number by NVML index, from ``snapshot``'s identity (read with every snapshot)."""
    if snapshot is None:
        return {}
    return {d.index: d.minor_number for d in snapshot.devices if d.minor_number is not None}


# --- whose process -------------------------------------------------------------------------------------------------


def job_processes(
    holders: Iterable[Holder], job: SlurmJob
) -> tuple[tuple[tuple[Holder, str], ...], tuple[tuple[Holder, str], ...]]:
    """Split ``holders`` into the job's (to kill) and the rest, each with why: ``((holder, why), ...)`` twice.

    The job's: a process in the job's cgroup (``slurm/<id>``, read by :func:`nvmlcheck._proc.container.container_of`);
    or one in no Slurm job's cgroup whose initial environment says ``SLURM_JOB_ID=<id>`` and whose owner is the job's
    user (a worker that daemonised out of the job under ``proctrack/linuxproc``). Never: a process in another job's
    cgroup (whatever its environment says), Slurm's step daemon, one outside the job's cgroup whose environment has
    ``SLURM_SCRIPT_CONTEXT`` (slurmd's Prolog or Epilog, e.g. a helper the epilog script started: it names the job
    and, for a root job, runs as its user), this process or an ancestor, a daemon
    (:data:`~nvmlcheck.holders.DAEMONS`), a zombie (no signal frees it), or anything when the job ID is unknown."""
    from ._proc.container import container_of
    from ._proc.environ import environ_value

    mine: list[tuple[Holder, str]] = []
    others: list[tuple[Holder, str]] = []
    for h in holders:
        why_not = _never_killed(h, job)
        if why_not is not None:
            others.append((h, why_not))
            continue
        c = container_of(h.pid)
        jobs = [ident for kind, ident in (c.names() if c is not None else ()) if kind == "slurm"]
        if jobs and c is not None and c.monitor:
            others.append((h, f"Slurm's step daemon of job {jobs[0]}"))
        elif jobs and jobs[0] == job.id:
            mine.append((h, f"in job {job.id}'s cgroup"))
        elif jobs:
            others.append((h, f"in another job's cgroup (job {jobs[0]})"))
        elif (context := environ_value(h.pid, "SLURM_SCRIPT_CONTEXT")) is not None:
            # slurmd's Prolog/Epilog scripts (and what they start) carry the job's SLURM_JOB_ID, run as root outside
            # the job's cgroup: for a root job (SLURM_JOB_UID=0) they would pass for its leftovers.
            others.append((h, f"Slurm's own script ({_shown(context, 40)}), not the job's"))
        elif environ_value(h.pid, "SLURM_JOB_ID") == job.id and job.uid is not None and h.uid == job.uid:
            mine.append((h, f"left job {job.id}'s cgroup; its environment names the job and it runs as its user"))
        else:
            where = f" ({c.label()})" if c is not None else ""
            others.append((h, f"not job {job.id}'s process{where}"))
    return tuple(mine), tuple(others)


def _never_killed(h: Holder, job: SlurmJob) -> str | None:
    if job.id is None:
        return "the job ID is unknown ($SLURM_JOB_ID unset)"
    if h.relation is not None:
        return "this process" if h.relation == "self" else "an ancestor of this process"
    if h.start_ticks is None:
        return "no process with this PID here (another PID namespace's numbering, or exited)"
    if h.is_daemon:
        return f"a daemon ({h.name})"
    if h.state == "zombie":
        return "a zombie: it has exited; its parent has to reap it"
    return None


# --- readiness ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Readiness:
    """The judgement of :func:`await_ready`: ``ready`` when every GPU is ready before the deadline; ``causes`` when
    not. ``polls``/``elapsed_ns`` are ``ready``'s; ``dirty_polls`` counts the polls of its wait that read the GPUs
    and found them not clean (a poll that failed to read them is none), ``last_dirty_ns`` and ``first_clean_ns``
    (ns from the wait's start) frame when the GPUs became clean (``None``: the wait never saw them dirty, or never
    clean). ``verdicts``: ``ready``'s per GPU, as JSON."""

    ready: bool
    causes: tuple[Cause, ...]
    polls: int
    elapsed_ns: int
    dirty_polls: int = 0
    last_dirty_ns: int | None = None
    first_clean_ns: int | None = None
    culprits: tuple[str, ...] = ()
    verdicts: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"ready": self.ready, "polls": self.polls, "elapsed_ns": self.elapsed_ns,
                "dirty_polls": self.dirty_polls, "last_dirty_ns": self.last_dirty_ns,
                "first_clean_ns": self.first_clean_ns, "culprits": list(self.culprits),
                "verdicts": list(self.verdicts)}


def health_causes(snapshot: Snapshot) -> list[Cause]:
    """What in ``snapshot`` (read with ``Fields.HEALTH``) needs an operator: each health cause of
    :func:`nvmlcheck.verdict.health_causes` (a pending or failed row remap, pending retirement, uncorrected ECC
    errors, a recovery action) and each GPU that could not be read (:func:`nvmlcheck.verdict.error_culprit`). A
    health value that cannot be read is no cause here (it is in the record's culprits of a ``ready`` check)."""
    from .verdict import error_culprit
    from .verdict import health_causes as culprits_of

    minors = _minors(snapshot)
    out = [cause_of(error_culprit(f.index, f.error), minors=minors) for f in snapshot.failures]
    for d in snapshot.devices:
        out.extend(cause_of(c, minors=minors) for c in culprits_of(d) if c.class_ == "unhealthy")
    return out


def await_ready(
    session: Session,
    indices: Sequence[int],
    *,
    deadline_ns: int,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    killed: Sequence[PidTimes] = (),
    started_ns: int | None = None,
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], object] = time.sleep,
    progress: GateProgress | None = None,
    one_check: bool = False,
    units: Sequence[str] = (),
) -> Readiness:
    """Whether the GPUs ``indices`` are ready by ``deadline_ns`` (on ``clock``), as :meth:`Session.ready
    <nvmlcheck.Session.ready>` judges it: clean (no process, at most ``max_used_bytes``), healthy (an unhealthy GPU
    ends the wait at once: waiting cannot help), no fatal XID meanwhile. The causes say how long was waited since
    ``started_ns`` (default: now); ``killed``: what the epilog signalled, so that a survivor is named as one;
    ``progress``: kept up to date with each poll (:class:`GateProgress`); ``one_check``: the gate's timeout is 0,
    one check judged alone (else a deadline already passed is still a bound: not confirmed in time, never a check
    that ignores the stable polls); ``units``: MIG instances (``MIG-…`` UUIDs) judged instead of their whole GPU,
    whose index ``indices`` still lists (another instance of that GPU is another job's: :func:`mig_units`)."""
    from ._deadline import USED_UP_S
    from .wait import WaitOptions

    start = clock()
    since = start if started_ns is None else started_ns
    dirty = 0
    last_dirty: int | None = None
    first_clean: int | None = None

    if progress is not None:
        progress.stage, progress.max_used_bytes = "waiting for the GPUs to be ready", max_used_bytes

    def observe(point: TracePoint) -> None:
        nonlocal dirty, last_dirty, first_clean
        if progress is not None:
            progress.polls += 1
            if point.snapshot is not None:
                progress.last_poll = point
        if point.clean:
            first_clean = point.offset_ns if first_clean is None else first_clean
        elif point.error is not None or point.failures:
            first_clean = None  # a poll that could not read the GPUs saw nothing: it breaks a clean run only
        else:
            dirty, last_dirty, first_clean = dirty + 1, point.offset_ns, None

    remaining_s = 0.0 if one_check else max(USED_UP_S, (deadline_ns - clock()) / 1e9)
    try:
        selection = _selection(session, indices, units, None if one_check else deadline_ns, clock)
        report = session.ready(selection, max_used_bytes=max_used_bytes, timeout=remaining_s,
                               options=WaitOptions().with_(on_poll=observe, clock=clock, sleep=sleep))
    except NvmlCheckError as exc:
        # The action is the error's (a lost GPU: reboot; one requiring a reset: reset), none where it names none: a
        # failing nvidia-smi, a refused permission or an unloaded driver is no reason to reset a GPU.
        from .verdict import error_culprit

        judged = error_culprit(indices[0] if indices else 0, exc)
        kind: CauseKind = "unhealthy" if judged.class_ == "unhealthy" else "unknown"
        cause = Cause(kind, f"GPU {', '.join(map(str, indices))}: {clean_text(str(exc)).split(': ', 1)[-1]}"[:160],
                      action=judged.action)
        return Readiness(False, (cause,), 0, clock() - start)
    by_pid = {t.pid: t for t in killed}
    after = clock() - since
    minors = _minors(report.snapshot)
    causes = tuple(cause_of(c, after_ns=after, killed=by_pid, minors=minors) for v in report.verdicts if not v.ready
                   for c in v.culprits)
    if not report.ready and not causes:
        gpus = ", ".join(gpu_label(i, minors).removeprefix("GPU ") for i in indices)  # "GPU 0, 1 (/dev/nvidia0)"
        causes = (Cause("unknown", f"GPU {gpus} not ready after {_seconds(after)}"),)
    return Readiness(report.ready, causes, report.polls, clock() - start, dirty, last_dirty,
                     first_clean if dirty else None, report.culprits, tuple(v.to_json() for v in report.verdicts))


def mig_units(gpus: Sequence[str]) -> tuple[str, ...]:
    """The MIG instances among ``gpus`` (a job's GPUs, or ``--devices``): their ``MIG-…`` UUIDs, each judged alone.
    A GPU in MIG mode is shared: its other instances may run other jobs, whose processes and memory are not this
    job's (judging the whole GPU found them and drained the node under every job's prolog and epilog)."""
    return tuple(dict.fromkeys(g for g in gpus if isinstance(g, str) and g[:4].upper() == "MIG-"))


def _selection(session: Session, indices: Sequence[int], units: Sequence[str], deadline_ns: int | None,
               clock: Callable[[], int]) -> list[int | str]:
    """What readiness judges: the MIG instances ``units``, and each GPU of ``indices`` that is none of theirs. Their
    GPUs come from the identities the selection read (by ``deadline_ns`` on ``clock``); where that cannot be told,
    every GPU of ``indices`` is judged whole as well (more is judged, never less)."""
    from .errors import DeadlinePassed

    if not units:
        return list(indices)
    parents: set[int] = set()
    for unit in units:
        try:
            parents.update(session._resolve([unit], deadline_ns, clock) or ())
        except (NvmlCheckError, DeadlinePassed):
            return [*units, *indices]
    return [*units, *(i for i in indices if i not in parents)]


# --- the three gates ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateResult:
    """What ``epilog``, ``prolog`` or ``health`` found. ``devices``: the NVML indices judged. ``ready``: clean and
    healthy (health: healthy). ``killed``: the job's processes the epilog signalled; ``left_alone``: holders it did
    not, ``(pid, name, why)``. ``readiness``: the judgement (``None`` when nothing was judged: no GPUs).
    ``interrupted``: the signal that ended the gate before its verdict (``"SIGTERM"``: slurmd's at
    PrologEpilogTimeout), ``None`` when it ran to the end; what it had found by then is the rest
    (:meth:`GateProgress.result`), never ready."""

    command: Command
    job: SlurmJob | None
    devices: tuple[int, ...]
    ready: bool
    causes: tuple[Cause, ...]
    elapsed_ns: int
    timeout_s: float
    readiness: Readiness | None = None
    killed: tuple[PidTimes, ...] = ()
    left_alone: tuple[tuple[int, str | None, str], ...] = ()
    would_kill: tuple[tuple[int, str | None, str], ...] = ()
    interrupted: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "job": None if self.job is None else self.job.to_json(),
            "devices": list(self.devices),
            "ready": self.ready,
            "causes": [c.to_json() for c in self.causes],
            "elapsed_ns": self.elapsed_ns,
            "timeout_s": self.timeout_s,
            "readiness": None if self.readiness is None else self.readiness.to_json(),
            "killed": [t.to_json() for t in self.killed],
            "left_alone": [{"pid": pid, "name": name, "reason": why} for pid, name, why in self.left_alone],
            "would_kill": [{"pid": pid, "name": name, "reason": why} for pid, name, why in self.would_kill],
            "interrupted": self.interrupted,
        }


class GateProgress:
    """What a gate has found so far, kept up to date while it runs (pass one as ``progress=`` to :func:`epilog`,
    :func:`prolog` or :func:`health`), so that a gate ended before its verdict can still say it: slurmd ends a
    Prolog or Epilog at PrologEpilogTimeout with SIGTERM to its process group and SIGKILL 10 ms later
    (docs/slurm.md, "Interrupted"), and what the gate found would otherwise be lost with it.

    ``stage``: what it was doing; ``devices``, ``unfound``: the GPUs judged and the causes found while choosing them;
    ``killed``: the job's processes signalled (each one's record as far as it went); ``left_alone``,
    ``would_kill``: as in :class:`GateResult`; ``last_poll``: the latest reading of the readiness wait (its
    snapshot), ``polls`` how many. Cheap to update: nothing is judged until :meth:`result` is asked."""

    __slots__ = ("clock", "command", "devices", "job", "killed", "last_poll", "left_alone", "max_used_bytes", "polls",
                 "stage", "started_ns", "unfound", "would_kill")

    def __init__(self, command: Command, job: SlurmJob | None = None, *,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.command: Command = command
        self.job = job
        self.stage = "starting"
        self.devices: tuple[int, ...] = ()
        self.unfound: tuple[Cause, ...] = ()
        self.killed: tuple[PidTimes, ...] = ()
        self.left_alone: tuple[tuple[int, str | None, str], ...] = ()
        self.would_kill: tuple[tuple[int, str | None, str], ...] = ()
        self.last_poll: TracePoint | None = None
        self.polls = 0
        self.max_used_bytes = DEFAULT_MAX_USED_BYTES
        self.clock = clock
        self.started_ns = clock()

    def result(self, signal_name: str, *, timeout_s: float) -> GateResult:
        """The gate's result as far as it went, ended by ``signal_name``: never ready; its causes are what the last
        reading of the GPUs showed (each holder, memory still held; judged as ``ready`` judges a reading, without
        the health it had not read), the causes found before, and one saying that the gate was interrupted, when
        and while doing what."""
        from .verdict import classify

        now = self.clock()
        elapsed = now - self.started_ns
        causes: list[Cause] = []
        point = self.last_poll
        if point is not None and point.snapshot is not None and point.partial:
            # The wait's probe read the memory only (the process lists are read once it is low): what it saw.
            minors = _minors(point.snapshot)
            for d in point.snapshot.devices:
                used = None if d.memory is None else d.memory.used_bytes
                if d.index in self.devices and (used is None or used > self.max_used_bytes):
                    held = "memory use unknown" if used is None else f"{format_bytes(used)} in use"
                    causes.append(Cause("unknown", f"{gpu_label(d.index, minors)}: {held} after {_seconds(elapsed)} "
                                                   "(who holds it was not read yet)", d.index, used_bytes=used))
        elif point is not None and point.snapshot is not None:
            try:
                verdicts = classify(point.snapshot, now_ns=now, max_used_bytes=self.max_used_bytes,
                                    judge_health=False)
            except Exception:  # a best effort on the way out: the interrupted cause below still says it
                verdicts = ()
            minors = _minors(point.snapshot)
            by_pid = {t.pid: t for t in self.killed}
            causes = [cause_of(c, after_ns=elapsed, killed=by_pid, minors=minors) for v in verdicts
                      if v.index in self.devices and not v.ready for c in v.culprits]
        readiness = None if point is None else Readiness(False, tuple(causes), self.polls, elapsed)
        gpus = f" (GPU {', '.join(map(str, self.devices))})" if self.devices else ""
        causes.append(Cause("unknown", f"interrupted by {signal_name} after {_seconds(elapsed)} while "
                                       f"{self.stage}{gpus}"))
        return GateResult(self.command, self.job, self.devices, False, (*causes, *self.unfound), elapsed, timeout_s,
                          readiness, self.killed, self.left_alone, self.would_kill, interrupted=signal_name)


def _deadline(clock: Callable[[], int], timeout_s: float) -> tuple[int, int]:
    """The gate's start and deadline on ``clock``; ``ArgumentError`` for a timeout that is no finite number >= 0."""
    bound_ns = None
    if not isinstance(timeout_s, bool) and isinstance(timeout_s, int | float) and 0 <= timeout_s < math.inf:
        bound_ns = ns_or_none(timeout_s)
    if bound_ns is None:
        raise ArgumentError(f"timeout_s must be a finite number of seconds >= 0, got {timeout_s!r}")
    start = clock()
    return start, start + bound_ns


def check_run_by_slurm(job: SlurmJob, devices: Sequence[str] | None, command: str = "the gate") -> None:
    """``ArgumentError`` (a ``ValueError``) when ``job`` is no Slurm job's and nothing names GPUs: no
    ``$SLURM_JOB_ID`` (slurmd sets it for every Prolog and Epilog), no GPU in the environment and no ``devices``. A
    prolog or epilog run so (by hand, outside Slurm) would judge no GPU and say "ready", as for a job without GPUs."""
    if job.id is None and not job.gpus and not devices:
        raise ArgumentError(
            f"{command}: not run by slurmd ($SLURM_JOB_ID is unset) and no GPU named ($SLURM_JOB_GPUS, "
            "$CUDA_VISIBLE_DEVICES): it would judge no GPU and say ready. By hand, name the GPUs with --devices (and "
            "set SLURM_JOB_ID=N for the epilog to end that job's processes)")


def _setup_bound(timeout_s: float, deadline_ns: int) -> int | None:
    """The deadline of a gate's setup readings (the selection, the minor numbers, the process lists, the health):
    ``None`` (no bound) for ``timeout_s`` 0, one check, which always completes as every ``timeout=0`` of the library
    does (``Session.ready``'s included); else the gate's."""
    return None if timeout_s == 0 else deadline_ns


def _indices(session: Session, selectors: Sequence[str] | None, deadline_ns: int | None,
             clock: Callable[[], int]) -> tuple[tuple[int, ...], tuple[Cause, ...]]:
    """The NVML indices of ``selectors`` (``--devices``: indices, UUIDs, ``cuda:N``, ``MIG-…``; ``None``: every GPU),
    their readings (a UUID's, ``cuda:N``'s) stopped at ``deadline_ns`` on ``clock`` (at most one query late): when
    the deadline came first, no index and a cause saying so (a slow or hung GPU must not hold the gate past slurmd's
    own timeout); likewise for a selector that names none of this host's GPUs."""
    from .errors import DeadlinePassed, NoSuchDevice

    try:
        resolved = session._resolve(list(selectors) if selectors else None, deadline_ns, clock)
    except DeadlinePassed:
        named = ", ".join(_shown(s, 60) for s in selectors or ())
        return (), (Cause("unknown", clean_text(f"which GPUs {named} are cannot be told: the GPUs were not read "
                                                 "within the timeout")[:160]),)
    except NoSuchDevice as exc:
        # Only this host can tell (a GPU gone, a gres.conf copied from another node's): a cause, drained and
        # recorded, never an exit that Slurm ignores (the HealthCheckProgram's) with no record.
        return (), (Cause("unknown", clean_text(f"--devices: {exc}")[:160]),)
    return (tuple(range(session.device_count())) if resolved is None else resolved), ()


#: What Slurm's numeric GPU IDs count (``--gpu-ids``): ``"minor"``, the N of ``/dev/nvidiaN`` (gres.conf lists
#: every GPU's file in minor order, ``File=/dev/nvidia[0-7]``); ``"index"``, NVML's index, PCI bus order
#: (``AutoDetect=nvml``: Slurm orders the GPUs it detects by PCI bus ID). docs/slurm.md, "Which GPUs".
GpuIds = Literal["minor", "index"]
GPU_IDS: tuple[GpuIds, ...] = ("minor", "index")


def job_gpu_indices(session: Session, gpus: Sequence[str], *, deadline_ns: int | None = None,
                    clock: Callable[[], int] = time.monotonic_ns,
                    gpu_ids: GpuIds = "minor") -> tuple[tuple[int, ...], tuple[Cause, ...]]:
    """The NVML indices of a job's GPUs (:attr:`SlurmJob.gpus`), and a cause for each one that cannot be found.

    A number is Slurm's GPU ID: its position in slurmd's list of the node's GPUs, which only gres.conf tells.
    ``gpu_ids="minor"`` (gres.conf lists ``/dev/nvidia0..N`` in order): the N of ``/dev/nvidiaN``, matched to the GPU
    whose minor number it is, never taken as NVML's index (PCI order; the two differ on some hosts, and the gate would
    judge another job's GPU); ``"index"`` (``AutoDetect=nvml``, PCI bus order): NVML's index. A UUID is matched as
    :meth:`Session.resolve <nvmlcheck.Session.resolve>` matches one. An ID no GPU's minor number (or index) is, or one
    that cannot be told because a GPU's minor number is unknown (unreadable, or the nvidia-smi backend without the
    driver's procfs list) or because more than one GPU reports it, is a cause of kind ``"unknown"``: what the job used
    is not judged, so the node is not called ready. ``deadline_ns`` (on ``clock``): the gate's; the minor numbers not
    read by then make every ID a cause."""
    from .model import Fields

    if gpu_ids not in GPU_IDS:
        raise ArgumentError(f"gpu_ids must be one of {', '.join(GPU_IDS)}, got {gpu_ids!r}")
    # UUIDs, and with "index" the IDs too, name GPUs as --devices does.
    ids = [g for g in gpus if is_digits(g)] if gpu_ids == "minor" else []
    out, causes = _resolved(session, [g for g in gpus if g not in ids], deadline_ns, clock)
    if not ids:
        return tuple(sorted(out)), tuple(causes)
    snap = _read(session, Fields(0), None, deadline_ns, clock)  # identity only: cached after the first read
    if snap is None:
        return tuple(sorted(out)), (*causes, *(Cause("unknown", f"which GPU is the job's GPU {g} (/dev/nvidia{g}) "
                                                                 "cannot be told: the minor numbers were not read "
                                                                 "within the timeout") for g in ids))
    by_minor: dict[int, list[int]] = {}
    for d in snap.devices:
        if d.minor_number is not None:
            by_minor.setdefault(d.minor_number, []).append(d.index)
    unknown = [f"GPU {d.index}'s: {d.why_unknown('minor_number') or 'unknown'}" for d in snap.devices
               if d.minor_number is None]
    unknown += [f"GPU {f.index}: it cannot be read" for f in snap.failures]
    unreadable = False
    for g in ids:
        found = by_minor.get(int(g), [])
        if len(found) == 1:
            out.add(found[0])
        elif found:
            # Two GPUs cannot both be /dev/nvidiaN: a reading is wrong, and judging either one could pass the job's
            # GPU by (the other may be it, and held).
            why = (f"which GPU is the job's GPU {g} (/dev/nvidia{g}) cannot be told: {_all_report(found)} minor "
                   f"number {g}")
            causes.append(Cause("unknown", clean_text(why)[:160]))
        elif unknown:
            why = f"which GPU is the job's GPU {g} (/dev/nvidia{g}) cannot be told: no minor number for {unknown[0]}"
            causes.append(Cause("unknown", clean_text(why)[:160]))
            unreadable = True
        else:
            minors = ", ".join(map(str, sorted(by_minor))) or "none"
            causes.append(Cause("unknown", f"the job's GPU {g} (/dev/nvidia{g}) is none of this host's GPUs "
                                           f"(minor numbers {minors})"))
    if unreadable:
        # Why those GPUs cannot be read (lost: reboot; reset required), with its action: the reason an operator
        # needs, which the 160 characters above cut off.
        from .verdict import error_culprit

        causes.extend(cause_of(error_culprit(f.index, f.error)) for f in snap.failures)
    return tuple(sorted(out)), tuple(causes)


def _resolved(session: Session, gpus: Sequence[str], deadline_ns: int | None,
              clock: Callable[[], int]) -> tuple[set[int], list[Cause]]:
    """The NVML indices of ``gpus`` (UUIDs, NVML indices), and a cause for each that is none of this host's GPUs, or
    that could not be told by ``deadline_ns`` (on ``clock``; ``None``: no bound)."""
    from .errors import DeadlinePassed, NoSuchDevice

    out: set[int] = set()
    causes: list[Cause] = []
    for g in gpus:
        try:
            out.update(session._resolve([g], deadline_ns, clock) or ())
        except DeadlinePassed:
            causes.append(Cause("unknown", clean_text(f"which GPU is the job's GPU {g} cannot be told: the GPUs "
                                                      "were not read within the timeout")[:160]))
        except NoSuchDevice:
            causes.append(Cause("unknown", f"the job's GPU {g} is none of this host's GPUs" +
                                (f" (NVML indices 0-{session.device_count() - 1})" if is_digits(g) else "")))
    return out, causes


def _all_report(indices: Sequence[int]) -> str:
    """``"GPUs 0 and 1 both report"``, ``"GPUs 0, 1 and 3 all report"``."""
    head, last = ", ".join(map(str, indices[:-1])), indices[-1]
    return f"GPUs {head} and {last} {'both' if len(indices) == 2 else 'all'} report"


def epilog(
    session: Session,
    job: SlurmJob,
    *,
    timeout_s: float,
    grace_s: float | None = 2.0,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    devices: Sequence[str] | None = None,
    device_files: Sequence[str] | str | None = None,
    kill: bool = True,
    gpu_ids: GpuIds = "minor",
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], object] = time.sleep,
    progress: GateProgress | None = None,
) -> GateResult:
    """After job ``job``: SIGTERM its processes that still hold a GPU (:func:`job_processes`; with their
    descendants), SIGKILL them after ``grace_s`` (at the latest once half of the time left is gone; ``None``: then),
    then :func:`await_ready` on its GPUs (:func:`job_gpu_indices`, its IDs read as ``gpu_ids`` says; ``devices``:
    these NVML selectors instead), all within ``timeout_s``. A job GPU that cannot be found is a cause (not ready);
    when none can be, nothing is signalled. ``kill=False`` (a dry run) signals nothing and lists them in
    ``would_kill``. A job without GPUs is ready at once, without reading any GPU; ``ArgumentError`` when ``job`` is
    no Slurm job's and nothing names GPUs (:func:`check_run_by_slurm`). ``progress``: kept up to date
    with what it finds (:class:`GateProgress`), for a caller that is interrupted before the result."""
    start, deadline = _deadline(clock, timeout_s)
    check_run_by_slurm(job, devices, "epilog")
    if not devices and not job.gpus:
        return GateResult("epilog", job, (), True, (), clock() - start, timeout_s)
    progress = progress if progress is not None else GateProgress("epilog", job, clock=clock)
    progress.job, progress.stage = job, "choosing the job's GPUs"
    indices, unfound = _job_indices(session, job, devices, _setup_bound(timeout_s, deadline), clock, gpu_ids=gpu_ids)
    progress.devices, progress.unfound = indices, unfound
    if not indices:
        return GateResult("epilog", job, (), False, unfound, clock() - start, timeout_s)
    from .holders import HoldersIncomplete, find_holders

    progress.stage = "finding the job's processes"

    def left_s() -> float | None:
        # The holders' reading stops at the gate's deadline (a huge /proc, a hung read); timeout_s 0 is one check,
        # which completes (no bound), and a budget used up is the least positive bound, never "no bound".
        if _setup_bound(timeout_s, deadline) is None:
            return None
        return max(1e-9, (deadline - clock()) / 1e9)

    try:
        try:
            holders = session.holders(list(indices), device_files=device_files, timeout=left_s())
        except HoldersIncomplete:
            raise
        except NvmlCheckError:
            # A GPU or its process list cannot be read: the job's processes are still found by their device files
            # (and proven the job's as always); the readiness judgement below says what cannot be read.
            holders = find_holders(None, device_files=device_files, timeout=left_s())
    except HoldersIncomplete as exc:  # which processes are the job's is unknown: nothing signalled, never ready
        holders = ()
        unfound += (Cause("unknown", clean_text(f"the job's processes could not all be found: {exc.reason}; "
                                                "nothing was signalled")[:160]),)
        progress.unfound = unfound
    mine, others = job_processes((h for h in holders if _on(h, indices)), job)
    # A listed PID with no process here (exited a moment ago, or another PID namespace's numbering) is nothing to
    # kill or leave alone; if it keeps holding, the readiness causes name it.
    left = [(h.pid, h.name, why) for h, why in others if h.start_ticks is not None]
    would: list[tuple[int, str | None, str]] = []
    killed: tuple[PidTimes, ...] = ()
    progress.left_alone = tuple(left)
    if mine and not kill:
        would = [(h.pid, h.name, why) for h, why in mine]
        progress.would_kill = tuple(would)
    elif mine:
        killed = _end_processes(session, [h for h, _ in mine], indices, left, deadline_ns=deadline, grace_s=grace_s,
                                progress=progress, clock=clock, sleep=sleep, one_check=timeout_s == 0)
    readiness = await_ready(session, indices, deadline_ns=deadline, max_used_bytes=max_used_bytes, killed=killed,
                            started_ns=start, clock=clock, sleep=sleep, progress=progress, one_check=timeout_s == 0,
                            units=mig_units(devices or job.gpus))
    return GateResult("epilog", job, indices, readiness.ready and not unfound, readiness.causes + unfound,
                      clock() - start, timeout_s, readiness, killed, tuple(left), tuple(would))


def _end_processes(session: Session, mine: Sequence[Holder], indices: Sequence[int],
                   left: list[tuple[int, str | None, str]], *, deadline_ns: int, grace_s: float | None,
                   progress: GateProgress, clock: Callable[[], int],
                   sleep: Callable[[float], object], one_check: bool = False) -> tuple[PidTimes, ...]:
    """The epilog's kill of the job's processes ``mine`` (with their descendants): SIGTERM, SIGKILL after
    ``grace_s`` (by half of the time left at the latest), until they are gone or ``deadline_ns``. What each got;
    those that cannot be signalled are added to ``left``."""
    from ._deadline import USED_UP_S
    from .kill import KillError, KillTimeout, prepare_kill
    from .predicates import always

    try:
        plan = prepare_kill(holders=list(mine), tree=True)
    except KillError as exc:
        left.extend((h.pid, h.name, f"cannot be signalled: {exc.reason}") for h in mine)
        progress.left_alone = tuple(left)
        return ()
    with plan:
        progress.stage = "ending the job's processes"
        plan.send_first(signal.SIGTERM, clock=clock)
        progress.killed = plan.targets
        # Used up: the least positive bound (the targets' exits not waited for), never 0 (one check) unless asked.
        remaining_s = 0.0 if one_check else max(USED_UP_S, (deadline_ns - clock()) / 1e9)
        try:
            # SIGKILL by half of what is left at the latest: the wait for the memory needs the rest.
            grace = remaining_s / 2 if grace_s is None else min(grace_s, remaining_s / 2)
            killed = plan.wait(session, timeout=remaining_s, grace_s=grace, devices=list(indices),
                               predicate=always(), sleep=sleep).pids
        except KillTimeout as exc:
            killed = exc.pids
        except NvmlCheckError:
            killed = plan.targets
        progress.killed = killed
    return killed


def _job_indices(session: Session, job: SlurmJob, devices: Sequence[str] | None, deadline_ns: int | None,
                 clock: Callable[[], int], *, gpu_ids: GpuIds) -> tuple[tuple[int, ...], tuple[Cause, ...]]:
    """``devices`` (NVML selectors, as ``--devices`` gives them) resolved, else the job's GPUs by Slurm's IDs."""
    if devices:
        return _indices(session, devices, deadline_ns, clock)
    return job_gpu_indices(session, job.gpus, deadline_ns=deadline_ns, clock=clock, gpu_ids=gpu_ids)


def _read(session: Session, fields: Fields, indices: Sequence[int] | None, deadline_ns: int | None,
          clock: Callable[[], int]) -> Snapshot | None:
    """One reading of ``indices`` (all: ``None``) stopped at ``deadline_ns`` (at most one call late): ``None`` when it
    was (a slow driver must not hold the gate past slurmd's own timeout)."""
    from ._deadline import read_by

    return read_by(session.backend, None if indices is None else tuple(indices), fields, deadline_ns, clock)


def _on(h: Holder, indices: Sequence[int]) -> bool:
    """Listed on one of ``indices``, or found by a device file only (which cannot say which GPU)."""
    return not h.gpus or any(g.index in indices for g in h.gpus)


def prolog(
    session: Session,
    job: SlurmJob,
    *,
    timeout_s: float,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    devices: Sequence[str] | None = None,
    gpu_ids: GpuIds = "minor",
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], object] = time.sleep,
    progress: GateProgress | None = None,
) -> GateResult:
    """Before job ``job``: :func:`await_ready` on its GPUs (:func:`job_gpu_indices`, its IDs read as ``gpu_ids``
    says; ``devices``: these NVML selectors instead) within ``timeout_s``. Nothing is signalled: what holds a GPU now
    is not this job's. A job without GPUs is ready at once; ``ArgumentError`` when ``job`` is no Slurm job's and
    nothing names GPUs (:func:`check_run_by_slurm`). ``progress``: kept up to date (:class:`GateProgress`)."""
    start, deadline = _deadline(clock, timeout_s)
    check_run_by_slurm(job, devices, "prolog")
    if not devices and not job.gpus:
        return GateResult("prolog", job, (), True, (), clock() - start, timeout_s)
    progress = progress if progress is not None else GateProgress("prolog", job, clock=clock)
    progress.job, progress.stage = job, "choosing the job's GPUs"
    indices, unfound = _job_indices(session, job, devices, _setup_bound(timeout_s, deadline), clock, gpu_ids=gpu_ids)
    progress.devices, progress.unfound = indices, unfound
    if not indices:
        return GateResult("prolog", job, (), False, unfound, clock() - start, timeout_s)
    readiness = await_ready(session, indices, deadline_ns=deadline, max_used_bytes=max_used_bytes, clock=clock,
                            sleep=sleep, progress=progress, one_check=timeout_s == 0,
                            units=mig_units(devices or job.gpus))
    return GateResult("prolog", job, indices, readiness.ready and not unfound, readiness.causes + unfound,
                      clock() - start, timeout_s, readiness)


def health(
    session: Session,
    *,
    timeout_s: float,
    devices: Sequence[str] | None = None,
    clean: bool = False,
    max_used_bytes: int = DEFAULT_MAX_USED_BYTES,
    clock: Callable[[], int] = time.monotonic_ns,
    sleep: Callable[[float], object] = time.sleep,
    progress: GateProgress | None = None,
) -> GateResult:
    """The periodic check: the health of every GPU (``devices``: these). Memory and processes are not judged (jobs
    run), unless ``clean``: then the GPUs must be ready as for a prolog, with one check (``timeout_s=0`` waits no
    longer), as before returning a drained, idle node to service. ``progress``: kept up to date
    (:class:`GateProgress`)."""
    from .model import Fields

    start, deadline = _deadline(clock, timeout_s)
    progress = progress if progress is not None else GateProgress("health", clock=clock)
    progress.stage = "choosing the GPUs"
    indices, unfound = _indices(session, devices, _setup_bound(timeout_s, deadline), clock)
    progress.devices, progress.unfound = indices, unfound
    if unfound:
        return GateResult("health", None, (), False, unfound, clock() - start, timeout_s)
    if clean:
        readiness = await_ready(session, indices, deadline_ns=deadline, max_used_bytes=max_used_bytes, clock=clock,
                                sleep=sleep, progress=progress, one_check=timeout_s == 0)
        return GateResult("health", None, indices, readiness.ready, readiness.causes, clock() - start, timeout_s,
                          readiness)
    progress.stage = "reading the GPUs' health"
    try:
        snap = _read(session, Fields.HEALTH, indices, _setup_bound(timeout_s, deadline), clock)
        causes = (health_causes(snap) if snap is not None else
                  [Cause("unknown", f"GPU {', '.join(map(str, indices))}: health not read within the timeout")])
    except NvmlCheckError as exc:
        causes = [Cause("unknown", f"GPU health unreadable: {clean_text(str(exc))}"[:160])]
    return GateResult("health", None, indices, not causes, tuple(causes), clock() - start, timeout_s)


# --- scontrol ------------------------------------------------------------------------------------------------------


#: Where scontrol is looked for when it is not on ``PATH`` (slurmd runs a Prolog/Epilog with no ``PATH``).
SCONTROL_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")


class ScontrolError(NvmlCheckError, OSError):
    """scontrol failed, timed out or printed what cannot be read (also an ``OSError``)."""


class NodeNotFound(ScontrolError):
    """``scontrol show node NAME`` knows no node of that name, or answered with another node's line (or several):
    the name is not one node's. A NodeSet's name looks like a node's, yet ``scontrol update NodeName=SET`` acts on
    every node of the set (Slurm 22.05), so :class:`Scontrol` then changes nothing."""


@dataclass(frozen=True, slots=True)
class ScontrolRun:
    """One scontrol command: ``argv``; ``ran`` (False in a dry run, when it could not be started, or when it was not
    run because its node is not one node's, :class:`NodeNotFound`: ``output`` then says why); ``exit_code``
    (``None``: not run, or cut by the deadline); ``output``: what it printed (stdout and stderr)."""

    argv: tuple[str, ...]
    ran: bool
    exit_code: int | None = None
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.ran and self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        return {"argv": list(self.argv), "ran": self.ran, "exit_code": self.exit_code, "output": self.output}


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as ``scontrol -o show node`` says: ``state`` (``"IDLE+DRAIN"``), its base and flags, the reason."""

    state: str
    reason: str | None

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0]

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state.split("+")[1:])

    @property
    def drained(self) -> bool:
        """Drained or draining."""
        return "DRAIN" in self.flags or self.base in ("DRAINED", "DRAINING")

    @property
    def ours(self) -> bool:
        """Whether nvmlcheck set the reason (:data:`REASON_PREFIX`)."""
        return self.reason is not None and self.reason.startswith(REASON_PREFIX)

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason}


_REASON_TAIL = re.compile(r" \[[^\[\]]*@[^\[\]]*\]$")  # " [root@2026-01-01T00:00:00]"


def parse_node_line(line: str) -> NodeState:
    """``scontrol -o show node NAME``'s one line → :class:`NodeState`; ``ValueError`` without a ``State=``."""
    head, sep, reason = line.strip().partition(" Reason=")
    state = next((item[6:] for item in head.split() if item.startswith("State=")), None)
    if state is None:
        raise ArgumentError(f"no State= in scontrol's output: {line[:200]!r}")
    return NodeState(state, _REASON_TAIL.sub("", reason) if sep else None)


class Scontrol:
    """Runs ``scontrol`` (``path``: this one; default found on ``PATH`` or in :data:`SCONTROL_DIRS`) with a deadline
    and a group kill, or, with ``dry_run``, gives each command to ``echo`` (one shell-quoted line) instead of running
    those that change the node. Every run is kept in :attr:`runs`.

    A name that :meth:`node` found to be no node's (:class:`NodeNotFound`: a NodeSet's name, which ``scontrol update``
    would expand to every node of the set) is never drained or resumed: the run is kept with ``ran`` False and
    ``output`` saying why. Read the node first (as the gate does before every change) to have this check.

    Each scontrol runs in a session of its own (so that one kill reaches what it started), out of reach of a kill of
    this process's group: while it runs, a guard process (:class:`nvmlcheck._proc.guard.Guard`, as a fleet's for its
    ssh clients) stands ready to SIGKILL its group should this process die without doing it (SIGKILL, the OOM
    killer)."""

    def __init__(self, path: str | None = None, *, dry_run: bool = False,
                 echo: Callable[[str], object] | None = None) -> None:
        self.path = path or _find_scontrol()
        self.dry_run = dry_run
        self.echo = echo
        self.runs: list[ScontrolRun] = []
        self._not_a_node: dict[str, str] = {}  # name -> why, from node()

    def drain(self, node: str, reason: str, *, deadline_ns: int) -> ScontrolRun:
        """``scontrol update NodeName=NODE State=DRAIN Reason=REASON``."""
        return self._change(node, (f"NodeName={node}", "State=DRAIN", f"Reason={reason}"), deadline_ns)

    def resume(self, node: str, *, deadline_ns: int) -> ScontrolRun:
        """``scontrol update NodeName=NODE State=RESUME``: undrain."""
        return self._change(node, (f"NodeName={node}", "State=RESUME"), deadline_ns)

    def node(self, node: str, *, deadline_ns: int) -> NodeState:
        """The node's state and reason (read even in a dry run). :class:`NodeNotFound` when scontrol knows no node
        of that name or answers with another's; :class:`ScontrolError` when scontrol fails, times out or prints no
        node line."""
        run = self._run(("-o", "show", "node", node), deadline_ns)
        shown = f"{' '.join(run.argv)}:"
        if not run.ok:
            how = _how_it_failed(run)
            # Slurm's own words, "Node X not found": not a warning that happens to say "not found" (a plugin's).
            if run.exit_code is not None and re.search(r"^Node \S+ not found\b", run.output, re.MULTILINE):
                raise self._no_such_node(node, f"{shown} {how} {clean_text(run.output)[:200]}")
            raise ScontrolError(f"{shown} {how} {run.output.strip()[:200]}".strip())
        lines = [line for line in run.output.splitlines() if line.strip()]
        # The node lines: those with a NodeName=. scontrol's warnings on stderr (a deprecated option in slurm.conf,
        # a plugin's message) are in the output too, and are no other node's line.
        names = [n for n in (next((item[9:] for item in line.split() if item.startswith("NodeName=")), None)
                             for line in lines) if n is not None]
        lines = [line for line in lines if any(item.startswith("NodeName=") for item in line.split())] or lines
        if names and names != [node]:
            listed = ", ".join(_shown(n or "?", 40) for n in names[:4]) + (" …" if len(names) > 4 else "")
            raise self._no_such_node(node, f"{shown} answered for {listed}, not for {node} alone")
        try:
            return parse_node_line(lines[0] if lines else "")
        except ArgumentError as exc:
            raise ScontrolError(str(exc)) from None

    def _no_such_node(self, node: str, why: str) -> NodeNotFound:
        why = (f"{why}: {_shown(node)} is not one node's name (a NodeSet's? scontrol update would act on every node "
               "of it): nothing is changed")
        self._not_a_node[node] = why
        return NodeNotFound(why)

    def _change(self, node: str, args: tuple[str, ...], deadline_ns: int) -> ScontrolRun:
        argv = (self.path or "scontrol", "update", *args)
        refused = self._not_a_node.get(node)
        if refused is not None:
            run = ScontrolRun(argv, False, None, f"not run: {refused}")
            self.runs.append(run)
            return run
        if self.dry_run:
            import shlex

            run = ScontrolRun(argv, False)
            self.runs.append(run)
            if self.echo is not None:
                self.echo(shlex.join(argv))
            return run
        return self._run(("update", *args), deadline_ns)

    def _run(self, args: tuple[str, ...], deadline_ns: int) -> ScontrolRun:
        argv = (self.path or "scontrol", *args)
        if self.path is None:
            run = ScontrolRun(argv, False, None, "scontrol not found on PATH nor in " + ", ".join(SCONTROL_DIRS))
        else:
            run = _run_child(argv, deadline_ns)
        self.runs.append(run)
        return run


#: After scontrol exited, how long its pipes are still read when something it left behind holds them open (a
#: daemonised helper): what scontrol printed before its exit is in the pipe by then, and the wait ends at its end of
#: file when nothing holds them.
_AFTER_EXIT_S = 0.1
#: After SIGKILL (at the deadline, or when this process is interrupted), how long past the deadline the leader's exit
#: is waited for, in ns: one of Child's 50 ms slices, not its REAP_GRACE_S (a second past the deadline per call). A
#: pidfd shows the exit at once; only a leader in uninterruptible sleep takes all of it, and is then left.
_KILL_REAP_NS = 50_000_000


def _run_child(argv: tuple[str, ...], deadline_ns: int) -> ScontrolRun:
    """Run ``argv`` until ``deadline_ns`` (``time.monotonic_ns()``), then kill its process group.

    As a fleet runs its ssh children (:mod:`nvmlcheck.hosts`): the child is started and waited for in a worker thread
    while this thread waits for the worker. The CLI raises SIGTERM (slurmd's, at its timeout), SIGHUP and Ctrl-C as
    exceptions in the main thread only, so none can cut the start between the fork and the moment the child is known
    (it would run on, unkilled); here the exception stops the worker, which kills the group, before it goes on."""
    import threading

    from ._proc.child import REAP_GRACE_S

    stop, finished = threading.Event(), threading.Event()
    started: list[Child] = []
    out: list[ScontrolRun | BaseException] = []

    def work() -> None:
        try:
            out.append(_run_until(argv, deadline_ns, stop.is_set, started))
        except BaseException as exc:  # handed to the caller's thread
            out.append(exc)
        finally:
            finished.set()

    # An event, not Thread.join: a join that an exception interrupts can mark the thread stopped while it runs
    # (bpo-45274's handling in Python 3.11), and a later join then returns at once.
    try:
        threading.Thread(target=work, name="nvmlcheck-scontrol", daemon=True).start()
        while not finished.wait(0.05):  # bounded, as a fleet waits: a signal's handler runs here within a slice
            pass
    except BaseException:
        stop.set()  # a child not started yet is killed by the worker as soon as it is
        for child in started:
            child.signal_group()
        finished.wait(2 * REAP_GRACE_S)  # bounded: a leader stuck in uninterruptible sleep is left
        raise
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def _run_until(argv: tuple[str, ...], deadline_ns: int, should_stop: Callable[[], bool],
                started: list[Child]) -> ScontrolRun:
    """The worker of :func:`_run_child`: start ``argv`` (appended to ``started``), read it until it exits, the
    deadline comes or ``should_stop()``; kill its group if it was not reaped by then. A guard process watches it
    meanwhile (this process may be SIGKILLed), and is dismissed once it is reaped; a leader that could not be reaped
    (uninterruptible sleep) is left to the guard, which SIGKILLs its group when this process ends."""
    from ._proc.child import Child
    from ._proc.guard import Guard

    guard = Guard()
    try:
        child = Child(argv, after_exit_s=_AFTER_EXIT_S, guard=guard)
    except OSError as exc:
        guard.dismiss(wait=False)
        return ScontrolRun(argv, False, None, str(exc))
    started.append(child)
    done = False
    try:
        done = child.wait(deadline_ns, should_stop=should_stop)
    finally:
        if child.returncode is None:  # the deadline came, or the caller is being interrupted
            child.kill(read_after_exit=False, deadline_ns=deadline_ns + _KILL_REAP_NS)
        child.close()
        if child.returncode is not None:
            guard.dismiss(wait=False)  # it ends by itself: the gate does not wait for an interpreter's start
    code = child.returncode
    # An exit of its own (>= 0) before the kill counts even when the deadline cut the reading of its pipes; a
    # SIGKILL of ours (< 0) is no answer.
    exit_code = code if code is not None and (done or code >= 0) else None
    return ScontrolRun(argv, True, exit_code, (bytes(child.stdout) + bytes(child.stderr)).decode(errors="replace"))


def _how_it_failed(run: ScontrolRun) -> str:
    """``"not started:"`` (no such file, not executable: it never ran, so it cannot have timed out), ``"timed out"``
    or ``"exit N"``."""
    if not run.ran:
        return "not started:"
    return "timed out" if run.exit_code is None else f"exit {run.exit_code}"


def _find_scontrol() -> str | None:
    found = shutil.which("scontrol")
    if found:
        return found
    return next((f"{d}/scontrol" for d in SCONTROL_DIRS if os.access(f"{d}/scontrol", os.X_OK)), None)


def node_name(given: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The node to drain: ``given``, else ``$SLURMD_NODENAME``, else the short host name. ``ArgumentError`` (a
    ``ValueError``, naming where it came from) for what is not one node's name (:func:`check_node_name`)."""
    env = os.environ if env is None else env
    if given is not None:  # --node "" is a usage error, not "no --node": the gate would act on another name
        return check_node_name(given, "--node")
    if env.get("SLURMD_NODENAME"):
        return check_node_name(env["SLURMD_NODENAME"], "$SLURMD_NODENAME")
    import socket

    return check_node_name(socket.gethostname().split(".")[0], "the host name")


def check_node_name(name: str, source: str = "the node name") -> str:
    """``name`` if it names one node, else ``ArgumentError`` naming ``source``. scontrol reads ``NodeName=`` as a
    hostlist expression: ``n1,n2`` or ``gpu[01-64]`` would drain (or resume) other nodes than this one, and a name
    starting with ``-`` would be read as an option; so a comma, a bracket, ``=``, a space or a control character,
    a leading ``-`` and the empty name are refused; so is ``ALL``, which scontrol's update takes as every node of the
    cluster."""
    bad = [c for c in name if c in ",[]=" or not "!" <= c <= "~"]
    if not name or name.startswith("-") or bad or len(name) > 255 or name.upper() == "ALL":
        why = (f"{_shown(''.join(dict.fromkeys(bad)))} in it" if bad else "empty" if not name else
               "it starts with '-'" if name.startswith("-") else
               "scontrol reads ALL as every node" if name.upper() == "ALL" else "longer than 255 characters")
        raise ArgumentError(f"{source}={_shown(name)} is not one node's name ({why}): scontrol would act on other "
                            "nodes, or read it as an option")
    return name

