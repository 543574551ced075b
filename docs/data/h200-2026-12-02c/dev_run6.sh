#!/bin/bash
# 2026-12-02 (third session): the session's code on the H200: gpu-tests, the one-shots against the session's start
# (b1ec3c6), and the paths this session changed, on a real GPU.
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/g1}; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-60} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  echo "== ready; select 1 (health read); select 1 --no-health; --json select 1 | passed_over"
  $P $S ready; echo "rc=$?"; $P $S select 1; echo "rc=$?"; $P $S select 1 --no-health; echo "rc=$?"
  $P $S --json select 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["found"], d["value"], d["passed_over"])'
  echo "== --backend smi snapshot --json: bus id spelled as NVML's"
  $P $S --backend smi --json snapshot | python3 -c 'import json,sys; d=json.load(sys.stdin); print([x["pci_bus_id"] for x in d["devices"]])'
  $P $S --json snapshot | python3 -c 'import json,sys; d=json.load(sys.stdin); print([x["pci_bus_id"] for x in d["devices"]])'
  echo "== without cffi (PYTHONPATH without /tmp/site): auto falls back to nvidia-smi; --backend nvml says why"
  PYTHONPATH=/tmp/inst-head $P $S --json wait --timeout 0 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["clean"], d["snapshot"]["backend"])'
  PYTHONPATH=/tmp/inst-head $P $S --backend nvml snapshot; echo "rc=$?"
  echo "== a torch holder: holders (container column), ready, kill --exclude (dry run), select 1"
  python3 -c 'import torch,time; x=torch.empty(4<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  $P $S holders; echo "rc=$?"
  $P $S ready --timeout 0.2; echo "rc=$?"
  $P $S select 1; echo "rc=$?"
  $P $S kill --all-on-gpu --devices 0 --exclude $H --dry-run; echo "rc=$?"
  $P $S --json kill --all-on-gpu --devices 0 --dry-run | python3 -c 'import json,sys; d=json.load(sys.stdin); print([(t["pid"], t["container"]) for t in d["targets"]])'
  echo "== kill the holder (a stopped one: SIGCONT after SIGTERM), then ready"
  kill -STOP $H
  $P $S kill --yes --grace 3 $H; echo "rc=$?"; $P $S ready; echo "rc=$?"
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/$(basename $W).tar.gz" -C "$W" .
