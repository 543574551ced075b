#!/bin/bash
# Issue 22 on one GPU (benchmarks/gpu/ready_check.py): ready idle / held / within a kill against an independent
# observer, and the health fields against nvidia-smi -q. About a minute. Run from the repo root, .whl/ carried.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q nvmlcheck benchmarks
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv > "$OUT/machine.txt" 2>&1
timeout 150 python3 benchmarks/gpu/ready_check.py --device 0 --bytes 8GiB --runs 5 --out "$OUT/ready.json"
echo "ready_check exit $?"
