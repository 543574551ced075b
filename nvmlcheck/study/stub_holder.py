"""The simulated holder for ``study --simulate``: :class:`StubHolderFactory` starts plain child processes that the
stub libnvidia-ml lists as pid-bound processes holding GPU memory, in place of real holders
(:func:`nvmlcheck.study.run_study` on the stub)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .._sim.scenario import write_scenario_text
from ..errors import ArgumentError
from .errors import HolderError
from .holders import Holder, check_ready, read_ready_line

if TYPE_CHECKING:
    from ..testing import Scenario

__all__ = ["CONTEXT_BYTES", "StubHolderFactory"]


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

#: What the stub lists for a ``context`` holder, which allocates nothing: about one CUDA context, as
#: docs/driver-facts.md measured one.
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
    memory back; the defaults are of the order a real kill takes, with the list emptying first, the case a check of
    the process list alone gets wrong (docs/driver-facts.md, docs/reclaim-study.md).
    ``zombie_holds``: an unreaped child still holds. ``base`` defaults to the file's content when the factory is
    made. The ``free`` ending is simulated as ``exit`` (the stub releases memory only after the process ends). A
    scenario fault returning NVML_ERROR_UNKNOWN makes the backend re-initialise NVML, which reloads the scenario and
    restarts the ``list_ms``/``release_ms`` clocks of dead holders: inject other codes into a study.

    Holder kinds (``kind``, as :mod:`nvmlcheck.study.child`) are simulated by the child's protocol: it reports its steps
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
        from .child import HOLDER_KINDS

        self.scenario_path = Path(scenario_path)
        if base is None:
            base = self.scenario_path.read_text(encoding="utf-8")
        text = base if isinstance(base, str) else base.render()
        self.base_text = text if text.endswith("\n") else text + "\n"
        if min(list_ms, release_ms, free_ms, destroy_ms, linger_ms) < 0:
            raise ArgumentError("list_ms, release_ms, free_ms, destroy_ms and linger_ms must be >= 0")
        if kind not in HOLDER_KINDS:
            raise ArgumentError(f"unknown holder kind {kind!r}: one of {', '.join(HOLDER_KINDS)}")
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
        argv = [self.python, "-S", "-c", _CHILD, self.kind, ":".join(self.device_files), str(self.free_ms),
                str(self.destroy_ms), str(self.linger_ms), str(nbytes), str(device)]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        holder = Holder(child, device, nbytes)
        try:
            holder.steps.update(check_ready(read_ready_line(child, 60.0), child.pid, nbytes, device))
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
        write_scenario_text(self.scenario_path, self.scenario_text())  # atomically: a concurrent init reads it
