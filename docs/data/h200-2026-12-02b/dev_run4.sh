#!/bin/bash
# 2026-12-02 (second session), second call: the session's final code on the H200: gpu-tests, the one-shots against
# the session's start (c06e618), and the paths changed today on a real GPU.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/f2; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-40} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  echo "== wait --timeout 0 (the watchdog armed, not firing)"; $P $S wait --timeout 0; echo "rc=$?"
  echo "== ready --timeout 0.3"; $P $S ready --timeout 0.3; echo "rc=$?"
  echo "== ready --need 100%"; $P $S ready --need 100%; echo "rc=$?"
  echo "== --json ready --timeout 0"; $P $S --json ready --timeout 0 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["schema"], d["version"], d["exit_code"], [(g["class"], g["line"]) for g in d["gpus"]])'
  echo "== --backend smi snapshot"; $P $S --backend smi snapshot; echo "rc=$?"
  echo "== --backend smi watch --for 0.2"; $P $S --backend smi watch --for 0.2; echo "rc=$?"
  echo "== kill 2 --dry-run (kthreadd: refused)"; $P $S kill 2 --dry-run; echo "rc=$?"
  echo "== select 1 --lock --lock-pid \$\$ --json"; $P $S --json select 1 --lock --lock-pid $$ | head -c 400; echo; echo "rc=$?"
  echo "== a torch holder: holders, ready, wait --timeout 0.5 --max-used 1GiB (holders follow the predicate)"
  python3 -c 'import torch,time; x=torch.empty(4<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  $P $S holders; echo "rc=$?"
  $P $S ready --timeout 0.2; echo "rc=$?"
  $P $S --json wait --timeout 0.3 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["exit_code"], [(h["gpu"], h["class"], h["kind"], h["pid"]) for h in d["holders"]])'
  echo "== kill the holder, then ready"; $P $S kill --yes $H; echo "rc=$?"; $P $S ready; echo "rc=$?"
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/f2.tar.gz" -C "$W" .
