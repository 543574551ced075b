"""What a health reading costs the driver on its first call in a process, by the two ways NVML offers it.

``ready`` reads each GPU's health once per one-shot, so the *first* call in a fresh process is what a user waits
for. Each mode runs ``--runs`` times in a fresh process (interleaved), after ``nvmlInit`` and the first handle:

- ``calls``: the dedicated calls nvmlcheck made (nvmlDeviceGetRetiredPagesPendingStatus, nvmlDeviceGetRemappedRows,
  nvmlDeviceGetTotalEccErrors uncorrected volatile and aggregate, nvmlDeviceGetFieldValues for the recovery action),
  each timed, then all of them a second time;
- ``fields``: the same values as field values in one nvmlDeviceGetFieldValues call (RETIRED_PENDING 31,
  REMAPPED_COR/UNC/PENDING/FAILURE 142-145, ECC_DBE_VOL_TOTAL 4, ECC_DBE_AGG_TOTAL 6, GET_GPU_RECOVERY_ACTION 230),
  a second such call, then nvmlDeviceGetRemappedRows (is its first-call cost shared with the fields?);
- ``split``: the field values one group per call (31; 142-145; 4 and 6; 230), to see which group is slow;
- ``threads``: nvmlDeviceGetRemappedRows in a second thread while the main thread reads the pending flag and the
  volatile ECC count: does the driver overlap first calls on one GPU (``both_wall`` against their sum)?

``fields_calls``: the one field-values call, then each dedicated call: are they warm after it?
``calls`` also times the first nvmlDeviceGetRetiredPages_v2 of each cause and the first compute process list.

It prints, per mode and call, the median and p90 in µs, and each mode's values (they must agree between modes).
Uses nvidia-ml-py (ctypes: its own overhead is µs; the question is ms).

    python3 benchmarks/gpu/health_paths.py --runs 10 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, sys, time
import pynvml as N
mode = sys.argv[1]
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
out = {"times": {}, "values": {}}
def timed(name, fn, *a):
    t = time.perf_counter_ns()
    try:
        v = fn(*a)
    except N.NVMLError as e:
        v = f"error {e.value}"
    out["times"][name] = (time.perf_counter_ns() - t) / 1e3
    return v
def field_values(ids):
    vals = N.nvmlDeviceGetFieldValues(h, ids)
    res = {}
    for fid, v in zip(ids, vals):
        if v.nvmlReturn:
            res[fid] = f"rc {v.nvmlReturn}"
        else:
            wide = v.valueType in (N.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, 5)
            res[fid] = int(v.value.ullVal if wide else v.value.uiVal)
    return res
UNC, VOL, AGG = 1, 0, 1
ALL = [31, 142, 143, 144, 145, 4, 6, 230]
if mode == "calls":
    for rnd in ("1", "2"):
        out["values"]["pending" + rnd] = str(timed("pending" + rnd, N.nvmlDeviceGetRetiredPagesPendingStatus, h))
        out["values"]["rows" + rnd] = str(timed("rows" + rnd, N.nvmlDeviceGetRemappedRows, h))
        out["values"]["ecc_vol" + rnd] = str(timed("ecc_vol" + rnd, N.nvmlDeviceGetTotalEccErrors, h, UNC, VOL))
        out["values"]["ecc_agg" + rnd] = str(timed("ecc_agg" + rnd, N.nvmlDeviceGetTotalEccErrors, h, UNC, AGG))
        out["values"]["recovery" + rnd] = str(timed("recovery" + rnd, field_values, [230]))
    out["values"]["retired1"] = str(timed("retired1", N.nvmlDeviceGetRetiredPages_v2, h, 0))
    out["values"]["retired2"] = str(timed("retired2", N.nvmlDeviceGetRetiredPages_v2, h, 1))
    out["values"]["compute1"] = str(len(timed("compute1", N.nvmlDeviceGetComputeRunningProcesses_v3, h)))
elif mode == "threads":
    import threading
    def rows():
        out["values"]["rows_t"] = str(timed("rows_thread", N.nvmlDeviceGetRemappedRows, h))
    t0 = time.perf_counter_ns()
    th = threading.Thread(target=rows)
    th.start()
    out["values"]["pending_t"] = str(timed("pending_main", N.nvmlDeviceGetRetiredPagesPendingStatus, h))
    out["values"]["ecc_t"] = str(timed("ecc_vol_main", N.nvmlDeviceGetTotalEccErrors, h, UNC, VOL))
    th.join()
    out["times"]["both_wall"] = (time.perf_counter_ns() - t0) / 1e3
elif mode == "fields_calls":
    out["values"]["all1"] = str(timed("all1", field_values, ALL))
    out["values"]["pending"] = str(timed("pending", N.nvmlDeviceGetRetiredPagesPendingStatus, h))
    out["values"]["rows"] = str(timed("rows", N.nvmlDeviceGetRemappedRows, h))
    out["values"]["ecc_vol"] = str(timed("ecc_vol", N.nvmlDeviceGetTotalEccErrors, h, UNC, VOL))
    out["values"]["ecc_agg"] = str(timed("ecc_agg", N.nvmlDeviceGetTotalEccErrors, h, UNC, AGG))
    out["values"]["retired"] = str(timed("retired", N.nvmlDeviceGetRetiredPages_v2, h, 0))
elif mode == "fields":
    out["values"]["all1"] = str(timed("all1", field_values, ALL))
    out["values"]["all2"] = str(timed("all2", field_values, ALL))
    out["values"]["rows_after"] = str(timed("rows_after", N.nvmlDeviceGetRemappedRows, h))
else:
    for name, ids in (("f31", [31]), ("f142_145", [142, 143, 144, 145]), ("f4_6", [4, 6]), ("f230", [230])):
        out["values"][name] = str(timed(name, field_values, ids))
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    modes = ("calls", "fields", "split", "threads", "fields_calls")
    times: dict[str, dict[str, list[float]]] = {m: {} for m in modes}
    values: dict[str, set[str]] = {}
    for _ in range(args.runs):
        for mode in modes:
            done = subprocess.run([args.python, "-c", CHILD, mode], capture_output=True, text=True, timeout=60,
                                  check=False)
            if done.returncode:
                print(f"{mode}: exit {done.returncode}: {done.stderr.strip()[-400:]}")
                return 1
            got = json.loads(done.stdout)
            for name, us in got["times"].items():
                times[mode].setdefault(name, []).append(us)
            for name, v in got["values"].items():
                values.setdefault(f"{mode}.{name}", set()).add(v)
    print(f"{'mode.call':28} {'median us':>10} {'p90 us':>10}   ({args.runs} fresh processes each)")
    for mode in modes:
        for name, us in times[mode].items():
            p90 = sorted(us)[min(len(us) - 1, int(0.9 * len(us)))]
            print(f"{mode + '.' + name:28} {statistics.median(us):10.1f} {p90:10.1f}")
    for name, vs in values.items():
        print(f"{name:28} {' | '.join(sorted(vs))}")
    if args.json:
        Path(args.json).write_text(json.dumps({"times": times, "values": {k: sorted(v) for k, v in values.items()}},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
