#!/bin/bash
# 2026-12-02, second call: the session's final code on the H200: holders/kill/ready/slurm paths changed today, gpu-tests,
# and the one-shots against the session's start (57a0ed2).
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/e3; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-40} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  echo "== holders (idle)"; $P $S holders; echo "rc=$?"
  echo "== holders --json (idle)"; $P $S --json holders; echo "rc=$?"
  echo "== snapshot --json unknown (idle)"; $P $S --json snapshot | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"system": d["system"], "unknown": d["devices"][0]["unknown"]}, indent=1))'
  echo "== a torch holder: holders, ready, kill --all-holders --dry-run"
  python3 -c 'import torch,time,sys; x=torch.empty(4<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  $P $S holders; echo "rc=$?"
  $P $S ready; echo "rc=$?"
  $P $S kill --all-holders --dry-run; echo "rc=$?"
  $P $S --json ready --timeout 0.5 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["exit_code"], d["polls"], [(g["class"], g["line"]) for g in d["gpus"]])'
  echo "== kill the holder by pid with --json (plan and prompt on stderr; --yes)"
  $P $S --json kill --yes $H > $W/kill.json 2> $W/kill.err; echo "rc=$?"; python3 -c 'import json; d=json.load(open("/tmp/e3/kill.json")); print(d["schema"], d["version"], d["exit_code"], sorted(d))'; cat $W/kill.err
  echo "== ready after"; $P $S ready; echo "rc=$?"
  echo "== watch --for 1"; $P $S watch --for 1; echo "rc=$?"
  echo "== wait --events --timeout 0.5"; $P $S wait --events --timeout 0.5; echo "rc=$?"
  echo "== slurm prolog SLURM_JOB_GPUS=0"; SLURM_JOB_ID=42 SLURM_JOB_UID=0 SLURM_JOB_GPUS=0 SLURMD_NODENAME=h200 $P $S slurm prolog --timeout 2 --dry-run --scontrol /bin/true; echo "rc=$?"
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/e3.tar.gz" -C "$W" .
