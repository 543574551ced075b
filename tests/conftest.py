"""Suite-wide options: the ``gpu`` marker is skipped without a real NVIDIA driver, unless ``--require-gpu``.

And a leak check: the pytest process is made a child subreaper, so a process a test starts and leaves running (a hung
fake nvidia-smi whose parent was killed, say) becomes its child instead of init's. After each test's teardown, a
child started during the test that still runs fails that test; it is killed (with its process group) and reaped.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

_PR_SET_CHILD_SUBREAPER = 36


def _children() -> set[int]:
    """This process's children (of every thread), from /proc: cheap enough for every test."""
    out: set[int] = set()
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            out.update(int(pid) for pid in (task / "children").read_text().split())
    return out


def _state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _end(pid: int) -> None:
    """SIGKILL a leaked child and its process group (when it leads one that is not ours), then reap it."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid and pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)


def pytest_configure(config: pytest.Config) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        config.stash[_SUBREAPER] = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        config.stash[_SUBREAPER] = False


_SUBREAPER = pytest.StashKey[bool]()
_BEFORE = pytest.StashKey[set[int]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    # After setup: daemons that a wider-scoped fixture started (sshd, say) are not this test's leaks.
    item.stash[_BEFORE] = _children() if item.config.stash.get(_SUBREAPER, False) else set()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield
    before = item.stash.get(_BEFORE, None)
    if before is None:
        return
    leaked: list[str] = []
    for pid in sorted(_children() - before):
        state = _state(pid)
        if state is None:
            continue
        if state in ("Z", "X"):  # exited, parent gone or never waited for: reap it, it holds nothing
            with contextlib.suppress(OSError):
                os.waitpid(pid, os.WNOHANG)
            continue
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
