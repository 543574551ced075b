"""Scale of ``--hosts``: wall time of ``nvmlcheck wait --timeout 0`` over N simulated hosts against one host.

The hosts are ssh aliases (``Host h00 ... HostName 127.0.0.2 Port P``) of a few real sshd instances on loopback
addresses (tests/hosts/sshlab.py), each running this checkout's nvmlcheck on an idle simulated H200. Each alias gets
its own ssh connection (its own ControlMaster), as distinct hosts would. Every figure is the median of ``--runs``
runs (min and max printed); the ratio is taken within the same run.

What it measures on one machine: every simulated host's remote Python starts on this machine's CPUs, so with more
hosts than cores the ratio measures this machine's CPU, not the fan-out. On a real fleet each host starts its own
interpreter; what stays local is one ssh client per host. ``--connect-timeout 60`` gives the hosts' deadline room
(timeout + connect timeout + 5 s) on a loaded machine: a run where a host times out is reported as an error, not
timed.

    python benchmarks/hosts_scale.py --hosts 64 --servers 4 --runs 3 [--json out.json]

Needs root, sshd and ssh (apt-get install openssh-server) and the stub libnvidia-ml (a C compiler and
nvidia-nvml-dev).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nvmlcheck.simulate import SCENARIOS  # noqa: E402
from nvmlcheck.testing import build_stub  # noqa: E402


def _load_lab() -> Any:
    # By path: tests/ is not a package, and importing it as tests.hosts.sshlab would give mypy two names for it.
    import importlib.util

    spec = importlib.util.spec_from_file_location("nvmlcheck_sshlab", ROOT / "tests" / "hosts" / "sshlab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class body runs
    spec.loader.exec_module(module)
    return module


sshlab = _load_lab()


def timed(lab: Any, hosts: list[str], fanout: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the local side: nvmlcheck and its ssh clients, user + system)."""
    argv = [sys.executable, "-m", "nvmlcheck", "wait", "--timeout", "0", "--json", "--hosts", ",".join(hosts),
            "--remote-python", str(lab.python), "--fanout", str(fanout), "--connect-timeout", "60",
            "--ssh-options", lab.ssh_options]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, env=lab.env(), check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        try:
            doc = json.loads(proc.stdout)
            why = [f"{h['host']}: {h['error'] or h['verdict']}" for h in doc["hosts"] if h["verdict"] != "clean"]
        except (ValueError, KeyError):
            why = [proc.stdout.decode()[-2000:], proc.stderr.decode()[-2000:]]
        raise SystemExit(f"exit {proc.returncode}:\n" + "\n".join(why))
    return wall, cpu


def summary(values: list[float]) -> dict[str, float]:
    return {"median_s": statistics.median(values), "min_s": min(values), "max_s": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--fanout", type=int, default=32)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    reason = sshlab.unavailable_reason()
    if reason is not None:
        raise SystemExit(reason)
    library = str(build_stub())
    lab = sshlab.new_lab()
    try:
        scenario = lab.directory / "idle.scenario"
        SCENARIOS["h200"]().write(scenario)
        env = {"NVMLCHECK_LIBNVML": library, "NVMLCHECK_STUB_SCENARIO": str(scenario)}
        servers = [sshlab.start_host(lab, f"s{i}", f"127.0.0.{2 + i}", env) for i in range(args.servers)]
        aliases = [f"h{i:02d}" for i in range(args.hosts)]
        for i, alias in enumerate(aliases):
            lab.add_alias(alias, servers[i % len(servers)])
        timed(lab, aliases[:1], args.fanout)  # warm: known_hosts, page cache
        one: list[float] = []
        many: list[float] = []
        ratios: list[float] = []
        cpu_one: list[float] = []
        cpu_many: list[float] = []
        for _ in range(args.runs):
            a, ca = timed(lab, aliases[:1], args.fanout)
            b, cb = timed(lab, aliases, args.fanout)
            one.append(a)
            many.append(b)
            cpu_one.append(ca)
            cpu_many.append(cb)
            ratios.append(b / a)
        result: dict[str, Any] = {
            "hosts": args.hosts, "servers": args.servers, "fanout": args.fanout, "runs": args.runs,
            "cpus": os.cpu_count(), "one_host": summary(one), "many_hosts": summary(many),
            "ratio_median": statistics.median(ratios), "ratios": ratios,
            # The local side's CPU (nvmlcheck + ssh clients); the rest of the wall time is the simulated hosts'.
            "local_cpu_one_host_s": statistics.median(cpu_one), "local_cpu_many_hosts_s": statistics.median(cpu_many),
            "load_average_1min": os.getloadavg()[0],
        }
    finally:
        lab.stop()
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
