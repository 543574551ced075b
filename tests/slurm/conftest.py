"""Fixtures for tests/slurm: a real one-node Slurm cluster (tests/slurm/slurmlab.py) whose GPUs are the simulator's.

Skipped, with the reason, where Slurm or munge is not installed (.ci/run installs them), not root, the stub
libnvidia-ml cannot be built, or the daemons do not come up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import slurmlab

#: ``--timeout`` of each wrapper: below the lab's PrologEpilogTimeout (30 s), long enough for a loaded 2-core box,
#: short enough that the case which must time out (a holder nvmlcheck may not kill) costs little.
TIMEOUTS = {"prolog": 4.0, "epilog": 4.0, "health": 4.0}


def lab_for_module(tmp_path_factory: pytest.TempPathFactory, name: str, **start: Any) -> Iterator[slurmlab.Lab]:
    """A Slurm lab for one test module (``start``: :func:`slurmlab.start`'s options), skipped with the reason where
    Slurm, munge or the stub cannot be had; stopped after, with nothing of it left running."""
    reason = slurmlab.unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from nvmlcheck.testing import StubBuildError, build_stub

    try:
        stub_cache = build_stub().parent.parent  # the wrappers' nvmlcheck finds the same build
    except (StubBuildError, FileNotFoundError) as exc:
        pytest.skip(f"the stub libnvidia-ml cannot be built: {exc}")
    directory = tmp_path_factory.mktemp(name)
    directory.chmod(0o755)  # job scripts run as the job's user
    try:
        lab = slurmlab.start(Path(directory), str(stub_cache), **start)
    except (RuntimeError, AssertionError, OSError) as exc:
        pytest.skip(f"the Slurm daemons could not be started here: {exc}"[:3000])
    try:
        yield lab
    finally:
        leaked = lab.stop()
    assert not leaked, f"processes left after the Slurm lab stopped (killed now): {leaked}"


# Per module, not per session: the daemons are this process's children, and no later suite may see them.
@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurmlab.Lab]:
    yield from lab_for_module(tmp_path_factory, "slurmlab", timeouts=TIMEOUTS)


@pytest.fixture
def cluster(slurm: slurmlab.Lab) -> Iterator[slurmlab.Lab]:
    """The lab, idle and undrained, with an empty record file; after the test, the health check off and nothing of
    the test's jobs left running (the suite's leak check would count a lingering step daemon as the test's)."""
    slurm.resume()
    yield slurm
    slurm.health(False)
    left = slurm.settle()
    assert not left, f"processes of the test's jobs still running: {left}"


def pytest_report_header(config: pytest.Config) -> list[str]:
    reason = slurmlab.unavailable_reason()
    return [f"slurm lab: {reason or 'available'}"] if os.environ.get("PYTEST_XDIST_WORKER") is None else []
