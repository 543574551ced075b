"""The ``nvmlcheck/holders`` document keeps docs/cli.md's rule: a ``null`` field is unknown and ``unknown`` says why
(``relation`` excepted: ``null`` there means none; ``container`` is ``null`` for none, or for unknown with a reason
under ``unknown``)."""

from __future__ import annotations

import errno
import os

import pytest

from nvmlcheck._proc import procfs
from nvmlcheck._proc.container import UNKNOWN
from nvmlcheck.holders import GpuUse, describe_process, select_kill_holders
from nvmlcheck.jsonout import holders_document

#: Fields whose ``null`` means "none", not "unknown".
NONE_MEANS_NONE = frozenset({"relation", "container"})


def _unexplained(holder: dict[str, object]) -> list[str]:
    unknown = holder["unknown"]
    assert isinstance(unknown, dict)
    return [key for key, value in holder.items() if value is None and key not in NONE_MEANS_NONE and key not in unknown]


def test_a_process_not_visible_here_has_a_reason_for_every_null() -> None:
    # A PID no process has (above Linux's PID_MAX_LIMIT), as NVML lists one of another PID namespace.
    gone = describe_process(4_123_456, found_by=frozenset({"nvml"}),
                            gpus=(GpuUse(0, "GPU-0", ("compute",), 1 << 30),))
    holder = holders_document("nvml", [gone])["holders"][0]
    assert holder["name"] is None and holder["user"] is None and holder["device_files"] is None
    assert _unexplained(holder) == []
    assert holder["unknown"]["user"] == holder["unknown"]["uid"]
    # Its container is not "none": it cannot be read either.
    assert holder["container"] is None and holder["unknown"]["container"] == holder["unknown"]["start_ticks"]
    assert " in " not in gone.describe()  # the line says it is not visible, not "in unknown container (...)"


def test_this_process_has_no_unexplained_null() -> None:
    me = describe_process(os.getpid(), found_by=frozenset({"device-file"}), device_files=("/dev/nvidia0",))
    holder = holders_document("nvml", [me])["holders"][0]
    assert holder["relation"] == "self"
    assert _unexplained(holder) == []


def test_a_container_that_cannot_be_told_is_null_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc/PID/cgroup unreadable (hidepid, EMFILE) used to give a null container with no reason: "in none".
    from nvmlcheck._proc import container

    why = "/proc/1/cgroup cannot be read: Permission denied (EACCES)"
    monkeypatch.setattr(container, "container_of", lambda pid, proc="/proc": container.Container(UNKNOWN, why, ""))
    me = describe_process(os.getpid(), found_by=frozenset({"device-file"}), device_files=("/dev/nvidia0",))
    assert me.container is None and me.why_unknown("container") == why
    assert f"in unknown container ({why})" in me.describe()
    holder = holders_document("nvml", [me])["holders"][0]
    assert holder["container"] is None and holder["unknown"]["container"] == why


def test_a_process_hidden_by_hidepid_is_not_called_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc mounted hidepid=1: the PID's directory is there, its files refuse (EPERM). It used to read as "no process
    # with this PID", and --all-on-gpu's refusal said the PID "names no process here".
    def refused(pid: object, proc: str = "/proc", *, strict: bool = False) -> None:
        if strict:
            raise procfs.ProcUnreadable(errno.EPERM, f"/proc/{pid}/stat cannot be read: not permitted (EPERM)")

    monkeypatch.setattr(procfs, "read_stat", refused)
    h = describe_process(4123, found_by=frozenset({"nvml"}), gpus=(GpuUse(0, "GPU-0", ("compute",), 1 << 30),))
    why = h.why_unknown("start_ticks")
    assert h.start_ticks is None and why is not None and "EPERM" in why and "hidepid" in why
    assert h.why_unknown("name") == why
    selection = select_kill_holders([h], all_holders=True)
    assert selection.targets == ()
    assert "cannot be read here" in selection.skipped[0][1]
    refused_all = select_kill_holders([h], all_holders=False)
    assert refused_all.refused is not None and "cannot be read here" in refused_all.refused
    assert "names no process" not in refused_all.refused


def test_a_holder_that_exits_while_it_is_read_is_not_said_to_run_in_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck._proc import container

    real = procfs.read_stat
    gone: list[bool] = []

    def exits(pid: object, proc: str = "/proc") -> None:
        gone.append(True)  # its cgroup file is gone: container_of says None, as for the root cgroup

    monkeypatch.setattr(container, "container_of", exits)
    monkeypatch.setattr(procfs, "read_stat", lambda pid, proc="/proc", *, strict=False:
                        None if gone else real(pid, proc, strict=strict))
    h = describe_process(os.getpid(), found_by=frozenset({"device-file"}), device_files=("/dev/nvidia0",))
    assert h.container is None and h.why_unknown("container") == "it exited while it was read"


def test_the_hosts_table_names_the_mig_instance_as_the_local_one_does() -> None:
    # `holders --hosts` printed "GPU 0" for a holder of GPU 0's MIG 1, which `holders` on the host itself names.
    from nvmlcheck.cli._hosts import _holder_lines

    uses = (GpuUse(0, "MIG-1", ("compute",), 1 << 30, gpu_instance_id=2, compute_instance_id=0, mig_index=1,
                   mig_uuid="MIG-1"),
            GpuUse(1, "GPU-1", ("compute",), 1 << 30, gpu_instance_id=3, why_instance_unknown="not read"),
            GpuUse(2, "GPU-2", ("compute",), 1 << 30))
    holder = describe_process(4_123_456, found_by=frozenset({"nvml"}), gpus=uses)
    lines = _holder_lines("gpu01", holders_document("nvml", [holder]))
    assert "GPU 0 MIG 1 1.0 GiB, GPU 1 GI 3 1.0 GiB, GPU 2 1.0 GiB" in lines[1]
    assert [g.where for g in uses] == ["GPU 0 MIG 1", "GPU 1 GI 3", "GPU 2"]
    # A host too old to send the instance: the GPU alone.
    old = {"holders": [{"pid": 5, "gpus": [{"index": 0, "used_bytes": 1 << 30}], "found_by": ["nvml"]}]}
    assert "GPU 0 1.0 GiB" in _holder_lines("gpu02", old)[1]
