"""A process that holds GPU memory, for tests and the reclamation study. Needs no PyTorch.

It allocates through the CUDA driver API (``libcuda.so.1``, via cffi), writes every byte so the memory is really
backed, then prints one line ``ready PID BYTES DEVICE`` and waits for a command on stdin:

* ``exit``: exit at once without freeing (the driver reclaims as for any exit);
* ``free``: free every allocation, print ``freed``, then exit;
* end of input: like ``exit``.

Killing it with SIGKILL or SIGTERM is the other way to end it (SIGTERM's default action ends it immediately).

    python -m nvmlcheck.holder --bytes 1GiB --device 0 [--chunks 4]

Exit status 3 with a message on stderr when CUDA is unavailable or the allocation fails.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["CudaError", "hold", "main", "parse_size"]

_CDEF = """
int cuInit(unsigned int flags);
int cuDeviceGet(int *device, int ordinal);
int cuDevicePrimaryCtxRetain(void **pctx, int dev);
int cuCtxSetCurrent(void *ctx);
int cuMemAlloc_v2(unsigned long long *dptr, size_t bytesize);
int cuMemsetD8_v2(unsigned long long dstDevice, unsigned char uc, size_t N);
int cuCtxSynchronize(void);
int cuMemFree_v2(unsigned long long dptr);
int cuGetErrorName(int error, const char **pStr);
"""

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "t": 1 << 40, "tib": 1 << 40}


class CudaError(RuntimeError):
    """A CUDA driver call failed."""


def parse_size(text: str) -> int:
    """``"16GiB"`` → 17179869184. Accepts B, KiB, MiB, GiB, TiB (K/M/G/T mean the binary units), KB/MB/GB."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m[2].lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 1GiB, 512MiB, 1073741824)")
    value = float(m[1]) * _UNITS[m[2].lower()]
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return int(value)


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


def hold(nbytes: int, device: int = 0, chunks: int = 1) -> tuple[Any, list[int]]:
    """Allocate ``nbytes`` on ``device`` in ``chunks`` allocations, touch every byte, and return the CUDA handle and
    the device pointers."""
    # NVML numbers GPUs in PCI bus order; make CUDA's ordinals agree so --device means the same GPU in both.
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    cuda = _Cuda()
    cuda.check(cuda.lib.cuInit(0), "cuInit")
    dev = cuda.ffi.new("int *")
    cuda.check(cuda.lib.cuDeviceGet(dev, device), f"cuDeviceGet({device})")
    ctx = cuda.ffi.new("void **")
    cuda.check(cuda.lib.cuDevicePrimaryCtxRetain(ctx, dev[0]), "cuDevicePrimaryCtxRetain")
    cuda.check(cuda.lib.cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent")
    pointers: list[int] = []
    base, extra = divmod(nbytes, chunks)
    for i in range(chunks):
        size = base + (1 if i < extra else 0)
        ptr = cuda.ffi.new("unsigned long long *")
        cuda.check(cuda.lib.cuMemAlloc_v2(ptr, size), f"cuMemAlloc({size})")
        # Touch every byte: an untouched allocation may not be backed yet on every driver.
        cuda.check(cuda.lib.cuMemsetD8_v2(ptr[0], 0xA5, size), "cuMemsetD8")
        pointers.append(int(ptr[0]))
    cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
    return cuda, pointers


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``python -m nvmlcheck.holder``)."""
    parser = argparse.ArgumentParser(prog="python -m nvmlcheck.holder", description="Hold GPU memory until told.")
    parser.add_argument("--bytes", required=True, type=parse_size, help="how much to allocate, e.g. 16GiB")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal (default 0)")
    parser.add_argument("--chunks", type=int, default=1, help="number of separate allocations (default 1)")
    args = parser.parse_args(argv)
    if args.chunks < 1:
        parser.error("--chunks must be at least 1")
    try:
        cuda, pointers = hold(args.bytes, args.device, args.chunks)
    except CudaError as exc:
        print(f"holder: {exc}", file=sys.stderr)
        return 3
    print(f"ready {os.getpid()} {args.bytes} {args.device}", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "free":
            for p in pointers:
                cuda.check(cuda.lib.cuMemFree_v2(p), "cuMemFree")
            cuda.check(cuda.lib.cuCtxSynchronize(), "cuCtxSynchronize")
            print("freed", flush=True)
            return 0
        if command == "exit":
            break
    # Skip interpreter teardown: end like a process that simply exits.
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
