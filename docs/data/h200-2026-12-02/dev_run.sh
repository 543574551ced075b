#!/bin/bash
# 2026-12-02: minor numbers (procfs vs NVML vs nvidia-smi -q), the Slurm gate on the real GPU, gpu-tests, one-shot.
set -u
OUT=${OUT:-/tmp/out}; W=/tmp/e2; mkdir -p "$OUT" "$W"
{
  echo "== /proc/driver/nvidia/gpus"; for f in /proc/driver/nvidia/gpus/*/information; do echo "-- $f"; cat "$f"; done
  echo "== nvidia-smi -q (minor, bus)"; nvidia-smi -q | grep -iE "minor|bus id|GPU UUID|^GPU " 
  ls -l /dev/nvidia[0-9]*
} > "$W/minor.txt" 2>&1
cat "$W/minor.txt"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-40} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
{
  echo "== smi backend snapshot json (minor)"; /usr/bin/python3 $S --backend smi snapshot --json | grep -E '"minor_number"|"index"'
  echo "== nvml snapshot json (minor)"; /usr/bin/python3 $S snapshot --json | grep -E '"minor_number"|"index"'
  for g in 0 1; do
    echo "== slurm prolog SLURM_JOB_GPUS=$g"
    SLURM_JOB_ID=42 SLURM_JOB_UID=0 SLURM_JOB_GPUS=$g SLURMD_NODENAME=h200 /usr/bin/python3 $S slurm prolog --timeout 2 \
      --dry-run --scontrol /bin/true --json; echo "rc=$?"
  done
  echo "== slurm prolog SLURM_JOB_GPUS=0, smi backend"
  SLURM_JOB_ID=42 SLURM_JOB_UID=0 SLURM_JOB_GPUS=0 SLURMD_NODENAME=h200 /usr/bin/python3 $S --backend smi slurm prolog \
    --timeout 5 --dry-run --scontrol /bin/true --json | grep -E '"devices"|"gpus"|"ready"|exit_code'; echo "rc=$?"
} > "$W/slurm_minor.txt" 2>&1
cat "$W/slurm_minor.txt"
tar czf "$OUT/e2.tar.gz" -C "$W" .
