"""The nvmlcheck CLI end to end on the simulated GPU: real child processes bound in stub scenarios, exit codes, JSON
documents and the live status line. (A zombie holding memory exits 1: tests/reliability/test_kill.py.)"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def scenario_file(tmp_path: Path, sc: Scenario) -> str:
    return str(sc.write(tmp_path / "scenario.txt"))


def test_kill_exits_0_only_after_the_simulated_reclaim(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], child: subprocess.Popen[bytes]
) -> None:
    sc = Scenario.h200()
    sc.add_process(0, child.pid, used_bytes=16 * GIB, bound=True, list_ms=40, release_ms=150)
    code, out, _ = run(capsys, "--simulate", scenario_file(tmp_path, sc), "--json", "kill", str(child.pid))
    assert code == 0
    doc: dict[str, Any] = json.loads(out)
    assert (doc["schema"], doc["version"], doc["clean"]) == ("nvmlcheck/kill", 2, True)
    (pid,) = doc["pids"]
    assert pid["pid"] == child.pid and pid["exited_ns"] is not None
    # the stub drops the process 40 ms and frees its memory 150 ms after it died: never reported earlier
    assert pid["off_gpu_ns"] >= 40_000_000
    assert doc["clean_ns"] >= 150_000_000
    assert doc["clean_ns"] - pid["exited_ns"] >= 150_000_000 - doc["resolution_ns"]
    assert doc["snapshot"]["devices"][0]["memory"]["used_bytes"] == 0
    assert child.poll() is not None


def test_wait_does_not_return_when_only_the_process_list_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_100_001, used_bytes=8 * GIB)
    sc.at_ms(30).remove_process(0, 4_100_001)
    sc.at_ms(30).set_device(0, used_bytes=8 * GIB)  # the list empties; the memory is still held
    # Freed at 700 ms of the stub's clock, which starts at its init, before the wait's: the 190 ms bound below
    # leaves 510 ms for that head start (opening the session), which a loaded CI machine can stretch well past the
    # 10 ms that freeing at 200 ms left.
    sc.at_ms(700).set_device(0, used_bytes=0)
    code, out, _ = run(capsys, "--simulate", scenario_file(tmp_path, sc), "--json", "wait", "--timeout", "30")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "nvmlcheck/wait" and doc["clean"] is True
    assert doc["clean_ns"] >= 190_000_000  # the stub's clock started a little before the wait did
    # One time base with the kill document: offsets from the start; first_clean_ns kept a version for old readers.
    assert doc["first_clean_ns"] == doc["clean_ns"] <= doc["confirmed_ns"] == doc["elapsed_ns"]


def test_wait_timeout_exits_1_naming_the_holder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 2 s, not 0.2: the timeout must come after a completed poll, also on a loaded machine (the CLI takes no clock).
    code, out, err = run(capsys, "--simulate", "h200-busy", "wait", "--timeout", "2")
    assert code == 1 and out == ""
    assert "pid 4123456" in err and "16.0 GiB" in err and "GPU 0" in err


def test_wait_timeout_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--simulate", "h200-busy", "--json", "wait", "--timeout", "2")  # a poll, even loaded
    assert code == 1
    doc = json.loads(out)
    assert doc["clean"] is False and doc["polls"] >= 1
    assert any("4123456" in c for c in doc["culprits"])


@pytest.mark.parametrize(
    "argv",
    [
        ["wait", "--timeout", "-1"],
        ["wait", "--timeout", "soon"],
        ["wait", "--stable-polls", "0"],
        ["kill", "--signal", "NOPE", "123"],
        ["--simulate", "h200", "--devices", "7", "snapshot"],
        ["--simulate", "no-such-scenario", "snapshot"],
        ["--simulate", "h200", "kill", "1"],
        ["--simulate", "h200", "kill"],
        ["frobnicate"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        code = cli.main(argv)
        raise SystemExit(code)
    assert info.value.code == 2
    assert capsys.readouterr().err.strip()  # it says why


def test_no_backend_exits_3(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(tmp_path / "missing.so"))
    monkeypatch.setenv("PATH", str(tmp_path))
    code, out, _ = run(capsys, "--json", "snapshot")
    assert code == 3
    doc = json.loads(out)
    assert doc["schema"] == "nvmlcheck/error" and doc["error"]["type"] == "BackendUnavailable"
    assert "missing.so" in doc["error"]["message"]


def test_snapshot_views_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--simulate", "h200-busy", "snapshot")
    assert code == 0 and "NVIDIA H200" in out and "16.0 GiB" in out
    code, out, _ = run(capsys, "--simulate", "h200-busy", "snapshot", "procs")
    assert code == 0 and "4123456" in out and "compute" in out
    code, out, _ = run(capsys, "--simulate", "h200x8", "--devices", "2,5", "--json", "snapshot")
    doc = json.loads(out)
    assert [d["index"] for d in doc["devices"]] == [2, 5]
    assert doc["devices"][0]["memory"]["granularity_bytes"] == 1
    assert doc["devices"][0]["unknown"]["health.retired_pages"].startswith("not supported")


def test_status_line_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TERM", raising=False)  # TERM=dumb (a CI's) has no status line
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            raise OSError("no terminal size")

    piped = io.StringIO()
    line = cli.StatusLine(piped, enabled=True)
    line.update("waiting 1.0 s")
    assert piped.getvalue() == "" and not line.enabled
    tty = Tty()
    line = cli.StatusLine(tty, enabled=True)
    line.update("waiting 1.0 s · 16.0 GiB used")
    line.clear()
    assert "\rwaiting 1.0 s" in tty.getvalue() and tty.getvalue().endswith("\r")


def test_a_terminal_that_fails_ends_the_status_line_not_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TERM", raising=False)  # TERM=dumb (a CI's) has no status line
    # A write error (EIO: the terminal went away) in the live status line escaped from on_poll and ended the wait in
    # a traceback, exit 1: the status line is not the verdict.
    class GoneTty(io.StringIO):
        writes = 0

        def isatty(self) -> bool:
            return True

        def fileno(self) -> int:
            raise OSError("no terminal size")

        def write(self, text: str) -> int:
            GoneTty.writes += 1
            raise OSError(5, "Input/output error")

    line = cli.StatusLine(GoneTty(), enabled=True)
    line.update("waiting 1.0 s")
    assert not line.enabled and GoneTty.writes == 1
    line._last = 0.0
    line.update("waiting 2.0 s")
    line.clear()
    assert GoneTty.writes == 1  # nothing more is tried


@pytest.mark.parametrize("backend", ["nvml", "smi"])
def test_simulate_hands_the_stub_to_the_session_explicitly(
    backend: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No hidden channel: the CLI reads no $NVMLCHECK_LIBNVML back; only the stub and children get variables.
    import os

    import nvmlcheck.session as session_module

    monkeypatch.delenv("NVMLCHECK_LIBNVML", raising=False)
    real_open = session_module.open
    seen: list[dict[str, Any]] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(dict(kwargs, env=os.environ.get("NVMLCHECK_LIBNVML"),
                         scenario=os.environ.get("NVMLCHECK_STUB_SCENARIO")))
        return real_open(*args, **kwargs)

    monkeypatch.setattr(session_module, "open", spy)
    code, out, _ = run(capsys, "--simulate", "h200", "--backend", backend, "snapshot")
    assert code == 0 and "NVIDIA H200" in out
    [call] = seen
    assert call["env"] is None and call["scenario"] is not None
    if backend == "nvml":
        assert Path(call["library_path"]).name == "libnvidia-ml.so.1" and call["smi_command"] is None
    else:
        assert call["smi_command"][-1].endswith("fake_nvidia_smi.py")
    assert "NVMLCHECK_STUB_SCENARIO" not in os.environ or os.environ["NVMLCHECK_STUB_SCENARIO"] != call["scenario"]
