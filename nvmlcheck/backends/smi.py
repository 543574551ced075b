"""The nvidia-smi backend: runs ``nvidia-smi`` (optionally behind a prefix such as ``ssh gpu01``) and parses its output.

Use it where libnvidia-ml cannot be loaded here, or where the GPUs are on another host or in a container::

    SmiBackend()                                              # nvidia-smi on PATH
    SmiBackend(prefix="ssh -o BatchMode=yes gpu01")           # the remote shell runs it (arguments are quoted)
    SmiBackend(prefix=["pct", "exec", "129", "--"])           # argv passed through as is (no quoting)

:class:`SmiRunner` runs it (argv only, a deadline per run, the process group killed at it); :func:`classify_failure`
turns a failed run into one exception class. Which runs a snapshot makes and why, how failures are classified and
how deadlines pass down: docs/backends.md ("The nvidia-smi backend").
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import shlex
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Final, Literal

from .._proc.child import REAP_GRACE_S, Child
from .._text import is_digits
from ..errors import (
    ArgumentError,
    ArgumentTypeError,
    BackendUnavailable,
    CorruptData,
    DeadlinePassed,
    DriverNotLoaded,
    GpuLost,
    InvalidArgument,
    LibraryNotFound,
    LibraryVersionMismatch,
    NoPermission,
    NotFound,
    NvmlCheckError,
    NvmlError,
    SmiError,
    SmiParseError,
    SmiTimeout,
    SmiTransportError,
    SmiTransportTimeout,
    error_class_for_code,
)
from ..model import DeviceFailure, DeviceState, Fields, ProcessKind, RetiredPage, Snapshot, SystemInfo, unknown_key
from . import SMI_RUN_TIMEOUT_S
from ._driver_procfs import GPUS_DIR, normal_bus_id, read_driver_gpus
from ._smi.pids import parse_pids_query
from ._smi.queries import ECC_COLUMNS, GpuRecord, parse_compute_apps, parse_query_gpu, parse_retired_pages
from ._smi.small import cuda_version_number, parse_list_gpus, parse_version_output
from ._smi.ssh import ssh_dropped, ssh_failure
from ._smi.text import HandleFailure, has_handle_failure
from ._smi_state import ProcessLists, build_device_state

if TYPE_CHECKING:
    from .._deadline import Deadline
    from .._proc.guard import Guard

__all__ = ["DEFAULT_TIMEOUT_S", "SmiBackend", "SmiResult", "SmiRunner", "classify_failure"]

#: Seconds one nvidia-smi run may take before its process group is killed.
DEFAULT_TIMEOUT_S: Final = SMI_RUN_TIMEOUT_S

ProcessQuery = Literal["pids", "compute-apps"]


def _words(value: Sequence[str] | str | None, default: Sequence[str]) -> tuple[str, ...]:
    """A command given as a list is used as is; a string is split like a POSIX shell would (no shell runs it)."""
    if value is None:
        return tuple(default)
    try:
        words = tuple(shlex.split(value)) if isinstance(value, str) else tuple(value)
    except ValueError as exc:  # an unclosed quote: the caller's argument, not a failure of nvidia-smi
        raise ArgumentError(f"command {value!r} does not split into words: {exc}") from None
    if not all(isinstance(w, str) for w in words):
        raise ArgumentTypeError(f"command words must be strings, got {value!r}")
    if any("\x00" in w for w in words):  # the OS refuses it with a bare ValueError ("embedded null byte")
        raise ArgumentError(f"command {value!r} holds a NUL character, which no command argument can")
    return words


def _infer_prefix_shell(prefix: Sequence[str]) -> bool:
    """ssh joins its command arguments with spaces and hands the line to the remote user's shell, so each word must be
    quoted for that shell; ``pct exec ... --``, ``docker exec``, ``sudo`` and ``env`` pass argv through untouched and
    must not be quoted (the quotes would arrive literally). Any prefix word named ``ssh`` (``ssh``, ``sshpass -p x
    ssh``, ``sudo -u u ssh``) therefore means a remote shell."""
    return any(os.path.basename(w) == "ssh" for w in prefix)


@dataclass(frozen=True, slots=True)
class SmiResult:
    """One finished run. ``argv`` is what was executed (prefix and quoting included), ``command`` the nvidia-smi words
    before quoting (for messages)."""

    argv: tuple[str, ...]
    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    elapsed_ns: int

    @property
    def output(self) -> str:
        """stdout and stderr together: nvidia-smi prints its errors on stdout, shells and ssh on stderr."""
        return f"{self.stdout}\n{self.stderr}".strip()


class _Batch:
    """Runs started together. The first kill SIGKILLs every one still running and starts one reap grace they all
    share: a batch stuck past its deadline (a wedged GPU's nvidia-smi runs in uninterruptible sleep, or a helper
    holding their pipes) costs the caller one grace, not one per run."""

    def __init__(self) -> None:
        self.runs: list[_Running] = []
        self.reap_by_ns: int | None = None

    def reap_deadline(self) -> int:
        if self.reap_by_ns is None:
            for run in self.runs:
                if run.proc.returncode is None:
                    run.child.signal_group()  # SIGKILL: their graces run side by side
            self.reap_by_ns = time.monotonic_ns() + int(REAP_GRACE_S * 1e9)
        return self.reap_by_ns


class _Running:
    """A started run; :meth:`wait` returns its result or kills its process group at the deadline.

    The process is a :class:`~nvmlcheck._proc.child.Child`: both pipes and the exit are watched with one selector.
    """

    def __init__(
        self, runner: SmiRunner, command: tuple[str, ...], argv: tuple[str, ...], timeout_s: float | None = None
    ) -> None:
        self.command = command
        self.argv = argv
        self.timeout_s = runner.timeout_s if timeout_s is None else timeout_s
        self.started_ns = time.monotonic_ns()
        self.deadline_ns = self.started_ns + int(self.timeout_s * 1e9)
        try:
            # A new session makes the child a process-group leader, so a timeout can kill everything it started (ssh
            # and its helpers, a shell and nvidia-smi) with one killpg. The output is read to its end (after_exit_s
            # None), bounded by the deadline.
            self.child = Child(argv, env=runner.env, guard=runner.guard)
        except OSError as exc:
            raise SmiTransportError(argv, None, str(exc), _cannot_start(argv[0], exc)) from exc
        self.proc = self.child.proc
        self.batch: _Batch | None = None  # set by SmiRunner.run_many

    def wait(self) -> SmiResult:
        if not self.child.wait(self.deadline_ns):
            err_text = self.kill()
            if self.child.overflow is not None:  # a flood (a broken or hostile host behind --smi-prefix): bounded
                raise SmiError(self.argv, None, err_text, f"printed more than {self.child.max_output_bytes} bytes on "
                                                          f"{self.child.overflow}: killed")
            raise SmiTimeout(self.argv, self.timeout_s, err_text)
        return SmiResult(
            self.argv,
            self.command,
            self.proc.returncode,
            self.child.stdout.decode("utf-8", "replace"),
            self.child.stderr.decode("utf-8", "replace"),
            time.monotonic_ns() - self.started_ns,
        )

    def kill(self) -> str:
        """Kill the whole process group and reap the leader; returns what it had printed on stderr."""
        # A process outside the group may hold our pipes, or the leader be stuck in uninterruptible sleep (a wedged
        # GPU): the kill stops reading after its grace and leaves it; blocking here would hang the caller with it.
        reaped = self.child.kill(deadline_ns=self.batch.reap_deadline() if self.batch is not None else None)
        note = "" if reaped else " (it did not exit after SIGKILL: uninterruptible sleep?)"
        return self.child.stderr.decode("utf-8", "replace") + note


class SmiRunner:
    """Builds argv lists and runs nvidia-smi with a deadline. Never a local shell.

    ``command``: the nvidia-smi executable and any fixed leading arguments (list, or a string split with
    :func:`shlex.split`); default ``nvidia-smi`` found on PATH (the remote PATH when a prefix is used).
    ``prefix``: words put before it (``"ssh -o BatchMode=yes gpu01"``, ``["pct", "exec", "129", "--"]``).
    ``prefix_shell``: whether the prefix hands the rest to a shell that splits words, so every word after the prefix is
    quoted with :func:`shlex.quote`. Default: ``True`` when a prefix word is ``ssh``, else ``False``.
    ``timeout_s``: the deadline of each run (default 10 s); at the deadline the whole process group gets SIGKILL.
    ``env``: the environment of the child (default: inherited). ``guard``: a guard process
    (:class:`nvmlcheck._proc.guard.Guard`) told of each run, which ends it should this process be SIGKILLed (a fleet's
    runs over ssh).
    """

    def __init__(
        self,
        command: Sequence[str] | str | None = None,
        prefix: Sequence[str] | str | None = None,
        timeout_s: float | None = None,
        *,
        prefix_shell: bool | None = None,
        env: Mapping[str, str] | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.command = _words(command, ("nvidia-smi",))
        if not self.command:
            raise ArgumentError("command must name the nvidia-smi executable")
        self.prefix = _words(prefix, ())
        self.prefix_shell = _infer_prefix_shell(self.prefix) if prefix_shell is None else prefix_shell
        timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
        if not math.isfinite(timeout) or timeout <= 0:
            raise ArgumentError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.timeout_s = timeout
        self.env = dict(env) if env is not None else None
        # A fleet's guard process (nvmlcheck._proc.guard): should this process be SIGKILLed, it ends the runs (an ssh
        # to a host) that would otherwise live on.
        self.guard = guard

    def argv_for(self, args: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(argv to execute, the unquoted nvidia-smi words) for nvidia-smi ``args``."""
        words = (*self.command, *args)
        if self.prefix and self.prefix_shell:
            return (*self.prefix, *(shlex.quote(w) for w in words)), words
        return (*self.prefix, *words), words

    def start(self, args: Sequence[str], timeout_s: float | None = None) -> _Running:
        """Start one run (its deadline starts now): ``timeout_s`` replaces the runner's own for this run."""
        argv, words = self.argv_for(args)
        return _Running(self, words, argv, timeout_s)

    def run(self, args: Sequence[str], timeout_s: float | None = None) -> SmiResult:
        """Run nvidia-smi ``args`` to completion or the deadline (``timeout_s``, default the runner's). Returns any
        exit status; raises only :class:`~nvmlcheck.SmiTimeout` and :class:`~nvmlcheck.SmiTransportError` (could
        not start)."""
        running = self.start(args, timeout_s)
        try:
            return running.wait()
        finally:
            # Interrupted (KeyboardInterrupt in the wait): kill and reap it, so no process or pipe is left behind.
            if running.proc.returncode is None:
                running.kill()

    def run_many(self, arg_lists: Sequence[Sequence[str]], timeout_s: float | None = None) -> list[SmiResult]:
        """Start every run at once and wait for all (each with its own deadline, ``timeout_s`` or the runner's). If
        one fails to start or times out, the others are killed too, so nothing is left behind."""
        running: list[_Running] = []
        batch = _Batch()
        try:
            for args in arg_lists:
                running.append(self.start(args, timeout_s))
                running[-1].batch = batch
                batch.runs.append(running[-1])
            return [r.wait() for r in running]
        finally:
            for r in running:
                if r.proc.returncode is None:
                    r.kill()


# --- classifying failures ---------------------------------------------------------------------------------------------

_NO_DRIVER_TEXT = "couldn't communicate with the nvidia driver"
_MISMATCH_TEXT = "driver/library version mismatch"
_NO_DEVICES_TEXT = "no devices were found"
_UNKNOWN_CODE: Final = 999  # NVML_ERROR_UNKNOWN


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def classify_failure(result: SmiResult, *, prefixed: bool = False) -> NvmlCheckError | None:
    """The exception a failed run stands for, or ``None`` when it succeeded (exit 0).

    nvidia-smi's exit statuses are NVML return codes (2 invalid argument, 4 no permission, 6 not found, 9 driver not
    loaded, 12 library not found, 15 GPU lost, 18 driver/library mismatch, 255 other); its messages go to stdout. With
    a prefix, 255 is ssh's own failure and 126/127 a remote shell's "not executable"/"not found": transport errors.
    Only the class is picked here; whether a wait retries it is the class's ``TRANSIENT`` (errors.py): the NVML
    code's, a plain :class:`~nvmlcheck.SmiError` (a refused or failed run) transient, a transport error fatal.
    """
    rc = result.returncode
    if rc == 0:
        return None
    text = result.output
    low = text.lower()
    cmd = shlex.join(result.command)
    detail = _first_line(text)
    smi = SmiError(result.argv, rc, text, f"nvidia-smi exited with status {rc}")
    error: NvmlCheckError
    if _NO_DRIVER_TEXT in low or (rc == 9 and not prefixed):
        error = DriverNotLoaded(9, cmd, detail=detail)
    elif _MISMATCH_TEXT in low or rc == 18:
        error = LibraryVersionMismatch(18, cmd, detail=detail)
    elif prefixed and rc == 255 and (failed := _prefix_failure(result, text)) is not None:
        return failed
    elif prefixed and rc == 1:
        # nvidia-smi never exits 1 (NVML_ERROR_UNINITIALIZED) on its own; a prefix (or what it ran) fails so.
        return SmiTransportError(result.argv, rc, text, f"the command prefix failed, or ran no nvidia-smi (exit 1: "
                                                        f"{detail or 'no output'})")
    elif rc in (126, 127):
        what = "was not found" if rc == 127 else "could not be executed"
        return SmiTransportError(result.argv, rc, text, f"{result.command[0]} {what} (exit {rc})")
    elif rc == 9:
        error = DriverNotLoaded(9, cmd, detail=detail)
    elif rc == 12:
        error = LibraryNotFound(12, cmd, detail=detail)
    elif _NO_DEVICES_TEXT in low or rc == 6:
        error = NotFound(6, cmd, detail=detail or "No devices were found")
    elif rc == 4:
        error = NoPermission(4, cmd, detail=detail)
    elif rc == 2 or (rc == 255 and _refused_arguments(low)):
        return SmiError(result.argv, rc, text, f"nvidia-smi refused the command (exit {rc})")
    else:
        # nvidia-smi's 255 is "other error or internal driver error" (its man page): NVML's Unknown, as the library
        # answers the same failure ("Failed to initialize NVML: Unknown Error", nvidia-docker #1671).
        code = _UNKNOWN_CODE if rc == 255 else rc
        error = error_class_for_code(code)(code, cmd, detail=detail or (f"nvidia-smi exited with status {rc}"
                                                                         if rc == 255 else detail))
    error.__cause__ = smi
    return error


_REFUSED_TEXTS: Final = ("invalid combination of input arguments", "is not a valid field to query",
                          "nvidia-smi -h")


def _refused_arguments(low: str) -> bool:
    """Whether nvidia-smi's output says it refused its arguments (a usage error), not that NVML failed."""
    return any(t in low for t in _REFUSED_TEXTS)


def _prefix_failure(result: SmiResult, text: str) -> SmiTransportError | None:
    """ssh's own failure (exit 255), read from the end of its stderr as a fleet reads it (a login banner comes first),
    so that the same failure is the same class either way: its connect timeout transient
    (:class:`~nvmlcheck.SmiTransportTimeout`, as a fleet's ``HostTimeout``), the rest not. ``None``: not ssh's
    failure but nvidia-smi's own exit 255 passed on by ssh (``Failed to initialize NVML: Unknown Error``): it
    printed on stdout, so ssh had connected and the command ran, and ssh's last line does not say the connection
    dropped (a login banner on stderr may say anything: it is not ssh's word)."""
    if result.stdout.strip() and not ssh_dropped(result.stderr):
        return None
    kind, line = ssh_failure(result.stderr or text)
    if kind == "timeout":
        return SmiTransportTimeout(result.argv, result.returncode, text,
                                   f"the command prefix timed out connecting ({line})")
    return SmiTransportError(result.argv, result.returncode, text,
                             f"the command prefix failed (ssh exits 255 on its own errors; here: {line})")


@contextlib.contextmanager
def _parsing(result: SmiResult) -> Iterator[None]:
    """Parse errors name the command whose output could not be read (the pure parser does not know it)."""
    try:
        yield
    except SmiParseError as exc:
        raise SmiParseError(exc.reason, exc.line_no, exc.line, result.argv) from None


def _legacy_ids(uuid: str) -> tuple[int, int] | None:
    """``(GI, CI)`` of a MIG name of drivers before R470 (``MIG-GPU-<uuid>/<GI>/<CI>``); ``None`` for a ``MIG-``
    UUID, which carries no ids."""
    parts = uuid.rsplit("/", 2)
    if len(parts) != 3 or not is_digits(parts[1]) or not is_digits(parts[2]):
        return None
    return int(parts[1]), int(parts[2])


def _raise_for(result: SmiResult, prefixed: bool) -> None:
    error = classify_failure(result, prefixed=prefixed)
    if error is not None:
        raise error


# --- the backend ------------------------------------------------------------------------------------------------------

_IDENTITY_FIELDS: Final = ("index", "uuid", "name", "pci.bus_id", "serial", "driver_version")
_BASE_FIELDS: Final = ("index", "uuid")
_IDENTITY_KEYS: Final = frozenset({"name", "pci_bus_id", "serial"})  # the cached fields that may be unknown
_FIELD_GROUPS: Final[Mapping[Fields, tuple[str, ...]]] = MappingProxyType(
    {
        Fields.MEMORY: ("memory.total", "memory.used", "memory.free", "memory.reserved"),
        Fields.CLOCK_SPEEDS: ("clocks.gr", "clocks.sm", "clocks.mem", "clocks.video"),
        # The old name is accepted by old and new drivers alike (580 prints it as clocks_event_reasons.active).
        Fields.CLOCK_REASONS: ("clocks_throttle_reasons.active",),
        Fields.CLOCK_LIMITS: (
            "clocks.max.gr",
            "clocks.max.sm",
            "clocks.max.mem",
            "clocks.applications.gr",
            "clocks.applications.mem",
        ),
        Fields.HEALTH: (
            "retired_pages.sbe",
            "retired_pages.dbe",
            "retired_pages.pending",
            "remapped_rows.correctable",
            "remapped_rows.uncorrectable",
            "remapped_rows.pending",
            "remapped_rows.failure",
            # Issue 22; older drivers refuse them one by one (each is then unknown with the reason).
            "ecc.errors.uncorrected.volatile.total",
            "ecc.errors.uncorrected.aggregate.total",
            "gpu_recovery_action",
        ),
    }
)
# Fields without which a group means nothing; a driver that refuses one of these fails the snapshot.
_REQUIRED: Final = frozenset({"index", "uuid", "memory.total", "memory.used", "memory.free", "clocks.sm"})
# Fields refused together: the model part needs all of them.
_TOGETHER: Final = (
    frozenset(_FIELD_GROUPS[Fields.HEALTH][3:7]),
    frozenset({"retired_pages.sbe", "retired_pages.dbe"}),
)
# A newer spelling to try when an older one is refused.
_ALTERNATIVE: Final = MappingProxyType({"clocks_throttle_reasons.active": "clocks_event_reasons.active"})
_APPS_FIELDS: Final = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
_RETIRED_FIELDS: Final = ("gpu_uuid", "retired_pages.address", "retired_pages.timestamp", "retired_pages.cause")
_FORMAT: Final = "--format=csv,nounits"  # bare numbers; the header still carries [MiB] and is checked
_INVALID_FIELD_PREFIX = 'Field "'
_INVALID_FIELD_SUFFIX = '" is not a valid field to query.'


@dataclass(frozen=True, slots=True)
class _Identity:
    index: int
    uuid: str  # "" for a GPU nvidia-smi could not read when the backend was opened
    name: str | None
    pci_bus_id: str | None
    serial: str | None
    minor_number: int | None = None  # from the driver's procfs list (._driver_procfs), when nvidia-smi is local
    #: Why a field above is None (a placeholder when it was read): each snapshot that reuses it gives the reason too.
    unknown: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Why its identity row could not be read (a damaged row whose UUID still read): the GPU fails until it reads.
    error: NvmlCheckError | None = None


def _refused_field(result: SmiResult) -> str | None:
    """The field named by ``Field "X" is not a valid field to query.`` (exit 2), else ``None``."""
    if result.returncode != 2:
        return None
    for raw in result.stdout.splitlines():
        line = raw.strip()
        if line.startswith(_INVALID_FIELD_PREFIX) and line.endswith(_INVALID_FIELD_SUFFIX):
            return line[len(_INVALID_FIELD_PREFIX) : -len(_INVALID_FIELD_SUFFIX)]
    return None


def _cannot_start(program: str, exc: OSError) -> str:
    """Why ``program`` could not be started, the cause first: not found (on ``PATH`` when it names no directory),
    not executable, or the OS's own words."""
    where = "" if os.sep in program else " on PATH"
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {program!r}: not found{where}"
    if isinstance(exc, PermissionError):
        return f"cannot start {program!r}: not executable ({exc.strerror})"
    return f"cannot start {program!r} ({exc.strerror or exc})"


def _open_failure(exc: NvmlCheckError) -> str:
    """The headline of a backend that could not open: what went wrong, not "did not answer" for everything (a
    missing nvidia-smi was said so only in the detail)."""
    if isinstance(exc, SmiTimeout):
        return f"nvidia-smi did not answer within {exc.timeout_s:g} s"
    if isinstance(exc, SmiTransportError):
        if exc.returncode is None and exc.message:  # it did not start: "cannot start 'nvidia-smi': not found"
            return exc.message
        return f"nvidia-smi could not be run: {exc.message}" if exc.message else "nvidia-smi could not be run"
    if isinstance(exc, SmiError) and exc.message:
        return f"nvidia-smi failed: {exc.message}"
    return "nvidia-smi did not answer"


class SmiBackend:
    """The ``"smi"`` backend (see the module docstring for what each snapshot runs).

    Opening runs ``nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,serial,driver_version --format=csv,nounits`` once
    and raises :class:`~nvmlcheck.BackendUnavailable` (with ``attempts``) when it does not answer, or the class of its
    exit status's NVML code when it answers with a failed initialisation (``NoPermission``, ``Unknown``, ...), as the
    NVML backend's opening does; the identity it
    returns is cached (index, UUID, name, serial, PCI bus id), live values never are.

    ``process_query``: ``"pids"`` (default; ``nvidia-smi -q -d PIDS``, all three process kinds) or ``"compute-apps"``
    (``--query-compute-apps``; graphics and MPS lists are then ``None`` with the reason). ``env`` and ``guard``: as
    :class:`SmiRunner`'s. Not thread-safe: use one backend per thread, or serialise calls.
    """

    name = "smi"

    def __init__(
        self,
        command: Sequence[str] | str | None = None,
        prefix: Sequence[str] | str | None = None,
        timeout_s: float | None = None,
        *,
        prefix_shell: bool | None = None,
        process_query: ProcessQuery = "pids",
        env: Mapping[str, str] | None = None,
        guard: Guard | None = None,
    ) -> None:
        if process_query not in ("pids", "compute-apps"):
            raise ArgumentError(f"process_query must be 'pids' or 'compute-apps', got {process_query!r}")
        self._runner = SmiRunner(command, prefix, timeout_s, prefix_shell=prefix_shell, env=env, guard=guard)
        self._prefixed = bool(self._runner.prefix)
        self._process_query: ProcessQuery = process_query
        self._refused: dict[str, str] = {}  # field -> why it is not asked for any more
        self._alternatives: dict[str, str] = {}  # old spelling -> the one this driver accepts
        self._identity: dict[int, _Identity] = {}
        self._minor_problem = "nvidia-smi --query-gpu has no minor number field"
        self._driver_version: str | None = None
        self._cuda_version: str | None = None
        self._system: SystemInfo | None = None
        self._version_problem: dict[str, str] = {}
        self._closed = False
        # Set once a GPU was seen in MIG mode: process queries then read the full -q (MIG Device blocks) and -L
        # (MIG UUIDs) instead of -q -d PIDS, which has neither.
        self._mig_seen = False
        # Set once nvidia-smi numbered a pinned GPU differently (one vanished or appeared): runs then list every GPU
        # (-i takes nvidia-smi's current numbers) and rows are matched by UUID (_pin).
        self._renumbered = False
        self._displaced: dict[int, str] = {}  # nvidia-smi index -> who is there now (for the failure of that index)
        self._printed_index: dict[int, int] = {}  # this pass: pinned index -> the index nvidia-smi printed
        self._strangers: set[str] = set()  # UUIDs nvidia-smi listed that could not be pinned (their index was taken)
        self._no_devices = False  # this pass: nvidia-smi said "No devices were found" (every GPU is gone)
        try:
            self._open()
        except (BackendUnavailable, NvmlError):
            # DriverNotLoaded, LibraryVersionMismatch, NoPermission, GpuLost, Unknown, ...: nvidia-smi's exit status
            # is an NVML return code, and opening raises its class, as its reads and the NVML backend's opening do.
            raise
        except NvmlCheckError as exc:
            argv = self._runner.argv_for(("--query-gpu=" + ",".join(_IDENTITY_FIELDS), _FORMAT))[0]
            raise BackendUnavailable(_open_failure(exc), [f"{shlex.join(argv)}: {type(exc).__name__}: {exc}"]) from exc

    # -- identity ----------------------------------------------------------------------------------------------------

    def _open(self) -> None:
        # --version (for the CUDA version) runs beside the identity query, so opening costs one run's time and
        # no snapshot ever pays for system().
        identity, version = self._runner.run_many(
            [("--query-gpu=" + ",".join(_IDENTITY_FIELDS), _FORMAT), ("--version",)]
        )
        self._use_identity(identity)
        self._use_versions(version)

    def _load_identity(self, deadline: Deadline | None = None) -> None:
        self._use_identity(self._run(("--query-gpu=" + ",".join(_IDENTITY_FIELDS), _FORMAT), deadline))

    def _use_identity(self, result: SmiResult) -> None:
        """Pin each GPU's index to its UUID. The first reading (opening) pins them all; a later one (a GPU appeared,
        or a UUID never seen came back) only adds GPUs at indices not pinned yet, or fills in one lost before
        opening: a pinned index always means the same GPU, as an NVML handle does (docs/backends.md, "GPUs that
        vanish or appear")."""
        if result.returncode == 6 and _NO_DEVICES_TEXT in result.output.lower():
            # nvidia-smi answered: there is no GPU (now). GPUs pinned before stay, and read as failures.
            return
        if result.returncode != 0 and not has_handle_failure(result.output):
            _raise_for(result, self._prefixed)
        with _parsing(result):
            records, failures = parse_query_gpu(result.stdout, _IDENTITY_FIELDS)
        def open_for(r: GpuRecord) -> bool:
            """Whether ``r`` may be pinned: a GPU never pinned at an index not pinned yet (a new GPU at a pinned index
            is not that GPU), or the GPU pinned there whose identity row could not be read before."""
            ident = self._identity.get(r.index)
            if ident is not None and ident.uuid:
                return ident.error is not None and ident.uuid == r.uuid
            return r.uuid not in self._pinned()

        fresh = [r for r in records if open_for(r)]
        minors = self._minor_numbers(fresh) if fresh else {}
        first = not self._identity
        for r in fresh:
            why = {k: v for k, v in r.unknown.items() if k in _IDENTITY_KEYS}
            self._identity[r.index] = _Identity(
                r.index, r.uuid, r.name, r.pci_bus_id, r.serial, minors.get(r.index), MappingProxyType(why)
            )
        if first:
            # A GPU lost before we opened still counts: it must show up in every snapshot as a failure, never vanish.
            # nvidia-smi numbers GPUs in PCI order and prints the lost one's bus id; when it names no index, the gaps
            # in the others' indices are where the lost ones were.
            gaps = iter(i for i in range(len(records) + len(failures)) if i not in self._identity)
            for hf in failures:
                index = hf.index if hf.index is not None else next(gaps, None)
                if index is not None and index not in self._identity:
                    # A damaged row whose UUID reads is pinned with its error: that GPU fails (as NVML fails a GPU
                    # whose identity it cannot read) until its identity reads, never seen as a GPU that moved.
                    # (Only at the index it printed: a UUID is never pinned to a guessed one.)
                    uuid = hf.uuid if hf.error is not None and hf.uuid and hf.index is not None else ""
                    error = self._with_argv(hf.error, result) if uuid and hf.error is not None else None
                    self._identity[index] = _Identity(index, uuid, None, hf.pci_bus_id, None, error=error)
        self._driver_version = next((r.driver_version for r in records if r.driver_version), self._driver_version)

    def _minor_numbers(self, records: Sequence[GpuRecord]) -> dict[int, int]:
        """Each GPU's minor number from the driver's procfs list, by UUID (by bus id where the list has no UUID);
        none behind a prefix: that nvidia-smi runs on another host. Why a GPU is left out is kept in
        ``_minor_problem``, the reason its snapshots give."""
        if self._prefixed:
            self._minor_problem = "nvidia-smi --query-gpu has no minor number field (and it runs behind a prefix)"
            return {}
        listed, problem = read_driver_gpus()
        by_uuid = {g.uuid: g.minor_number for g in listed if g.uuid}
        by_bus = {g.bus_id: g.minor_number for g in listed if not g.uuid}
        out: dict[int, int] = {}
        for r in records:
            minor = by_uuid.get(r.uuid)
            if minor is None and r.pci_bus_id:
                minor = by_bus.get(normal_bus_id(r.pci_bus_id))
            if minor is not None:
                out[r.index] = minor
        self._minor_problem = (
            f"nvidia-smi --query-gpu has no minor number field, and {problem or GPUS_DIR + ' does not list this GPU'}"
        )
        return out

    # -- Backend protocol --------------------------------------------------------------------------------------------

    def device_count(self) -> int:
        """How many GPUs nvidia-smi listed when the backend was opened (or last re-read its identity)."""
        return len(self._identity)

    def system(self) -> SystemInfo:
        """Driver version (``--query-gpu=driver_version``), CUDA driver version (``nvidia-smi --version``'s ``CUDA
        Version``, as 13000 for 13.0), both read when the backend was opened. ``nvml_version`` is ``None``:
        nvidia-smi prints only an abbreviated form (``580.159``), not nvmlSystemGetNVMLVersion's ``13.580.159.04``."""
        if self._system is None:
            unknown = {"nvml_version": "nvidia-smi does not print nvmlSystemGetNVMLVersion's value"}
            unknown.update(self._version_problem)
            cuda = cuda_version_number(self._cuda_version) if self._cuda_version else None
            if cuda is None:
                printed = self._cuda_version or ""
                why = (
                    f"this driver deprecated it: nvidia-smi printed CUDA Version {printed!r}"
                    if "deprecated" in printed.lower()
                    else f"nvidia-smi printed CUDA Version {self._cuda_version!r}"
                )
                unknown.setdefault("cuda_driver_version", why)
            if self._driver_version is None:
                unknown["driver_version"] = "nvidia-smi printed no driver_version"
            self._system = SystemInfo(self._driver_version, None, cuda, MappingProxyType(unknown))
        return self._system

    def _use_versions(self, result: SmiResult) -> None:
        # An old nvidia-smi without --version (or an odd answer) costs only the CUDA version, never the backend.
        try:
            _raise_for(result, self._prefixed)
            versions = parse_version_output(result.stdout)
        except NvmlCheckError as exc:
            self._version_problem = {"cuda_driver_version": f"nvidia-smi --version failed: {exc}"}
            return
        # Driver 610 prints "CUDA Version: Deprecated, see ..." and adds "CUDA UMD Version"/"KMD Version".
        cuda = versions.get("cuda umd version")
        self._cuda_version = cuda if cuda is not None else versions.get("cuda version")
        self._driver_version = self._driver_version or versions.get("kmd version") or versions.get("driver version")
        if self._cuda_version is None:
            self._version_problem = {"cuda_driver_version": "nvidia-smi --version printed no CUDA Version"}

    def close(self) -> None:
        """Nothing is held between calls (each run is reaped before its call returns); later calls raise."""
        self._closed = True

    def __enter__(self) -> SmiBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- snapshot ----------------------------------------------------------------------------------------------------

    def snapshot(
        self, indices: Sequence[int] | None = None, fields: Fields = Fields.ALL, *, deadline: Deadline | None = None
    ) -> Snapshot:
        """Read the GPUs ``indices`` (all when ``None``) with the fewest nvidia-smi runs (module docstring).

        Memory is whole MiB rounded up by nvidia-smi (``granularity_bytes`` = 1 MiB). A GPU nvidia-smi cannot read
        (``Unable to determine the device handle``, a UUID of ``[GPU requires reset]``, or no row at all) is a
        :class:`~nvmlcheck.model.DeviceFailure`; errors that stop the whole pass (driver gone, timeout) are raised.
        ``deadline``: each run gets at most the time left before it (module docstring); past it,
        :class:`~nvmlcheck.errors.DeadlinePassed`.
        """
        if self._closed:
            raise BackendUnavailable("this nvidia-smi backend was closed")
        taken_ns = time.monotonic_ns()
        wall = time.time()
        selected = self._select(indices, deadline)
        if not selected:
            # No GPU (nvidia-smi said so when the backend was opened): nothing to run.
            return Snapshot(self.name, taken_ns, time.monotonic_ns() - taken_ns, wall, self.system(), ())
        # -i takes nvidia-smi's current numbers: once they differ from the pinned ones, every GPU is read (_pin).
        select_args = ("-i", ",".join(map(str, selected))) if indices is not None and not self._renumbered else ()
        gpu_fields = self._gpu_fields(fields)
        jobs: list[tuple[str, ...]] = [(*select_args, "--query-gpu=" + ",".join(gpu_fields), _FORMAT)]
        mig_jobs = Fields.PROCESSES in fields and self._process_query == "pids" and self._mig_seen
        if Fields.PROCESSES in fields:
            jobs.append((*select_args, *self._process_args()))
            if mig_jobs:
                jobs.append(("-L",))
        results = self._run_many(jobs, deadline)
        gpu_result = results[0]
        while (refused := _refused_field(gpu_result)) is not None:
            # An older driver does not know a field: ask without it (remembered) rather than fail every poll.
            gpu_fields = self._refuse(refused, gpu_fields, gpu_result)
            gpu_result = self._run((*select_args, "--query-gpu=" + ",".join(gpu_fields), _FORMAT), deadline)
        renumbered = self._renumbered
        self._no_devices = False
        records, handle_failures = self._parse_gpus(gpu_result, gpu_fields, deadline)
        if any(self._identity_error(r) is not None for r in records if r.index in selected):
            self._load_identity(deadline)  # as NVML reads an identity it could not read again, every pass
        if self._renumbered and not renumbered and select_args:
            # This pass asked nvidia-smi for GPUs by numbers that now name others: read again, every GPU.
            return self.snapshot(indices, fields, deadline=deadline)
        if (
            Fields.PROCESSES in fields
            and self._process_query == "pids"
            and not mig_jobs
            and any(r.mig_mode for r in records)
        ):
            # First sight of MIG: read the MIG devices now rather than judge this pass without them.
            self._mig_seen = mig_jobs = True
            results = [gpu_result, *self._run_many([(*select_args, *self._process_args()), ("-L",)], deadline)]
        unreadable: dict[str, NvmlCheckError] = {}  # UUID -> why that GPU's part of the output could not be read
        lists = self._process_lists(results[1], records, unreadable) if Fields.PROCESSES in fields and records else {}
        if mig_jobs:
            self._add_mig_uuids(results[2], records, lists)
        retired = self._retired_pages(records, select_args, deadline) if Fields.HEALTH in fields else {}
        devices, read_failures = self._devices(
            records, selected, fields, lists=lists, retired=retired, unreadable=unreadable
        )
        failures = self._failures(selected, devices, handle_failures, gpu_result, read_failures)
        return Snapshot(
            backend=self.name,
            taken_ns=taken_ns,
            duration_ns=time.monotonic_ns() - taken_ns,
            wall_time=wall,
            system=self.system(),
            devices=tuple(devices),
            failures=failures,
        )

    def _devices(
        self,
        records: Sequence[GpuRecord],
        selected: Sequence[int],
        fields: Fields,
        *,
        lists: Mapping[str, ProcessLists],
        retired: Mapping[str, tuple[RetiredPage, ...] | str],
        unreadable: Mapping[str, NvmlCheckError],
    ) -> tuple[list[DeviceState], dict[int, DeviceFailure]]:
        """Each selected GPU's reading, or its failure when a part of it could not be read (``unreadable``, its
        identity, a process holding more than the GPU has)."""
        devices: list[DeviceState] = []
        extra = [(k if k == "mig" else f"health.{k}", v) for k, v in self._refused_reasons(fields)]
        read_failures: dict[int, DeviceFailure] = {}
        for record in records:
            if record.index not in selected:
                continue
            error = unreadable.get(record.uuid) or self._identity_error(record)
            if error is not None:
                read_failures[record.index] = DeviceFailure(record.index, record.uuid, error)
                continue
            ident = self._identity_for(record)
            known = self._identity.get(record.index)
            minor = known.minor_number if known is not None and known.uuid == record.uuid else None
            # The cached identity's reasons, for the fields this row did not read itself.
            cached = known.unknown.items() if ident and known is not None else ()
            why = [*extra, *((k, v) for k, v in cached if getattr(record, k) is None)]
            try:
                devices.append(
                    build_device_state(
                        record,
                        fields,
                        processes=lists.get(record.uuid),
                        retired_pages=retired.get(record.uuid),
                        identity=ident,
                        minor_number=minor,
                        extra_unknown=why if minor is not None else [*why, ("minor_number", self._minor_problem)],
                    )
                )
            except CorruptData as exc:  # a process using more than its GPU has: that GPU's reading is discarded
                read_failures[record.index] = DeviceFailure(record.index, record.uuid, exc)
        return devices, read_failures

    def _run_many(self, jobs: Sequence[Sequence[str]], deadline: Deadline | None) -> list[SmiResult]:
        """Runs started together, each given at most the time left before ``deadline`` (see the module docstring)."""
        limit = self._limit(deadline)
        try:
            return self._runner.run_many(jobs, limit)
        except SmiTimeout as exc:
            if limit is not None:  # the wait's time ran out, not the run's own timeout
                raise DeadlinePassed(f"nvidia-smi was stopped at the wait's deadline: {exc}") from exc
            raise

    def _run(self, args: Sequence[str], deadline: Deadline | None) -> SmiResult:
        """One run, given at most the time left before ``deadline``."""
        return self._run_many([args], deadline)[0]

    def _limit(self, deadline: Deadline | None) -> float | None:
        """The timeout of a run starting now: ``None`` (the runner's own) unless the time left before ``deadline``
        is shorter. Raises DeadlinePassed when no time is left: a run given none could not answer."""
        if deadline is None:
            return None
        left = deadline.remaining_s()
        if left <= 0.0:
            raise DeadlinePassed("the wait's deadline passed before nvidia-smi could be run")
        return left if left < self._runner.timeout_s else None

    def _select(self, indices: Sequence[int] | None, deadline: Deadline | None = None) -> tuple[int, ...]:
        if indices is None:
            return tuple(sorted(self._identity))
        chosen = tuple(dict.fromkeys(indices))
        for i in chosen:
            if isinstance(i, bool) or not isinstance(i, int):
                raise ArgumentTypeError(f"GPU indices must be ints, got {i!r}")
        missing = [i for i in chosen if i not in self._identity]
        if missing:
            self._load_identity(deadline)  # a GPU may have appeared since the backend was opened
            missing = [i for i in chosen if i not in self._identity]
        if missing:
            # nvidia-smi -i 0,5 on a one-GPU host prints GPU 0 and exits 0: the check must be ours.
            raise InvalidArgument(
                2,
                "nvidia-smi -i",
                missing[0],
                detail=f"no GPU with that index (nvidia-smi lists {len(self._identity)})",
            )
        return chosen

    def _gpu_fields(self, fields: Fields) -> tuple[str, ...]:
        wanted: list[str] = list(_BASE_FIELDS)
        for flag, names in _FIELD_GROUPS.items():
            # The limits and the reasons come with the current speeds: the model's Clocks is built around them.
            if fields & flag or (flag is Fields.CLOCK_SPEEDS and fields & Fields.CLOCKS):
                wanted.extend(self._alternatives.get(n, n) for n in names)
        if Fields.PROCESSES in fields and self._process_query == "pids":
            wanted.append("pci.bus_id")  # -q names GPUs by PCI bus id
        # Always, with the identity as NVML reads it: MIG changes what "clean" means (docs/waiting.md) and what
        # CUDA sees of a GPU (docs/cuda.md): an identity-only read left it None, which refused every cuda:N.
        wanted.append("mig.mode.current")
        return tuple(n for n in wanted if n not in self._refused)

    def _refuse(self, refused: str, current: tuple[str, ...], result: SmiResult) -> tuple[str, ...]:
        original = next((k for k, v in self._alternatives.items() if v == refused), refused)
        if refused in _ALTERNATIVE and _ALTERNATIVE[refused] not in current:
            self._alternatives[original] = _ALTERNATIVE[refused]
            return tuple(_ALTERNATIVE[refused] if n == refused else n for n in current)
        if refused in _REQUIRED or refused not in current:
            raise SmiError(result.argv, result.returncode, result.output, f"nvidia-smi does not know field {refused}")
        group = next((g for g in _TOGETHER if refused in g), frozenset({refused}))
        for name in group:
            self._refused[name] = f"this nvidia-smi does not know the field {refused}"
        return tuple(n for n in current if n not in group)

    def _refused_reasons(self, fields: Fields) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if "mig.mode.current" in self._refused:
            # An nvidia-smi older than MIG: mig_mode is None (judged as before MIG), and this says why.
            out.append(("mig", self._refused["mig.mode.current"]))
        if Fields.HEALTH in fields:
            for name, key in (("remapped_rows.correctable", "remapped_rows"), ("retired_pages.sbe", "retired_pages")):
                if name in self._refused:
                    out.append((key, self._refused[name]))
            if "retired_pages.pending" in self._refused:
                out.append(("retired_pages_pending", self._refused["retired_pages.pending"]))
            for key, name in (*ECC_COLUMNS, ("recovery_action", "gpu_recovery_action")):
                if name in self._refused:
                    out.append((key, self._refused[name]))
        return out

    def _parse_gpus(
        self, result: SmiResult, gpu_fields: Sequence[str], deadline: Deadline | None = None
    ) -> tuple[tuple[GpuRecord, ...], tuple[HandleFailure, ...]]:
        if result.returncode != 0 and not has_handle_failure(result.output):
            no_devices = result.returncode == 6 and _NO_DEVICES_TEXT in result.output.lower()
            if no_devices and "-i" not in result.command:
                # Every GPU is gone (each pinned one is then GpuLost, as NVML's handles would answer), not the backend.
                self._no_devices = True
                return (), ()
            if not self._renumbered and no_devices:
                # -i N names no GPU any more: the GPUs may have been renumbered (one vanished). Every GPU is read to
                # tell; if they were, the caller reads again without -i.
                every = self._run(("--query-gpu=index,uuid", _FORMAT), deadline)
                self._parse_gpus(every, ("index", "uuid"), deadline)
                if self._renumbered or self._no_devices:
                    return (), ()
            _raise_for(result, self._prefixed)
        # Some GPUs could not be read; nvidia-smi still printed the others (exit 15 for a lost one).
        with _parsing(result):
            records, failures = parse_query_gpu(result.stdout, gpu_fields)
        pinned = self._pinned()
        new = {r.uuid for r in records if r.uuid not in pinned} - self._strangers
        if new:
            self._load_identity(deadline)  # a GPU appeared, or one lost before opening came back
            self._strangers |= new - set(self._pinned())  # not ours (an index pinned to another): asked once
        return self._pin(records), failures

    def _pinned(self) -> dict[str, int]:
        return {i.uuid: i.index for i in self._identity.values() if i.uuid}

    def _pin(self, records: Sequence[GpuRecord]) -> tuple[GpuRecord, ...]:
        """Each row under the index its UUID is pinned to. nvidia-smi numbers the GPUs it sees now: once one vanished
        (or appeared before others), its index N is another GPU, which must never be read as GPU N. Such a row moves
        to its GPU's own index (from then on every run lists all GPUs: ``-i`` takes nvidia-smi's numbers); a GPU
        this backend never pinned is left out, and the index it displaced is a failure that names it."""
        pinned = self._pinned()
        out: list[GpuRecord] = []
        self._printed_index = {}
        self._displaced = {}
        for r in records:
            index = pinned.get(r.uuid)
            if index is None or index != r.index:
                ident = self._identity.get(r.index)
                was = ident.uuid if ident is not None and ident.uuid else "this GPU"
                self._displaced.setdefault(
                    r.index,
                    f"nvidia-smi no longer lists {was} as GPU {r.index}: "
                    f"it prints {r.uuid} there now. The GPUs were renumbered (one was removed or added); open the "
                    "backend again to read the new numbering",
                )
                self._renumbered = True
            if index is None:
                continue
            self._printed_index[index] = r.index
            r.index = index
            out.append(r)
        return tuple(out)

    def _identity_error(self, record: GpuRecord) -> NvmlCheckError | None:
        """Why the identity pinned for ``record``'s GPU could not be read (``None``: it was)."""
        ident = self._identity.get(record.index)
        return ident.error if ident is not None and ident.uuid == record.uuid else None

    def _identity_for(self, record: GpuRecord) -> Mapping[str, str | None]:
        ident = self._identity.get(record.index)
        if ident is None or ident.uuid != record.uuid:
            return {}
        return {"name": ident.name, "pci_bus_id": ident.pci_bus_id, "serial": ident.serial}

    def _process_args(self) -> tuple[str, ...]:
        if self._process_query == "pids":
            return ("-q",) if self._mig_seen else ("-q", "-d", "PIDS")
        return ("--query-compute-apps=" + ",".join(_APPS_FIELDS), _FORMAT)

    def _process_lists(
        self, result: SmiResult, records: Sequence[GpuRecord], failed: dict[str, NvmlCheckError]
    ) -> dict[str, ProcessLists]:
        """Each record's lists, by UUID. A GPU whose part of the output could not be read goes into ``failed`` (its
        UUID -> the error) instead: it fails alone, as a GPU whose list NVML answers with corrupt data."""
        if result.returncode != 0 and not has_handle_failure(result.output):
            _raise_for(result, self._prefixed)
        if self._process_query == "pids":
            return self._pids_lists(result, records, failed)
        with _parsing(result):
            listing = parse_compute_apps(result.stdout, _APPS_FIELDS)
        for r in records:
            if r.uuid in listing.failed:
                failed[r.uuid] = self._with_argv(listing.failed[r.uuid], result)
        not_csv = "nvidia-smi --query-compute-apps lists compute processes only (use process_query='pids')"
        not_listed = {unknown_key("processes", k): not_csv for k in (ProcessKind.GRAPHICS, ProcessKind.MPS)}
        out: dict[str, ProcessLists] = {}
        unattributed = listing.unattributed
        strangers = sorted((set(listing.by_gpu) | set(listing.failed)) - set(self._pinned()))
        if unattributed is None and strangers:
            # A row on a GPU this backend does not know (a MIG-... UUID, a GPU that appeared): its process may be on
            # one of ours, whose list would then look shorter than it is.
            unattributed = (f"nvidia-smi --query-compute-apps listed a process on {strangers[0]}, which is none of "
                            "the GPUs this backend reads: the lists cannot be attributed")
        for r in records:
            reasons = dict(not_listed)
            if unattributed is not None:
                reasons[unknown_key("processes", ProcessKind.COMPUTE)] = unattributed
                out[r.uuid] = ProcessLists(None, None, None, reasons)
            else:
                out[r.uuid] = ProcessLists(listing.by_gpu.get(r.uuid, ()), None, None, reasons)
        return out

    def _pids_lists(
        self, result: SmiResult, records: Sequence[GpuRecord], failed: dict[str, NvmlCheckError]
    ) -> dict[str, ProcessLists]:
        with _parsing(result):
            listing = parse_pids_query(result.stdout)
        self._note_cuda_version(listing.cuda_version)
        handle_failed = {hf.pci_bus_id: hf for hf in listing.failures if hf.pci_bus_id}
        pcis = {r.uuid: r.pci_bus_id or self._identity_for(r).get("pci_bus_id") or "" for r in records}
        for pci, error in listing.failed.items():
            if pci not in pcis.values():
                # A block of a GPU this pass did not read (or one a process name's line break made up): which GPU's
                # lines it holds cannot be told, and one of ours may be missing processes.
                raise self._with_argv(error, result)
        out: dict[str, ProcessLists] = {}
        for r in records:
            pci = pcis[r.uuid]
            if pci in listing.failed:
                failed[r.uuid] = self._with_argv(listing.failed[pci], result)
                continue
            why = listing.unknown.get(pci)
            if pci not in listing.compute:
                hf = handle_failed.get(pci)
                why = (
                    f"nvidia-smi -q -d PIDS could not read GPU {r.index} (error code {hf.code}): {hf.message}"
                    if hf is not None
                    else f"nvidia-smi -q -d PIDS did not list GPU {r.index} (PCI bus id {pci or 'unknown'})"
                )
            if why is not None:
                reasons = {unknown_key("processes", k): why for k in ProcessKind}
                out[r.uuid] = ProcessLists(None, None, None, reasons)
                continue
            # Bytes a driver withholds (WDDM, MIG) are None on each process; the lists themselves are complete.
            bytes_why = listing.bytes_unknown.get(pci)
            reasons = {unknown_key("processes", "used_bytes"): bytes_why} if bytes_why is not None else {}
            mig = listing.mig_devices.get(pci, ()) if self._mig_seen and r.mig_mode else None
            if mig is not None and pci in listing.mig_unknown:
                mig = None
                reasons["mig_devices"] = f"nvidia-smi -q: {listing.mig_unknown[pci]}"
            out[r.uuid] = ProcessLists(listing.compute[pci], listing.graphics[pci], listing.mps[pci], reasons, mig)
        return out

    def _add_mig_uuids(self, result: SmiResult, records: Sequence[GpuRecord], lists: dict[str, ProcessLists]) -> None:
        """Put ``-L``'s MIG UUIDs on the MIG devices read from ``-q`` (matched by GPU index and MIG device index).
        A failed ``-L`` costs only the UUIDs (``None`` with the reason), never the snapshot."""
        why: str | None = None
        uuids: Mapping[int, Mapping[int, str]] = {}
        try:
            _raise_for(result, self._prefixed)
            with _parsing(result):
                uuids = parse_list_gpus(result.stdout)
        except NvmlCheckError as exc:
            why = f"nvidia-smi -L failed: {exc}"
        for r in records:
            pl = lists.get(r.uuid)
            if pl is None or not pl.mig_devices:
                continue
            named = uuids.get(self._printed_index.get(r.index, r.index), {})  # -L prints nvidia-smi's numbers
            # -q and -L are two runs: an instance created or destroyed between them renumbers the others, and a UUID
            # matched by index would then name another instance (a wait on it would judge the wrong tenant).
            # The name of drivers before R470 carries its instance's ids: one that is not this instance's, too.
            changed = why is None and bool(named) and (set(named) != {m.index for m in pl.mig_devices} or any(
                _legacy_ids(named[m.index]) not in (None, (m.gpu_instance_id, m.compute_instance_id))
                for m in pl.mig_devices if m.index in named))
            devices = []
            for m in pl.mig_devices:
                uuid = None if changed else named.get(m.index)
                if uuid is None:
                    reason = why or (
                        f"the MIG devices of GPU {r.index} changed between nvidia-smi -q and -L (-q: "
                        f"{sorted(x.index for x in pl.mig_devices)}, -L: {sorted(named)}): which UUID is which "
                        "cannot be told" if changed else
                        f"nvidia-smi -L listed no MIG device {m.index} under GPU {r.index}")
                    devices.append(dataclasses.replace(m, unknown=MappingProxyType({**m.unknown, "uuid": reason})))
                else:
                    devices.append(dataclasses.replace(m, uuid=uuid))
            lists[r.uuid] = dataclasses.replace(pl, mig_devices=tuple(devices))

    def _note_cuda_version(self, text: str | None) -> None:
        """Take ``-q``'s CUDA Version when ``--version`` gave none that reads as a version (driver 610 prints
        ``CUDA Version: Deprecated, see ...`` there, and may still print the number in ``-q``)."""
        if text is None or cuda_version_number(text) is None:
            return
        if self._cuda_version is None or cuda_version_number(self._cuda_version) is None:
            self._cuda_version = text
            self._version_problem = {}
            self._system = None  # rebuilt with the version on the next system()

    def _retired_pages(
        self, records: Sequence[GpuRecord], select_args: tuple[str, ...], deadline: Deadline | None = None
    ) -> dict[str, tuple[RetiredPage, ...] | str]:
        if not any((r.retired_sbe or 0) + (r.retired_dbe or 0) > 0 for r in records):
            return {}  # no GPU has retired pages: nothing to list (the common case costs no run)
        args = (*select_args, "--query-retired-pages=" + ",".join(_RETIRED_FIELDS), _FORMAT)
        result = self._run(args, deadline)
        _raise_for(result, self._prefixed)
        with _parsing(result):
            listing = parse_retired_pages(result.stdout, _RETIRED_FIELDS)
        out: dict[str, tuple[RetiredPage, ...] | str] = {}
        for r in records:
            if r.uuid in listing.unsupported:
                out[r.uuid] = listing.unsupported[r.uuid]
            else:
                out[r.uuid] = listing.by_gpu.get(r.uuid, ())
        return out

    def _failures(
        self,
        selected: Sequence[int],
        devices: Sequence[DeviceState],
        handle_failures: Sequence[HandleFailure],
        result: SmiResult,
        read_failures: Mapping[int, DeviceFailure],
    ) -> tuple[DeviceFailure, ...]:
        """Every selected GPU without a reading, with the error that explains it: its device-handle line, its damaged
        row, ``read_failures`` (a GPU whose process list or values could not be read), else "no row". A damaged row
        that can be tied to no such GPU raises: it may be any GPU's."""
        seen = {d.index for d in devices}
        by_pci = {i.pci_bus_id: i.index for i in self._identity.values() if i.pci_bus_id}
        by_uuid = self._pinned()
        out: dict[int, DeviceFailure] = dict(read_failures)
        leftovers: list[HandleFailure] = []
        for hf in handle_failures:
            # The UUID and the bus id name the GPU whatever nvidia-smi's numbering; the printed index only while it is
            # ours.
            index = by_uuid.get(hf.uuid or "")
            if index is None:
                index = by_pci.get(hf.pci_bus_id or "")
            if index is None and not self._renumbered and hf.uuid is None:
                index = hf.index  # (a row whose UUID reads but is not pinned is another GPU's, whatever its index)
            if index is not None and index not in selected and hf.error is not None:
                continue  # a damaged row of a GPU not asked for (every GPU is read once renumbered): not ours to judge
            if index is None or index in seen or index not in selected or index in out:
                leftovers.append(hf)
                continue
            out[index] = self._device_failure(index, hf, result)
        missing = [i for i in selected if i not in seen and i not in out]
        for index in missing:
            out[index] = self._device_failure(index, leftovers.pop(0) if leftovers else None, result)
        damaged = next((hf.error for hf in leftovers if hf.error is not None), None)
        if damaged is not None:
            # A row nvidia-smi printed that names none of the GPUs still unaccounted for (or one read by another row):
            # the output contradicts itself, and no reading of it can be trusted.
            raise self._with_argv(damaged, result)
        return tuple(out[i] for i in selected if i in out)

    @staticmethod
    def _with_argv(error: NvmlCheckError, result: SmiResult) -> NvmlCheckError:
        """A parse error found by the pure parsers, naming the command whose output it was."""
        if isinstance(error, SmiParseError) and not error.argv:
            return SmiParseError(error.reason, error.line_no, error.line, result.argv)
        return error

    def _device_failure(self, index: int, hf: HandleFailure | None, result: SmiResult) -> DeviceFailure:
        ident = self._identity.get(index)
        cmd = shlex.join(result.command)
        error: Exception
        if hf is None and index in self._displaced:
            error = GpuLost(15, cmd, index, self._displaced[index])  # as NVML's handle of a GPU that went away
        elif hf is None and self._no_devices:
            error = GpuLost(15, cmd, index, "nvidia-smi lists no GPU now (No devices were found): it was removed")
        elif hf is not None and hf.error is not None:
            error = self._with_argv(hf.error, result)  # its row could not be read: never an idle GPU
        elif hf is None:
            error = SmiError(
                result.argv, result.returncode, result.output, f"nvidia-smi printed no row for GPU {index}"
            )
        else:
            error = error_class_for_code(hf.code)(hf.code, cmd, index, hf.message)
        return DeviceFailure(index, (ident.uuid or None) if ident else None, error)
