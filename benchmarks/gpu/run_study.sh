#!/bin/bash
# The reclamation study on a real GPU (docs/reclaim-study.md): 1, 4, 16, 64 and 120 GiB, SIGKILL and SIGTERM, 5 measured
# runs each plus one warm-up per cell (60 runs, about 1-3 s each; well under 8 minutes). Outputs land in $OUT.
#   run from the repo root on the GPU host; needs Python 3.12 with cffi/pycparser wheels in .whl/
#   (../shared/gpu-host/fetch-wheels.sh) or already installed in /tmp/site; matplotlib must be importable for --plot.
set -u
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/plots"
{
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,memory.reserved --format=csv
  lscpu | grep -E "Model name|^CPU\(s\)"; python3 --version; git rev-parse HEAD 2>/dev/null
} 2>&1 | tee "$OUT/machine.txt"
python3 -c 'import cffi, matplotlib; print("cffi", cffi.__version__, "matplotlib", matplotlib.__version__)' || exit 1

# Holders allocate in 4 pieces: one 120 GiB cuMemAlloc works too, but pieces keep each allocation and memset call
# modest on any driver. The observer polls in a tight loop (--mode precise, one busy core). timeout: never past 8 min.
start=$(date +%s)
timeout 450 python3 -m nvmlcheck study reclaim --sizes 1GiB,4GiB,16GiB,64GiB,120GiB --repeats 5 --endings KILL,TERM \
  --chunks 4 --run-timeout 20 --out "$OUT/reclaim.jsonl" --trace --plot "$OUT/plots" 2>&1 | tee "$OUT/reclaim.txt"
status=${PIPESTATUS[0]}
echo "study exit status $status after $(( $(date +%s) - start )) s" | tee -a "$OUT/reclaim.txt"

# The summary again from the records on disk (what docs/reclaim-study.md quotes), as text and JSON.
python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
from nvmlcheck.study import format_summary, load_records, summarize
out = Path(sys.argv[1])
records = load_records(out / "reclaim.jsonl")
rows = summarize(records)
print(f"{len(records)} records ({sum(r.warmup for r in records)} warm-ups, {sum(r.timed_out for r in records)} timed out)")
print(format_summary(rows))
(out / "summary.json").write_text(json.dumps([row.to_json() for row in rows], indent=1))
PY
ls -l "$OUT" "$OUT/plots"
exit "$status"
