"""MIG end to end through holders and ``kill --all-on-gpu``: a ``MIG-...`` selection names one instance, so its
holders are that instance's processes, never those of the GPU's other instances (a kill would signal them)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import devfiles
from nvmlcheck.testing import Scenario

from .conftest import GIB, MIG0, MIG1
from .conftest import two_instances as _two_instances

pytestmark = pytest.mark.stub

def two_instances(in0: int | None, in1: int | None, *, unplaced: int | None = None) -> Scenario:
    return _two_instances(in0=in0, in1=in1, unplaced=unplaced)


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
    assert b.pid in skipped and skipped[b.pid] == "in GPU 0 MIG 1, not selected (--devices)"


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
    assert f"left alone: pid {b.pid} (python): in GPU 0 MIG 1, not selected" in done.stderr
    assert a.poll() is None and b.poll() is None


# --- which instance each holder runs in ----------------------------------------------------------------------------
# GpuUse carried only the GPU's UUID: on a GPU in MIG mode, `holders` (its table, its JSON) did not say in which
# instance each holder runs, which is what an operator of a shared GPU needs before a kill.


def _instances(h: nc.Holder) -> list[tuple[int, int | None, str | None, int | None, int | None, str | None]]:
    return [(g.index, g.mig_index, g.mig_uuid, g.gpu_instance_id, g.compute_instance_id, g.why_instance_unknown)
            for g in h.gpus]


def test_each_holder_of_a_mig_gpu_names_its_instance(gpus: Callable[[Scenario], nc.Session]) -> None:
    sc = two_instances(4_000_010, 4_000_020, unplaced=4_000_030)
    sc.add_process(1, 4_000_040, used_bytes=GIB)  # GPU 1 is not in MIG mode
    with gpus(sc) as session:
        found = {h.pid: h for h in session.holders()}
    with gpus(two_instances(4_000_010, 4_000_020)) as session:
        alone = {h.pid: h for h in session.holders([MIG1])}
    assert _instances(found[4_000_010]) == [(0, 0, MIG0, 1, 0, None)]
    assert _instances(found[4_000_020]) == [(0, 1, MIG1, 2, 0, None)]
    # Listed with no instance id: unknown, and why, never a guess.
    assert _instances(found[4_000_030]) == [(0, None, None, None, None,
                                             "NVML lists the process with no GPU-instance id")]
    assert _instances(found[4_000_040]) == [(1, None, None, None, None, None)]
    assert found[4_000_020].describe().endswith("holds 1.0 GiB on GPU 0 MIG 1")
    assert _instances(alone[4_000_020]) == [(0, 1, MIG1, 2, 0, None)] and alone[4_000_020].gpus[0].uuid == MIG1


def test_the_holders_command_names_the_instance(tmp_path: Path) -> None:
    import json

    path = str(two_instances(4_000_010, 4_000_020).write(tmp_path / "s.txt"))
    run = [sys.executable, "-m", "nvmlcheck", "--simulate", path]
    doc = json.loads(subprocess.run([*run, "--json", "holders"], capture_output=True, text=True, check=True,
                                    timeout=120).stdout)
    (g,) = next(h["gpus"] for h in doc["holders"] if h["pid"] == 4_000_020)
    assert doc["version"] == 1 and g["uuid"].startswith("GPU-")  # additive: the GPU's UUID stays where it was
    assert (g["mig_index"], g["mig_uuid"], g["gpu_instance_id"], g["compute_instance_id"],
            g["why_instance_unknown"]) == (1, MIG1, 2, 0, None)
    table = subprocess.run([*run, "holders"], capture_output=True, text=True, check=True, timeout=120).stdout
    row = next(line for line in table.splitlines() if line.lstrip().startswith("4000020"))
    assert "GPU 0 MIG 1 1.0 GiB" in row


def test_the_dry_run_document_says_what_each_target_holds_and_what_was_left_alone(
    tmp_path: Path, hold: Callable[[], subprocess.Popen[bytes]]
) -> None:
    # The kill-plan document gave only pid/name/cmdline per target: on a shared MIG GPU the operator could not see
    # from it which instance (or how much) each would-be target holds; its left_alone had no names and the plan's
    # notes (the device-file rule) were on stderr only.
    import json

    a, b = hold(), hold()
    two_instances(a.pid, b.pid).write(tmp_path / "s.txt")
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--simulate", str(tmp_path / "s.txt"), "--json", "kill",
                           "--all-on-gpu", "--devices", MIG0, "--dry-run"], capture_output=True, text=True, check=False,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (target,) = doc["targets"]
    assert target["pid"] == a.pid and [(g["index"], g["mig_index"], g["mig_uuid"], g["used_bytes"])
                                       for g in target["gpus"]] == [(0, 0, MIG0, GIB)]
    (left,) = [e for e in doc["left_alone"] if e["pid"] == b.pid]
    assert left["name"] == "python" and left["reason"] == "in GPU 0 MIG 1, not selected (--devices)"
    assert any(n.startswith("device files:") for n in doc["notes"])
    assert a.poll() is None and b.poll() is None
