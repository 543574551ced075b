"""Explicit simulation: run nvmlcheck against the bundled stub libnvidia-ml (``--simulate``, ``nvmlcheck demo``).

Nothing here is ever chosen automatically: ``backend="auto"`` never falls back to a simulator. Building the stub
needs a C compiler and the ``nvidia-nvml-dev`` package (``pip install 'nvmlcheck[sim]'``).

Named scenarios (:data:`SCENARIOS`): ``h200`` (one idle H200 as measured), ``h200x8`` (eight idle H200s),
``h200-busy`` (one H200 with a process that never lets go of 16 GiB). Any other value is read as a scenario file
path (format: stubs/README.md).

The stand-in for real GPU memory holders in a study on the stub, :class:`StubHolderFactory`, lives in
:mod:`nvmlcheck.study.stub_holder` (re-exported here for one release).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from ._sim.scenario import Scenario
from ._sim.session import StubSession, simulation
from .errors import ArgumentError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .study.stub_holder import CONTEXT_BYTES, StubHolderFactory

__all__ = ["CONTEXT_BYTES", "SCENARIOS", "StubHolderFactory", "scenario_named", "simulated"]

GIB = 1 << 30


def _busy() -> Scenario:
    sc = Scenario.h200()
    sc.add_process(0, 4_123_456, used_bytes=16 * GIB)
    return sc


#: Bundled scenarios by name.
SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "h200": Scenario.h200,
    "h200x8": lambda: Scenario.h200(devices=8),
    "h200-busy": _busy,
}


def scenario_named(name_or_path: str) -> Scenario | Path:
    """A bundled scenario by name, or a scenario file path. ``ValueError`` if it is neither."""
    factory = SCENARIOS.get(name_or_path)
    if factory is not None:
        return factory()
    path = Path(name_or_path)
    if path.is_file():
        return path
    names = ", ".join(sorted(SCENARIOS))
    raise ArgumentError(f"--simulate {name_or_path!r}: not a bundled scenario ({names}) nor a scenario file")


@contextlib.contextmanager
def simulated(scenario: Scenario | Path) -> Iterator[StubSession]:
    """Build the stub (cached) and write the scenario while the block runs. The stub and child processes find the
    scenario through their environment; nvmlcheck is told explicitly: open sessions with
    ``library_path=stub.library_path``."""
    with simulation(scenario) as stub:
        yield stub


def __getattr__(name: str) -> object:
    # Moved to nvmlcheck.study.stub_holder, re-exported for one release; resolved on use, so that --simulate does
    # not load the study package.
    if name in ("CONTEXT_BYTES", "StubHolderFactory"):
        from .study import stub_holder

        return getattr(stub_holder, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
