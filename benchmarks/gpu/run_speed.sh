#!/bin/bash
# The start-up round's H200 calls (issues 22 item 5, 23 item 4) in one script: the installed console script of this
# tree (and of a base) timed as a user runs it. Usage, from the repo root on the GPU host:
#   bash benchmarks/gpu/run_speed.sh STEP...      (results in $W, default /tmp/speed; a tarball in $OUT)
# Steps: oneshot (oneshot.py --runs ${ONESHOT_RUNS:-30}, this tree and the base in the same rounds), timeline
#   (oneshot_timeline.py --runs 10 on the tree), kill (kill_speed.py --runs ${KILL_RUNS:-6} on this tree; $FORMS, e.g.
#   pid,devices, limits the forms), kill-base (the same on the base, 3 runs), exit (exit_cost.py --runs 15), profile
#   (startup_profile.py), compare (compare_nvml.py, base and tree alternating, two rounds), gpu-tests
#   (pytest tests/gpu --require-gpu). The calls of 2026-12-01: explore = profile exit oneshot kill (with the host
#   venv's pip, see docs/performance.md), mid = oneshot timeline kill, speed2 = oneshot timeline kill kill-base exit
#   compare gpu-tests, speed3 and speed4 = oneshot timeline kill, killdiag = kill with FORMS and KILL_RUNS=7 or 8.
# Here: pip wheel --no-deps -w .whl/ . ; for the base (39d1599): git archive 39d1599 | tar -x -C .base and
# pip wheel --no-deps -w .whl/base .base ; carry .whl and .base.
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/speed}; mkdir -p "$OUT" "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/cffi-*.whl .whl/pycparser-*.whl || exit 1
# pip --target does not replace a package already there (a warm machine keeps /tmp): install afresh.
rm -rf /tmp/inst-head /tmp/inst-base
for v in head base; do
  whl=.whl/nvmlcheck-*.whl; [ $v = base ] && whl=.whl/base/nvmlcheck-*.whl
  ls $whl >/dev/null 2>&1 || continue
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/inst-$v $whl || exit 1
  # The console script as a current pip writes it, for the system interpreter (the host's python3 is PyTorch's venv).
  printf '#!/usr/bin/python3\nimport sys\nfrom nvmlcheck.cli import script\nif __name__ == "__main__":\n    sys.exit(script())\n' \
    > /tmp/inst-$v/bin/nvmlcheck
  /usr/bin/python3 -m compileall -q /tmp/inst-$v/nvmlcheck
done
/usr/bin/python3 -m compileall -q nvmlcheck benchmarks
[ -d .base/nvmlcheck ] && /usr/bin/python3 -m compileall -q .base/nvmlcheck .base/benchmarks
export PYTHONUNBUFFERED=1
step() { local name=$1 t=$2; shift 2; local t0=$EPOCHREALTIME
  timeout -k 5 "$t" "$@" > "$W/$name.txt" 2>&1; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]:<18} exit {int(sys.argv[2]):3d} in {float(sys.argv[4]) - float(sys.argv[3]):6.1f} s')" \
    "$name" "$rc" "$t0" "$EPOCHREALTIME" | tee -a "$W/steps.txt"; }
kill_speed() { local v=$1 runs=$2; mkdir -p "$W/kill-$v"
  step kill_speed-$v 200 env PYTHONPATH=/tmp/site:/tmp/inst-$v python3 benchmarks/gpu/kill_speed.py --runs "$runs" \
    ${FORMS:+--forms "$FORMS"} --bytes 1GiB --python /usr/bin/python3 --script /tmp/inst-$v/bin/nvmlcheck \
    --budget-s 180 --out "$W/kill-$v"; }
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; /usr/bin/python3 --version; date -u;
  git log -1 --format='tree %h %s' 2>/dev/null; } > "$W/machine.txt" 2>&1
cat "$W/machine.txt"
for s in "$@"; do
  case $s in
    oneshot) mkdir -p "$W/oneshot"
      base=(); [ -d /tmp/inst-base ] && base=(--base-script /tmp/inst-base/bin/nvmlcheck
        --base-path /tmp/site:/tmp/inst-base)
      step oneshot 200 env PYTHONPATH=/tmp/site python3 benchmarks/gpu/oneshot.py --runs "${ONESHOT_RUNS:-30}" \
        --python /usr/bin/python3 --script /tmp/inst-head/bin/nvmlcheck --path /tmp/site:/tmp/inst-head "${base[@]}" --budget 170 \
        --out "$W/oneshot" ;;
    timeline) step timeline 60 env PYTHONPATH=/tmp/site python3 benchmarks/gpu/oneshot_timeline.py --runs 10 \
        --python /usr/bin/python3 --out "$W" ;;
    kill) kill_speed head "${KILL_RUNS:-6}" ;;
    kill-base) kill_speed base 3 ;;
    exit) step exit_cost 60 python3 benchmarks/gpu/exit_cost.py --runs 15 --python /usr/bin/python3 --out "$W" ;;
    profile) step startup_profile 60 env PYTHONPATH=/tmp/site python3 benchmarks/gpu/startup_profile.py \
        --python /usr/bin/python3 --out "$W" ;;
    compare) for r in 1 2; do for v in base head; do
        dir=$PWD; [ $v = base ] && dir=$PWD/.base
        step compare_${v}_$r 90 env PYTHONPATH="/tmp/site:$dir" bash -c 'cd "$0" && exec python3 \
          benchmarks/compare_nvml.py --number 3000 --repeats 5 --json "$1"' "$dir" "$W/compare_${v}_$r.json"
      done; done ;;
    gpu-tests) step gpu-tests 150 env PYTHONPATH=/tmp/site python3 -m pytest -q -p no:cacheprovider tests/gpu -x \
        --require-gpu ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
for f in "$W"/*.txt; do echo "== $f"; grep -v "#[2-9]" "$f" | tail -n 22; done
tar czf "$OUT/$(basename "$W").tar.gz" -C "$W" .
exit 0
