"""`nvmlcheck kill` as real servers need it (issue 23): --match and --container/--cgroup selectors with the plan and
--dry-run, the signal before NVML with --devices and --tree (a selector's existence checked right after), --missing-ok
and ProcessGone, --only-targets on a shared GPU, true "left alone" reasons, and a remote kill's per-host lines. Real
child processes (each one reaped), the stub libnvidia-ml through $NVMLCHECK_LIBNVML."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck._proc import selectors
from nvmlcheck._proc.targets import Refused
from nvmlcheck.testing import Scenario

from ._support import GIB, Stub

SLEEP = "import sys, time; print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def start(python_child: Callable[..., subprocess.Popen[bytes]]) -> Callable[..., subprocess.Popen[bytes]]:
    def run(*extra: str) -> subprocess.Popen[bytes]:
        return python_child(SLEEP, *extra)

    return run


def token() -> str:
    """A word that only the command lines of this test's children hold."""
    return f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"


def exits(p: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int | None:
    """The child's exit status once it exits (``None``: still running after ``timeout_s``)."""
    try:
        return p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def h200(stub: Stub, *holders: tuple[int, int]) -> None:
    """One H200 with ``(pid, bytes)`` holders bound to real processes."""
    sc = Scenario.h200()
    for pid, size in holders:
        sc.add_process(0, pid, used_bytes=size, bound=True, list_ms=10, release_ms=20)
    stub.write(sc)


# --- --match ------------------------------------------------------------------------------------------------------


def test_match_shows_the_plan_then_kills_every_match(
    stub: Stub, start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    word = token()
    a, b, other = start(word), start(word), start("unrelated")
    h200(stub)
    code, out, err = run(capsys, "kill", "--match", word, "--yes", "--timeout", "20")
    assert code == 0, err
    assert err.index("plan: SIGTERM to 2 processes") < err.index(f"pid {a.pid} (match)")
    assert f"pid {a.pid} (python" in out and f"pid {b.pid} (python" in out and "clean:" in out
    assert exits(a) == exits(b) == -signal.SIGTERM
    assert other.poll() is None


def test_match_dry_run_prints_the_plan_and_signals_nothing(
    start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    word = token()
    a = start(word)
    code, out, _ = run(capsys, "--json", "kill", "--match", word, "--tree", "--dry-run")
    assert code == 0
    doc: dict[str, Any] = json.loads(out)
    assert doc["schema"] == "nvmlcheck/kill-plan" and doc["tree"] is True
    (t,) = doc["targets"]
    assert (t["pid"], t["found_by"], t["discarded"]) == (a.pid, "match", None)
    assert word in " ".join(t["cmdline"])
    assert exits(a, 0.2) is None  # nothing was signalled


@pytest.mark.parametrize(("pattern", "words"), [("(", "not a regular expression"), ("x*", "matches an empty")])
def test_a_bad_pattern_is_a_usage_error_before_anything(capsys: pytest.CaptureFixture[str], pattern: str,
                                                        words: str) -> None:
    code, _, err = run(capsys, "kill", "--match", pattern, "--yes")
    assert code == 2 and words in err and "nothing was signalled" in err


def test_a_match_that_selects_nothing(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    word = token()
    code, _, err = run(capsys, "kill", "--match", word, "--yes")
    assert code == 2 and "selected no process" in err
    h200(stub)
    code, out, err = run(capsys, "kill", "--match", word, "--yes", "--missing-ok", "--timeout", "5")
    assert code == 0 and "selected no process" in err and "nothing to kill" in out
    assert err.count("selected no process") == 1  # selected once, before NVML: not again after it


def test_match_leaves_out_this_process_and_its_ancestors(tmp_path: Path) -> None:
    word = token()
    # A shell (an ancestor whose command line holds the word) runs Python, which asks for every match.
    script = tmp_path / "ask.py"
    script.write_text("import json, sys\nfrom nvmlcheck._proc import selectors\n"
                      "print(json.dumps(selectors.by_match(sys.argv[1])))\n")
    env = os.environ | {"PYTHONPATH": str(Path(nc.__file__).parents[1])}
    out = subprocess.run(["sh", "-c", f'"{sys.executable}" "{script}" "{word}"; : {word}'], capture_output=True,
                         text=True, timeout=60, check=True, env=env)
    chosen, skipped = json.loads(out.stdout)
    assert chosen == []
    assert [why for _, why in skipped] == ["an ancestor of this process (signalling it would end the command that "
                                           "runs this one)"]


# --- --container / --cgroup ------------------------------------------------------------------------------------------




def test_cgroup_kills_every_member_and_nothing_else(
    stub: Stub, start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str],
    cgroup_dir: Path,
) -> None:
    inside = [start(), start()]
    outside = start()
    try:
        for p in inside:
            (cgroup_dir / "cgroup.procs").write_text(str(p.pid))
    except OSError as exc:
        pytest.skip(f"cannot move a process into {cgroup_dir}: {exc}")
    h200(stub, (inside[0].pid, 2 * GIB))
    code, out, err = run(capsys, "--json", "kill", "--cgroup", str(cgroup_dir), "--yes", "--timeout", "20")
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(t["pid"] for t in doc["pids"]) == sorted(p.pid for p in inside)
    assert {t["found_by"] for t in doc["pids"]} == {"container"}
    assert all(exits(p) == -signal.SIGTERM for p in inside)
    assert outside.poll() is None
    # The same cgroup named as /proc/PID/cgroup prints it, by --container: now empty.
    code, _, err = run(capsys, "kill", "--container", "/" + cgroup_dir.name, "--yes")
    assert code == 2 and "selected no process" in err


def test_container_and_cgroup_syntax(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in ((("--container", "python3"), "not a container"), (("--container", "3f2a1b2c"), "at least 12"),
                        (("--cgroup", "lxc/129"), "starts with '/'"), (("--cgroup", "/"), "root cgroup")):
        code, _, err = run(capsys, "kill", *argv, "--yes")
        assert code == 2 and words in err, err


# --- the signal before NVML ------------------------------------------------------------------------------------------


def test_named_targets_are_signalled_before_nvml_even_with_devices_and_tree(
    start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No libnvidia-ml and no nvidia-smi: a kill that opened NVML before its signal would signal nothing.
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(tmp_path / "missing" / "libnvidia-ml.so.1"))
    monkeypatch.setenv("PATH", str(tmp_path))
    word = token()
    a, b = start(word), start()
    code, _, err = run(capsys, "kill", str(b.pid), "--match", word, "--yes", "--devices", "0", "--tree",
                       "--timeout", "10")
    assert code == 3, err
    assert "signalled before the GPUs were read" in err and "every target exited" in err
    assert exits(a) == exits(b) == -signal.SIGTERM


def test_a_device_that_does_not_exist_is_found_right_after_the_signal(
    stub: Stub, start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    p = start()
    h200(stub, (p.pid, GIB))
    code, _, err = run(capsys, "kill", str(p.pid), "--devices", "5", "--timeout", "10")
    assert code == 2 and "no GPU with index 5" in err and f"pid {p.pid}" in err and "not judged" in err
    assert exits(p) == -signal.SIGTERM


# --- --missing-ok, ProcessGone, NotPermitted -----------------------------------------------------------------------


def test_a_pid_that_is_gone(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    gone = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    gone.wait()
    with pytest.raises(nc.ProcessGone) as info:
        nc.prepare_kill([gone.pid])
    assert isinstance(info.value, nc.KillError) and info.value.pid == gone.pid
    code, out, _ = run(capsys, "--json", "kill", str(gone.pid))
    assert code == 2 and json.loads(out)["error"]["type"] == "ProcessGone"
    h200(stub)
    code, out, _ = run(capsys, "--json", "kill", str(gone.pid), "--missing-ok", "--timeout", "5")
    doc = json.loads(out)
    assert code == 0 and doc["missing"] == [gone.pid] and doc["pids"] == [] and doc["clean"] is True
    with nc.prepare_kill([gone.pid], missing_ok=True) as plan:
        assert plan.missing == (gone.pid,) and plan.targets == ()


def test_eperm_is_not_permitted() -> None:
    from nvmlcheck.kill import _public

    exc = _public(Refused(42, "not permitted (EPERM)", "eperm"))
    assert isinstance(exc, nc.NotPermitted) and isinstance(exc, nc.KillError) and exc.pid == 42
    assert type(_public(Refused(1, "init"))) is nc.KillError


# --- --only-targets on a shared GPU --------------------------------------------------------------------------------


def test_only_targets_ends_clean_on_a_shared_gpu_and_names_the_tenant(
    stub: Stub, start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    ours, tenant = start(), start()
    h200(stub, (ours.pid, 8 * GIB), (tenant.pid, 2 * GIB))
    code, out, err = run(capsys, "--json", "kill", str(ours.pid), "--only-targets", "--timeout", "20")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["judged"] == "targets" and [t["pid"] for t in doc["pids"]] == [ours.pid]
    assert any(f"pid {tenant.pid}" in line and "not ours" in line for line in doc["not_ours"])
    assert exits(ours) == -signal.SIGTERM and tenant.poll() is None


def test_without_only_targets_a_shared_gpu_is_never_clean(
    stub: Stub, start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    ours, tenant = start(), start()
    h200(stub, (ours.pid, 8 * GIB), (tenant.pid, 2 * GIB))
    code, out, _ = run(capsys, "--json", "kill", str(ours.pid), "--timeout", "0.5")
    assert code == 1 and json.loads(out)["judged"] == "gpus"
    assert exits(ours) == -signal.SIGTERM


# --- true reasons, remote lines ------------------------------------------------------------------------------------


def test_a_process_on_another_gpus_list_is_left_alone_as_such(
    stub: Stub, start: Callable[..., subprocess.Popen[bytes]], capsys: pytest.CaptureFixture[str],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    devdir = tmp_path / "dev"
    devdir.mkdir()
    (devdir / "nvidia1").write_text("")
    monkeypatch.setenv("NVMLCHECK_DEVICE_FILES", f"{devdir}/nvidia[0-9]*")
    holder = subprocess.Popen([sys.executable, "-S", "-c",
                               "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)",
                               str(devdir / "nvidia1")], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
        sc = Scenario.h200(devices=2)
        sc.add_process(1, holder.pid, used_bytes=GIB, bound=True)
        stub.write(sc)
        code, out, _ = run(capsys, "--json", "kill", "--all-on-gpu", "--devices", "0", "--yes", "--timeout", "5")
        doc = json.loads(out)
        reasons = {e["pid"]: e["reason"] for e in doc["left_alone"]}
        assert code == 0 and reasons[holder.pid] == "on GPU 1's process list, not selected (--devices)"
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_a_remote_kill_lists_each_hosts_pids_and_phases(capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck.cli._hosts import _kill_lines

    doc = {"schema": "nvmlcheck/kill", "clean": True, "clean_ns": 265_000_000, "confirmed_ns": 270_000_000,
           "pids": [{"pid": 4123, "name": "python3", "found_by": "named", "discarded": "it ignores SIGTERM (SIG_IGN)",
                     "signals": [{"signal": "SIGKILL", "sent_ns": 0}], "exited_ns": 105_000_000,
                     "off_gpu_ns": 106_000_000}],
           "left_alone": [{"pid": 9, "name": "nvidia-persistenced", "reason": "a daemon"}], "missing": [77]}
    _kill_lines("gpu1", SimpleNamespace(verdict="clean"), doc)  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "gpu1  pid 4123 (python3, named): SIGKILL +0.0 ms (SIGKILL at once: it ignores SIGTERM (SIG_IGN)), " \
           "exited +105.0 ms, off the GPU process list +106.0 ms" in out
    assert "gpu1  left alone: pid 9 (nvidia-persistenced): a daemon" in out and "pid 77: gone already" in out
    assert "gpu1  clean: every target exited and memory back +265.0 ms" in out and "0 polls" not in out


@given(st.text(alphabet=st.characters(blacklist_characters=".^$*+?{}[]\\|()\x00"), min_size=1, max_size=8),
       st.text(max_size=40))
def test_a_pattern_without_regex_syntax_is_a_substring_search_with_re_s_answers(pattern: str, text: str) -> None:
    import re

    matcher = selectors.check_pattern(pattern)
    assert isinstance(matcher, selectors.Substring)  # re is not imported for it
    assert (matcher.search(text) is not None) == (re.compile(pattern).search(text) is not None)
    assert matcher.search(f"x {pattern} y") is not None


@pytest.mark.parametrize("pattern", ["a.b", "^python", "x$", "a|b", "(?i)sglang", r"\d+", "a{2}", "[ab]"])
def test_a_pattern_with_regex_syntax_is_a_regular_expression(pattern: str) -> None:
    assert not isinstance(selectors.check_pattern(pattern), selectors.Substring)
