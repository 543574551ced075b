"""One error root, the calls that need a session: bad input to a session's methods raises an ``NvmlCheckError`` (and
the built-in kind a caller may expect). The rest of the walk: ``tests/unit/test_error_root.py``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import nvmlcheck as nc
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub

CALLS: list[tuple[str, Callable[[nc.Session], object], type[BaseException]]] = [
    ("resolve(9)", lambda s: s.resolve(9), KeyError),
    ("resolve('GPU-nope')", lambda s: s.resolve("GPU-nope"), ValueError),
    ("resolve('MIG-nope')", lambda s: s.resolve("MIG-nope"), ValueError),
    ("resolve([])", lambda s: s.resolve([]), ValueError),
    ("resolve(1.5)", lambda s: s.resolve(1.5), TypeError),  # type: ignore[arg-type]
    ("snapshot(devices=[9])", lambda s: s.snapshot(devices=[9]), KeyError),
    ("wait_until_clean(timeout=-1)", lambda s: s.wait_until_clean(timeout=-1), ValueError),
    ("wait_until_clean(stable_polls=0)", lambda s: s.wait_until_clean(stable_polls=0), ValueError),
    ("wait_until_clean(devices=[9])", lambda s: s.wait_until_clean(devices=[9]), ValueError),
    ("select_clean(count=0)", lambda s: nc.select_clean(s, 0), ValueError),
    ("select_clean(count=5)", lambda s: nc.select_clean(s, 5), ValueError),
    ("kill_and_wait(grace_s=-1)", lambda s: nc.kill_and_wait(s, [1], grace_s=-1), ValueError),
    ("kill_and_wait(timeout=-1)", lambda s: nc.kill_and_wait(s, [1], timeout=-1), ValueError),
    ("cuda_mapping().resolve('cuda:7')", lambda s: s.cuda_mapping({"CUDA_VISIBLE_DEVICES": "0"}).resolve("cuda:7"),
     ValueError),
]


@pytest.mark.parametrize(("what", "call", "kind"), CALLS, ids=[c[0] for c in CALLS])
def test_bad_input_to_a_session(
    gpus: Callable[[Scenario], nc.Session], what: str, call: Callable[[nc.Session], object], kind: type[BaseException]
) -> None:
    with gpus(Scenario.h200(devices=2)) as session, pytest.raises(nc.NvmlCheckError) as info:
        call(session)
    assert isinstance(info.value, kind), f"{what}: {type(info.value).__name__} is not a {kind.__name__}"


def test_a_closed_session(gpus: Callable[[Scenario], nc.Session]) -> None:
    session = gpus(Scenario.h200())
    session.close()
    with pytest.raises(nc.SessionClosed) as info:
        session.snapshot()
    assert isinstance(info.value, ValueError)
