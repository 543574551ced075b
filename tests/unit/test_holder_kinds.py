"""``nvmlcheck.study.child``'s kinds (``python -m nvmlcheck.holder``) against a fake CUDA driver: which calls each
kind makes, in which contexts, and the steps it reports. (The real driver is exercised by
benchmarks/gpu/run_study2.sh on a GPU host.)"""

from __future__ import annotations

from typing import Any

import pytest

from nvmlcheck.study import child as h


class FakeLib:
    """Records every driver call; hands out distinct handles and pointers."""

    def __init__(self, ffi: Any) -> None:
        self.ffi = ffi
        self.calls: list[tuple[Any, ...]] = []
        self.next = 0x1000
        self.current: Any = None

    def _handle(self) -> int:
        self.next += 0x100
        return self.next

    def cuInit(self, flags: int) -> int:
        self.calls.append(("init",))
        return 0

    def cuDeviceGet(self, dev: Any, ordinal: int) -> int:
        dev[0] = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, pctx: Any, dev: int) -> int:
        pctx[0] = ("primary", dev)
        self.calls.append(("retain", dev))
        return 0

    def cuCtxCreate_v2(self, pctx: Any, flags: int, dev: int) -> int:
        pctx[0] = ("created", self._handle())
        self.current = pctx[0]
        self.calls.append(("create", dev))
        return 0

    def cuCtxSetCurrent(self, ctx: Any) -> int:
        self.current = ctx
        return 0

    def cuMemAlloc_v2(self, ptr: Any, size: int) -> int:
        ptr[0] = self._handle()
        self.calls.append(("alloc", self.current, size))
        return 0

    def cuMemsetD8_v2(self, ptr: int, value: int, size: int) -> int:
        self.calls.append(("memset", ptr, size))
        return 0

    def cuMemsetD8Async(self, ptr: int, value: int, size: int, stream: Any) -> int:
        self.calls.append(("memset_async", stream))
        return 0

    def cuStreamCreate(self, s: Any, flags: int) -> int:
        s[0] = ("stream", self._handle())
        self.calls.append(("stream", flags))
        return 0

    def cuCtxSynchronize(self) -> int:
        return 0

    def cuMemFree_v2(self, ptr: int) -> int:
        self.calls.append(("free", self.current, ptr))
        return 0

    def cuCtxDestroy_v2(self, ctx: Any) -> int:
        self.calls.append(("destroy", ctx))
        return 0


class Box:
    """Stands in for a cffi out-parameter: index 0 is the value."""

    def __init__(self) -> None:
        self.value: Any = None

    def __getitem__(self, i: int) -> Any:
        return self.value

    def __setitem__(self, i: int, v: Any) -> None:
        self.value = v


class FakeFfi:
    NULL = None

    def new(self, ctype: str) -> Box:
        return Box()


class FakeCuda:
    def __init__(self) -> None:
        self.ffi = FakeFfi()
        self.lib = FakeLib(self.ffi)

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise h.CudaError(what)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(h, "_Cuda", lambda: fake)
    return fake


def kinds_of(calls: list[tuple[Any, ...]], name: str) -> list[tuple[Any, ...]]:
    return [c for c in calls if c[0] == name]


def test_alloc_and_chunks_split_the_bytes_in_the_primary_context(cuda: FakeCuda) -> None:
    state = h.hold(10, 1, 3, kind="chunks")
    allocs = kinds_of(cuda.lib.calls, "alloc")
    assert [a[2] for a in allocs] == [4, 3, 3] and {a[1] for a in allocs} == {("primary", 1)}
    assert len(kinds_of(cuda.lib.calls, "memset")) == 3  # every byte touched
    assert set(state.steps) == {"init", "ctx", "alloc", "touch"} and not state.created
    assert h.release(state, free=True, destroy=True).keys() == {"free", "sync"}  # a primary context: no destroy
    assert len(kinds_of(cuda.lib.calls, "free")) == 3 and not kinds_of(cuda.lib.calls, "destroy")


def test_context_holds_no_allocation(cuda: FakeCuda) -> None:
    state = h.hold(0, 0, kind="context")
    assert not kinds_of(cuda.lib.calls, "alloc") and kinds_of(cuda.lib.calls, "retain") == [("retain", 0)]
    assert "alloc" not in state.steps
    with pytest.raises(ValueError, match="context kind"):
        h.hold(1 << 20, 0, kind="context")
    with pytest.raises(ValueError, match="context kind"):
        h.hold(0, 0, kind="alloc")


def test_contexts_each_hold_their_share_and_destroy_destroys_each(cuda: FakeCuda) -> None:
    state = h.hold(8, 0, 4, kind="contexts")
    assert len(kinds_of(cuda.lib.calls, "create")) == 4 and state.created
    allocs = kinds_of(cuda.lib.calls, "alloc")
    assert [a[2] for a in allocs] == [2, 2, 2, 2] and len({a[1] for a in allocs}) == 4  # one per context
    steps = h.release(state, free=False, destroy=True)
    assert set(steps) == {"destroy"} and len(kinds_of(cuda.lib.calls, "destroy")) == 4


def test_streams_queue_work_that_is_not_waited_for(cuda: FakeCuda) -> None:
    state = h.hold(1 << 20, 0, 3, kind="streams")
    assert len(kinds_of(cuda.lib.calls, "stream")) == 3
    queued = kinds_of(cuda.lib.calls, "memset_async")
    assert len(queued) == 3 * h.QUEUE_DEPTH and len({q[1] for q in queued}) == 3
    assert state.steps["queued"] == 3 * h.QUEUE_DEPTH and "enqueue" in state.steps


def test_destroy_frees_then_destroys_its_created_context(cuda: FakeCuda) -> None:
    state = h.hold(6, 0, 2, kind="destroy")
    assert kinds_of(cuda.lib.calls, "create") == [("create", 0)]
    steps = h.release(state, free=True, destroy=True)
    assert list(steps) == ["free", "sync", "destroy"]
    names = [c[0] for c in cuda.lib.calls]
    assert names.index("destroy") > max(i for i, n in enumerate(names) if n == "free")


def test_step_lines_round_trip() -> None:
    assert h.parse_steps(h.format_steps({"free": 12, "sync": 3}).split()) == {"free": 12, "sync": 3}
    assert h.parse_steps(["ready", "x=1", "y=a", "=2", "z=-4"]) == {"x": 1, "z": -4}
    with pytest.raises(ValueError, match="unknown holder kind"):
        h.hold(1, kind="vgpu")
