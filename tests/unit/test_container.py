"""The container reader: recorded /proc/PID/cgroup samples (tests/data/cgroup) classified, selectors parsed, members
listed from a fake /proc and from this machine's own (a child moved into a cgroup made for the test)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nvmlcheck._proc import procfs
from nvmlcheck._proc.container import (
    UNKNOWN,
    Container,
    ContainerSpec,
    classify,
    container_of,
    members,
    parse_cgroup,
    parse_spec,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "cgroup"
D = "3f2a1b2c3d4e5f60718293a4b5c6d7e8f90112233445566778899aabbccddeef"
C = "9c1e2d3f4a5b6c7d8e9f00112233445566778899aabbccddeeff001122334455"
POD = "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"

# file -> (kind, id, label, monitor)
EXPECTED: dict[str, tuple[str, str, str, bool]] = {
    "docker-v1-cgroupfs.txt": ("docker", D, "docker 3f2a1b2c3d4e", False),
    "docker-v2-systemd.txt": ("docker", D, "docker 3f2a1b2c3d4e", False),
    "docker-v1-systemd.txt": ("docker", D, "docker 3f2a1b2c3d4e", False),
    "k8s-containerd-v2-systemd.txt": ("kubernetes", POD, f"pod {POD}", False),
    "k8s-v1-cgroupfs.txt": ("kubernetes", POD, f"pod {POD}", False),
    "k8s-guaranteed-v2-cgroupfs.txt": ("kubernetes", POD, f"pod {POD}", False),
    "k8s-static-pod-v2.txt": ("kubernetes", "6c2b8f1a9d3e4f5a6b7c8d9e0f1a2b3c",
                              "pod 6c2b8f1a9d3e4f5a6b7c8d9e0f1a2b3c", False),
    "crio-v2.txt": ("kubernetes", POD, f"pod {POD}", False),
    "crio-conmon-v2.txt": ("kubernetes", POD, f"pod {POD} monitor", True),
    "podman-rootless-v2.txt": ("podman", D, "podman 3f2a1b2c3d4e (user 1000)", False),
    "podman-conmon-v2.txt": ("podman", D, "podman 3f2a1b2c3d4e monitor", True),
    "nerdctl-v2.txt": ("containerd", D, "containerd 3f2a1b2c3d4e", False),
    "lxc-legacy-v1.txt": ("lxc", "129", "lxc/129", False),
    "lxc4-payload-v2.txt": ("lxc", "129", "lxc/129", False),
    "lxc4-monitor-v2.txt": ("lxc", "129", "lxc/129 monitor", True),
    "proxmox-payload-v2.txt": ("lxc", "129", "lxc/129", False),
    "proxmox-monitor-v2.txt": ("lxc", "129", "lxc/129 monitor", True),
    "systemd-service-v2.txt": ("systemd", "sglang.service", "systemd sglang.service", False),
    "systemd-user-app-v2.txt": ("systemd", "app-tmux-1234.scope", "systemd app-tmux-1234.scope", False),
    "systemd-session-hybrid.txt": ("systemd", "session-3.scope", "systemd session-3.scope", False),
    "slurm-v1.txt": ("slurm", "42", "slurm job 42", False),
    "slurm-v2-task.txt": ("slurm", "42", "slurm job 42", False),
    "slurm-v2-batch.txt": ("slurm", "42", "slurm job 42", False),
    "slurm-v2-stepd.txt": ("slurm", "42", "slurm job 42 monitor", True),
    # <node>_slurmstepd.scope (several slurmd per host) used to read as the unit "systemd gx10-ac12_slurmstepd.scope"
    "slurm-v2-multi-slurmd.txt": ("slurm", "42", "slurm job 42", False),
    "slurm-v2-infra.txt": ("systemd", "slurmstepd.scope", "systemd slurmstepd.scope", False),
    "sandbox-v1-memory.txt": ("cgroup", "/process_api/d7130a16e04e726c016b028c3f5ed92f",
                              "cgroup /process_api/d7130a16e04e726c016b028c3f5ed92f", False),
    "deleted-v2.txt": ("docker", D, "docker 3f2a1b2c3d4e", False),
}


def test_every_sample_has_an_expectation() -> None:
    samples = {p.name for p in DATA.glob("*.txt")}
    assert samples == set(EXPECTED) | {"root-v1.txt", "root-v2.txt"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_samples_are_classified(name: str) -> None:
    c = parse_cgroup((DATA / name).read_text())
    assert c is not None
    kind, ident, label, monitor = EXPECTED[name]
    assert (c.kind, c.id, c.label(), c.monitor) == (kind, ident, label, monitor)
    assert c.pidns_inode is None  # the pure parser reads no namespace
    assert c.cgroup.startswith("/") and not c.cgroup.endswith("(deleted)")


@pytest.mark.parametrize("name", ["root-v1.txt", "root-v2.txt"])
def test_the_root_cgroup_is_no_container(name: str) -> None:
    assert parse_cgroup((DATA / name).read_text()) is None


def test_a_pod_names_its_container_and_a_container_its_unit() -> None:
    pod = parse_cgroup((DATA / "k8s-containerd-v2-systemd.txt").read_text())
    assert pod is not None and pod.is_container
    assert ("containerd", C) in pod.nested
    lxc = parse_cgroup((DATA / "lxc4-payload-v2.txt").read_text())
    assert lxc is not None and lxc.nested == (("systemd", "nginx.service"),)
    unit = parse_cgroup((DATA / "systemd-service-v2.txt").read_text())
    assert unit is not None and not unit.is_container


def test_v1_prefers_the_hierarchy_that_names_a_container() -> None:
    # name=systemd says slurmd.service (the daemon's unit); freezer says the job: the job wins.
    c = parse_cgroup((DATA / "slurm-v1.txt").read_text())
    assert c is not None and c.cgroup == "/slurm/uid_1000/job_42/step_0/task_0"
    # docker on a hybrid host: the v2 line says only containerd's unit, v1 names the container.
    d = parse_cgroup((DATA / "docker-v1-cgroupfs.txt").read_text())
    assert d is not None and d.kind == "docker" and d.cgroup == f"/docker/{D}"


def test_malformed_lines_are_skipped() -> None:
    assert parse_cgroup("garbage\n\n3:memory\n0::relative\n") is None
    c = parse_cgroup(f"nonsense\n0::/docker/{D}\n")
    assert c is not None and c.kind == "docker"


def test_this_process() -> None:
    text = procfs.read_cgroup(os.getpid())
    assert text is not None
    c = container_of(os.getpid())
    expected = parse_cgroup(text)
    if expected is None:
        assert c is None  # the root cgroup, and (a test runner is) this namespace
    else:
        assert c is not None and (c.kind, c.id, c.cgroup) == (expected.kind, expected.id, expected.cgroup)
        assert c.pidns_inode == os.stat("/proc/self/ns/pid").st_ino


def test_a_process_that_is_gone() -> None:
    assert container_of(procfs.pid_max() + 1) is None


# --- selectors -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "expected"), [
    ("lxc/129", ("lxc", "129")),
    ("slurm/42", ("slurm", "42")),
    ("job_42", ("slurm", "42")),
    (POD, ("kubernetes", POD)),
    (f"pod{POD.replace('-', '_')}", ("kubernetes", POD)),
    (D[:12], ("id", D[:12])),
    (D.upper(), ("id", D)),
    (f"docker:{D[:12]}", ("docker", D[:12])),
    ("sglang.service", ("unit", "sglang.service")),
    ("user-1000.slice", ("unit", "user-1000.slice")),
    ("/docker//abc/", ("path", "/docker/abc")),
    ("/docker/./abc/.", ("path", "/docker/abc")),
    ("/sys/fs/cgroup/memory/./job/", ("dir", "/sys/fs/cgroup/memory/job")),
    ("/sys/fs/cgroup/pids/job", ("dir", "/sys/fs/cgroup/pids/job")),
    ("pidns:4026532100", ("pidns", "4026532100")),
    ("pid:[4026532100]", ("pidns", "4026532100")),
    # A pod UID as its systemd slice spells it (kubepods-…-pod<uid with _>.slice) was "not a container".
    (POD.replace("-", "_"), ("kubernetes", POD)),
    # A cgroup may be named with trailing spaces: the path stays as typed (it was cut to "/jobs/run", another
    # cgroup, with everything below it); only leading blanks are typing.
    (" /jobs/run ", ("path", "/jobs/run ")),
    ("/sys/fs/cgroup/jobs/run\t", ("dir", "/sys/fs/cgroup/jobs/run\t")),
    (" nginx.service ", ("unit", "nginx.service")),
])
def test_selectors_parse(spec: str, expected: tuple[str, str]) -> None:
    got = parse_spec(spec)
    assert (got.kind, got.value) == expected


@pytest.mark.parametrize(("spec", "words"), [
    ("", "empty"),
    ("3f2a1b2c", "at least 12"),
    ("lxc", "not a container"),
    ("docker:xyz", "12 to 64 hex"),
    ("/a/../b", "'..'"),
    ("python3", "not a container"),
    # "." components name the same directory: the roots spelt with them are still roots.
    ("/sys/fs/cgroup/.", "root cgroup"),
    ("/./", "root cgroup"),
])
def test_bad_selectors_are_refused_with_the_forms(spec: str, words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(".", r"\.")):
        parse_spec(spec)


# --- members, from a fake /proc ----------------------------------------------------------------------------------


def _fake_proc(tmp_path: Path, procs: dict[int, str]) -> str:
    for pid, cgroup in procs.items():
        d = tmp_path / str(pid)
        (d / "ns").mkdir(parents=True)
        (d / "cgroup").write_text(cgroup)
        (d / "stat").write_text(f"{pid} (p{pid}) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {1000 + pid} 0 0\n")
        (d / "ns" / "pid").write_text("")
    (tmp_path / "self").mkdir()
    return str(tmp_path)


def test_members_by_every_form(tmp_path: Path) -> None:
    other = "3f2a1b2c3d4e" + "0" * 52  # shares the 12-digit prefix with D
    proc = _fake_proc(tmp_path, {
        10: f"0::/system.slice/docker-{D}.scope\n",
        11: f"0::/system.slice/docker-{D}.scope/inner\n",
        12: f"0::/system.slice/docker-{other}.scope\n",
        20: "0::/lxc.payload.129/system.slice/nginx.service\n",
        21: "0::/lxc.monitor.129\n",
        30: "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n",
        31: "0::/system.slice/slurmstepd.scope/job_42/step_0/slurm\n",
        40: (DATA / "k8s-containerd-v2-systemd.txt").read_text(),
        50: "0::/\n",
    })
    assert members(D[:20], proc) == [(10, 1010), (11, 1011)]
    assert members(other, proc) == [(12, 1012)]
    with pytest.raises(ValueError, match="names 2 containers"):
        members(D[:12], proc)
    assert members("lxc/129", proc) == [(20, 1020)]  # the monitor is the host's, not the container's
    assert members("slurm/42", proc) == [(30, 1030)]  # the step daemon is Slurm's
    assert members("/system.slice/slurmstepd.scope/job_42", proc) == [(30, 1030), (31, 1031)]  # a path: all below
    assert members("nginx.service", proc) == [(20, 1020)]
    assert members(POD, proc) == [(40, 1040)]
    assert members(C[:12], proc) == [(40, 1040)]  # the pod's container, by its own ID
    assert members("lxc/130", proc) == []
    assert members(ContainerSpec("lxc", "129"), proc) == [(20, 1020)]


# --- members, on this machine ------------------------------------------------------------------------------------




def test_a_hierarchys_root_is_refused_however_it_is_spelt() -> None:
    # v1's /sys/fs/cgroup/memory/. (or a v2 root) passed the check before: every process of the host, kernel threads
    # included, was selected. Its parent (after "." and symlinks) has no cgroup.procs: it is a hierarchy's root.
    roots = [d for d in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/pids")
             if os.path.isfile(f"{d}/cgroup.procs")]
    if not roots:
        pytest.skip("no cgroup v1 hierarchy mounted here (v2's root is refused by parse_spec, tested above)")
    for root in roots:
        for spelt in (root, root + "/.", root + "/./"):
            with pytest.raises(ValueError, match="root cgroup"):
                members(spelt)


def test_members_of_a_real_cgroup(cgroup_dir: Path) -> None:
    child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
    try:
        try:
            (cgroup_dir / "cgroup.procs").write_text(str(child.pid))
        except OSError as exc:
            pytest.skip(f"cannot move a process into {cgroup_dir}: {exc}")
        st = procfs.read_stat(child.pid)
        assert st is not None
        expect = [(child.pid, st.start_ticks)]
        assert members(str(cgroup_dir)) == expect  # the directory, read from cgroup.procs
        rel = "/" + cgroup_dir.name
        assert members(rel) == expect  # the path as /proc/PID/cgroup prints it
        c = container_of(child.pid)
        assert c is not None and c.kind == "cgroup" and c.id == rel
    finally:
        child.kill()
        child.wait()


def test_members_of_our_own_cgroup_include_us() -> None:
    me = container_of(os.getpid())
    if me is None or me.kind == "pidns":
        pytest.skip("this test runs in the root cgroup")
    spec = me.cgroup
    assert os.getpid() in [pid for pid, _ in members(spec)]


def test_container_is_frozen() -> None:
    c = Container("lxc", "129", "/lxc/129")
    with pytest.raises(AttributeError):
        c.kind = "docker"  # type: ignore[misc]
    assert c.label() == "lxc/129" and c.names() == (("lxc", "129"),) and c.pidns_inode is None


# --- what cannot be told is unknown, with why: never "none" ------------------------------------------------------


def _status(nspid: str | None) -> str:
    return "Name:\tp\nTgid:\t7\nUid:\t1000\t1000\t1000\t1000\n" + (f"NSpid:\t{nspid}\n" if nspid else "")


def test_an_unreadable_cgroup_file_is_an_unknown_container(tmp_path: Path) -> None:
    # Any error but "gone" (hidepid, EMFILE, a path longer than the kernel prints: ENAMETOOLONG) used to read as the
    # root cgroup: the holder was shown in no container at all. Here the file is a directory (EISDIR).
    (tmp_path / "7" / "cgroup").mkdir(parents=True)
    c = container_of(7, str(tmp_path))
    assert c is not None and c.kind == UNKNOWN and not c.is_container
    assert "cgroup cannot be read" in c.id and "EISDIR" in c.id
    assert c.label() == f"unknown container ({c.id})"
    assert container_of(8, str(tmp_path)) is None  # gone: no process to say anything of


@pytest.mark.parametrize(("theirs", "ours", "expected"), [
    ("7", "1", None),  # both in this /proc's namespace: none
    ("7\t1", "1", "another PID namespace"),  # nested below this one: which one is unknown
    (None, "1", "cannot be read"),  # a kernel before NSpid: nothing to tell by
    ("7", "5\t1", "cannot be read"),  # this process is itself nested: one entry proves nothing about it
])
def test_a_root_cgroup_process_whose_namespace_cannot_be_read(
    tmp_path: Path, theirs: str | None, ours: str, expected: str | None,
) -> None:
    # Another user's process: /proc/PID/ns/pid needs ptrace access. It used to read as "in this namespace" (None).
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("0::/\n")
    (tmp_path / "7" / "status").write_text(_status(theirs))
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "status").write_text(_status(ours))
    c = container_of(7, str(tmp_path))
    if expected is None:
        assert c is None
    else:
        assert c is not None and c.kind == UNKNOWN and expected in c.id and c.cgroup == "/"


def test_a_hierarchy_named_twice_is_forged_and_unknown(tmp_path: Path) -> None:
    # A cgroup name with a newline (refused by the kernel only since 4.13) forges a second line: the last one used to
    # win, so a user's process under its own delegated subtree read as "docker <any ID it liked>".
    forged = f"0::/user.slice/user-1000.slice/user@1000.service/x\n0::/docker/{D}\n"
    c = parse_cgroup(forged)
    assert c is not None and c.kind == UNKNOWN and "twice" in c.id and not c.is_container
    v1 = f"4:memory:/user.slice/x\n4:memory:/docker/{D}\n0::/\n"
    assert parse_cgroup(v1) == Container(UNKNOWN, c.id.replace("the v2 hierarchy", "memory"), "")
    # ... and no selector takes it, not even by a path one of its lines names.
    proc = _fake_proc(tmp_path, {10: f"0::/docker/{D}\n", 11: forged})
    assert members(D[:12], proc) == [(10, 1010)]
    assert members(f"/docker/{D}", proc) == [(10, 1010)]


def test_hierarchies_that_name_different_containers_are_unknown(tmp_path: Path) -> None:
    # The first hierarchy that named a container used to win: which one holds the process cannot be told.
    text = f"9:memory:/docker/{D}\n12:pids:/lxc/129\n0::/\n"
    c = parse_cgroup(text)
    assert c is not None and c.kind == UNKNOWN
    assert "different containers" in c.id and "docker 3f2a1b2c3d4e" in c.id and "lxc/129" in c.id
    proc = _fake_proc(tmp_path, {10: text})
    assert members(D[:12], proc) == [] and members("lxc/129", proc) == []  # no kind or ID selector proves it
    assert members(f"/docker/{D}", proc) == [(10, 1010)]  # a path is matched in each hierarchy, as before
    # The same container named by several hierarchies (a Slurm job's step and task cgroups) is still that one.
    slurm = "11:freezer:/slurm/uid_1000/job_42/step_0/task_0\n5:devices:/slurm/uid_1000/job_42/step_0\n"
    got = parse_cgroup(slurm)
    assert got is not None and (got.kind, got.id) == ("slurm", "42")


def test_deleted_is_dropped_from_the_v2_line_only() -> None:
    # The kernel appends " (deleted)" to the v2 line alone; on a v1 line it is part of the cgroup's name, and
    # dropping it made --cgroup /a select a process of the cgroup "/a (deleted)".
    c = parse_cgroup("4:memory:/a (deleted)\n0::/\n")
    assert c is not None and c.cgroup == "/a (deleted)"
    d = parse_cgroup("0::/a (deleted)\n")
    assert d is not None and d.cgroup == "/a"


def test_what_a_users_own_cgroups_name_is_that_users_claim(tmp_path: Path) -> None:
    # Below user@UID.service the user makes any cgroup it likes: a GPU process of its own in .../docker/<ID of
    # someone else's container> used to be labelled that container (an operator then stops the wrong one), and one
    # in .../slurmstepd.scope/job_42/... counted as job 42's.
    user = "/user.slice/user-1000.slice/user@1000.service"
    decoy = parse_cgroup(f"0::{user}/app.slice/docker/{D}\n")
    assert decoy is not None and (decoy.kind, decoy.id, decoy.user) == ("docker", D, 1000)
    assert decoy.label() == "docker 3f2a1b2c3d4e (user 1000)"
    job = parse_cgroup(f"0::{user}/slurmstepd.scope/job_42/step_0/user/task_0\n")
    assert job is not None and "slurm" not in dict(job.names())  # slurmstepd never runs a job there
    monitor = parse_cgroup(f"0::{user}/app.slice/lxc.monitor.129\n")
    assert monitor is not None and monitor.label() == "lxc/129 monitor (user 1000)"
    # A container with a user's session inside it is the container's, not the user's.
    lxc = parse_cgroup(f"0::/lxc.payload.129{user}/app.slice/foo.scope\n")
    assert lxc is not None and (lxc.kind, lxc.id, lxc.user) == ("lxc", "129", None)
    # One hierarchy naming the container and another the user's claim on it: which holds it cannot be told.
    mixed = parse_cgroup(f"0::{user}/docker/{D}\n9:memory:/docker/{D}\n")
    assert mixed is not None and mixed.kind == UNKNOWN
    # kill --container: the ID names the container and the user's claim on it: refused, not both signalled.
    proc = _fake_proc(tmp_path, {10: f"0::/system.slice/docker-{D}.scope\n", 11: f"0::{user}/docker/{D}\n",
                                 20: f"0::{user}/user.slice/libpod-{C}.scope\n"})
    with pytest.raises(ValueError, match=r"names 2 containers .*\(user 1000\).*cgroup path"):
        members(D[:12], proc)
    with pytest.raises(ValueError, match="names 2 containers"):
        members(f"docker:{D}", proc)
    assert members(C[:12], proc) == [(20, 1020)]  # a rootless container alone is selected as any other
    assert members(f"/system.slice/docker-{D}.scope", proc) == [(10, 1010)]


def test_a_label_is_safe_to_print_and_the_path_stays_exact() -> None:
    # A cgroup may be named with an escape sequence: ready's culprit line and kill's plan printed it raw.
    c = parse_cgroup("0::/jobs/a b\x1b[2J\u202e\n")
    assert c is not None and c.cgroup == "/jobs/a b\x1b[2J\u202e" and c.id == c.cgroup
    assert c.label() == "cgroup /jobs/a b\\x1b[2J\\u202e"


def test_a_path_that_is_not_utf8_is_matched_by_its_bytes(tmp_path: Path) -> None:
    # Read as U+FFFD, /w/bad\xff and /w/bad\xfe were one name: --cgroup with the real bytes (as argv carries them)
    # selected neither, and the name as printed ("/w/bad\ufffd") selected both.
    proc = _fake_proc(tmp_path, {10: "", 11: ""})
    (tmp_path / "10" / "cgroup").write_bytes(b"0::/w/bad\xff\n")
    (tmp_path / "11" / "cgroup").write_bytes(b"0::/w/bad\xfe\n")
    assert members(os.fsdecode(b"/w/bad\xff"), proc) == [(10, 1010)]
    assert members("/w/bad\ufffd", proc) == []
    assert members("/w", proc) == [(10, 1010), (11, 1011)]
    c = container_of(10, proc)
    assert c is not None and c.cgroup == "/w/bad\ufffd"  # printed, it reads as U+FFFD


def test_a_slurm_job_id_is_ascii_digits() -> None:
    # str.isdigit took "job_\u0664\u0662" (Arabic-Indic 42) for a job, whose ID no selector or job ID ever matches.
    c = parse_cgroup("0::/system.slice/slurmstepd.scope/job_\u0664\u0662/step_0/user/task_0\n")
    assert c is not None and c.kind != "slurm"


def test_a_deep_path_is_read_in_linear_time() -> None:
    # A user may nest its own cgroups ~2,000 deep (PATH_MAX): each component used to look back at every one before
    # it for "kubepods", 0.16 s for one such process, paid for each process of it by every --container scan. Counted,
    # not timed: the str.startswith calls per component stay bounded.
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "c_call" and getattr(arg, "__name__", "") == "startswith":
            calls += 1

    depth = 1000
    sys.setprofile(count)
    try:
        got = classify("/" + "/".join(["a"] * depth))
    finally:
        sys.setprofile(None)
    assert got is not None and got[0] == "cgroup"
    assert calls < 20 * depth
    # The context is kept all the way down: a pod's container under kubepods, however deep.
    deep = classify("/kubepods/" + "/".join(["a"] * 500) + f"/pod{POD}/{C}")
    assert deep is not None and deep[:2] == ("kubernetes", POD) and ("container", C) in deep[2]


def _stat_line(pid: int, flags: int, state: str = "S") -> str:
    return f"{pid} (p) {state} 1 1 1 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 {1000 + pid} 0 0\n"


@pytest.mark.parametrize(("exiting", "expected"), [(True, UNKNOWN), (False, "systemd")])
def test_an_exiting_process_on_cgroup_v1_is_unknown(tmp_path: Path, exiting: bool, expected: str) -> None:
    # From do_exit on (a zombie, a process tearing its GPU context down) the kernel prints "/" for each v1 hierarchy:
    # a docker container's process on a hybrid host read as the v2 line's "systemd containerd.service", and on a
    # v1 host as no container at all.
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("9:memory:/\n1:name=systemd:/\n0::/system.slice/containerd.service\n")
    (tmp_path / "7" / "stat").write_text(_stat_line(7, procfs.PF_EXITING if exiting else 0, "Z" if exiting else "S"))
    c = container_of(7, str(tmp_path))
    assert c is not None and c.kind == expected
    if exiting:
        assert "exiting" in c.id
    # The v2 line stays true while it exits: a container it names is still named.
    (tmp_path / "7" / "cgroup").write_text(f"9:memory:/\n0::/system.slice/docker-{D}.scope\n")
    c = container_of(7, str(tmp_path))
    assert c is not None and (c.kind, c.id) == ("docker", D)


def test_a_real_zombie_keeps_its_container_or_an_unknown_one() -> None:
    live = container_of(os.getpid())
    if live is None or live.kind == "pidns":
        pytest.skip("this test runs in the root cgroup: a zombie of it is rightly in none")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        while (st := procfs.read_stat(pid)) is not None and st.state != "Z":
            os.sched_yield()
        c = container_of(pid)
        assert c is not None  # its container (the v2 line), or unknown with why: never "none"
        assert c.kind == UNKNOWN or (c.kind, c.id) == (live.kind, live.id)
    finally:
        os.waitpid(pid, 0)


def test_a_path_cut_at_path_max_keeps_only_whole_names(tmp_path: Path) -> None:
    # The kernel prints at most PATH_MAX - 1 characters of a cgroup path (seen on 6.18: 4095), cutting a name in
    # the middle: a process deep below /a/<250 d>/... read as in the cgroup the cut spells (/a/.../ddd), so
    # --cgroup with that path selected it, and its label named a cgroup it is not in.
    name = "d" * 250
    cut = ("/a/" + "/".join([name] * 20))[:4095]
    whole = cut[: cut.rindex("/")]
    assert not cut.endswith(name)  # the last name is cut short
    # 10 is deep below; 11 is in a cgroup whose whole path is what the cut spells: the kernel prints the same text.
    proc = _fake_proc(tmp_path, {10: f"4:pids:{cut}\n0::/\n", 11: f"4:pids:{cut}\n0::/\n"})
    c = parse_cgroup(f"4:pids:{cut}\n0::/\n")
    assert c is not None and c.cgroup == whole + "/…" and c.label() == f"cgroup {whole}/…"
    assert members(cut, proc) == []  # which of them is in it cannot be told: neither is taken for a member
    assert members(whole, proc) == [(10, 1010), (11, 1011)]  # both are below the names the text proves


def test_a_member_that_cannot_be_read_refuses_the_selection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Out of descriptors (here: a cgroup file that is a directory, EISDIR), a member was silently left out: the kill
    # reported done with it still running.
    proc = _fake_proc(tmp_path, {10: f"0::/docker/{D}\n", 11: ""})
    (tmp_path / "11" / "cgroup").unlink()
    (tmp_path / "11" / "cgroup").mkdir()
    with pytest.raises(ValueError, match=r"whether pid 11 is in id .* cannot be told: .*EISDIR"):
        members(D[:12], proc)
    # Not permitted (another user's, under hidepid): not this user's to signal either; the rest is selected.
    real = procfs.read_cgroup

    def refused(pid: int | str, proc: str = "/proc", *, strict: bool = False, exact: bool = False) -> str | None:
        if str(pid) == "11":
            raise procfs.ProcUnreadable(errno.EACCES, "/proc/11/cgroup cannot be read: Permission denied (EACCES)")
        return real(pid, proc, strict=strict, exact=exact)

    monkeypatch.setattr(procfs, "read_cgroup", refused)
    assert members(D[:12], proc) == [(10, 1010)]


def test_a_member_whose_pid_was_taken_while_it_was_read_is_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cgroup file was read, then the start time the kill pins by: a PID reused in between was returned with the
    # newcomer's start time, as if the newcomer (in no container) were a member.
    from nvmlcheck._proc import container

    scope = f"0::/system.slice/docker-{D}.scope\n"
    proc = _fake_proc(tmp_path, {10: scope, 11: scope})
    real = container._read_for_members

    def then_reused(pid: int, proc_dir: str, parsed: object) -> object:
        got = real(pid, proc_dir, parsed)  # type: ignore[arg-type]
        if pid == 10:  # the member exits and a process of no container takes its PID
            (tmp_path / "10" / "stat").write_text("10 (new) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 9999 0 0\n")
            (tmp_path / "10" / "cgroup").write_text("0::/\n")
        return got

    monkeypatch.setattr(container, "_read_for_members", then_reused)
    assert members(D[:20], proc) == [(11, 1011)]


def test_a_name_in_two_places_is_refused_not_both_selected(tmp_path: Path) -> None:
    # A unit, an LXC name or a Slurm job ID is not unique: the host and each container have their own
    # nginx.service. kill --container nginx.service selected the host's, an LXC container's and a user's own.
    user = "/user.slice/user-1000.slice/user@1000.service"
    proc = _fake_proc(tmp_path, {
        10: "0::/system.slice/nginx.service\n",
        11: "0::/system.slice/nginx.service/worker\n",
        20: "0::/lxc.payload.129/system.slice/nginx.service\n",
        30: f"0::{user}/app.slice/nginx.service\n",
        40: "0::/lxc.payload.test/system.slice/a.service\n",
        41: "0::/lxc.payload.129/lxc.payload.test/system.slice/a.service\n",
        50: "0::/lxc.payload.130/system.slice/docker.service\n",
        51: "0::/lxc.payload.130/system.slice/docker.service/sub\n",
    })
    with pytest.raises(ValueError, match=r"'nginx.service' names 3 cgroups \(/lxc.payload.129/system.slice/nginx"
                                         r".service, /system.slice/nginx.service, .*--cgroup"):
        members("nginx.service", proc)
    with pytest.raises(ValueError, match=r"'system.slice' names 5 cgroups \(.*, and 1 more\)"):
        members("system.slice", proc)
    with pytest.raises(ValueError, match=r"'test' names 2 cgroups \(/lxc.payload.129/lxc.payload.test, "
                                         r"/lxc.payload.test\)"):
        members("lxc/test", proc)
    # One place, however deep its members: selected as before.
    assert members("docker.service", proc) == [(50, 1050), (51, 1051)]
    assert members("/system.slice/nginx.service", proc) == [(10, 1010), (11, 1011)]  # the path names one


def test_a_cgroup_below_a_directory_that_cannot_be_read_refuses_the_selection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # --cgroup /sys/fs/cgroup/...: a child cgroup whose cgroup.procs (or listing) failed was passed over, its
    # processes left running while the kill said done.
    proc = _fake_proc(tmp_path / "proc", {10: "0::/job\n", 11: "0::/job/sub\n"})
    top = tmp_path / "fs"
    (top / "job" / "sub").mkdir(parents=True)
    (top / "cgroup.procs").write_text("")
    (top / "job" / "cgroup.procs").write_text("10\n")
    spec = ContainerSpec("dir", str(top / "job"))
    (top / "job" / "sub" / "cgroup.procs").write_text("11\n")
    assert members(spec, proc) == [(10, 1010), (11, 1011)]
    (top / "job" / "sub" / "cgroup.procs").unlink()
    (top / "job" / "sub" / "cgroup.procs").symlink_to("cgroup.procs")  # ELOOP when read, as root too
    with pytest.raises(ValueError, match=r"job/sub/cgroup.procs cannot be told"):
        members(spec, proc)
    (top / "job" / "sub" / "cgroup.procs").unlink()
    (top / "job" / "sub" / "cgroup.procs").write_text("11\n")
    real_scandir = os.scandir

    def unlistable(path: str) -> object:
        if str(path).endswith("sub"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", unlistable)
    with pytest.raises(ValueError, match=r"job/sub cannot be told: Permission denied"):
        members(spec, proc)
    monkeypatch.undo()
    # A cgroup removed while the tree is read: its processes went with it (or moved): passed over.
    (top / "job" / "sub" / "cgroup.procs").unlink()
    (top / "job" / "sub" / "cgroup.procs").symlink_to("gone")
    assert members(spec, proc) == [(10, 1010)]


def test_a_process_that_may_be_a_member_but_cannot_be_told_is_said_left_alone(tmp_path: Path) -> None:
    # A forged or self-contradicting cgroup text naming the container: the process is not signalled unproven, but
    # it was left out silently (the kill said the container done while it ran on); now it is listed, with why.
    from nvmlcheck._proc.selectors import by_container

    forged = f"0::/user.slice/user-1000.slice/user@1000.service/x\n0::/docker/{D}\n"
    mixed = f"9:memory:/docker/{D}\n12:pids:/lxc/129\n0::/\n"
    proc = _fake_proc(tmp_path, {10: f"0::/docker/{D}\n", 11: forged, 12: mixed, 13: "0::/lxc/130\n"})
    doubtful: list[tuple[int, str]] = []
    assert members(D[:12], proc, doubtful) == [(10, 1010)]
    assert [pid for pid, _ in doubtful] == [11, 12]
    assert "twice" in doubtful[0][1] and "different containers" in doubtful[1][1]
    assert all(why.startswith(f"it may be in {D[:12]}, but its container cannot be told") for _, why in doubtful)
    chosen, skipped = by_container("lxc/129", proc)
    assert chosen == [] and [pid for pid, _ in skipped] == [12] and "lxc/129" in skipped[0][1]
    chosen, skipped = by_container(D[:12], proc)
    assert [c[0] for c in chosen] == [10] and [pid for pid, _ in skipped] == [11, 12]
    assert by_container("lxc/130", proc) == ([(13, 1013, "container")], [])  # nothing doubtful: nothing said
    assert members(D[:12], proc) == [(10, 1010)]  # without a list to fill, as before


def test_an_ambiguous_name_is_escaped_in_the_refusal(tmp_path: Path) -> None:
    # The names an ambiguous selector found were written raw: a container's name with a terminal escape in it.
    user = "/user.slice/user-1000.slice/user@1000.service"
    proc = _fake_proc(tmp_path, {10: "0::/lxc.payload.a\x1b[31mb\n", 11: f"0::{user}/lxc.payload.a\x1b[31mb\n"})
    with pytest.raises(ValueError, match="names 2 containers") as raised:
        members("lxc/a\x1b[31mb", proc)
    assert "\x1b" not in str(raised.value) and r"a\x1b[31mb (user 1000)" in str(raised.value)


def test_a_line_for_a_hierarchy_this_host_lacks_is_forged(tmp_path: Path) -> None:
    # Before Linux 4.13 a v1 cgroup's name may hold a newline; one that forged a line for a fresh hierarchy (an ID and
    # controller name no other line has) passed: a user's process read as "docker <any ID it liked>" and was taken
    # by kill --container. Every process's file lists the same hierarchies: one this process's lacks is forged.
    host = "4:memory:/\n1:name=systemd:/\n"
    forged = f"4:memory:/user.slice/x\n9:evil:/docker/{D}\n1:name=systemd:/user.slice/user-1000.slice/s.scope\n"
    proc = _fake_proc(tmp_path, {10: f"4:memory:/docker/{D}\n1:name=systemd:/docker/{D}\n", 11: forged})
    (tmp_path / "self" / "cgroup").write_text(host)
    assert parse_cgroup(forged) is not None and parse_cgroup(forged).kind == "docker"  # type: ignore[union-attr]
    c = container_of(11, proc)
    assert c is not None and c.kind == UNKNOWN and "9:evil" in c.id and "does not have" in c.id
    good = container_of(10, proc)
    assert good is not None and (good.kind, good.id) == ("docker", D)
    doubtful: list[tuple[int, str]] = []
    assert members(D[:12], proc, doubtful) == [(10, 1010)]
    assert [pid for pid, _ in doubtful] == [11]


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_a_pid_namespace_selects_the_namespaces_nested_in_it() -> None:
    # pidns:INODE took only the processes whose own namespace it is: a sandbox's (or an inner container's) processes,
    # which are that namespace's too, were left running while the kill said it done.
    import shutil
    import signal
    import time

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to make PID namespaces")
    outer = subprocess.Popen(["unshare", "--pid", "--fork", "unshare", "--pid", "--fork", "sleep", "60"],
                             stderr=subprocess.DEVNULL)
    init = inner = 0
    try:
        for _ in range(400):  # counted, not timed: until both namespaces' first processes are there
            init = next(iter(_children(outer.pid)), 0)
            inner = next(iter(_children(init)), 0) if init else 0
            if inner:
                break
            time.sleep(0.05)
        if not inner:
            pytest.skip("unshare did not make the nested namespace")
        ino = os.stat(f"/proc/{init}/ns/pid").st_ino
        assert os.stat(f"/proc/{inner}/ns/pid").st_ino != ino  # its own namespace, nested in the outer one
        got = [pid for pid, _ in members(f"pidns:{ino}")]
        assert init in got and inner in got and outer.pid not in got
        assert [pid for pid, _ in members(f"pidns:{os.stat(f'/proc/{inner}/ns/pid').st_ino}")] == [inner]
    finally:
        if init:
            os.kill(init, signal.SIGKILL)  # the outer namespace's init: the kernel ends both namespaces with it
        outer.kill()
        outer.wait()
