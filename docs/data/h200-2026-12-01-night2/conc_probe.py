# Do NVML's slow first calls overlap when made from two threads? (ctypes; fresh process per case; H200)
import json, subprocess, sys, statistics
CHILD = r'''
import ctypes, json, sys, threading, time
lib = ctypes.CDLL("libnvidia-ml.so.1"); lib.nvmlInit_v2()
h = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
def mk():
    u = (ctypes.c_uint * 4)(); ull = ctypes.c_ulonglong(); st = ctypes.c_int(); n = ctypes.c_uint(0)
    fv = ctypes.create_string_buffer(64); ctypes.cast(fv, ctypes.POINTER(ctypes.c_uint))[0] = 230
    return {"procs": lambda: lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), None),
            "remap": lambda: lib.nvmlDeviceGetRemappedRows(h, u, ctypes.byref(u, 4), ctypes.byref(u, 8), ctypes.byref(u, 12)),
            "pending": lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h, ctypes.byref(st)),
            "ecc": lambda: lib.nvmlDeviceGetTotalEccErrors(h, 1, 0, ctypes.byref(ull)),
            "fields": lambda: lib.nvmlDeviceGetFieldValues(h, 1, fv),
            "mig": lambda: lib.nvmlDeviceGetMigMode(h, u, ctypes.byref(u, 4))}
PLANS = {"serial": [["procs", "remap", "pending", "ecc", "fields", "mig"]],
         "t2": [["procs", "pending", "ecc", "fields", "mig"], ["remap"]],
         "t2b": [["procs", "ecc", "mig"], ["remap", "pending", "fields"]],
         "t3": [["procs", "ecc", "mig"], ["remap"], ["pending", "fields"]],
         "each": [["procs"], ["remap"], ["pending"], ["ecc"], ["fields"], ["mig"]],
         "mig_par": [["procs", "remap", "pending", "ecc", "fields"], ["mig"]]}
plan = PLANS[sys.argv[1]]
out = {}
def run(names, t0):
    calls = mk()
    for nm in names:
        a = time.perf_counter_ns(); calls[nm](); b = time.perf_counter_ns()
        out[nm] = ((a - t0) / 1e3, (b - t0) / 1e3)
t0 = time.perf_counter_ns()
ths = [threading.Thread(target=run, args=(p, t0)) for p in plan[1:]]
for t in ths: t.start()
run(plan[0], t0)
for t in ths: t.join()
out["wall"] = (0, (time.perf_counter_ns() - t0) / 1e3)
print(json.dumps(out))
'''
res = {}
cases = ("serial", "t2", "t2b", "t3", "each", "mig_par")
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 10):
    for case in cases:
        d = json.loads(subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, check=True).stdout)
        for k, v in d.items():
            res.setdefault(case, {}).setdefault(k, []).append(v)
print("per call: median start..end µs from t0 (threads started at t0); wall = t0 to all joined")
for case in cases:
    d = res[case]
    print(f"{case:8}", "  ".join(f"{k} {statistics.median(x[0] for x in v):.0f}..{statistics.median(x[1] for x in v):.0f}"
                                  for k, v in d.items()))
