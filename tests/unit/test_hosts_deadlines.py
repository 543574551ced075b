"""A fleet's deadline is a number: NaN, which passes every comparison as false, once meant no deadline at all (a host
that hangs hung the call), and is refused before anything runs, as is a negative one."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest

from nvmlcheck import hosts
from nvmlcheck.hosts import Fleet


@pytest.mark.parametrize(("keyword", "value"), [("timeout_s", math.nan), ("deadline_s", math.nan),
                                                  ("timeout_s", -1.0), ("deadline_s", -0.5), ("timeout_s", True)])
def test_a_deadline_that_is_no_number_of_seconds_is_refused_before_any_ssh(keyword: str, value: float,
                                                                          tmp_path: Path) -> None:
    started = tmp_path / "started"
    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 1000\n", encoding="utf-8")
    ssh.chmod(0o755)
    with Fleet(ssh=str(ssh), control_master=False) as fleet, pytest.raises(ValueError, match=keyword):
        if keyword == "timeout_s":
            fleet.run(["gpu01"], ["wait", "--timeout", "0"], timeout_s=value)
        else:
            fleet.run(["gpu01"], ["wait", "--timeout", "0"], deadline_s=value)
    assert not started.exists()


def test_nan_through_the_helpers_is_refused_too() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a number of seconds"):
        hosts.wait_on_hosts(["gpu01"], math.nan)


def test_a_control_directory_named_with_other_digits_is_left_alone(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # str.isdigit takes "²": int("²") then raised inside every host's ssh command, failing the whole fleet.
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    odd = tmp_path / "nvmlcheck-ssh-²-1-abc"
    odd.mkdir()
    hosts._sweep_stale_control_dirs("ssh", [])
    assert odd.is_dir()


def test_a_fallback_that_raises_systemexit_fails_its_host_and_the_call_ends(tmp_path: Path) -> None:
    # A host without nvmlcheck, read through a caller's fallback that exits: its worker thread ended without a
    # result, and the call waited for it forever.
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho \"No module named nvmlcheck\" >&2\nexit 1\n", encoding="utf-8")
    ssh.chmod(0o755)

    def fallback(context: hosts.FallbackContext) -> tuple[dict[str, object], int]:
        raise SystemExit(0)

    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        results = fleet.run(["gpu01", "gpu02"], ["wait", "--timeout", "0"], timeout_s=0.0, fallback=fallback)
    assert [r.verdict for r in results] == ["failed", "failed"]
    assert all(r.error is not None and "internal error: SystemExit" in r.error.message for r in results)
    assert hosts.overall_exit_code(results) == 3


def test_a_fallback_gets_the_fleets_guard_for_its_runs(tmp_path: Path) -> None:
    # The nvidia-smi runs of a fallback go over ssh too: without the fleet's guard a SIGKILLed fleet left them running.
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho \"No module named nvmlcheck\" >&2\nexit 1\n", encoding="utf-8")
    ssh.chmod(0o755)
    guards: list[object] = []

    def fallback(context: hosts.FallbackContext) -> tuple[dict[str, object], int]:
        guards.append(context.guard)
        return {"schema": "nvmlcheck/snapshot", "version": 1, "devices": []}, 3

    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        fleet.run(["gpu01"], ["snapshot"], timeout_s=5.0, fallback=fallback)
        assert guards == [fleet._guard] and guards[0] is not None


def test_a_fallback_whose_nvidia_smi_times_out_is_a_host_timeout(tmp_path: Path) -> None:
    # The same failure as a HostTimeout (no answer in time), reached through the nvidia-smi fallback, was a
    # RemoteError: not transient, while a host whose nvmlcheck timed out is.
    from nvmlcheck import SmiTimeout
    from nvmlcheck.wait import is_transient

    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho \"No module named nvmlcheck\" >&2\nexit 1\n", encoding="utf-8")
    ssh.chmod(0o755)

    def fallback(context: hosts.FallbackContext) -> tuple[dict[str, object], int]:
        raise SmiTimeout(["ssh", "gpu01", "nvidia-smi"], 5.0)

    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        result, = fleet.run(["gpu01"], ["snapshot"], timeout_s=5.0, fallback=fallback)
    assert isinstance(result.error, hosts.HostTimeout) and is_transient(result.error), result.error
    assert result.verdict == "failed" and "nvidia-smi did not answer in time" in result.error.message


def test_a_fallback_whose_nvidia_smi_times_out_while_opening_is_a_host_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fallback opens an SmiBackend, whose opening wraps nvidia-smi's timeout in BackendUnavailable (its cause):
    # the fleet looked only at the error itself and called that host a RemoteError, not transient.
    import sys

    from nvmlcheck.backends.smi import SmiBackend
    from nvmlcheck.testing import stub_source_dir
    from nvmlcheck.wait import is_transient

    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho \"No module named nvmlcheck\" >&2\nexit 1\n", encoding="utf-8")
    ssh.chmod(0o755)
    monkeypatch.setenv("FAKE_SMI_DELAY_S", "30")  # nvidia-smi does not answer

    def fallback(context: hosts.FallbackContext) -> tuple[dict[str, object], int]:
        SmiBackend(command=[sys.executable, "-S", str(stub_source_dir() / "fake_nvidia_smi.py")], timeout_s=0.2)
        raise AssertionError("the backend opened")

    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        result, = fleet.run(["gpu01"], ["snapshot"], timeout_s=5.0, fallback=fallback)
    assert isinstance(result.error, hosts.HostTimeout) and is_transient(result.error), result.error
    assert "did not answer" in result.error.message
