"""A one-node Slurm cluster on this machine, whose GPUs are the simulator's: munged, slurmctld and slurmd started by
the tests (no systemd), everything under one temporary directory.

The directory holds the munge key and socket, ``slurm.conf`` (``SLURM_CONF``), ``gres.conf`` whose ``File=`` lines
name character devices made with ``mknod`` (Slurm refuses plain files: "is not a valid character or block device",
and the job then gets no ``SLURM_JOB_GPUS``), the state, spool and log directories, the scenario file the simulated
GPUs read (``scenario.txt``), and the Prolog, Epilog and HealthCheckProgram wrappers. Slurm runs those with no
``PATH`` and no arguments (docs/slurm.md), so each wrapper is a small shell script that runs this checkout's
``python -m nvmlcheck --simulate SCENARIO slurm …`` with ``--record records.jsonl`` (one JSON line per run: what the
tests assert on). The health wrapper does nothing unless ``health.on`` exists, so that the periodic check acts only in
the test that switches it on.

Every daemon runs in the foreground as a child of this process, in its own session; :meth:`Lab.stop` ends them
(SIGTERM, then SIGKILL after a bound), kills whatever else still carries the lab's tag in its environment (job
processes, slurmstepd), removes the cgroups Slurm made, and returns what it had to kill, so a test can fail on a leak.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel")
#: The environment variable that marks every process the lab starts (and, through the jobs' environment, every job
#: process): the leak check at teardown looks for it.
TAG = "NVMLCHECK_SLURM_LAB"
#: The simulated GPUs, and the PIDs the stub scenario file may name.
GPUS = 2
#: A NodeSet of the lab's node: its name reads like a node's, and ``scontrol update`` expands it.
NODESET = "labset"


def _which(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}", f"/usr/local/sbin/{name}") if os.access(p, os.X_OK)),
        None)


def unavailable_reason() -> str | None:
    """Why the lab cannot run here, or None."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if _which(name) is None]
    if missing:
        return (f"Slurm or munge not installed ({', '.join(missing)} missing): apt-get install slurmctld slurmd "
                "slurm-client munge (.ci/run does this)")
    if os.geteuid() != 0:
        return "the Slurm lab runs as root (slurmd, SlurmUser=root, mknod for the GPU device files)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tagged(pid: int, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{TAG}={tag}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def tagged_processes(tag: str) -> list[int]:
    """Live processes (not zombies) whose environment carries the lab's tag, this process excluded."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _tagged(int(entry), tag) and _alive(int(entry)):
            found.append(int(entry))
    return found


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, step_s: float = 0.1) -> Any:
    """Poll ``check`` until it returns something truthy (returned); AssertionError naming ``what`` after the bound."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(step_s)


@dataclass
class Lab:
    """One cluster: its directory, node name and daemons."""

    directory: Path
    node: str
    proctrack: str
    tag: str = field(init=False)
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: The lab's processes once it was up (:meth:`stragglers` reports the others).
    baseline: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        self.tag = str(self.directory)

    # --- paths ---------------------------------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def scenario(self) -> Path:
        return self.directory / "scenario.txt"

    @property
    def records(self) -> Path:
        return self.directory / "records.jsonl"

    @property
    def jobs(self) -> Path:
        """A directory job scripts write to (their PID files)."""
        return self.directory / "jobs"

    def env(self) -> dict[str, str]:
        """The environment for Slurm's client commands and the jobs they submit (tagged)."""
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": str(self.conf),
                TAG: self.tag, "HOME": str(self.directory), "LANG": "C.UTF-8"}

    # --- commands ------------------------------------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(argv), capture_output=True, text=True, env=self.env(), timeout=timeout,
                              cwd=self.directory, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stdout}{done.stderr}")
        return done

    def node_info(self) -> dict[str, str]:
        """``scontrol -o show node``, as key=value pairs (the reason is the rest of the line after ``Reason=``)."""
        line = self.run("scontrol", "-o", "show", "node", self.node).stdout.strip()
        info: dict[str, str] = {}
        head, _, reason = line.partition(" Reason=")
        for item in head.split():
            key, _, value = item.partition("=")
            info[key] = value
        if reason:
            info["Reason"] = reason.split(" [", 1)[0]  # "text [root@2026-01-01T00:00:00]"
        return info

    def node_state(self) -> str:
        return self.node_info().get("State", "?")

    def job_info(self, job_id: int) -> dict[str, str]:
        line = self.run("scontrol", "-o", "show", "job", str(job_id), check=False).stdout.strip()
        return dict(item.partition("=")[::2] for item in line.split() if "=" in item)

    def sbatch(self, script: str, *options: str) -> int:
        """Submit ``script`` (the body of a ``/bin/sh`` batch script) on one GPU; returns the job ID."""
        path = self.jobs / f"job-{time.monotonic_ns()}.sh"
        path.write_text("#!/bin/sh\n" + script, encoding="utf-8")
        path.chmod(0o755)
        out = self.run("sbatch", "--parsable", "-t", "1", "-o", str(self.jobs / "slurm-%j.out"), *options,
                       str(path)).stdout
        return int(out.strip().split(";")[0])

    def wait_job_done(self, job_id: int, timeout_s: float = 30) -> dict[str, str]:
        """Wait until the job has ended and its epilog has run (the node no longer COMPLETING); returns the job."""
        def done() -> dict[str, str] | None:
            job = self.job_info(job_id)
            if job.get("JobState") in (None, "PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
                return None
            return job if "COMPLETING" not in self.node_state() else None
        result: dict[str, str] = wait_for(f"job {job_id} to end", done, timeout_s)
        return result

    def wait_node(self, predicate: Callable[[str], bool], what: str, timeout_s: float = 20) -> str:
        """Wait until the node's state satisfies ``predicate``; returns it."""
        def check() -> str | None:
            state = self.node_state()
            return state if predicate(state) else None
        result: str = wait_for(f"node {self.node} {what}", check, timeout_s)
        return result

    def resume(self) -> None:
        """Return the node to service (whatever drained it) and clear the records and the health switch."""
        (self.directory / "health.on").unlink(missing_ok=True)
        if "DRAIN" in self.node_state():
            self.run("scontrol", "update", f"NodeName={self.node}", "State=RESUME")
        self.wait_node(lambda s: "DRAIN" not in s and s.startswith("IDLE"), "idle")
        self.records.unlink(missing_ok=True)

    def read_records(self, command: str | None = None) -> list[dict[str, Any]]:
        """The JSON lines the wrappers' ``--record`` wrote (for ``command`` only, when given)."""
        if not self.records.exists():
            return []
        docs = [json.loads(line) for line in self.records.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [d for d in docs if command is None or d.get("command") == command]

    def health(self, on: bool) -> None:
        """Let the periodic HealthCheckProgram act (it exits at once while this is off)."""
        switch = self.directory / "health.on"
        if on:
            switch.touch()
        else:
            switch.unlink(missing_ok=True)

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "munged.log"):
            path = self.directory / "log" / name
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stragglers(self) -> list[str]:
        """Live processes of the lab other than those it had once up (the daemons and their helpers, such as
        slurmctld's slurmscriptd): job processes, step daemons; as ``pid: command``."""
        return [f"{pid}: {_cmdline(pid)}" for pid in tagged_processes(self.tag) if pid not in self.baseline]

    def settle(self, timeout_s: float = 15) -> list[str]:
        """Wait until only the daemons are left (a finished job's step daemon exits a moment after the job); returns
        what is still there after the bound."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.stragglers()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.1)

    # --- teardown ------------------------------------------------------------------------------------------------
    def stop(self) -> list[str]:
        """Stop every daemon and every process carrying the lab's tag; returns the command lines of the processes
        that were still alive after the daemons had stopped (a leak, unless empty)."""
        for name in reversed(DAEMONS):  # slurmd first: it stops its job steps
            proc = self.daemons.get(name)
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(5)
        leaked = []
        for _ in range(3):  # a dying slurmstepd may still fork; bounded
            pids = tagged_processes(self.tag)
            if not pids:
                break
            for pid in pids:
                leaked.append(f"{pid}: {_cmdline(pid)}")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        self._remove_cgroups()
        return leaked

    def _remove_cgroups(self) -> None:
        """Remove the (empty) cgroups proctrack/cgroup made for this node, deepest first; best effort."""
        root = Path("/sys/fs/cgroup")
        for top in [*root.glob(f"*/slurm_{self.node}"), *root.glob(f"*/slurm_{self.node}_lab"), root / "unified" /
                    f"slurm_{self.node}"]:
            if not top.is_dir():
                continue
            for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    path.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


def _cgroup_v1_freezer() -> bool:
    """Whether proctrack/cgroup can work here: a writable cgroup v1 freezer hierarchy (cgroup v2 needs systemd's
    dbus in Slurm 22.05, which this lab does not run)."""
    freezer = Path("/sys/fs/cgroup/freezer")
    return (freezer / "cgroup.procs").exists() and os.access(freezer, os.W_OK)


def _write_wrappers(lab: Lab, stub_cache: str, timeouts: dict[str, float]) -> dict[str, Path]:
    bin_dir = lab.directory / "bin"
    bin_dir.mkdir()
    wrappers = {}
    common = (
        "#!/bin/sh\n"
        "# Slurm runs this with no PATH and no arguments.\n"
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin; export PATH\n"
        f"SLURM_CONF={lab.conf}; export SLURM_CONF\n"
        f"PYTHONPATH={ROOT}; export PYTHONPATH\n"
        f"NVMLCHECK_STUB_CACHE={stub_cache}; export NVMLCHECK_STUB_CACHE\n"
        f"{TAG}={lab.tag}; export {TAG}\n"
    )
    for command, timeout in timeouts.items():
        gate = f"[ -e {lab.directory / 'health.on'} ] || exit 0\n" if command == "health" else ""
        path = bin_dir / f"nvmlcheck-{command}"
        path.write_text(
            common + gate
            + f"exec {sys.executable} -m nvmlcheck --simulate {lab.scenario} slurm {command} --timeout {timeout} "
              f"--record {lab.records}\n",
            encoding="utf-8")
        path.chmod(0o755)
        wrappers[command] = path
    return wrappers


def _write_config(lab: Lab, wrappers: dict[str, Path], prolog_epilog_timeout: int = 30) -> None:
    d = lab.directory
    for sub in ("ctld", "spool", "log", "dev", "jobs"):
        (d / sub).mkdir()
    (d / "jobs").chmod(0o1777)
    for index in range(GPUS):
        os.mknod(d / "dev" / f"nvidia{index}", 0o666 | 0o020000, os.makedev(195, index))  # S_IFCHR
    cpus = os.cpu_count() or 1
    lab.conf.write_text(f"""\
# A one-node test cluster (tests/slurm/slurmlab.py).
ClusterName=nvmltest
SlurmctldHost={lab.node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d / 'munge' / 'munge.socket'}
StateSaveLocation={d / 'ctld'}
SlurmdSpoolDir={d / 'spool'}
SlurmctldPidFile={d / 'slurmctld.pid'}
SlurmdPidFile={d / 'slurmd.pid'}
SlurmctldLogFile={d / 'log' / 'slurmctld.log'}
SlurmdLogFile={d / 'log' / 'slurmd.log'}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType={lab.proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=2
MinJobAge=300
PrologEpilogTimeout={prolog_epilog_timeout}
Prolog={wrappers['prolog']}
Epilog={wrappers['epilog']}
HealthCheckProgram={wrappers['health']}
HealthCheckInterval=1
NodeName={lab.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 Gres=gpu:{GPUS} State=UNKNOWN
NodeSet={NODESET} Nodes={lab.node}
PartitionName=gpu Nodes={lab.node} Default=YES MaxTime=INFINITE State=UP
""", encoding="utf-8")
    (d / "gres.conf").write_text(
        f"AutoDetect=off\nNodeName={lab.node} Name=gpu File={d / 'dev'}/nvidia[0-{GPUS - 1}]\n", encoding="utf-8")
    (d / "cgroup.conf").write_text("CgroupPlugin=autodetect\n", encoding="utf-8")


def _start(lab: Lab, name: str, argv: list[str]) -> None:
    env = {**lab.env(), "SLURM_CONF": str(lab.conf)}
    with open(lab.directory / "log" / f"{name}.out", "wb") as out:  # the child keeps its own descriptor
        lab.daemons[name] = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env=env, cwd=lab.directory, start_new_session=True)


def _check_running(lab: Lab) -> None:
    for name, proc in lab.daemons.items():
        if proc.poll() is not None:
            out = (lab.directory / "log" / f"{name}.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited {proc.returncode}: {out}\n{lab.log_tail()}")


def start(directory: Path, stub_cache: str, *, timeouts: dict[str, float], prolog_epilog_timeout: int = 30) -> Lab:
    """Configure and start the cluster; returns once the node is IDLE. RuntimeError (with the daemons' logs) when
    it does not come up within a bound; the caller stops the lab either way. ``timeouts``: each wrapper's
    ``--timeout``; ``prolog_epilog_timeout``: slurm.conf's ``PrologEpilogTimeout`` (seconds)."""
    node = socket.gethostname().split(".")[0]
    lab = Lab(directory, node, "proctrack/cgroup" if _cgroup_v1_freezer() else "proctrack/linuxproc")
    try:
        _setup(lab, stub_cache, timeouts, prolog_epilog_timeout)
    except BaseException:
        lab.stop()
        raise
    return lab


def _setup(lab: Lab, stub_cache: str, timeouts: dict[str, float], prolog_epilog_timeout: int = 30) -> None:
    d = lab.directory
    munge = d / "munge"
    munge.mkdir(mode=0o700)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    _write_config(lab, _write_wrappers(lab, stub_cache, timeouts), prolog_epilog_timeout)
    _start(lab, "munged", [str(_which("munged")), "--foreground", "--force", f"--key-file={key}",
                           f"--socket={munge / 'munge.socket'}", f"--pid-file={munge / 'munged.pid'}",
                           f"--log-file={d / 'log' / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"])
    def munged_up() -> bool:
        _check_running(lab)
        return (munge / "munge.socket").exists()
    wait_for("munged's socket", munged_up, 10)
    _start(lab, "slurmctld", [str(_which("slurmctld")), "-D", "-i", "-f", str(lab.conf)])
    def ctld_up() -> bool:
        _check_running(lab)
        return lab.run("scontrol", "ping", check=False, timeout=5).returncode == 0
    wait_for("slurmctld to answer", ctld_up, 20, 0.2)
    _start(lab, "slurmd", [str(_which("slurmd")), "-D", "-f", str(lab.conf), "-N", lab.node])

    def idle() -> bool:
        _check_running(lab)
        state = lab.run("sinfo", "-h", "-n", lab.node, "-o", "%T", check=False, timeout=5).stdout.strip()
        return state == "idle"
    wait_for(f"node {lab.node} to be idle", idle, 30, 0.2)
    lab.baseline = frozenset(tagged_processes(lab.tag))


@contextlib.contextmanager
def running(directory: Path, stub_cache: str, *, timeouts: dict[str, float]) -> Iterator[Lab]:
    """The lab while the block runs; stopped after, also on failure or KeyboardInterrupt."""
    lab = start(directory, stub_cache, timeouts=timeouts)
    try:
        yield lab
    finally:
        lab.stop()
