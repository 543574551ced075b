"""``nvmlcheck.study.child``'s kinds (``python -m nvmlcheck.holder``) against a fake CUDA driver: which calls each
kind makes, in which contexts, and the steps it reports. (The real driver is exercised by
benchmarks/gpu/run_study2.sh on a GPU host.)"""

from __future__ import annotations

from typing import Any

import pytest

from nvmlcheck.study import child as h


class FakeLib:
    """Records every driver call; hands out distinct handles and pointers. ``free_bytes`` is the GPU's free memory:
    device allocations take from it, and managed ones once touched on the GPU (unless ``managed_on_host``: then only
    a prefetch does)."""

    def __init__(self, ffi: Any) -> None:
        self.ffi = ffi
        self.calls: list[tuple[Any, ...]] = []
        self.next = 0x1000
        self.current: Any = None
        self.free_bytes = 100 << 30
        self.managed: dict[int, int] = {}
        self.managed_on_host = False

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
        self.free_bytes -= size
        self.calls.append(("alloc", self.current, size))
        return 0

    def cuMemsetD8_v2(self, ptr: int, value: int, size: int) -> int:
        self.calls.append(("memset", ptr, size))
        if ptr in self.managed and not self.managed_on_host:
            self.free_bytes -= self.managed.pop(ptr)
        return 0

    def cuMemHostAlloc(self, pp: Any, size: int, flags: int) -> int:
        pp[0] = ("host", self._handle())
        self.calls.append(("host_alloc", size))
        return 0

    def cuMemFreeHost(self, p: Any) -> int:
        self.calls.append(("host_free", p))
        return 0

    def cuMemHostRegister_v2(self, p: Any, size: int, flags: int) -> int:
        self.calls.append(("register", size))
        return 0

    def cuMemHostUnregister(self, p: Any) -> int:
        self.calls.append(("unregister", p))
        return 0

    def cuMemAllocManaged(self, ptr: Any, size: int, flags: int) -> int:
        ptr[0] = self._handle()
        self.managed[ptr[0]] = size
        self.calls.append(("managed", size, flags))
        return 0

    def cuMemGetInfo_v2(self, free: Any, total: Any) -> int:
        free[0], total[0] = self.free_bytes, 140 << 30
        return 0

    def cuCtxGetDevice(self, dev: Any) -> int:
        dev[0] = 0
        return 0

    def cuMemPrefetchAsync(self, ptr: int, size: int, dev: int, stream: Any) -> int:
        self.calls.append(("prefetch", ptr, size, dev))
        self.free_bytes -= self.managed.pop(ptr, 0)
        return 0

    def cuIpcGetMemHandle(self, handle: Any, ptr: int) -> int:
        handle.data[:] = ptr.to_bytes(8, "little") * 8
        self.calls.append(("export", ptr))
        return 0

    def cuIpcOpenMemHandle_v2(self, ptr: Any, handle: bytes, flags: int) -> int:
        ptr[0] = int.from_bytes(handle[:8], "little")
        self.calls.append(("open", ptr[0], flags))
        return 0

    def cuIpcCloseMemHandle(self, ptr: int) -> int:
        self.calls.append(("close", ptr))
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


class Bytes(Box):
    """A struct of raw bytes (an IPC handle, an NCCL id): ``ffi.buffer`` reads and writes it; by value it is bytes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.data = bytearray(n)

    def __getitem__(self, i: int) -> Any:
        return bytes(self.data)


class FakeFfi:
    NULL = None

    def new(self, ctype: str) -> Box:
        if ctype == "CUipcMemHandle *":
            return Bytes(64)
        if ctype == "ncclUniqueId *":
            return Bytes(128)
        return Box()

    def buffer(self, box: Bytes) -> bytearray:
        return box.data

    def from_buffer(self, obj: Any) -> Any:
        return ("buffer", id(obj))

    def cast(self, ctype: str, value: Any) -> Any:
        return value

    def string(self, value: Any) -> bytes:
        return str(value).encode()


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


# --- the third edition's kinds (issue 26) ---------------------------------------------------------------------------

from nvmlcheck.study import holdkinds  # noqa: E402
from nvmlcheck.study.child import HoldOptions  # noqa: E402


def test_pinned_allocates_host_memory_in_pieces_then_device_memory_and_frees_both(cuda: FakeCuda) -> None:
    state = h.hold(6, 0, 2, kind="pinned", options=HoldOptions(pinned_bytes=10))
    assert [c[1] for c in kinds_of(cuda.lib.calls, "host_alloc")] == [5, 5]
    assert [a[2] for a in kinds_of(cuda.lib.calls, "alloc")] == [3, 3]  # device memory beside, in the same pieces
    names = [c[0] for c in cuda.lib.calls]
    assert names.index("host_alloc") < names.index("alloc")
    assert {"init", "ctx", "pin", "alloc", "touch"} <= set(state.steps)
    steps = h.release(state, free=True, destroy=False)
    assert len(kinds_of(cuda.lib.calls, "host_free")) == 2 and {"unpin", "free", "sync"} <= set(steps)


def test_pinned_without_device_memory_and_by_registration(cuda: FakeCuda) -> None:
    state = h.hold(0, 0, kind="pinned", options=HoldOptions(pinned_bytes=8192, pin_mode="register"))
    assert kinds_of(cuda.lib.calls, "register") == [("register", 8192)] and not kinds_of(cuda.lib.calls, "alloc")
    assert len(state.keep) == 2  # the mapping and its buffer outlive the registration
    h.release(state, free=True, destroy=False)
    assert len(kinds_of(cuda.lib.calls, "unregister")) == 1


def test_ipc_exporter_prints_its_handle_and_an_importer_opens_it(cuda: FakeCuda) -> None:
    exporter = h.hold(1 << 20, 0, 4, kind="ipc", options=HoldOptions(role="exporter"))
    assert len(kinds_of(cuda.lib.calls, "alloc")) == 1  # one allocation, whatever the count: a handle exports one
    handle = exporter.words["ipc"]
    assert len(handle) == 128 and "export" in exporter.steps
    importer = h.hold(0, 0, kind="ipc", options=HoldOptions(role="importer", ipc_handle=handle))
    (opened,) = kinds_of(cuda.lib.calls, "open")
    assert opened[1] == exporter.pointers[0][0] and opened[2] == 1  # the same allocation; lazy peer access
    assert importer.imported == [exporter.pointers[0][0]] and {"open", "touch"} <= set(importer.steps)
    assert not kinds_of(cuda.lib.calls, "alloc")[1:]  # the importer allocated nothing
    h.release(importer, free=True, destroy=False)
    assert kinds_of(cuda.lib.calls, "close") == [("close", exporter.pointers[0][0])]


def test_managed_is_touched_on_the_gpu_prefetched_when_not_and_never_oversubscribed(cuda: FakeCuda) -> None:
    state = h.hold(8 << 30, 0, kind="managed")
    assert kinds_of(cuda.lib.calls, "managed")[0][1:] == (8 << 30, 1) and "prefetch" not in state.steps
    cuda.lib.managed_on_host = True  # a memset that left the pages on the host: the prefetch moves them
    state = h.hold(8 << 30, 0, kind="managed")
    assert "prefetch" in state.steps and len(kinds_of(cuda.lib.calls, "prefetch")) == 1
    cuda.lib.managed_on_host = True
    cuda.lib.cuMemPrefetchAsync = lambda *a: 0  # type: ignore[method-assign]  # nothing moves them: refused
    with pytest.raises(h.CudaError, match="not resident"):
        h.hold(8 << 30, 0, kind="managed")
    cuda.lib.free_bytes = 20 << 30  # 20 GiB free: 16 GiB is more than free less the 7 GiB margin (5% of 140)
    with pytest.raises(h.CudaError, match="refusing to allocate"):
        h.hold(16 << 30, 0, kind="managed")


def test_mps_client_needs_the_study_daemons_pipe(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(holdkinds.MPS_PIPE_ENV, raising=False)
    with pytest.raises(ValueError, match="CUDA_MPS_PIPE_DIRECTORY"):
        h.hold(1 << 20, 0, kind="mps")
    assert not cuda.lib.calls  # refused before any CUDA call
    monkeypatch.setenv(holdkinds.MPS_PIPE_ENV, "/tmp/nvmlcheck-mps-x/pipe")
    state = h.hold(1 << 20, 0, kind="mps")
    assert len(kinds_of(cuda.lib.calls, "alloc")) == 1 and "touch" in state.steps


class FakeNccl:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def ncclGetUniqueId(self, uid: Any) -> int:
        uid.data[:] = bytes(range(128))
        self.calls.append(("id",))
        return 0

    def ncclCommInitRank(self, comm: Any, nranks: int, uid: bytes, rank: int) -> int:
        comm[0] = ("comm", rank)
        self.calls.append(("init", nranks, uid, rank))
        return 0

    def ncclAllReduce(self, *args: Any) -> int:  # send, recv, count, datatype, op, comm, stream
        self.calls.append(("allreduce", args[2], args[5]))
        return 0

    def ncclCommDestroy(self, comm: Any) -> int:
        self.calls.append(("destroy", comm))
        return 0

    def ncclGetErrorString(self, rc: int) -> str:
        return "unhandled cuda error"


def test_nccl_root_prints_the_id_a_rank_joins_with(cuda: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    nccl = FakeNccl()
    monkeypatch.setattr(holdkinds, "load_nccl", lambda: (FakeFfi(), nccl))
    lines: list[str] = []
    root = h.hold(1 << 20, 0, kind="nccl", options=HoldOptions(role="root", nranks=2, on_line=lines.append))
    (line,) = lines
    assert line == "nccl-id " + bytes(range(128)).hex()
    assert nccl.calls[:2] == [("id",), ("init", 2, bytes(range(128)), 0)] and nccl.calls[2][0] == "allreduce"
    assert {"id", "comm", "allreduce"} <= set(root.steps)
    h.hold(0, 1, kind="nccl", options=HoldOptions(role="rank", rank=1, nranks=2, nccl_id=line.split()[1]))
    assert nccl.calls[3] == ("init", 2, bytes(range(128)), 1) and nccl.calls[4][0] == "allreduce"
    h.release(root, free=True, destroy=False)
    assert nccl.calls[-1] == ("destroy", ("comm", 0))
    nccl.ncclAllReduce = lambda *a: 2  # type: ignore[method-assign]
    with pytest.raises(h.CudaError, match="ncclAllReduce failed: unhandled cuda error"):
        h.hold(0, 0, kind="nccl", options=HoldOptions(role="root", nranks=2))


@pytest.mark.parametrize(("nbytes", "kind", "options", "match"), [
    (1, "alloc", HoldOptions(pinned_bytes=1), "pinned kind's"),
    (1, "pinned", HoldOptions(pin_mode="mlock"), "pin mode"),
    (1, "ipc", HoldOptions(role="root"), "exporter or importer"),
    (1, "ipc", HoldOptions(role="importer", ipc_handle="ab" * 64), "allocates nothing"),
    (0, "ipc", HoldOptions(role="importer", ipc_handle="zz" * 64), "handle"),
    (0, "ipc", HoldOptions(role="importer"), "handle"),
    (0, "ipc", HoldOptions(), "needs bytes > 0"),
    (0, "nccl", HoldOptions(role="root", nranks=1), "two or more"),
    (0, "nccl", HoldOptions(role="rank", rank=0, nranks=2, nccl_id="00" * 128), "rank 0 is the root"),
    (0, "nccl", HoldOptions(role="rank", rank=2, nranks=2, nccl_id="00" * 128), "not within"),
    (0, "nccl", HoldOptions(role="rank", rank=1, nranks=2), "root's id"),
    (0, "managed", HoldOptions(), "needs bytes > 0"),
    (0, "pinned", HoldOptions(pinned_bytes=1 << 60), "refusing to pin"),
])
def test_kind_options_are_checked_before_any_cuda_call(
    cuda: FakeCuda, nbytes: int, kind: str, options: HoldOptions, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        h.hold(nbytes, 0, kind=kind, options=options)
    assert not cuda.lib.calls


def test_ready_words_round_trip() -> None:
    assert h.parse_words(["init=5", "ipc:abcd", "x:", "sim=1", "nccl:12"]) == {"ipc": "abcd", "nccl": "12"}
