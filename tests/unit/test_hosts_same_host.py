"""The same host spelled two ways runs once.

``gpu01`` and ``root@gpu01`` (ssh's default user being root), ``gpu01`` and ``gpu01.``, ``gpu01`` and ``gpu01:22``
ran the command twice at once on one machine. What can be known without contacting the host is merged by
``parse_hosts`` (case, a trailing dot, an IPv6 address's form); what only ssh's configuration knows (the default
user and port, a ``Host`` block's ``User``/``Port``) by ``Fleet.run`` through ``ssh -G``, which reads the
configuration and connects nowhere.
"""

from __future__ import annotations

import getpass
import shutil
from pathlib import Path

import pytest

from nvmlcheck.hosts import Fleet, parse_hosts

SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(SSH is None, reason="no OpenSSH client here (ssh -G)")
ME = getpass.getuser()


def test_a_trailing_dot_case_and_an_ipv6_form_are_one_host_without_asking_ssh() -> None:
    hosts = parse_hosts(["gpu01", "GPU01.", "gpu01.example.com.", "gpu01.Example.com", "[0:0::1]", "[::1]", "gpu01:22"])
    # gpu01:22 is not gpu01 here: only ssh knows its default port (Fleet.run asks it).
    assert [str(h) for h in hosts] == ["gpu01", "gpu01.example.com.", "[0:0::1]", "gpu01:22"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "ssh_config"
    path.write_text("Host gpu02\n  User admin\n  Port 2222\nHost alias01\n  HostName gpu01\n", encoding="utf-8")
    return path


@needs_ssh
def test_spellings_that_ssh_reaches_as_one_are_run_once(config: Path) -> None:
    fleet = Fleet(ssh=str(SSH), ssh_options=["-F", str(config)], control_master=False)
    with fleet:
        kept, also = fleet.same_hosts(parse_hosts([
            "gpu01", f"{ME}@gpu01", "gpu01:22", f"{ME}@gpu01.:22",  # ssh's default user and port: one host
            "nobody-else@gpu01",  # another user: another login
            "gpu02", "admin@gpu02:2222", "admin@gpu02", "gpu02:22",  # the config's User and Port for gpu02
            "alias01",  # an alias of gpu01 in the config: not asked about (documented), its own host
        ]))
    assert [str(h) for h in kept] == ["gpu01", "nobody-else@gpu01", "gpu02", "gpu02:22", "alias01"]
    assert {str(kept[i]): [str(h) for h in hs] for i, hs in also.items()} == {
        "gpu01": [f"{ME}@gpu01", "gpu01:22", f"{ME}@gpu01.:22"],
        "gpu02": ["admin@gpu02:2222", "admin@gpu02"],  # admin@gpu02 reads Port 2222 from the config too
    }


def test_an_ssh_without_G_merges_nothing_on_a_guess(tmp_path: Path) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho 'unknown option -- G' >&2\nexit 255\n", encoding="utf-8")
    ssh.chmod(0o755)
    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        kept, also = fleet.same_hosts(parse_hosts(["gpu01", f"{ME}@gpu01", "gpu01:22"]))
    assert [str(h) for h in kept] == ["gpu01", f"{ME}@gpu01", "gpu01:22"] and also == {}


@needs_ssh
def test_a_fleet_runs_a_host_once_and_says_which_spellings_it_merged(tmp_path: Path) -> None:
    # A stand-in ssh: `-G` goes to the real one (the configuration only); a connection logs its destination and is
    # refused, so each host that ran is counted.
    log = tmp_path / "ran.txt"
    ssh = tmp_path / "ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do [ "$a" = -G ] && exec {SSH} "$@"; done\n'
        'while [ "$1" != -- ]; do shift; done\n'
        f'echo "$2" >> {log}\n'
        'echo "ssh: connect to host $2 port 22: Connection refused" >&2\nexit 255\n', encoding="utf-8")
    ssh.chmod(0o755)
    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        results = fleet.run(["gpu01", f"{ME}@gpu01", "GPU01.", "gpu03"], ["snapshot"], timeout_s=5)
    assert sorted(log.read_text().split()) == ["gpu01", "gpu03"]
    assert [str(r.host) for r in results] == ["gpu01", "gpu03"]
    assert results[0].note == f"also given as {ME}@gpu01: the same host for ssh (ssh -G), run once"
    assert results[0].verdict == "failed"  # refused: never clean


def test_an_ssh_G_that_hangs_is_killed_at_the_bound_and_merges_nothing(tmp_path: Path) -> None:
    # `Match exec` or a name to canonicalise can hold ssh -G: it is bounded by the connect timeout, run fanout at a
    # time, killed with its group, and a spelling it did not answer for is kept as given.
    pids = tmp_path / "pids"
    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 1000\n", encoding="utf-8")
    ssh.chmod(0o755)
    with Fleet(ssh=str(ssh), control_master=False, connect_timeout_s=0.5, fanout=2) as fleet:
        kept, also = fleet.same_hosts(parse_hosts(["gpu01", f"{ME}@gpu01", "gpu01:22"]))
    assert [str(h) for h in kept] == ["gpu01", f"{ME}@gpu01", "gpu01:22"] and also == {}
    started = [int(p) for p in pids.read_text().split()] if pids.exists() else []
    assert started and all(not Path(f"/proc/{pid}").exists() for pid in started)
