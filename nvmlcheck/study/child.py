"""A process that holds GPU memory, for tests and the reclamation study (needs no PyTorch; CUDA driver API through
cffi). Run it as ``python -m nvmlcheck.holder``::

    python -m nvmlcheck.holder --bytes 1GiB --device 0 [--kind alloc] [--count 4] [--pinned 8GiB] [--role ...]

It sets up its :data:`HOLDER_KINDS` state, prints ``ready PID BYTES DEVICE [STEP=NS ...] [KEY:VALUE ...]``, and
waits for ``exit`` or ``free`` on stdin (or a signal); ended by a command it prints ``done [STEP=NS ...]`` and leaves
with ``os._exit``. Exit status 3 with a message on stderr when CUDA is unavailable or a step fails. The kinds of the
third edition (pinned host memory, CUDA IPC, managed memory, MPS clients, NCCL) live in
:mod:`nvmlcheck.study.holdkinds`. The kinds, the steps and the protocol: docs/study-records.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._units import parse_size
from ..errors import ArgumentError, NvmlCheckError

__all__ = ["HOLDER_KINDS", "ROLES", "CudaError", "HeldState", "HoldOptions", "format_steps", "hold", "main",
           "parse_size", "parse_steps", "parse_words", "release"]

#: The kinds of holder (each described in docs/study-records.md).
HOLDER_KINDS: tuple[str, ...] = ("alloc", "context", "chunks", "contexts", "streams", "destroy", "pinned", "ipc",
                                 "managed", "mps", "nccl")
#: A holder's part in a group: ``holder`` (alone), ``exporter``/``importer`` (``ipc``), ``root``/``rank``
#: (``nccl``: the root makes the communicator's id), ``client`` (``mps``).
ROLES: tuple[str, ...] = ("holder", "exporter", "importer", "root", "rank", "client")

_CDEF = """
int cuInit(unsigned int flags);
int cuDeviceGet(int *device, int ordinal);
int cuDevicePrimaryCtxRetain(void **pctx, int dev);
int cuCtxCreate_v2(void **pctx, unsigned int flags, int dev);
int cuCtxDestroy_v2(void *ctx);
int cuCtxSetCurrent(void *ctx);
int cuMemAlloc_v2(unsigned long long *dptr, size_t bytesize);
int cuMemsetD8_v2(unsigned long long dstDevice, unsigned char uc, size_t N);
int cuMemsetD8Async(unsigned long long dstDevice, unsigned char uc, size_t N, void *hStream);
int cuStreamCreate(void **phStream, unsigned int Flags);
int cuCtxSynchronize(void);
int cuMemFree_v2(unsigned long long dptr);
int cuGetErrorName(int error, const char **pStr);
int cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
int cuMemFreeHost(void *p);
int cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
int cuMemHostUnregister(void *p);
int cuMemAllocManaged(unsigned long long *dptr, size_t bytesize, unsigned int flags);
int cuMemGetInfo_v2(size_t *free, size_t *total);
int cuCtxGetDevice(int *device);
int cuMemPrefetchAsync(unsigned long long devPtr, size_t count, int dstDevice, void *hStream);
typedef struct { char reserved[64]; } CUipcMemHandle;
int cuIpcGetMemHandle(CUipcMemHandle *pHandle, unsigned long long dptr);
int cuIpcOpenMemHandle_v2(unsigned long long *pdptr, CUipcMemHandle handle, unsigned int Flags);
int cuIpcCloseMemHandle(unsigned long long dptr);
"""


#: Memsets queued per stream by the ``streams`` kind: deep enough that work is still queued at the end, shallow
#: enough never to fill the driver's launch queue (which would block the enqueue).
QUEUE_DEPTH = 128
#: Bytes each queued memset writes (at most; less when the allocation is smaller): a fraction of a ms each at HBM
#: bandwidth (terabytes per second), so 4 streams x 128 queue on the order of 100 ms of work (an estimate, not
#: measured).
QUEUE_BYTES = 1 << 30


class CudaError(NvmlCheckError, RuntimeError):
    """A CUDA driver call failed (in a holder process). Also a ``RuntimeError``."""


def format_steps(steps: dict[str, int]) -> str:
    """``{"free": 12}`` → ``"free=12"`` (the ``STEP=NS`` pairs of the ``ready`` and ``done`` lines)."""
    return " ".join(f"{k}={v}" for k, v in steps.items())


def parse_steps(words: Sequence[str]) -> dict[str, int]:
    """The ``STEP=NS`` pairs among ``words`` (others ignored: a later holder may print more)."""
    out: dict[str, int] = {}
    for w in words:
        key, eq, value = w.partition("=")
        if eq and key and re.fullmatch(r"-?\d+", value):
            out[key] = int(value)
    return out


def parse_words(words: Sequence[str]) -> dict[str, str]:
    """The ``KEY:VALUE`` words among ``words`` (``ipc:HEX``, the exporter's IPC handle); others ignored."""
    out: dict[str, str] = {}
    for w in words:
        key, colon, value = w.partition(":")
        if colon and key and value and "=" not in key:
            out[key] = value
    return out


class _Cuda:
    def __init__(self) -> None:
        import cffi

        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        try:
            self.lib: Any = self.ffi.dlopen("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"libcuda.so.1 could not be loaded ({exc}); is the NVIDIA driver installed?") from None

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self.ffi.new("const char **")
            self.lib.cuGetErrorName(rc, name)
            raw = self.ffi.string(name[0]) if name[0] != self.ffi.NULL else b"unknown"
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            raise CudaError(f"{what} failed: {text} ({rc})")


@dataclass
class HeldState:
    """What a holder set up: the CUDA handle, its contexts (``created``: made by ``cuCtxCreate``, so destroyable),
    the device pointers per context, and the cost of each set-up step (``steps``, ns). The third edition's kinds add
    ``host`` (pinned host memory: ``("alloc" | "register", pointer)``), ``imported`` (IPC-imported device pointers),
    ``nccl`` (the library and communicator), ``words`` (``KEY:VALUE`` words for the ``ready`` line) and ``keep``
    (objects that must outlive the state, such as the mapped buffers behind registered memory)."""

    cuda: Any
    contexts: list[Any] = field(default_factory=list)
    created: bool = False
    pointers: list[list[int]] = field(default_factory=list)
    steps: dict[str, int] = field(default_factory=dict)
    host: list[tuple[str, Any]] = field(default_factory=list)
    imported: list[int] = field(default_factory=list)
    nccl: Any = None
    words: dict[str, str] = field(default_factory=dict)
    keep: list[Any] = field(default_factory=list)


def _timed(steps: dict[str, int], key: str, t0: int) -> None:
    steps[key] = steps.get(key, 0) + time.monotonic_ns() - t0


@dataclass(frozen=True, slots=True)
class HoldOptions:
    """The third edition's options of :func:`hold`: ``pinned_bytes`` and ``pin_mode`` (``pinned``), ``role``
    (:data:`ROLES`; ``None``: the kind's default), ``ipc_handle`` (an ``importer``'s handle, hex), ``nccl_id``
    (a ``rank``'s communicator id, hex), ``rank``/``nranks`` (``nccl``), ``on_line`` (prints a line before
    ``ready``: the NCCL root's id)."""

    pinned_bytes: int = 0
    pin_mode: str = "alloc"
    role: str | None = None
    ipc_handle: str | None = None
    nccl_id: str | None = None
    rank: int = 0
    nranks: int = 1
    on_line: Callable[[str], None] | None = None


def hold(nbytes: int, device: int = 0, chunks: int = 1, *, kind: str = "alloc",
         options: HoldOptions | None = None) -> HeldState:
    """Set up a holder of ``kind`` (see :data:`HOLDER_KINDS`) on ``device`` and return what it holds. ``chunks`` is
    the count: allocations (``alloc``, ``chunks``, ``destroy``, ``pinned``: pieces of both the device and the host
    memory), contexts (``contexts``) or streams (``streams``). ``options``: see :class:`HoldOptions`."""
    from . import holdkinds

    opts = options or HoldOptions()
    if kind not in HOLDER_KINDS:
        raise ArgumentError(f"unknown holder kind {kind!r}: one of {', '.join(HOLDER_KINDS)}")
    if chunks < 1:
        raise ArgumentError(f"the count must be at least 1, got {chunks}")
    holdkinds.check_options(nbytes, kind, opts)
    # NVML numbers GPUs in PCI bus order; make CUDA's ordinals agree so --device means the same GPU in both.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    steps: dict[str, int] = {}
    t0 = time.monotonic_ns()
    cuda = _Cuda()
    cuda.check(cuda.lib.cuInit(0), "cuInit")
    dev = cuda.ffi.new("int *")
    cuda.check(cuda.lib.cuDeviceGet(dev, device), f"cuDeviceGet({device})")
    _timed(steps, "init", t0)
    state = HeldState(cuda, steps=steps)
    n_ctx = chunks if kind == "contexts" else 1
    t0 = time.monotonic_ns()
    for _ in range(n_ctx):
        ctx = cuda.ffi.new("void **")
        if kind in ("contexts", "destroy"):
            cuda.check(cuda.lib.cuCtxCreate_v2(ctx, 0, dev[0]), "cuCtxCreate")  # also makes it current
            state.created = True
        else:
            cuda.check(cuda.lib.cuDevicePrimaryCtxRetain(ctx, dev[0]), "cuDevicePrimaryCtxRetain")
            cuda.check(cuda.lib.cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent")
        state.contexts.append(ctx[0])
        state.pointers.append([])
    _timed(steps, "ctx", t0)
    if kind in holdkinds.KINDS:
        holdkinds.KINDS[kind](state, nbytes, chunks, opts)
        return state
    if kind == "context":
        cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        return state
    # How many allocations in each context: the count splits the bytes, except for streams (one per stream's work).
    per_ctx = 1 if kind in ("contexts", "streams") else chunks
    pieces = split(nbytes, n_ctx * per_ctx)
    for c, ctx_ptr in enumerate(state.contexts):
        cuda.check(cuda.lib.cuCtxSetCurrent(ctx_ptr), "cuCtxSetCurrent")
        allocate(state, pieces[c * per_ctx:(c + 1) * per_ctx], c)
    if kind == "streams":
        _queue_work(state, chunks, nbytes)
    return state


def allocate(state: HeldState, pieces: Sequence[int], ctx_index: int = 0) -> None:
    """Allocate each of ``pieces`` bytes in the current context and write every byte (steps ``alloc``, ``touch``)."""
    cuda, steps = state.cuda, state.steps
    for size in pieces:
        ptr = cuda.ffi.new("unsigned long long *")
        t0 = time.monotonic_ns()
        cuda.check(cuda.lib.cuMemAlloc_v2(ptr, size), f"cuMemAlloc({size})")
        _timed(steps, "alloc", t0)
        t0 = time.monotonic_ns()
        # Touch every byte: an untouched allocation may not be backed yet on every driver.
        cuda.check(cuda.lib.cuMemsetD8_v2(ptr[0], 0xA5, size), "cuMemsetD8")
        cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        _timed(steps, "touch", t0)
        state.pointers[ctx_index].append(int(ptr[0]))


def split(nbytes: int, n: int) -> list[int]:
    """``nbytes`` in ``n`` pieces as equal as can be (the first ones one byte larger)."""
    base, extra = divmod(nbytes, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _queue_work(state: HeldState, streams: int, nbytes: int) -> None:
    """Create ``streams`` streams and queue :data:`QUEUE_DEPTH` memsets on each, not waited for: work in flight."""
    cuda, steps = state.cuda, state.steps
    ptr = state.pointers[0][0]
    size = min(nbytes, QUEUE_BYTES)
    t0 = time.monotonic_ns()
    handles = []
    for _ in range(streams):
        s = cuda.ffi.new("void **")
        cuda.check(cuda.lib.cuStreamCreate(s, 1), "cuStreamCreate")  # 1: CU_STREAM_NON_BLOCKING
        handles.append(s[0])
    _timed(steps, "streams", t0)
    t0 = time.monotonic_ns()
    for _ in range(QUEUE_DEPTH):
        for s in handles:
            cuda.check(cuda.lib.cuMemsetD8Async(ptr, 0x5A, size, s), "cuMemsetD8Async")
    _timed(steps, "enqueue", t0)
    steps["queued"] = QUEUE_DEPTH * streams


def release(state: HeldState, *, free: bool, destroy: bool) -> dict[str, int]:
    """What a holder does on its way out: free its allocations (``free``: device memory, pinned host memory, IPC
    mappings, the NCCL communicator), destroy its created contexts (``destroy``); returns the cost of each step
    (``free``, ``sync``, ``unpin``, ``close``, ``comm``, ``destroy``, ns)."""
    from . import holdkinds

    cuda = state.cuda
    steps: dict[str, int] = {}
    if free:
        holdkinds.release_extras(state, steps)
        t0 = time.monotonic_ns()
        for c, ctx in enumerate(state.contexts):
            cuda.check(cuda.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            for p in state.pointers[c]:
                cuda.check(cuda.lib.cuMemFree_v2(p), "cuMemFree")
        _timed(steps, "free", t0)
        t0 = time.monotonic_ns()
        cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        _timed(steps, "sync", t0)
    if destroy and state.created:
        t0 = time.monotonic_ns()
        for ctx in state.contexts:
            cuda.check(cuda.lib.cuCtxDestroy_v2(ctx), "cuCtxDestroy")
        _timed(steps, "destroy", t0)
    return steps


def _size_or_zero(text: str) -> int:
    return 0 if text.strip() in ("0", "0B") else parse_size(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nvmlcheck.holder", description="Hold GPU memory until told.")
    parser.add_argument("--bytes", required=True, type=_size_or_zero,
                        help="device memory to allocate, e.g. 16GiB (0: none; with --kind context, pinned, nccl, "
                             "or an IPC importer)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    parser.add_argument("--kind", choices=HOLDER_KINDS, default="alloc", help="what to hold (default alloc)")
    parser.add_argument("--count", "--chunks", dest="count", type=int, default=1,
                        help="allocations, contexts or streams, by kind (default 1)")
    parser.add_argument("--pinned", type=_size_or_zero, default=0,
                        help="pinned host memory to hold (--kind pinned), e.g. 8GiB")
    parser.add_argument("--pin-mode", choices=("alloc", "register"), default="alloc",
                        help="cuMemHostAlloc (alloc, default) or cuMemHostRegister of mapped memory (register)")
    parser.add_argument("--role", choices=ROLES, default=None, help="part in a group (ipc, nccl)")
    parser.add_argument("--ipc-handle", default=None, help="an importer's IPC handle (hex, from the exporter)")
    parser.add_argument("--nccl-id", default=None, help="a rank's NCCL communicator id (hex, from the root)")
    parser.add_argument("--rank", type=int, default=0, help="NCCL rank (default 0)")
    parser.add_argument("--nranks", type=int, default=1, help="NCCL ranks in the communicator")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``python -m nvmlcheck.holder``)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be at least 1")
    options = HoldOptions(
        pinned_bytes=args.pinned, pin_mode=args.pin_mode, role=args.role, ipc_handle=args.ipc_handle,
        nccl_id=args.nccl_id, rank=args.rank, nranks=args.nranks, on_line=lambda line: print(line, flush=True),
    )
    try:
        state = hold(args.bytes, args.device, args.count, kind=args.kind, options=options)
    except (CudaError, ValueError, OSError) as exc:
        print(f"holder: {exc}", file=sys.stderr)
        return 3
    words = " ".join(f"{k}:{v}" for k, v in state.words.items())
    print(f"ready {os.getpid()} {args.bytes} {args.device} {format_steps(state.steps)} {words}".rstrip(), flush=True)
    done: dict[str, int] = {}
    for line in sys.stdin:
        command = line.strip()
        if command in ("free", "exit"):
            try:
                done = release(state, free=command == "free", destroy=args.kind == "destroy")
            except CudaError as exc:
                print(f"holder: {exc}", file=sys.stderr)
                os._exit(3)
            break
    else:
        if args.kind == "destroy":  # end of input is "exit": the destroy kind still destroys
            done = release(state, free=False, destroy=True)
    print(f"done {format_steps(done)}".rstrip(), flush=True)
    # Skip interpreter teardown: end like a process that simply exits, whatever it did before.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
