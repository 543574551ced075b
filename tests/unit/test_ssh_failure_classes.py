"""ssh's own failure (exit 255) is the same class of error through ``--smi-prefix "ssh HOST"`` as through ``--hosts``.

An ssh connect timeout through the smi prefix was a fatal ``SmiTransportError`` while the same event through a fleet
was a transient ``HostTimeout``: a wait gave up on a host that had only been slow. Both now read ssh's stderr the same
way, from the end (a login banner comes first): a connect timeout is transient, a refused connection, an unknown
name or a refused login are not.
"""

from __future__ import annotations

import pickle

import pytest

import nvmlcheck as nc
from nvmlcheck.backends.smi import SmiResult, classify_failure
from nvmlcheck.hosts import Fleet, Host, HostAuthError, HostTimeout, HostUnreachable
from nvmlcheck.wait import is_transient

BANNER = ("*** Authorised use only. Sessions are logged. ***\n"
          "*** Permission denied to anyone not in group gpu-admins; idle sessions timed out after 15 min ***\n")

#: stderr of ssh exiting 255 → (the fleet's class, whether transient).
CASES = [
    ("ssh: connect to host gpu01 port 22: Connection timed out", HostTimeout, True),
    ("ssh: connect to host gpu01 port 22: Operation timed out", HostTimeout, True),  # BSD, macOS
    ("Connection timed out during banner exchange\nConnection to 10.0.0.7 port 22 timed out", HostTimeout, True),
    ("Timeout, server gpu01 not responding.", HostTimeout, True),  # ServerAliveInterval's keepalives unanswered
    ("ssh: connect to host gpu01 port 22: Connection refused", HostUnreachable, False),
    ("ssh: Could not resolve hostname gpu01: Name or service not known", HostUnreachable, False),
    ("ssh: connect to host gpu01 port 22: No route to host", HostUnreachable, False),
    ("root@gpu01: Permission denied (publickey,password).", HostAuthError, False),
    ("Host key verification failed.", HostAuthError, False),
    # A banner above ssh's own line says "permission denied" and "timed out": ssh's last word decides.
    (BANNER + "Connection closed by 10.0.0.7 port 22", HostUnreachable, False),
    (BANNER + "ssh: connect to host gpu01 port 22: Connection timed out", HostTimeout, True),
    ("Connection timed out\n" + "root@gpu01: Permission denied (publickey).", HostAuthError, False),
]


def smi_error(stderr: str, stdout: str = "") -> nc.NvmlCheckError | None:
    argv = ("ssh", "gpu01", "nvidia-smi", "--query-gpu=index", "--format=csv")
    return classify_failure(SmiResult(argv, argv[2:], 255, stdout, stderr, 1), prefixed=True)


@pytest.mark.parametrize(("stderr", "fleet_class", "transient"), CASES)
def test_an_ssh_failure_is_one_class_of_error_both_ways(stderr: str, fleet_class: type[nc.NvmlCheckError],
                                                        transient: bool) -> None:
    fleet = Fleet._classify(Host.parse("gpu01"), 255, "", stderr, 1.0, command=["wait"])
    smi = smi_error(stderr)
    assert type(fleet) is fleet_class
    assert isinstance(smi, nc.SmiTransportError)  # the way to nvidia-smi failed: never GPU state, never clean
    assert is_transient(smi) is is_transient(fleet) is transient
    assert isinstance(smi, TimeoutError) is isinstance(fleet, TimeoutError) is transient
    assert isinstance(smi, nc.SmiTransportTimeout) is transient
    last = [line for line in stderr.splitlines() if line.strip()][-1].strip()
    if fleet_class is not HostUnreachable or "closed" not in last:
        assert last in str(smi)  # the line that decided is named


@pytest.mark.parametrize("stderr", ["", BANNER])
def test_nvidia_smis_own_exit_255_through_ssh_is_not_a_transport_error(stderr: str) -> None:
    # nvidia-smi exits 255 on NVML's "Unknown Error" (nvidia-docker#1671) and ssh passes the status on: the command
    # ran (it printed), ssh said nothing of its own (a banner is not ssh's word). It was "the command prefix failed",
    # fatal; it is nvidia-smi's failure, transient as without a prefix.
    smi = smi_error(stderr, stdout="Failed to initialize NVML: Unknown Error")
    direct = classify_failure(SmiResult(("nvidia-smi",), ("nvidia-smi",), 255,
                                        "Failed to initialize NVML: Unknown Error", "", 1))
    assert smi is not None and direct is not None
    assert not isinstance(smi, nc.SmiTransportError) and type(smi) is type(direct) and is_transient(smi)


@pytest.mark.parametrize(("stdout", "stderr"), [
    ("index, uuid\n0, GPU-", "Connection to gpu01 closed by remote host."),  # dropped under a running command
    ("", ""),  # ssh -q: its own failure, said nowhere; nothing ran
    ("", BANNER + "ssh: connect to host gpu01 port 22: Connection refused"),
])
def test_ssh_that_failed_or_dropped_is_a_transport_error(stdout: str, stderr: str) -> None:
    smi = smi_error(stderr, stdout=stdout)
    assert isinstance(smi, nc.SmiTransportError) and not is_transient(smi)


def test_the_timeout_pickles_and_keeps_its_classes() -> None:
    smi = smi_error("ssh: connect to host gpu01 port 22: Connection timed out")
    assert isinstance(smi, nc.SmiTransportTimeout)
    copy = pickle.loads(pickle.dumps(smi))
    assert type(copy) is nc.SmiTransportTimeout and str(copy) == str(smi) and copy.returncode == 255
    assert nc.SmiTransportTimeout.__module__ == "nvmlcheck" and "TRANSIENT" in vars(nc.SmiTransportTimeout)
