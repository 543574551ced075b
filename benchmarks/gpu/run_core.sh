#!/bin/bash
# One device call for the core figures: GPU tests, then the NVML per-call comparison. Outputs land in $OUT.
#   run from the repo root on the GPU host (see docs/performance.md); needs .whl/ from ../shared/gpu-host/fetch-wheels.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.reserved --format=csv
lscpu | grep -E "Model name|^CPU\(s\)" ; python3 --version
python3 -m compileall -q nvmlcheck benchmarks
python3 -m pytest tests/gpu --require-gpu -q -p no:cacheprovider -rA -x 2>&1 | tee "$OUT/gpu-tests.txt" | tail -25
python3 benchmarks/compare_nvml.py --json "$OUT/compare.json" 2>&1 | tee "$OUT/compare.txt"
python3 -m pytest benchmarks/bench_nvml.py --benchmark-enable -q -p no:cacheprovider --benchmark-columns=min,median \
  --benchmark-json="$OUT/bench_nvml.json" 2>&1 | grep -E "^test_|passed|failed" | tee "$OUT/bench_nvml.txt"
python3 -m nvmlcheck snapshot; python3 -m nvmlcheck --backend smi snapshot; python3 -m nvmlcheck snapshot procs
