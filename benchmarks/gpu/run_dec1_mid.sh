#!/bin/bash
# A short H200 call in the middle of the start-up work: the installed console script's one-shots and kills, and the
# one-shot timeline. Here: pip wheel --no-deps -w .whl/ . ; carry .whl.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; W=/tmp/mid; mkdir -p "$W"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/cffi-*.whl .whl/pycparser-*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/inst .whl/nvmlcheck-*.whl || exit 1
# The console script as a current pip writes it, for the system interpreter (the host's python3 is a venv's).
printf '#!/usr/bin/python3\nimport sys\nfrom nvmlcheck.cli import script\nif __name__ == "__main__":\n    sys.exit(script())\n' \
  > /tmp/inst/bin/nvmlcheck
/usr/bin/python3 -m compileall -q /tmp/inst/nvmlcheck nvmlcheck benchmarks
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:/tmp/inst
step() { local name=$1 t=$2; shift 2; local t0=$EPOCHREALTIME
  timeout -k 5 "$t" "$@" > "$W/$name.txt" 2>&1; local rc=$?
  python3 -c "import sys; print(f'{sys.argv[1]:<18} exit {int(sys.argv[2]):3d} in {float(sys.argv[4]) - float(sys.argv[3]):6.1f} s')" \
    "$name" "$rc" "$t0" "$EPOCHREALTIME" | tee -a "$W/steps.txt"; }
step oneshot 100 python3 benchmarks/gpu/oneshot.py --runs 20 --python /usr/bin/python3 --script /tmp/inst/bin/nvmlcheck \
  --budget 80 --out "$W"
step timeline 60 env PYTHONPATH=/tmp/site python3 benchmarks/gpu/oneshot_timeline.py --runs 8 --python /usr/bin/python3 --out "$W"
step kill_speed 120 python3 benchmarks/gpu/kill_speed.py --runs 3 --bytes 1GiB --python /usr/bin/python3 \
  --script /tmp/inst/bin/nvmlcheck --budget-s 90 --out "$W"
cat "$W/oneshot.txt" "$W/timeline.txt" "$W/kill_speed.txt" | grep -v "#[2-9]"
tar czf "$OUT/mid.tar.gz" -C "$W" .
exit 0
