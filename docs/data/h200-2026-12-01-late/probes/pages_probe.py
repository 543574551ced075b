import json, os, subprocess, sys, statistics
CHILD = r'''
import ctypes, json, sys, time
lib = ctypes.CDLL("libnvidia-ml.so.1"); lib.nvmlInit_v2()
h = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
u = (ctypes.c_uint * 4)(); n = ctypes.c_uint(0); a = (ctypes.c_ulonglong * 2)(); st = ctypes.c_int()
mem = ctypes.create_string_buffer(64); ctypes.cast(mem, ctypes.POINTER(ctypes.c_uint))[0] = (2 << 24) | 40
def t(f):
    t0 = time.perf_counter_ns(); f(); return (time.perf_counter_ns() - t0) / 1e3
def pages():
    n.value = 0; lib.nvmlDeviceGetRetiredPages_v2(h, 0, ctypes.byref(n), a, ctypes.byref(a, 8))
pend = lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h, ctypes.byref(st))
between = {
  "none": lambda: None,
  "sleep1ms": lambda: time.sleep(0.001),
  "sleep5ms": lambda: time.sleep(0.005),
  "migmode": lambda: lib.nvmlDeviceGetMigMode(h, u, ctypes.byref(u, 4)),
  "procs": lambda: lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), None),
  "memory": lambda: lib.nvmlDeviceGetMemoryInfo_v2(h, mem),
}[sys.argv[1]]
out = {"pending": t(pend), "pages1": t(pages)}
between()
out["pages2"] = t(pages)
between()
out["pending2"] = t(pend)
print(json.dumps(out))
'''
res = {}
for rnd in range(8):
    for case in ("none", "sleep1ms", "sleep5ms", "migmode", "procs", "memory"):
        d = json.loads(subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, check=True).stdout)
        for k, v in d.items():
            res.setdefault(case, {}).setdefault(k, []).append(v)
print(f"{'between':10} {'pending':>9} {'pages1':>9} {'pages2':>9} {'pending2':>9}   (µs, medians of 8 fresh processes)")
for case, d in res.items():
    print(f"{case:10} " + " ".join(f"{statistics.median(d[k]):9.1f}" for k in ("pending", "pages1", "pages2", "pending2")))
