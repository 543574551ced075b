"""MIG end to end through holders and ``kill --all-on-gpu``: a ``MIG-...`` selection names one instance, so its
holders are that instance's processes, never those of the GPU's other instances (a kill would signal them)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import devfiles
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

MIB = 1 << 20
GIB = 1 << 30
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
MIG0 = "MIG-00000000-0000-0000-0000-000000000000"
MIG1 = "MIG-00000000-0000-0000-0000-000000000001"


@pytest.fixture
def dev(tmp_path: Path) -> tuple[Path, str]:
    d = tmp_path / "dev"
    d.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (d / name).write_text("")
    return d, f"{d}/nvidia[0-9]*:{d}/nvidiactl"


@pytest.fixture
def hold(dev: tuple[Path, str]) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-S", "-c", HOLD, str(dev[0] / "nvidia0")], stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def two_instances(in0: int | None, in1: int | None, *, unplaced: int | None = None) -> Scenario:
    """GPU 0 in MIG mode with MIG 0 (GI 1) and MIG 1 (GI 2); ``in0``/``in1`` run in them, ``unplaced`` on the
    parent with no instance id."""
    sc = Scenario.h200(2)
    sc.set_device(0, mig=True, used_bytes=55 * MIB)
    sc.add_mig_device(0, 0, gi=1, total_bytes=16 * GIB)
    sc.add_mig_device(0, 1, gi=2, total_bytes=32 * GIB)
    if in0 is not None:
        sc.add_process(0, in0, used_bytes=GIB, gi=1, ci=0)
    if in1 is not None:
        sc.add_process(0, in1, used_bytes=GIB, gi=2, ci=0)
    if unplaced is not None:
        sc.add_process(0, unplaced, used_bytes=GIB)
    return sc


def test_holders_of_an_instance_are_its_own(
    dev: tuple[Path, str], hold: Callable[[], subprocess.Popen[bytes]], gpus: Callable[[Scenario], nc.Session]
) -> None:
    a, b = hold(), hold()
    with gpus(two_instances(a.pid, b.pid)) as session:
        found = session.holders([MIG1], device_files=dev[1])
        whole = session.holders([0], device_files=dev[1])
    listed = [(h.pid, [(g.index, g.uuid) for g in h.gpus]) for h in found if h.gpus]
    assert listed == [(b.pid, [(0, MIG1)])]  # named as the instance, as wait and ready name it
    assert {h.pid for h in whole if h.gpus} == {a.pid, b.pid}


def test_all_on_gpu_of_an_instance_never_chooses_another_instances_process(
    dev: tuple[Path, str], hold: Callable[[], subprocess.Popen[bytes]], gpus: Callable[[Scenario], nc.Session]
) -> None:
    a, b = hold(), hold()
    with gpus(two_instances(a.pid, b.pid)) as session, devfiles.simulated_stand_ins(dev[1].split(":"), "the test"):
        sel = nc.select_kill_holders(session, [MIG0], all_holders=False)
    assert [t.pid for t in sel.targets] == [a.pid]
    skipped = {h.pid: why for h, why in sel.skipped}
    assert b.pid in skipped and skipped[b.pid] == "in a MIG instance of GPU 0, not selected (--devices)"


def test_all_on_gpu_of_an_instance_refuses_a_process_it_cannot_place(
    dev: tuple[Path, str], hold: Callable[[], subprocess.Popen[bytes]], gpus: Callable[[Scenario], nc.Session]
) -> None:
    # A process on the parent's lists with no instance id may run in the selected instance: nothing is chosen
    # (it cannot be proven to be there, and leaving it would call the instance free of holders).
    a = hold()
    with gpus(two_instances(None, None, unplaced=a.pid)) as session, \
            devfiles.simulated_stand_ins(dev[1].split(":"), "the test"), pytest.raises(nc.NvmlCheckError) as err:
        nc.select_kill_holders(session, [MIG0], all_holders=False)
    assert "cannot tell what holds it" in str(err.value)


def test_cli_kill_all_on_gpu_of_an_instance_plans_only_its_process(
    tmp_path: Path, hold: Callable[[], subprocess.Popen[bytes]]
) -> None:
    # The command passed the selection on as NVML indices: MIG- became its whole GPU, and both were signalled.
    a, b = hold(), hold()
    two_instances(a.pid, b.pid).write(tmp_path / "s.txt")  # dev/ beside it holds the stand-in device files
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--simulate", str(tmp_path / "s.txt"), "kill",
                           "--all-on-gpu", "--devices", MIG0, "--dry-run"], capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    planned = done.stderr.split("plan:")[1]
    assert f"pid {a.pid} " in planned and f"pid {b.pid} " not in planned
    assert f"left alone: pid {b.pid} (python): in a MIG instance of GPU 0" in done.stderr
    assert a.poll() is None and b.poll() is None
