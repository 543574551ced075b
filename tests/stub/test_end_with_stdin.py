"""A command a fleet runs over ssh ends with the fleet: ``$NVMLCHECK_END_WITH_STDIN=1`` and a stdin that began with
the fleet's hello end it as SIGHUP does (exit 129) when that stdin ends; nothing else does (docs/hosts.md).

Real ``python -m nvmlcheck`` processes on simulated GPUs; every assertion is on an exit status or what was read,
and the waits that must not end early have their own short timeout, so nothing depends on how fast the machine is.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from time import monotonic_ns as time_ns

import pytest

from nvmlcheck._proc.child import Child
from nvmlcheck._proc.signals import ENV_END_WITH_STDIN, STDIN_HELLO
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30
#: A hang guard only: each command here ends by itself well within it.
GUARD_S = 120


def _busy(tmp_path: Path) -> str:
    sc = Scenario.h200()
    sc.add_process(0, 4242, "compute", 8 * GIB)  # never clean: a wait runs to its timeout
    return str(sc.write(tmp_path / "busy.txt"))


def _run(argv: list[str], stdin: int, *, end_with_stdin: bool) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != ENV_END_WITH_STDIN}
    if end_with_stdin:
        env[ENV_END_WITH_STDIN] = "1"
    return subprocess.Popen([sys.executable, "-m", "nvmlcheck", *argv], stdin=stdin, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def test_the_end_of_the_fleets_stdin_ends_the_command_as_sighup_does(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    proc = _run(["--simulate", _busy(tmp_path), "wait", "--timeout", "600"], read_end, end_with_stdin=True)
    os.close(read_end)
    os.write(write_end, STDIN_HELLO)
    assert proc.stderr is not None
    assert b"simulated GPUs" in proc.stderr.readline()  # the command runs (its signal handlers are in place)
    os.close(write_end)  # the fleet gave up, died, or the connection was cut
    _out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 129, err  # 128 + SIGHUP, after the command's own cleanup


@pytest.mark.parametrize("stdin", ["devnull", "empty-pipe", "other-words"])
def test_a_stdin_that_is_not_the_fleets_does_not_end_it(tmp_path: Path, stdin: str) -> None:
    # A remote prefix that gives the command a stdin of its own (docker exec without -i, ...): it runs to its end.
    if stdin == "devnull":
        fd = os.open(os.devnull, os.O_RDONLY)
    else:
        fd, write_end = os.pipe()
        if stdin == "other-words":
            os.write(write_end, b"something else entirely, and then the end\n")
        os.close(write_end)
    proc = _run(["--simulate", _busy(tmp_path), "wait", "--timeout", "1"], fd, end_with_stdin=True)
    os.close(fd)
    _out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 1, err  # its own timeout: not ended by the stdin


def test_without_the_variable_the_stdin_is_not_watched(tmp_path: Path) -> None:
    read_end, write_end = os.pipe()
    proc = _run(["--simulate", _busy(tmp_path), "wait", "--timeout", "1"], read_end, end_with_stdin=False)
    os.close(read_end)
    os.write(write_end, STDIN_HELLO)
    os.close(write_end)
    _out, err = proc.communicate(timeout=GUARD_S)
    assert proc.returncode == 1, err


def test_the_variable_is_not_passed_on_to_the_commands_children() -> None:
    code = ("import os, sys; from nvmlcheck._proc.signals import hang_up_at_stdin_eof; "
            "print(hang_up_at_stdin_eof(), os.environ.get(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, ENV_END_WITH_STDIN], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=GUARD_S, check=True,
                          env={**os.environ, ENV_END_WITH_STDIN: "1"})
    assert done.stdout.split() == ["False", "None"]  # /dev/null is not watched, and the variable is gone


def test_a_child_with_a_held_stdin_reads_the_bytes_then_the_end_only_when_released() -> None:
    # The child reads what was written, then reports whether more came before it was ended: the pipe stays open
    # (no end of file) until the Child is reaped, killed or closed.
    code = ("import os, stat, sys; mode = os.fstat(0).st_mode; first = os.read(0, 64); "
            "print(stat.S_ISFIFO(mode), first.decode().strip(), flush=True); os.read(0, 64); print('eof', flush=True)")
    child = Child([sys.executable, "-c", code], hold_stdin=b"hello\n")
    try:
        assert child._stdin_w is not None
        child._release_stdin()  # as reaping, killing or closing the Child does: the child sees its end and exits
        assert child._stdin_w is None
        assert child.wait(time_ns() + GUARD_S * 10**9) and child.returncode == 0
        assert child.stdout.decode().split() == ["True", "hello", "eof"]
    finally:
        child.kill()
    plain = Child([sys.executable, "-c", code.replace("os.read(0, 64); print('eof'", "print('no wait'")])
    assert plain._stdin_w is None
    assert plain.wait(None) and plain.stdout.decode().split() == ["False", "no", "wait"]  # /dev/null: no FIFO


def test_a_signal_while_the_simulation_starts_cleans_it_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # The race behind a rare exit 0 for `ended by SIGHUP`: the fleet's stdin ended (SIGHUP) just as the banner was
    # printed, inside simulation.__enter__, where `with` calls no __exit__: the command then ended as if simulating,
    # skipping its exit status. Made deterministic: the banner's write raises what the SIGHUP handler raises.
    import argparse

    from nvmlcheck.cli import _common
    from nvmlcheck.cli._signals import Terminated

    args = argparse.Namespace(simulate="h200", json=False, hosts=None, hosts_file=None)
    sim = _common.simulation(args)

    class Hangup:
        def write(self, text: str) -> int:
            raise Terminated(1)

        def flush(self) -> None:
            return None

    monkeypatch.setattr(sys, "stderr", Hangup())
    with pytest.raises(Terminated):
        sim.__enter__()
    monkeypatch.undo()
    assert not _common._simulating and args.simulation is None  # cleaned up: the exit status is the command's
