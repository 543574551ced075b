#!/bin/bash
# Issues 10 and 12 on real GPUs, in one device call: the GPU tests, the CLI's launch path (launch -> signal,
# signal -> clean, clean -> exit; wait --timeout 0 against nvidia-smi and a bare nvmlInit) with the PyTorch venv's
# python3 and the system python3, the smi backend's kill, a TP-N-like tree ended four ways (kill_tree.py), and the
# detection lag against the independent observer. Run from the repo root on the GPU host, .whl/ carried.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; python3 --version; command -v python3
  ls /usr/bin/python3*; /usr/bin/python3 --version; uname -r; nproc; date -u; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
python3 -m compileall -q nvmlcheck benchmarks
t0=$(date +%s); el() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
el "gpu tests"
timeout 120 python3 -m pytest tests/gpu --require-gpu -q -p no:cacheprovider 2>&1 | tail -4
el "launch, venv python3"
timeout 150 python3 benchmarks/cli_launch.py --runs 15 --bytes 1GiB --json "$OUT/launch_venv.json" 2>&1 | tail -14
if /usr/bin/python3 -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  el "launch, system python3"
  timeout 120 python3 benchmarks/cli_launch.py --runs 15 --bytes 1GiB --python /usr/bin/python3 \
    --json "$OUT/launch_sys.json" 2>&1 | tail -14
  el "launch, system python3, text output"
  timeout 100 python3 benchmarks/cli_launch.py --runs 10 --bytes 1GiB --python /usr/bin/python3 --text \
    --json "$OUT/launch_sys_text.json" 2>&1 | tail -14
  el "launch, system python3, python -m nvmlcheck"
  timeout 100 python3 benchmarks/cli_launch.py --runs 10 --bytes 1GiB --python /usr/bin/python3 --entry module \
    --json "$OUT/launch_sys_module.json" 2>&1 | tail -14
fi
el "launch, smi backend"
timeout 120 python3 benchmarks/cli_launch.py --runs 5 --bytes 1GiB --backend smi --json "$OUT/launch_smi.json" 2>&1 | tail -14
el "kill tree"
timeout 240 python3 benchmarks/gpu/kill_tree.py --gpus "$(nvidia-smi -L | wc -l)" --bytes 8GiB --out "$OUT" 2>&1 | tail -12
if [ "${LAG:-0}" = 1 ]; then
  el "lag"
  timeout 150 python3 benchmarks/gpu/reclaim_lag.py --sizes 1GiB,16GiB --runs 3 --json "$OUT/lag.json" > "$OUT/lag.txt" 2>&1
  tail -14 "$OUT/lag.txt"
fi
el "done"
