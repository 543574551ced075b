#!/bin/bash
# 2026-12-02 (fourth session), second call: the session's code after both rounds of probes on the H200: gpu-tests,
# the one-shots against the session's start (0f72d39), and the second round's paths on a real GPU.
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/h2}; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-60} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  echo "== the listener on the real driver (registration in its own thread now): state, covered GPUs"
  $P -c 'import nvmlcheck as nc
with nc.open() as g:
    l = g.listen(); print("listener:", l.state, sorted(l.covered), l.reason, l.device_reasons)'
  $P $S watch --for 0.5; echo "rc=$?"
  $P $S wait --events --timeout 0.3; echo "rc=$?"
  $P $S --json ready --timeout 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ready"], d["polls"])'
  echo "== holders --timeout 0: one complete reading; holders with the default bound"
  $P $S holders --timeout 0; echo "rc=$?"
  $P $S holders; echo "rc=$?"
  echo "== a timeout the open used up: not confirmed (exit 1), never a one-poll clean"
  $P $S wait --timeout 1e-9; echo "rc=$?"
  $P $S ready --timeout 1e-9; echo "rc=$?"
  echo "== a torch holder: kill --signal RTMIN+2 --dry-run plan, kill --all-on-gpu --events, ready"
  python3 -c 'import torch,time; x=torch.empty(2<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  $P $S --json kill --all-on-gpu --devices 0 --dry-run | python3 -c 'import json,sys; d=json.load(sys.stdin); print([(t["pid"], t.get("gpus")) for t in d["targets"]])'
  $P $S kill --all-on-gpu --devices 0 --yes --events --grace 3 --timeout 10; echo "rc=$?"
  $P $S ready; echo "rc=$?"
  kill -9 $H 2>/dev/null; wait $H 2>/dev/null
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/$(basename $W).tar.gz" -C "$W" .
