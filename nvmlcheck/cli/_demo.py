"""``nvmlcheck demo``, the first thing a newcomer runs on any machine with a C compiler (here, under cli/: it
prints with the CLI's tables).

A simulated H200 (the bundled stub libnvidia-ml) where a *real* child process holds 16 GiB: the stub lists it while
the child lives, drops it from the process list 90 ms after it dies and gives the memory back 120 ms after (on a
real GPU the list can empty before the memory returns: docs/driver-facts.md). The demo kills the child with
:func:`~nvmlcheck.kill.kill_and_wait` and shows each phase, against the ``sleep 3`` ritual.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

__all__ = ["cmd_demo", "run_demo"]

GIB = 1 << 30
HOLD_BYTES = 16 * GIB
LIST_MS = 90
RELEASE_MS = 120


def cmd_demo(args: argparse.Namespace) -> int:
    """``nvmlcheck demo``."""
    return run_demo(json_output=args.json)


def run_demo(*, json_output: bool = False) -> int:
    """Run the demo; returns the exit code (0 when the wait saw the simulated reclaim)."""
    from .._sim.build import StubBuildError
    from .._sim.scenario import Scenario
    from ..kill import kill_and_wait
    from ..session import open as open_session
    from ..simulate import simulated
    from ._common import SimulationUnavailable, simulation_hint, verdict
    from ._output import device_table, human_bytes, process_table

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(3600)"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
    )
    try:
        scenario = Scenario.h200()
        scenario.add_process(0, child.pid, used_bytes=HOLD_BYTES, bound=True, list_ms=LIST_MS, release_ms=RELEASE_MS)
        with contextlib.ExitStack() as stack:
            try:
                stub = stack.enter_context(simulated(scenario))
            except (StubBuildError, OSError) as exc:  # a cache that cannot be written too
                # Reported by cli._main like any command's (exit 3, an nvmlcheck/error document under --json).
                raise SimulationUnavailable(simulation_hint(exc)) from None
            gpus = stack.enter_context(open_session("nvml", library_path=str(stub.library_path)))
            before = gpus.snapshot()
            # The demo's answer is what it prints: one that cannot be written (a full disk) exits 141, as snapshot's.
            verdict(0, answer_is_output=True)
            if not json_output:
                print("nvmlcheck demo: a simulated NVIDIA H200 (the bundled stub libnvidia-ml; no GPU is touched)")
                print(f"a real child process, pid {child.pid}, holds {human_bytes(HOLD_BYTES)} on GPU 0:\n")
                device_table(before, sys.stdout)
                print()
                process_table(before, sys.stdout)
                print(f"\nnvmlcheck kill {child.pid}  (SIGTERM, then wait until GPU 0 is verified clean)")
            result = kill_and_wait(gpus, [child.pid], timeout=10.0, grace_s=2.0)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    if json_output:
        from ..jsonout import demo_document
        from ._output import marked_simulated, print_json

        print_json(marked_simulated(demo_document(result)))  # as every simulated output says
        return 0
    t = result.pids[0]

    def ms(v: int | None) -> str:
        return "   not seen" if v is None else f"{v / 1e6:8.1f} ms"

    print(f"  signal sent                 {ms(0)}")
    print(f"  pid gone from the OS        {ms(t.exited_ns)}")
    print(f"  pid off the GPU process list{ms(t.off_gpu_ns)}   <- 'no processes' alone would say clean here")
    print(f"  memory back, verified       {ms(result.clean_ns)}   (confirmed {ms(result.confirmed_ns).strip()}, "
          f"resolution {result.resolution_ns / 1e6:.2f} ms)")
    speedup = 3e9 / max(result.confirmed_ns, 1)
    print(f"\nGPU 0 clean after {result.confirmed_ns / 1e9:.3f} s; `sleep 3 && nvidia-smi` would have taken 3 s "
          f"plus a ~20 ms nvidia-smi run ({speedup:.0f}x longer).")
    return 0
