"""Control characters in what processes, GPUs and remote hosts say are escaped in every text output (issue 27,
item 9); JSON documents keep them exact.

A real process names itself ``x ESC[2J NL clean: f`` (argv[0] and comm) and carries an OSC title sequence in its
command line; a simulated GPU is named with a title sequence; a remote document carries both. No output may contain
a raw control character or a line that a name forged.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck._text import printable, printable_lines
from nvmlcheck.testing import Scenario, StubProbe, build_stub

pytestmark = pytest.mark.stub
GIB = 1 << 30
NAME = "x\x1b[2J\nclean: f"  # 14 characters: fits comm (15)
TITLE = "\x1b]0;pwned\x07"
GPU_NAME = "\x1b]0;owned\x07NVIDIA H200\u202e"
SHOWN = "x\\x1b[2J\\x0aclean: f"


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c in "\u202e\u2028")]


def _assert_safe(text: str) -> None:
    assert not _raw_controls(text), repr(text)
    assert not any(line.startswith("clean: f") for line in text.splitlines()), text


def test_printable_escapes_controls_bidi_and_separators_only() -> None:
    assert printable(NAME) == SHOWN
    assert printable("a\tb\x7f\x9b\u202e\u2066\u2028z") == "a\\x09b\\x7f\\x9b\\u202e\\u2066\\u2028z"
    assert printable("python3 train.py --lr 1e-3 µs é 漢字") == "python3 train.py --lr 1e-3 µs é 漢字"
    assert printable_lines("line one\nGPU 0: " + printable(NAME)) == "line one\nGPU 0: " + SHOWN
    assert printable(None) == "None"


@pytest.fixture
def hostile() -> Iterator[subprocess.Popen[bytes]]:
    code = ("import os, sys, time\nopen('/proc/self/comm', 'w').write(os.environ['COMM'])\n"
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()")
    # A short command line (the holders table shows 80 characters of it): the code comes through the environment.
    proc = subprocess.Popen([NAME, "-S", "-c", "import os;exec(os.environ['C'])", TITLE], executable=sys.executable,
                            env={**os.environ, "COMM": NAME, "C": code}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def scenario(tmp_path: Path, hostile: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(tmp_path / "locks"))
    sc = Scenario.h200(devices=2)
    sc.set_device(0, name=GPU_NAME)
    sc.add_process(0, hostile.pid, used_bytes=GIB, bound=True)
    yield str(sc.write(tmp_path / "sc.txt"))
    assert StubProbe(build_stub()).init_refcount() == 0


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_snapshot_views_escape_process_and_gpu_names(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, err = _run(capsys, "--simulate", scenario, "snapshot", "procs")
    _assert_safe(out + err)
    assert SHOWN in out
    _, out, err = _run(capsys, "--simulate", scenario, "snapshot")
    _assert_safe(out + err)
    assert "\\x1b]0;owned\\x07NVIDI" in out  # the table cuts names at 21 characters
    _, out, _ = _run(capsys, "--simulate", scenario, "--json", "snapshot")
    doc = json.loads(out)  # exact in JSON: json.dumps escapes by itself
    assert doc["devices"][0]["name"] == GPU_NAME
    assert doc["devices"][0]["processes"]["compute"][0]["name"] == NAME


def test_holders_and_the_kill_selection_escape_command_lines(scenario: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--simulate", scenario, "holders")
    _assert_safe(out + err)
    assert SHOWN in out and "\\x1b]0;pwned\\x07" in out
    # --all-on-gpu says what it would do before anything is signalled: here it refuses (exit 2), naming the process
    # on the GPU's list that has no NVIDIA device file open; --all-holders (a dry run without --yes) lists it.
    code, out, err = _run(capsys, "--simulate", scenario, "kill", "--all-on-gpu", "--timeout", "0")
    assert code == 2 and "refusing --all-on-gpu" in err
    _assert_safe(out + err)
    assert SHOWN in err
    code, out, err = _run(capsys, "--simulate", scenario, "kill", "--all-holders", "--timeout", "0")
    _assert_safe(out + err)
    assert SHOWN in err


def test_wait_culprits_are_escaped_in_text_and_exact_in_json(scenario: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "--simulate", scenario, "wait", "--timeout", "0")
    assert code == 1
    _assert_safe(out + err)
    assert SHOWN in err
    code, out, _ = _run(capsys, "--simulate", scenario, "--json", "wait", "--timeout", "0")
    assert json.loads(out)["snapshot"]["devices"][0]["processes"]["compute"][0]["name"] == NAME


def test_a_kill_of_the_hostile_process_prints_one_clean_line(
    scenario: str, hostile: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(capsys, "--simulate", scenario, "kill", str(hostile.pid), "--timeout", "30")
    assert code == 0, err
    _assert_safe(out + err)
    assert [line for line in out.splitlines() if line.startswith("clean:")] == [out.splitlines()[-1]]
    assert SHOWN in out


# --- remote documents ----------------------------------------------------------------------------------------------


def _host_output(capsys: pytest.CaptureFixture[str], command: str, results: list[Any]) -> str:
    from nvmlcheck.cli._hosts import _print

    _print(argparse.Namespace(command=command, view=None), results)
    out, err = capsys.readouterr()
    return out + err


def test_a_remote_document_is_escaped_and_a_hostile_one_does_not_break_the_output(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from nvmlcheck.hosts import Host, HostResult, RemoteError

    device = {"index": 0, "name": GPU_NAME, "uuid": "GPU-\x1b[2J", "memory": {"used_bytes": 0, "total_bytes": GIB},
              "processes": {"compute": [{"pid": 7, "name": NAME, "used_bytes": GIB}], "graphics": [], "mps": []}}
    clean = {"schema": "nvmlcheck/wait", "snapshot": {"devices": [device], "failures": []}, "polls": 2,
             "elapsed_ns": 1000}
    dirty = {"schema": "nvmlcheck/wait", "snapshot": {"devices": [device]},
             "culprits": [f"GPU 0: pid 7 ({NAME}) holds 1 GiB"]}
    nonsense = {"schema": "nvmlcheck/wait", "snapshot": {"devices": "all", "failures": [3]}, "polls": "many",
                "elapsed_ns": "soon"}
    failed = RemoteError("gpu04", f"exit 1 without an nvmlcheck document: {TITLE}\nclean: f", 1)
    results = [HostResult(Host("gpu01"), clean, 0), HostResult(Host("gpu02"), dirty, 1),
               HostResult(Host("gpu03"), nonsense, 0), HostResult(Host("gpu04"), None, 1, failed)]
    text = _host_output(capsys, "wait", results)
    _assert_safe(text)
    assert "\\x1b]0;owned\\x07NVIDI" in text and SHOWN in text
    holders = {"schema": "nvmlcheck/holders", "holders": [
        {"pid": 7, "user": "root\x1b[8m", "state": "sleeping", "found_by": ["nvml"], "cmdline": [NAME, TITLE],
         "gpus": [{"index": 0, "used_bytes": GIB}]}, "not a holder"]}
    text = _host_output(capsys, "holders", [HostResult(Host("gpu01"), holders, 0)])
    _assert_safe(text)
    assert SHOWN in text
    snap = {"schema": "nvmlcheck/snapshot", "devices": [device], "failures": [
        {"index": 1, "error": {"message": f"lost {TITLE}"}}]}
    from nvmlcheck.cli._hosts import _print

    _print(argparse.Namespace(command="snapshot", view="procs"), [HostResult(Host("gpu01"), snap, 0)])
    out, _ = capsys.readouterr()
    _assert_safe(out)
    assert SHOWN in out and "lost \\x1b]0;pwned\\x07" in out
