"""Holders: NVML process lists joined with a /proc/*/fd scan for NVIDIA device files, on the stub. CI has no
/dev/nvidia*, so the tests create stand-in files in a temporary directory and name them explicitly (the
``device_files`` parameter) or through the simulation (``simulated_stand_ins``); no environment variable does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck._proc import devfiles
from nvmlcheck.holders import describe_process
from nvmlcheck.testing import Scenario, build_stub

pytestmark = pytest.mark.stub
GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]

HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


@pytest.fixture
def dev(tmp_path: Path) -> tuple[Path, str]:
    """A fake /dev with nvidia0, nvidia1, nvidiactl, and the pattern that matches them."""
    d = tmp_path / "dev"
    d.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "other"):
        (d / name).write_text("")
    return d, f"{d}/nvidia[0-9]*:{d}/nvidiactl"


@pytest.fixture
def procs() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str, argv0: str | None = None) -> subprocess.Popen[bytes]:
        code = HOLD if args else SLEEP
        p = subprocess.Popen([argv0 or sys.executable, "-S", "-c", code, *args], executable=sys.executable,
                             stdout=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


def test_patterns_from_argument_and_default() -> None:
    assert devfiles.device_file_patterns() == devfiles.DEFAULT_DEVICE_FILES
    assert devfiles.device_file_patterns("/x/nvidia*:/y/ctl") == ("/x/nvidia*", "/y/ctl")
    assert devfiles.device_file_patterns("/z/*") == ("/z/*",)
    with pytest.raises(ValueError, match="absolute"):
        devfiles.device_file_patterns("nvidia*")


def test_the_environment_does_not_change_what_counts_as_a_device_file(
    procs: Callable[..., subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 27: NVMLCHECK_DEVICE_FILES=/dev/null made every process with /dev/null open a holder (and a kill target).
    monkeypatch.setenv("NVMLCHECK_DEVICE_FILES", "/dev/null:/*")
    p = procs("/dev/null")
    rule = devfiles.device_rule()
    assert rule.is_default and rule.stand_ins == ()
    assert p.pid not in devfiles.scan().holders
    assert p.pid not in {h.pid for h in nc.find_holders(None)}


def test_a_file_named_like_a_device_is_not_one_but_a_character_device_of_nvidias_major_is(
    tmp_path: Path, procs: Callable[..., subprocess.Popen[bytes]]
) -> None:
    fake = tmp_path / "nvidia0"
    fake.write_text("")
    p = procs(str(fake))
    assert devfiles.open_device_files(p.pid) == ()  # a regular file, whatever its name
    # /dev/null is a character device (major 1): not NVIDIA's.
    q = procs("/dev/null")
    assert devfiles.open_device_files(q.pid) == ()
    majors = devfiles.nvidia_majors()
    assert devfiles.NVIDIA_MAJOR in majors and 1 not in majors
    # Counted by major: a rule whose majors include 1 finds /dev/null (what a real NVIDIA node looks like).
    rule = devfiles.DeviceRule(frozenset({1}))
    assert devfiles.open_device_files(q.pid, rule) == ("/dev/null",)


def test_nvidia_majors_come_from_proc_devices(tmp_path: Path) -> None:
    table = tmp_path / "devices"
    table.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-uvm\n235 nvidia-caps\n"
                     "509 nvidia-nvswitch\n240 nvidia-caps-imex-channels\n 10 misc\n\nBlock devices:\n"
                     "259 nvidia-block-not-a-char\n")
    assert devfiles.nvidia_majors(str(table)) == {195, 234, 235, 509, 240}
    assert devfiles.nvidia_majors(str(tmp_path / "missing")) == {195}


def test_stand_ins_count_only_when_named_and_the_kill_plan_says_so(
    dev: tuple[Path, str], procs: Callable[..., subprocess.Popen[bytes]]
) -> None:
    d, pattern = dev
    p = procs(str(d / "nvidia0"))
    assert p.pid not in devfiles.scan().holders
    assert devfiles.scan(pattern).holders[p.pid] == (str(d / "nvidia0"),)
    sel = nc.select_kill_holders(nc.find_holders(None, device_files=pattern), all_holders=True,
                                 device_files=pattern)
    assert [t.pid for t in sel.targets] == [p.pid]
    assert any("stand-in files" in n and pattern in n for n in sel.notes), sel.notes
    with devfiles.simulated_stand_ins([f"{d}/*"], "a test simulation"):
        assert p.pid in devfiles.scan().holders
        assert "a test simulation" in devfiles.device_rule().describe()
    assert p.pid not in devfiles.scan().holders


def test_holders_join_nvml_and_device_files(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    d, pattern = dev
    both = procs(str(d / "nvidia0"))  # on GPU 0's list and has a device file open
    files_only = procs(str(d / "nvidia1"))  # a per-GPU device file, on no list
    control_only = procs(str(d / "nvidiactl"))  # only the control device: NVML's own clients, monitors
    collision = procs()  # on the list (a PID of another namespace, as an old driver reports it), no device file
    unrelated = procs(str(d / "other"))  # neither
    sc = Scenario.h200()
    sc.add_process(0, both.pid, used_bytes=GIB, bound=True)
    sc.add_process(0, collision.pid, used_bytes=2 * GIB)
    with gpus(sc) as session:
        holders = {h.pid: h for h in session.holders(device_files=pattern)}
    assert unrelated.pid not in holders
    h = holders[both.pid]
    assert h.found_by == {"nvml", "device-file"} and h.visible_here
    assert h.device_files == (str(d / "nvidia0"),) and h.used_bytes == GIB and h.gpus[0].index == 0
    assert h.state in ("sleeping", "running") and h.uid == os.getuid() and h.cmdline and h.nspid
    assert h.ancestry is not None and h.ancestry[0] == os.getpid() and h.relation is None and not h.is_daemon
    assert holders[files_only.pid].found_by == {"device-file"} and holders[files_only.pid].gpus == ()
    c = holders[collision.pid]
    assert c.found_by == {"nvml"} and c.device_files == () and not c.visible_here

    # A listed PID whose local process holds no NVIDIA device file: NVML's numbering is not this namespace's, so
    # choosing by GPU is refused whole (issue 27): nothing is chosen, and the reason names the PID.
    refused = nc.select_kill_holders(tuple(holders.values()), all_holders=False)
    assert refused.targets == () and refused.refused is not None
    assert f"pid {collision.pid}" in refused.refused and "no NVIDIA device file open" in refused.refused
    every = nc.select_kill_holders(tuple(holders.values()), all_holders=True)
    assert sorted(t.pid for t in every.targets) == sorted([both.pid, files_only.pid])
    assert holders[control_only.pid].gpu_device_files == () and holders[files_only.pid].gpu_device_files
    assert "holds no GPU" in dict((hh.pid, why) for hh, why in every.skipped)[control_only.pid]

    # Without the suspect entry the lists are proven: --all-on-gpu through the split API signals the real holder.
    on_gpu = nc.select_kill_holders(tuple(h for h in holders.values() if h.pid != collision.pid), all_holders=False)
    assert [t.pid for t in on_gpu.targets] == [both.pid] and on_gpu.refused is None
    with nc.prepare_kill(holders=on_gpu.targets) as plan:
        assert [(t.pid, t.found_by) for t in plan.targets] == [(both.pid, "nvml")]
        plan.send_first(signal.SIGTERM)
    assert both.wait() == -signal.SIGTERM
    assert collision.poll() is None and files_only.poll() is None


def test_session_selection_with_simulated_stand_ins(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    d, pattern = dev
    on1 = procs(str(d / "nvidia1"))
    on0 = procs(str(d / "nvidia0"))
    sc = Scenario.h200(2)
    sc.add_process(0, on0.pid, used_bytes=GIB)
    sc.add_process(1, on1.pid, used_bytes=GIB)
    with gpus(sc) as session, devfiles.simulated_stand_ins(pattern.split(":"), "the test"):
        sel = nc.select_kill_holders(session, [1], all_holders=False)
    assert [t.pid for t in sel.targets] == [on1.pid]
    assert any("the test" in n for n in sel.notes)


def test_self_ancestors_and_daemons_are_skipped(
    dev: tuple[Path, str], procs: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    d, pattern = dev
    # Calling itself nvidia-persistenced exempts nothing (issue 27): the program it runs is Python.
    impostor = procs(str(d / "nvidia0"), argv0="nvidia-persistenced")
    with open(d / "nvidia1"):  # this process holds one too
        holders = nc.find_holders(None, device_files=pattern)
    by_pid = {h.pid: h for h in holders}
    assert by_pid[os.getpid()].relation == "self"
    assert by_pid[impostor.pid].name == "nvidia-persistenced" and not by_pid[impostor.pid].is_daemon
    sel = nc.select_kill_holders(holders, all_holders=True)
    assert [t.pid for t in sel.targets] == [impostor.pid]
    reasons = {h.pid: why for h, why in sel.skipped}
    assert reasons[os.getpid()] == "this process"
    with pytest.raises(nc.KillError, match="this process"):
        nc.prepare_kill(holders=[by_pid[os.getpid()]])


def test_daemon_kind_is_the_program_not_the_name() -> None:
    root_binary = ("/usr/bin/dcgm-exporter", 0, 0o100755)
    assert nc.holders.daemon_kind("dcgm-exporter", ("dcgm-exporter",), root_binary) == "agent"
    assert nc.holders.daemon_kind("nvidia-persiste", ("x",), ("/usr/bin/nvidia-persistenced", 0, 0o100755)) == "daemon"
    # A renamed comm or argv[0] over another program, a binary a user owns or others may write: not exempt.
    assert nc.holders.daemon_kind("dcgm-exporter", ("dcgm-exporter",), ("/usr/bin/python3", 0, 0o100755)) is None
    assert nc.holders.daemon_kind("dcgm-exporter", (), ("/home/u/dcgm-exporter", 1000, 0o100755)) is None
    assert nc.holders.daemon_kind("dcgm-exporter", (), ("/opt/dcgm-exporter", 0, 0o100777)) is None
    assert nc.holders.daemon_kind("python3", ("dcgm-exporter",), root_binary) is None
    # Another user's process (exe unreadable): the names are all there is; it cannot be signalled from here anyway.
    assert nc.holders.daemon_kind("nvtop", ("nvtop",), None) == "agent"


@pytest.mark.skipif(os.geteuid() != 0, reason="an agent is a program root owns: needs root to make one")
def test_a_monitoring_agent_is_left_alone_by_all_holders(
    dev: tuple[Path, str], tmp_path: Path
) -> None:
    d, pattern = dev
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent_exe = bin_dir / "dcgm-exporter"
    shutil.copy("/bin/sleep", agent_exe)
    agent_exe.chmod(0o755)
    fds = [os.open(d / name, os.O_RDONLY) for name in ("nvidia0", "nvidiactl")]
    try:
        agent = subprocess.Popen([str(agent_exe), "60"], pass_fds=fds)
    finally:
        for fd in fds:
            os.close(fd)
    try:
        devfile = str(d / "nvidia0")
        for _ in range(500):  # until it runs the copy (exec done) with the files open
            h = next((h for h in nc.find_holders(None, device_files=pattern) if h.pid == agent.pid), None)
            if h is not None and h.daemon_kind == "agent" and devfile in (h.device_files or ()):
                break
            time.sleep(0.01)
        assert h is not None and h.daemon_kind == "agent" and h.is_daemon
        sel = nc.select_kill_holders([h], all_holders=True)
        assert sel.targets == () and "monitoring agent (dcgm-exporter)" in sel.skipped[0][1]
        assert [t.pid for t in nc.select_kill_holders([h], all_holders=True, include_daemons=True).targets] == [
            agent.pid]
    finally:
        agent.kill()
        agent.wait()


def test_a_holder_whose_pid_was_reused_is_left_out(
    dev: tuple[Path, str], procs: Callable[..., subprocess.Popen[bytes]]
) -> None:
    d, pattern = dev
    p = procs(str(d / "nvidia0"))
    (h,) = nc.find_holders(None, device_files=pattern)
    assert h.start_ticks is not None
    stale = type(h)(**{f: getattr(h, f) for f in h.__dataclass_fields__} | {"start_ticks": h.start_ticks - 1})
    other = procs()
    with nc.prepare_kill([other.pid], holders=[stale]) as plan:
        assert plan.vanished == (p.pid,) and [t.pid for t in plan.targets] == [other.pid]


def test_explain_unseen_holders_names_device_file_holders(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    d, pattern = dev
    hidden = procs(str(d / "nvidia0"))
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)  # memory held, no process listed
    with gpus(sc) as session:
        snap = session.snapshot()
    lines = nc.explain_unseen_holders(snap, device_files=pattern)
    assert any(f"pid {hidden.pid}" in line and "on no GPU process list" in line for line in lines), lines


def test_a_wait_timeout_with_memory_held_and_no_process_names_the_device_file_holder(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d, pattern = dev
    hidden = procs(str(d / "nvidia0"))
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)  # as inside a PID namespace: memory held, the list empty
    with gpus(sc) as session, devfiles.simulated_stand_ins(pattern.split(":"), "the test"), \
            pytest.raises(nc.WaitTimeout) as info:
        session.wait_until_clean(timeout=0)
    assert any(f"pid {hidden.pid}" in c and "on no GPU process list" in c for c in info.value.culprits)
    assert any("4.0 GiB used" in c for c in info.value.culprits)  # the predicate's own reason stays first


def test_a_wait_timeout_with_listed_holders_adds_no_scan_lines(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d, pattern = dev
    holder = procs(str(d / "nvidia0"))
    sc = Scenario.h200()
    sc.add_process(0, holder.pid, used_bytes=4 * GIB)
    with gpus(sc) as session, devfiles.simulated_stand_ins(pattern.split(":"), "the test"), \
            pytest.raises(nc.WaitTimeout) as info:
        session.wait_until_clean(timeout=0)
    assert not any("on no GPU process list" in c for c in info.value.culprits)


def test_a_wait_timeout_explains_only_the_gpus_its_predicate_refused(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    # GPU 1 holds 512 MiB with no process, clean under a 1 GiB limit; GPU 0 is held by a process seen by its
    # device file only. The scan's lines used to judge every GPU at 16 MiB, and the re-raised timeout lost the
    # poller's holders (judged on the refused GPUs): both named GPU 1, which the wait had accepted.
    d, pattern = dev
    hidden = procs(str(d / "nvidia0"))
    sc = Scenario.h200(devices=2)
    sc.set_device(0, used_bytes=4 * GIB)
    sc.set_device(1, used_bytes=512 << 20)
    predicate = nc.predicates.no_processes() & nc.predicates.memory_used_at_most(GIB)
    with gpus(sc) as session, devfiles.simulated_stand_ins(pattern.split(":"), "the test"), \
            pytest.raises(nc.WaitTimeout) as info:
        session.wait_until_clean(0, predicate)
    assert any(f"pid {hidden.pid}" in c for c in info.value.culprits)  # the scan ran: GPU 0 was refused
    assert not any("GPU 1" in c for c in info.value.culprits)
    assert info.value.holders and {c.gpu for c in info.value.holders} == {0}


# Runs as PID 1 of a new PID namespace, with the stub listing two PIDs as an old driver reports them (host numbering):
# HOST_PID, which names no process here, and the PID of `unrelated`, a local process that merely shares the number.
# The real holder, `holder`, has a device file open and is on no list under its local PID.
_COLLISION = """
import json, subprocess, sys
import nvmlcheck as nc
from nvmlcheck.testing import Scenario

lib, scenario_path, devfile, pattern, host_pid = sys.argv[1:6]
SLEEP = "import time; print('ready', flush=True); time.sleep(60)"
HOLD = "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); time.sleep(60)"
unrelated = subprocess.Popen([sys.executable, "-S", "-c", SLEEP], stdout=subprocess.PIPE)
holder = subprocess.Popen([sys.executable, "-S", "-c", HOLD, devfile], stdout=subprocess.PIPE)
for p in (unrelated, holder):
    assert p.stdout.readline() == b"ready\\n"
sc = Scenario.h200()
sc.add_process(0, unrelated.pid, used_bytes=1 << 30)
sc.add_process(0, int(host_pid), used_bytes=1 << 30)
sc.write(scenario_path)
with nc.open("nvml", library_path=lib) as gpus:
    on_gpu = nc.select_kill_holders(gpus, all_holders=False, device_files=pattern)
    every = nc.select_kill_holders(gpus, all_holders=True, device_files=pattern)
if on_gpu.targets:
    with nc.prepare_kill(holders=on_gpu.targets) as plan:
        plan.send_first()
print(json.dumps({
    "unrelated": unrelated.pid, "holder": holder.pid,
    "on_gpu_targets": [h.pid for h in on_gpu.targets],
    "on_gpu_skipped": {str(h.pid): why for h, why in on_gpu.skipped},
    "refused": on_gpu.refused,
    "every_targets": [h.pid for h in every.targets],
    "unrelated_alive": unrelated.poll() is None,
}))
for p in (unrelated, holder):
    p.kill()
    p.wait()
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_pid_collision_in_a_namespace_is_never_selected(dev: tuple[Path, str], tmp_path: Path) -> None:
    d, pattern = dev
    script = tmp_path / "collision.py"
    script.write_text(_COLLISION)
    host_pid = 4_000_000  # no such PID inside the new namespace
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(script), str(build_stub()),
         str(tmp_path / "ns-scenario.txt"), str(d / "nvidia0"), pattern, str(host_pid)],
        check=False, capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "NVMLCHECK_STUB_SCENARIO"}
        | {"NVMLCHECK_STUB_SCENARIO": str(tmp_path / "ns-scenario.txt"), "PYTHONPATH": str(ROOT)},
    )
    if out.returncode != 0 and "unshare" in out.stderr and "Operation not permitted" in out.stderr:
        pytest.skip(f"no PID namespace here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["on_gpu_targets"] == [] and r["unrelated_alive"]
    # Choosing by GPU is refused whole: the lists are not this namespace's numbering.
    assert r["refused"] and f"pid {host_pid}" in r["refused"] and f"pid {r['unrelated']}" in r["refused"]
    assert "PID namespace of its own" in r["refused"]
    assert r["every_targets"] == [r["holder"]]  # --all-holders finds the real one by its device file


def test_a_process_that_just_exited_is_no_evidence_of_another_numbering(
    dev: tuple[Path, str],
    procs: Callable[..., subprocess.Popen[bytes]],
    gpus: Callable[[Scenario], nc.Session],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nvmlcheck import holders as holders_module

    d, pattern = dev
    live = procs(str(d / "nvidia0"))
    ended = procs(str(d / "nvidia1"))
    sc = Scenario.h200(2)
    sc.add_process(0, live.pid, used_bytes=GIB, bound=True)
    # Still listed for 1 s after it exits, as a driver does for ~0.1 s; the second read, RECHECK_S later, proves it
    # gone (both margins are wide: a loaded machine does not flip them).
    sc.add_process(1, ended.pid, used_bytes=GIB, bound=True, list_ms=1000, release_ms=1000)
    monkeypatch.setattr(holders_module, "RECHECK_S", 1.5)
    with gpus(sc) as session, devfiles.simulated_stand_ins(pattern.split(":"), "the test"):
        session.snapshot()  # the stub reads the scenario at init
        ended.kill()
        ended.wait()  # reaped: its PID names no process here, yet NVML lists it for a while
        assert ended.pid in {p.pid for p in session.snapshot().devices[1].processes or ()}
        selection = nc.select_kill_holders(session, [0], all_holders=False)
    assert selection.refused is None and [t.pid for t in selection.targets] == [live.pid]


def test_pid_1_is_left_alone_when_it_is_no_ancestor(dev: tuple[Path, str]) -> None:
    # Run through nsenter or docker exec, the parent is outside the namespace: PID 1 is no ancestor of this process,
    # and proposing it made the kill refuse everything (issue 27). It is left alone, with the kill's own reason.
    d, _ = dev
    init = describe_process(1, found_by=frozenset({"device-file"}), device_files=(str(d / "nvidia0"),),
                            gpu_device_files=(str(d / "nvidia0"),), me=(os.getpid(), ()))
    assert init.relation is None and init.start_ticks is not None
    sel = nc.select_kill_holders([init], all_holders=True, include_daemons=True)
    assert sel.targets == () and "PID 1 is init" in sel.skipped[0][1]


def test_the_timeout_explanation_scan_is_bounded_and_says_what_it_left(
    dev: tuple[Path, str], procs: Callable[..., subprocess.Popen[bytes]]
) -> None:
    d, pattern = dev
    procs(str(d / "nvidia0"))
    whole = devfiles.scan(pattern)
    assert whole.unscanned == 0
    cut = devfiles.scan(pattern, deadline_ns=0)  # a deadline passed already: nothing is read
    assert cut.holders == {} and cut.unscanned > 0
    lines = nc.explain_unseen_holders(None, device_files=pattern, budget_s=0.0)
    assert any("were not scanned" in line for line in lines), lines


def test_a_wait_timeout_bounds_its_explanation_scan(
    gpus: Callable[[Scenario], nc.Session], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nvmlcheck import holders as holders_module

    monkeypatch.setattr(holders_module, "EXPLAIN_BUDGET_S", 0.0)  # as on a host whose scan outlasts the budget
    sc = Scenario.h200()
    sc.set_device(0, used_bytes=4 * GIB)  # memory held, no process listed: the scan is wanted
    with gpus(sc) as session, pytest.raises(nc.WaitTimeout) as info:
        session.wait_until_clean(timeout=0)
    assert any("were not scanned" in c and "bounded" in c for c in info.value.culprits), info.value.culprits


def _opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sc: Scenario) -> nc.Session:
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(sc.write(tmp_path / "s.txt")))
    return nc.open("nvml", library_path=str(build_stub()))


def test_a_process_list_that_cannot_be_read_is_never_no_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # GPU 0 holds 1 GiB, but its compute list cannot be read: "no process holds a selected GPU" (exit 0) was a
    # failed query looking like an idle GPU.
    sc = Scenario.h200(devices=2)
    sc.add_process(0, 4_100_000, used_bytes=1 << 30)
    sc.set_device(0, unsupported=("processes.compute",))
    with _opened(tmp_path, monkeypatch, sc) as gpus:
        with pytest.raises(nc.NvmlCheckError, match="GPU 0: cannot tell what holds it: its compute process list"):
            gpus.holders()
        assert gpus.holders(1) == ()  # the other GPU is read on its own
    from nvmlcheck.cli import main

    code = main(["--simulate", str(tmp_path / "s.txt"), "--json", "holders"])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 3 and doc["schema"] == "nvmlcheck/error" and "compute process list" in doc["error"]["message"]


def test_a_lost_gpu_that_is_not_selected_does_not_stop_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario.h200(devices=2)
    sc.set_device(1, lost=True)
    with _opened(tmp_path, monkeypatch, sc) as gpus:
        assert gpus.holders(0) == ()
        with pytest.raises(nc.GpuLost):
            gpus.holders()  # selected (all), it is the answer


def test_a_select_timeout_names_holders_only_of_the_gpus_it_passed_over(
    gpus: Callable[[Scenario], nc.Session],
) -> None:
    # SelectTimeout's holders were judged from its snapshot at 16 MiB on every GPU: GPU 0, clean under the
    # select's 1 GiB limit (and chosen as clean), was named as held.
    import pickle

    sc = Scenario.h200(devices=2)
    sc.set_device(0, used_bytes=512 << 20)
    sc.add_process(1, 4_000_001, used_bytes=2 * GIB)
    predicate = nc.predicates.no_processes() & nc.predicates.memory_used_at_most(GIB)
    with gpus(sc) as session, pytest.raises(nc.WaitTimeout) as info:
        session.select_clean(2, predicate=predicate, timeout=0)
    assert info.value.clean == (0,)  # type: ignore[attr-defined]
    assert {c.gpu for c in info.value.holders} == {1}
    again = pickle.loads(pickle.dumps(info.value))
    assert {c.gpu for c in again.holders} == {1}


def test_a_simulations_rule_counts_its_stand_ins_only_never_the_hosts_devices(tmp_path: Path) -> None:
    """Under a simulation the host's real NVIDIA devices counted beside the stand-ins: on a host with GPUs, a
    simulated ``kill --all-holders --yes`` (or a test of it) would have signalled real CUDA processes, which hold
    none of the simulated GPUs. Explicit stand-ins keep NVIDIA's devices beside them."""
    from nvmlcheck._proc import devfiles

    globs = devfiles.simulated_globs(tmp_path / "scenario.txt")
    with devfiles.simulated_stand_ins(globs, "a test's simulation"):
        rule = devfiles.device_rule()
    assert rule.majors == frozenset() and rule.stand_ins == globs
    assert rule.describe().startswith(f"stand-in files {globs[0]} only")
    assert devfiles.NVIDIA_MAJOR in devfiles.device_rule(globs).majors  # given explicitly: both
