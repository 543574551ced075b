#!/bin/bash
# The session's last H200 call (~6 min): per-call cost before/after (benchmarks/compare_nvml.py, this tree against
# the session's base exported to .base/, alternating), one-shot start-up (oneshot.py) and kill launch -> signal
# (kill_speed.py) after the start-up work, ready's ETA with the refitted model (ready_check.py), and the Slurm epilog's reclaim part on real CUDA holders
# (slurm_epilog.py). Here: git archive BASE | (mkdir -p .base && tar -x -C .base); carry .whl and .base.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
HEAD_DIR=$PWD; BASE_DIR=$PWD/.base; W=/tmp/final; mkdir -p "$W"
python3 -m compileall -q "$HEAD_DIR/nvmlcheck" "$HEAD_DIR/benchmarks" "$BASE_DIR/nvmlcheck" "$BASE_DIR/benchmarks"
step() { local name=$1 t=$2; shift 2; local t0=$EPOCHREALTIME
  timeout -k 5 "$t" "$@" > "$W/$name.txt" 2>&1; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]:<18} exit {int(sys.argv[2]):3d} in {float(sys.argv[4]) - float(sys.argv[3]):6.1f} s')" \
    "$name" "$rc" "$t0" "$EPOCHREALTIME" | tee -a "$OUT/steps.txt"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; /usr/bin/python3 --version; date -u; } \
  > "$W/machine.txt" 2>&1
for round in 1 2; do
  for s in base head; do
    dir=$HEAD_DIR; [ $s = base ] && dir=$BASE_DIR
    step "compare_${s}_$round" 90 env PYTHONPATH="/tmp/site:$dir" bash -c 'cd "$0" && exec python3 \
      benchmarks/compare_nvml.py --number 3000 --repeats 5 --json "$1"' "$dir" "$W/compare_${s}_$round.json"
  done
done
export PYTHONPATH=/tmp/site:$HEAD_DIR
step oneshot 150 python3 benchmarks/gpu/oneshot.py --runs 30 --python /usr/bin/python3 --out "$W"
step kill_speed 170 python3 benchmarks/gpu/kill_speed.py --runs 5 --bytes 1GiB --python /usr/bin/python3 \
  --budget-s 120 --out "$W"
step ready 120 python3 benchmarks/gpu/ready_check.py --device 0 --bytes 8GiB --runs 5 --out "$W/ready.json"
step slurm_epilog 120 python3 benchmarks/gpu/slurm_epilog.py --gpus 1 --bytes 8GiB --runs 10 --out "$W"
tail -n 12 "$W"/compare_*_2.txt "$W/oneshot.txt" "$W/kill_speed.txt" "$W/ready.txt" "$W/slurm_epilog.txt"
cp "$W/oneshot.txt" "$W/kill_speed.txt" "$W/ready.txt" "$W/slurm_epilog.txt" "$OUT/" 2>/dev/null
tar czf "$OUT/final.tar.gz" -C "$W" .
exit 0
