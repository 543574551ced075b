"""The quick parse (cli/_quick.py) gives argparse's namespace for every form it reads, and hands everything else to
argparse: the two parses are compared word for word on a corpus of launch-script argvs, defaults included."""

from __future__ import annotations

import argparse

import pytest

from nvmlcheck.cli._parser import build_parser, command_in
from nvmlcheck.cli._quick import Namespace, quick_parse

#: Forms the quick parse reads (it must not hand them to argparse).
READ = [
    ["wait"], ["snapshot"], ["ready"], ["kill", "5"], ["kill"],
    ["wait", "--timeout", "0"], ["wait", "--timeout=0"], ["wait", "--timeout", "none"], ["--json", "wait"],
    ["wait", "--json"], ["--json", "wait", "--json"], ["wait", "--max-used", "1GiB", "--stable-polls", "3"],
    ["wait", "--events", "--precise"], ["--devices", "0,1", "wait"], ["wait", "--devices", "0", "--devices", "1,0"],
    ["--devices", "2", "snapshot", "--devices", "GPU-1234"], ["--backend", "nvml", "wait"], ["wait", "--backend=smi"],
    ["--simulate", "h200", "wait"], ["wait", "--smi-prefix", "ssh gpu01"], ["--devices", "cuda:0", "ready"],
    ["snapshot", "procs"], ["snapshot", "devices", "--json"], ["--json", "snapshot", "procs"],
    ["ready", "--need", "80GiB"], ["ready", "--need", "0.9", "--timeout", "5"], ["ready", "--need=90%"],
    ["ready", "--no-events", "--max-used", "0", "--stable-polls", "1"],
    ["kill", "5", "6"], ["kill", "--tree", "5"], ["kill", "5", "--tree"], ["kill", "--devices", "0", "5"],
    ["kill", "--devices", "0", "--tree", "5", "6"], ["--devices", "0", "kill", "5"], ["kill", "--match", "python3 x"],
    ["kill", "--match", "srv", "--yes", "--tree"], ["kill", "--cgroup", "/docker/abc", "--yes"],
    ["kill", "--container", "lxc/129", "--yes"], ["kill", "--grace", "never", "--signal", "KILL", "5"],
    ["kill", "--grace", "0.5", "--signal", "9", "--timeout", "3", "5"], ["kill", "--dry-run", "--missing-ok", "5"],
    ["kill", "--all-holders", "--yes"], ["kill", "--all-on-gpu", "--devices", "1", "--yes"],
    ["kill", "--only-targets", "5"], ["--json", "kill", "--events", "5"], ["kill", "--match=a=b", "--yes"],
    ["kill", "--devices", "GPU-12ab", "5"], ["--backend", "smi", "kill", "5"],
]

#: Forms it hands to argparse (errors, help, what it does not read).
HANDED = [
    [], ["--help"], ["-h"], ["wait", "--help"], ["--version"], ["demo"], ["holders"], ["frobnicate"],
    ["wait", "--timeout", "1", "--timeout", "2"], ["--backend", "nvml", "snapshot", "--backend", "smi"],
    ["wait", "--timeout", "abc"], ["wait", "--timeout", "-1"], ["wait", "--time", "0"], ["wait", "--pids", "5"],
    ["wait", "--host", "gpu01"], ["kill", "--hosts", "a,b", "5"], ["--backend", "bogus", "wait"], ["wait", "5"],
    ["snapshot", "everything"], ["snapshot", "procs", "devices"], ["kill", "5", "--tree", "6"], ["kill", "-5"],
    ["kill", "x"], ["kill", "--", "5"], ["wait", "--json=1"], ["kill", "--grace"], ["wait", "--devices", ""],
    ["wait", "--devices", "cuda:x"], ["ready", "--need", "2.0"], ["kill", "--signal", "NOPE", "5"],
    ["kill", "--match", "-x"], ["wait", "--stable-polls", "0"], ["wait", "-"],
]


def _argparse(argv: list[str]) -> argparse.Namespace | None:
    try:
        return build_parser(only=command_in(argv)).parse_args(argv)
    except SystemExit:
        return None


@pytest.mark.parametrize("argv", READ, ids=" ".join)
def test_the_quick_parse_reads_the_plain_forms_as_argparse_does(argv: list[str]) -> None:
    quick = quick_parse(argv)
    assert quick is not None, "handed to argparse"
    expected = _argparse(argv)
    assert expected is not None
    assert vars(quick) == vars(expected)
    assert {k: type(v) for k, v in vars(quick).items()} == {k: type(v) for k, v in vars(expected).items()}


@pytest.mark.parametrize("argv", HANDED, ids=" ".join)
def test_everything_else_goes_to_argparse(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert quick_parse(argv) is None


def test_every_option_of_the_quick_commands_is_known_to_it() -> None:
    # An option added to argparse's wait/snapshot/ready/kill must be added to the quick parse (or refused by it):
    # without it, the quick namespace would lack its default.
    for command in ("wait", "snapshot", "ready", "kill"):
        quick = quick_parse([command])
        assert quick is not None and vars(quick) == vars(_argparse([command])), command


def test_the_namespace_compares_as_argparse_does() -> None:
    assert Namespace(a=1) == argparse.Namespace(a=1) and Namespace(a=1) != Namespace(a=2)
    assert "a" in Namespace(a=1) and "b" not in Namespace(a=1)


@pytest.mark.parametrize(("option", "word"), [("--timeout", "none"), ("--grace", "never")])
def test_a_bad_duration_names_the_word_for_no_bound(
    option: str, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["kill", option, bad, "5"])
        assert f"(or '{word}')" in capsys.readouterr().err  # --grace's is 'never', as its help says


def test_a_parser_built_for_one_command_shows_the_full_usage() -> None:
    """The fast path builds one command's parser (``only=``); its usage line must still name every command, not
    ``{wait}`` alone as if wait were the only one (``nvmlcheck wait --bogus`` printed that)."""
    from nvmlcheck.cli._parser import COMMAND_NAMES, USAGE_ORDER

    full = build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert tuple(sub.choices) == USAGE_ORDER and set(USAGE_ORDER) == set(COMMAND_NAMES)
    for command in COMMAND_NAMES:
        assert build_parser(only=command).format_usage() == full.format_usage(), command
    assert "{" + ",".join(USAGE_ORDER) + "}" in full.format_usage()


def test_a_usage_error_after_a_command_shows_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(only="wait").parse_args(["wait", "--bogus"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --bogus" in err and "{wait}" not in err and "snapshot,watch,wait,kill" in err
