#!/bin/bash
# 2026-12-02 (fourth session), first call: the code after the first round of probes on the H200: gpu-tests, the
# one-shots against the session's start (0f72d39), and this round's paths on a real GPU.
set -u
OUT=${OUT:-/tmp/out}; W=${W:-/tmp/h1}; mkdir -p "$OUT" "$W"
W=$W ONESHOT_RUNS=${ONESHOT_RUNS:-60} bash benchmarks/gpu/run_speed.sh gpu-tests oneshot
export PYTHONPATH=/tmp/site:/tmp/inst-head
S=/tmp/inst-head/bin/nvmlcheck
P=/usr/bin/python3
{
  U=$($P $S --json snapshot | python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["uuid"])')
  echo "== wait by the UUID in lower case, and by a lower-case gpu- prefix (any case, as the session reads it)"
  $P $S wait --timeout 0 --devices "$(echo $U | tr A-Z a-z)"; echo "rc=$?"
  $P $S wait --timeout 0 --devices "gpu-$(echo ${U:4:8} | tr a-f A-F)"; echo "rc=$?"
  echo "== the event listener on the real driver (every event type nvml.h names, narrowed where refused)"
  $P $S watch --for 0.5; echo "rc=$?"
  $P $S --json watch --for 0.3; echo "rc=$?"
  $P -c 'import nvmlcheck as nc
with nc.open() as g:
    l = g.listen(); print("listener:", l.state, sorted(l.covered), l.reason, l.device_reasons)'
  python3 -c 'import pynvml as n
n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); m = n.nvmlDeviceGetSupportedEventTypes(h); print("supported mask", hex(m))
s = n.nvmlEventSetCreate()
try:
    n.nvmlDeviceRegisterEvents(h, m, s); print("all supported types registered at once")
except n.NVMLError as e:
    print("registering every supported type refused:", e)'

  $P $S wait --events --timeout 0.3; echo "rc=$?"
  $P $S --json ready --timeout 1 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["ready"], d["polls"], d.get("notes"))'
  echo "== sizes: 15EiB need (more than the GPU has), 2**53+1 bytes max-used"
  $P $S ready --need 15EiB; echo "rc=$?"
  $P $S wait --timeout 0 --max-used 9007199254740993; echo "rc=$?"
  echo "== smi backend: ready (recovery action field), holders --timeout 0"
  $P $S --backend smi ready; echo "rc=$?"
  $P $S holders --timeout 0; echo "rc=$?"
  echo "== a torch holder: holders --json (instance fields), ready (culprit), kill --all-on-gpu --yes"
  python3 -c 'import torch,time; x=torch.empty(4<<30, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize(); print("ready", flush=True); time.sleep(60)' > $W/holder.out 2>&1 &
  H=$!
  for i in $(seq 100); do grep -q ready $W/holder.out && break; sleep 0.1; done
  $P $S --json holders --timeout 5 | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["holders"][0] if d.get("holders") else d)'
  $P $S ready --timeout 0.2; echo "rc=$?"
  $P $S --json ready --timeout 0.2 | python3 -c 'import json,sys; d=json.load(sys.stdin); print([c for v in d["gpus"] for c in v["culprits"]])'
  $P $S kill --all-on-gpu --devices 0 --yes --grace 3 --timeout 10; echo "rc=$?"
  $P $S ready; echo "rc=$?"
  kill -9 $H 2>/dev/null; wait $H 2>/dev/null
} > "$W/final.txt" 2>&1
cat "$W/final.txt"
tar czf "$OUT/$(basename $W).tar.gz" -C "$W" .
