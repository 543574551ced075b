#!/bin/bash
# Why some kills' clean stamp trailed the observer's "memory back" by 10-30 ms (run_dec1_speed3/4.sh), and the kill
# with a change to the scans (since reverted): 7 runs each of kill PID, --devices 0, --tree, --cgroup, with each
# target's exit and off-list stamps and the resolution.
# Here: pip wheel --no-deps -w .whl/ . ; carry .whl.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/killdiag; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/cffi-*.whl .whl/pycparser-*.whl || exit 1
rm -rf /tmp/inst-head
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/inst-head .whl/nvmlcheck-*.whl || exit 1
printf '#!/usr/bin/python3\nimport sys\nfrom nvmlcheck.cli import script\nif __name__ == "__main__":\n    sys.exit(script())\n' \
  > /tmp/inst-head/bin/nvmlcheck
/usr/bin/python3 -m compileall -q /tmp/inst-head/nvmlcheck benchmarks
PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/inst-head timeout 200 python3 benchmarks/gpu/kill_speed.py --runs 7 \
  --forms pid,devices,tree,cgroup --bytes 1GiB --python /usr/bin/python3 --script /tmp/inst-head/bin/nvmlcheck --budget-s 150 \
  --out "$W" > "$W/kill_speed.txt" 2>&1
cat "$W/kill_speed.txt"
python3 - "$W/kill_speed.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["runs"]:
    if r["form"] == "bare":
        continue
    sig = r["launch_to_signal_ns"]
    back = r["teardown_ns"]  # signal -> observer's memory back
    t = (r.get("targets") or [{}])[0]
    f = lambda v: "-" if v is None else f"{v / 1e6:7.1f}"
    print(r["form"], "back", f(back), "exited", f(t.get("exited_ns")), "off", f(t.get("off_gpu_ns")), "clean",
          f(r["clean_ns"]), "polls", r.get("polls"), "res", f(r.get("resolution_ns")), "exit-back",
          f(r["exit_after_memory_back_ns"]))
PY
tar czf "$OUT/killdiag.tar.gz" -C "$W" .
