#!/bin/bash
# Issue 13's before/after on a real GPU, in one device call: the per-call and start-up figures of the tree as it was
# (an export of the base commit in .base/, carried) against this tree, run alternately so drift hits both alike; the
# GPU tests, the model-construction benchmark, and a smoke of the reorganised kill and study paths on this tree.
#   git archive BASE | (mkdir -p .base && tar -x -C .base)   # here, then carry .base and .whl
#   OUT=... bash benchmarks/gpu/run_before_after.sh
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
HEAD_DIR=$PWD; BASE_DIR=$PWD/.base
{ nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv; python3 --version; uname -r; nproc
  date -u; } > "$OUT/machine.txt" 2>&1; cat "$OUT/machine.txt"
python3 -m compileall -q "$HEAD_DIR/nvmlcheck" "$BASE_DIR/nvmlcheck" "$HEAD_DIR/benchmarks" "$BASE_DIR/benchmarks"
t0=$(date +%s); el() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }
side() { (cd "$1" && PYTHONPATH=/tmp/site:$1 "${@:2}"); }

el "gpu tests (this tree)"
side "$HEAD_DIR" timeout 120 python3 -m pytest tests/gpu --require-gpu -q -p no:cacheprovider -rA > "$OUT/gpu-tests.txt" 2>&1
tail -4 "$OUT/gpu-tests.txt"
for round in 1 2 3; do
  for s in base head; do
    dir=$HEAD_DIR; [ $s = base ] && dir=$BASE_DIR
    el "compare_nvml $s round $round"
    side "$dir" timeout 90 python3 benchmarks/compare_nvml.py --number 3000 --repeats 5 \
      --json "$OUT/compare_${s}_$round.json" > "$OUT/compare_${s}_$round.txt" 2>&1 || echo "exit $?"
  done
done
el "construction (this tree)"
side "$HEAD_DIR" timeout 90 python3 benchmarks/construction_nvml.py --repeats 15 --json "$OUT/construction.json" 2>&1 | tail -14
el "wait --timeout 0 and import, alternating"
side "$HEAD_DIR" timeout 150 python3 - "$BASE_DIR" "$HEAD_DIR" "$OUT/startup.json" <<'PY'
import json, os, statistics, subprocess, sys, time
base, head, out = sys.argv[1:4]
pythons = {"venv": sys.executable, "system": "/usr/bin/python3"}
cmds = {"wait0": ["-m", "nvmlcheck", "wait", "--timeout", "0"], "kill_help": ["-m", "nvmlcheck", "kill", "--help"],
        "import_wait": ["-c", "import nvmlcheck.wait"], "bare": ["-c", "pass"]}
res = {}
for pyname, py in pythons.items():
    if not os.path.exists(py):
        continue
    for name, args in cmds.items():
        times = {"base": [], "head": []}
        for _ in range(15):
            for side, d in (("base", base), ("head", head)):
                env = dict(os.environ, PYTHONPATH=f"/tmp/site:{d}")
                t = time.perf_counter_ns()
                subprocess.run([py, *args], cwd=d, env=env, capture_output=True)
                times[side].append((time.perf_counter_ns() - t) / 1e6)
        b, h = statistics.median(times["base"]), statistics.median(times["head"])
        res[f"{pyname}/{name}"] = {"base_ms": b, "head_ms": h, "ratio": h / b, "raw": times}
        print(f"{pyname:7} {name:12} base {b:7.1f} ms  head {h:7.1f} ms  head/base {h / b:.3f}")
json.dump(res, open(out, "w"), indent=1)
PY
el "kill smoke (this tree): a holder killed and verified clean"
side "$HEAD_DIR" bash -c '
  sleep 300 2>/dev/null | python3 -m nvmlcheck.holder --bytes 2GiB --device 0 > /tmp/holder.out 2>&1 & hp=$!  # stdin open
  for i in $(seq 100); do grep -q ready /tmp/holder.out && break; sleep 0.1; done; head -c 300 /tmp/holder.out; echo
  timeout 60 python3 -m nvmlcheck kill $hp --timeout 30 --json > "'"$OUT"'/kill_smoke.json"; echo "kill exit $?"
  head -c 1500 "'"$OUT"'/kill_smoke.json"; echo; pkill -f "^sleep 300" || true'
el "study smoke (this tree)"
side "$HEAD_DIR" timeout 150 python3 -m nvmlcheck study reclaim --sizes 1GiB,8GiB --repeats 3 --endings KILL \
  --out "$OUT/study_smoke.jsonl" > "$OUT/study_smoke.txt" 2>&1; echo "study exit $?"; tail -12 "$OUT/study_smoke.txt"
el "done"
# One file back (the device tool returns a limited number of files).
(cd "$OUT" && tar -czf /tmp/results.tar.gz --exclude=results.tar.gz . && find . -mindepth 1 -delete && mv /tmp/results.tar.gz .)
