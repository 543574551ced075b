"""Start-up cost of the CLI on a loaded machine without a GPU: CPU time and modules, not wall clock.

For each one-shot command (``wait --timeout 0``, ``snapshot``, ``ready``, on the stub libnvidia-ml), the CPU time
(user + system, ``getrusage(RUSAGE_CHILDREN)`` around each run) of the whole process; for each ``kill`` form, the
CPU time of the process from its start up to the first signal (the signal call is wrapped: it records the CPU clock
and the number of modules loaded, then ends the process), against a bare interpreter's ``os.kill``. Min and median
of ``--runs`` runs, interleaved. CPU time is what a loaded 2-core box can measure; the wall-clock figures on a GPU
host are benchmarks/gpu/oneshot.py's and benchmarks/gpu/kill_speed.py's.

    python benchmarks/startup_cpu.py --runs 30 [--python /usr/bin/python3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs the nvmlcheck script as the console script does, with the first signal wrapped: at it, write the process's
# CPU time and module count to the file named by $STARTUP_OUT and end at once (the target is reaped by the caller).
KILL_WRAPPER = r"""
import os, sys, signal, time
def _at_signal(real):
    def call(*a):
        real(*a)
        if a[1] == 0:  # an existence probe, not the signal
            return
        t = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
        with open(os.environ["STARTUP_OUT"], "w") as f:
            f.write(f"{t * 1e3:.3f} {len(sys.modules)}")
        os._exit(0)
    return call
os.kill = _at_signal(os.kill)
import _signal  # nvmlcheck._proc.signals sends through _signal, the module signal wraps
for _mod in (signal, _signal):
    if hasattr(_mod, "pidfd_send_signal"):
        _mod.pidfd_send_signal = _at_signal(_mod.pidfd_send_signal)
sys.argv = ["nvmlcheck", *sys.argv[1:]]
from nvmlcheck.cli import script
script()
"""
BARE_KILL = r"""
import os, sys, signal, time
os.kill(int(sys.argv[1]), 15)
t = time.clock_gettime(time.CLOCK_PROCESS_CPUTIME_ID)
with open(os.environ["STARTUP_OUT"], "w") as f:
    f.write(f"{t * 1e3:.3f} {len(sys.modules)}")
"""


def child_cpu_ms(argv: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1e3


def modules_of(argv: list[str], env: dict[str, str]) -> int:
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], env=env, capture_output=True, text=True,
                          check=False, timeout=60)
    return sum(1 for line in done.stderr.splitlines() if line.startswith("import time:") and "|" in line
               and "cumulative" not in line)


def kill_once(py: str, form: list[str], env: dict[str, str], token: str) -> tuple[float, int]:
    target = subprocess.Popen([py, "-S", "-c", "import time; time.sleep(60)", token])
    try:
        out = Path(env["STARTUP_OUT"])
        out.unlink(missing_ok=True)
        words = [w.replace("{pid}", str(target.pid)).replace("{token}", token) for w in form]
        script = BARE_KILL if words == ["bare"] else KILL_WRAPPER
        args = [str(target.pid)] if words == ["bare"] else words
        subprocess.run([py, "-c", script, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=False, timeout=60)
        cpu, mods = out.read_text().split()
        return float(cpu), int(mods)
    finally:
        target.kill()
        target.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    py = args.python
    subprocess.run([py, "-m", "compileall", "-q", str(ROOT / "nvmlcheck")], check=False)
    from nvmlcheck._sim.build import build_stub
    from nvmlcheck.testing import Scenario

    tmp = Path(tempfile.mkdtemp(prefix="startup-cpu-"))
    scenario = tmp / "scenario.txt"
    Scenario.h200(devices=2).write(scenario)
    env = dict(os.environ, NVMLCHECK_LIBNVML=str(build_stub()), NVMLCHECK_STUB_SCENARIO=str(scenario),
               PYTHONPATH=str(ROOT), STARTUP_OUT=str(tmp / "at-signal.txt"))
    env.pop("NVMLCHECK_STUB_LOG", None)
    oneshots = {
        "python -c pass": [py, "-c", "pass"],
        "wait --timeout 0": [py, "-m", "nvmlcheck", "wait", "--timeout", "0"],
        "snapshot": [py, "-m", "nvmlcheck", "snapshot"],
        "ready": [py, "-m", "nvmlcheck", "ready"],
        "--json wait --timeout 0": [py, "-m", "nvmlcheck", "--json", "wait", "--timeout", "0"],
    }
    kills = {
        "bare os.kill": ["bare"],
        "kill PID": ["kill", "{pid}"],
        "kill --devices 0 PID": ["kill", "--devices", "0", "{pid}"],
        "kill --tree PID": ["kill", "--tree", "{pid}"],
        "kill --match TOKEN": ["kill", "--match", "{token}", "--yes"],
        "kill --json PID": ["--json", "kill", "{pid}"],
    }
    cpu: dict[str, list[float]] = {name: [] for name in [*oneshots, *kills]}
    mods: dict[str, int] = {name: modules_of(argv, env) for name, argv in oneshots.items()}
    for i in range(args.runs):
        for name, argv in oneshots.items():
            cpu[name].append(child_cpu_ms(argv, env))
        for name, form in kills.items():
            ms, count = kill_once(py, form, env, f"startup-token-{os.getpid()}-{i}")
            cpu[name].append(ms)
            mods[name] = count
    print(f"{'command':28} {'min ms':>8} {'median':>8} {'modules':>8}   (CPU time, {args.runs} runs, {py})")
    for name, values in cpu.items():
        kind = " (sys.modules at the signal)" if name in kills else ""
        print(f"{name:28} {min(values):8.1f} {statistics.median(values):8.1f} {mods[name]:8d}{kind}")
    if args.json:
        Path(args.json).write_text(json.dumps({"python": py, "runs": args.runs, "cpu_ms": cpu, "modules": mods},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
