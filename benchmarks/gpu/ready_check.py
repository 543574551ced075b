"""Issue 22 on a real GPU: ``nvmlcheck ready`` idle, held, and within a kill; its health fields against
``nvidia-smi -q``. Bounded (about a minute; ``--budget`` caps it), one JSON file to ``--out``.

1. idle: ``nvmlcheck --json ready --devices N`` must exit 0 (and the nvidia-smi backend's too).
2. held: a holder (PyTorch when importable, else ``python -m nvmlcheck.holder``) on GPU N: exit 1, class ``held``,
   the culprit naming its PID and program.
3. within a kill, ``--runs`` times: an independent raw-NVML observer (``raw_observer.py``, no nvmlcheck code) watches
   the holder; the holder is SIGKILLed (and left unreaped: a zombie, as after any kill) and ``Session.ready`` judges
   GPU N at once: it must say ``reclaiming`` with an ETA; the predicted moment (verdict + ETA) is compared with the
   moment the observer saw the memory back (both CLOCK_MONOTONIC). Then ``ready --timeout 10`` waits: exit 0.
4. health: ``Session.snapshot(fields=HEALTH)`` against ``nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT,ECC`` (remap
   counts, pending, failure, pending retirement, volatile uncorrected ECC), parsed here independently.

    PYTHONPATH=$PWD python3 benchmarks/gpu/ready_check.py --device 0 --bytes 8GiB --runs 5 --out "$OUT/ready.json"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TORCH_HOLDER = r"""
import sys, time, torch
n, dev = int(sys.argv[1]), int(sys.argv[2])
x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{dev}")
x.fill_(1); torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(600)
"""


def cli(*argv: str, timeout: float = 60.0) -> dict[str, Any]:
    """``python -m nvmlcheck --json ARGV``: exit code, document, stderr tail, wall time."""
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nvmlcheck", "--json", *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)
    try:
        doc = json.loads(done.stdout) if done.stdout.strip() else None
    except json.JSONDecodeError:
        doc = {"unparsed": done.stdout[-2000:]}
    return {"argv": list(argv), "exit": done.returncode, "wall_s": round(time.monotonic() - t0, 4), "doc": doc,
            "stderr": done.stderr[-2000:]}


def start_holder(nbytes: int, device: int, use_torch: bool) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if use_torch:
        argv = [sys.executable, "-c", TORCH_HOLDER, str(nbytes), str(device)]
        kind = "torch"
    else:
        argv = [sys.executable, "-m", "nvmlcheck.holder", "--bytes", str(nbytes), "--device", str(device)]
        kind = "nvmlcheck.holder"
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the {kind} holder did not start: {line!r}")
    return proc, kind


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def torch_available() -> bool:
    return subprocess.run([sys.executable, "-c", "import torch; assert torch.cuda.is_available()"],
                          capture_output=True, check=False).returncode == 0


def kill_run(nc: Any, device: int, nbytes: int, use_torch: bool, clean_bytes: int) -> dict[str, Any]:
    """One holder, SIGKILLed under an independent observer; ready judges right after the kill."""
    holder, kind = start_holder(nbytes, device, use_torch)
    observer = subprocess.Popen(
        [sys.executable, str(HERE / "raw_observer.py"), "--pid", str(holder.pid), "--device", str(device),
         "--clean-bytes", str(clean_bytes), "--timeout", "20"], stdout=subprocess.PIPE, text=True)
    assert observer.stdout is not None
    out: dict[str, Any] = {"holder": kind, "pid": holder.pid}
    try:
        if observer.stdout.readline().strip() != "ready":
            raise RuntimeError("the observer did not start")
        with nc.open("nvml") as gpus:
            gpus.snapshot([device])  # warm: handles, first-call costs, before the kill
            killed_ns = time.monotonic_ns()
            os.kill(holder.pid, signal.SIGKILL)  # not reaped until after the verdict: a zombie, as after any kill
            start_ns = time.monotonic_ns()
            report = gpus.ready([device], timeout=0)
            judged_ns = start_ns + report.elapsed_ns
        (v,) = report.verdicts
        observed = json.loads(observer.stdout.readline() or "{}")
        back_ns = observed.get("clean_ns")  # memory back and off the list
        out.update(killed_ns=killed_ns, verdict_at_ms=(judged_ns - killed_ns) / 1e6, cls=v.class_,
                   eta_ms=None if v.eta_ns is None else v.eta_ns / 1e6, line=v.line(),
                   culprits=[c.to_json() for c in v.culprits], observer=observed)
        if back_ns is not None:
            out["memory_back_ms"] = (back_ns - killed_ns) / 1e6
            if v.eta_ns is not None:
                out["eta_error_ms"] = (judged_ns + v.eta_ns - back_ns) / 1e6
    finally:
        stop(holder)
        observer.wait(timeout=30)
    out["wait_after"] = cli("ready", "--devices", str(device), "--timeout", "10", timeout=30)
    return out


# --- nvidia-smi -q, read independently -------------------------------------------------------------------------------


def smi_health(device: int) -> dict[str, Any]:
    done = subprocess.run(["nvidia-smi", "-q", "-i", str(device), "-d", "ROW_REMAPPER,PAGE_RETIREMENT,ECC"],
                          capture_output=True, text=True, timeout=30, check=False)
    text = done.stdout
    out: dict[str, Any] = {"exit": done.returncode, "raw": text}

    def value(section: str, key: str) -> str | None:
        m = re.search(rf"^\s*{re.escape(section)}\s*\n((?:\s{{6,}}.*\n)+)", text, re.M)
        if not m:
            return None
        k = re.search(rf"^\s*{re.escape(key)}\s*:\s*(.*)$", m.group(1), re.M)
        return k.group(1).strip() if k else None

    out["remap_correctable"] = value("Remapped Rows", "Correctable Error")
    out["remap_uncorrectable"] = value("Remapped Rows", "Uncorrectable Error")
    out["remap_pending"] = value("Remapped Rows", "Pending")
    out["remap_failure"] = value("Remapped Rows", "Remapping Failure Occurred")
    out["retired_pending"] = value("Retired Pages", "Pending Page Blacklist") or value("Retired Pages", "Pending")
    vol = re.search(r"^\s*Volatile\s*\n((?:\s{8,}.*\n)+)", text, re.M)
    if vol:
        numbers = [int(n) for n in re.findall(r"Uncorrectable[^:\n]*:\s*(\d+)", vol.group(1))]
        out["ecc_volatile_uncorrected"] = sum(numbers) if numbers else None
    return out


def agree(health: Any, smi: dict[str, Any]) -> dict[str, Any]:
    def yes(s: str | None) -> bool | None:
        return None if s is None or s.startswith(("N/A", "[")) else s.lower().startswith("yes")

    def num(s: str | None) -> int | None:
        return int(s) if s is not None and s.isdigit() else None

    rows = None if health is None else health.remapped_rows
    pairs = {
        "remap_correctable": (None if rows is None else rows.correctable, num(smi.get("remap_correctable"))),
        "remap_uncorrectable": (None if rows is None else rows.uncorrectable, num(smi.get("remap_uncorrectable"))),
        "remap_pending": (None if rows is None else rows.pending, yes(smi.get("remap_pending"))),
        "remap_failure": (None if rows is None else rows.failure, yes(smi.get("remap_failure"))),
        "retired_pending": (None if health is None else health.retired_pages_pending, yes(smi.get("retired_pending"))),
        "ecc_volatile_uncorrected": (getattr(health, "ecc_uncorrected_volatile", None),
                                     smi.get("ecc_volatile_uncorrected")),
    }
    return {k: {"nvmlcheck": a, "nvidia_smi": b, "agree": a == b or (a is None and b is None)}
            for k, (a, b) in pairs.items()}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--bytes", default="8GiB")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--budget", type=float, default=110.0, help="seconds; runs stop starting after this")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/out"), "ready.json"))
    args = p.parse_args()
    t_start = time.monotonic()
    import nvmlcheck as nc
    from nvmlcheck._units import parse_size

    nbytes = parse_size(args.bytes)
    dev = str(args.device)
    result: dict[str, Any] = {"device": args.device, "bytes": nbytes, "python": sys.version}
    use_torch = torch_available()
    result["holder"] = "torch" if use_torch else "nvmlcheck.holder"

    # 1. idle
    result["idle"] = cli("ready", "--devices", dev)
    result["idle_smi"] = cli("--backend", "smi", "ready", "--devices", dev)
    result["idle_ok"] = result["idle"]["exit"] == 0 and result["idle_smi"]["exit"] == 0
    clean_bytes = 16 << 20

    # 2. held
    holder, _ = start_holder(nbytes, args.device, use_torch)
    try:
        held = cli("ready", "--devices", dev)
        culprits = (held.get("doc") or {}).get("holders") or []
        held["ok"] = held["exit"] == 1 and any(c.get("pid") == holder.pid and c.get("class") == "held"
                                               for c in culprits)
        result["held"] = held
    finally:
        stop(holder)
    result["after_held"] = cli("ready", "--devices", dev, "--timeout", "10", timeout=30)

    # 3. within a kill
    runs = []
    for _ in range(args.runs):
        if time.monotonic() - t_start > args.budget - 15:
            break
        runs.append(kill_run(nc, args.device, nbytes, use_torch, clean_bytes))
    result["kills"] = runs
    errors = [r["eta_error_ms"] for r in runs if "eta_error_ms" in r]
    result["kill_summary"] = {
        "runs": len(runs),
        "classes": [r.get("cls") for r in runs],
        "eta_ms": [r.get("eta_ms") for r in runs],
        "memory_back_ms": [r.get("memory_back_ms") for r in runs],
        "verdict_at_ms": [r.get("verdict_at_ms") for r in runs],
        "eta_error_ms": errors,
        "median_abs_error_ms": statistics.median(abs(e) for e in errors) if errors else None,
        "within_50ms": sum(abs(e) <= 50 for e in errors),
        "waits_ready_after": [r["wait_after"]["exit"] for r in runs],
    }

    # 4. health against nvidia-smi -q
    with nc.open("nvml") as gpus:
        snap = gpus.snapshot([args.device], fields=nc.Fields.HEALTH)
    d = snap.devices[0] if snap.devices else None
    smi = smi_health(args.device)
    result["health"] = {
        "nvmlcheck": None if d is None else {"health": repr(d.health), "unknown": dict(d.unknown)},
        "nvidia_smi": {k: v for k, v in smi.items() if k != "raw"},
        "agreement": agree(None if d is None else d.health, smi),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).with_suffix(".smi-q.txt").write_text(smi.get("raw", ""))
    result["elapsed_s"] = round(time.monotonic() - t_start, 2)
    Path(args.out).write_text(json.dumps(result, indent=1, default=str))
    s = result["kill_summary"]
    print(f"idle ok {result['idle_ok']}; held ok {result['held']['ok']}; kills {s['classes']} eta {s['eta_ms']} "
          f"back {s['memory_back_ms']} error {s['eta_error_ms']} (within 50 ms: {s['within_50ms']}/{len(errors)}); "
          f"health agree {all(a['agree'] for a in result['health']['agreement'].values())}; {result['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
