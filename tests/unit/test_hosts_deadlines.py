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


def test_the_ssh_config_questions_count_against_the_calls_timeout(tmp_path: Path) -> None:
    # gpu01 and root@gpu01 are asked of ssh -G (which ones are one host) before any runs: that took up to 5 s
    # outside the timeout, each host then given the whole --timeout again. The fake ssh -G takes a second (at least:
    # load only makes it later) and names two users, so both run; each records the --timeout it was given.
    import json
    import sys

    seen = tmp_path / "seen"
    seen.mkdir()
    ssh = tmp_path / "ssh"
    ssh.write_text(
        f"#!{sys.executable}\nimport json, os, sys, time\n"
        "if '-G' in sys.argv:\n"
        "    time.sleep(1.0)\n"
        "    user = 'root' if 'root@gpu01' in sys.argv else 'me'\n"
        "    print(f'user {user}\\nhostname gpu01\\nport 22')\n"
        "    sys.exit(0)\n"
        "words = sys.argv[-1].split()\n"
        f"open(os.path.join({str(seen)!r}, sys.argv[-2]), 'w').write(words[words.index('--timeout') + 1])\n"
        f"print({json.dumps(json.dumps({'schema': 'nvmlcheck/wait', 'version': 2, 'clean': True}))})\n",
        encoding="utf-8")
    ssh.chmod(0o755)
    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        results = fleet.run(["gpu01", "root@gpu01"], ["wait", "--timeout", "1000.0"], timeout_s=1000.0)
    assert [r.verdict for r in results] == ["clean", "clean"], results
    assert float((seen / "gpu01").read_text()) <= 999.0
    assert float((seen / "root@gpu01").read_text()) <= 999.0


@pytest.mark.parametrize(("command", "answer", "why"), [
    # nvidia-smi could not read GPU 1: a failed host with "error": null and "FAILED: exit 3", where the same answer
    # from nvmlcheck on the host is a remote error naming the GPU.
    (["snapshot"], ({"schema": "nvmlcheck/snapshot", "version": 1, "devices": [],
                     "failures": [{"index": 1, "error": {"type": "GpuLost", "message": "fell off"}}]}, 3),
     "exit 3 with its nvmlcheck/snapshot document: GPU 1: fell off"),
    # A fallback of the caller's is held to the remote nvmlcheck's rules: no verdict in it is not clean.
    (["wait", "--timeout", "0"], ({"schema": "nvmlcheck/wait", "version": 2}, 0), "no 'clean'"),
    (["wait", "--timeout", "0"], ({"schema": "nvmlcheck/snapshot", "version": 1, "devices": []}, 0), "answered wait"),
    (["wait", "--timeout", "0"], (None, 0), "gave no document"),
    # nvidia-smi listed no GPU: the snapshot's exit 3 says so
    (["snapshot"], ({"schema": "nvmlcheck/snapshot", "version": 1, "devices": [], "failures": []}, 3),
     "exit 3 with its nvmlcheck/snapshot document: no GPU in it"),
])
def test_a_fallbacks_answer_that_is_no_verdict_is_a_remote_error_saying_why(
        tmp_path: Path, command: list[str], answer: tuple[object, int], why: str) -> None:
    ssh = tmp_path / "ssh"
    ssh.write_text("#!/bin/sh\necho \"No module named nvmlcheck\" >&2\nexit 1\n", encoding="utf-8")
    ssh.chmod(0o755)

    def fallback(context: hosts.FallbackContext) -> tuple[object, int]:
        return answer

    with Fleet(ssh=str(ssh), control_master=False) as fleet:
        result, = fleet.run(["gpu01"], command, timeout_s=0.0, fallback=fallback)  # type: ignore[arg-type]
    assert isinstance(result.error, hosts.RemoteError) and why in result.error.message, result
    assert "nvidia-smi" in result.error.message and result.verdict == "failed"
    assert result.document == answer[0] and hosts.overall_exit_code([result]) == 3


def test_a_host_started_late_gets_what_is_left_in_its_nvidia_smi_fallback_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The remote --timeout of a host queued behind the fanout shrank; its nvidia-smi fallback's wait still had the
    # whole --timeout (a fleet of 3 hosts at fanout 1, --timeout 2: the second, without nvmlcheck, waited 2 s more).
    import sys

    ssh = tmp_path / "ssh"
    ssh.write_text(f"#!{sys.executable}\nimport sys, time\n"
                   "time.sleep(1.0 if 'gpu01' in sys.argv else 0)\n"  # at least a second: load only adds to it
                   "print('No module named nvmlcheck', file=sys.stderr)\nsys.exit(1)\n", encoding="utf-8")
    ssh.chmod(0o755)
    given: list[float | None] = []

    def call(self: hosts.SmiFallback, context: hosts.FallbackContext) -> tuple[dict[str, object], int]:
        given.append(self.timeout_s)
        return {"schema": "nvmlcheck/wait", "version": 2, "clean": True}, 0

    monkeypatch.setattr(hosts.SmiFallback, "__call__", call)
    with Fleet(ssh=str(ssh), control_master=False, fanout=1) as fleet:
        results = fleet.run(["gpu01", "gpu02"], ["wait", "--timeout", "1000.0"], timeout_s=1000.0,
                            fallback=hosts.SmiFallback("wait", timeout_s=1000.0))
    assert [r.verdict for r in results] == ["clean", "clean"], results
    assert given[0] is not None and given[0] <= 1000.0
    assert given[1] is not None and given[1] <= 999.0


def test_a_host_whose_turn_came_after_the_timeout_says_so(tmp_path: Path) -> None:
    # Its remote wait, given the least positive timeout, blamed "opening the GPUs" for not confirming in time; the
    # host's note names the fleet's queue (--fanout) instead. Its verdict stays not clean: it was not confirmed.
    import json
    import sys

    ssh = tmp_path / "ssh"
    doc = {"schema": "nvmlcheck/wait", "version": 2, "clean": False, "culprits": ["the timeout was used up"]}
    ssh.write_text(f"#!{sys.executable}\nimport sys, time\n"
                   "if 'gpu01' in sys.argv:\n"
                   "    time.sleep(1.0)\n"  # past the whole --timeout of 0.5 s, however loaded the machine
                   f"    print({json.dumps(json.dumps({**doc, 'clean': True}))}); sys.exit(0)\n"
                   "words = sys.argv[-1].split()\n"
                   "assert float(words[words.index('--timeout') + 1]) <= 1e-9, words\n"
                   f"print({json.dumps(json.dumps(doc))}); sys.exit(1)\n", encoding="utf-8")
    ssh.chmod(0o755)
    with Fleet(ssh=str(ssh), control_master=False, fanout=1) as fleet:
        first, late = fleet.run(["gpu01", "gpu02"], ["wait", "--timeout", "0.5"], timeout_s=0.5)
    assert first.verdict == "clean" and first.note is None
    assert late.verdict == "not-clean" and late.note is not None and "--fanout 1" in late.note, late
    assert "used up before it started" in late.note


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
