#!/bin/bash
# Issues 22/27 on one H200 in one device call (~6 min): the GPU test suite, health against nvidia-smi -q, ready
# (idle / held / within a kill, benchmarks/gpu/ready_check.py), one-shot start-up against nvidia-smi (oneshot.py),
# which device files NVML-only clients keep open (agent_device_files.py), the event listener's slice
# (event_slice.py). Run from the repo root with .whl/ carried; everything lands in $OUT (at most 8 files).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -m compileall -q nvmlcheck benchmarks
W=/tmp/b; mkdir -p "$W"
step() { local name=$1 t=$2; shift 2; local t0=$EPOCHREALTIME
  timeout -k 5 "$t" "$@" > "$W/$name.txt" 2>&1; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]:<12} exit {int(sys.argv[2]):3d} in {float(sys.argv[4]) - float(sys.argv[3]):6.1f} s')" \
    "$name" "$rc" "$t0" "$EPOCHREALTIME" | tee -a "$OUT/steps.txt"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv; python3 --version;
  git rev-parse HEAD 2>/dev/null; date -u; } > "$W/machine.txt" 2>&1
step gpu-tests 150 python3 -m pytest -q -p no:cacheprovider tests/gpu -x --require-gpu
step health 30 bash -c 'nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT; python3 -m nvmlcheck --json snapshot'
step ready 150 python3 benchmarks/gpu/ready_check.py --device 0 --bytes 8GiB --runs 5 --out "$W/ready.json"
step oneshot 150 python3 benchmarks/gpu/oneshot.py --runs 30 --python /usr/bin/python3 --out "$W"
step agents 60 env OUT="$W" python3 benchmarks/gpu/agent_device_files.py
step evslice 60 python3 benchmarks/gpu/event_slice.py --out "$W"
tail -n 25 "$W"/ready.txt "$W"/oneshot.txt 2>/dev/null | tail -n 60
tar czf "$OUT/b.tar.gz" -C "$W" .
cp "$W/oneshot.txt" "$W/ready.txt" "$W/gpu-tests.txt" "$OUT/" 2>/dev/null
exit 0
