#!/bin/bash
# 2026-12-02 (third session), second call: the session's final code on the H200: gpu-tests, the one-shots against
# the session's start (b1ec3c6) in 80 rounds, and the second round's paths on a real GPU.
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/g2}; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-80} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  echo "== wait --devices cuda:0 (NVML; MIG mode read with the identity), and through nvidia-smi"
  $P $S wait --timeout 0 --devices cuda:0; echo "rc=$?"
  $P $S --backend smi wait --timeout 0 --devices cuda:0; echo "rc=$?"
  echo "== --backend smi --json snapshot: mig_mode read with the identity"
  $P $S --backend smi --json snapshot | python3 -c 'import json,sys; d=json.load(sys.stdin); print([(x["index"], x.get("mig_mode")) for x in d["devices"]])'
  echo "== an abbreviated option is refused; --json --version"
  $P $S wait --dev 0; echo "rc=$?"
  $P $S --json --version; echo "rc=$?"
  echo "== watch --for 0.3 (the listener on the real driver)"
  $P $S watch --for 0.3; echo "rc=$?"
  echo "== wait --events --timeout 0.2 on an idle GPU; ready --timeout 1 (2 polls)"
  $P $S wait --events --timeout 0.2; echo "rc=$?"
  $P $S --json ready --timeout 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ready"], d["polls"])'
  echo "== select 1 --format cuda"
  $P $S select 1 --format cuda; echo "rc=$?"
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/$(basename $W).tar.gz" -C "$W" .
