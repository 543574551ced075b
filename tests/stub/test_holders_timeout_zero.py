"""``timeout=0`` of a holders reading is one complete reading, as everywhere in the project (a wait's ``timeout=0``
is one check that always completes: docs/waiting.md). It used to be a deadline that had passed already:
``find_holders(timeout=0)``, ``Session.holders(timeout=0)``, ``select_kill_holders(timeout=0)`` and ``holders
--timeout 0`` were cut at once (``HoldersIncomplete``, exit 3) whatever held the GPUs. A positive timeout still bounds
the reading, and one used up inside ``select_kill_holders`` is never read as 0 (unbounded)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.testing import Scenario, StepClock

pytestmark = pytest.mark.stub
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A process with a stand-in /dev/nvidia0 open, and the stand-in's pattern."""
    d = tmp_path / "dev"
    d.mkdir()
    (d / "nvidia0").write_text("")
    p = subprocess.Popen([sys.executable, "-S", "-c", HOLD, str(d / "nvidia0")], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    yield f"{d}/nvidia[0-9]*", p
    p.kill()
    p.wait()
    p.stdout.close()


@pytest.mark.parametrize("timeout", [0, 0.0, 1e-10])  # 1e-10 s rounds to 0 ns: the same instant, as a wait's
def test_find_holders_with_timeout_0_reads_them_all(holder: tuple[str, subprocess.Popen[bytes]],
                                                    timeout: float) -> None:
    pattern, p = holder
    # Every clock reading is 10 s later: any deadline would cut the reading; timeout=0 has none.
    found = nc.find_holders(None, device_files=pattern, timeout=timeout, clock=StepClock(10.0).clock)
    assert p.pid in {h.pid for h in found}


def test_a_positive_timeout_still_cuts(holder: tuple[str, subprocess.Popen[bytes]]) -> None:
    pattern, _ = holder
    with pytest.raises(nc.HoldersIncomplete):
        nc.find_holders(None, device_files=pattern, timeout=1e-6, clock=StepClock(10.0).clock)


def test_session_holders_and_the_selection_with_timeout_0_are_complete(
        gpus: Callable[[Scenario], nc.Session], holder: tuple[str, subprocess.Popen[bytes]]) -> None:
    pattern, p = holder
    sc = Scenario.h200(devices=2)
    sc.add_process(0, p.pid, used_bytes=1 << 30)
    with gpus(sc) as session:
        found = session.holders(timeout=0, device_files=pattern)
        assert [(h.pid, [g.index for g in h.gpus]) for h in found if h.gpus] == [(p.pid, [0])]
        selection = nc.select_kill_holders(session, [0], all_holders=False, device_files=pattern, timeout=0)
    assert selection.refused is None and [h.pid for h in selection.targets] == [p.pid]


def test_a_selection_whose_timeout_is_used_up_stays_bounded(gpus: Callable[[Scenario], nc.Session]) -> None:
    # What is left of a positive timeout is never handed on as 0 (which now asks for a complete reading).
    sc = Scenario.h200(devices=4)
    sc.fault("nvmlDeviceGetComputeRunningProcesses_v3", delay_ms=300)
    with gpus(sc) as session, pytest.raises(nc.HoldersIncomplete):
        nc.select_kill_holders(session, all_holders=True, timeout=1e-6)


def test_the_holders_command_with_timeout_0_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = Scenario.h200(devices=2)
    sc.add_process(1, 4_000_010, used_bytes=1 << 30)
    path = str(sc.write(tmp_path / "s.txt"))
    code = cli.main(["--simulate", path, "--json", "holders", "--timeout", "0"])
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    doc = json.loads(out)
    assert [(h["pid"], [g["index"] for g in h["gpus"]]) for h in doc["holders"]] == [(4_000_010, [1])]
