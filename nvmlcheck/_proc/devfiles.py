"""Which processes have NVIDIA device files open: a scan of ``/proc/*/fd``.

The patterns are globs matched (``fnmatch``) against the targets of the ``/proc/PID/fd/N`` links. The default is
:data:`DEFAULT_DEVICE_FILES`; ``$NVMLCHECK_DEVICE_FILES`` (one glob, or several separated by ``:``) replaces it, and
so does the ``patterns`` argument, so that tests on machines without ``/dev/nvidia*`` can open files of their own.
Every CUDA process opens every ``/dev/nvidiaN`` whatever GPU it uses (docs/driver-facts.md): a device file finds a
holder but cannot say which GPU it holds. Entry points: :func:`scan`, :func:`open_device_files`,
:func:`device_file_patterns`; how ``holders`` and ``kill --all-holders`` use it: docs/killing.md.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

__all__ = ["DEFAULT_DEVICE_FILES", "ENV_VAR", "FdScan", "device_file_patterns", "open_device_files", "scan"]

#: The NVIDIA device files: one per GPU, the control device, UVM, and the MIG/capability devices.
DEFAULT_DEVICE_FILES: tuple[str, ...] = (
    "/dev/nvidia[0-9]*",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm*",
    "/dev/nvidia-caps/*",
)
#: The environment variable that replaces :data:`DEFAULT_DEVICE_FILES` (``:``-separated globs).
ENV_VAR = "NVMLCHECK_DEVICE_FILES"


def device_file_patterns(patterns: Sequence[str] | str | None = None) -> tuple[str, ...]:
    """The globs to use: ``patterns`` (a glob, or ``:``-separated globs, or a sequence), else
    ``$NVMLCHECK_DEVICE_FILES``, else :data:`DEFAULT_DEVICE_FILES`."""
    if patterns is None:
        env = os.environ.get(ENV_VAR, "")
        patterns = env if env.strip() else DEFAULT_DEVICE_FILES
    items = patterns.split(":") if isinstance(patterns, str) else list(patterns)
    out = tuple(p.strip() for p in items if p.strip())
    bad = next((p for p in out if not p.startswith("/")), None)
    if not out or bad is not None:
        from ..errors import ArgumentError  # layer 1, loaded only for this error

        raise ArgumentError(f"a device-file pattern is an absolute path glob, got {bad!r}" if out
                            else "no device-file pattern given")
    return out


def _matcher(patterns: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns))


def open_device_files(pid: int, patterns: Sequence[str], proc: str = "/proc") -> tuple[str, ...] | None:
    """The matching files ``pid`` has open (sorted, each once), or ``None`` when its descriptors cannot be read
    (gone, or not permitted)."""
    return _fds(pid, _matcher(patterns), proc)


def _fds(pid: int | str, match: re.Pattern[str], proc: str) -> tuple[str, ...] | None:
    base = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(base)
    except OSError:
        return None
    found: set[str] = set()
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
        except OSError:
            continue  # closed meanwhile
        if match.match(target):
            found.add(target)
    return tuple(sorted(found))


class FdScan(NamedTuple):
    """One scan: ``holders`` maps PID → matching files open; ``unreadable`` lists the PIDs whose descriptors could
    not be read (not permitted), which may hold device files too."""

    holders: dict[int, tuple[str, ...]]
    unreadable: tuple[int, ...]


def scan(patterns: Sequence[str] | str | None = None, proc: str = "/proc") -> FdScan:
    """Every process of this PID namespace with a matching file open (see :func:`device_file_patterns`)."""
    match = _matcher(device_file_patterns(patterns))
    holders: dict[int, tuple[str, ...]] = {}
    unreadable: list[int] = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        files = _fds(name, match, proc)
        if files is None:
            if os.path.exists(f"{proc}/{name}"):
                unreadable.append(int(name))
        elif files:
            holders[int(name)] = files
    return FdScan(holders, tuple(sorted(unreadable)))
