#!/bin/bash
# The reclamation study, third edition (issue 26; docs/reclaim-study.md "Third edition"), on one GPU in under 9
# minutes: reclaim time against pinned host memory (0, 8, 32 GiB; 64 GiB if time is left) beside 8 GiB (and 64 GiB)
# of device memory, against CUDA IPC importers (1 and 2, the exporter or the importers ended first; 0 and 4 if time is
# left), managed memory, an MPS client (when nvidia-cuda-mps-control exists) and NCCL (needs two GPUs: skipped with
# its reason on one). Every cell 10 measured runs; then `study compare` between neighbours and `study fit`.
#   run from the repo root on the GPU host, .whl/ carried:   bash benchmarks/gpu/run_study3.sh
#   try it anywhere on the stub (a shape, not a measurement): GLOBAL="--simulate h200" REPEATS=3 OUT=/tmp/o \
#       bash benchmarks/gpu/run_study3.sh
# Time: LIMIT (default 470 s from the start) ends the studies; comparisons, the fit and the archive take ~20 s more.
# Each study gets a cap (its --budget: no run starts past it, nor one its cell's last run says would end past it) and
# the studies run in order of importance, so a slow host loses the least important cells. Estimates from the second
# edition: a plain run ~1.1 s (python + cuInit ~0.6 s, ~0.15 s reclaim); pinning at a few GiB/s and unpinning at
# ~0.1 s/GiB (SGLang's figure) make a 32 GiB pinned run ~10-15 s, a 64 GiB one ~20-30 s; an IPC run ~2.5 s.
# Outputs in $OUT (7 files): records.jsonl (every record, appended after each study), runs.txt (each study: exit
# status, time, skip reason), machine.txt, summary.txt, compare.txt, fit.txt, study3.tar.gz (per-study JSONL, text
# and compare JSON).
set -u
if [ -z "${GLOBAL:-}" ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$(date +%s)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${WORK:-/tmp/study3}; rm -rf "$W"; mkdir -p "$W"
REPEATS=${REPEATS:-10}; LIMIT=${LIMIT:-470}; GLOBAL=${GLOBAL:-}; DEV=${DEV:-0}
END=$(( T0 + LIMIT ))
: > "$OUT/records.jsonl"; : > "$OUT/runs.txt"
python3 -m compileall -q nvmlcheck 2>&1 | tail -3
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,memory.reserved --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)"; free -g | head -2; echo "ulimit -l: $(ulimit -l)"; python3 --version
  uname -r; date -u; git rev-parse HEAD 2>/dev/null
  echo "nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo 'not on PATH')"
  python3 -c 'import cffi; print("cffi", cffi.__version__)'
  echo "REPEATS=$REPEATS LIMIT=$LIMIT DEV=$DEV GLOBAL=$GLOBAL"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

left() { echo $(( END - $(date +%s) )); }
# [NEED=S] study NAME CAP OPTIONS...: one `study reclaim` into $W/NAME.jsonl (+ .txt), its records appended to
# records.jsonl; skipped when fewer than NEED (default 15) seconds are left.
study() {
  local name=$1 cap=$2 need=${NEED:-15}; shift 2
  local l; l=$(left)
  if [ "$l" -lt "$need" ]; then
    echo "$name: SKIPPED (time budget spent: $l s left, $need s needed) [$*]" | tee -a "$OUT/runs.txt"; return
  fi
  # The previous study's tail (a killed holder still tearing down) must not fail this one's first baseline.
  # shellcheck disable=SC2086  # GLOBAL is a list of options
  timeout 40 python3 -m nvmlcheck $GLOBAL wait --devices "$DEV" --timeout 30 > /dev/null 2>&1
  l=$(left)
  if [ "$l" -lt 10 ]; then echo "$name: SKIPPED (no time left after waiting for a clean GPU)" | tee -a "$OUT/runs.txt"; return; fi
  local budget=$(( cap < l - 5 ? cap : l - 5 ))
  local t1; t1=$(date +%s)
  # The cap stops new runs; the timeout ends a study one run past it (a 64 GiB pinned run: ~30 s), never past LIMIT.
  local hard=$(( budget + 60 < l ? budget + 60 : l ))
  # shellcheck disable=SC2086
  timeout -k 5 "$hard" python3 -m nvmlcheck $GLOBAL study reclaim --devices "$DEV" --repeats "$REPEATS" --trace \
    --budget "$budget" --ready-timeout 15 --out "$W/$name.jsonl" "$@" > "$W/$name.txt" 2>&1
  local rc=$?
  [ -f "$W/$name.jsonl" ] && cat "$W/$name.jsonl" >> "$OUT/records.jsonl"
  local n=0; [ -f "$W/$name.jsonl" ] && n=$(grep -c '"warmup":false' "$W/$name.jsonl")
  local note; note=$(grep -E "skipped:|stopped early|error:|timed out" "$W/$name.txt" | head -2 | tr '\n' ' ')
  echo "$name: exit $rc, $n measured runs in $(( $(date +%s) - t1 )) s (cap $budget s) at $(( $(date +%s) - T0 )) s [$*] $note" \
    | tee -a "$OUT/runs.txt"
}

P=(--kind pinned --endings KILL)
I=(--kind ipc --endings KILL --sizes 8GiB --no-warmup)
# 1. Pinned host memory beside 8 GiB of device memory: the users' question (SGLang's pinned pool).
study pinned-0-dev8 20 "${P[@]}" --sizes 8GiB --pinned 0
study pinned-8-dev8 60 "${P[@]}" --sizes 8GiB --pinned 8GiB --run-timeout 40
study pinned-32-dev8 170 "${P[@]}" --sizes 8GiB --pinned 32GiB --run-timeout 60 --no-warmup
# 2. CUDA IPC: an exporter and K importers, either side ended first (the other 0.3 s after the first was reaped).
#    No warm-up: every run starts fresh processes, and 8 GiB allocations ran in the studies just before.
study ipc-1-exporter-first 35 "${I[@]}" --importers 1 --first exporter
study ipc-1-importers-first 35 "${I[@]}" --importers 1 --first importers
study ipc-2-exporter-first 35 "${I[@]}" --importers 2 --first exporter
study ipc-2-importers-first 35 "${I[@]}" --importers 2 --first importers
# 3. Managed memory touched on the GPU (8 GiB: far below the free memory; the holder refuses more than free - 7 GiB).
study managed-dev8 20 --kind managed --endings KILL --sizes 8GiB
# 4. MPS (a daemon of the study's own, started and stopped in the run) and NCCL: run or skipped with the reason.
study mps-dev8 30 --kind mps --endings KILL --sizes 8GiB --run-timeout 10
# The study quits its MPS daemon itself; one killed outright would leave it (and its server's memory): quit any left.
for pipe in "${TMPDIR:-/tmp}"/nvmlcheck-mps-*/pipe; do
  [ -e "$pipe/control" ] || continue
  echo "an MPS daemon was left in $pipe: quit" | tee -a "$OUT/runs.txt"
  echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 10 nvidia-cuda-mps-control
done
study nccl-dev8 10 --kind nccl --endings KILL --sizes 8GiB
# 5. If time is left: the exporter alone; 64 GiB of device memory beside; 64 GiB pinned; 4 importers; registration.
study ipc-0 20 "${I[@]}" --importers 0
study pinned-0-dev64 25 "${P[@]}" --sizes 64GiB --pinned 0
study ipc-1-exporter-first-dev64 35 --kind ipc --endings KILL --sizes 64GiB --importers 1 --first exporter --no-warmup
study pinned-8-dev64 70 "${P[@]}" --sizes 64GiB --pinned 8GiB --run-timeout 40
study ipc-4-exporter-first 40 "${I[@]}" --importers 4 --first exporter
NEED=100 study pinned-64-dev8 300 "${P[@]}" --sizes 8GiB --pinned 64GiB --run-timeout 90 --no-warmup
study pinned-8-register-dev8 70 "${P[@]}" --sizes 8GiB --pinned 8GiB --pin-mode register --run-timeout 40
echo "studies done at $(( $(date +%s) - T0 )) s" | tee -a "$OUT/runs.txt"

# Comparisons between neighbours (B - A; 95% bootstrap intervals, seed 26), text and JSON. IPC pairs compare each
# run's last stage (the time from the last signal), whichever side it was.
cmp() {  # cmp NAME A B [options]
  local name=$1 a=$W/$2.jsonl b=$W/$3.jsonl; shift 3
  [ -s "$a" ] && [ -s "$b" ] || { echo "== $name: skipped (missing records)"; return; }
  echo "== $name"
  timeout 20 python3 -m nvmlcheck study compare "$a" "$b" --seed 26 "$@"
  timeout 20 python3 -m nvmlcheck --json study compare "$a" "$b" --seed 26 "$@" > "$W/compare-$name.json"
}
{
  cmp pinned-0-vs-8 pinned-0-dev8 pinned-8-dev8 --across pinned
  cmp pinned-8-vs-32 pinned-8-dev8 pinned-32-dev8 --across pinned
  cmp pinned-32-vs-64 pinned-32-dev8 pinned-64-dev8 --across pinned
  cmp pinned-0-vs-32-exited pinned-0-dev8 pinned-32-dev8 --across pinned --measure exited
  cmp dev8-vs-64-pinned-0 pinned-0-dev8 pinned-0-dev64 --across size
  cmp dev8-vs-64-pinned-8 pinned-8-dev8 pinned-8-dev64 --across size
  cmp pinned-alloc-vs-register pinned-8-dev8 pinned-8-register-dev8 --across pin_mode
  cmp ipc-0-vs-1 ipc-0 ipc-1-exporter-first --across importers,first,role --stage last
  cmp ipc-1-vs-2-exporter-first ipc-1-exporter-first ipc-2-exporter-first --across importers --stage last
  cmp ipc-1-vs-2-importers-first ipc-1-importers-first ipc-2-importers-first --across importers --stage last
  cmp ipc-2-vs-4-exporter-first ipc-2-exporter-first ipc-4-exporter-first --across importers --stage last
  cmp ipc-1-order ipc-1-exporter-first ipc-1-importers-first --across first,role --stage last
  cmp ipc-2-order ipc-2-exporter-first ipc-2-importers-first --across first,role --stage last
  cmp ipc-1-dev8-vs-64 ipc-1-exporter-first ipc-1-exporter-first-dev64 --across size --stage last
  cmp alloc-vs-managed pinned-0-dev8 managed-dev8 --across holder
  cmp alloc-vs-mps pinned-0-dev8 mps-dev8 --across holder,role
} > "$OUT/compare.txt" 2>&1

# Summaries from the records on disk: each study's table, the holders' own step costs (the pinning rate), and what
# an IPC group's first side left held when the last side was ended.
timeout 30 python3 - "$W" > "$OUT/summary.txt" 2>&1 <<'PY'
import sys
from pathlib import Path
from nvmlcheck.study import format_summary, load_records, percentile, summarize
w = Path(sys.argv[1])
for path in sorted(w.glob("*.jsonl")):
    records = load_records(path)
    measured = [r for r in records if not r.warmup]
    print(f"### {path.stem}: {len(measured)} measured runs, {len(records) - len(measured)} warm-ups, "
          f"{sum(r.timed_out for r in records)} timed out{' (FEWER THAN 10)' if len(measured) < 10 else ''}")
    if not records:
        continue
    print(format_summary(summarize(records)))
    steps: dict[str, list[float]] = {}
    held: dict[str, list[int]] = {}
    for r in measured:
        if r.timed_out:
            continue
        last = max(d.signal_ns for d in r.devices) - 10_000_000
        for d in r.devices:
            for k, v in (d.holder_steps or {}).items():
                steps.setdefault(f"{d.role}.{k}", []).append(v / 1e6)
            if len(r.devices) > 1 and d.signal_ns >= last and d.held_at_signal_bytes is not None:
                held.setdefault(d.role, []).append(d.held_at_signal_bytes)
    med = ", ".join(f"{k} {percentile(v, 0.5):.1f}" for k, v in sorted(steps.items()) if not k.endswith(".sim"))
    print(f"holder steps, medians in ms: {med or '-'}")
    pins = steps.get("holder.pin")
    if pins and measured[0].pinned_bytes:
        print(f"pinning rate: {measured[0].pinned_bytes / (1 << 30) / (percentile(pins, 0.5) / 1e3):.2f} GiB/s "
              f"({measured[0].pin_mode})")
    for role, values in held.items():
        print(f"held when the last stage ({role}s) was ended: median {percentile(values, 0.5) / (1 << 30):.2f} GiB "
              f"above the baseline (min {min(values) / (1 << 30):.2f}, max {max(values) / (1 << 30):.2f})")
    print()
PY

# The model: fitted to this edition's records, and to them with the second edition's (several contexts). Both pin
# modes (and, with the second edition, KILL and exit) are fitted as one model, each its own cell: --across says so.
{ echo "== fit: third edition"
  timeout 30 python3 -m nvmlcheck study fit "$OUT/records.jsonl" --across pin_mode
  timeout 30 python3 -m nvmlcheck --json study fit "$OUT/records.jsonl" --across pin_mode > "$W/fit.json"
  echo; echo "== fit: third edition + second edition (docs/data/h200x2-2026-11-30/study2)"
  timeout 30 python3 -m nvmlcheck study fit "$OUT/records.jsonl" docs/data/h200x2-2026-11-30/study2/*.jsonl \
    --across ending,pin_mode
  timeout 30 python3 -m nvmlcheck --json study fit "$OUT/records.jsonl" docs/data/h200x2-2026-11-30/study2/*.jsonl \
    --across ending,pin_mode > "$W/fit-with-second-edition.json"; } > "$OUT/fit.txt" 2>&1
tar -C "$(dirname "$W")" -czf "$OUT/study3.tar.gz" "$(basename "$W")"
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/runs.txt"
cat "$OUT/runs.txt"; tail -25 "$OUT/fit.txt"; ls -l "$OUT"
