"""``wait --pids`` takes PIDs a kernel can hand out: one beyond Linux's PID_MAX_LIMIT (a typing error) was watched as
"gone" at once, and the wait answered clean (exit 0) for a process it could never have seen."""

from __future__ import annotations

import pytest

from nvmlcheck import cli
from nvmlcheck._proc import PID_MAX_LIMIT


@pytest.mark.parametrize("word", ["99999999999", str(PID_MAX_LIMIT + 1), "0", "-3"])
def test_wait_refuses_a_pid_no_kernel_hands_out(word: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["wait", "--timeout", "0", "--pids", word]) == 2
    err = capsys.readouterr().err
    assert "--pids" in err and "not a process ID" in err and str(PID_MAX_LIMIT) in err


def test_wait_takes_the_largest_pid() -> None:
    from nvmlcheck.cli._values import watched_pid

    assert watched_pid(str(PID_MAX_LIMIT)) == PID_MAX_LIMIT and watched_pid("1") == 1
