"""nvmlcheck.hosts, the Python API, against the sshd lab."""

from __future__ import annotations

from nvmlcheck.hosts import (
    Fleet,
    HostTimeout,
    SmiFallback,
    overall_exit_code,
    run_on_hosts,
    snapshot_on_hosts,
    wait_on_hosts,
)

from .conftest import Hosts, ssh_children


def test_wait_on_hosts(hosts: Hosts) -> None:
    results = wait_on_hosts([hosts.idle, hosts.busy, hosts.no_nvmlcheck], 0, ssh_options=hosts.lab.ssh_options,
                            remote_python=str(hosts.lab.python), connect_timeout_s=5)
    assert [r.verdict for r in results] == ["clean", "not-clean", "clean"]
    assert [r.via for r in results] == ["nvmlcheck", "nvmlcheck", "nvidia-smi"]
    assert overall_exit_code(results) == 1
    assert not ssh_children(hosts.lab)


def test_snapshot_on_hosts(hosts: Hosts) -> None:
    (result,) = snapshot_on_hosts([hosts.eight], ssh_options=hosts.lab.ssh_options,
                                  remote_python=str(hosts.lab.python))
    assert result.verdict == "clean" and result.document is not None
    assert len(result.document["devices"]) == 8


def test_a_hang_is_cut_at_the_deadline_while_the_others_answer(hosts: Hosts) -> None:
    # ssh's own connect timeout is far away: the fleet's deadline is what ends the hanging host. The deadline is
    # also the idle host's: 3 s (a login, an interpreter's start, NVML's) was a race on a loaded 2-core machine.
    results = run_on_hosts([hosts.hanging, hosts.idle], ["wait", "--timeout", "0"], deadline_s=15.0,
                           ssh_options=hosts.lab.ssh_options, remote_python=str(hosts.lab.python),
                           connect_timeout_s=600)
    hang, idle = results
    assert isinstance(hang.error, HostTimeout) and "ssh killed" in hang.error.message
    assert hang.verdict == "failed"
    assert idle.verdict == "clean"
    assert not ssh_children(hosts.lab)


def test_a_connected_host_past_its_deadline_is_cut_too(hosts: Hosts) -> None:
    # Connected and logged in, the remote wait would answer "not clean" after 30 s: the deadline comes first. (With
    # ControlMaster the master holds copies of ssh's pipes, so this also checks they are not waited on.)
    (busy,) = run_on_hosts([hosts.busy], ["wait", "--timeout", "30"], deadline_s=3.0,
                           ssh_options=hosts.lab.ssh_options, remote_python=str(hosts.lab.python))
    assert isinstance(busy.error, HostTimeout) and busy.exit_code is None
    assert not ssh_children(hosts.lab)


def test_a_fleet_reuses_its_connection(hosts: Hosts) -> None:
    with Fleet(ssh_options=hosts.lab.ssh_options, remote_python=str(hosts.lab.python)) as fleet:
        for _ in range(2):
            (result,) = fleet.run([hosts.idle], ["wait", "--timeout", "0"], timeout_s=0,
                                  fallback=SmiFallback("wait", timeout_s=0))
            assert result.verdict == "clean"
        # The ControlMaster outlives each call (ControlPersist) ...
        assert any("[mux]" in c for c in ssh_children(hosts.lab))
    # ... and close() ends it.
    assert not ssh_children(hosts.lab)
