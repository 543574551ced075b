"""A fleet against hostile, broken or merely odd hosts, without sshd: a fake ``ssh`` program stands for each
connection. Host specs with line breaks, the same host spelled twice, a hosts file with a byte order mark, stdout
noise around the document, exit statuses that are no verdict, a hostile kill document in the human view, a fleet
larger than its fanout against its timeout, and a signal while the answer is being written.

Nothing here asserts a duration; waits are for events, capped only against a hang.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli, hosts
from nvmlcheck.hosts import Fleet, Host, HostResult, RemoteError, parse_hosts, read_hosts_file

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = {"schema": "nvmlcheck/snapshot", "version": 1, "devices": [], "failures": []}


def _fake_ssh(path: Path, body: str) -> str:
    """An executable standing for ssh: ``body`` is Python run with the ssh arguments in ``sys.argv``."""
    path.write_text(f"#!{sys.executable}\nimport json, os, sys, time\n{body}\n", encoding="utf-8")
    path.chmod(0o755)
    return str(path)


# --- host specs --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["root\n@gpu01", "gpu01\n:22", "root\n@gpu01:22", "gpu01\n"[:-1] + "\n:2222"])
def test_a_spec_with_a_line_break_inside_is_refused(spec: str) -> None:
    # "$" in the spec's patterns let a trailing newline through: a user "root\n" reached ssh and the output.
    with pytest.raises(ValueError, match="bad host"):
        Host.parse(spec)


def test_the_same_host_spelled_twice_runs_once() -> None:
    # ssh lowercases the host name: GPU01 and gpu01 are one host, and a kill must not run twice there at once.
    got = parse_hosts(["GPU01", "gpu01", "root@gpu01", "[::1]", "[0:0::1]", "[::1]:22", "gpu01:22"])
    assert [str(h) for h in got] == ["GPU01", "root@gpu01", "[::1]", "[::1]:22", "gpu01:22"]


def test_a_hosts_file_with_a_byte_order_mark_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "fleet.txt"
    path.write_bytes(b"\xef\xbb\xbfgpu01\r\n# a comment\r\n\r\nroot@gpu02:2222  # trailing\r\n")
    assert read_hosts_file(path) == ["gpu01", "root@gpu02:2222"]


# --- what a host prints ------------------------------------------------------------------------------------------


def _classify(rc: int, out: str, command: str = "snapshot") -> HostResult | RemoteError:
    answer = Fleet._classify(Host("gpu01"), rc, out, "", 0.1, command=[command])
    assert isinstance(answer, HostResult | RemoteError), answer
    return answer


def test_a_document_amid_login_noise_is_the_answer_with_a_note() -> None:
    doc = json.dumps(SNAPSHOT, indent=1)
    for out in (f"Welcome to gpu01\nLast login: never\n{doc}\n", f"{doc}\nlogout\n", f"motd {{\n{doc}"):
        answer = _classify(0, out)
        assert isinstance(answer, HostResult) and answer.verdict == "clean", answer
        assert answer.note is not None and "besides the document" in answer.note
    assert _classify(0, doc).note is None  # type: ignore[union-attr]


def test_two_documents_in_one_answer_are_not_trusted() -> None:
    doc = json.dumps(SNAPSHOT, indent=1)
    answer = _classify(0, f"{doc}\n{doc}\n")
    assert isinstance(answer, RemoteError) and "2 nvmlcheck documents" in answer.message


@pytest.mark.parametrize("cut", ['{"schema": "nvmlcheck/snapshot", "version": 1, "devices": [',
                                 '{\n "schema": "nvmlcheck/snapshot",\n "version": 1,\n'])
def test_a_document_beside_one_cut_short_is_not_trusted(cut: str) -> None:
    # A partial line after (or before) a whole document was ignored as banner noise, the whole one the answer.
    doc = json.dumps(SNAPSHOT, indent=1)
    for out in (f"{doc}\n{cut}", f"{cut}\n{doc}\n"):
        answer = _classify(0, out)
        assert isinstance(answer, RemoteError) and "cut short" in answer.message, (out, answer)
    answer = _classify(0, f"{doc}\nlogout: {cut}")  # not beginning a line: not a document, noise
    assert isinstance(answer, HostResult) and answer.verdict == "clean", answer


def test_noise_alone_names_its_first_line_not_a_brace() -> None:
    answer = _classify(0, "Welcome to gpu01\n{\n}\n")
    assert isinstance(answer, RemoteError) and answer.message.endswith("Welcome to gpu01"), answer


def test_a_deeply_nested_answer_is_a_failure_not_an_internal_error() -> None:
    answer = _classify(0, '{"schema": "nvmlcheck/snapshot", "a": ' + "[" * 100_000)
    assert isinstance(answer, RemoteError)


@pytest.mark.parametrize(("command", "rc", "doc", "why"), [
    # snapshot's exit 3: a GPU it could not read. The host failed, and says why (it had no error at all before).
    ("snapshot", 3, {**SNAPSHOT, "failures": [{"index": 1, "error": {"type": "GpuLost", "message": "fell off"}}]},
     "GPU 1: fell off"),
    # a snapshot never exits 1: that was "not clean" before, for a command with no such verdict
    ("snapshot", 1, SNAPSHOT, "exit 1 with its nvmlcheck/snapshot document"),
    ("holders", 1, {"schema": "nvmlcheck/holders", "version": 1, "holders": []}, "exit 1"),
    ("wait", 4, {"schema": "nvmlcheck/wait", "version": 2, "clean": False}, "exit 4"),
    ("wait", 2, {"schema": "nvmlcheck/wait", "version": 2, "clean": False}, "exit 2"),
])
def test_an_exit_status_that_is_no_verdict_fails_with_a_reason(
        command: str, rc: int, doc: dict[str, Any], why: str) -> None:
    answer = _classify(rc, json.dumps(doc), command)
    assert isinstance(answer, RemoteError) and why in answer.message, answer
    assert answer.document == doc
    result = HostResult(Host("gpu01"), answer.document, rc, answer)
    assert result.verdict == "failed" and hosts.overall_exit_code([result]) == 3


# --- the human view of a hostile kill document ---------------------------------------------------------------------


def test_a_hostile_kill_document_shows_question_marks_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"schema": "nvmlcheck/kill", "version": 2, "clean": True, "clean_ns": "soon", "confirmed_ns": None,
           "pids": [{"pid": 1, "name": "\x1b]0;owned\x07x", "signals": [{"signal": "SIGTERM", "sent_ns": "x"}],
                     "exited_ns": [1]}, "junk"],
           "left_alone": "abc", "missing": 7, "not_ours": ["\x1b[2Jforged"]}
    ssh = _fake_ssh(tmp_path / "ssh", f"print({json.dumps(doc)!r})")
    monkeypatch.setattr(hosts, "Fleet", functools.partial(Fleet, ssh=ssh, control_master=False))
    code = cli.main(["kill", "--host", "gpu01", "--", "4123"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out, out
    assert "pid 1 (" in out and "SIGTERM ?" in out and "1 host: 1 clean" in out, out


# --- a fleet larger than its fanout ends by its timeout, not a multiple of it -------------------------------------


def test_a_host_started_late_gets_what_is_left_of_the_timeout(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    seen.mkdir()
    # The first host answers after a second (at least: a loaded machine only makes it later); the second, started
    # after it (fanout 1), records the --timeout it was given.
    body = (f"words = sys.argv[-1].split()\n"
            f"name = 'first' if 'gpu01' in sys.argv else 'second'\n"
            f"open(os.path.join({str(seen)!r}, name), 'w').write(words[words.index('--timeout') + 1])\n"
            f"time.sleep(1.0 if name == 'first' else 0)\n"
            f"print(json.dumps({{'schema': 'nvmlcheck/wait', 'version': 2, 'clean': True}}))\n")
    ssh = _fake_ssh(tmp_path / "ssh", body)
    with Fleet(ssh=ssh, control_master=False, fanout=1) as fleet:
        results = fleet.run(["gpu01", "gpu02"], ["wait", "--timeout", "1000.0"], timeout_s=1000.0)
    assert [r.verdict for r in results] == ["clean", "clean"], results
    assert float((seen / "first").read_text()) <= 1000.0
    assert float((seen / "second").read_text()) <= 999.0  # what was left after the first host's second


def test_an_explicit_deadline_or_another_timeout_leaves_the_command_alone(tmp_path: Path) -> None:
    assert hosts._with_timeout(["wait", "--timeout", "30.0"], 30.0, 12.5) == ["wait", "--timeout", "12.5"]
    assert hosts._with_timeout(["wait", "--timeout=30"], 30.0, 1.0) == ["wait", "--timeout=1.0"]
    assert hosts._with_timeout(["wait", "--timeout", "none"], 30.0, 1.0) is None
    assert hosts._with_timeout(["wait", "--timeout", "20"], 30.0, 1.0) is None
    assert hosts._with_timeout(["kill", "--", "--timeout", "30"], 30.0, 1.0) is None


# --- a signal while the answer is written ------------------------------------------------------------------------


def test_sigterm_while_the_document_is_written_leaves_a_whole_document(
    tmp_path: Path, sigterm_while_writing: Callable[..., tuple[bytes, int, bytes]]
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    big = {**SNAPSHOT, "padding": "x" * 300_000}  # far more than the pipe holds
    _fake_ssh(bin_dir / "ssh", f"print({json.dumps(big)!r})")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    env.pop("NVMLCHECK_SSH_OPTIONS", None)
    out, code, err = sigterm_while_writing(
        [sys.executable, "-m", "nvmlcheck", "snapshot", "--host", "gpu01", "--json"], env)
    doc = json.loads(out)  # whole: not cut where the signal came
    assert doc["schema"] == "nvmlcheck/hosts" and doc["hosts"][0]["document"]["padding"] == big["padding"]
    # The verdict was decided and is out whole: the command ends with it (an error document after the answer would
    # be a second document on stdout).
    assert code == 0, err
