"""A new user's probe of the command line: an answer that cannot be delivered (``--help`` into a closed pipe or a
full disk) is said and exits 141, as ``--version`` and every other answer do; errors say the cause in words."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nvmlcheck import cli


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"])
@pytest.mark.parametrize("argv", [["--help"], ["wait", "--help"], ["--version"]])
def test_help_that_cannot_be_written_is_an_output_failure_not_exit_0(redirect: str, argv: list[str]) -> None:
    # argparse dropped the OSError of its write: `nvmlcheck --help >&-` exited 0 having printed nothing, where
    # `--version` exited 141 with "output failed".
    if redirect == ">/dev/full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    out = subprocess.run(["sh", "-c", f'exec "$@" {redirect}', "sh", sys.executable, "-m", "nvmlcheck", *argv],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 141, out.stderr
    assert "output failed" in out.stderr and "Traceback" not in out.stderr


def test_a_usage_error_on_a_closed_stderr_is_still_exit_2() -> None:
    out = subprocess.run(["sh", "-c", 'exec "$@" 2>&-', "sh", sys.executable, "-m", "nvmlcheck", "wait",
                          "--timeout", "x"], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 2


def test_records_that_do_not_exist_are_said_in_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # "cannot read the records of a: [Errno 2] No such file or directory: 'a'": Python's code, the name twice.
    missing = str(tmp_path / "a.jsonl")
    assert cli.main(["study", "compare", missing, missing]) == 2
    err = capsys.readouterr().err
    assert f"cannot read the records of {missing}: No such file or directory" in err and "Errno" not in err
    assert cli.main(["study", "fit", missing]) == 2
    assert "Errno" not in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    (["bogus"], "nvmlcheck: error: unknown command 'bogus': one of snapshot, watch, wait,"),
    (["snapshto"], "unknown command 'snapshto': did you mean snapshot? one of snapshot,"),
    (["study", "reclam"], "nvmlcheck study: error: unknown command 'reclam': did you mean reclaim? one of reclaim, "
                          "compare, fit"),
])
def test_an_unknown_command_is_named_with_the_commands(argv: list[str], said: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # "argument {snapshot,watch,wait,kill,select,ready,holders,demo,simulate,study,slurm}: invalid choice: 'bogus'".
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and "invalid choice" not in err


@pytest.mark.parametrize("value", ["-1", "1e9", "nan", "abc", "0"])
def test_connect_timeout_states_its_own_bound_once(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    # -1 was told "at most 1e+09", and 1e9 then "at most 86400 seconds (a day)".
    assert cli.main(["wait", "--host", "gpu01", "--connect-timeout", value]) == 2
    err = capsys.readouterr().err
    assert f"argument --connect-timeout: must be > 0 seconds and at most 86400 (a day), got '{value}'" in err
