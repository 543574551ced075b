"""The ssh fleet against real sshd instances when nvmlcheck is SIGKILLed or a host floods it (issue 27)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import Hosts, ssh_children


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="nc"))  # short: ControlMaster socket paths are limited to ~108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _guards(marker: str) -> list[str]:
    """Guard processes (not zombies) whose command line names ``marker``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "guard.py" in cmdline and marker in cmdline and state != "Z":
            found.append(entry)
    return found


def _control_dirs(base: Path) -> list[Path]:
    return [p for p in base.iterdir() if p.name.startswith("nvmlcheck-ssh-")]


def _remote_nvmlcheck(hosts: Hosts) -> list[int]:
    """The lab's remote processes that run nvmlcheck."""
    found = []
    for pid in hosts.lab.remote_pids():
        with contextlib.suppress(OSError):
            if b"nvmlcheck" in Path(f"/proc/{pid}/cmdline").read_bytes() and _state(pid) not in ("Z", None):
                found.append(pid)
    return found


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def test_sigkill_leaves_no_ssh_client_master_or_directory(hosts: Hosts, short_tmp: Path) -> None:
    argv = [sys.executable, "-m", "nvmlcheck", "wait", "--timeout", "600", "--host", hosts.busy,
            "--remote-python", str(hosts.lab.python), "--ssh-options", hosts.lab.ssh_options]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**hosts.lab.env(), "TMPDIR": str(short_tmp)})
    try:
        end = time.monotonic() + 60
        # The remote wait is running (its client and the ControlMaster are up) before the kill.
        while not (any("[mux]" in c for c in ssh_children(hosts.lab)) and len(ssh_children(hosts.lab)) >= 2):
            assert proc.poll() is None and time.monotonic() < end, ssh_children(hosts.lab)
            time.sleep(0.05)
        assert _control_dirs(short_tmp)
        while not _remote_nvmlcheck(hosts):  # and the remote command has started
            assert proc.poll() is None and time.monotonic() < end
            time.sleep(0.05)
        proc.kill()
        proc.wait()
        end = time.monotonic() + 30
        while (ssh_children(hosts.lab) or _control_dirs(short_tmp)) and time.monotonic() < end:
            time.sleep(0.05)
        assert not ssh_children(hosts.lab), "ssh outlived the SIGKILLed nvmlcheck"
        assert not _control_dirs(short_tmp)
        # The remote wait (600 s of its own timeout left) ended with its caller: its stdin, held by the SIGKILLed
        # process through ssh, reached end of file. Before, it ran on "the host" until its own timeout.
        end = time.monotonic() + 30
        while _remote_nvmlcheck(hosts) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _remote_nvmlcheck(hosts), "the remote command outlived its SIGKILLed caller"
        end = time.monotonic() + 30
        while _guards(str(hosts.lab.ssh_config)) and time.monotonic() < end:
            time.sleep(0.05)
        assert not _guards(str(hosts.lab.ssh_config)), "the guard did not end after its cleanup"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_host_that_floods_its_output_fails_and_is_cut(hosts: Hosts, tmp_path: Path) -> None:
    flood = tmp_path / "flood"
    # The "remote python" of a hostile host: endless output that is not an nvmlcheck document.
    flood.write_text(f"#!/bin/sh\nexec {sys.executable} -S -c 'import sys\nwhile True: "
                     "sys.stdout.buffer.write(b\"A\" * 65536)'\n", encoding="utf-8")
    flood.chmod(0o755)
    argv = [sys.executable, "-m", "nvmlcheck", "--json", "snapshot", "--hosts", f"{hosts.idle},{hosts.eight}",
            "--remote-python", str(flood), "--ssh-options", hosts.lab.ssh_options]
    proc = subprocess.run(argv, capture_output=True, text=True, env=hosts.lab.env(), timeout=120, check=False)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    for host in doc["hosts"]:
        assert host["verdict"] == "failed" and "output over 4194304 bytes" in host["error"]["message"], host
    assert not ssh_children(hosts.lab)


def test_login_noise_around_the_answer_is_ignored_with_a_note_and_a_lost_gpu_names_itself(hosts: Hosts) -> None:
    # A .bashrc that echoes, a login banner on stdout: the answer is still the one nvmlcheck document (before, every
    # such host failed, "exit 0 without an nvmlcheck document: }").
    noisy = "sh -c 'echo Welcome to gpu01; echo {; \"$@\"; status=$?; echo bye; exit $status' sh"
    code, doc = hosts.cli_json("wait", "--timeout", "0", "--host", hosts.idle, "--remote-prefix", noisy)
    entry = doc["hosts"][0]
    assert code == 0 and entry["verdict"] == "clean", doc
    assert "besides the document" in entry["note"]
    code, out, err = hosts.cli("wait", "--timeout", "0", "--host", hosts.idle, "--remote-prefix", noisy)
    assert code == 0 and "besides the document" in out, err
    # snapshot's exit 3 (a lost GPU): failed with its reason, not with "error": null.
    code, doc = hosts.cli_json("snapshot", "--host", hosts.lost)
    entry = doc["hosts"][0]
    assert code == 3 and entry["verdict"] == "failed" and entry["document"]["schema"] == "nvmlcheck/snapshot", doc
    assert entry["error"]["kind"] == "remote" and "GPU 1" in entry["error"]["message"], entry
