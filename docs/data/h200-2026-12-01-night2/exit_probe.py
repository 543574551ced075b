# The exit of the real console script against the floor's, measured the same way: last line -> EOF -> reaped.
import os, subprocess, sys, time, statistics, resource
sys.path.insert(0, "benchmarks/gpu")
from oneshot import FLOOR
env = dict(os.environ, PYTHONPATH="/tmp/site:/tmp/inst-head")
CASES = {"floor-ready": ["/usr/bin/python3", "-c", FLOOR, "ready"],
         "ready": ["/usr/bin/python3", "/tmp/inst-head/bin/nvmlcheck", "ready"],
         "wait0": ["/usr/bin/python3", "/tmp/inst-head/bin/nvmlcheck", "wait", "--timeout", "0"],
         "ready-noearly": ["/usr/bin/python3", "-c", "import sys; sys.argv=['nvmlcheck','ready']; from nvmlcheck.cli import _common; _common.FAST_EXIT=True; from nvmlcheck.cli import main; _common.verdict_printed(main())"]}
rows = {k: [] for k in CASES}
for rnd in range(int(sys.argv[1])):
    for name, argv in CASES.items():
        t0 = time.monotonic_ns()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
        last = None
        while True:
            line = p.stdout.readline()
            if not line:
                break
            last = time.monotonic_ns()
        eof = time.monotonic_ns()
        _, status, ru = os.wait4(p.pid, 0)
        reaped = time.monotonic_ns()
        rows[name].append(((last - t0) / 1e6, (eof - last) / 1e6, (reaped - last) / 1e6, ru.ru_maxrss / 1024, status))
print(f"{'case':15} {'line ms':>8} {'->eof':>7} {'->reap':>7} {'maxrss MB':>9}  (medians)")
for name, r in rows.items():
    print(f"{name:15} " + " ".join(f"{statistics.median(x[i] for x in r):8.2f}" for i in range(4)), set(x[4] for x in r))
