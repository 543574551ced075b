"""Predicates: what counts as clean, the three-valued logic, and the reason texts a person reads at 3 a.m."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from snapshots import GIB, H200_RESERVED, busy, dev, failure, idle, mem, proc, snap

from nvmlcheck.errors import ArgumentTypeError, GpuLost, Unknown
from nvmlcheck.model import MIB, DeviceState, ProcessKind, Snapshot
from nvmlcheck.predicates import (
    ALL_KINDS,
    Predicate,
    Verdict,
    _DevicePredicate,
    _Scope,
    _Why,
    always,
    default_predicate,
    format_bytes,
    memory_back_to,
    memory_used_at_most,
    never,
    no_processes,
    on_devices,
    pids_gone,
)

NO_GFX = {"processes.graphics": "NVML_ERROR_NOT_SUPPORTED (3) from nvmlDeviceGetGraphicsRunningProcesses_v3"}


# --- the default predicate --------------------------------------------------------------------------------------


def test_default_is_clean_on_idle_gpus() -> None:
    v = default_predicate().evaluate(idle(0, 1, 2))
    assert v == Verdict(True, ())
    assert v.clean and bool(v) and not v.unknown


def test_default_names_the_holder_with_pid_name_bytes_kind_and_device() -> None:
    v = default_predicate().evaluate(busy(pid=1234, used=16 * GIB, index=0))
    assert not v.clean and v.satisfied is False
    assert v.reasons == (
        "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)",
        "GPU 0: 16.0 GiB used, above the 16.0 MiB limit",
    )


def test_empty_process_list_with_memory_still_held_is_not_clean() -> None:
    # FACTS: the list emptied 28 ms before used returned to idle on an H200.
    s = snap(dev(0), dev(1, used=3 * GIB // 2))
    v = default_predicate().evaluate(s)
    assert v.satisfied is False
    assert v.reasons == (
        "GPU 1: 1.5 GiB used with no visible process (PID namespace or a process that already exited); "
        "clean means at most 16.0 MiB",
    )
    assert no_processes().check(s) is True  # the list alone would have lied


def test_default_allows_a_little_memory_but_not_more() -> None:
    assert default_predicate().check(snap(dev(0, used=16 * MIB))) is True
    v = default_predicate().evaluate(snap(dev(0, used=16 * MIB + 1)))
    assert v.satisfied is False
    # 16 MiB + 1 B must not read "16.0 MiB used, above the 16.0 MiB limit"
    assert v.reasons[0].startswith("GPU 0: 16,777,217 B used with no visible process")
    assert "at most 16,777,216 B" in v.reasons[0]


def test_default_with_devices_only_judges_those() -> None:
    s = snap(dev(0), busy(index=1).devices[0])
    assert default_predicate(devices=[0]).check(s) is True
    assert default_predicate(devices=[1]).check(s) is False
    assert default_predicate().check(s) is False


def test_default_with_baseline_judges_v1_drivers() -> None:
    base = snap(dev(0, v1=True))
    now_idle = snap(dev(0, v1=True))
    assert default_predicate().check(now_idle) is None  # cannot judge without a baseline
    assert default_predicate(baseline=base).check(now_idle) is True
    assert default_predicate(baseline=base).check(snap(dev(0, v1=True, used=GIB))) is False


def test_reasons_are_grouped_by_gpu() -> None:
    s = snap(
        dev(0, procs=[proc(11, GIB)]),
        dev(1, procs=[proc(22, 2 * GIB, name=None)], graphics=[proc(33, None, name="Xorg")]),
    )
    assert default_predicate().evaluate(s).reasons == (
        "GPU 0: pid 11 (python3) holds 1.0 GiB (compute)",
        "GPU 0: 1.0 GiB used, above the 16.0 MiB limit",
        "GPU 1: pid 22 (name unknown) holds 2.0 GiB (compute)",
        "GPU 1: pid 33 (Xorg) holds an unknown amount (NVML: not available) (graphics)",
        "GPU 1: 2.0 GiB used, above the 16.0 MiB limit",
    )


# --- unknown is never clean -------------------------------------------------------------------------------------


def test_unknown_process_list_is_not_clean_and_says_why() -> None:
    s = snap(dev(0, graphics=None, unknown=NO_GFX))
    v = no_processes().evaluate(s)
    assert v.satisfied is None and v.unknown and not v.clean
    assert v.reasons == (
        "GPU 0: graphics process list unknown "
        "(NVML_ERROR_NOT_SUPPORTED (3) from nvmlDeviceGetGraphicsRunningProcesses_v3)",
    )
    assert default_predicate().check(s) is None


def test_unknown_list_of_a_kind_not_asked_for_does_not_matter() -> None:
    s = snap(dev(0, graphics=None, unknown=NO_GFX))
    assert no_processes(kinds=[ProcessKind.COMPUTE, "mps"]).check(s) is True
    assert no_processes(kinds="graphics").check(s) is None


def test_unknown_memory_is_not_clean() -> None:
    s = snap(dev(0, memory=None, unknown={"memory": "NVML_ERROR_UNKNOWN (999)"}))
    v = memory_used_at_most(GIB).evaluate(s)
    assert v.satisfied is None
    assert v.reasons == ("GPU 0: memory use unknown (NVML_ERROR_UNKNOWN (999))",)


def test_unknown_without_a_recorded_reason_still_explains() -> None:
    v = default_predicate().evaluate(snap(dev(0, memory=None, procs=None)))
    assert v.satisfied is None
    assert "GPU 0: compute process list unknown (no reason recorded; was Fields.PROCESSES read?)" in v.reasons
    assert "GPU 0: memory use unknown (no reason recorded; was Fields.MEMORY read?)" in v.reasons


def test_process_with_unknown_bytes_still_counts_as_a_holder() -> None:
    s = snap(dev(0, used=0, procs=[proc(77, None)]))
    assert no_processes().check(s) is False


def test_device_failure_is_never_clean_and_named() -> None:
    lost = GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1)
    s = snap(dev(0), failures=[failure(1, lost, uuid="GPU-dead")])
    for p in (default_predicate(), no_processes(), memory_used_at_most(GIB), pids_gone([5])):
        v = p.evaluate(s)
        assert v.satisfied is None, p
        assert v.reasons == (f"GPU 1 (GPU-dead): could not be read: {lost}",)


def test_failure_does_not_hide_a_known_culprit() -> None:
    s = snap(busy(index=0).devices[0], failures=[failure(1, Unknown(999, "nvmlDeviceGetMemoryInfo_v2", 1))])
    v = default_predicate().evaluate(s)
    assert v.satisfied is False  # GPU 0 decides it
    assert v.reasons[0] == "GPU 0: pid 1234 (python3) holds 16.0 GiB (compute)"
    assert v.reasons[-1].startswith("GPU 1: could not be read: nvmlDeviceGetMemoryInfo_v2 for GPU 1 failed")


def test_empty_snapshot_is_not_clean() -> None:
    v = default_predicate().evaluate(snap())
    assert v.satisfied is None
    assert v.reasons == ("no GPU in the snapshot: nothing to judge, so not clean",)


# --- memory: v1 drivers, nvidia-smi granularity, baselines ------------------------------------------------------


def test_v1_driver_cannot_judge_a_fixed_limit() -> None:
    s = snap(dev(0, v1=True))  # idle, but used reads ~615 MiB
    v = memory_used_at_most(GIB).evaluate(s)  # even a generous limit must not guess
    assert v.satisfied is None
    (reason,) = v.reasons
    assert reason.startswith("GPU 0: cannot judge 615.1 MiB used: this driver only offers nvmlDeviceGetMemoryInfo (v1)")
    assert "memory_back_to(baseline)" in reason
    assert (~memory_used_at_most(GIB)).check(s) is None


def test_memory_back_to_works_on_v1_drivers() -> None:
    base = snap(dev(0, v1=True), dev(1, v1=True))
    p = memory_back_to(base, tolerance_bytes=8 * MIB)
    assert p.check(snap(dev(0, v1=True, used=8 * MIB), dev(1, v1=True))) is True
    v = p.evaluate(snap(dev(0, v1=True, used=2 * GIB), dev(1, v1=True)))
    assert v.satisfied is False
    assert v.reasons == (
        "GPU 0: 2.6 GiB used, 2.0 GiB above the baseline 615.1 MiB + 8.0 MiB tolerance "
        "with no visible process (PID namespace or a process that already exited)",
    )


def test_memory_back_to_matches_devices_by_uuid_and_refuses_strangers() -> None:
    base = snap(dev(0, uuid="GPU-a"))
    s = snap(dev(0, uuid="GPU-b"))
    v = memory_back_to(base).evaluate(s)
    assert v.satisfied is None
    assert v.reasons == ("GPU 0 (GPU-b): not in the baseline snapshot; cannot compare",)


def test_memory_back_to_refuses_mixed_semantics_and_unknown_baseline() -> None:
    assert memory_back_to(snap(dev(0))).check(snap(dev(0, v1=True))) is None
    base = snap(dev(0, memory=None, unknown={"memory": "NVML_ERROR_TIMEOUT (10)"}))
    v = memory_back_to(base).evaluate(idle(0))
    assert v.satisfied is None
    assert v.reasons == ("GPU 0: the baseline has no memory reading (NVML_ERROR_TIMEOUT (10)); cannot compare",)
    v2 = memory_back_to(snap(dev(0))).evaluate(snap(dev(0, v1=True)))
    assert "measure 'used' differently" in v2.reasons[0]


def test_memory_back_to_respects_both_granularities() -> None:
    base = snap(dev(0, granularity=MIB, used=616 * MIB))
    p = memory_back_to(base, tolerance_bytes=0)
    # Same whole-MiB reading, zero tolerance: the true values may differ by almost 2 MiB either way.
    assert p.check(snap(dev(0, granularity=MIB, used=616 * MIB))) is None
    assert p.check(snap(dev(0, granularity=MIB, used=614 * MIB))) is True
    assert p.check(snap(dev(0, granularity=MIB, used=618 * MIB))) is False
    assert memory_back_to(base, tolerance_bytes=2 * MIB).check(snap(dev(0, granularity=MIB, used=616 * MIB)))


@pytest.mark.parametrize(
    ("used_mib", "expected"),
    [(0, True), (14, True), (15, True), (16, None), (17, False), (1000, False)],
)
def test_smi_mib_granularity_never_guesses(used_mib: int, expected: bool | None) -> None:
    # nvidia-smi prints whole MiB: "16 MiB" may be 16 MiB + 1023 KiB, or (rounded) a little less than 16 MiB.
    s = snap(dev(0, used=used_mib * MIB, granularity=MIB), backend="smi")
    assert memory_used_at_most(16 * MIB).check(s) is expected


def test_smi_granularity_reason() -> None:
    s = snap(dev(0, used=16 * MIB, granularity=MIB), backend="smi")
    (reason,) = memory_used_at_most(16 * MIB).evaluate(s).reasons
    assert reason == (
        "GPU 0: 16.0 MiB used is within the 1.0 MiB reporting resolution of the 16.0 MiB limit; "
        "cannot tell which side it is on"
    )


def test_nvml_granularity_is_exact() -> None:
    assert memory_used_at_most(16 * MIB).check(snap(dev(0, used=16 * MIB))) is True
    assert memory_used_at_most(16 * MIB).check(snap(dev(0, used=16 * MIB + 1))) is False
    assert memory_used_at_most(0).check(idle()) is True


def test_memory_reason_when_processes_are_listed_does_not_claim_invisibility() -> None:
    (_, reason) = default_predicate().evaluate(busy(used=GIB)).reasons
    assert reason == "GPU 0: 1.0 GiB used, above the 16.0 MiB limit"


# --- pids_gone --------------------------------------------------------------------------------------------------


def test_pids_gone() -> None:
    s = snap(dev(0, procs=[proc(10, GIB)], graphics=[proc(10, GIB)]), dev(1, mps=[proc(20, GIB, name="mps-server")]))
    assert pids_gone([30]).check(s) is True
    assert pids_gone([]).check(s) is True
    v = pids_gone([10, 20]).evaluate(s)
    assert v.satisfied is False
    assert v.reasons == (
        "GPU 0: pid 10 (python3) holds 1.0 GiB (compute), still listed",
        "GPU 0: pid 10 (python3) holds 1.0 GiB (graphics), still listed",
        "GPU 1: pid 20 (mps-server) holds 1.0 GiB (mps), still listed",
    )


def test_pids_gone_is_unknown_when_a_list_is_unreadable() -> None:
    s = snap(dev(0, mps=None, unknown={"processes.mps": "NVML_ERROR_NO_PERMISSION (4)"}))
    v = pids_gone([10]).evaluate(s)
    assert v.satisfied is None
    assert v.reasons == ("GPU 0: mps process list unknown (NVML_ERROR_NO_PERMISSION (4))",)


@pytest.mark.parametrize("bad", [0, -1, True, "12", 1.5])
def test_pids_gone_rejects_bad_pids(bad: object) -> None:
    with pytest.raises(ValueError, match=r"not a process ID: .*a process ID is a positive whole number"):
        pids_gone([bad])  # type: ignore[list-item]


@pytest.mark.parametrize("beyond", [4_194_305, 2**32 + 10, 10**400])
def test_pids_gone_rejects_a_pid_no_process_list_can_hold(beyond: int) -> None:
    # Accepted before: no list ever holds it, so the predicate held at once (a wait for it ended "gone").
    with pytest.raises(ValueError, match=r"not a process ID: .*a process ID is at most 4194304"):
        pids_gone([10, beyond])


# --- device selection -------------------------------------------------------------------------------------------


def test_on_devices_by_index_and_uuid() -> None:
    s = snap(dev(0), busy(index=1).devices[0], dev(2, uuid="GPU-two"))
    assert on_devices([0, "GPU-two"], default_predicate()).check(s) is True
    assert on_devices([1], no_processes()).check(s) is False


def test_on_devices_missing_device_is_unknown() -> None:
    v = on_devices([0, 5, "GPU-nope"], default_predicate()).evaluate(idle(0))
    assert v.satisfied is None
    assert v.reasons == ("GPU 5: selected but not in the snapshot", "GPU 'GPU-nope': selected but not in the snapshot")


def test_on_devices_keeps_failures_of_selected_devices_only() -> None:
    s = snap(dev(0), failures=[failure(3, GpuLost(15, "nvmlDeviceGetHandleByIndex_v2", 3))])
    assert on_devices([0], default_predicate()).check(s) is True
    assert on_devices([0, 3], default_predicate()).check(s) is None


def test_nested_on_devices_narrows() -> None:
    s = idle(0, 1)
    assert on_devices([0, 1], on_devices([1], no_processes())).check(s) is True
    assert on_devices([0], on_devices([1], no_processes())).check(s) is None


@pytest.mark.parametrize("bad", [[], [-1], [True], [1.0]])
def test_on_devices_rejects_bad_selectors(bad: list[object]) -> None:
    with pytest.raises(ValueError):
        on_devices(bad, always())  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, "01", "GPU-0000", b"0"])
def test_on_devices_rejects_a_selection_that_is_no_list(bad: object) -> None:
    """A str is not read character by character (each a "UUID" no GPU has: a wait that could never end clean), an
    int is not an iterable: both refused at once, with the error the library raises for a wrong type."""
    with pytest.raises(ArgumentTypeError, match=r"on_devices\(\) takes a list"):
        on_devices(bad, always())  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"on_devices\(\) takes a list"):
        default_predicate(devices=bad)  # type: ignore[arg-type]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        memory_used_at_most(-1)
    with pytest.raises(TypeError):
        memory_used_at_most(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        memory_back_to(idle(), tolerance_bytes=-1)
    with pytest.raises(ValueError):
        no_processes(kinds=[])
    with pytest.raises(ValueError):
        no_processes(kinds=["opengl"])


# --- logic ------------------------------------------------------------------------------------------------------


def test_not_of_unknown_stays_unknown_with_only_the_unknown_reasons() -> None:
    s = snap(dev(0, graphics=None, unknown=NO_GFX))
    for p in (no_processes(), ~no_processes()):
        v = p.evaluate(s)
        assert v.satisfied is None and not v.clean
        assert v.reasons == (
            "GPU 0: graphics process list unknown "
            "(NVML_ERROR_NOT_SUPPORTED (3) from nvmlDeviceGetGraphicsRunningProcesses_v3)",
        )
    # (a | b) unknown with a False: ~ must not report a's "false" reasons, which are good news for ~(a | b)
    q = ~(memory_used_at_most(0) | no_processes())
    v = q.evaluate(snap(dev(0, used=GIB, graphics=None, unknown=NO_GFX)))
    assert v.satisfied is None
    assert all("unknown" in r for r in v.reasons), v.reasons


def test_not_of_known_values() -> None:
    assert (~no_processes()).check(busy()) is True
    v = (~no_processes()).evaluate(idle())
    assert v.satisfied is False
    assert v.reasons == (
        "no compute, graphics or MPS process: this holds, and the predicate asks for the opposite (~)",
    )


def test_not_decided_despite_unknown_when_the_unknown_part_does_not_matter() -> None:
    s = snap(busy(index=1).devices[0], failures=[failure(0, Unknown(999, "x", 0))])
    assert no_processes().check(s) is False
    assert (~no_processes()).check(s) is True


def test_double_negation_is_the_predicate_itself() -> None:
    p = no_processes()
    assert ~~p is p


TRUTHS: list[bool | None] = [True, False, None]


class _Fixed(Predicate):
    """A predicate with a fixed answer, to test the connectives exhaustively."""

    def __init__(self, value: bool | None) -> None:
        self.value = value

    def _check(self, scope: object) -> bool | None:
        return self.value

    def _explain(self, scope: object) -> list[_Why]:
        return [_Why(self.value, None, f"fixed {self.value}")]

    def describe(self) -> str:
        return f"fixed {self.value}"


def _kleene_and(a: bool | None, b: bool | None) -> bool | None:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def _kleene_or(a: bool | None, b: bool | None) -> bool | None:
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


@pytest.mark.parametrize("a", TRUTHS)
@pytest.mark.parametrize("b", TRUTHS)
def test_connectives_are_kleene(a: bool | None, b: bool | None) -> None:
    s = idle()
    pa, pb = _Fixed(a), _Fixed(b)
    assert (pa & pb).check(s) is _kleene_and(a, b)
    assert (pa | pb).check(s) is _kleene_or(a, b)
    assert (~pa).check(s) is (None if a is None else not a)
    # De Morgan holds in Kleene logic
    assert (~(pa & pb)).check(s) is (~pa | ~pb).check(s)
    v = (pa & pb).evaluate(s)
    assert (v.reasons == ()) is (v.satisfied is True)


def test_always_and_never() -> None:
    s = busy()
    assert always().check(s) is True
    assert never().evaluate(s) == Verdict(False, ("never() is never satisfied",))
    assert (always() & no_processes()).check(s) is False
    assert (never() | no_processes()).check(idle()) is True


def test_and_deduplicates_shared_reasons() -> None:
    lost = GpuLost(15, "f", 0)
    v = (no_processes() & memory_used_at_most(0) & pids_gone([1])).evaluate(snap(failures=[failure(0, lost)]))
    assert v.reasons == (f"GPU 0: could not be read: {lost}",)


def test_predicates_have_no_truth_value() -> None:
    with pytest.raises(TypeError, match="combine predicates with &"):
        bool(no_processes())
    with pytest.raises(TypeError):
        _ = no_processes() and memory_used_at_most(0)


def test_combining_with_a_non_predicate_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _ = no_processes() & True  # type: ignore[operator]


def test_call_is_evaluate() -> None:
    assert default_predicate()(busy()) == default_predicate().evaluate(busy())


# --- descriptions -----------------------------------------------------------------------------------------------


def test_describe_and_repr() -> None:
    p = on_devices([0, 1], no_processes() & (memory_used_at_most(16 * MIB) | ~pids_gone([42, 7])))
    assert p.describe() == (
        "on GPU 0, 1: no compute, graphics or MPS process and "
        "(used memory at most 16.0 MiB or not (pids 7, 42 gone from every GPU process list))"
    )
    assert repr(p) == "on_devices([0, 1], no_processes() & (memory_used_at_most(16777216) | ~pids_gone([7, 42])))"
    assert str(no_processes(kinds=["compute"])) == "no compute process"
    assert repr(no_processes(kinds=["mps", "compute"])) == "no_processes(kinds=('mps', 'compute'))"
    assert repr(always() | never()) == "always() | never()"
    assert repr(~(always() & never())) == "~(always() & never())"
    assert memory_back_to(idle(0, 1), 0).describe() == "used memory back to the baseline (+ 0 B)"
    assert "baseline of 2 GPUs" in repr(memory_back_to(idle(0, 1)))


def test_and_or_flatten() -> None:
    p = no_processes() & memory_used_at_most(0) & pids_gone([1])
    assert repr(p) == "no_processes() & memory_used_at_most(0) & pids_gone([1])"
    assert ALL_KINDS == (ProcessKind.COMPUTE, ProcessKind.GRAPHICS, ProcessKind.MPS)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (512, "512 B"), (4096, "4.0 KiB"), (16 * MIB, "16.0 MiB"), (H200_RESERVED, "615.1 MiB"),
     (3 * GIB // 2, "1.5 GiB"), (2**41, "2.0 TiB"), (-GIB, "-1.0 GiB")],
)  # fmt: skip
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


# --- check() and evaluate() agree on random snapshots -----------------------------------------------------------

_procs = st.lists(st.builds(proc, st.integers(1, 5), st.one_of(st.none(), st.integers(0, 4 * GIB))), max_size=2)


@st.composite
def _devices(draw: st.DrawFn, index: int) -> DeviceState:
    lists = [draw(st.one_of(st.none(), _procs)) for _ in range(3)]
    unknown = {
        f"processes.{k.value}": "NVML_ERROR_UNKNOWN (999)"
        for k, lst in zip(ALL_KINDS, lists, strict=True)
        if lst is None
    }
    memory = draw(
        st.one_of(
            st.none(),
            st.builds(
                mem,
                st.integers(0, 64 * MIB),
                v1=st.booleans(),
                granularity=st.sampled_from([1, MIB]),
            ),
        )
    )
    return dev(index, memory=memory, procs=lists[0], graphics=lists[1], mps=lists[2], unknown=unknown)


@st.composite
def _snapshots(draw: st.DrawFn) -> Snapshot:
    n = draw(st.integers(0, 3))
    devices = [draw(_devices(i)) for i in range(n)]
    fails = [failure(n, Unknown(999, "f", n))] if draw(st.booleans()) else []
    return snap(*devices, failures=fails)


_leaves = st.sampled_from(
    [
        no_processes(),
        no_processes(kinds="compute"),
        pids_gone([1, 2]),
        memory_used_at_most(16 * MIB),
        memory_used_at_most(0),
        memory_back_to(idle(0, 1)),
        always(),
        never(),
    ]
)
_predicates = st.recursive(
    _leaves,
    lambda inner: st.one_of(
        st.builds(lambda a, b: a & b, inner, inner),
        st.builds(lambda a, b: a | b, inner, inner),
        st.builds(lambda a: ~a, inner),
        st.builds(lambda a: on_devices([0, 2], a), inner),
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(_predicates, _snapshots())
def test_check_and_evaluate_agree(p: Predicate, s: Snapshot) -> None:
    v = p.evaluate(s)
    assert v.satisfied is p.check(s)
    assert (v.reasons == ()) is v.clean  # never "not clean" without saying why
    assert (~p).check(s) is (None if v.satisfied is None else not v.satisfied)
    if s.failures and p.check(s) is True:
        # only a predicate that does not look at devices (always, never-negated, ...) may ignore a failure
        assert "always" in repr(p) or "never" in repr(p) or "~" in repr(p) or "on_devices" in repr(p)


_INLINED = [no_processes(), pids_gone([1, 2, 3]), memory_used_at_most(16 * MIB), memory_used_at_most(0)]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_INLINED), _snapshots())
def test_inlined_hot_paths_agree_with_the_per_device_rule(p: Predicate, s: Snapshot) -> None:
    # no_processes, pids_gone and memory_used_at_most inline their device loop for the poller; the generic loop
    # over _check_device is the reference.
    assert isinstance(p, _DevicePredicate)
    scope = _Scope(s.devices, s.failures)
    assert p._check(scope) is _DevicePredicate._check(p, scope)


def test_pids_gone_describes_one_pid_many_and_none() -> None:
    assert pids_gone([42]).describe() == "pid 42 gone from every GPU process list"
    assert pids_gone([42, 7]).describe() == "pids 7, 42 gone from every GPU process list"
    assert pids_gone([]).describe() == "no PID given (holds wherever the process lists are read)"


@pytest.mark.parametrize(("value", "error"), [(True, TypeError), (-1, ValueError), ("1", TypeError)])
def test_default_predicate_names_max_used_bytes_not_the_inner_limit_bytes(value: object, error: type) -> None:
    with pytest.raises(error, match=r"^max_used_bytes must"):
        default_predicate(max_used_bytes=value)  # type: ignore[arg-type]
