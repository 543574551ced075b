"""nvmlcheck.hosts without ssh: host specs, hosts files, the ssh argv, classification, the one verdict."""

from __future__ import annotations

import pickle
import shlex
from pathlib import Path

import pytest

from nvmlcheck import ArgumentError
from nvmlcheck.hosts import (
    Fleet,
    Host,
    HostAuthError,
    HostResult,
    HostTimeout,
    HostUnreachable,
    NoRemoteNvmlcheck,
    RemoteError,
    overall_exit_code,
    parse_hosts,
    read_hosts_file,
)


@pytest.mark.parametrize(
    ("spec", "host", "user", "port", "text"),
    [
        ("gpu01", "gpu01", None, None, "gpu01"),
        ("root@gpu01", "gpu01", "root", None, "root@gpu01"),
        ("root@10.0.0.7:2222", "10.0.0.7", "root", 2222, "root@10.0.0.7:2222"),
        ("[::1]", "::1", None, None, "[::1]"),
        ("admin@[fe80::1%eth0]:22", "fe80::1%eth0", "admin", 22, "admin@[fe80::1%eth0]:22"),
        (" gpu-02.example.org ", "gpu-02.example.org", None, None, "gpu-02.example.org"),
    ],
)
def test_host_specs(spec: str, host: str, user: str | None, port: int | None, text: str) -> None:
    parsed = Host.parse(spec)
    assert (parsed.host, parsed.user, parsed.port) == (host, user, port)
    assert str(parsed) == text
    assert Host.parse(str(parsed)) == parsed


@pytest.mark.parametrize(
    "spec", ["", "-oProxyCommand=sh", "root@", "@gpu", "gpu:0", "gpu:65536", "gpu:x", "::1", "[::1", "[gpu]",
             "a b", "gpu;rm", "$(id)@gpu", "[::1]x"],
)
def test_bad_host_specs_name_themselves(spec: str) -> None:
    with pytest.raises(ValueError, match="bad host"):
        Host.parse(spec)


def test_parse_hosts_keeps_order_and_drops_duplicates() -> None:
    assert [str(h) for h in parse_hosts(["b", "a", "b", Host("c")])] == ["b", "a", "c"]


def test_hosts_file(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# fleet\ngpu01\n\n  root@gpu02:2222  # the second\n#gpu03\n", encoding="utf-8")
    assert read_hosts_file(path) == ["gpu01", "root@gpu02:2222"]


def test_the_remote_command_is_one_quoted_word() -> None:
    fleet = Fleet(ssh_options="-F /x/ssh_config", remote_prefix="pct exec 129 --", remote_python="python3 -S",
                  control_master=False)
    argv = fleet.argv(Host.parse("root@gpu01:2222"), ["wait", "--devices", "0;rm -rf /"])
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]
    assert "-F" in argv and argv[argv.index("-p") + 1] == "2222"
    assert argv[-3:-1] == ["--", "root@gpu01"]
    assert shlex.split(argv[-1]) == ["pct", "exec", "129", "--", "env", "NVMLCHECK_END_WITH_STDIN=1", "python3",
                                     "-S", "-m", "nvmlcheck", "--json", "wait", "--devices", "0;rm -rf /"]


def test_fleet_options_are_checked() -> None:
    with pytest.raises(ValueError, match="fanout"):
        Fleet(fanout=0)
    with pytest.raises(ValueError):
        Fleet(remote_prefix="pct 'exec")


@pytest.mark.parametrize(
    ("rc", "stderr", "cls"),
    [
        (255, "ssh: connect to host 127.0.0.9 port 22: Connection refused\n", HostUnreachable),
        (255, "root@gpu: Permission denied (publickey).\n", HostAuthError),
        (255, "Host key verification failed.\n", HostAuthError),
        (255, "Connection timed out during banner exchange\n", HostTimeout),
        # A login banner above ssh's own lines says what it likes: the last line that names a failure decides.
        (255, "Unauthorised use: permission denied to all but staff\nConnection closed by 10.0.0.7 port 22\n",
         HostUnreachable),
        (255, "Sessions are timed out after 15 minutes\nroot@gpu: Permission denied (publickey).\n", HostAuthError),
        (255, "Permission denied to visitors\nssh: connect to host gpu port 22: Connection timed out\n", HostTimeout),
        (255, "Received disconnect from 10.0.0.7 port 22:2: Too many authentication failures\n"
              "Disconnected from 10.0.0.7 port 22\n", HostAuthError),
        (1, "/usr/bin/python3: No module named nvmlcheck\n", NoRemoteNvmlcheck),
        (127, "bash: line 1: python3: command not found\n", NoRemoteNvmlcheck),
        (1, "Traceback ...\nSyntaxError\n", RemoteError),
        (None, "", HostTimeout),
    ],
)
def test_failures_are_classified(rc: int | None, stderr: str, cls: type) -> None:
    answer = Fleet._classify(Host("gpu"), rc, "", stderr, 1.0)
    assert type(answer) is cls
    assert str(answer).startswith("gpu: ")
    assert pickle.loads(pickle.dumps(answer)).args == answer.args  # type: ignore[union-attr]


def test_documents_are_kept_and_error_documents_are_remote_errors() -> None:
    ok = Fleet._classify(Host("gpu"), 1, '{"schema": "nvmlcheck/wait", "version": 2, "clean": false}', "", 0.1,
                         command=["wait"])
    assert isinstance(ok, HostResult) and ok.verdict == "not-clean"
    err = Fleet._classify(
        Host("gpu"), 3, '{"schema": "nvmlcheck/error", "version": 1, "error": {"type": "GpuLost", "message": "lost"}}',
        "", 0.1)
    assert isinstance(err, RemoteError) and err.document is not None and "GpuLost: lost" in str(err)


@pytest.mark.parametrize(("command", "rc", "doc", "why"), [
    # The exit status alone never makes a host clean: a document that cannot stand for the verdict fails the host.
    (["wait"], 0, {"schema": "nvmlcheck/wait", "version": 2, "clean": False}, "contradictory"),
    (["wait"], 0, {"schema": "nvmlcheck/snapshot", "version": 1, "devices": []}, "answered wait with"),
    (["wait"], 0, {"schema": "nvmlcheck/wait", "version": 9, "clean": True}, "version 9"),
    (["wait"], 0, {"schema": "nvmlcheck/wait", "version": 1, "clean": True}, "version 1"),
    (["ready"], 0, {"schema": "nvmlcheck/ready", "version": 1, "ready": True, "exit_code": 1}, "contradictory"),
    (["ready"], 0, {"schema": "nvmlcheck/ready", "version": 1, "ready": "yes", "exit_code": 0}, "contradictory"),
    # A document without its verdict, or without the list its lines come from, was not read whole (a hand-made or
    # broken one): exit 0 made it clean, and a snapshot of no "devices" an "ok" host of no GPU line.
    (["wait"], 0, {"schema": "nvmlcheck/wait", "version": 2}, "no 'clean'"),
    (["kill"], 0, {"schema": "nvmlcheck/kill", "version": 2, "pids": []}, "no 'clean'"),
    (["ready"], 0, {"schema": "nvmlcheck/ready", "version": 1, "exit_code": 0}, "no 'ready'"),
    (["wait"], 1, {"schema": "nvmlcheck/wait", "version": 2, "clean": True}, "contradictory"),
    (["ready"], 5, {"schema": "nvmlcheck/ready", "version": 1, "ready": True}, "contradictory"),
    (["snapshot"], 0, {"schema": "nvmlcheck/snapshot", "version": 1}, "no 'devices' list"),
    (["snapshot"], 0, {"schema": "nvmlcheck/snapshot", "version": 1, "devices": {}}, "no 'devices' list"),
    (["holders"], 0, {"schema": "nvmlcheck/holders", "version": 1, "holders": None}, "no 'holders' list"),
    (["kill"], 0, {"schema": "nvmlcheck/kill-plan", "version": 1}, "no 'targets' list"),
])
def test_a_document_that_cannot_stand_for_the_exit_status_fails_the_host(
        command: list[str], rc: int, doc: dict[str, object], why: str) -> None:
    import json

    answer = Fleet._classify(Host("gpu"), rc, json.dumps(doc), "", 0.1, command=command)
    assert isinstance(answer, RemoteError) and why in str(answer), answer
    assert HostResult(Host("gpu"), doc, rc, answer).verdict == "failed"
    schema = str(doc["schema"]) if doc["schema"] == "nvmlcheck/kill-plan" else f"nvmlcheck/{command[0]}"
    good = {**doc, "schema": schema, "version": 2 if schema in ("nvmlcheck/wait", "nvmlcheck/kill") else 1,
            "clean": True, "ready": True, "exit_code": 0, "devices": [], "holders": [], "targets": []}
    ok = Fleet._classify(Host("gpu"), 0, json.dumps(good), "", 0.1, command=command)
    assert isinstance(ok, HostResult) and ok.verdict == "clean"


def test_one_verdict() -> None:
    def r(code: int | None, doc: bool = True) -> HostResult:
        return HostResult(Host("h"), {"schema": "nvmlcheck/wait"} if doc else None, code)

    with pytest.raises(ArgumentError, match="nothing was checked"):
        overall_exit_code([])  # no host checked is no verdict, never "clean"
    assert overall_exit_code(iter([r(0)])) == 0  # any iterable, read once
    assert overall_exit_code([r(0), r(0)]) == 0
    assert overall_exit_code([r(0), r(1)]) == 1
    assert overall_exit_code([r(1), r(0, doc=False)]) == 3
    assert overall_exit_code([r(0), r(3)]) == 3
    assert r(0, doc=False).verdict == "failed"  # no document never looks clean


@pytest.mark.parametrize("command", ["wait", "kill"])
def test_events_reach_the_remote_command(command: str) -> None:
    from nvmlcheck.cli._hosts import remote_command
    from nvmlcheck.cli._parser import build_parser

    tail = ["--", "123"] if command == "kill" else []
    with_events = build_parser().parse_args([command, "--host", "gpu01", "--events", *tail])
    without = build_parser().parse_args([command, "--host", "gpu01", *tail])
    words = remote_command(with_events)
    assert "--events" in words and "--events" not in remote_command(without)
    if command == "kill":
        assert words.index("--events") < words.index("--")  # an option, not a PID


def test_how_each_host_error_is_handled_is_declared_on_its_class_as_for_the_smi_prefix() -> None:
    from nvmlcheck import SmiTimeout, SmiTransportError
    from nvmlcheck.hosts import HostError
    from nvmlcheck.wait import is_transient

    # HostTimeout was not transient while SmiTimeout, the same failure through --smi-prefix "ssh HOST", is: a caller
    # polling hosts gave up on a host that had only been slow. Every class decides for itself (none inherits by
    # accident), and the ssh failures match the smi backend's classes for them.
    classes = [HostError, HostUnreachable, HostAuthError, HostTimeout, RemoteError, NoRemoteNvmlcheck]
    assert all("TRANSIENT" in vars(c) for c in classes), [c.__name__ for c in classes if "TRANSIENT" not in vars(c)]
    assert HostTimeout.TRANSIENT == SmiTimeout.TRANSIENT is True
    assert HostUnreachable.TRANSIENT == SmiTransportError.TRANSIENT is False
    slow = Fleet._classify(Host.parse("gpu01"), None, "", "", 12.5, command=["wait"])
    refused = Fleet._classify(Host.parse("gpu01"), 255, "", "ssh: connect to host gpu01 port 22: Connection refused",
                              1.0, command=["wait"])
    assert isinstance(slow, HostTimeout) and is_transient(slow)
    assert isinstance(refused, HostUnreachable) and not is_transient(refused)
    assert HostResult(Host.parse("gpu01"), None, None, slow).verdict == "failed"  # transient, never clean


#: Each command run on hosts with every option of its own set away from its default; values a user chooses begin with
#: "-" where they may.
_EVERY_OPTION = {
    "snapshot": ["--backend", "smi", "--devices", "0,1"],
    "holders": ["--backend", "smi", "--devices", "0,1", "--timeout", "7"],
    "wait": ["--backend", "smi", "--devices", "0,1", "--timeout", "7", "--max-used", "1MiB", "--stable-polls", "3",
             "--events", "--pids", "11", "12", "--precise"],
    "ready": ["--backend", "smi", "--devices", "0,1", "--need", "1GiB", "--timeout", "7", "--max-used", "1MiB",
              "--stable-polls", "3", "--no-events"],
    "kill": ["--backend", "smi", "--devices", "0,1", "--timeout", "7", "--max-used", "1MiB", "--stable-polls", "3",
             "--events", "--grace", "1", "--signal", "INT", "--tree", "--all-holders", "--all-on-gpu", "--yes",
             "--match=-m", "--container=-c", "--cgroup=-g", "--exclude=-agent", "--exclude", "4242", "--dry-run",
             "--missing-ok", "--only-targets", "--", "11", "12"],
}


@pytest.mark.parametrize("command", sorted(_EVERY_OPTION))
def test_every_option_of_a_command_reaches_the_hosts_as_given(command: str) -> None:
    import argparse

    from nvmlcheck.cli._hosts import LOCAL_OPTIONS, remote_command
    from nvmlcheck.cli._parser import build_parser

    # kill --exclude was never passed on: `kill --all-holders --exclude AGENT --yes --hosts ...` signalled the
    # agent on every host. And --container=-c reached the remote parser as "--container -c": a usage error there.
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = {a.dest for a in sub.choices[command]._actions if a.dest != "help"} - LOCAL_OPTIONS
    here = parser.parse_args([command, "--host", "gpu01", *_EVERY_OPTION[command]])
    default = parser.parse_args([command, "--host", "gpu01"] + (["--", "1"] if command == "kill" else []))
    untested = {o for o in options if getattr(here, o) == getattr(default, o)}
    assert not untested, f"set these in _EVERY_OPTION[{command!r}] (or add them to LOCAL_OPTIONS): {untested}"
    there = parser.parse_args(remote_command(here))
    assert {o: getattr(there, o) for o in options} == {o: getattr(here, o) for o in options}


@pytest.mark.parametrize(("fields", "why"), [
    (("gpu01\nX",), "is not a host name or address"),
    (("-oProxyCommand=sh",), "is not a host name or address"),
    (("gpu 01",), "is not a host name or address"),
    (("",), "is not a host name or address"),
    (("gpu01", "root\n"), "bad user"),
    (("gpu01", None, 0), "port must be an int 1-65535"),
    (("gpu01", None, True), "port must be an int 1-65535"),
    (("gpu01", None, "22"), "port must be an int 1-65535"),
])
def test_a_host_built_directly_is_held_to_the_rules_of_parse(fields: tuple[object, ...], why: str) -> None:
    # parse() refused these, but Host(...) took them as given, and parse_hosts() passes Host objects through: a
    # newline reached ssh's destination and every line printed about the host.
    with pytest.raises(ArgumentError, match=why):
        Host(*fields)  # type: ignore[arg-type]


def test_what_parse_makes_is_a_valid_host() -> None:
    assert Host("fe80::1%eth0", "admin", 22) == Host.parse("admin@[fe80::1%eth0]:22")
    assert Host("gpu-02.example.org") == Host.parse("gpu-02.example.org")


@pytest.mark.parametrize("word", ["35", "RTMIN+1", "sigrtmax-2", "9", "term"])
def test_kill_passes_the_signal_to_the_hosts_as_the_user_spelled_it(word: str) -> None:
    import signal as _signal

    from nvmlcheck.cli._hosts import remote_command
    from nvmlcheck.cli._parser import build_parser

    if not hasattr(_signal, "SIGRTMIN"):
        pytest.skip("no real-time signals here")
    here = build_parser().parse_args(["kill", "--host", "gpu01", "--signal", word, "--", "1"])
    words = remote_command(here)
    # Before, the host's own name was passed: `--signal 35` became "SIGRTMIN+1" (glibc's SIGRTMIN is 34), which a
    # musl host (SIGRTMIN 35) read as 36. The number stays a number; RTMIN+N stays relative to each host's SIGRTMIN.
    assert words[words.index("--signal") + 1] == word
    if word in ("35", "RTMIN+1") and int(_signal.SIGRTMIN) == 34:
        assert here.signal == "SIGRTMIN+1"  # named here as before (the plan, the records)


@pytest.mark.parametrize(("argv", "command"), [
    (["select", "--hosts", "gpu01"], "select runs on this machine only"),  # was "argument K: not an integer: 'gpu01'"
    (["select", "1", "--host", "gpu01"], "select runs on this machine only"),
    (["watch", "--hosts-file=fleet.txt"], "watch runs on this machine only"),
    (["--host", "gpu01", "wait"], "not an option of nvmlcheck itself"),  # was "unknown command 'gpu01'" alone
])
def test_a_host_option_where_none_is_taken_says_which_commands_take_it(
        argv: list[str], command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]
    option = next(w for w in argv if w.startswith("--host")).partition("=")[0]
    assert line.partition("error: ")[2].startswith(f"{option}: {command}"), err
    assert "snapshot, wait, kill, ready, holders take --host/--hosts/--hosts-file" in line, err


def test_a_remote_commands_own_exit_255_is_a_remote_error_not_unreachable() -> None:
    # ssh's stdout is the remote side's alone: with text there, the host was reached, and an exit 255 without a line
    # of ssh's is the remote command's own. It read "unreachable: boom".
    answer = Fleet._classify(Host("gpu"), 255, "motd: welcome\n", "boom\n", 0.1, command=["wait"])
    assert isinstance(answer, RemoteError) and "remote command's own" in answer.message and "boom" in answer.message
    # ssh's own line still decides, stdout or not (a connection dropped under a running command).
    dropped = Fleet._classify(Host("gpu"), 255, "motd: welcome\n", "Connection to gpu closed by remote host.\n", 0.1,
                              command=["wait"])
    assert type(dropped) is HostUnreachable
    assert type(Fleet._classify(Host("gpu"), 255, "", "boom\n", 0.1, command=["wait"])) is HostUnreachable
