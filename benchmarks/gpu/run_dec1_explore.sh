#!/bin/bash
# Where the one-shot and kill milliseconds go on the H200 (a short call before the start-up work of this session):
# the exit's cost with NVML open (exit_cost.py), per-module import times and per-call costs (startup_profile.py),
# and the one-shot and kill figures of the installed console script (pip install of the wheel carried in .whl/).
# Here: pip wheel --no-deps -w .whl/ . ; carry .whl.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/cffi-*.whl .whl/pycparser-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/inst .whl/nvmlcheck-*.whl || exit 1
python3 -m compileall -q nvmlcheck benchmarks
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/inst
step() { local name=$1 t=$2; shift 2; local t0=$EPOCHREALTIME
  timeout -k 5 "$t" "$@" > "$OUT/$name.txt" 2>&1; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]:<18} exit {int(sys.argv[2]):3d} in {float(sys.argv[4]) - float(sys.argv[3]):6.1f} s')" \
    "$name" "$rc" "$t0" "$EPOCHREALTIME" | tee -a "$OUT/steps.txt"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; /usr/bin/python3 --version; date -u;
  head -3 /tmp/inst/bin/nvmlcheck; } > "$OUT/machine.txt" 2>&1
step exit_cost 60 python3 benchmarks/gpu/exit_cost.py --runs 20 --python /usr/bin/python3 --out "$OUT"
step startup_profile 90 python3 benchmarks/gpu/startup_profile.py --python /usr/bin/python3 --out "$OUT"
step oneshot 100 python3 benchmarks/gpu/oneshot.py --runs 20 --python /usr/bin/python3 --script /tmp/inst/bin/nvmlcheck \
  --budget 80 --out "$OUT"
step kill_speed 120 python3 benchmarks/gpu/kill_speed.py --runs 3 --bytes 1GiB --python /usr/bin/python3 \
  --script /tmp/inst/bin/nvmlcheck --budget-s 90 --out "$OUT"
tail -n 12 "$OUT/exit_cost.txt" "$OUT/startup_profile.txt" "$OUT/oneshot.txt" "$OUT/kill_speed.txt"
exit 0
