# The early thread's GIL switch interval, and the import order before the early start: A/B in the same rounds.
import os, subprocess, sys, time, statistics, random
sys.path.insert(0, "benchmarks/gpu")
from oneshot import FLOOR
env = dict(os.environ, PYTHONPATH="/tmp/site:/tmp/inst-head")
PY = "/usr/bin/python3"
def wrapper(si):
    return ("import sys\nfrom nvmlcheck._nvml import library\n"
            f"library._EARLY_SWITCH_INTERVAL_S = {si}\nfrom nvmlcheck.cli import script\nsys.exit(script())\n")
CASES = {"nvidia-smi": ["nvidia-smi", "--query-gpu=memory.used", "--format=csv"],
         "floor-ready": [PY, "-c", FLOOR, "ready"]}
for cmd in (["ready"], ["wait", "--timeout", "0"]):
    CASES[f"{cmd[0]} script"] = [PY, "/tmp/inst-head/bin/nvmlcheck", *cmd]
    for si in ("0.0001", "0.00002", "0.000005"):
        CASES[f"{cmd[0]} lib-first si={si}"] = [PY, "-c", wrapper(si), *cmd]
rows = {k: [] for k in CASES}
n = int(sys.argv[1])
for rnd in range(n):
    order = list(CASES.items()); random.shuffle(order)
    for name, argv in order:
        t0 = time.monotonic_ns()
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, env=env)
        rows[name].append((time.monotonic_ns() - t0) / 1e6)
        assert r.returncode == 0, (name, r.returncode)
smi = statistics.median(rows["nvidia-smi"])
print(f"{'case':32} {'median':>7} {'p25':>7} {'p75':>7} {'/smi':>6}   ({n} rounds, shuffled within each)")
for name, r in rows.items():
    q = statistics.quantiles(r, n=4)
    print(f"{name:32} {statistics.median(r):7.2f} {q[0]:7.2f} {q[2]:7.2f} {statistics.median(r)/smi:6.3f}")
for cmd in ("ready", "wait"):
    ref = rows[f"{cmd} script"]
    for si in ("0.0001", "0.00002", "0.000005"):
        d = [a - b for a, b in zip(rows[f"{cmd} lib-first si={si}"], ref)]
        q = statistics.quantiles(d, n=4)
        print(f"{cmd} lib-first si={si} minus script, per round: {statistics.median(d):+.2f} ({q[0]:+.2f}..{q[2]:+.2f})")
