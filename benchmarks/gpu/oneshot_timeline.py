"""Where the milliseconds of one ``nvmlcheck`` run go, on a GPU host: a timeline of each run, not only its total.

Each command runs ``--runs`` times under a wrapper that stamps CLOCK_MONOTONIC (shared with this parent, which
stamps the launch) at: the wrapper's first line (the interpreter's own start-up is before it), the library's import,
its ``dlopen`` and symbol probe, the early start (``begin_early``), every NVML C call through
``LoadedLibrary.function`` (start and end; ``T.`` marks the early init thread's, ``#2`` a name's second call), the
thread's warm reads, the session's ``acquire`` (when the main thread asked for NVML and when it had it), the first
signal (kill), the first write to stdout, and ``os._exit``; the parent stamps the reap. Medians in ms from launch,
per mark (each mark's own median: their order can differ from any one run's; the JSON keeps every run). What it
shows: whether the imports or the driver are the critical path, and which calls wait for which.

    python3 benchmarks/gpu/oneshot_timeline.py --runs 15 [--python /usr/bin/python3] [--out DIR]

``$TIMELINE_SWITCH_INTERVAL_S`` sets the early thread's GIL switch interval (library._EARLY_SWITCH_INTERVAL_S).

The wrapper changes the order of two imports (it loads ``nvmlcheck._nvml.library`` first, as the script's early
start does anyway) and adds a few µs per wrapped call; totals are oneshot.py's, not this one's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WRAPPER = r"""
import time
_T0 = time.monotonic_ns()
import os, sys, _thread
marks = [("python_up", _T0)]
_MAIN = _thread.get_ident()
def mark(name):
    if _thread.get_ident() != _MAIN:
        name = "T." + name  # the early init thread
    marks.append((name, time.monotonic_ns()))
def _wrap(owner, attr, label):
    real = getattr(owner, attr)
    def call(*a, **k):
        mark(label + ".call")
        try:
            return real(*a, **k)
        finally:
            mark(label + ".ret")
    setattr(owner, attr, call)
class _FfiProxy:  # the library module's ffi, with dlopen stamped
    def __init__(self, ffi):
        self._ffi = ffi
    def __getattr__(self, name):
        return getattr(self._ffi, name)
    def dlopen(self, *a):
        mark("dlopen.call")
        try:
            return self._ffi.dlopen(*a)
        finally:
            mark("dlopen.ret")
def _patch(L):
    _function = L.LoadedLibrary.function
    def function(self, name):
        fn = _function(self, name)
        def timed(*a):
            mark(name + ".call")
            rc = fn(*a)
            mark(name + ".ret")
            return rc
        return timed
    L.LoadedLibrary.function = function
    L.ffi = _FfiProxy(L.ffi)
    _wrap(L, "_probe", "probe")
    _wrap(L.LoadedLibrary, "begin_early", "begin_early")
    _wrap(L.LoadedLibrary, "_warm_reads", "warm_reads")
    _wrap(L.LoadedLibrary, "acquire", "acquire")
if "kill" not in sys.argv:  # a kill loads the library after its signal: its row has no NVML marks
    mark("library.import")
    from nvmlcheck._nvml import library
    mark("library.imported")
    if os.environ.get("TIMELINE_SWITCH_INTERVAL_S"):  # an A/B of the early thread's GIL switch interval
        library._EARLY_SWITCH_INTERVAL_S = float(os.environ["TIMELINE_SWITCH_INTERVAL_S"])
    _patch(library)
_kill = os.kill
def kill(pid, sig):
    if sig and not any(m[0] == "signal" for m in marks):
        mark("signal")
    return _kill(pid, sig)
os.kill = kill
import _signal
if hasattr(_signal, "pidfd_send_signal"):
    _pidfd_send = _signal.pidfd_send_signal
    def pidfd_send(fd, sig, *a):
        if sig and not any(m[0] == "signal" for m in marks):
            mark("signal")
        return _pidfd_send(fd, sig, *a)
    _signal.pidfd_send_signal = pidfd_send
_write = sys.stdout.write
def write(s):
    if not any(m[0] == "stdout" for m in marks):
        mark("stdout")
    return _write(s)
sys.stdout.write = write
_exit = os._exit
def exit_(code):
    mark("os._exit")
    sys.stdout.flush()
    os.write(2, ("TIMELINE " + repr(marks) + "\n").encode())
    _exit(code)
os._exit = exit_
sys.argv = ["nvmlcheck", *sys.argv[1:]]
from nvmlcheck.cli import script
script()
"""


def once(py: str, words: list[str]) -> dict[str, float]:
    t0 = time.monotonic_ns()
    done = subprocess.run([py, "-c", WRAPPER, *words], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    reaped = time.monotonic_ns()
    line = next((x for x in done.stderr.splitlines() if x.startswith("TIMELINE ")), None)
    if line is None:
        raise RuntimeError(f"{words}: no timeline (exit {done.returncode}): {done.stderr[-800:]}")
    out: dict[str, float] = {}
    for name, ns in eval(line[len("TIMELINE "):]):  # our own child's repr of a list of pairs
        key, n = name, 2
        while key in out:  # a second handle call: .call#2
            key, n = f"{name}#{n}", n + 1
        out[key] = (ns - t0) / 1e6
    out["reaped"] = (reaped - t0) / 1e6
    out["exit"] = float(done.returncode)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    sleeper = subprocess.Popen([args.python, "-c", "import time; time.sleep(600)"])
    commands = {"wait --timeout 0": ["wait", "--timeout", "0"], "snapshot": ["snapshot"], "ready": ["ready"],
                "kill PID": ["--json", "kill", "{pid}", "--timeout", "5"]}  # fmt: skip
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in commands}
    try:
        for i in range(args.runs + 1):
            for name, words in commands.items():
                if name == "kill PID":
                    sleeper = subprocess.Popen([args.python, "-c", "import time; time.sleep(600)"])
                r = once(args.python, [w.replace("{pid}", str(sleeper.pid)) for w in words])
                if name == "kill PID":
                    sleeper.wait()
                if i:  # the first round warms caches
                    rows[name].append(r)
    finally:
        sleeper.kill()
    summary: dict[str, dict[str, float]] = {}
    for name, rs in rows.items():
        keys = sorted({k for r in rs for k in r}, key=lambda k: statistics.median(r[k] for r in rs if k in r))
        summary[name] = {k: statistics.median(r[k] for r in rs if k in r) for k in keys}
        print(f"{name}  (median ms from launch, {len(rs)} runs)")
        for k in keys:
            print(f"    {k:44s} {summary[name][k]:8.2f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "oneshot_timeline.json").write_text(json.dumps({"python": args.python, "summary": summary, "runs": rows},
                                                          indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
