"""``--tree`` skipped a descendant it may not signal (another user's, a setuid helper: EPERM) without a word: no
entry in ``left_alone``, so a descendant that kept a GPU left the kill timing out with no reason given for it. Now it
is listed, with why. EPERM is stood in for (the tests run as root) by the pin's refusal of that one PID."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from nvmlcheck._proc import pin, procfs, targets

PARENT = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-S', '-c', 'import time; "
          "time.sleep(60)']); print(c.pid, flush=True); time.sleep(60)")


@pytest.fixture
def family() -> Iterator[tuple[int, int]]:
    p = subprocess.Popen([sys.executable, "-S", "-c", PARENT], stdout=subprocess.PIPE)
    assert p.stdout is not None
    child = int(p.stdout.readline())
    yield p.pid, child
    for pid in (child, p.pid):
        try:
            import os
            import signal

            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()
    p.stdout.close()


def test_a_descendant_not_ours_to_signal_is_listed_as_left_alone(
        family: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    parent, child = family
    st = procfs.read_stat(child)
    assert st is not None and st.ppid == parent
    real = pin.Pinned.open

    def refusing(pid: int, *, mode: pin.PinMode = "auto", expect_start_ticks: int | None = None) -> pin.Pinned:
        if pid == child:
            raise PermissionError("EPERM")
        return real(pid, mode=mode, expect_start_ticks=expect_start_ticks)

    monkeypatch.setattr(pin.Pinned, "open", refusing)  # a plain function on the class: called as Pinned.open(...)
    found = targets.prepare([parent], tree=True)
    try:
        found.scan_descendants()
        assert [t.pid for t in found.items] == [parent]
        assert found.left_alone == [(child, f"a descendant of pid {parent}: {targets.EPERM}")]
        found.scan_descendants()  # once, however often it is seen
        assert len(found.left_alone) == 1
    finally:
        found.close()
