#!/bin/bash
# The per-call comparison and the detection-lag runs only (docs/performance.md); run_final.sh runs everything.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q nvmlcheck benchmarks
timeout 60 python3 -m pytest tests/gpu --require-gpu -q -p no:cacheprovider 2>&1 | tail -3
timeout 90 python3 benchmarks/compare_nvml.py --number 3000 --repeats 10 --json "$OUT/compare.json" 2>&1 | tee "$OUT/compare.txt"
timeout 120 python3 benchmarks/gpu/reclaim_lag.py --runs 5 --json "$OUT/lag.json" > "$OUT/lag.txt" 2>&1; echo "lag exit $?"; tail -14 "$OUT/lag.txt"
