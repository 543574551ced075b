"""Run by test_lifecycle.py in a child process: ``python _interrupted_wait.py nvml|smi FAKE_SMI``.

Waits without a timeout on GPUs that never become clean, announces ``polling`` after the first poll, and on SIGINT
(KeyboardInterrupt) prints one JSON line comparing what was open before the session with what is left after it:
file descriptors, child processes, and the stub's NVML reference count. The environment points nvmlcheck at the stub
(``NVMLCHECK_LIBNVML``, ``NVMLCHECK_STUB_SCENARIO``) or the fake nvidia-smi's knobs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nvmlcheck as nc
from nvmlcheck.testing import StubProbe
from nvmlcheck.wait import TracePoint


def inventory() -> dict[str, list[int]]:
    fds = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    kids: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            kids.update(int(p) for p in (task / "children").read_text().split())
        except OSError:
            continue
    return {"fds": fds, "children": sorted(kids)}


def main() -> int:
    backend, fake = sys.argv[1], sys.argv[2]
    before = inventory()
    announced: list[bool] = []

    def on_poll(_: TracePoint) -> None:
        if not announced:
            announced.append(True)
            print("polling", flush=True)

    try:
        with nc.open(backend, smi_command=[sys.executable, "-S", fake], smi_timeout_s=60) as gpus:
            print("open", flush=True)
            gpus.wait_until_clean(timeout=None, on_poll=on_poll)
    except KeyboardInterrupt:
        after = inventory()
        refcount = None
        if backend == "nvml":
            refcount = StubProbe(os.environ["NVMLCHECK_LIBNVML"]).init_refcount()
        print(json.dumps({"before": before, "after": after, "refcount": refcount}), flush=True)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
