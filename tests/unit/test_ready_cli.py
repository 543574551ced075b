"""``ready``'s command line without a GPU: --need parsing, the words sent to --hosts, and the hosts' verdicts."""

from __future__ import annotations

import argparse

import pytest

from nvmlcheck.cli._hosts import remote_command
from nvmlcheck.cli._parser import build_parser
from nvmlcheck.cli._values import need_amount
from nvmlcheck.hosts import Host, HostResult, overall_exit_code

GIB = 1 << 30


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GiB", (80 * GIB, None)), ("4096B", (4096, None)), ("0", (0, None)), ("0.9", (None, 0.9)),
     ("90%", (None, 0.9)), ("1.0", (None, 1.0)), (".5", (None, 0.5)), (str(1 << 20), (1 << 20, None)),
     (str(80 * GIB), (80 * GIB, None)), ("16GB", (16 * 10**9, None)), ("16G", (16 * GIB, None))],
)
def test_need_is_bytes_or_a_fraction(text: str, expected: tuple[int | None, float | None]) -> None:
    need_bytes, fraction = need_amount(text)
    assert need_bytes == expected[0]
    assert fraction == pytest.approx(expected[1]) if expected[1] is not None else fraction is None


@pytest.mark.parametrize("text", ["1.5", "150%", "0%", "lots", "-1GiB", "-1", "nan", "inf", "1e3", "0.0", ""])
def test_bad_needs_are_usage_errors_naming_the_rule(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        need_amount(text)


@pytest.mark.parametrize("text", ["2", "16", "80", "90", "100", "4096", "143771", str((1 << 20) - 1)])
def test_a_bare_number_under_a_mib_is_ambiguous_never_bytes(text: str) -> None:
    """``--need 80`` was 80 bytes: any GPU has that free, so ``ready`` said ready on a GPU with 1 GiB free where
    80 GiB (or 80 %, or nvidia-smi's 80 MiB) was meant. It is refused, naming the spellings that say which."""
    with pytest.raises(argparse.ArgumentTypeError, match=f"--need {text} is ambiguous.*{text}GiB.*{text}%.*{text}B"):
        need_amount(text)


def test_ready_defaults_to_one_check() -> None:
    args = build_parser(only="ready").parse_args(["ready"])
    assert (args.timeout, args.need, args.no_events, args.stable_polls) == (0.0, None, False, 2)


def test_hosts_run_ready_with_its_own_options() -> None:
    args = build_parser(only="ready").parse_args(
        ["--devices", "0,cuda:1", "ready", "--need", "90%", "--timeout", "5", "--no-events", "--hosts", "a,b"])
    words = remote_command(args)
    assert words[:3] == ["ready", "--devices", "0,cuda:1"]
    assert words[words.index("--timeout") + 1] == "5.0" and words[words.index("--need") + 1] == "0.9"
    assert "--no-events" in words and "--max-used" in words
    bytes_args = build_parser(only="ready").parse_args(["ready", "--need", "80GiB", "--hosts", "a"])
    assert remote_command(bytes_args)[remote_command(bytes_args).index("--need") + 1] == f"{80 * GIB}B"
    # A small need in bytes reaches the host as bytes, never as a bare number it refuses as ambiguous.
    small = build_parser(only="ready").parse_args(["ready", "--need", "512B", "--hosts", "a"])
    sent = remote_command(small)[remote_command(small).index("--need") + 1]
    assert sent == "512B" and need_amount(sent) == (512, None)


def test_a_host_that_needs_an_operator_gives_exit_5_unless_one_failed() -> None:
    doc = {"schema": "nvmlcheck/ready", "version": 1}
    sick = HostResult(Host("a"), doc, 5)
    late = HostResult(Host("b"), doc, 1)
    assert (sick.verdict, late.verdict) == ("unhealthy", "not-clean")
    assert overall_exit_code([sick, late]) == 5
    assert overall_exit_code([late]) == 1
    assert overall_exit_code([sick, HostResult(Host("c"), None, 3)]) == 3
    # exit 5 from another command is no verdict this version knows: failed, never clean
    assert HostResult(Host("d"), {"schema": "nvmlcheck/wait"}, 5).verdict == "failed"


@pytest.mark.parametrize("text", ["1e400", "9" * 400, "1e309"])
def test_a_timeout_too_large_to_be_a_float_is_refused_as_too_large_never_no_bound(text: str) -> None:
    """``--timeout 1e308`` was refused (at most 1e9 s) but ``--timeout 1e400``, larger, overflowed to inf and meant
    no bound at all: a number is a bound, only the words (none, inf, forever) are none."""
    from nvmlcheck.cli._values import seconds_or_none

    with pytest.raises(argparse.ArgumentTypeError, match="at most"):
        seconds_or_none(text)
    assert seconds_or_none("inf") is None and seconds_or_none("+Infinity") is None
    assert seconds_or_none("none") is None
