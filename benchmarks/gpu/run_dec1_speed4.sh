#!/bin/bash
# The fourth closing H200 call, after the clock classes moved to _clocks; otherwise as run_dec1_speed3.sh: one-shots
# and kills of the installed console script, this tree against 39d1599 (the previous session's end), and the
# one-shot timeline.
# Here: pip wheel --no-deps -w .whl/ . ; git archive 39d1599 | tar -x -C .base ; pip wheel --no-deps -w .whl/base
# of that export; carry .whl and .base.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/speed4; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/cffi-*.whl .whl/pycparser-*.whl || exit 1
rm -rf /tmp/inst-head /tmp/inst-base
for v in head base; do
  whl=.whl/nvmlcheck-*.whl; [ $v = base ] && whl=.whl/base/nvmlcheck-*.whl
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/inst-$v $whl || exit 1
  # The console script as a current pip writes it, for the system interpreter (the host's python3 is a venv's).
  printf '#!/usr/bin/python3\nimport sys\nfrom nvmlcheck.cli import script\nif __name__ == "__main__":\n    sys.exit(script())\n' \
    > /tmp/inst-$v/bin/nvmlcheck
  /usr/bin/python3 -m compileall -q /tmp/inst-$v/nvmlcheck
done
/usr/bin/python3 -m compileall -q nvmlcheck benchmarks .base/nvmlcheck .base/benchmarks
export PYTHONUNBUFFERED=1
step() { local name=$1 t=$2; shift 2; local t0=$EPOCHREALTIME
  timeout -k 5 "$t" "$@" > "$W/$name.txt" 2>&1; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]:<18} exit {int(sys.argv[2]):3d} in {float(sys.argv[4]) - float(sys.argv[3]):6.1f} s')" \
    "$name" "$rc" "$t0" "$EPOCHREALTIME" | tee -a "$W/steps.txt"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; /usr/bin/python3 --version; date -u;
  echo "head install has the last change: $(grep -c '_clocks' /tmp/inst-head/nvmlcheck/model.py)"; } \
  > "$W/machine.txt" 2>&1
cat "$W/machine.txt"
for v in head base; do
  mkdir -p "$W/oneshot-$v"
  step oneshot-$v 120 env PYTHONPATH=/tmp/site:/tmp/inst-$v python3 benchmarks/gpu/oneshot.py --runs 30 \
    --python /usr/bin/python3 --script /tmp/inst-$v/bin/nvmlcheck --budget 100 --out "$W/oneshot-$v"
done
step timeline 60 env PYTHONPATH=/tmp/site python3 benchmarks/gpu/oneshot_timeline.py --runs 10 --python /usr/bin/python3 \
  --out "$W"
for v in head base; do
  mkdir -p "$W/kill-$v"
  runs=6; [ $v = base ] && continue  # the base's kills: the second call's figures
  step kill_speed-$v 150 env PYTHONPATH=/tmp/site:/tmp/inst-$v python3 benchmarks/gpu/kill_speed.py --runs $runs \
    --bytes 1GiB --python /usr/bin/python3 --script /tmp/inst-$v/bin/nvmlcheck --budget-s 120 --out "$W/kill-$v"
done
tail -n 12 "$W"/oneshot-*/oneshot.txt 2>/dev/null
for f in "$W"/oneshot-*.txt "$W"/kill_speed-*.txt "$W"/timeline.txt; do
  echo "== $f"; grep -v "#[2-9]" "$f" | tail -n 22; done
tar czf "$OUT/speed4.tar.gz" -C "$W" .
exit 0
