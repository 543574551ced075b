"""A lab of real OpenSSH servers on loopback addresses, each a simulated GPU host running this checkout's nvmlcheck.

Used by tests/hosts (through its conftest) and by benchmarks/hosts_scale.py. Everything lives in one temporary
directory: a host key, a client key, ``authorized_keys``, one ``sshd_config`` per server, an ``ssh_config`` for the
client (passed to nvmlcheck as ``--ssh-options "-F FILE"``, or ``ssh_options=`` in Python), and ``bin/python``, the
``--remote-python`` wrapper every host runs.

Each sshd sets its sessions' environment with ``SetEnv`` (OpenSSH >= 8.7): the stub libnvidia-ml and that host's
scenario (``NVMLCHECK_LIBNVML``, ``NVMLCHECK_STUB_SCENARIO``), a ``PATH`` whose ``nvidia-smi`` is the fake one from
``stubs/``, and ``LAB_NVMLCHECK=absent`` on a host that must look as if nvmlcheck were not installed there (the wrapper
then runs Python with ``-I -S``: no PYTHONPATH, no site-packages, a genuine ``No module named nvmlcheck``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


def unavailable_reason() -> str | None:
    """Why the lab cannot run here, or None."""
    if SSHD is None:
        return "OpenSSH server (sshd) not installed: apt-get install openssh-server (.ci/run does this)"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not installed: apt-get install openssh-client"
    if os.geteuid() != 0:
        return "the sshd lab runs as root (sshd's privilege separation and loopback addresses 127.0.0.N)"
    return None


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@dataclass
class LabHost:
    """One sshd: where it listens and what it simulates."""

    name: str
    address: str
    port: int
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def spec(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"root@{host}:{self.port}"


@dataclass
class Lab:
    directory: Path
    python: Path  # the --remote-python wrapper
    ssh_config: Path
    hosts: dict[str, LabHost] = field(default_factory=dict)
    extra: list[socket.socket] = field(default_factory=list)

    @property
    def ssh_options(self) -> str:
        return f"-F {self.ssh_config}"

    def env(self) -> dict[str, str]:
        """The environment for an nvmlcheck CLI child that talks to the lab (the ssh options go on its command line:
        ``--ssh-options`` with :attr:`ssh_options`)."""
        env = dict(os.environ)
        env.pop("NVMLCHECK_SSH_OPTIONS", None)
        env["PYTHONPATH"] = str(ROOT)
        for name in ("NVMLCHECK_LIBNVML", "NVMLCHECK_STUB_SCENARIO"):
            env.pop(name, None)
        return env

    def remote_pids(self) -> list[int]:
        """Processes of the lab's ssh sessions ("on the hosts"): their environment has the lab's ``HOME``."""
        marker = f"HOME={self.directory}".encode()
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
        return found

    def end_remote_commands(self) -> None:
        """SIGKILL what still runs on the "hosts": a safety net (a remote nvmlcheck ends with the stdin its fleet
        holds open, docs/hosts.md, "Ending"; a test's own remote command might not). Reaped when this process became
        their parent (a subreaper)."""
        for pid in self.remote_pids():
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)

    def add_alias(self, alias: str, host: LabHost) -> None:
        with self.ssh_config.open("a", encoding="utf-8") as f:
            f.write(f"Host {alias}\n  HostName {host.address}\n  Port {host.port}\n  User root\n")

    def closed_port(self, address: str = "127.0.0.250") -> str:
        """A spec nothing listens on."""
        return f"root@{address}:{free_port(address)}"

    def hanging(self, address: str = "127.0.0.251") -> str:
        """A spec whose TCP connection is accepted (by the kernel's backlog) and then never answered."""
        s = socket.socket()
        s.bind((address, 0))
        s.listen(128)
        self.extra.append(s)
        return f"root@{address}:{s.getsockname()[1]}"

    def stop(self) -> None:
        for s in self.extra:
            s.close()
        for host in self.hosts.values():
            if host.process is not None and host.process.poll() is None:
                host.process.terminate()
                try:
                    host.process.wait(5)
                except subprocess.TimeoutExpired:
                    host.process.kill()
                    host.process.wait()


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nvmlcheck-lab", "-f", str(path)],
                   check=True, stdout=subprocess.DEVNULL)


def create(directory: Path) -> Lab:
    """Keys, client config and the remote-python wrapper (no server yet: :func:`start_host`)."""
    directory.mkdir(parents=True, exist_ok=True)
    _keygen(directory / "host_key")
    _keygen(directory / "client_key")
    shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(
        "#!/bin/sh\n"
        "# The lab's --remote-python: this checkout's nvmlcheck, or (LAB_NVMLCHECK=absent) a Python without it.\n"
        f'if [ "$LAB_NVMLCHECK" = absent ]; then exec {sys.executable} -I -S "$@"; fi\n'
        f'PYTHONPATH={ROOT}; export PYTHONPATH\n'
        f'exec {sys.executable} "$@"\n',
        encoding="utf-8",
    )
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec {sys.executable} {ROOT / "stubs" / "fake_nvidia_smi.py"} "$@"\n',
                   encoding="utf-8")
    for script in (python, smi):
        script.chmod(0o755)
    ssh_config = directory / "ssh_config"
    ssh_config.write_text(
        "Host *\n"
        f"  IdentityFile {directory / 'client_key'}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {directory / 'known_hosts'}\n"
        "  StrictHostKeyChecking no\n"
        "  LogLevel ERROR\n",
        encoding="utf-8",
    )
    return Lab(directory, python, ssh_config)


def start_host(lab: Lab, name: str, address: str, env: dict[str, str]) -> LabHost:
    """Start one sshd on ``address`` (a free port) whose sessions get ``env``; waits until it accepts."""
    assert SSHD is not None
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    port = free_port(address)
    host = LabHost(name, address, port, env)
    path = f"{lab.directory / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    # HOME: the sessions' shell (bash -c) must not read this machine's ~/.bashrc, which may do anything (pyenv init
    # waits up to 60 s on a stale rehash lock); the lab's directory has none.
    setenv = " ".join(f'"{k}={v}"' for k, v in {"PATH": path, "HOME": str(lab.directory), **env}.items())
    config = lab.directory / f"sshd_{name}.conf"
    config.write_text(
        f"ListenAddress {f'[{address}]' if ':' in address else address}:{port}\n"
        f"HostKey {lab.directory / 'host_key'}\n"
        f"PidFile {lab.directory / f'sshd_{name}.pid'}\n"
        f"AuthorizedKeysFile {lab.directory / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PrintMotd no\n"
        "MaxStartups 200\n"
        "MaxSessions 200\n"
        "LogLevel ERROR\n"
        f"SetEnv {setenv}\n",
        encoding="utf-8",
    )
    with open(lab.directory / f"sshd_{name}.log", "wb") as log_file:  # the child keeps its own descriptor
        host.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=log_file)
    deadline = time.monotonic() + 15
    while True:
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            break
        if host.process.poll() is not None:
            log = (lab.directory / f"sshd_{name}.log").read_text(errors="replace")
            raise RuntimeError(f"sshd {name} exited {host.process.returncode}: {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"sshd {name} did not listen on {address}:{port}")
        time.sleep(0.05)
    lab.hosts[name] = host
    return host


def new_lab() -> Lab:
    return create(Path(tempfile.mkdtemp(prefix="nvmlcheck-lab-")))
