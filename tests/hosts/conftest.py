"""Fixtures for tests/hosts: a lab of real OpenSSH servers on loopback addresses (tests/hosts/sshlab.py), one per
simulated GPU host, and a helper that runs the nvmlcheck CLI against them.

Skipped, with the reason, where sshd is not installed (CI installs openssh-server in .ci/run) or not root.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from . import sshlab


@dataclass
class Hosts:
    """The lab and the spec of each of its hosts."""

    lab: sshlab.Lab
    idle: str
    busy: str
    lost: str
    eight: str
    no_nvmlcheck: str
    no_nvmlcheck_busy: str
    closed: str
    hanging: str
    busy_scenario: Path

    def cli(self, *args: str, timeout: float = 120) -> tuple[int, str, str]:
        """Run ``python -m nvmlcheck ARGS --remote-python LAB --connect-timeout 2 --ssh-options "-F LAB"``: (exit
        code, stdout, stderr)."""
        argv = [sys.executable, "-m", "nvmlcheck", *args, "--remote-python", str(self.lab.python),
                "--connect-timeout", "2", "--ssh-options", self.lab.ssh_options]
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.lab.env(), timeout=timeout,
                              check=False)
        return proc.returncode, proc.stdout, proc.stderr

    def cli_json(self, *args: str) -> tuple[int, dict[str, Any]]:
        code, out, err = self.cli(*args, "--json")
        try:
            doc = json.loads(out)
        except ValueError:
            raise AssertionError(f"not JSON (exit {code}): {out!r} {err!r}") from None
        return code, doc


def _peer_ports(pid: str) -> set[int] | None:
    """The remote TCP ports of process ``pid``'s sockets, or None when they cannot be read."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        ports = set()
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                for row in f.readlines()[1:]:
                    cols = row.split()
                    if cols[9] in inodes:
                        ports.add(int(cols[2].rsplit(":", 1)[1], 16))
        return ports
    except OSError:
        return None


def _started_for(pid: str, lab: sshlab.Lab) -> bool:
    # A ControlMaster rewrites its command line ("ssh: /tmp/nvmlcheck-ssh-.../... [mux]", over its environment too),
    # which no longer names the lab; its TCP connection still goes to one of the lab's sshd ports. Without this, a
    # master that another test run on the machine left (ControlPersist=60) counted as this lab's.
    ports = _peer_ports(pid)
    if ports is None:
        return True  # cannot tell: count it
    mine = {h.port for h in lab.hosts.values()} | {sock.getsockname()[1] for sock in lab.extra}
    return bool(ports & mine)


def ssh_children(lab: sshlab.Lab) -> list[str]:
    """Command lines of ssh processes still alive that belong to this lab (clients and ControlMaster muxes)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        if not cmdline.startswith("ssh"):
            continue
        if str(lab.ssh_config) in cmdline or ("nvmlcheck-ssh-" in cmdline and _started_for(entry, lab)):
            found.append(f"{entry}: {cmdline}")
    return found


@pytest.fixture(autouse=True)
def _remote_commands_end(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on the lab, end what its cut connections left running "on the hosts" (see
    :meth:`sshlab.Lab.end_remote_commands`), before the suite's leak check counts it as this process's."""
    yield
    if "hosts" in request.fixturenames:
        request.getfixturevalue("hosts").lab.end_remote_commands()


# Per module, not per session: the servers are this process's children, and later suites (tests/reliability's soak)
# check that no child process is left behind.
@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    reason = sshlab.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from nvmlcheck.simulate import SCENARIOS
    from nvmlcheck.testing import Scenario, StubBuildError, build_stub

    try:
        library = str(build_stub())
    except (StubBuildError, FileNotFoundError) as exc:
        pytest.skip(f"the stub libnvidia-ml cannot be built: {exc}")
    lab = sshlab.create(tmp_path_factory.mktemp("sshlab"))

    def scenario(name: str, sc: Scenario) -> dict[str, str]:
        path = lab.directory / f"{name}.scenario"
        sc.write(path)
        return {"NVMLCHECK_LIBNVML": library, "NVMLCHECK_STUB_SCENARIO": str(path)}

    lost = Scenario.h200(2)
    lost.set_device(1, lost=True)
    try:
        specs = {
            "idle": sshlab.start_host(lab, "idle", "127.0.0.2", scenario("idle", SCENARIOS["h200"]())).spec,
            "busy": sshlab.start_host(lab, "busy", "127.0.0.3", scenario("busy", SCENARIOS["h200-busy"]())).spec,
            "lost": sshlab.start_host(lab, "lost", "127.0.0.4", scenario("lost", lost)).spec,
            "eight": sshlab.start_host(lab, "eight", "127.0.0.5", scenario("eight", SCENARIOS["h200x8"]())).spec,
            "no_nvmlcheck": sshlab.start_host(
                lab, "none", "127.0.0.6", {**scenario("none", SCENARIOS["h200"]()), "LAB_NVMLCHECK": "absent"}).spec,
            "no_nvmlcheck_busy": sshlab.start_host(
                lab, "none-busy", "127.0.0.7",
                {**scenario("none-busy", SCENARIOS["h200-busy"]()), "LAB_NVMLCHECK": "absent"}).spec,
        }
        yield Hosts(lab, **specs, closed=lab.closed_port(), hanging=lab.hanging(),
                    busy_scenario=lab.directory / "busy.scenario")
    finally:
        lab.stop()
