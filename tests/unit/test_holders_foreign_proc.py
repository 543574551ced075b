"""In a PID namespace entered without mounting its procfs (``unshare --pid --fork`` without ``--mount-proc``, a
container given the host's ``/proc``), ``/proc`` numbers processes as another namespace does. A kill refuses there
(``procfs.foreign_numbering``); the holders reading did not: it listed the host's PIDs as this namespace's and
described each NVML PID (this namespace's numbering on current drivers) from another process's ``/proc`` entry
(its name, owner, command line). Now the reading is an error that says why, and a timed-out wait's explanation one
line saying so: unknown, never another process's description."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import procfs

ROOT = Path(__file__).resolve().parents[2]
WHY = "/proc is the procfs of another PID namespace: it calls this process 812, and this process is 1 in its own"


def test_a_foreign_procfs_makes_the_holders_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs, "foreign_numbering", lambda proc="/proc": WHY)
    with pytest.raises(nc.NvmlCheckError, match="the holders cannot be read here: /proc is the procfs of another"):
        nc.find_holders(None)
    with pytest.raises(nc.NvmlCheckError, match="unknown"):
        nc.find_holders(None, timeout=5)
    assert nc.explain_unseen_holders(None) == [
        f"the processes that hold the GPUs cannot be described here: {WHY}"]


def test_its_own_procfs_reads_them() -> None:
    assert procfs.foreign_numbering() is None
    nc.find_holders(None, device_files="/nonexistent/nvidia[0-9]*")  # no error


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="no PID namespaces here (unshare --pid needs privilege)")
def test_holders_in_a_pid_namespace_without_its_procfs_is_an_error() -> None:
    code = "import nvmlcheck as nc; nc.find_holders(None)"
    out = subprocess.run(["unshare", "--pid", "--fork", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert out.returncode != 0 and "the holders cannot be read here" in out.stderr, out.stderr
