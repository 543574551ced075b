#!/bin/bash
# The reclamation study, second edition (issue 18; docs/reclaim-study.md "Second edition"), on a 2-GPU host in under
# 6 minutes: the floor (a context, no allocation), KILL vs exit vs free at 1 and 16 GiB with the holder's own step
# costs, cuCtxDestroy before exit, and one GPU at a time vs two at once. Every run records its phases (leader zombie,
# pidfd exit, device files closed, off the list, memory back, reaped) with their sampling windows.
#   run from the repo root on the GPU host:  OUT=/some/dir bash benchmarks/gpu/run_study2.sh
#   needs Python 3.12 with cffi (wheels in .whl/ are installed to /tmp/site) and matplotlib for the plots.
#   REPEATS (default 10) measured runs per cell; BUDGET (default 330 s) caps the studies: a study that would start
#   with less than 20 s left is skipped and listed in skipped.txt, one cut by the cap keeps the runs it completed
#   (records are streamed). The studies run in order of importance: floor, endings, concurrency, destroy, extras.
#   The first edition's runs took 1-3 s each (holder start and cuInit dominate): 10 repeats + 1 warm-up per cell
#   gives ~120 runs for the first three groups.
# Outputs: $OUT/study2.tar.gz (every JSONL, printed summary, compare output and plot) and, readable at once,
# $OUT/summary.txt, $OUT/compare.txt, $OUT/steps.txt, $OUT/machine.txt.
set -u
if [ -z "${GLOBAL:-}" ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; R=$OUT/study2; mkdir -p "$R/plots"
REPEATS=${REPEATS:-10}; BUDGET=${BUDGET:-330}
{ nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,memory.reserved --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; uname -r; date -u; git rev-parse HEAD 2>/dev/null
  echo "REPEATS=$REPEATS BUDGET=$BUDGET"; } 2>&1 | tee "$R/machine.txt"
python3 -c 'import cffi; print("cffi", cffi.__version__)' || exit 1
PLOT=1; python3 -c 'import matplotlib; print("matplotlib", matplotlib.__version__)' || PLOT=0
# Every GPU (runs unchanged on 8). GLOBAL: options before the command, e.g. GLOBAL="--simulate h200x8" GPUS=0,1 to
# try the script anywhere on the stub (its figures are the stub's, not a driver's).
GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd, -)}; GLOBAL=${GLOBAL:-}

t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
# study NAME OPTIONS...: one `study reclaim` into $R/NAME.jsonl (+ .txt, plots/NAME/), capped by the time left.
study() {
  local name=$1; shift
  local l; l=$(left)
  if [ "$l" -lt 20 ]; then echo "SKIPPED $name ($*): time budget spent" | tee -a "$R/skipped.txt"; return; fi
  local plot=(); [ "$PLOT" = 1 ] && plot=(--plot "$R/plots/$name")
  # shellcheck disable=SC2086  # GLOBAL is a list of options
  timeout "$l" python3 -m nvmlcheck $GLOBAL study reclaim --repeats "$REPEATS" --run-timeout 10 --trace \
    --out "$R/$name.jsonl" "${plot[@]}" "$@" > "$R/$name.txt" 2>&1
  echo "$name: exit $? at $(( $(date +%s) - t0 )) s ($*)" | tee -a "$R/runs.txt"
}

# 1. The floor: a process with a context and no allocation (what every CUDA process pays).
study floor-KILL --devices 0 --holder context --endings KILL
study floor-exit --devices 0 --holder context --endings exit
# 2. Endings at 1 and 16 GiB, one file per (size, ending) so `compare --across ending` pairs them cleanly.
for size in 1GiB 16GiB; do
  for ending in KILL exit free; do
    study "alloc-$size-$ending" --devices 0 --sizes "$size" --endings "$ending"
  done
done
# 3. Concurrency at 16 GiB: each GPU alone, in turn, vs every GPU's holder killed at the same instant.
study one-gpu-16GiB-KILL --devices "$GPUS" --concurrent none --sizes 16GiB --endings KILL
study all-gpus-16GiB-KILL --devices "$GPUS" --concurrent gpus --sizes 16GiB --endings KILL
# 4. The holder destroys its context itself before exiting (its own cost recorded as end.destroy).
for size in 1GiB 16GiB; do study "destroy-$size-exit" --devices 0 --holder destroy --sizes "$size" --endings exit; done
# 5. If time is left: work queued on streams at the kill, several contexts, several holders on one GPU.
study streams-1GiB-KILL --devices 0 --holder streams --count 4 --sizes 1GiB --endings KILL
study contexts-1GiB-KILL --devices 0 --holder contexts --count 4 --sizes 1GiB --endings KILL
study per-gpu4-1GiB-KILL --devices 0 --per-gpu 4 --sizes 1GiB --endings KILL
echo "studies done after $(( $(date +%s) - t0 )) s" | tee -a "$R/runs.txt"

# Comparisons (B - A; 95% bootstrap intervals, fixed seed), text and JSON.
cmp() {  # cmp NAME A B [options]
  local name=$1 a=$R/$2.jsonl b=$R/$3.jsonl; shift 3
  [ -s "$a" ] && [ -s "$b" ] || { echo "== $name: skipped (missing records)"; return; }
  echo "== $name"
  python3 -m nvmlcheck study compare "$a" "$b" --seed 18 "$@"
  python3 -m nvmlcheck --json study compare "$a" "$b" --seed 18 "$@" > "$R/compare-$name.json"
}
{
  cmp floor-KILL-vs-exit floor-KILL floor-exit --across ending
  cmp floor-vs-1GiB-KILL floor-KILL alloc-1GiB-KILL --across holder,size
  for size in 1GiB 16GiB; do
    cmp "$size-KILL-vs-exit" "alloc-$size-KILL" "alloc-$size-exit" --across ending
    cmp "$size-exit-vs-free" "alloc-$size-exit" "alloc-$size-free" --across ending
    cmp "$size-exit-vs-destroy" "alloc-$size-exit" "destroy-$size-exit" --across holder
    cmp "$size-exit-vs-free-files-closed" "alloc-$size-exit" "alloc-$size-free" --across ending \
      --measure files_closed
  done
  cmp 1GiB-vs-16GiB-KILL alloc-1GiB-KILL alloc-16GiB-KILL --across size
  cmp one-vs-all-gpus one-gpu-16GiB-KILL all-gpus-16GiB-KILL --across concurrent
  cmp one-vs-all-gpus-exited one-gpu-16GiB-KILL all-gpus-16GiB-KILL --across concurrent --measure exited
  cmp kill-vs-streams alloc-1GiB-KILL streams-1GiB-KILL --across holder
  cmp kill-vs-contexts alloc-1GiB-KILL contexts-1GiB-KILL --across holder
} 2>&1 | tee "$R/compare.txt"

# Summaries from the records on disk, and the holders' own step costs: for each cell the median of every step and
# of (signal -> memory back) minus the holder's own end steps, i.e. the teardown after what the holder did itself.
python3 - "$R" <<'PY' 2>&1 | tee "$R/steps.txt"
import json, sys
from pathlib import Path
from nvmlcheck.study import format_summary, load_records, percentile, summarize
r = Path(sys.argv[1])
summary = []
for path in sorted(r.glob("*.jsonl")):
    records = load_records(path)
    rows = summarize(records)
    summary.append(f"### {path.stem}: {len(records)} records ({sum(x.warmup for x in records)} warm-ups, "
                   f"{sum(x.timed_out for x in records)} timed out)\n{format_summary(rows)}\n")
    (r / f"{path.stem}.summary.json").write_text(json.dumps([row.to_json() for row in rows], indent=1))
    steps: dict[str, list[float]] = {}
    after: list[float] = []
    for rec in records:
        if rec.warmup or rec.timed_out:
            continue
        for d in rec.devices:
            own = d.holder_steps or {}
            for k, v in own.items():
                steps.setdefault(k, []).append(v / 1e6)
            if d.memory_back_ns is not None:
                after.append((d.memory_back_ns - sum(v for k, v in own.items() if k.startswith("end."))) / 1e6)
    med = ", ".join(f"{k} {percentile(v, 0.5):.2f}" for k, v in sorted(steps.items()) if k != "sim")
    tail = f"; memory back minus own end steps {percentile(after, 0.5):.1f} ms (n {len(after)})" if after else ""
    print(f"{path.stem}: holder steps, medians in ms: {med or '-'}{tail}")
(r / "summary.txt").write_text("\n".join(summary))
PY
cat "$R/summary.txt"
cp "$R/summary.txt" "$R/compare.txt" "$R/steps.txt" "$R/machine.txt" "$OUT/"
[ -f "$R/skipped.txt" ] && cp "$R/skipped.txt" "$OUT/"
tar -C "$OUT" -czf "$OUT/study2.tar.gz" study2 && rm -rf "$R"
echo "total $(( $(date +%s) - t0 )) s"; ls -l "$OUT"
