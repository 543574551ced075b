import json, subprocess, sys, statistics
CHILD = r'''
import ctypes, json, sys, threading, time
lib = ctypes.CDLL("libnvidia-ml.so.1"); lib.nvmlInit_v2()
h = ctypes.c_void_p(); lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
n = ctypes.c_uint(0); a = (ctypes.c_ulonglong * 2)(); st = ctypes.c_int(); u = (ctypes.c_uint * 4)()
buf = ctypes.create_string_buffer(96); pci = ctypes.create_string_buffer(128); ci = ctypes.c_int()
mem = ctypes.create_string_buffer(64); ctypes.cast(mem, ctypes.POINTER(ctypes.c_uint))[0] = (2 << 24) | 40
h2 = ctypes.c_void_p()
def t(f):
    t0 = time.perf_counter_ns(); f(); return (time.perf_counter_ns() - t0) / 1e3
def pages():
    n.value = 0; lib.nvmlDeviceGetRetiredPages_v2(h, 0, ctypes.byref(n), a, ctypes.byref(a, 8))
pend = lambda: lib.nvmlDeviceGetRetiredPagesPendingStatus(h, ctypes.byref(st))
system = [lambda: lib.nvmlSystemGetDriverVersion(buf, 96), lambda: lib.nvmlSystemGetNVMLVersion(buf, 96),
          lambda: lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(ci)), lambda: lib.nvmlDeviceGetCount_v2(ctypes.byref(n)),
          lambda: lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h2))]
identity = [lambda: lib.nvmlDeviceGetUUID(h, buf, 96), lambda: lib.nvmlDeviceGetName(h, buf, 96),
            lambda: lib.nvmlDeviceGetPciInfo_v3(h, pci), lambda: lib.nvmlDeviceGetSerial(h, buf, 96),
            lambda: lib.nvmlDeviceGetMinorNumber(h, ctypes.byref(n))]
reads = [lambda: lib.nvmlDeviceGetMigMode(h, u, ctypes.byref(u, 4)), lambda: lib.nvmlDeviceGetMemoryInfo_v2(h, mem)]
case = sys.argv[1]
between = {"none": [], "system": system, "identity": identity, "reads": reads, "all": system + identity + reads}[case]
out = {}
th = threading.Thread(target=lambda: out.__setitem__("T.pending", t(pend))); th.start(); th.join()
for f in between:
    f()
out["pages"] = t(pages)
print(json.dumps(out))
'''
res = {}
for rnd in range(10):
    for case in ("none", "system", "identity", "reads", "all"):
        d = json.loads(subprocess.run([sys.executable, "-c", CHILD, case], capture_output=True, text=True, check=True).stdout)
        for k, v in d.items():
            res.setdefault(case, {}).setdefault(k, []).append(v)
for case, d in res.items():
    print(f"{case:9}", "  ".join(f"{k} {statistics.median(v):7.1f}" for k, v in d.items()), "(µs, medians of 10 processes)")
