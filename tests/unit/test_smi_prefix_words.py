"""``--smi-prefix`` as typed: a command that does not split (an unclosed quote) or is empty is a usage error naming
the option, and a prefix that fails with status 1 is the prefix's failure, not NVML_ERROR_UNINITIALIZED."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nvmlcheck.backends.smi import SmiBackend, SmiResult, SmiRunner, classify_failure
from nvmlcheck.cli import main
from nvmlcheck.errors import ArgumentError, SmiTransportError, Uninitialized


@pytest.mark.parametrize(("prefix", "words"), [("'x", "does not split into words"), ("", "an empty command"),
                                                ("  ", "an empty command")])
@pytest.mark.parametrize("command", [["snapshot"], ["wait", "--timeout", "0"], ["holders"]])
def test_a_prefix_that_is_no_command_is_a_usage_error(prefix: str, words: str, command: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--json", "--smi-prefix", prefix, *command])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and "--smi-prefix" in doc["error"]["message"] and words in doc["error"]["message"], doc


def _failed(rc: int, stderr: str) -> SmiResult:
    return SmiResult(("sleep", "100", "nvidia-smi", "-L"), ("nvidia-smi", "-L"), rc, "", stderr, 1)


def test_status_1_behind_a_prefix_is_the_prefixs_failure() -> None:
    error = classify_failure(_failed(1, "sleep: unrecognized option '-L'"), prefixed=True)
    assert isinstance(error, SmiTransportError) and "unrecognized option" in str(error)
    # Without a prefix the status is nvidia-smi's own: NVML's code 1.
    assert isinstance(classify_failure(_failed(1, ""), prefixed=False), Uninitialized)


def test_simulate_with_hosts_is_refused_before_the_simulation_starts(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["wait", "--host", "gpu01", "--simulate", "h200"])
    err = capsys.readouterr()[1]
    assert code == 2 and "cannot be combined with --host" in err
    assert "simulated GPUs" not in err  # no banner: nothing was built or started


@pytest.mark.parametrize("keyword", ["prefix", "command"])
def test_a_command_that_does_not_split_is_an_argument_error_from_python_too(keyword: str) -> None:
    given: dict[str, Any] = {keyword: "ssh 'gpu01"}
    for make in (SmiRunner, SmiBackend):
        with pytest.raises(ArgumentError, match="does not split into words"):  # also a ValueError, as shlex's was
            make(**given)
