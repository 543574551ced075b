"""`nvmlcheck kill`'s plan, its confirmation and `--dry-run` on the simulated GPU: the plan and the prompt go to stderr,
`--json` too (stdout is the document alone, and what is confirmed is seen), a dry run of every form never asks and
never waits for the GPUs, and the plan's grace reads `0 s` for `--grace=-0`. The processes hold a stand-in device file
in dev/ next to the scenario, where `--simulate` looks for its stand-ins."""

from __future__ import annotations

import io
import json
import math
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30

# Holds the device file named by argv[1] (when given), says ready, sleeps; argv[2] marks its command line.
HOLD = ("import sys, time; f = open(sys.argv[1]) if sys.argv[1] != '-' else None; print('ready', flush=True); "
        "time.sleep(60)")


class Terminal(io.StringIO):
    """A terminal on stdin that answers ``text`` to the prompt (``input()`` writes its prompt to ``sys.stdout`` when
    stdin is not the real terminal: what the tester's pty showed)."""

    def isatty(self) -> bool:
        return True


class Untouchable:
    """A terminal on stdin that must never be read: a dry run does not ask."""

    def isatty(self) -> bool:
        return True

    def read(self, size: int = -1) -> str:
        raise AssertionError("the dry run read stdin: it asked")

    readline = read


@pytest.fixture
def start(python_child: Callable[..., subprocess.Popen[bytes]]) -> Callable[..., subprocess.Popen[bytes]]:
    def run(device_file: str = "-", word: str = "") -> subprocess.Popen[bytes]:
        return python_child(HOLD, device_file, word)

    return run


def token() -> str:
    return f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def scenario(tmp_path: Path, *holders: int, foreign: bool = False) -> str:
    """One H200 whose list holds ``holders`` (bound: released when they exit); ``foreign``: also a PID that names
    no process here, so the GPU stays busy whatever is killed."""
    sc = Scenario.h200()
    for pid in holders:
        sc.add_process(0, pid, used_bytes=4 * GIB, bound=True, list_ms=20, release_ms=40)
    if foreign:
        sc.add_process(0, 4_100_001, used_bytes=GIB)
    return str(sc.write(tmp_path / "scenario.txt"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the plan and the prompt: stderr, --json included ----------------------------------------------------------------


def test_json_kill_shows_the_plan_and_asks_on_stderr_and_prints_the_document_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    word = token()
    p = start(device_file, word)
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, err = run(capsys, "--simulate", scenario(tmp_path, p.pid), "--json", "kill", "--match", word,
                         "--timeout", "20")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)  # stdout is one document: no prompt before it
    assert doc["schema"] == "nvmlcheck/kill" and [t["pid"] for t in doc["pids"]] == [p.pid]
    assert "[y/N]" not in out
    # The plan is shown before the question, both on stderr.
    assert err.index("plan: SIGTERM to 1 process") < err.index(f"pid {p.pid} (match)") < err.index(
        "kill this process? [y/N]")
    assert p.wait(timeout=10) < 0


def test_all_holders_asks_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = start(device_file)
    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = run(capsys, "--simulate", scenario(tmp_path, p.pid), "--json", "kill", "--all-holders")
    assert code == 2 and "not confirmed; nothing was signalled" in json.loads(out)["error"]["message"]
    assert "[y/N]" not in out and err.index(f"pid {p.pid}") < err.index("kill this process? [y/N]")
    assert alive(p.pid)


def test_all_holders_with_match_asks_once_for_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    word = token()
    holder, matched = start(device_file), start("-", word)
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))  # one answer: a second question would read end of input
    code, out, err = run(capsys, "--simulate", scenario(tmp_path, holder.pid), "--json", "kill", "--all-holders",
                         "--match", word, "--timeout", "20")
    assert code == 0, err
    assert err.count("[y/N]") == 1 and "kill these 2 processes? [y/N]" in err
    assert sorted(t["pid"] for t in json.loads(out)["pids"]) == sorted([holder.pid, matched.pid])


def test_a_selector_asks_even_for_a_pid_also_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    word = token()
    p = start(device_file, word)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal, no --yes
    code, _, err = run(capsys, "--simulate", scenario(tmp_path, p.pid), "kill", str(p.pid), "--match", word)
    assert code == 2 and "refusing to kill 1 process without --yes" in err and alive(p.pid)


def test_the_prompt_reaches_the_terminal_not_stdout(
    tmp_path: Path, start: Callable[..., subprocess.Popen[bytes]], device_file: str
) -> None:
    """The tester's case: stdin a real terminal, stdout redirected to a file."""
    import pty

    word = token()
    p = start(device_file, word)
    sc = scenario(tmp_path, p.pid)
    master, slave = pty.openpty()
    out_path = tmp_path / "out.json"
    try:
        with out_path.open("wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "nvmlcheck", "--simulate", sc, "--json", "kill", "--match",
                                     word, "--timeout", "20"], stdin=slave, stdout=out, stderr=slave)
            os.close(slave)
            slave = -1
            os.write(master, b"y\n")
            seen = b""
            while b"[y/N]" not in seen or proc.poll() is None:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the command exited and closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            assert proc.wait(timeout=60) == 0, seen.decode(errors="replace")
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert b"kill this process? [y/N]" in seen and b"plan: SIGTERM to 1 process" in seen
    doc = json.loads(out_path.read_text())  # the file holds the document alone
    assert doc["schema"] == "nvmlcheck/kill" and [t["pid"] for t in doc["pids"]] == [p.pid]


# --- --dry-run: never asks, never waits ------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["all-on-gpu", "all-holders", "match", "all-holders+match", "pid", "pid+match"])
@pytest.mark.parametrize("stdin", ["no terminal", "terminal"])
@pytest.mark.parametrize("json_out", [False, True])
def test_a_dry_run_of_every_form_prints_the_plan_and_never_asks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, monkeypatch: pytest.MonkeyPatch, *, form: str, stdin: str, json_out: bool,
) -> None:
    word = token()
    holder = start(device_file, word)
    monkeypatch.setattr(sys, "stdin", Untouchable() if stdin == "terminal" else io.StringIO(""))
    selectors = {"all-on-gpu": ["--all-on-gpu", "--devices", "0"], "all-holders": ["--all-holders"],
                 "match": ["--match", word], "all-holders+match": ["--all-holders", "--match", word],
                 "pid": [str(holder.pid)], "pid+match": [str(holder.pid), "--match", word]}[form]
    code, out, err = run(capsys, "--simulate", scenario(tmp_path, holder.pid), *(["--json"] if json_out else []),
                         "kill", *selectors, "--dry-run")
    assert code == 0, err
    assert "--yes" not in err and "[y/N]" not in err + out
    if json_out:
        doc = json.loads(out)
        assert doc["schema"] == "nvmlcheck/kill-plan" and [t["pid"] for t in doc["targets"]] == [holder.pid]
    else:
        assert "dry run: nothing was signalled" in out and "plan: SIGTERM to 1 process" in err
    assert alive(holder.pid)


@pytest.mark.parametrize(("selector", "busy"), [(["--all-holders"], True), (["--all-on-gpu"], False),
                                               (["--match", "WORD", "--missing-ok"], True)])
def test_a_dry_run_with_nothing_to_signal_prints_the_empty_plan_and_does_not_wait(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], selector: list[str], busy: bool
) -> None:
    # A busy GPU (a PID of no process here) would make a wait time out (exit 1); a wait on an idle one would print
    # an nvmlcheck/kill document. (--all-on-gpu refuses a GPU listing a PID of no process here: it stays idle.)
    sc = scenario(tmp_path, foreign=busy)
    argv = [token() if a == "WORD" else a for a in selector]
    code, out, err = run(capsys, "--simulate", sc, "--json", "kill", *argv, "--dry-run", "--timeout", "0")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["schema"], doc["targets"], doc["missing"]) == ("nvmlcheck/kill-plan", [], [])
    if selector == ["--all-holders"]:  # the holder --all-holders left alone is in the plan, with why
        assert [e["pid"] for e in doc["left_alone"]] == [4_100_001]
    code, out, err = run(capsys, "--simulate", sc, "kill", *argv, "--dry-run", "--timeout", "0")
    assert code == 0 and "dry run: nothing was signalled" in out and "plan: nothing to signal" in err


# --- the grace as the plan says it -----------------------------------------------------------------------------------


def test_grace_minus_zero_reads_0_s(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    word = token()
    p = start(device_file, word)
    sc = scenario(tmp_path, p.pid)
    code, out, err = run(capsys, "--simulate", sc, "kill", "--match", word, "--dry-run", "--grace=-0")
    assert code == 0, err
    assert "(SIGKILL after 0 s to what is left)" in err and "-0" not in err
    code, out, err = run(capsys, "--simulate", sc, "--json", "kill", "--match", word, "--dry-run", "--grace=-0")
    grace = json.loads(out)["grace_s"]
    assert code == 0 and grace == 0 and math.copysign(1.0, grace) == 1.0 and '"grace_s": -0' not in out
    assert alive(p.pid)


def test_a_grace_longer_than_the_timeout_is_no_sigkill_in_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str,
) -> None:
    # The kill ends at its timeout: a plan promising "SIGKILL after 5 s" would name a signal never sent.
    word = token()
    p = start(device_file, word)
    sc = scenario(tmp_path, p.pid)
    code, _, err = run(capsys, "--simulate", sc, "kill", "--match", word, "--dry-run", "--timeout", "2")
    assert code == 0, err
    assert "(no SIGKILL: --timeout 2 s ends the kill before --grace 5 s)" in err and "SIGKILL after" not in err
    code, _, err = run(capsys, "--simulate", sc, "kill", "--match", word, "--dry-run", "--timeout", "5")
    assert code == 0 and "(SIGKILL after 5 s to what is left)" in err
    # SIGKILL first has nothing to escalate to: the plan promised a second SIGKILL after the grace period.
    code, _, err = run(capsys, "--simulate", sc, "kill", "--match", word, "--dry-run", "--signal", "KILL")
    assert code == 0 and "plan: SIGKILL to 1 process (no grace period: SIGKILL cannot be caught)" in err, err
    assert alive(p.pid)
