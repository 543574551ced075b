"""Running out of file descriptors never reads as "the process is gone" (issue 27, item 3): a kill of a tree bigger
than ``ulimit -n`` ends every member, or fails before anything is signalled; a /proc read that fails with EMFILE
raises instead of answering "no such process"."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.stub

ROOT = Path(__file__).resolve().parents[2]
MEMBERS = 120  # more than the descriptor limits below


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in (b"Z", b"X")


@pytest.fixture
def tree() -> Iterator[tuple[int, list[int]]]:
    """A shell with MEMBERS sleeping children, in a session of its own (killed whole afterwards)."""
    launcher = subprocess.Popen(
        ["bash", "-c", f"for i in $(seq {MEMBERS}); do sleep 120 & done; echo ready; wait"],
        stdout=subprocess.PIPE, start_new_session=True,
    )
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == b"ready\n"
        kids: set[int] = set()
        for task in os.listdir(f"/proc/{launcher.pid}/task"):
            kids.update(int(c) for c in Path(f"/proc/{launcher.pid}/task/{task}/children").read_text().split())
        assert len(kids) == MEMBERS
        yield launcher.pid, sorted(kids)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()


def _limited(soft: int, hard: int | None) -> Callable[[], None]:
    def apply() -> None:
        _, current_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, current_hard if hard is None else hard))

    return apply


@pytest.mark.parametrize(("soft", "hard"), [(40, None), (40, 40)], ids=["soft-limit-low", "hard-limit-low"])
def test_a_tree_bigger_than_the_descriptor_limit_is_killed_whole(
    tree: tuple[int, list[int]], soft: int, hard: int | None
) -> None:
    launcher, members = tree
    done = subprocess.run(
        [sys.executable, "-m", "nvmlcheck", "--simulate", "h200", "--json", "kill", "--tree", str(launcher),
         "--grace", "2", "--timeout", "30"],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=_limited(soft, hard),
    )
    survivors = [pid for pid in members if not _dead(pid)]
    if done.returncode == 0:
        doc = json.loads(done.stdout)
        assert doc["clean"] is True
        assert survivors == [], f"clean with {len(survivors)} members still running"
        assert {t["pid"] for t in doc["pids"]} >= set(members)
    else:  # an error before anything was signalled is the other honest answer
        assert "nothing was signalled" in done.stdout + done.stderr, done.stdout + done.stderr
        assert len(survivors) == MEMBERS


_EXHAUSTED = textwrap.dedent("""
    import json, os, resource, subprocess, sys
    from nvmlcheck._proc import procfs
    from nvmlcheck._proc.pin import Pinned
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        try:
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        out = {"lenient": procfs.read_stat(child.pid) is None}
        try:
            procfs.read_stat(child.pid, strict=True)
            out["strict"] = "no error"
        except OSError as exc:
            out["strict"] = f"{type(exc).__name__}: {exc.strerror}"
        try:
            Pinned.open(child.pid)
            out["pin"] = "pinned"
        except ProcessLookupError:
            out["pin"] = "gone"
        except OSError as exc:
            out["pin"] = type(exc).__name__
    finally:
        for fd in held:
            os.close(fd)
        child.kill()
        child.wait()
    print(json.dumps(out))
""")


def test_out_of_descriptors_is_unreadable_not_gone() -> None:
    done = subprocess.run([sys.executable, "-c", _EXHAUSTED], capture_output=True, text=True, timeout=60,
                          check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    out = json.loads(done.stdout)
    assert out["lenient"] is True  # the plain reader still answers None (its callers only describe)
    assert out["strict"].startswith("ProcUnreadable") and "EMFILE" in out["strict"]
    assert out["pin"] == "ProcUnreadable"
