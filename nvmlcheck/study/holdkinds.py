"""The holder kinds of the study's third edition (issue 26), set up in the holder process (``python -m
nvmlcheck.holder``) once :func:`nvmlcheck.study.child.hold` has made the primary context current:

* ``pinned``: page-locked host memory (``cuMemHostAlloc``, or ``cuMemHostRegister`` of mapped memory), with or
  without device memory beside it;
* ``ipc``: an ``exporter`` allocates and exports a CUDA IPC handle, each ``importer`` opens it;
* ``managed``: ``cuMemAllocManaged`` touched on the GPU (never more than the GPU has free, less a margin);
* ``mps``: a plain allocation made by an MPS client (the study's own daemon, through ``CUDA_MPS_PIPE_DIRECTORY``);
* ``nccl``: a communicator across GPUs, one holder (rank) per GPU, connected by one all-reduce.

Each reports its own set-up steps (docs/study-records.md lists them); :func:`release_extras` undoes them on ``free``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from ..errors import ArgumentError
from .child import CudaError, HeldState, HoldOptions, allocate, split

__all__ = ["KINDS", "MANAGED_MARGIN_BYTES", "MPS_PIPE_ENV", "NCCL_LIBRARY_ENV", "PINNED_RAM_SHARE", "check_options",
           "load_nccl", "release_extras"]

#: Managed memory asks for at most the GPU's free memory less this (or less 5% of the total, if larger): asking for
#: more than is free oversubscribes the GPU, which can hang it.
MANAGED_MARGIN_BYTES = 4 << 30
#: Pinned host memory is refused above this share of the machine's physical memory (pinned pages cannot be swapped:
#: pinning most of the RAM starves everything else, the study included).
PINNED_RAM_SHARE = 0.6
#: Where an MPS client finds its control daemon; the study's daemon sets it for its clients only.
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
#: A path to ``libnccl.so`` to use instead of searching for it.
NCCL_LIBRARY_ENV = "NVMLCHECK_NCCL_LIBRARY"

_IPC_LAZY_ENABLE_PEER_ACCESS = 1
_MEM_ATTACH_GLOBAL = 1
_HANDLE_BYTES = 64
_NCCL_ID_BYTES = 128
_NCCL_FLOAT32, _NCCL_SUM = 7, 0
_DEFAULT_ROLE = {"ipc": "exporter", "mps": "client"}
_ROLES_OF = {"ipc": ("exporter", "importer"), "nccl": ("root", "rank"), "mps": ("client",)}

_NCCL_CDEF = """
typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
int ncclGetUniqueId(ncclUniqueId *uniqueId);
int ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
int ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, ncclComm_t comm,
                  void *stream);
int ncclCommDestroy(ncclComm_t comm);
const char *ncclGetErrorString(int result);
"""


def role_of(kind: str, options: HoldOptions) -> str:
    """The holder's role: the one asked for, else the kind's default (``holder`` for most kinds)."""
    return options.role or _DEFAULT_ROLE.get(kind, "holder")


def _physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


def check_options(nbytes: int, kind: str, options: HoldOptions) -> None:
    """``ValueError`` for a combination of size, kind and options that the kind cannot hold (before any CUDA call)."""
    role = role_of(kind, options)
    allowed = _ROLES_OF.get(kind, ("holder",))
    if role not in allowed:
        raise ArgumentError(f"the {kind} kind takes the role {' or '.join(allowed)}, not {role!r}")
    if nbytes < 0 or options.pinned_bytes < 0:
        raise ArgumentError("byte counts must be >= 0")
    if options.pinned_bytes and kind != "pinned":
        raise ArgumentError(f"pinned host memory is the pinned kind's: the {kind} kind takes none")
    if options.pin_mode not in ("alloc", "register"):
        raise ArgumentError(f"pin mode must be 'alloc' or 'register', got {options.pin_mode!r}")
    zero_ok = kind in ("context", "pinned", "nccl") or role == "importer"
    if kind == "context" and nbytes:
        raise ArgumentError("the context kind holds no allocation (bytes 0)")
    if role == "importer" and nbytes:
        raise ArgumentError("an IPC importer allocates nothing (bytes 0): it maps the exporter's allocation")
    if not zero_ok and nbytes == 0:
        raise ArgumentError(f"the {kind} kind needs bytes > 0 (only the context kind holds no allocation)")
    if role == "importer" and not _is_hex(options.ipc_handle, _HANDLE_BYTES):
        raise ArgumentError(f"an IPC importer needs the exporter's handle: {_HANDLE_BYTES * 2} hex digits")
    if kind == "nccl":
        _check_nccl(role, options)
    if kind == "mps" and not os.environ.get(MPS_PIPE_ENV):
        raise ArgumentError(f"an MPS client needs {MPS_PIPE_ENV} (the pipe directory of the study's MPS daemon)")
    ram = _physical_memory_bytes()
    if options.pinned_bytes and ram and options.pinned_bytes > PINNED_RAM_SHARE * ram:
        raise ArgumentError(f"refusing to pin {options.pinned_bytes} bytes: more than {PINNED_RAM_SHARE:.0%} of this "
                         f"machine's {ram} bytes of memory")


def _check_nccl(role: str, options: HoldOptions) -> None:
    if options.nranks < 2:
        raise ArgumentError(f"an NCCL communicator needs two or more ranks, got {options.nranks}")
    if not 0 <= options.rank < options.nranks:
        raise ArgumentError(f"rank {options.rank} is not within 0..{options.nranks - 1}")
    if (role == "root") != (options.rank == 0):
        raise ArgumentError("the NCCL root is rank 0, and rank 0 is the root")
    if role == "rank" and not _is_hex(options.nccl_id, _NCCL_ID_BYTES):
        raise ArgumentError(f"an NCCL rank needs the root's id: {_NCCL_ID_BYTES * 2} hex digits")


def _is_hex(text: str | None, nbytes: int) -> bool:
    if text is None or len(text) != nbytes * 2:
        return False
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def _timed(steps: dict[str, int], key: str, t0: int) -> None:
    steps[key] = steps.get(key, 0) + time.monotonic_ns() - t0


def _symbol(lib: Any, *names: str) -> Any:
    """The first of ``names`` the library exports (``_v2`` first, the older name after)."""
    for name in names:
        try:
            return getattr(lib, name)
        except AttributeError:
            continue
    raise CudaError(f"the CUDA driver exports none of {', '.join(names)}")


def _pinned(state: HeldState, nbytes: int, chunks: int, options: HoldOptions) -> None:
    cuda = state.cuda
    if options.pinned_bytes:
        t0 = time.monotonic_ns()
        for size in split(options.pinned_bytes, chunks):
            if options.pin_mode == "alloc":
                p = cuda.ffi.new("void **")
                cuda.check(cuda.lib.cuMemHostAlloc(p, size, 0), f"cuMemHostAlloc({size})")
                state.host.append(("alloc", p[0]))
            else:
                import mmap

                mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)  # anonymous, like a large malloc
                buf = cuda.ffi.from_buffer(mapped)
                ptr = cuda.ffi.cast("void *", buf)
                cuda.check(_symbol(cuda.lib, "cuMemHostRegister_v2", "cuMemHostRegister")(ptr, size, 0),
                           f"cuMemHostRegister({size})")
                state.keep.extend((mapped, buf))
                state.host.append(("register", ptr))
        _timed(state.steps, "pin", t0)
    if nbytes:
        allocate(state, split(nbytes, chunks))


def _ipc(state: HeldState, nbytes: int, chunks: int, options: HoldOptions) -> None:
    cuda = state.cuda
    handle = cuda.ffi.new("CUipcMemHandle *")
    if role_of("ipc", options) == "importer":
        cuda.ffi.buffer(handle)[:] = bytes.fromhex(options.ipc_handle or "")
        ptr = cuda.ffi.new("unsigned long long *")
        t0 = time.monotonic_ns()
        opener = _symbol(cuda.lib, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle")
        cuda.check(opener(ptr, handle[0], _IPC_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle")
        _timed(state.steps, "open", t0)
        t0 = time.monotonic_ns()
        cuda.check(cuda.lib.cuMemsetD8_v2(ptr[0], 0x5A, 1), "cuMemsetD8 (imported)")  # the mapping works
        cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        _timed(state.steps, "touch", t0)
        state.imported.append(int(ptr[0]))
        return
    allocate(state, [nbytes])  # one allocation: a handle exports one allocation
    t0 = time.monotonic_ns()
    cuda.check(cuda.lib.cuIpcGetMemHandle(handle, state.pointers[0][0]), "cuIpcGetMemHandle")
    _timed(state.steps, "export", t0)
    state.words["ipc"] = bytes(cuda.ffi.buffer(handle)[:]).hex()


def _managed(state: HeldState, nbytes: int, chunks: int, options: HoldOptions) -> None:
    cuda = state.cuda
    free, total = cuda.ffi.new("size_t *"), cuda.ffi.new("size_t *")
    cuda.check(cuda.lib.cuMemGetInfo_v2(free, total), "cuMemGetInfo")
    margin = max(MANAGED_MARGIN_BYTES, int(total[0]) // 20)
    if nbytes > int(free[0]) - margin:
        raise CudaError(f"refusing to allocate {nbytes} bytes of managed memory: the GPU has {int(free[0])} bytes "
                        f"free, and more than free less {margin} can oversubscribe it (and hang it)")
    before = int(free[0])
    for size in split(nbytes, chunks):
        ptr = cuda.ffi.new("unsigned long long *")
        t0 = time.monotonic_ns()
        cuda.check(cuda.lib.cuMemAllocManaged(ptr, size, _MEM_ATTACH_GLOBAL), f"cuMemAllocManaged({size})")
        _timed(state.steps, "alloc", t0)
        t0 = time.monotonic_ns()
        # A memset runs on the GPU, so its pages are populated in GPU memory; checked below, and a prefetch to the
        # GPU is the fallback where they were not.
        cuda.check(cuda.lib.cuMemsetD8_v2(ptr[0], 0xA5, size), "cuMemsetD8 (managed)")
        cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        _timed(state.steps, "touch", t0)
        state.pointers[0].append(int(ptr[0]))
    if not _resident(cuda, before, nbytes):
        t0 = time.monotonic_ns()
        dev = cuda.ffi.new("int *")
        cuda.check(cuda.lib.cuCtxGetDevice(dev), "cuCtxGetDevice")
        for p, size in zip(state.pointers[0], split(nbytes, chunks), strict=True):
            cuda.check(cuda.lib.cuMemPrefetchAsync(p, size, dev[0], cuda.ffi.NULL), "cuMemPrefetchAsync")
        cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        _timed(state.steps, "prefetch", t0)
        if not _resident(cuda, before, nbytes):
            raise CudaError(f"{nbytes} bytes of managed memory are not resident on the GPU after a memset and a "
                            "prefetch (cuMemGetInfo): nothing to measure")


def _resident(cuda: Any, free_before: int, nbytes: int) -> bool:
    """Whether the GPU's free memory dropped by (nearly) ``nbytes`` since ``free_before``."""
    free, total = cuda.ffi.new("size_t *"), cuda.ffi.new("size_t *")
    cuda.check(cuda.lib.cuMemGetInfo_v2(free, total), "cuMemGetInfo")
    return free_before - int(free[0]) >= nbytes * 0.9


def _mps(state: HeldState, nbytes: int, chunks: int, options: HoldOptions) -> None:
    allocate(state, split(nbytes, chunks))  # an ordinary allocation; its memory belongs to the MPS server


def load_nccl() -> tuple[Any, Any]:
    """``(ffi, lib)`` of the NCCL library: ``$NVMLCHECK_NCCL_LIBRARY``, else ``libnccl.so.2`` from the loader's
    path, else the copy a PyTorch install carries (``nvidia/nccl/lib`` on ``sys.path``); :class:`CudaError` when
    there is none."""
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(_NCCL_CDEF)
    candidates = [os.environ.get(NCCL_LIBRARY_ENV, ""), "libnccl.so.2", "libnccl.so"]
    candidates += [os.path.join(p, "nvidia", "nccl", "lib", "libnccl.so.2") for p in sys.path if p]
    errors = []
    for name in filter(None, candidates):
        try:
            return ffi, ffi.dlopen(name)
        except OSError as exc:
            errors.append(f"{name}: {str(exc)[:100]}")
    raise CudaError("no NCCL library could be loaded (set " + NCCL_LIBRARY_ENV + "); tried " + "; ".join(errors[:3]))


def _nccl_check(ffi: Any, lib: Any, rc: int, what: str) -> None:
    if rc != 0:
        text = lib.ncclGetErrorString(rc)
        raise CudaError(f"{what} failed: {ffi.string(text).decode() if text != ffi.NULL else 'unknown'} ({rc})")


def _nccl(state: HeldState, nbytes: int, chunks: int, options: HoldOptions) -> None:
    cuda = state.cuda
    ffi, lib = load_nccl()
    uid = ffi.new("ncclUniqueId *")
    if role_of("nccl", options) == "root":
        t0 = time.monotonic_ns()
        _nccl_check(ffi, lib, lib.ncclGetUniqueId(uid), "ncclGetUniqueId")
        _timed(state.steps, "id", t0)
        if options.on_line is not None:  # the factory starts the other ranks with it
            options.on_line(f"nccl-id {bytes(ffi.buffer(uid)[:]).hex()}")
    else:
        ffi.buffer(uid)[:] = bytes.fromhex(options.nccl_id or "")
    comm = ffi.new("ncclComm_t *")
    t0 = time.monotonic_ns()
    _nccl_check(ffi, lib, lib.ncclCommInitRank(comm, options.nranks, uid[0], options.rank), "ncclCommInitRank")
    _timed(state.steps, "comm", t0)
    state.nccl = (ffi, lib, comm[0])
    if nbytes:
        allocate(state, split(nbytes, chunks))
    allocate(state, [4096])  # the all-reduce's buffer
    t0 = time.monotonic_ns()
    buf = ffi.cast("void *", state.pointers[0][-1])
    # NCCL connects its peers at the first collective: one all-reduce makes the communicator whole.
    _nccl_check(ffi, lib, lib.ncclAllReduce(buf, buf, 1024, _NCCL_FLOAT32, _NCCL_SUM, comm[0], ffi.NULL),
                "ncclAllReduce")
    cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
    _timed(state.steps, "allreduce", t0)


#: Kind → set-up, called with the primary context current.
KINDS: dict[str, Callable[[HeldState, int, int, HoldOptions], None]] = {
    "pinned": _pinned, "ipc": _ipc, "managed": _managed, "mps": _mps, "nccl": _nccl,
}


def release_extras(state: HeldState, steps: dict[str, int]) -> None:
    """On ``free``: close IPC mappings (``close``), unpin host memory (``unpin``) and destroy the NCCL
    communicator (``comm``), each timed, before the device memory is freed."""
    cuda = state.cuda
    if state.imported:
        t0 = time.monotonic_ns()
        for p in state.imported:
            cuda.check(cuda.lib.cuIpcCloseMemHandle(p), "cuIpcCloseMemHandle")
        _timed(steps, "close", t0)
    if state.host:
        t0 = time.monotonic_ns()
        for how, p in state.host:
            if how == "alloc":
                cuda.check(cuda.lib.cuMemFreeHost(p), "cuMemFreeHost")
            else:
                cuda.check(cuda.lib.cuMemHostUnregister(p), "cuMemHostUnregister")
        _timed(steps, "unpin", t0)
    if state.nccl is not None:
        ffi, lib, comm = state.nccl
        t0 = time.monotonic_ns()
        _nccl_check(ffi, lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")
        _timed(steps, "comm", t0)
