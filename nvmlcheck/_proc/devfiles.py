"""Which processes have NVIDIA device files open: a scan of ``/proc/*/fd``.

A descriptor is an NVIDIA device file when its target is a character device whose major number is NVIDIA's: 195
(``/dev/nvidiaN``, ``nvidiactl``, ``nvidia-modeset``) and every major ``/proc/devices`` lists under a name starting
with ``nvidia`` (UVM, capabilities, NVSwitch, ...), checked with ``stat`` of the descriptor: identity, not a path (a
regular file called ``/dev/nvidia0`` is none; a renamed node is one). Nothing in the environment changes this rule.
Tests, where there is no NVIDIA device, name stand-in files: explicitly (``stand_ins``), or through the simulator,
which registers its own (:func:`simulated_stand_ins`, used only by ``nvmlcheck._sim`` and the test kit); a
:class:`DeviceRule` says which rule a scan used, so a kill's plan can print it. Every CUDA process opens every
``/dev/nvidiaN`` (docs/driver-facts.md): a device file finds a holder, not which GPU it holds. docs/killing.md.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "DEFAULT_DEVICE_FILES",
    "NVIDIA_MAJOR",
    "SIMULATED_DEVICE_DIR",
    "DeviceRule",
    "FdScan",
    "device_file_patterns",
    "device_rule",
    "kinds_of",
    "nvidia_majors",
    "open_device_files",
    "scan",
    "simulated_globs",
    "simulated_stand_ins",
    "stub_loaded_from_env",
]

#: The paths of NVIDIA's device files, as globs: what the study watches close in its own holders (a path is enough
#: there: they are processes it started). Which processes *hold* a GPU is decided by :class:`DeviceRule`.
DEFAULT_DEVICE_FILES: tuple[str, ...] = (
    "/dev/nvidia[0-9]*",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm*",
    "/dev/nvidia-caps/*",
)
#: The fixed major of ``/dev/nvidia*`` (``nvidia-frontend``): GPUs are minors 0-253, 254 ``nvidia-modeset``,
#: 255 ``nvidiactl``.
NVIDIA_MAJOR = 195
_FIRST_NON_GPU_MINOR = 254
_GPU_STAND_IN = re.compile(r"nvidia[0-9]+")


def nvidia_majors(proc_devices: str = "/proc/devices") -> frozenset[int]:
    """195 and the majors ``proc_devices`` lists among its character devices under a name starting with
    ``nvidia`` (``nvidia-uvm``, ``nvidia-caps``, ``nvidia-nvswitch``, ...; they are assigned at module load)."""
    majors = {NVIDIA_MAJOR}
    try:
        with open(proc_devices, encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return frozenset(majors)
    in_char = False
    for line in text.splitlines():
        if line.startswith("Character devices"):
            in_char = True
            continue
        if line.startswith("Block devices"):
            break
        parts = line.split()
        if in_char and len(parts) == 2 and parts[0].isdigit() and parts[1].startswith("nvidia"):
            majors.add(int(parts[0]))
    return frozenset(majors)


def device_file_patterns(patterns: Sequence[str] | str | None = None) -> tuple[str, ...]:
    """Path globs: ``patterns`` (a glob, ``:``-separated globs, or a sequence), else :data:`DEFAULT_DEVICE_FILES`.
    ``ValueError`` for an empty or relative one."""
    if patterns is None:
        return DEFAULT_DEVICE_FILES
    if not isinstance(patterns, str):
        try:
            items: list[object] = list(patterns)
        except TypeError:
            items = [patterns]
        if not all(isinstance(p, str) for p in items):
            from ..errors import ArgumentTypeError

            raise ArgumentTypeError(f"device-file patterns are path globs (str, or a sequence of str), got "
                                    f"{patterns!r}")
    else:
        items = list(patterns.split(":"))
    out = tuple(p.strip() for p in items if isinstance(p, str) and p.strip())
    bad = next((p for p in out if not p.startswith("/")), None)
    if not out or bad is not None:
        from ..errors import ArgumentError  # layer 1, loaded only for this error

        raise ArgumentError(f"a device-file pattern is an absolute path glob, got {bad!r}" if out
                            else "no device-file pattern given")
    return out


def _matcher(patterns: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


@dataclass(frozen=True)
class DeviceRule:
    """What counts as an NVIDIA device file in a scan: a character device of one of ``majors``, and (tests only)
    a file whose path matches one of ``stand_ins``; ``origin`` says who named the stand-ins. A simulation's rule has
    no majors: its stand-ins only (:func:`device_rule`)."""

    majors: frozenset[int]
    stand_ins: tuple[str, ...] = ()
    origin: str | None = None
    _stand_in: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.stand_ins:
            object.__setattr__(self, "_stand_in", _matcher(self.stand_ins))

    @property
    def is_default(self) -> bool:
        """Whether only NVIDIA's character devices count (no stand-in)."""
        return not self.stand_ins

    def describe(self) -> str:
        """``NVIDIA character devices (majors 195, 508)``, then the stand-ins and who named them, if any; a
        simulation's rule has its stand-ins only."""
        if not self.majors:
            return (f"stand-in files {':'.join(self.stand_ins)} only ({self.origin or 'given explicitly'}; no NVIDIA "
                    "character device: the simulated GPUs are not this host's)")
        text = f"NVIDIA character devices (majors {', '.join(map(str, sorted(self.majors)))})"
        if self.stand_ins:
            text += f" and stand-in files {':'.join(self.stand_ins)} ({self.origin or 'given explicitly'})"
        return text

    def kind(self, fd_path: str, target: str) -> str | None:
        """``"gpu"`` (a per-GPU file, ``/dev/nvidiaN``), ``"other"`` (``nvidiactl``, UVM, capabilities, ...) or
        ``None`` (not an NVIDIA device file) for the descriptor ``fd_path`` whose link reads ``target``."""
        if self._stand_in is not None and self._stand_in.match(target):
            return "gpu" if _GPU_STAND_IN.fullmatch(os.path.basename(target)) else "other"
        if not target.startswith("/"):
            return None  # socket:[...], pipe:[...], anon_inode:...: no device behind it
        try:
            st = os.stat(fd_path)
        except OSError:
            return None  # closed meanwhile
        if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) not in self.majors:
            return None
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        return "gpu" if major == NVIDIA_MAJOR and minor < _FIRST_NON_GPU_MINOR else "other"


#: Stand-ins registered by the simulator (``nvmlcheck._sim``) and the test kit, with who registered them.
_simulated: tuple[tuple[str, ...], str] | None = None


@contextlib.contextmanager
def simulated_stand_ins(globs: Sequence[str], origin: str) -> Iterator[None]:
    """Make ``globs`` count as NVIDIA device files in scans that name no stand-ins, while the block runs. For the
    simulator and the test kit only: a production run never enters it, and no environment variable does it."""
    global _simulated
    previous = _simulated
    _simulated = (device_file_patterns(globs), origin)
    try:
        yield
    finally:
        _simulated = previous


#: Where a simulation's stand-in device files are: ``dev/`` next to its scenario file (the test kit's
#: ``nvml_bound_process`` opens ``dev/nvidiaN`` and ``dev/nvidiactl`` there).
SIMULATED_DEVICE_DIR = "dev"
_SCENARIO_VARIABLE = "NVMLCHECK_STUB_SCENARIO"  # the stub's own: the scenario it answers from


def simulated_globs(scenario_path: str | os.PathLike[str]) -> tuple[str, ...]:
    """The stand-in globs of the simulation whose scenario is ``scenario_path``."""
    return (os.path.join(os.path.dirname(os.path.abspath(scenario_path)), SIMULATED_DEVICE_DIR, "*"),)


def stub_loaded_from_env() -> None:
    """This process loaded nvmlcheck's stub through ``$NVMLCHECK_LIBNVML`` (a test's child process; proven by
    the library's own symbol): from now on the stand-ins next to the stub's scenario count."""
    from .. import _proc

    _proc.stub_from_env = True


def _simulation_stand_ins() -> tuple[tuple[str, ...], str] | None:
    if _simulated is not None:
        return _simulated
    from .. import _proc

    scenario = os.environ.get(_SCENARIO_VARIABLE) if _proc.stub_from_env else None
    if scenario:
        return simulated_globs(scenario), "the simulated GPU: nvmlcheck's stub library, from $NVMLCHECK_LIBNVML"
    return None


def device_rule(stand_ins: Sequence[str] | str | None = None, *, origin: str | None = None) -> DeviceRule:
    """The rule a scan uses: NVIDIA's majors (read now from ``/proc/devices``) plus ``stand_ins`` (globs, or
    ``:``-separated globs; given explicitly) or, when ``None``, the simulator's (none in a production run)."""
    if stand_ins is not None:
        return DeviceRule(nvidia_majors(), device_file_patterns(stand_ins), origin or "given explicitly")
    simulated = _simulation_stand_ins()
    if simulated is not None:
        # The simulated GPUs are not this host's: a process on a real one holds none of them, and a simulated
        # kill --all-holders on a host with GPUs must never signal it. Only the stand-ins count.
        return DeviceRule(frozenset(), *simulated)
    return DeviceRule(nvidia_majors())


def _rule(rule: DeviceRule | Sequence[str] | str | None) -> DeviceRule:
    return rule if isinstance(rule, DeviceRule) else device_rule(rule)


def open_device_files(pid: int, rule: DeviceRule | Sequence[str] | str | None = None,
                      proc: str = "/proc") -> tuple[str, ...] | None:
    """The NVIDIA device files ``pid`` has open (paths, sorted, each once), or ``None`` when its descriptors cannot
    be read (gone, or not permitted)."""
    found = _fds(pid, _rule(rule), proc)
    return None if found is None else tuple(sorted(found))


def kinds_of(pid: int, rule: DeviceRule, proc: str = "/proc") -> dict[str, str] | None:
    """The NVIDIA device files ``pid`` has open, each with its kind (``"gpu"``, ``"other"``: :meth:`DeviceRule.kind`),
    or ``None`` when its descriptors cannot be read (gone, or not permitted)."""
    return _fds(pid, rule, proc)


def _fd_dir(pid: int | str, proc: str) -> tuple[str, list[str]] | None:
    """The directory of ``pid``'s open descriptors and their names (``None``: unreadable). A process whose main
    thread exited (``pthread_exit``) while others run lists none under ``/proc/PID/fd``: the table is read through
    one of its live threads (``task/TID/fd``), where the files (a GPU context's too) still are."""
    base = f"{proc}/{pid}/fd"
    try:
        names: list[str] | None = os.listdir(base)
    except OSError:
        names = None
    if names:
        return base, names
    try:
        tids = [t for t in os.listdir(f"{proc}/{pid}/task") if t != str(pid) and t.isascii() and t.isdigit()]
    except OSError:
        tids = []
    for tid in sorted(tids):
        try:
            return f"{proc}/{pid}/task/{tid}/fd", os.listdir(f"{proc}/{pid}/task/{tid}/fd")
        except OSError:
            continue
    return None if names is None else (base, names)


def _fds(pid: int | str, rule: DeviceRule, proc: str) -> dict[str, str] | None:
    """Path → kind of each NVIDIA device file ``pid`` has open."""
    where = _fd_dir(pid, proc)
    if where is None:
        return None
    base, names = where
    found: dict[str, str] = {}
    for name in names:
        fd_path = f"{base}/{name}"
        try:
            target = os.readlink(fd_path)
        except OSError:
            continue  # closed meanwhile
        if target in found:
            continue
        kind = rule.kind(fd_path, target)
        if kind is not None:
            found[target] = kind
    return found


class FdScan(NamedTuple):
    """One scan: ``holders`` maps PID → NVIDIA device files open; ``gpu_files`` the per-GPU ones among them
    (``/dev/nvidiaN``; a process with only ``nvidiactl`` or UVM open has none); ``unreadable`` lists the PIDs whose
    descriptors could not be read (not permitted), which may hold device files too; ``rule`` is what counted;
    ``unscanned``: processes left unread because the scan's deadline passed (0: the scan is complete)."""

    holders: dict[int, tuple[str, ...]]
    unreadable: tuple[int, ...]
    rule: DeviceRule
    gpu_files: dict[int, tuple[str, ...]]
    unscanned: int = 0


def scan(rule: DeviceRule | Sequence[str] | str | None = None, proc: str = "/proc", *,
         deadline_ns: int | None = None, clock: Callable[[], int] = time.monotonic_ns,
         progress: Callable[[str, int, int], object] | None = None) -> FdScan:
    """Every process of this PID namespace with an NVIDIA device file open (``rule``: a :class:`DeviceRule`, or
    stand-in globs for :func:`device_rule`). With ``deadline_ns`` (on ``clock``), the scan stops there and counts
    the processes it did not read (``unscanned``): a host with many descriptors takes seconds to read whole.
    ``progress(pid, done, total)`` is called before each process is read (a reader in another thread, bounding a
    read that blocks, tells from it where the scan is: ``holders._bounded``)."""
    rule = _rule(rule)
    holders: dict[int, tuple[str, ...]] = {}
    gpu_files: dict[int, tuple[str, ...]] = {}
    unreadable: list[int] = []
    pids = [name for name in os.listdir(proc) if name.isdigit()]
    for done, name in enumerate(pids):
        if deadline_ns is not None and clock() >= deadline_ns:
            return FdScan(holders, tuple(sorted(unreadable)), rule, gpu_files, len(pids) - done)
        if progress is not None:
            progress(name, done, len(pids))
        files = _fds(name, rule, proc)
        if files is None:
            if os.path.exists(f"{proc}/{name}"):
                unreadable.append(int(name))
        elif files:
            holders[int(name)] = tuple(sorted(files))
            gpu_files[int(name)] = tuple(sorted(p for p, kind in files.items() if kind == "gpu"))
    return FdScan(holders, tuple(sorted(unreadable)), rule, gpu_files)
