"""The command line's side of the contract (issue 24): every reading command describes itself in ``--help``, sizes
say which units are decimal, and the one size parser reads them so."""

from __future__ import annotations

import contextlib
import io

import pytest

import nvmlcheck as nc
from nvmlcheck._units import parse_size
from nvmlcheck.cli._parser import build_parser


def _help(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*argv, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("command", ["snapshot", "wait", "holders", "kill", "select", "watch", "simulate"])
def test_every_command_describes_itself(command: str) -> None:
    text = _help(command)
    usage_end = text.index("\n\n")
    described = text[usage_end:].lstrip().split("\n\n")[0]
    assert not described.startswith(("positional arguments", "options")), f"{command} --help has no description"
    assert len(described) > 60, described


@pytest.mark.parametrize("command", [("wait",), ("select",), ("simulate", "hold")])
def test_size_options_say_which_units_are_decimal(command: tuple[str, ...]) -> None:
    text = " ".join(_help(*command).split())
    assert "KB/MB/GB/TB powers of 10" in text and "16GB 16,000,000,000" in text


def test_sizes_decimal_and_binary() -> None:
    assert parse_size("16GiB") == parse_size("16G") == parse_size("16gib") == 16 * nc.GIB
    assert parse_size("16GB") == 16 * 10**9
    assert parse_size("2TB") == 2 * 10**12 and parse_size("2TiB") == parse_size("2T") == 2 << 40
    assert parse_size("512MiB") == 512 * nc.MIB and parse_size("512MB") == 512 * 10**6
    assert nc.GIB == 1 << 30 and nc.MIB == 1 << 20
    with pytest.raises(nc.ArgumentError, match="not a size"):
        parse_size("16 gigs")


@pytest.mark.parametrize("command", [["run"], ["hold", "--gpu", "0", "--bytes", "1GiB"]])
def test_simulate_takes_simulate_after_the_command_too(command: list[str]) -> None:
    # docs/cli.md: `--scenario` (or `--simulate`, before or after `simulate run`/`hold`); the error of a hold without a
    # scenario suggests `--simulate FILE` as well.
    args = build_parser().parse_args(["simulate", *command, "--simulate", "gpus.txt", "--", "true"])
    assert args.scenario == "gpus.txt"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", *command, "--simulate", "a", "--scenario", "b", "--", "true"])


def test_kill_help_names_every_selector_yes_covers_and_its_exit_codes() -> None:
    text = " ".join(_help("kill").split())
    assert "--match/--container/--cgroup" in text
    assert "exit codes: 0" in text and "4 a fatal GPU event" in text
    assert "NVMLCHECK_DEVICE_FILES" not in " ".join(_help("holders").split())  # the variable is gone (docs/killing.md)


@pytest.mark.parametrize(("argv", "meant"), [
    (["wait", "--time", "1"], "--timeout"),
    (["snapshot", "--dev", "0"], "--devices"),  # argparse names the '0' it then read as the view
    (["--js", "snapshot"], "--json"),  # an abbreviated --json printed its errors as text, its answers as JSON
    (["--sim", "h200", "wait"], "--simulate"),
    (["kill", "--y", "5"], "--yes"),
    (["wait", "--tiemout", "3"], "--timeout"),
])
def test_an_abbreviated_or_misspelt_option_is_refused_naming_the_option_meant(
    argv: list[str], meant: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse's abbreviations made `--dev 0` mean --devices: a launch script then depends on no longer option
    # beginning the same way, and wants_json (which reads argv before the parser) did not see `--js` as --json.
    from nvmlcheck.cli import main

    assert main(argv) == 2
    assert f"did you mean {meant}? (options are spelled in full)" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "commands"), [
    ([], "snapshot, watch, wait, kill"),
    (["simulate"], "run, hold, scenario"),
    (["study"], "reclaim, compare, fit"),
    (["slurm"], "epilog, prolog, health"),
])
def test_a_missing_command_is_named_with_the_commands_there_are(
    argv: list[str], commands: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from nvmlcheck.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"name a command: {commands}" in err and "_command" not in err


def test_simulate_refuses_json_rather_than_printing_no_document(capsys: pytest.CaptureFixture[str]) -> None:
    # `--json simulate scenario h200` printed the scenario file, exit 0: a --json run whose stdout is no document.
    import json

    from nvmlcheck.cli import main

    assert main(["--json", "simulate", "scenario", "h200"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "nvmlcheck/error" and doc["exit_code"] == 2
    assert "takes no --json" in doc["error"]["message"]


@pytest.mark.parametrize("argv", [["wait", "--x\x1b[2J"], ["\x1b]0;title\x07"], ["snapshot", "\u202eprocs"]])
def test_an_argument_error_escapes_what_the_words_carry(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # argparse's "unrecognized arguments: ..." and "invalid choice" wrote the words raw: an escape sequence in a
    # launch script's variable reached the terminal (every other message goes through nvmlcheck._text).
    from nvmlcheck.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err and "\x07" not in err
    assert "\\x1b" in err or "\\u202e" in err


@pytest.mark.parametrize("command", [[], ["wait"], ["kill"], ["simulate", "hold"], ["study", "reclaim"],
                                     ["slurm", "epilog"]])
def test_every_help_prints_on_an_ascii_terminal(command: list[str]) -> None:
    # `wait --help` has `µs`: on an ASCII terminal argparse's write raised UnicodeEncodeError, which the command line
    # reported as a usage error (exit 2) instead of the help.
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONIOENCODING": "ascii:strict"}
    out = subprocess.run([sys.executable, "-m", "nvmlcheck", *command, "--help"], capture_output=True, timeout=120,
                         check=False, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(b"usage: nvmlcheck") and out.stdout.isascii()


@pytest.mark.parametrize("argv", [["--json", "--version"], ["--version", "--json"]])
def test_json_version_is_a_document(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # `--json --version` printed "nvmlcheck 0.1.0": the one --json run whose stdout was no document.
    import json

    from nvmlcheck import __version__
    from nvmlcheck.cli import main

    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": "nvmlcheck/version", "version": 1,
                                                   "nvmlcheck": __version__}
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"nvmlcheck {__version__}\n"
