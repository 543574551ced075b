#!/bin/bash
# Every GPU figure the docs quote, in one device call (device time is scarce): GPU tests, the NVML per-call
# comparison, detection lag against an independent observer, and the reclamation study. Each step has its own time
# cap; outputs stream to $OUT so a cut step still leaves what it measured. Run from the repo root on the GPU host.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=$OUT/results; mkdir -p "$R/plots"
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,memory.reserved --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; uname -r; date -u; } 2>&1 | tee "$R/machine.txt"
python3 -m compileall -q nvmlcheck benchmarks
t0=$(date +%s)
timeout 60 python3 -m pytest tests/gpu --require-gpu -q -p no:cacheprovider -rA 2>&1 | tee "$R/gpu-tests.txt" | tail -16
echo "== compare ($(( $(date +%s) - t0 )) s)"
timeout 80 python3 benchmarks/compare_nvml.py --number 3000 --repeats 10 --json "$R/compare.json" 2>&1 | tee "$R/compare.txt"
echo "== lag ($(( $(date +%s) - t0 )) s)"
timeout 200 python3 benchmarks/gpu/reclaim_lag.py --runs 5 --json "$R/lag.json" > "$R/lag.txt" 2>&1; echo "lag exit $?"
tail -14 "$R/lag.txt"
echo "== study ($(( $(date +%s) - t0 )) s)"
timeout 220 python3 -m nvmlcheck study reclaim --sizes 1GiB,4GiB,16GiB,64GiB,120GiB --repeats 5 --endings KILL,TERM \
  --chunks 4 --run-timeout 20 --out "$R/reclaim.jsonl" --trace --plot "$R/plots" > "$R/reclaim.txt" 2>&1
echo "study exit $? after $(( $(date +%s) - t0 )) s"; tail -62 "$R/reclaim.txt"
tar -C "$OUT" -czf "$OUT/results.tar.gz" results
cp "$R/compare.txt" "$R/lag.txt" "$R/gpu-tests.txt" "$OUT/" 2>/dev/null; rm -rf "$R"
