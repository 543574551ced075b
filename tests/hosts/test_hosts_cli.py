"""``--host`` against real sshd instances, each a simulated GPU host (tests/hosts/conftest.py).

No wall-clock asserts (CI is a loaded 2-core VM): verdicts, exit codes, documents, and that no ssh child is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from .conftest import Hosts, ssh_children


def by_host(doc: dict[str, Any]) -> dict[str, Any]:
    assert doc["schema"] == "nvmlcheck/hosts" and doc["version"] == 1
    return {h["host"]: h for h in doc["hosts"]}


def test_one_verdict_over_every_kind_of_host(hosts: Hosts) -> None:
    specs = [hosts.idle, hosts.eight, hosts.busy, hosts.lost, hosts.no_nvmlcheck, hosts.closed, hosts.hanging]
    code, doc = hosts.cli_json("wait", "--timeout", "0", "--hosts", ",".join(specs))
    assert code == 3, doc
    assert doc["exit_code"] == 3 and doc["command"] == "wait"
    got = by_host(doc)
    assert list(got) == specs  # the order given
    assert got[hosts.idle]["verdict"] == "clean"
    assert got[hosts.idle]["document"]["schema"] == "nvmlcheck/wait"
    eight = got[hosts.eight]["document"]["snapshot"]["devices"]
    assert got[hosts.eight]["verdict"] == "clean" and len(eight) == 8
    busy = got[hosts.busy]
    assert busy["verdict"] == "not-clean" and busy["exit_code"] == 1
    assert any("4123456" in c for c in busy["document"]["culprits"])
    lost = got[hosts.lost]
    assert lost["verdict"] == "failed" and lost["error"]["kind"] == "remote"
    assert "LOST" in lost["error"]["message"].upper()
    fallback = got[hosts.no_nvmlcheck]
    assert fallback["verdict"] == "clean" and fallback["via"] == "nvidia-smi", fallback
    assert "no nvmlcheck" in fallback["note"]
    assert fallback["document"]["snapshot"]["backend"] == "smi"
    assert got[hosts.closed]["error"]["kind"] == "unreachable"
    assert got[hosts.hanging]["error"]["kind"] == "timeout"
    assert doc["clean"] == [hosts.idle, hosts.eight, hosts.no_nvmlcheck]
    assert doc["not_clean"] == [hosts.busy]
    assert doc["failed"] == [hosts.lost, hosts.closed, hosts.hanging]
    assert not ssh_children(hosts.lab)


def test_all_clean_is_exit_0_with_a_line_per_gpu(hosts: Hosts) -> None:
    code, out, err = hosts.cli("wait", "--timeout", "5", "--host", hosts.idle, "--host", hosts.eight)
    assert code == 0, (out, err)
    lines = out.splitlines()
    assert sum(line.startswith(hosts.idle) and " GPU " in line for line in lines) == 1
    assert sum(line.startswith(hosts.eight) and " GPU " in line for line in lines) == 8
    assert lines[-1] == "2 hosts: 2 clean"


def test_a_busy_host_is_exit_1_and_named(hosts: Hosts) -> None:
    # --timeout 0, one check judged alone: with 0.2 s, a loaded machine could time the idle host out before its
    # second clean poll, and the summary line then named two hosts not clean.
    code, out, _ = hosts.cli("wait", "--timeout", "0", "--hosts", f"{hosts.idle},{hosts.busy}")
    assert code == 1
    assert f"{hosts.busy}  NOT CLEAN" in out
    assert out.splitlines()[-1] == f"2 hosts: 1 clean; 1 not clean: {hosts.busy}"


def test_snapshot_and_holders(hosts: Hosts) -> None:
    code, doc = hosts.cli_json("snapshot", "--hosts", f"{hosts.idle},{hosts.eight},{hosts.no_nvmlcheck}")
    assert code == 0, doc
    got = by_host(doc)
    assert [len(h["document"]["devices"]) for h in got.values()] == [1, 8, 1]
    assert got[hosts.no_nvmlcheck]["via"] == "nvidia-smi"
    code, doc = hosts.cli_json("holders", "--host", hosts.idle)
    assert code == 0 and by_host(doc)[hosts.idle]["document"]["schema"] == "nvmlcheck/holders"


def test_human_views_put_the_host_in_front(hosts: Hosts) -> None:
    code, out, err = hosts.cli("snapshot", "procs", "--hosts", f"{hosts.busy},{hosts.idle}")
    assert code == 0, err
    assert f"{hosts.busy}  GPU 0   4123456  compute     16.0 GiB  ?" in out.splitlines()
    assert not any(line.startswith(hosts.idle) and "GPU" in line for line in out.splitlines())
    code, out, err = hosts.cli("holders", "--host", hosts.idle, "--host", hosts.closed)
    assert code == 3, err
    assert f"{hosts.idle.ljust(len(hosts.closed))}  no process holds a selected GPU" in out
    assert out.splitlines()[-1] == f"2 hosts: 1 ok; 1 failed: {hosts.closed} (unreachable)"


@pytest.mark.parametrize("command", [["holders"], ["kill", "4123456"]])
def test_kill_and_holders_refuse_without_nvmlcheck(hosts: Hosts, command: list[str]) -> None:
    code, doc = hosts.cli_json(*command, "--host", hosts.no_nvmlcheck)
    assert code == 3
    error = by_host(doc)[hosts.no_nvmlcheck]["error"]
    assert error["kind"] == "no-nvmlcheck"
    assert f"{command[0]} needs nvmlcheck on the host" in error["message"]


def test_an_ipv6_host(hosts: Hosts) -> None:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    from . import sshlab

    host = sshlab.start_host(hosts.lab, "v6", "::1", hosts.lab.hosts["idle"].env)
    try:
        assert host.spec.startswith("root@[::1]:")
        code, doc = hosts.cli_json("wait", "--timeout", "0", "--host", host.spec)
        assert code == 0, doc
        assert doc["clean"] == [host.spec]
    finally:  # this test's own server: the suite's leak check counts what a test leaves running
        hosts.lab.hosts.pop("v6", None)
        assert host.process is not None
        host.process.terminate()
        host.process.wait(30)


def test_remote_prefix_runs_the_command_behind_it(hosts: Hosts) -> None:
    # The prefix is proven to run: it points the idle host's nvmlcheck at the busy scenario.
    code, doc = hosts.cli_json("wait", "--timeout", "0", "--host", hosts.idle,
                               "--remote-prefix", f"env NVMLCHECK_STUB_SCENARIO={hosts.busy_scenario}")
    assert code == 1, doc
    assert by_host(doc)[hosts.idle]["verdict"] == "not-clean"


def test_remote_prefix_entering_a_pid_namespace(hosts: Hosts) -> None:
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--", "true"], capture_output=True,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare cannot create a PID namespace here: {probe.stderr.decode(errors='replace').strip()}")
    code, doc = hosts.cli_json("holders", "--host", hosts.idle,
                               "--remote-prefix", "unshare --pid --fork --mount-proc --")
    assert code == 0, doc
    code, doc = hosts.cli_json("wait", "--timeout", "1", "--host", hosts.idle,
                               "--remote-prefix", "unshare --pid --fork --mount-proc --")
    assert code == 0, doc


def test_bad_host_specs_are_usage_errors_naming_them(hosts: Hosts) -> None:
    code, _, err = hosts.cli("wait", "--host", "root@-oProxyCommand=x")
    assert code == 2 and "-oProxyCommand=x" in err
    code, _, err = hosts.cli("wait", "--hosts", "a,b:99999")
    assert code == 2 and "b:99999" in err
    path = hosts.lab.directory / "hosts.txt"
    path.write_text(f"# the lab\n{hosts.idle}   # idle\n\nbad host\n", encoding="utf-8")
    code, _, err = hosts.cli("wait", "--hosts-file", str(path))
    assert code == 2 and "bad host" in err and str(path) in err
    path.write_text(f"# the lab\n{hosts.idle}   # idle\n\n{hosts.eight}\n", encoding="utf-8")
    code, doc = hosts.cli_json("wait", "--timeout", "2", "--hosts-file", str(path))
    assert code == 0 and list(by_host(doc)) == [hosts.idle, hosts.eight]
    code, _, err = hosts.cli("wait", "--host", hosts.idle, "--simulate", "h200")
    assert code == 2 and "--simulate" in err


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_every_ssh_child(hosts: Hosts, signum: int) -> None:
    # Three kinds of ssh child at once: the busy host's remote wait (--timeout 30), the hanging host's connection
    # attempt, and the nvidia-smi fallback's polls of a busy host without nvmlcheck.
    argv = [sys.executable, "-m", "nvmlcheck", "wait", "--timeout", "30", "--json", "--hosts",
            f"{hosts.busy},{hosts.hanging},{hosts.no_nvmlcheck_busy}", "--remote-python", str(hosts.lab.python),
            "--connect-timeout", "60", "--ssh-options", hosts.lab.ssh_options]
    # SIGINT starts at its default in the child even where this test runs with it ignored (a background job of a
    # non-interactive shell), as it is for a launch script run in the foreground.
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=hosts.lab.env(),
                            preexec_fn=_default_sigint)  # noqa: PLW1509 - one signal call, no locks taken
    try:
        deadline = time.monotonic() + 90
        while True:
            children = [c for c in ssh_children(hosts.lab) if "-O exit" not in c]
            if len(children) >= 3 and any("nvidia-smi" in c for c in children):
                break
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the ssh children never all started: {children}"
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, (out, err)
    assert b"nvmlcheck/error" in out
    assert not ssh_children(hosts.lab)


def test_kill_on_a_host(hosts: Hosts) -> None:
    # The lab's hosts are this machine: a real process here is a real process "there".
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        code, doc = hosts.cli_json("kill", str(target.pid), "--grace", "2", "--timeout", "20", "--host", hosts.idle)
        assert code == 0, doc
        remote = by_host(doc)[hosts.idle]["document"]
        assert remote["schema"] == "nvmlcheck/kill" and remote["clean"] is True
        assert [t["pid"] for t in remote["pids"]] == [target.pid]
        assert target.wait(10) == -signal.SIGTERM
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def test_fake_ssh_options_do_not_leak_into_other_tests() -> None:
    assert "NVMLCHECK_SSH_OPTIONS" not in os.environ


def test_ready_on_hosts_one_verdict_with_exit_5_for_a_gpu_that_needs_an_operator(hosts: Hosts) -> None:
    specs = [hosts.idle, hosts.busy, hosts.lost]
    code, doc = hosts.cli_json("ready", "--need", "0.5", "--hosts", ",".join(specs))
    got = by_host(doc)
    assert got[hosts.idle]["verdict"] == "clean" and got[hosts.idle]["document"]["schema"] == "nvmlcheck/ready"
    assert got[hosts.busy]["verdict"] == "not-clean" and got[hosts.busy]["document"]["gpus"][0]["class"] != "ready"
    lost = got[hosts.lost]  # GPU 1 fell off the bus: unhealthy, a reboot
    assert lost["verdict"] == "unhealthy" and lost["exit_code"] == 5, lost
    assert code == 5 and doc["unhealthy"] == [hosts.lost] and doc["not_clean"] == [hosts.busy]
    code, out, _ = hosts.cli("ready", "--hosts", ",".join(specs))
    assert code == 5 and "NEEDS AN OPERATOR" in out and out.splitlines()[-1].startswith("3 hosts: 1 ready")
    assert not ssh_children(hosts.lab)
