"""What a timed-out wait adds to its culprits, read after its deadline: the scan of every process's open files runs
only when memory is held with no process listed (it cost a wait 15-150 ms past its deadline, every time a listed
holder kept a GPU); otherwise only the listed holders' own states are read."""

from __future__ import annotations

import os

import pytest
from snapshots import GIB, busy, dev, proc, snap

from nvmlcheck import holders
from nvmlcheck._proc import devfiles


def test_a_listed_holder_costs_no_scan_of_every_process(monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[object] = []
    real = devfiles.scan

    def counted(*args: object, **kwargs: object) -> devfiles.FdScan:
        scans.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(devfiles, "scan", counted)
    holders.timeout_explanation(busy(pid=os.getpid()))
    assert scans == []
    holders.timeout_explanation(snap(dev(0, used=4 * GIB, procs=[])))  # held by no listed process: look for it
    assert len(scans) == 1


def test_a_listed_zombie_is_still_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devfiles, "scan", lambda *a, **k: pytest.fail("scanned every process"))
    monkeypatch.setattr(holders, "describe_process", lambda pid, **k: holders.Holder(
        pid=pid, found_by=frozenset(), gpus=(), name="python3", state="zombie", uid=0, user="root", cmdline=(),
        nspid=None, ancestry=(1,), device_files=None, is_daemon=False, relation=None, start_ticks=1))
    lines = holders.timeout_explanation(snap(dev(0, used=4 * GIB, procs=[proc(4242, 4 * GIB)])))
    assert lines == ["pid 4242 (python3) is a zombie: it has exited but its parent (pid 1) has not reaped it; no "
                     "signal frees what it still holds"]
