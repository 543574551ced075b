import json, subprocess, sys, statistics
CHILD = r'''
import ctypes, json, sys, threading, time
lib = ctypes.CDLL("libnvidia-ml.so.1"); lib.nvmlInit_v2()
h = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
n = ctypes.c_uint(0); a = (ctypes.c_ulonglong * 2)(); st = ctypes.c_int(); e = ctypes.c_ulonglong()
def t(f):
    t0 = time.perf_counter_ns(); f(); return (time.perf_counter_ns() - t0) / 1e3
def pages():
    n.value = 0; lib.nvmlDeviceGetRetiredPages_v2(h, 0, ctypes.byref(n), a, ctypes.byref(a, 8))
pend = lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h, ctypes.byref(st))
remap = lambda: lib.nvmlDeviceGetRemappedRows(h, ctypes.byref(n), ctypes.byref(n), ctypes.byref(n), ctypes.byref(n))
ecc = lambda: lib.nvmlDeviceGetTotalEccErrors(h, 1, 0, ctypes.byref(e))
out = {}
def in_thread(key, f):
    th = threading.Thread(target=lambda: out.__setitem__(key, t(f))); th.start(); th.join()
case = sys.argv[1]
if case == "other_thread_first":  # as a one-shot: the early thread warms, the main thread reads
    in_thread("T.remap", remap); in_thread("T.pending", pend); in_thread("T.ecc", ecc)
out["pages"] = t(pages); out["pending"] = t(pend); out["remap"] = t(remap); out["ecc"] = t(ecc)
print(json.dumps(out))
'''
res = {}
for rnd in range(10):
    for case in ("main_only", "other_thread_first"):
        d = json.loads(subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, check=True).stdout)
        for k, v in d.items():
            res.setdefault(case, {}).setdefault(k, []).append(v)
for case, d in res.items():
    print(case, "  ".join(f"{k} {statistics.median(v):7.1f}" for k, v in d.items()), "(µs, medians of 10 processes)")
