"""The command line's streams as an adversary leaves them: ``watch --json``'s error document (an interrupt, a bad
``--devices``) kept to one line of its JSON Lines stream, a stdout closed at start (``>&-``), and a stdout whose
encoding cannot write ``µ`` (``PYTHONIOENCODING=ascii``). Each used to end in a traceback, a multi-line document or a
wrong exit status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub


def _nvmlcheck(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], capture_output=True, text=True, timeout=120,
                          check=False, env=env)


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]  # each line a document, as JSON Lines says


def test_watch_json_error_document_is_one_line() -> None:
    out = _nvmlcheck("--simulate", "h200", "--json", "watch", "--devices", "7", "--for", "1")
    assert out.returncode == 2, out.stderr
    docs = _json_lines(out.stdout)
    assert [d["schema"] for d in docs] == ["nvmlcheck/error"] and docs[0]["exit_code"] == 2


def test_watch_json_ended_by_sigterm_stays_json_lines(tmp_path: Path) -> None:
    scenario = Scenario.h200()
    scenario.at_ms(50).raise_event(0, "xid", xid=13)
    path = scenario.write(tmp_path / "scenario.txt")
    proc = subprocess.Popen([sys.executable, "-m", "nvmlcheck", "--simulate", str(path), "--json", "watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the event: the stream is running
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM
    docs = _json_lines(first + rest)
    assert [d["schema"] for d in docs] == ["nvmlcheck/event", "nvmlcheck/error"]
    assert docs[-1]["exit_code"] == 128 + signal.SIGTERM


@pytest.mark.parametrize(("argv", "code"), [
    (["snapshot"], 141),  # the answer is the output: not delivered
    (["--json", "snapshot"], 141),
    (["holders"], 141),
    (["wait", "--timeout", "5"], 0),  # clean whether or not anyone reads it
    (["--json", "wait", "--timeout", "5"], 0),
])
def test_a_closed_stdout_is_an_output_failure_not_a_traceback(argv: list[str], code: int) -> None:
    # `nvmlcheck snapshot >&-`: Python sets sys.stdout to None; the command ended in an AttributeError traceback, exit 1
    # (a clean wait included).
    out = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "nvmlcheck", "--simulate", "h200",
                          *argv], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr and "output failed (stdout is closed)" in out.stderr


def test_an_ascii_stdout_spells_what_it_cannot_write() -> None:
    # "read in 312 µs" on an ASCII stdout raised UnicodeEncodeError, a ValueError: a clean wait exited 2, "usage error";
    # then it printed "312 \\xb5s", which no one reads as microseconds. Now "312 us"; UTF-8 keeps "µs".
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    for argv in (["wait", "--timeout", "5"], ["snapshot"]):
        out = _nvmlcheck("--simulate", "h200", *argv, env=env)
        assert out.returncode == 0, out.stderr
        assert out.stdout.isascii() and " us" in out.stdout and "\\x" not in out.stdout
    out = _nvmlcheck("--simulate", "h200", "snapshot", env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert out.returncode == 0 and " µs" in out.stdout


@pytest.mark.parametrize(("argv", "code"), [
    (["wait", "--timeout", "x"], 2),  # a usage error, decided before any command module loads
    (["kill", "--signal", "NOPE", "1"], 2),
])
def test_a_closed_stdout_with_an_argument_error_is_still_the_usage_error(argv: list[str], code: int) -> None:
    # The streams were made usable only when a command module loaded _output: an argument error before that ended in
    # an AttributeError traceback, exit 1.
    out = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "nvmlcheck", *argv],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr


def test_watch_json_argument_error_is_one_line() -> None:
    # The parser's own error (before cmd_watch set the one-line mode) was an indented document over nine lines.
    out = _nvmlcheck("--json", "watch", "--for", "-1")
    assert out.returncode == 2, out.stderr
    docs = _json_lines(out.stdout)
    assert [d["schema"] for d in docs] == ["nvmlcheck/error"] and docs[0]["exit_code"] == 2


def test_every_environment_variable_a_help_names_is_one_nvmlcheck_reads() -> None:
    # `holders --help` named $NVMLCHECK_DEVICE_FILES, removed releases ago (no variable changes the device-file rule).
    import re

    from nvmlcheck.cli._parser import build_parser

    root = Path(__file__).resolve().parents[2] / "nvmlcheck"
    source = "\n".join(p.read_text(encoding="utf-8") for p in root.rglob("*.py") if p.name != "_parser.py")
    parser = build_parser(json_errors=False, only=None)
    texts = [parser.format_help()]
    for action in parser._subparsers._group_actions if parser._subparsers else ():  # every command's help
        texts += [sub.format_help() for sub in getattr(action, "choices", {}).values()]
    named = set(re.findall(r"NVMLCHECK_[A-Z_]+", "\n".join(texts)))
    unread = sorted(n for n in named if not re.search(rf"[\"']{n}[\"']", source))
    assert not unread, f"help texts name variables nothing reads: {unread}"


def test_watch_on_the_smi_backend_says_there_is_nothing_to_watch() -> None:
    # It said "the smi backend has no events ...: waits poll", a wait's words: watch does not poll, it ends.
    out = _nvmlcheck("--simulate", "h200", "--backend", "smi", "watch", "--for", "0.2")
    assert out.returncode == 3, out.stderr
    assert "nothing to watch" in out.stderr and "--backend nvml" in out.stderr and "waits poll" not in out.stderr


def test_an_unknown_signal_says_what_is_accepted() -> None:
    out = _nvmlcheck("kill", "--signal", "FOO", "123")
    assert out.returncode == 2 and "unknown signal 'FOO'" in out.stderr and "TERM, SIGINT, KILL, 9" in out.stderr


def test_no_gpu_backend_points_to_the_simulator(tmp_path: Path) -> None:
    # No driver and no nvidia-smi: the message said "install the NVIDIA driver" and nothing of --simulate.
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVMLCHECK_") or k == "NVMLCHECK_STUB_CACHE"}
    env["PATH"] = str(tmp_path)  # no nvidia-smi
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    out = _nvmlcheck("snapshot", env=env)
    if out.returncode == 0:
        pytest.skip("this machine has a GPU driver")
    assert out.returncode == 3 and "--simulate h200" in out.stderr, out.stderr
    json_out = _nvmlcheck("--json", "snapshot", env=env)
    assert json.loads(json_out.stdout)["exit_code"] == 3 and "--simulate" not in json_out.stdout


def test_sigterm_while_a_json_answer_is_written_leaves_one_whole_document(
    sigterm_while_writing: Callable[..., tuple[bytes, int, bytes]],
) -> None:
    # json.dump wrote the document in chunks: a SIGTERM while stdout was blocked on a full pipe cut it, and the error
    # path then added an nvmlcheck/error document after the half of it (two documents, neither whole).
    out, code, err = sigterm_while_writing(
        [sys.executable, "-m", "nvmlcheck", "--simulate", "h200x8", "--json", "snapshot"])
    doc = json.loads(out)  # one document, whole
    assert doc["schema"] == "nvmlcheck/snapshot" and len(doc["devices"]) == 8
    assert code == 0, err  # the answer was out: the command ends with its verdict
