"""Hypothesis over random stub scenarios with random faults: return codes from nvml.h on random functions with random
after/count, lost devices, INSUFFICIENT_SIZE races that grow or shrink lists, the 535.43 struct quirk, and timeline
changes that add load. Two properties:

* every snapshot either returns data consistent with the scenario or raises a documented exception (an
  :class:`~nvmlcheck.NvmlCheckError`); devices that cannot be read are failures, never data;
* ``wait_until_clean`` never returns clean while the scenario is not clean (a device holds memory, a declared process
  is listed and no race can remove it, or a GPU is lost).

Waits run on an injected clock, so each example takes milliseconds. ``NVMLCHECK_FUZZ_EXAMPLES`` raises the count.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import nvmlcheck as nc
from nvmlcheck import errors
from nvmlcheck._sim.symbols import DEVICE_FUNCTIONS
from nvmlcheck.testing import NVML_FUNCTIONS, PROCESS_KINDS, Scenario
from nvmlcheck.wait import PollPolicy

from ._support import MIB, Stub

pytestmark = pytest.mark.stub

EXAMPLES = int(os.environ.get("NVMLCHECK_FUZZ_EXAMPLES", "600"))
TOTAL = 150_754_820_096
LIMIT = 16 * MIB  # the default predicate's limit on used memory
RACE_PID_BASE = 4_100_000  # the stub's synthetic race processes count up from here
# Not faulted: nvmlShutdown (a failed shutdown leaves the stub's count up, which no caller can repair) and the
# legacy init names nvmlcheck never calls while nvmlInit_v2 exists.
_NOT_FAULTED = ("nvmlErrorString", "nvmlShutdown", "nvmlInit", "nvmlInitWithFlags")
FAULTABLE = tuple(f for f in NVML_FUNCTIONS if f not in _NOT_FAULTED)
CODES = (*errors.KNOWN_CODES, 4242)  # every code nvml.h defines, and one it does not
# Half the faults hit what a wait calls on every poll, with the codes that change what it sees.
POLL_PATH = (
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v3",  # twice: most processes are compute processes
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
)
TELLING_CODES = (1, 3, 4, 7, 13, 15, 999, 4242)


@dataclass
class Proc:
    pid: int
    kind: str
    used: int | None  # None: NVML's "not available"
    holds: int


@dataclass
class Model:
    """What the scenario says, as far as the checks need it."""

    devices: int
    base_used: list[int]
    lost: set[int]
    procs: list[list[Proc]]  # per device, in declaration order
    shrinking: set[tuple[int, str]] = field(default_factory=set)  # (device, kind) with a race that removes entries
    timeline_pids: set[int] = field(default_factory=set)
    timeline_lost: set[int] = field(default_factory=set)
    quirk: bool = False
    faults: int = 0

    def never_clean(self) -> bool:
        """Dirty at every moment, whatever the faults: memory held by no process, a lost GPU, or a declared process
        that no race can remove (timeline lines only add load, and a re-init reloads the initial state)."""
        if any(u > LIMIT for u in self.base_used) or self.lost:
            return True
        return any(p for d, procs in enumerate(self.procs) for p in procs if (d, p.kind) not in self.shrinking)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Scenario, Model]:
    n = draw(st.integers(1, 3))
    sc = Scenario()
    model = Model(n, [], set(), [[] for _ in range(n)])
    pids = iter(range(4_000_000, 4_100_000, 7))
    for i in range(n):
        used = draw(st.sampled_from([0, 0, 0, 4 * MIB, LIMIT, LIMIT + 1, 3 << 30]))
        lost = draw(st.booleans()) if draw(st.integers(0, 9)) == 0 else False
        sc.add_device(total_bytes=TOTAL, reserved_bytes=644_939_776, used_bytes=used, lost=lost)
        model.base_used.append(used)
        if lost:
            model.lost.add(i)
        for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2, 3]))):  # idle GPUs half the time: waits can end clean
            kind = draw(st.sampled_from(("compute", *PROCESS_KINDS)))
            used_bytes = draw(st.one_of(st.none(), st.integers(0, 8 << 30)))
            holds = used_bytes if used_bytes is not None else draw(st.integers(0, 1 << 30))
            pid = next(pids)
            sc.add_process(i, pid, kind, used_bytes, holds_bytes=holds)
            model.procs[i].append(Proc(pid, kind, used_bytes, holds))
    for _ in range(draw(st.integers(0, 4))):
        fn = draw(st.sampled_from(POLL_PATH) | st.sampled_from(FAULTABLE))
        device = None
        if fn in DEVICE_FUNCTIONS and draw(st.booleans()):  # (a MIG device's calls take no GPU: refused)
            device = draw(st.integers(0, n - 1))
        sc.fault(
            fn,
            code=draw(st.sampled_from(TELLING_CODES) | st.sampled_from(CODES)),
            device=device,
            after=draw(st.sampled_from([0, 0, 1, 2, 3, 5, 8, 12])),  # early faults fire within the first polls
            count=draw(st.sampled_from([0, 0, 1, 2, 4])),  # 0: sticky
        )
        model.faults += 1
    for _ in range(draw(st.integers(0, 1))):
        device, kind = draw(st.integers(0, n - 1)), draw(st.sampled_from(PROCESS_KINDS))
        grow = draw(st.integers(-3, 150))
        sc.race(device, kind, grow=grow, count=draw(st.integers(0, 3)))
        if grow < 0:
            model.shrinking.add((device, kind))
    if draw(st.integers(0, 9)) == 0:
        sc.quirk(proc_struct="535.43")
        model.quirk = True
    for _ in range(draw(st.integers(0, 2))):  # later load: a process appears, or a GPU falls off the bus
        step = sc.at_call(draw(st.integers(1, 200)))
        device = draw(st.integers(0, n - 1))
        if draw(st.booleans()):
            pid = next(pids)
            step.add_process(device, pid, draw(st.sampled_from(PROCESS_KINDS)), MIB)
            model.timeline_pids.add(pid)
        else:
            step.set_device(device, lost=True)
            model.timeline_lost.add(device)
    return sc, model


def check_snapshot(snap: nc.Snapshot, model: Model) -> None:
    """A snapshot that was returned must be consistent with the scenario."""
    indices = [d.index for d in snap.devices] + [f.index for f in snap.failures]
    assert sorted(indices) == list(range(model.devices)), indices  # every GPU once: data or failure
    for f in snap.failures:
        assert isinstance(f.error, nc.NvmlCheckError), f.error
    for d in snap.devices:
        assert d.index not in model.lost, f"GPU {d.index} is lost but reported as data"
        if d.memory is not None:
            assert d.memory.total_bytes == TOTAL
            assert model.base_used[d.index] <= d.memory.used_bytes <= TOTAL
            assert d.memory.used_bytes + d.memory.free_bytes <= TOTAL
        declared = {p.pid: p for p in model.procs[d.index]}
        for kind in nc.ProcessKind:
            listed = d.processes_of(kind)
            if listed is None:
                assert d.why_unknown(f"processes.{kind.value}"), "an unknown list must say why"
                continue
            pids = [p.pid for p in listed]
            assert len(set(pids)) == len(pids), f"duplicated entries: {pids}"
            mine = [p for p in model.procs[d.index] if p.kind == kind.value]
            if (d.index, kind.value) not in model.shrinking:
                assert pids[: len(mine)] == [p.pid for p in mine], "a declared process is missing: truncated?"
            for p in listed:
                if p.pid in declared:
                    assert p.used_bytes == declared[p.pid].used
                else:
                    assert p.pid >= RACE_PID_BASE or p.pid in model.timeline_pids, f"unknown pid {p.pid}"


class FakeTime:
    """An injected clock: each reading advances 20 µs (a poll's cost), each sleep advances what it asked."""

    def __init__(self) -> None:
        self.now = 0

    def clock(self) -> int:
        self.now += 20_000
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(1, round(seconds * 1e9))


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=scenarios(), fields=st.sampled_from([nc.Fields.WAIT, nc.Fields.ALL, nc.Fields.MEMORY]))
def test_random_faults_give_consistent_data_or_documented_errors(
    stub: Stub, case: tuple[Scenario, Model], fields: nc.Fields
) -> None:
    scenario, model = case
    try:
        session = stub.open(scenario)
    except nc.NvmlCheckError as exc:
        event(f"open: {type(exc).__name__}")
        return  # an init fault: a documented error, and nothing is left open (checked by the fixture)
    with session:
        for _ in range(4):
            try:
                snap = session.snapshot(fields=fields)
            except nc.NvmlCheckError as exc:
                event(f"snapshot raised {type(exc).__name__}")
                continue
            event(f"snapshot: {len(snap.devices)} device(s), {len(snap.failures)} failure(s)")
            check_snapshot(snap, model)
        fake = FakeTime()
        try:
            result = session.wait_until_clean(
                timeout=0.02, policy=PollPolicy.every(0.001), clock=fake.clock, sleep=fake.sleep
            )
        except (nc.WaitTimeout, nc.NvmlCheckError) as exc:
            event(f"wait raised {type(exc).__name__} ({'never clean' if model.never_clean() else 'may be clean'})")
            return
        event("wait: clean")
        assert not model.never_clean(), f"the wait returned clean on a scenario that never is:\n{scenario.render()}"
        check_snapshot(result.snapshot, model)
        assert all(d.processes == () for d in result.snapshot.devices)
        assert all(d.memory is not None and d.memory.used_bytes <= LIMIT for d in result.snapshot.devices)
