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
from .holders import Holder, HolderSpec, LineReader, check_ready

if TYPE_CHECKING:
    from ..testing import Scenario

__all__ = ["CONTEXT_BYTES", "StubHolderFactory"]


#: A stand-in holder. argv: kind, device files (``:``-separated, may be empty), free_ms, destroy_ms, linger_ms,
#: bytes, device, role, setup_ms. It opens the files, sleeps ``setup_ms`` (a simulated set-up step: ``pin``), prints
#: ``ready PID BYTES DEVICE STEP=NS...`` (an ``exporter`` adds ``ipc:HEX``; a ``root`` prints ``nccl-id HEX`` before)
#: and waits for ``exit``/``free`` on stdin (or a signal). On a command it simulates the in-process steps of its kind
#: (``free`` sleeps ``free_ms``, the destroy kind sleeps ``destroy_ms``), prints ``done STEP=NS...``; then, with
#: ``linger_ms``, its main thread (the leader) exits alone while another thread keeps the files open for
#: ``linger_ms``: a zombie leader before the whole process has exited, as a CUDA process tearing down looks from
#: ``/proc``.
_CHILD = r"""
import os, sys, time
t0 = time.monotonic_ns()
kind, files, free_ms, destroy_ms, linger_ms = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
fds = [os.open(f, os.O_RDONLY) for f in files.split(":") if f]
init = time.monotonic_ns() - t0
pid, nbytes, device, role, setup_ms = os.getpid(), sys.argv[6], sys.argv[7], sys.argv[8], int(sys.argv[9])
extra = ""
if setup_ms:
    t = time.monotonic_ns(); time.sleep(setup_ms / 1e3); extra += f" pin={time.monotonic_ns() - t}"
if role == "root":
    print("nccl-id " + "ab" * 128, flush=True)
if role == "exporter":
    extra += " ipc:" + "cd" * 64
print(f"ready {pid} {nbytes} {device} init={init} sim=1{extra}", flush=True)
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
    0) is listed with :data:`CONTEXT_BYTES`. The third edition's kinds start through ``start_group``: a ``pinned``
    holder sleeps ``pin_ms_per_gib`` per pinned GiB before it is ready (step ``pin``) and is listed and holds its
    memory ``pinned_ms_per_gib`` longer per pinned GiB after it dies; an ``ipc`` exporter prints a handle its
    importers get (each listed with :data:`CONTEXT_BYTES`), and the exporter's allocation is held by the side ended
    last (so with the exporter ended first the importers keep it); an ``nccl`` root prints an id its ranks get;
    ``mps`` clients are listed as MPS processes. ``device_files``: files each child opens and keeps open (point the
    study's ``device_files`` globs at them to watch the files-closed phase); ``linger_ms``: after a command, the
    leader thread exits first and another thread keeps the files open this long (see ``_CHILD``). These are shapes
    for testing the instrument, not measurements: every record says ``simulated: true``, with ``simulation`` (what
    simulated it: ``"the stub libnvidia-ml and stub holders"``, or the text given).
    """

    #: Every record of a study with these holders says ``simulated: true`` (``RunRecord.simulated``).
    simulated = True

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
        pinned_ms_per_gib: float = 100.0,
        pin_ms_per_gib: float = 0.0,
        simulation: str = "the stub libnvidia-ml and stub holders",
    ) -> None:
        from .child import HOLDER_KINDS

        self.scenario_path = Path(scenario_path)
        if base is None:
            base = self.scenario_path.read_text(encoding="utf-8")
        text = base if isinstance(base, str) else base.render()
        self.base_text = text if text.endswith("\n") else text + "\n"
        if min(list_ms, release_ms, free_ms, destroy_ms, linger_ms, pinned_ms_per_gib, pin_ms_per_gib) < 0:
            raise ArgumentError("list_ms, release_ms, free_ms, destroy_ms, linger_ms, pinned_ms_per_gib and "
                             "pin_ms_per_gib must be >= 0")
        if kind not in HOLDER_KINDS:
            raise ArgumentError(f"unknown holder kind {kind!r}: one of {', '.join(HOLDER_KINDS)}")
        self.list_ms = list_ms
        self.release_ms = release_ms
        self.zombie_holds = zombie_holds
        self.python = python
        self.kind = kind
        self.device_files = tuple(device_files)
        self.free_ms, self.destroy_ms, self.linger_ms = free_ms, destroy_ms, linger_ms
        self.pinned_ms_per_gib, self.pin_ms_per_gib = pinned_ms_per_gib, pin_ms_per_gib
        self.simulation = simulation
        self.live: list[Holder] = []
        #: pid -> the scenario keys of its entry, for holders that are not listed the plain way.
        self.entries: dict[int, str] = {}

    def start(self, device: int, nbytes: int) -> Holder:
        """Start a child and list it on ``device`` as holding ``nbytes`` (a context's bytes for size 0)."""
        holder, reader = self._launch(device, nbytes)
        self._ready(holder, reader)
        self.live.append(holder)
        self._write()
        return holder

    def start_group(self, devices: Sequence[int], spec: HolderSpec, per_gpu: int) -> list[Holder]:
        """One run's holders of any kind (see the class); all or none."""
        started: list[tuple[Holder, LineReader]] = []
        try:
            if spec.kind == "ipc":
                for device in devices:
                    self._ipc(device, spec, started)
            elif spec.kind == "nccl":
                self._nccl(devices, spec, started)
            else:
                gib = spec.pinned_bytes / (1 << 30)
                delay = round(gib * self.pinned_ms_per_gib)
                for device in devices:
                    for _ in range(per_gpu):
                        role = "client" if spec.kind == "mps" else "holder"
                        h, r = self._launch(device, spec.nbytes, role, setup_ms=round(gib * self.pin_ms_per_gib))
                        started.append((h, r))
                        self._ready(h, r)
                        kind = "mps" if spec.kind == "mps" else "compute"
                        self.entries[h.pid] = self._entry(h, kind=kind, extra_ms=delay)
        except BaseException:
            for h, _ in started:
                h.kill_quietly()
                h.process.wait()
                h.close()
                self.entries.pop(h.pid, None)
            raise
        holders = [h for h, _ in started]
        self.live.extend(holders)
        self._write()
        return holders

    def _ipc(self, device: int, spec: HolderSpec, started: list[tuple[Holder, LineReader]]) -> None:
        exporter, r = self._launch(device, spec.nbytes, "exporter")
        started.append((exporter, r))
        self._ready(exporter, r)
        importers = []
        for _ in range(spec.importers):
            h, r = self._launch(device, 0, "importer")
            started.append((h, r))
            importers.append((h, r))
        for h, r in importers:
            self._ready(h, r)
        # The allocation is held by the side ended last: with the exporter first, the importers keep it.
        keeper = importers[0][0] if importers and spec.first == "exporter" else exporter
        size = spec.nbytes
        self.entries[exporter.pid] = self._entry(exporter, holds=size if keeper is exporter else 0)
        for h, _ in importers:
            self.entries[h.pid] = self._entry(h, used=CONTEXT_BYTES,
                                              holds=CONTEXT_BYTES + (size if h is keeper else 0))

    def _nccl(self, devices: Sequence[int], spec: HolderSpec, started: list[tuple[Holder, LineReader]]) -> None:
        root, r = self._launch(devices[0], spec.nbytes, "root")
        started.append((root, r))
        first = r.line(60.0).split()
        if first[:1] != [b"nccl-id"]:
            raise HolderError(f"the simulated NCCL root printed {first!r} before its ready line")
        for device in devices[1:]:
            started.append(self._launch(device, spec.nbytes, "rank"))
        for h, reader in started:
            self._ready(h, reader)

    def _entry(self, h: Holder, *, kind: str = "compute", used: int | None = None, holds: int | None = None,
               extra_ms: int = 0) -> str:
        listed = used if used is not None else h.nbytes or CONTEXT_BYTES
        held = f" holds={holds}" if holds is not None else ""
        return (f"kind={kind} pid={h.pid} used={listed}{held} bound=1 list_ms={self.list_ms + extra_ms} "
                f"release_ms={self.release_ms + extra_ms}")

    def _launch(self, device: int, nbytes: int, role: str = "holder", setup_ms: int = 0) -> tuple[Holder, LineReader]:
        argv = [self.python, "-S", "-c", _CHILD, self.kind, ":".join(self.device_files), str(self.free_ms),
                str(self.destroy_ms), str(self.linger_ms), str(nbytes), str(device), role, str(setup_ms)]
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return Holder(child, device, nbytes, role=role), LineReader(child)

    def _ready(self, holder: Holder, reader: LineReader) -> None:
        from .child import parse_words

        try:
            line = reader.line(60.0)
            holder.steps.update(check_ready(line, holder.pid, holder.nbytes, holder.device))
        except HolderError:
            holder.kill_quietly()
            holder.process.wait()
            holder.close()
            raise
        holder.words.update(parse_words(line.decode(errors="replace").split()[4:]))

    def finish(self, holders: Sequence[Holder]) -> None:
        """Drop ``holders`` from the scenario (a dead pid-bound entry would be listed for ``list_ms`` more after the
        next load, and the next baseline would see it)."""
        gone = {id(h) for h in holders}
        self.live = [h for h in self.live if id(h) not in gone]
        for h in holders:
            self.entries.pop(h.pid, None)
        self._write()

    def scenario_text(self) -> str:
        """The scenario as it is written now: ``base`` plus the live holders."""
        zombie = " zombie_holds=1" if self.zombie_holds else ""
        extra = "".join(f"process device={h.device} {self.entries.get(h.pid) or self._entry(h)}{zombie}\n"
                        for h in self.live)
        return self.base_text + extra

    def _write(self) -> None:
        write_scenario_text(self.scenario_path, self.scenario_text())  # atomically: a concurrent init reads it
