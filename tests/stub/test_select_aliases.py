"""A message names the option as the user typed it: ``select --timeout`` is ``--wait`` under another name, and a
message about it said ``--wait`` (or ``--wait/--timeout``) to a user who never typed that. Every option with two
names is checked (select's ``--wait``/``--timeout``, simulate's ``--scenario``/``--simulate``, study reclaim's
``--holder``/``--kind``), through the parser and the messages the commands make at run time."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck import cli
from nvmlcheck.cli._parser import build_parser
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub


def aliased() -> Iterator[tuple[list[str], list[str]]]:
    """(the command's words, the option's names) of every option with two names that takes a value."""

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> Iterator[tuple[list[str], list[str]]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])
            elif len(action.option_strings) > 1 and action.nargs is None and action.const is None:
                yield path, list(action.option_strings)

    yield from walk(build_parser(), [])


ALIASED = [(words, name, names) for words, names in aliased() for name in names]


def test_the_aliases_are_found() -> None:
    found = {(" ".join(words), tuple(names)) for words, _, names in ALIASED}
    assert ("select", ("--wait", "--timeout")) in found and ("study reclaim", ("--holder", "--kind")) in found


@pytest.mark.parametrize(("words", "name", "names"), ALIASED, ids=[f"{' '.join(w)} {n}" for w, n, _ in ALIASED])
def test_a_parse_error_names_the_spelling_typed(
    capsys: pytest.CaptureFixture[str], words: list[str], name: str, names: list[str]
) -> None:
    argv = [*words, *(["1"] if words == ["select"] else []), name]  # no value: "expected one argument"
    code = _main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert f"argument {name}: expected one argument" in err, err
    assert "/".join(names) not in err


@pytest.mark.parametrize(("words", "name", "names"), ALIASED, ids=[f"{' '.join(w)} {n}" for w, n, _ in ALIASED])
def test_given_twice_under_two_names_names_both(
    capsys: pytest.CaptureFixture[str], words: list[str], name: str, names: list[str]
) -> None:
    other = next(n for n in names if n != name)
    value = {"--holder": "alloc", "--kind": "alloc"}.get(name, "1")
    argv = [*words, *(["1"] if words == ["select"] else []), other, value, name, value]
    code = _main(argv)
    err = capsys.readouterr().err
    assert code == 2 and f"{name} (as {other} and {name}) given twice" in err, err


def _main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def test_a_bad_value_names_the_spelling_typed(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["select", "1", "--timeout", "-1"]) == 2
    err = capsys.readouterr().err
    assert "argument --timeout: must be >= 0" in err and "--wait" not in err.splitlines()[-1]
    assert _main(["select", "1", "--wait", "-1"]) == 2
    assert "argument --wait: must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--wait", "--timeout"])
def test_select_format_cuda_too_short_names_the_option_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    path = str(Scenario.h200().write(tmp_path / "s.txt"))
    code = cli.main(["--simulate", path, "select", "1", "--format", "cuda", option, "1e-9"])
    err = capsys.readouterr().err
    other = "--timeout" if option == "--wait" else "--wait"
    assert code == 1 and f"were not read within {option}" in err and other not in err, err


@pytest.mark.parametrize("option", ["--scenario", "--simulate"])
def test_simulate_names_the_scenario_option_typed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    missing = str(tmp_path / "no-such-file")
    assert _main(["simulate", "hold", "--gpu", "0", "--bytes", "1GiB", option, missing, "--", "true"]) == 2
    assert f"{option} '{missing}': no such scenario file" in capsys.readouterr().err
    assert _main(["simulate", "run", option, missing, "--", "true"]) == 2
    assert f"{option} '{missing}'" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--holder", "--kind"])
def test_study_names_the_holder_option_typed(capsys: pytest.CaptureFixture[str], option: str) -> None:
    assert _main(["study", "reclaim", option, "context", "--sizes", "1GiB"]) == 2
    assert f"{option} context allocates nothing" in capsys.readouterr().err
