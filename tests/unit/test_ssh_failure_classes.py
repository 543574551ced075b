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


def test_remote_output_on_stdout_does_not_decide() -> None:
    # nvidia-smi's messages go to stdout: a remote "timed out" there is not ssh's connect timeout.
    smi = smi_error("ssh: connect to host gpu01 port 22: Connection refused", stdout="NVML call timed out")
    assert isinstance(smi, nc.SmiTransportError) and not is_transient(smi)


def test_the_timeout_pickles_and_keeps_its_classes() -> None:
    smi = smi_error("ssh: connect to host gpu01 port 22: Connection timed out")
    assert isinstance(smi, nc.SmiTransportTimeout)
    copy = pickle.loads(pickle.dumps(smi))
    assert type(copy) is nc.SmiTransportTimeout and str(copy) == str(smi) and copy.returncode == 255
    assert nc.SmiTransportTimeout.__module__ == "nvmlcheck" and "TRANSIENT" in vars(nc.SmiTransportTimeout)
