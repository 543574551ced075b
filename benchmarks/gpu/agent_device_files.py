"""Which NVIDIA device files monitoring processes keep open (issue 27, item 11), on a real GPU host.

Starts, each for a few seconds: `nvidia-smi -l 1`, `nvidia-smi dmon`, a Python process that only initialises NVML
through nvmlcheck and polls it, and (if CUDA is importable) a process with a CUDA context; then lists, from
/proc/PID/fd, every open file whose target is a character device of major 195 or an `nvidia*` major of /proc/devices,
with its major:minor. Proves (or refutes) that NVML-only clients hold `/dev/nvidiactl` and no `/dev/nvidiaN` (what
`kill --all-holders` now relies on to leave them alone as "holds no GPU"), and shows what a CUDA process holds.
Writes $OUT/agent_device_files.json; bounded to about 40 s. Run: python benchmarks/gpu/agent_device_files.py
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nvmlcheck._proc.devfiles import nvidia_majors

OUT = Path(os.environ.get("OUT", "."))
NVML_POLL = ("import time, nvmlcheck as nc\n"
             "with nc.open('nvml') as g:\n"
             "    end = time.monotonic() + 30\n"
             "    while time.monotonic() < end:\n"
             "        g.snapshot(); time.sleep(0.5)\n")
CUDA_CTX = ("import time, ctypes\n"
            "cuda = ctypes.CDLL('libcuda.so.1'); cuda.cuInit(0); ctx = ctypes.c_void_p(); dev = ctypes.c_int()\n"
            "cuda.cuDeviceGet(ctypes.byref(dev), 0); cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)\n"
            "time.sleep(30)\n")


def nvidia_files(pid: int, majors: frozenset[int]) -> list[str] | None:
    """The NVIDIA device files ``pid`` has open; None when its fd table cannot be read (it exited, or is a zombie)."""
    out = []
    base = f"/proc/{pid}/fd"
    try:
        names = os.listdir(base)
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    for name in names:
        try:
            target = os.readlink(f"{base}/{name}")
            st = os.stat(f"{base}/{name}")
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) in majors:
            out.append(f"{target} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}")
    return sorted(set(out))


def probe(p: subprocess.Popen[bytes], majors: frozenset[int]) -> dict[str, object]:
    """What a running probe holds; a probe that exited before its fd table was read is recorded as exited (its exit
    status; ``files`` None), not a crash."""
    files = nvidia_files(p.pid, majors)
    code = p.poll()
    if files is None or code is not None:
        return {"alive": False, "exit": code, "files": None}
    return {"alive": True, "exit": None, "files": files}


def main() -> None:
    majors = nvidia_majors()
    cases = {
        "nvidia-smi -l 1": ["nvidia-smi", "-l", "1"],
        "nvidia-smi dmon": ["nvidia-smi", "dmon"],
        "nvmlcheck NVML poll": [sys.executable, "-c", NVML_POLL],
        "CUDA context": [sys.executable, "-c", CUDA_CTX],
    }
    results: dict[str, object] = {"majors": sorted(majors)}
    for label, argv in cases.items():
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        try:
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        except OSError as exc:
            results[label] = f"not started: {exc}"
            continue
        try:
            time.sleep(4)
            results[label] = probe(p, majors)
        finally:
            p.kill()
            p.wait()
            if p.stderr is not None:
                err = p.stderr.read().decode(errors="replace").strip()
                entry = results.get(label)
                if isinstance(entry, dict) and entry["exit"] is not None and err:
                    entry["stderr"] = err[-500:]  # why it exited before it was read
                p.stderr.close()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "agent_device_files.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
