"""prepare_kill and kill_and_wait refuse an argument of the wrong type with an ArgumentTypeError (a TypeError) that
names the keyword and what it takes, before anything is selected, pinned or signalled: a str or a bare int where an
iterable of PIDs goes (a str was read as its characters), a PID where a Holder goes, a match or container that is not
a str, a flag that is not a bool (``tree="no"`` turned the tree on). kill_and_wait checks them before it touches the
session."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.holders import Holder


@pytest.fixture
def pid() -> Iterator[int]:
    """A live child that nothing here may signal."""
    p = subprocess.Popen([sys.executable, "-S", "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                         stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    yield p.pid
    assert p.poll() is None, "a call with a bad argument signalled the child"
    p.kill()
    p.wait()
    p.stdout.close()


def holder(pid: int) -> Holder:
    return Holder(pid=pid, found_by=frozenset({"device-file"}), gpus=(), name="python", state="sleeping", uid=None,
                  user=None, cmdline=None, nspid=None, ancestry=None, device_files=None, is_daemon=False,
                  relation=None, start_ticks=None)


#: (what, the keyword arguments given ``pid``, words the message holds)
BAD: list[tuple[str, Callable[[int], dict[str, Any]], tuple[str, ...]]] = [
    ("pids a str", lambda pid: {"pids": str(pid)}, ("pids is an iterable of ints", "not a str", "give [{pid}]")),
    ("pids a padded str", lambda pid: {"pids": f" {pid}\n"}, ("pids is an iterable of ints", "give [{pid}]")),
    ("pids bytes", lambda pid: {"pids": str(pid).encode()}, ("pids is an iterable of ints", "not a bytes")),
    ("pids a bare int", lambda pid: {"pids": pid}, ("pids is an iterable of ints", "bare int", "give [{pid}]")),
    ("pids a bool", lambda pid: {"pids": True}, ("pids is an iterable of ints", "True (bool)")),
    ("pids None", lambda pid: {"pids": None}, ("pids is an iterable of ints", "None (NoneType)")),
    ("a PID a str", lambda pid: {"pids": [pid, str(pid)]}, ("pids: a PID is an int", "(str)")),
    ("match an int", lambda pid: {"pids": [pid], "match": 123}, ("match is None or a str", "123 (int)")),
    ("match bytes", lambda pid: {"pids": [pid], "match": b"x"}, ("match is None or a str", "(bytes)")),
    ("match compiled", lambda pid: {"pids": [pid], "match": re.compile("")},
     ("match is None or a str", "give its .pattern")),
    ("container an int", lambda pid: {"pids": [pid], "container": 129}, ("container is None or a str", "(int)")),
    ("tree a str", lambda pid: {"pids": [pid], "tree": "no"}, ("tree is True or False", "'no' (str)")),
    ("tree an int", lambda pid: {"pids": [pid], "tree": 1}, ("tree is True or False", "1 (int)")),
    ("missing_ok None", lambda pid: {"pids": [pid], "missing_ok": None}, ("missing_ok is True or False",)),
]
PREPARE_ONLY: list[tuple[str, Callable[[int], dict[str, Any]], tuple[str, ...]]] = [
    ("holders PIDs", lambda pid: {"holders": [pid]},
     ("holders is an iterable of Holder", "an item is a Holder", "PIDs go in pids")),
    ("holders a str", lambda pid: {"holders": "python"}, ("holders is an iterable of Holder", "not a str")),
    ("holders a bare Holder", lambda pid: {"holders": holder(pid)}, ("bare Holder", "give [holder]")),
    ("holders an int", lambda pid: {"holders": 5}, ("holders is an iterable of Holder", "5 (int)")),
]
KILL_AND_WAIT_ONLY: list[tuple[str, Callable[[int], dict[str, Any]], tuple[str, ...]]] = [
    ("only_targets a str", lambda pid: {"pids": [pid], "only_targets": "yes"}, ("only_targets is True or False",)),
]


@pytest.mark.parametrize(("what", "kwargs", "words"), BAD + PREPARE_ONLY, ids=[c[0] for c in BAD + PREPARE_ONLY])
def test_prepare_kill_refuses_the_wrong_type_naming_the_keyword(
    pid: int, what: str, kwargs: Callable[[int], dict[str, Any]], words: tuple[str, ...]
) -> None:
    with pytest.raises(nc.ArgumentTypeError) as info:
        nc.prepare_kill(**kwargs(pid))
    assert isinstance(info.value, TypeError)
    for word in words:
        assert word.format(pid=pid) in str(info.value), f"{what}: {info.value}"


class Untouchable:
    """A session that must not be used: the arguments are checked first."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"kill_and_wait used the session ({name}) before checking its arguments")


@pytest.mark.parametrize(("what", "kwargs", "words"), BAD + KILL_AND_WAIT_ONLY,
                         ids=[c[0] for c in BAD + KILL_AND_WAIT_ONLY])
def test_kill_and_wait_refuses_the_wrong_type_before_using_the_session(
    pid: int, what: str, kwargs: Callable[[int], dict[str, Any]], words: tuple[str, ...]
) -> None:
    given = kwargs(pid)
    with pytest.raises(nc.ArgumentTypeError) as info:
        nc.kill_and_wait(Untouchable(), given.pop("pids"), **given)  # type: ignore[arg-type]
    for word in words:
        assert word.format(pid=pid) in str(info.value), f"{what}: {info.value}"


def test_right_types_still_pin(pid: int) -> None:
    for pids in ([pid], (pid,), {pid}, iter([pid]), range(pid, pid + 1)):
        with nc.prepare_kill(pids, tree=False, missing_ok=False) as plan:
            assert [t.pid for t in plan.targets] == [pid]
