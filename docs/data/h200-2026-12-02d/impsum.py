import subprocess, sys, os, statistics
P = "/root/.pyenv/versions/3.12.1/bin/python3.12"
env = dict(os.environ, NVMLCHECK_STUB_SCENARIO="/tmp/h200.txt", LD_LIBRARY_PATH="/work/main/.stub-cache/full-47840988a9a69c8cf25d")
paths = {"base": "/tmp/site312", "head": "/tmp/head312:/tmp/site312"}
res = {k: [] for k in paths}
per = {k: {} for k in paths}
for r in range(30):
    for k, pp in paths.items():
        out = subprocess.run([P, "-X", "importtime", "/tmp/nvc.py", "ready"], env=dict(env, PYTHONPATH=pp), capture_output=True, text=True).stderr
        tot = 0
        for line in out.splitlines():
            if "|" not in line or "self" in line: continue
            a, b, name = line.split("|")
            us = int(a.split(":")[1]); nm = name.strip()
            if nm.startswith("nvmlcheck"):
                tot += us
                per[k].setdefault(nm, []).append(us)
        res[k].append(tot)
for k in res: print(k, "nvmlcheck self sum median us", statistics.median(res[k]))
diffs = []
for nm in sorted(set(per["base"]) | set(per["head"])):
    b = statistics.median(per["base"].get(nm, [0])); h = statistics.median(per["head"].get(nm, [0]))
    diffs.append((h - b, nm, b, h))
for d in sorted(diffs, reverse=True)[:10]: print("%+6.0f %-40s %6.0f %6.0f" % d)
