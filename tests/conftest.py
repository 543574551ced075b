"""Suite-wide options: the ``gpu`` marker is skipped without a real NVIDIA driver, unless ``--require-gpu``.

And a leak check: the pytest process moves into a cgroup of its own (cgroup v2, membership only, no controller), so
every process a test starts stays countable however it detaches (setsid, a dead parent, ssh's daemonised master, a
cleared environment). After each test's teardown, a process that joined during the test and still runs a moment
later fails that test; it is killed. Where no cgroup can be made the check is off, and the summary says so.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_UNIFIED = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


class _LeakCheck:
    """The cgroup this pytest process runs in, and who is in it."""

    def __init__(self) -> None:
        self.group: Path | None = None
        self.home: Path | None = None
        self.why_off = "no writable cgroup v2 hierarchy"
        for root in _UNIFIED:
            if not (root / "cgroup.procs").exists():
                continue
            try:
                own = Path("/proc/self/cgroup").read_text()
                rel = next(line[3:] for line in own.splitlines() if line.startswith("0::"))
                home = root / rel.lstrip("/")
                group = home / f"nvmlcheck-tests-{os.getpid()}"
                group.mkdir(exist_ok=True)
                (group / "cgroup.procs").write_text(str(os.getpid()))
            except (OSError, StopIteration) as exc:
                self.why_off = f"cannot make a cgroup under {root}: {exc}"
                continue
            self.group, self.home = group, home
            return

    def members(self) -> set[int]:
        if self.group is None:
            return set()
        try:
            return {int(pid) for pid in (self.group / "cgroup.procs").read_text().split()} - {os.getpid()}
        except OSError:
            return set()

    def close(self) -> None:
        if self.group is None or self.home is None:
            return
        for pid in self.members():
            _end(pid)
        with contextlib.suppress(OSError):
            (self.home / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in ("Z", "X")


def _end(pid: int) -> None:
    """SIGKILL a leaked process and its process group (when it leads one that is not ours)."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid and pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)


_LEAKS = pytest.StashKey[_LeakCheck]()
_BEFORE = pytest.StashKey[set[int]]()
_SETTLE_S = 3.0  # a process signalled by the test's teardown is given this long to exit before it counts as leaked


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_LEAKS] = _LeakCheck()
    # A CI runner starts the suite as a background job of a non-interactive shell: SIGINT ignored, inherited by
    # every child (nvmlcheck rightly keeps an inherited SIG_IGN), and _thread.interrupt_main() does nothing. The
    # Ctrl-C tests (a child interrupted, a test's own interrupt) then hung or failed there alone. Python's handler
    # here: a handler is reset to the default at exec, so the children start as from a terminal. A test of the
    # ignored case sets SIG_IGN in its child itself.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_unconfigure(config: pytest.Config) -> None:
    check = config.stash.get(_LEAKS, None)
    if check is not None:
        check.close()


def pytest_report_header(config: pytest.Config) -> str:
    check = config.stash[_LEAKS]
    return f"leak check: {'on, cgroup ' + str(check.group) if check.group else 'off (' + check.why_off + ')'}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # After setup: daemons that a wider-scoped fixture started (sshd, say) are not this test's leaks.
    item.stash[_BEFORE] = item.config.stash[_LEAKS].members()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    before = item.stash.get(_BEFORE, None)
    check = item.config.stash[_LEAKS]
    if before is None or check.group is None:
        return
    fresh = {pid for pid in check.members() - before if _running(pid)}
    settle_until = time.monotonic() + _SETTLE_S
    while fresh and time.monotonic() < settle_until:  # killed by the teardown a moment ago: let them exit
        time.sleep(0.01)
        fresh = {pid for pid in fresh if _running(pid)}
    leaked: list[str] = []
    for pid in sorted(fresh):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmd = "?"
        leaked.append(f"pid {pid} ({cmd[:120]})")
        _end(pid)
    if leaked:
        pytest.fail(f"the test left processes running (killed now): {'; '.join(leaked)}", pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail (instead of skip) tests marked gpu when no real GPU is reachable",
    )


def _real_gpu_reason() -> str | None:
    """None when a real libnvidia-ml initialises and sees at least one GPU, else why not."""
    if os.environ.get("NVMLCHECK_LIBNVML") or os.environ.get("NVMLCHECK_STUB_SCENARIO"):
        return "NVMLCHECK_LIBNVML/NVMLCHECK_STUB_SCENARIO point at a stub, not a real driver"
    from nvmlcheck import NvmlCheckError
    from nvmlcheck.backends.nvml import NvmlBackend

    try:
        backend = NvmlBackend()
    except NvmlCheckError as exc:
        return f"no NVIDIA driver: {exc}".splitlines()[0]
    try:
        if backend.device_count() == 0:
            return "NVML sees no GPU"
    finally:
        backend.close()
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = _real_gpu_reason()
    if reason is None:
        return
    if config.getoption("--require-gpu"):
        raise pytest.UsageError(f"--require-gpu given but no GPU is usable: {reason}")
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


def _remove_cgroup(path: Path) -> None:
    """Remove a test's cgroup once the kernel has let its last (reaped) member go: bounded, never a bare sleep."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            path.rmdir()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.fixture
def cgroup_dir() -> Iterator[Path]:
    """A new, empty cgroup (v2 where mounted, else v1 pids) for a test to put processes in; removed after."""
    for hierarchy in ("unified", "pids", ""):
        base = Path("/sys/fs/cgroup") / hierarchy
        if not (base / "cgroup.procs").is_file():
            continue
        path = base / f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
        except OSError:
            continue
        try:
            yield path
        finally:
            _remove_cgroup(path)
        return
    pytest.skip("no writable cgroup hierarchy here (needs root and a mounted cgroupfs)")


@pytest.fixture
def python_child() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``start(code, *args, ready=True)``: a ``python -S -c code args`` child, stdout piped; with ``ready``, returned
    once it printed ``ready`` (its first line). Every child is killed, reaped and its pipe closed at teardown."""
    started: list[subprocess.Popen[bytes]] = []

    def start(code: str, *args: str, ready: bool = True) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-S", "-c", code, *args], stdout=subprocess.PIPE)
        started.append(p)
        if ready:
            assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        return p

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()


@pytest.fixture
def sigterm_while_writing() -> Callable[..., tuple[bytes, int, bytes]]:
    """``run(argv, env=None)``: start ``argv`` with its stdout on a 4 KiB pipe that nobody reads until it is (nearly)
    full, so the command is blocked writing its answer; send SIGTERM then; return what it wrote, its exit status and
    its stderr. For the rule that an answer is written whole (``cli._output.write_whole``)."""
    import fcntl
    import termios

    def run(argv: list[str], env: dict[str, str] | None = None) -> tuple[bytes, int, bytes]:
        read_end, write_end = os.pipe()
        fcntl.fcntl(read_end, 1031, 4096)  # F_SETPIPE_SZ: far less than the answer
        size = fcntl.fcntl(read_end, 1032)  # F_GETPIPE_SZ
        proc = subprocess.Popen(argv, stdout=write_end, stderr=subprocess.PIPE, env=env)
        os.close(write_end)
        try:
            buffered = bytearray(4)
            end = time.monotonic() + 120
            while True:  # the writer fills the pipe and blocks: the answer is being written
                fcntl.ioctl(read_end, termios.FIONREAD, buffered)
                if int.from_bytes(buffered, sys.byteorder) >= size - 256:  # a buffered writer stops a little short
                    break
                assert proc.poll() is None and time.monotonic() < end, "the answer was never written"
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            chunks = []
            while chunk := os.read(read_end, 1 << 16):
                chunks.append(chunk)
            _, err = proc.communicate(timeout=120)
        finally:
            os.close(read_end)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return b"".join(chunks), proc.returncode, err

    return run


# nvmlcheck's command line, with the read of one process's /proc/PID/cmdline made to hang (it is read under the
# process's memory-map lock, which a process stuck in the driver can hold for good: ps hangs there too). The hang is
# a stand-in in the command's own process, where its watchdog runs. argv: the stuck PID, then the command's words.
_HUNG_CMDLINE = """
import sys, time
stuck = int(sys.argv[1])
from nvmlcheck._proc import procfs
real = procfs.cmdline
def cmdline(pid, proc="/proc"):
    if pid == stuck:
        time.sleep(3600)
    return real(pid, proc)
procfs.cmdline = cmdline
sys.argv = ["nvmlcheck", *sys.argv[2:]]
from nvmlcheck import cli
cli.script()
"""


@pytest.fixture
def hung_cmdline_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``run(stuck_pid, *words)``: ``nvmlcheck *words`` in a child process in which reading ``stuck_pid``'s
    ``/proc/PID/cmdline`` never returns; its exit status and output (text)."""
    root = Path(__file__).resolve().parents[1]

    def run(stuck: int, *words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _HUNG_CMDLINE, str(stuck), *words], capture_output=True,
                              text=True, timeout=60, check=False, env=os.environ | {"PYTHONPATH": str(root)})

    return run
