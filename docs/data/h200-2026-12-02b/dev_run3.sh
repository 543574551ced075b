#!/bin/bash
# 2026-12-02 (second session), first call: gpu-tests and the one-shots on cd174d8 (the hung-reading watchdog) against
# the session's start (c06e618), then the README's figures again: kill -> verified clean against `sleep 3 &&
# nvidia-smi | grep MiB` (reclaim_lag.py, the independent raw observer) and the per-call comparison.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/f1; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-40} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
t0=$(date +%s)
timeout 260 python3 benchmarks/gpu/reclaim_lag.py --sizes 1GiB,16GiB,64GiB,120GiB --runs 5 --json "$W/lag.json" > "$W/lag.txt" 2>&1
echo "reclaim_lag exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$W/steps.txt"; tail -16 "$W/lag.txt"
t0=$(date +%s)
timeout 120 python3 benchmarks/compare_nvml.py --number 3000 --repeats 10 --json "$W/compare.json" > "$W/compare.txt" 2>&1
echo "compare_nvml exit $? in $(( $(date +%s) - t0 )) s" | tee -a "$W/steps.txt"; cat "$W/compare.txt" | tail -20
python3 -c '
import statistics, subprocess, time
ts = []
for _ in range(15):
    t = time.perf_counter(); subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"], capture_output=True); ts.append((time.perf_counter() - t) * 1e3)
print("nvidia-smi --query-gpu x15: median %.1f ms, min %.1f, max %.1f" % (statistics.median(ts), min(ts), max(ts)))' | tee -a "$W/steps.txt"
tar czf "$OUT/f1.tar.gz" -C "$W" .
