"""Explicit simulation: run nvmlcheck against the bundled stub libnvidia-ml (``--simulate``, ``nvmlcheck demo``).

Nothing here is ever chosen automatically: ``backend="auto"`` never falls back to a simulator. Building the stub
needs a C compiler and the ``nvidia-nvml-dev`` package (``pip install 'nvmlcheck[sim]'``).

Named scenarios (:data:`SCENARIOS`): ``h200`` (one idle H200 as measured), ``h200x8`` (eight idle H200s),
``h200-busy`` (one H200 with a process that never lets go of 16 GiB). Any other value is read as a scenario file
path (format: stubs/README.md).

:func:`add_bound_process` and :func:`remove_bound_process` change a scenario *file* in place (``nvmlcheck simulate
hold``), atomically and under a lock, for processes that read it meanwhile. The stand-in for real GPU memory
holders in a study on the stub, :class:`StubHolderFactory`, lives in :mod:`nvmlcheck.study.stub_holder`
(re-exported here for one release).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from ._sim.scenario import ProcessKindName, Scenario, write_scenario_text
from ._sim.session import StubSession, simulation
from .errors import ArgumentError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .study.stub_holder import CONTEXT_BYTES, StubHolderFactory

__all__ = ["CONTEXT_BYTES", "SCENARIOS", "StubHolderFactory", "add_bound_process", "bound_process_line",
           "remove_bound_process", "scenario_named", "simulated"]

GIB = 1 << 30


def _busy() -> Scenario:
    sc = Scenario.h200()
    sc.add_process(0, 4_123_456, used_bytes=16 * GIB)
    return sc


#: Bundled scenarios by name.
SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "h200": Scenario.h200,
    "h200x8": lambda: Scenario.h200(devices=8),
    "h200-busy": _busy,
}


def scenario_named(name_or_path: str) -> Scenario | Path:
    """A bundled scenario by name, or a scenario file path. ``ValueError`` if it is neither: a file whose first line
    (after comments and blank lines) is not ``nvmlcheck-stub-scenario 1`` is refused here, not by the stub's
    ``nvmlInit``."""
    factory = SCENARIOS.get(name_or_path)
    if factory is not None:
        return factory()
    path = Path(name_or_path)
    if path.is_file():
        why = _not_a_scenario(path)
        if why is not None:
            raise ArgumentError(f"--simulate {name_or_path!r}: not a scenario file ({why}); write one with "
                                "`nvmlcheck simulate scenario` or Scenario.write (docs/testing.md)")
        return path
    names = ", ".join(sorted(SCENARIOS))
    raise ArgumentError(f"--simulate {name_or_path!r}: not a bundled scenario ({names}) nor a scenario file")


_MAGIC = "nvmlcheck-stub-scenario 1"


def _not_a_scenario(path: Path) -> str | None:
    """Why ``path`` is no scenario file (its first line that is not blank or a comment is not the format's first
    line), or ``None``. The rest is the stub's to judge."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                words = line.split("#", 1)[0].split()
                if words:
                    return None if " ".join(words) == _MAGIC else f"its first line must be {_MAGIC!r}"
    except OSError as exc:
        return exc.strerror or str(exc)
    return "it is empty"


@contextlib.contextmanager
def simulated(scenario: Scenario | Path) -> Iterator[StubSession]:
    """Build the stub (cached) and write the scenario while the block runs. The stub and child processes find the
    scenario through their environment; nvmlcheck is told explicitly: open sessions with
    ``library_path=stub.library_path``."""
    with simulation(scenario) as stub:
        yield stub


# A device declared at the top level of a scenario file (not a timeline line, which starts with `at`).
_DEVICE_LINE = re.compile(r"^\s*device\s+index=(\d+)\b", re.MULTILINE)
_DEVICE_TOTAL = re.compile(r"^\s*device\s+index=(\d+)\b[^\n]*?\btotal=(\d+)", re.MULTILINE)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on the scenario's directory while its file is read and replaced: two ``simulate hold``
    commands on one file do not lose each other's line (the file itself is replaced, so it cannot carry the lock)."""
    import fcntl

    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _append(path: Path, line: str) -> None:
    with _locked(path):
        text = path.read_text(encoding="utf-8")
        write_scenario_text(path, text + ("" if text.endswith("\n") else "\n") + line + "\n")


def bound_process_line(
    path: str | os.PathLike[str],
    device: int,
    pid: int,
    used_bytes: int,
    *,
    kind: ProcessKindName = "compute",
    list_ms: int = 90,
    release_ms: int = 120,
) -> str:
    """The scenario line of a process bound to ``pid`` on GPU ``device`` of the scenario file at ``path``, checked
    against it. Raises :class:`~nvmlcheck.ArgumentError` (a ``ValueError``) for a GPU the file does not declare or
    a bad value."""
    from .errors import ArgumentError

    target = Path(path)
    text = target.read_text(encoding="utf-8")
    declared = {int(i) for i in _DEVICE_LINE.findall(text)}
    if device not in declared:
        raise ArgumentError(f"GPU {device} is not in the scenario {target} (it declares GPU "
                            f"{', '.join(map(str, sorted(declared))) or 'none'})")
    check_hold_fits(text, device, used_bytes, str(target))
    renderer = Scenario()  # only to validate and render the line, in the scenario format's own words
    for _ in range(device + 1):
        renderer.add_device()
    renderer.add_process(device, pid, kind, used_bytes, bound=True, list_ms=list_ms, release_ms=release_ms)
    return renderer.render().splitlines()[-1]


def check_hold_fits(scenario_text: str, device: int, used_bytes: int | None, where: str) -> None:
    """Refuse a held amount larger than GPU ``device``'s total in the scenario (``where`` names it): the stub would
    report more used than the GPU has, NVML's answer for a struct layout misread ("UNREADABLE"), never a hold.
    Used by ``simulate hold`` and the test kit's bound processes; a scenario written by hand may still say so."""
    total = next((int(t) for i, t in _DEVICE_TOTAL.findall(scenario_text) if int(i) == device), None)
    if total is not None and isinstance(used_bytes, int) and used_bytes > total:
        from ._units import format_bytes
        from .errors import ArgumentError

        raise ArgumentError(f"{format_bytes(used_bytes)} is more than GPU {device} of {where} has "
                            f"({format_bytes(total)})")


def add_bound_process(
    path: str | os.PathLike[str],
    device: int,
    pid: int,
    used_bytes: int,
    *,
    kind: ProcessKindName = "compute",
    list_ms: int = 90,
    release_ms: int = 120,
) -> None:
    """Add process ``pid`` to the scenario file at ``path``, bound to the real process: listed on GPU ``device``
    with ``used_bytes`` while it lives, off the list ``list_ms`` and its memory back ``release_ms`` after it exits.

    Raises :class:`~nvmlcheck.ArgumentError` (a ``ValueError``) for a GPU the file does not declare or a bad value
    (:func:`bound_process_line`); the file is left as it was.
    """
    line = bound_process_line(path, device, pid, used_bytes, kind=kind, list_ms=list_ms, release_ms=release_ms)
    _append(Path(path), line)


def remove_bound_process(
    path: str | os.PathLike[str], device: int, pid: int, *, kind: ProcessKindName = "compute"
) -> None:
    """Remove process ``pid`` of ``kind`` on GPU ``device`` from the scenario file at ``path`` (a ``remove=1`` line,
    as the scenario format says; nothing happens to an entry that is not there)."""
    _append(Path(path), f"process device={int(device)} kind={kind} pid={int(pid)} remove=1")


def __getattr__(name: str) -> object:
    # Moved to nvmlcheck.study.stub_holder, re-exported for one release; resolved on use, so that --simulate does
    # not load the study package.
    if name in ("CONTEXT_BYTES", "StubHolderFactory"):
        from .study import stub_holder

        return getattr(stub_holder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
