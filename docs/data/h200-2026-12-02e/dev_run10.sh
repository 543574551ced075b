#!/bin/bash
# 2026-12-02 (fifth session): the session's code after its round of probes on the H200: gpu-tests, the one-shots
# against the session's start (b3e3afc), and the round's paths on a real GPU (listening gaps, holders' bounded
# /proc reads, ready's words and refusals, ASCII output).
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/h3}; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-60} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  echo "== listening gaps on the real driver: none expected on a healthy GPU ([] = listened throughout)"
  $P $S watch --for 0.5; echo "rc=$?"
  $P $S --json wait --events --timeout 0.3 | $P -c 'import json,sys; d=json.load(sys.stdin); print("wait", d.get("clean"), "gaps", d.get("listening_gaps"))'
  $P $S --json ready --timeout 1 | $P -c 'import json,sys; d=json.load(sys.stdin); print("ready", d["ready"], d["polls"], "gaps", d.get("listening_gaps"))'
  echo "== words and refusals"
  $P $S ready --need 80; echo "rc=$?"
  PYTHONIOENCODING=ascii $P $S wait --timeout 0; echo "rc=$?"
  echo "== a torch holder: holders (head, then base) timed in one process each, 20 calls; ready names it"
  python3 -c 'import torch,time; x=torch.empty(2<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(90)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  for v in head base; do
    PYTHONPATH=/tmp/site:/tmp/inst-$v $P -c '
import statistics, sys, time, nvmlcheck as nc
with nc.open() as g:
    g.holders()
    t = []
    for _ in range(20):
        t0 = time.perf_counter_ns(); hs = g.holders(); t.append(time.perf_counter_ns() - t0)
print(sys.argv[1], "holders", len(hs), [(h.pid, h.name) for h in hs][:3], "median %.2f ms p10 %.2f p90 %.2f" % (
    statistics.median(t) / 1e6, sorted(t)[2] / 1e6, sorted(t)[17] / 1e6))' $v
  done
  $P $S holders; echo "rc=$?"
  $P $S holders --timeout 0; echo "rc=$?"
  $P $S ready; echo "rc=$?"
  $P $S --json kill --all-on-gpu --devices 0 --yes --events --grace 3 --timeout 10 | $P -c 'import json,sys; d=json.load(sys.stdin); print("kill clean", d.get("clean"), [(p["pid"], p.get("exited_ns")) for p in d.get("pids", [])])'
  $P $S --json ready | $P -c 'import json,sys; d=json.load(sys.stdin); print("ready after kill", d["ready"], "gaps", d.get("listening_gaps"))'
  kill -9 $H 2>/dev/null; wait $H 2>/dev/null
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/$(basename $W).tar.gz" -C "$W" .
