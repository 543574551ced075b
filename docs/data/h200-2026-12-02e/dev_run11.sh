#!/bin/bash
# 2026-12-02 (fifth session), second call: the session's final code on the H200: gpu-tests, and the safety fix of
# the third round on a host with a real CUDA holder (a simulation counts its stand-ins only: never the real holder).
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/h4}; mkdir -p "$OUT" "$W"
W=$W bash benchmarks/gpu/run_speed.sh gpu-tests
export PYTHONPATH=/tmp/site:$PWD
P=/usr/bin/python3
{
  echo "== a PyTorch holder on the real GPU; the simulated GPUs' holders and kill plan must not name it"
  python3 -c 'import torch,time; x=torch.empty(1<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  echo "holder pid $H"
  $P -m nvmlcheck holders; echo "rc=$?"
  $P -m nvmlcheck --simulate h200 holders; echo "rc=$?"
  $P -m nvmlcheck --simulate h200 --json kill --all-holders --dry-run | $P -c 'import json,sys; d=json.load(sys.stdin); print("simulated plan targets", [t["pid"] for t in d["targets"]], "notes", d.get("notes"))'; echo "rc=$?"
  kill -0 $H && echo "holder alive after the simulated dry run"
  $P -m nvmlcheck --json snapshot | $P -c 'import json,sys; d=json.load(sys.stdin); print("health.state", [x["health"]["state"] for x in d["devices"]])'
  $P -m nvmlcheck ready; echo "rc=$?"
  kill -9 $H 2>/dev/null; wait $H 2>/dev/null
  $P -m nvmlcheck wait --timeout 5; echo "rc=$?"
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/$(basename $W).tar.gz" -C "$W" .
