"""What closing a session with a running event listener costs, on the stub (issue 27): the close waits for the one
``nvmlEventSetWait_v2`` in flight, so it takes up to one wait slice (``events.WAIT_SLICE_MS``).

    python benchmarks/event_stop_stub.py        # 30 closes at random points of a slice; prints median and max
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import time

import nvmlcheck as nc
from nvmlcheck import events
from nvmlcheck.testing import Scenario, build_stub


def main() -> None:
    library = str(build_stub())
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NVMLCHECK_STUB_SCENARIO"] = str(Scenario.h200(2).write(os.path.join(tmp, "sc.txt")))
        rng = random.Random(1)
        closes_ms = []
        for _ in range(30):
            gpus = nc.open("nvml", library_path=library)
            gpus.listen()
            time.sleep(0.02 + rng.random() * 0.1)
            start = time.perf_counter()
            gpus.close()
            closes_ms.append((time.perf_counter() - start) * 1e3)
    print(f"WAIT_SLICE_MS={events.WAIT_SLICE_MS}: close with a listener: median {statistics.median(closes_ms):.1f} ms, "
          f"max {max(closes_ms):.1f} ms")


if __name__ == "__main__":
    main()
