"""Explicit simulation: run nvmlcheck against the bundled stub libnvidia-ml (``--simulate``, ``nvmlcheck demo``).

Nothing here is ever chosen automatically: ``backend="auto"`` never falls back to a simulator. Building the stub
needs a C compiler and the ``nvidia-nvml-dev`` package (``pip install 'nvmlcheck[sim]'``).

Named scenarios (:data:`SCENARIOS`): ``h200`` (one idle H200 as measured), ``h200x8`` (eight idle H200s),
``h200-busy`` (one H200 with a process that never lets go of 16 GiB). Any other value is read as a scenario file
path (format: stubs/README.md).

:class:`StubHolderFactory` stands in for real GPU memory holders in a reclamation study
(:func:`nvmlcheck.study.run_study`) on the stub: plain child processes, listed by the stub as pid-bound processes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ._sim.scenario import Scenario
from ._sim.session import StubSession, simulation
from .study import Holder

__all__ = ["CONTEXT_BYTES", "SCENARIOS", "StubHolderFactory", "scenario_named", "simulated"]

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
    """A bundled scenario by name, or a scenario file path. ``ValueError`` if it is neither."""
    factory = SCENARIOS.get(name_or_path)
    if factory is not None:
        return factory()
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = ", ".join(sorted(SCENARIOS))
    raise ValueError(f"--simulate {name_or_path!r}: not a bundled scenario ({names}) nor a scenario file")


@contextlib.contextmanager
def simulated(scenario: Scenario | Path) -> Iterator[StubSession]:
    """Build the stub (cached) and write the scenario while the block runs. The stub and child processes find the
    scenario through their environment; nvmlcheck is told explicitly: open sessions with
    ``library_path=stub.library_path``."""
    with simulation(scenario) as stub:
        yield stub


#: A stand-in holder. argv: kind, device files (``:``-separated, may be empty), free_ms, destroy_ms, linger_ms.
#: It opens the files, prints ``ready PID BYTES DEVICE STEP=NS...`` and waits for ``exit``/``free`` on stdin (or a
#: signal). On a command it simulates the in-process steps of its kind (``free`` sleeps ``free_ms``, the destroy kind
#: sleeps ``destroy_ms``), prints ``done STEP=NS...``; then, with ``linger_ms``, its main thread (the leader) exits
#: alone while another thread keeps the files open for ``linger_ms``: a zombie leader before the whole process has
#: exited, as a CUDA process tearing down looks from ``/proc``.
_CHILD = r"""
import os, sys, time
t0 = time.monotonic_ns()
kind, files, free_ms, destroy_ms, linger_ms = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
fds = [os.open(f, os.O_RDONLY) for f in files.split(":") if f]
init = time.monotonic_ns() - t0
pid, nbytes, device = os.getpid(), sys.argv[6], sys.argv[7]
print(f"ready {pid} {nbytes} {device} init={init} sim=1", flush=True)
line = sys.stdin.readline().strip()
steps = {}
if line == "free":
    t = time.monotonic_ns(); time.sleep(free_ms / 1e3); steps["free"] = time.monotonic_ns() - t
if kind == "destroy":
    t = time.monotonic_ns(); time.sleep(destroy_ms / 1e3); steps["destroy"] = time.monotonic_ns() - t
print("done " + " ".join(f"{k}={v}" for k, v in steps.items()), flush=True)
if linger_ms > 0:
    import ctypes, threading
    def linger():
        time.sleep(linger_ms / 1e3)
        os._exit(0)
    threading.Thread(target=linger).start()
    ctypes.CDLL(None).pthread_exit(None)  # the leader exits alone (CDLL released the GIL for the call)
os._exit(0)
"""

#: What the stub lists for a ``context`` holder, which allocates nothing: about one context (FACTS.md: 518 MiB).
CONTEXT_BYTES = 518 << 20


class StubHolderFactory:
    """Holders for a study on the stub libnvidia-ml: a plain ``python -S -c ...`` child per GPU, which the stub lists
    as a pid-bound compute process holding the requested bytes.

    ``start`` starts the child and rewrites the scenario file at ``scenario_path`` (the one the stub reads,
    :attr:`~nvmlcheck.testing.StubSession.scenario_path`) as ``base`` plus one pid-bound process per live holder;
    ``finish`` writes it back without them. The stub reads the file at the ``nvmlInit`` that takes NVML's reference
    count from 0 to 1, which is why the study opens a fresh session after starting the holders (and why nothing
    else may keep NVML initialised in this process meanwhile).

    ``list_ms``/``release_ms``: how long after the child's death the stub drops it from the list and gives its
    memory back; the defaults resemble an H200 (FACTS.md: off the list ~90 ms, memory back ~120 ms after a kill).
    ``zombie_holds``: an unreaped child still holds. ``base`` defaults to the file's content when the factory is
    made. The ``free`` ending is simulated as ``exit`` (the stub releases memory only after the process ends). A
    scenario fault returning NVML_ERROR_UNKNOWN makes the backend re-initialise NVML, which reloads the scenario and
    restarts the ``list_ms``/``release_ms`` clocks of dead holders: inject other codes into a study.

    Holder kinds (``kind``, as :mod:`nvmlcheck.holder`) are simulated by the child's protocol: it reports its steps
    on its ``ready`` line (``sim=1`` marks them simulated) and, ended by a command, sleeps ``free_ms`` for ``free``
    and ``destroy_ms`` for the ``destroy`` kind and reports those on its ``done`` line; a ``context`` holder (size
    0) is listed with :data:`CONTEXT_BYTES`. ``device_files``: files each child opens and keeps open (point the
    study's ``device_files`` globs at them to watch the files-closed phase); ``linger_ms``: after a command, the
    leader thread exits first and another thread keeps the files open this long (see ``_CHILD``). These are shapes
    for testing the instrument, not measurements.
    """

    def __init__(
        self,
        scenario_path: str | os.PathLike[str],
        *,
        base: Scenario | str | None = None,
        list_ms: int = 90,
        release_ms: int = 120,
        zombie_holds: bool = False,
        python: str = sys.executable,
        kind: str = "alloc",
        device_files: Sequence[str] = (),
        free_ms: int = 0,
        destroy_ms: int = 0,
        linger_ms: int = 0,
    ) -> None:
        from .holder import HOLDER_KINDS

        self.scenario_path = Path(scenario_path)
        if base is None:
            base = self.scenario_path.read_text(encoding="utf-8")
        text = base.render() if isinstance(base, Scenario) else base
        self.base_text = text if text.endswith("\n") else text + "\n"
        if min(list_ms, release_ms, free_ms, destroy_ms, linger_ms) < 0:
            raise ValueError("list_ms, release_ms, free_ms, destroy_ms and linger_ms must be >= 0")
        if kind not in HOLDER_KINDS:
            raise ValueError(f"unknown holder kind {kind!r}: one of {', '.join(HOLDER_KINDS)}")
        self.list_ms = list_ms
        self.release_ms = release_ms
        self.zombie_holds = zombie_holds
        self.python = python
        self.kind = kind
        self.device_files = tuple(device_files)
        self.free_ms, self.destroy_ms, self.linger_ms = free_ms, destroy_ms, linger_ms
        self.live: list[Holder] = []

    def start(self, device: int, nbytes: int) -> Holder:
        """Start a child and list it on ``device`` as holding ``nbytes`` (a context's bytes for size 0)."""
        from .study import HolderError, _check_ready, _read_line

        argv = [self.python, "-S", "-c", _CHILD, self.kind, ":".join(self.device_files), str(self.free_ms),
                str(self.destroy_ms), str(self.linger_ms), str(nbytes), str(device)]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        holder = Holder(child, device, nbytes)
        try:
            holder.steps.update(_check_ready(_read_line(child, 60.0), child.pid, nbytes, device))
        except HolderError:
            holder.kill_quietly()
            child.wait()
            holder.close()
            raise
        self.live.append(holder)
        self._write()
        return holder

    def finish(self, holders: Sequence[Holder]) -> None:
        """Drop ``holders`` from the scenario (a dead pid-bound entry would be listed for ``list_ms`` more after the
        next load, and the next baseline would see it)."""
        gone = {id(h) for h in holders}
        self.live = [h for h in self.live if id(h) not in gone]
        self._write()

    def scenario_text(self) -> str:
        """The scenario as it is written now: ``base`` plus the live holders."""
        extra = "".join(
            f"process device={h.device} kind=compute pid={h.pid} used={h.nbytes or CONTEXT_BYTES} bound=1 "
            f"list_ms={self.list_ms} "
            f"release_ms={self.release_ms}{' zombie_holds=1' if self.zombie_holds else ''}\n"
            for h in self.live
        )
        return self.base_text + extra

    def _write(self) -> None:
        # Replace atomically: a concurrent init must never read half a file.
        fd, tmp = tempfile.mkstemp(prefix=".scenario.", dir=self.scenario_path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.scenario_text())
        os.replace(tmp, self.scenario_path)
