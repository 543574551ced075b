"""The types of the pytest fixtures of :mod:`nvmlcheck.testing.pytest_plugin`, to annotate tests that use them.

The fixtures themselves live in the plugin (pytest loads it in every run, so it imports nothing until a fixture is
used); this module holds what a test's signature names: ``nvml_bound_process: BoundProcessFactory``. The others
are plain types: ``nvml_scenario: Scenario``, ``nvml_stub: StubSession``, ``nvml_scenario_path: Path``,
``nvml_stub_library: Path``, ``fake_nvidia_smi: Path`` (docs/testing.md, "Fixtures").
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Protocol

from ..model import ProcessKind
from .scenario import ProcessKindName

__all__ = ["BoundProcessFactory"]


class BoundProcessFactory(Protocol):
    """The ``nvml_bound_process`` fixture: a function that starts a real child process and lists it on a simulated
    GPU while it lives.

    ``nvml_bound_process(device=0, used_bytes=16 << 30, *, kind="compute", list_ms=90, release_ms=120,
    zombie_holds=False, argv=None)`` starts ``argv`` (default: a Python that sleeps) and adds it to ``nvml_scenario``
    as a bound process of ``kind`` on GPU ``device`` holding ``used_bytes``: after it exits it leaves the process
    list ``list_ms`` later and gives its memory back ``release_ms`` later, as a driver does (``zombie_holds``: an
    unreaped zombie still holds it). Returns the child, which leads a process group of its own: at the end of the test
    what is left of each group (the child, a job it started) is killed and every child is reaped.
    """

    def __call__(
        self,
        device: int = 0,
        used_bytes: int = 16 << 30,
        *,
        kind: ProcessKind | ProcessKindName = "compute",
        list_ms: int = 90,
        release_ms: int = 120,
        zombie_holds: bool = False,
        argv: Sequence[str] | None = None,
    ) -> subprocess.Popen[bytes]: ...
