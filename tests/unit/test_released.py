"""targets_released (issue 23, item 3): a kill on a shared GPU judges only what its targets held; other tenants are
"not ours". Synthetic snapshots: what the baseline shows the targets held, and the GPU as the kill goes on."""

from __future__ import annotations

import pytest
from snapshots import GIB, dev, proc, snap

import nvmlcheck as nc
from nvmlcheck.model import MIB
from nvmlcheck.released import not_ours, targets_released

ME, OTHER = 4123, 777


def base() -> nc.Snapshot:
    """At the signal: our worker holds 8 GiB on GPU 0, another tenant 2 GiB; GPU 1 holds only the tenant's 1 GiB."""
    return snap(dev(0, procs=[proc(ME, 8 * GIB), proc(OTHER, 2 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))


def test_clean_when_our_memory_is_back_and_the_tenant_still_runs() -> None:
    p = targets_released([ME], base())
    now = snap(dev(0, procs=[proc(OTHER, 2 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))
    assert p.check(now) is True
    assert nc.default_predicate().check(now) is False  # "clean" of the whole GPU never holds on a shared one
    assert not_ours(now, [ME]) == ("GPU 0: pid 777 (python3) holds 2.0 GiB: not ours",
                                   "GPU 1: pid 778 (python3) holds 1.0 GiB: not ours")


def test_not_clean_while_a_target_is_listed_or_its_memory_is_not_back() -> None:
    p = targets_released([ME], base())
    listed = snap(dev(0, procs=[proc(ME, 8 * GIB), proc(OTHER, 2 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))
    v = p.evaluate(listed)
    assert v.satisfied is False and any("pid 4123" in r and "a target" in r for r in v.reasons)
    # Off the list, 5 GiB still held by no process (the context being torn down).
    held = snap(dev(0, used=7 * GIB, procs=[proc(OTHER, 2 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))
    v = p.evaluate(held)
    assert v.satisfied is False and any("3.0 GiB of the 8.0 GiB the targets held is back" in r for r in v.reasons)


def test_a_tenant_that_grows_meanwhile_is_allowed_for_and_an_invisible_one_is_counted_as_held() -> None:
    p = targets_released([ME], base())
    grew = snap(dev(0, procs=[proc(OTHER, 5 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))
    assert p.check(grew) is True
    # A tenant of another PID namespace (memory with no process) at the baseline stays "not ours" afterwards.
    hidden = snap(dev(0, used=10 * GIB, procs=[proc(ME, 8 * GIB)]))
    q = targets_released([ME], hidden)
    after = snap(dev(0, used=2 * GIB, procs=[]))
    assert q.check(after) is True
    assert not_ours(after, [ME]) == ("GPU 0: 2.0 GiB held by no visible process (another PID namespace's tenant): "
                                     "not ours",)


def test_within_the_tolerance_and_the_resolution() -> None:
    p = targets_released([ME], base(), tolerance_bytes=16 * MIB)
    near = snap(dev(0, used=2 * GIB + 10 * MIB, procs=[proc(OTHER, 2 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))
    assert p.check(near) is True
    coarse = snap(dev(0, used=2 * GIB + 16 * MIB, procs=[proc(OTHER, 2 * GIB)], granularity=MIB),
                  dev(1, procs=[proc(OTHER + 1, GIB)]))
    assert p.check(coarse) is None  # a whole-MiB reading at the limit cannot say which side it is on


def test_unknowns_are_none_with_a_reason() -> None:
    unknown_bytes = snap(dev(0, used=8 * GIB, procs=[proc(ME, None)]))
    p = targets_released([ME], unknown_bytes)
    v = p.evaluate(snap(dev(0, used=0)))
    assert v.satisfied is None and any("not available" in r for r in v.reasons)
    q = targets_released([ME], base())
    v = q.evaluate(snap(dev(0, memory=None, procs=[proc(OTHER, 2 * GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)])))
    assert v.satisfied is None
    v = q.evaluate(snap(dev(0, procs=None), dev(1, procs=[proc(OTHER + 1, GIB)])))
    assert v.satisfied is None
    v = q.evaluate(snap(dev(2, uuid="GPU-other")))
    assert v.satisfied is None and any("not in the baseline" in r for r in v.reasons)
    v1 = targets_released([ME], snap(dev(0, procs=[proc(ME, 8 * GIB)], v1=True)))
    assert v1.check(snap(dev(0, v1=True))) is None


def test_pids_may_grow_as_a_tree_is_found() -> None:
    pids = [ME]
    p = targets_released(lambda: pids, base())
    late = snap(dev(0, procs=[proc(OTHER, 2 * GIB), proc(ME + 1, GIB)]), dev(1, procs=[proc(OTHER + 1, GIB)]))
    assert p.check(late) is True  # a stranger's 1 GiB grew the "others"
    pids.append(ME + 1)  # now a found descendant: a target still listed
    assert p.check(late) is False


def test_bad_tolerance() -> None:
    with pytest.raises(ValueError, match="tolerance_bytes"):
        targets_released([ME], base(), tolerance_bytes=-1)


def test_a_tenant_leaving_during_the_kill_does_not_pass_for_the_targets_memory() -> None:
    """Our worker 4 GiB, a tenant 8 GiB. The tenant's job ends while ours is torn down: used falls by 8 GiB, more
    than ours held, while our 4 GiB is still held with no process listed. Not released until it is back."""
    p = targets_released([ME], snap(dev(0, procs=[proc(ME, 4 * GIB), proc(OTHER, 8 * GIB)])))
    v = p.evaluate(snap(dev(0, used=4 * GIB, procs=[])))
    assert v.satisfied is False and any("0 B of the 4.0 GiB the targets held is back" in r for r in v.reasons)
    assert p.check(snap(dev(0, used=8 * GIB + 4 * GIB, procs=[]))) is False  # the tenant off its list, memory not back
    assert p.check(snap(dev(0, used=0, procs=[]))) is True
    assert p.check(snap(dev(0, procs=[proc(OTHER, 8 * GIB)]))) is True  # the tenant still runs


@pytest.mark.parametrize(("pids", "error"), [
    (str(ME), nc.ArgumentTypeError),  # read digit by digit, no target would ever be seen on a list
    (ME, nc.ArgumentTypeError),
    ([True], nc.ArgumentError),
    ([0], nc.ArgumentError),
    (lambda: ["4123"], nc.ArgumentError),
])
def test_targets_that_are_no_pids_are_refused(pids: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        targets_released(pids, base())  # type: ignore[arg-type]
    with pytest.raises(nc.ArgumentTypeError):
        targets_released([ME], base(), tolerance_bytes="16MiB")  # type: ignore[arg-type]


def test_a_tenant_of_unreported_bytes_leaving_does_not_pass_for_the_targets_memory() -> None:
    """Our worker 4 GiB; a tenant whose bytes NVML does not report ('not available') holds 8 GiB. The tenant leaves
    while our 4 GiB is still held with no process listed: used falls by 8 GiB, which no figure of the baseline
    accounts for. Unknown, never released."""
    p = targets_released([ME], snap(dev(0, used=12 * GIB, procs=[proc(ME, 4 * GIB), proc(OTHER, None)])))
    v = p.evaluate(snap(dev(0, used=4 * GIB, procs=[])))
    assert v.satisfied is None
    assert v.reasons == ("GPU 0: pid 777 left its list holding an amount NVML did not report ('not available'); "
                         "cannot tell its memory from the targets'",)
    # While it stays listed, what it holds is part of the baseline's used figure, as before.
    assert p.check(snap(dev(0, used=8 * GIB, procs=[proc(OTHER, None)]))) is True
    assert p.check(snap(dev(0, used=12 * GIB, procs=[proc(OTHER, None)]))) is False


def test_not_ours_calls_no_memory_invisible_that_a_list_could_not_show() -> None:
    # The lists could not be read: whose the 10 GiB is cannot be told, not "held by no visible process".
    unread = snap(dev(0, used=10 * GIB, procs=None, unknown={"processes.compute": "NVML_ERROR_UNKNOWN (999)"}))
    assert not_ours(unread, [ME]) == ("GPU 0: 10.0 GiB used and a process list could not be read: cannot tell whose",)
    # A listed tenant whose bytes are not reported may hold the rest: it is named, no invisible tenant is made up.
    unsized = snap(dev(0, used=10 * GIB, procs=[proc(OTHER, None)]))
    assert not_ours(unsized, [ME]) == ("GPU 0: pid 777 (python3) holds an unknown amount: not ours",)
    # Our own process of unreported bytes: nothing else is named.
    assert not_ours(snap(dev(0, used=10 * GIB, procs=[proc(ME, None)])), [ME]) == ()
