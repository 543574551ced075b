"""docs/cli.md against the parser: every command is listed, every option a command takes is documented in its
section (global ones under "Global options", the host ones under "Many hosts", Slurm's in docs/slurm.md), every
option a synopsis shows exists, every JSON document the CLI prints is in the table of documents, and every exit
code ``--help`` names is in the exit-code table."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck.cli._parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
CLI = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
SLURM = (ROOT / "docs" / "slurm.md").read_text(encoding="utf-8")
GLOBAL = frozenset({"--backend", "--smi-prefix", "--simulate", "--devices", "--json"})
HOSTS = frozenset({"--host", "--hosts", "--hosts-file", "--remote-prefix", "--remote-python", "--fanout",
                   "--connect-timeout", "--ssh-options"})
#: cli.md section (its ``## `` heading) -> the commands it documents.
SECTIONS: dict[str, list[tuple[str, ...]]] = {
    "snapshot": [("snapshot",)],
    "wait": [("wait",)],
    "kill": [("kill",)],
    "watch": [("watch",)],
    "holders": [("holders",)],
    "ready": [("ready",)],
    "select": [("select",)],
    "demo": [("demo",)],
    "simulate": [("simulate", "run"), ("simulate", "hold"), ("simulate", "scenario")],
    "study reclaim": [("study", "reclaim"), ("study", "compare"), ("study", "fit")],
}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def parser_for(path: tuple[str, ...]) -> argparse.ArgumentParser:
    parser = build_parser()
    for word in path:
        parser = _subcommands(parser)[word]
    return parser


def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    subs = _subcommands(parser)
    if not subs:
        yield path
    for name, sub in subs.items():
        yield from leaves(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"}


def section(name: str) -> str:
    """The text of cli.md's ``## name`` section, up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(name)}\n(.*?)(?=^## )", CLI, re.MULTILINE | re.DOTALL)
    assert match is not None, f"docs/cli.md has no '## {name}' section"
    return match.group(1)


def _documented(option: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_every_command_is_listed() -> None:
    listed = CLI.split("## Global options", 1)[0]
    missing = [name for name in _subcommands(build_parser()) if f"[`{name}" not in listed]
    assert not missing, f"docs/cli.md's list of commands lacks {missing}"
    every = {path for path in leaves(build_parser())}
    covered = {path for paths in SECTIONS.values() for path in paths} | {p for p in every if p[0] == "slurm"}
    assert every == covered, f"commands this test does not map to a docs section: {sorted(every - covered)}"


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_every_option_is_documented(name: str) -> None:
    text = section(name)
    missing: list[str] = []
    for path in SECTIONS[name]:
        for option in sorted(options(parser_for(path)) - GLOBAL - HOSTS):
            if not _documented(option, text):
                missing.append(f"nvmlcheck {' '.join(path)} {option}")
    assert not missing, f"options not in docs/cli.md's '## {name}' section:\n" + "\n".join(missing)


def test_global_host_and_slurm_options_are_documented() -> None:
    every = set().union(*(options(parser_for(path)) for path in leaves(build_parser())))
    assert every >= GLOBAL | HOSTS, "the option sets of this test are out of date"
    globals_text, hosts_text = section("Global options"), section("Many hosts")
    missing = [o for o in sorted(GLOBAL - {"--json"}) if not _documented(o, globals_text)]
    missing += [o for o in sorted(HOSTS) if not _documented(o, hosts_text)]
    for path in (p for p in leaves(build_parser()) if p[0] == "slurm"):
        missing += [f"{' '.join(path)} {o}" for o in sorted(options(parser_for(path)) - GLOBAL) if
                    not _documented(o, SLURM)]
    assert not missing, f"options not documented where docs/cli.md says they are: {missing}"


def test_synopses_name_real_options() -> None:
    """Each ```text synopsis of a command section names only options that command (or a global) takes."""
    wrong: list[str] = []
    for name, paths in SECTIONS.items():
        known = set().union(*(options(parser_for(p)) for p in paths)) | GLOBAL | HOSTS
        for block in re.findall(r"^```text\n(.*?)^```", section(name), re.MULTILINE | re.DOTALL):
            for option in re.findall(r"(?<![\w-])--[a-z][a-z-]*", block):
                if option not in known:
                    wrong.append(f"'## {name}': {option}")
    assert not wrong, f"docs/cli.md synopses name options that do not exist: {wrong}"


def test_every_document_is_in_the_table() -> None:
    # The table: the lines from its header to the first line that is not a row (a blank line ends it).
    after = CLI.split("## JSON documents", 1)[1].split("| schema | printed by |", 1)[1]
    table = after.split("\n\n", 1)[0]
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "nvmlcheck" / "jsonout").glob("*.py"))
    kinds = set(re.findall(r'document\(\s*"([a-z-]+)"', code))
    kinds |= {"event", "study-compare"}  # printed by events.py and study/compare.py
    assert {"snapshot", "wait", "kill", "holders", "error"} <= kinds, kinds
    missing = sorted(k for k in kinds if f"`nvmlcheck/{k}`" not in table)
    assert not missing, f"documents missing from docs/cli.md's table of JSON documents: {missing}"


def test_exit_codes_in_help_are_in_the_table() -> None:
    epilog = build_parser().epilog or ""
    codes = {int(c) for c in re.findall(r"\b(\d{1,3})\b", epilog.split(":", 1)[1])}
    table = section("Exit codes")
    rows = {int(c) for line in table.splitlines() if line.startswith("| ") for c in
            re.findall(r"\b(\d{1,3})\b", line.split("|")[1])}
    assert codes and codes <= rows, f"exit codes in --help but not in docs/cli.md's table: {sorted(codes - rows)}"
