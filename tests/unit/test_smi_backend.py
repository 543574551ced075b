"""SmiBackend over the fake nvidia-smi (stubs/fake_nvidia_smi.py) rendering stub scenarios.

Memory comes back in bytes with MiB granularity (nvidia-smi rounds up), processes land on the right GPU, unsupported
values are None with a reason, health is read only when asked, and each snapshot runs the fewest nvidia-smi commands.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvmlcheck.backends import Backend
from nvmlcheck.backends.smi import SmiBackend
from nvmlcheck.errors import (
    BackendUnavailable,
    DriverNotLoaded,
    GpuLost,
    GpuRequiresReset,
    InvalidArgument,
    LibraryVersionMismatch,
    SmiParseError,
    SmiTimeout,
    SmiTransportError,
)
from nvmlcheck.model import MIB, ClockEventReason, Fields, ProcessKind, RetiredPage, RetirementCause

ROOT = Path(__file__).resolve().parents[2]
FAKE_CMD = [sys.executable, "-S", str(ROOT / "stubs" / "fake_nvidia_smi.py")]
TOTAL = 150_754_820_096  # an H200: 143771 MiB exactly
RESERVED = 644_939_776  # 615.06 MiB, printed as 616
GIB = 1 << 30
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID1 = "GPU-00000000-0000-0000-0000-000000000001"
KNOBS = (
    "FAKE_SMI_DELAY_S",
    "FAKE_SMI_HANG",
    "FAKE_SMI_EXIT",
    "FAKE_SMI_MATCH",
    "FAKE_SMI_REFUSE_FIELDS",
    "FAKE_SMI_PLACEHOLDER",
    "FAKE_SMI_LOST_STYLE",
    "FAKE_SMI_RAW_COMMAS",
)


# Stands in for ssh (see test_smi_runner.py): drops options and host, hands the joined words to a shell.
SSH_WRAPPER = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in -o) shift 2 ;; -*) shift ;; *) break ;; esac
done
[ "$1" = unreachable ] && { echo "ssh: connect to host unreachable port 22: Connection refused" >&2; exit 255; }
shift
exec sh -c "$*"
"""


def ceil_mib(n: int) -> int:
    return math.ceil(n / MIB) * MIB


class Env:
    """A scenario file and an argv log for one test."""

    def __init__(self, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = tmp / "scenario.txt"
        self.log = tmp / "argv.jsonl"
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(self.path))
        monkeypatch.setenv("FAKE_SMI_ARGV_LOG", str(self.log))
        for knob in KNOBS:
            monkeypatch.delenv(knob, raising=False)

    def write(self, *lines: str) -> None:
        self.path.write_text("\n".join(["nvmlcheck-stub-scenario 1", *lines]) + "\n", encoding="utf-8")

    def runs(self) -> list[list[str]]:
        """The argument lists nvidia-smi was run with since the last call."""
        if not self.log.exists():
            return []
        out = [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines()]
        self.log.unlink()
        return out

    def knob(self, name: str, value: str) -> None:
        self.monkeypatch.setenv(name, value)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    return Env(tmp_path, monkeypatch)


@pytest.fixture
def two_gpus(env: Env) -> Iterator[SmiBackend]:
    env.write("device index=0", "device index=1")
    backend = SmiBackend(command=FAKE_CMD)
    env.runs()
    yield backend
    backend.close()


# --- opening ----------------------------------------------------------------------------------------------------------


class TestOpen:
    def test_opens_with_one_cheap_query_and_caches_identity(self, env: Env) -> None:
        env.write("device index=0", 'device index=1 name="NVIDIA H200 NVL" serial=42')
        backend = SmiBackend(command=FAKE_CMD)
        assert isinstance(backend, Backend)
        assert backend.name == "smi" and backend.device_count() == 2
        identity, version = sorted(env.runs())  # run side by side: opening costs one nvidia-smi run's time
        assert identity[0].startswith("--query-gpu=index,uuid,") and version == ["--version"]
        snap = backend.snapshot(fields=Fields.MEMORY)
        assert [(d.index, d.uuid, d.name, d.serial, d.pci_bus_id) for d in snap.devices] == [
            (0, UUID0, "NVIDIA H200", "1650924060042", "00000000:01:00.0"),
            (1, UUID1, "NVIDIA H200 NVL", "42", "00000000:02:00.0"),
        ]
        (poll,) = env.runs()
        assert "name" not in poll[0].split("=", 1)[1].split(","), "identity is cached, not asked every poll"

    def test_no_scenario_means_no_driver(self, env: Env) -> None:
        env.monkeypatch.delenv("NVMLCHECK_STUB_SCENARIO")
        with pytest.raises(DriverNotLoaded) as info:
            SmiBackend(command=FAKE_CMD)
        assert isinstance(info.value, BackendUnavailable)
        assert "couldn't communicate with the NVIDIA driver" in str(info.value)

    def test_library_mismatch(self, env: Env) -> None:
        env.write("device index=0")
        env.knob("FAKE_SMI_EXIT", "18")
        with pytest.raises(LibraryVersionMismatch, match="Driver/library version mismatch"):
            SmiBackend(command=FAKE_CMD)

    def test_missing_executable_is_backend_unavailable_with_attempts(self, env: Env) -> None:
        with pytest.raises(BackendUnavailable) as info:
            SmiBackend(command="/no/such/nvidia-smi")
        assert info.value.attempts and "/no/such/nvidia-smi" in info.value.attempts[0]

    def test_a_missing_executable_says_so_in_the_message_not_only_the_detail(self, env: Env, tmp_path: Path) -> None:
        # `--backend smi` without nvidia-smi said "nvidia-smi did not answer": nothing was run to answer.
        with pytest.raises(BackendUnavailable) as info:
            SmiBackend(command="/no/such/nvidia-smi")
        assert info.value.TRANSIENT is False
        assert "not found" in info.value.message and "did not answer" not in info.value.message
        plain = tmp_path / "nvidia-smi"
        plain.write_text("#!/bin/sh\n", encoding="utf-8")  # not executable
        with pytest.raises(BackendUnavailable) as info:
            SmiBackend(command=str(plain))
        assert "not executable" in info.value.message

    def test_timeout_at_open_is_backend_unavailable(self, env: Env) -> None:
        env.write("device index=0")
        env.knob("FAKE_SMI_DELAY_S", "30")
        with pytest.raises(BackendUnavailable) as info:
            SmiBackend(command=FAKE_CMD, timeout_s=0.3)
        assert isinstance(info.value.__cause__, SmiTimeout)
        assert "did not answer within 0.3 s" in info.value.message

    def test_through_an_ssh_like_prefix(self, env: Env, tmp_path: Path) -> None:
        env.write("device index=0", "process device=0 kind=compute pid=4123456 used=1048576")
        ssh = tmp_path / "ssh"
        ssh.write_text(SSH_WRAPPER, encoding="utf-8")
        ssh.chmod(0o755)
        remote = SmiBackend(command=FAKE_CMD, prefix=[str(ssh), "-o", "BatchMode=yes", "gpu01"]).snapshot()
        local = SmiBackend(command=FAKE_CMD).snapshot()
        assert remote.devices == local.devices

    def test_unreachable_host_is_backend_unavailable_from_a_transport_error(self, env: Env, tmp_path: Path) -> None:
        env.write("device index=0")
        ssh = tmp_path / "ssh"
        ssh.write_text(SSH_WRAPPER, encoding="utf-8")
        ssh.chmod(0o755)
        with pytest.raises(BackendUnavailable) as info:
            SmiBackend(command=FAKE_CMD, prefix=[str(ssh), "unreachable"])
        assert isinstance(info.value.__cause__, SmiTransportError)
        assert "Connection refused" in info.value.attempts[0]

    def test_no_gpu_is_zero_devices(self, env: Env) -> None:
        env.write()
        backend = SmiBackend(command=FAKE_CMD)
        assert backend.device_count() == 0
        assert backend.snapshot().devices == ()

    def test_system_info(self, env: Env) -> None:
        env.write("system driver=575.51.03 cuda=12090", "device index=0")
        system = SmiBackend(command=FAKE_CMD).system()
        assert (system.driver_version, system.cuda_driver_version, system.nvml_version) == ("575.51.03", 12090, None)
        assert "nvml" in system.unknown["nvml_version"].lower()


# --- memory and processes ---------------------------------------------------------------------------------------------


class TestMemoryAndProcesses:
    def test_idle_memory_in_bytes_with_mib_granularity(self, two_gpus: SmiBackend) -> None:
        before = time.monotonic_ns()
        snap = two_gpus.snapshot()
        assert snap.backend == "smi" and before <= snap.taken_ns <= time.monotonic_ns()
        assert snap.duration_ns > 0 and snap.failures == ()
        for d in snap.devices:
            assert d.memory is not None
            assert d.memory.total_bytes == TOTAL
            assert d.memory.reserved_bytes == ceil_mib(RESERVED) == 616 * MIB
            assert d.memory.used_bytes == 0
            assert d.memory.free_bytes == ceil_mib(TOTAL - RESERVED) == 143156 * MIB
            assert d.memory.granularity_bytes == MIB and d.memory.used_includes_reserved is False
            assert d.processes == ()  # nvidia-smi said "Processes : None"

    def test_processes_land_on_their_gpu(self, env: Env) -> None:
        env.write(
            "device index=0",
            "device index=1 used=1000",
            "process device=0 kind=compute pid=4123456 used=1073741824",
            "process device=1 kind=graphics pid=4123457 used=na holds=3145728",
            "process device=1 kind=mps pid=4123458 used=5242880",
            "process device=1 kind=compute pid=4123458 used=5242880 holds=0",
        )
        snap = SmiBackend(command=FAKE_CMD).snapshot()
        d0, d1 = snap.devices
        assert d0.memory is not None and d0.memory.used_bytes == GIB
        assert [(p.pid, p.kind, p.used_bytes) for p in d0.processes or ()] == [(4123456, ProcessKind.COMPUTE, GIB)]
        assert d1.compute_processes is not None and [p.pid for p in d1.compute_processes] == [4123458]
        assert d1.mps_processes is not None and [p.pid for p in d1.mps_processes] == [4123458]
        assert d1.graphics_processes is not None
        (gfx,) = d1.graphics_processes
        assert (gfx.pid, gfx.used_bytes, gfx.name) == (4123457, None, None)  # "not available" stays None
        # used = 1000 B of other use + 3 MiB graphics + 5 MiB MPS = 8 MiB + 1000 B, printed rounded up
        assert d1.memory is not None and d1.memory.used_bytes == ceil_mib(1000 + 8 * MIB) == 9 * MIB

    def test_compute_apps_query_leaves_graphics_and_mps_unknown(self, env: Env) -> None:
        env.write("device index=0", "process device=0 kind=compute pid=4123456 used=1048576")
        backend = SmiBackend(command=FAKE_CMD, process_query="compute-apps")
        env.runs()
        d = backend.snapshot(fields=Fields.WAIT).devices[0]
        assert d.compute_processes is not None and d.compute_processes[0].used_bytes == MIB
        assert d.graphics_processes is None and d.mps_processes is None and d.processes is None
        assert "compute processes only" in (d.why_unknown("processes.graphics") or "")
        assert any(run[0].startswith("--query-compute-apps=") for run in env.runs())

    def test_compute_apps_row_on_an_unknown_gpu_makes_the_lists_unknown_not_empty(
        self, env: Env, tmp_path: Path
    ) -> None:
        # --query-compute-apps printing a MIG-... (or any unknown) UUID in gpu_uuid: its process is on some GPU of
        # ours, whose list was then () (no process) before; it is unknown now, with the reason.
        wrapper = tmp_path / "mig-uuid-smi.py"
        wrapper.write_text(
            "import subprocess, sys\n"
            f"run = subprocess.run({FAKE_CMD!r} + sys.argv[1:], capture_output=True, text=True)\n"
            f"sys.stdout.write(run.stdout.replace({UUID0!r} + ', 4123456', 'MIG-0-0-0-0-9, 4123456'))\n"
            "sys.exit(run.returncode)\n"
        )
        env.write("device index=0", "process device=0 kind=compute pid=4123456 used=1048576")
        backend = SmiBackend(command=[sys.executable, "-S", str(wrapper)], process_query="compute-apps")
        d = backend.snapshot(fields=Fields.WAIT).devices[0]
        assert d.compute_processes is None
        assert "MIG-0-0-0-0-9" in (d.why_unknown("processes.compute") or "")

    def test_mig_instance_ids(self, env: Env) -> None:
        env.write("device index=0", "process device=0 kind=compute pid=4123456 used=1048576 gi=1 ci=2")
        (p,) = SmiBackend(command=FAKE_CMD).snapshot().devices[0].compute_processes or ()
        assert (p.gpu_instance_id, p.compute_instance_id) == (1, 2)

    def test_unsupported_memory_is_none_with_reason(self, env: Env) -> None:
        env.write("device index=0", "device index=1 unsupported=memory")
        d0, d1 = SmiBackend(command=FAKE_CMD).snapshot(fields=Fields.MEMORY).devices
        assert d0.memory is not None
        assert d1.memory is None and "[N/A]" in (d1.why_unknown("memory") or "")
        assert d1.why_unknown("memory.used_bytes") == d1.why_unknown("memory")

    def test_older_placeholder_text(self, env: Env) -> None:
        env.write("device index=0 unsupported=memory,clock.sm")
        env.knob("FAKE_SMI_PLACEHOLDER", "[Not Supported]")
        d = SmiBackend(command=FAKE_CMD).snapshot().devices[0]
        assert d.memory is None and "[Not Supported]" in (d.why_unknown("memory") or "")
        assert d.clocks is not None and d.clocks.sm_mhz is None and d.clocks.graphics_mhz == 345
        assert "[Not Supported]" in (d.why_unknown("clocks.sm_mhz") or "")

    def test_unsupported_process_lists_are_unknown_not_empty(self, env: Env) -> None:
        env.write("device index=0 unsupported=processes.compute,processes.graphics,processes.mps")
        d = SmiBackend(command=FAKE_CMD).snapshot().devices[0]
        assert d.compute_processes is None and d.processes is None
        assert "N/A" in (d.why_unknown("processes.compute") or "")

    def test_names_with_commas_and_spaces(self, env: Env) -> None:
        # A real process whose argv[0] has commas and spaces, tied to the scenario with bound=1.
        child = subprocess.Popen(
            ["my, odd  name", "-S", "-c", "import time; time.sleep(60)"], executable=sys.executable
        )
        try:
            env.write("device index=0", f"process device=0 kind=compute pid={child.pid} used=1048576 bound=1")
            pids = SmiBackend(command=FAKE_CMD).snapshot().devices[0].compute_processes or ()
            assert [p.name for p in pids] == ["my, odd  name"]  # -q prints names unaltered
            csv = SmiBackend(command=FAKE_CMD, process_query="compute-apps")
            assert [p.name for p in csv.snapshot().devices[0].compute_processes or ()] == ["my? odd  name"]
            env.knob("FAKE_SMI_RAW_COMMAS", "1")  # a driver that does not sanitise commas
            assert [p.name for p in csv.snapshot().devices[0].compute_processes or ()] == ["my, odd  name"]
        finally:
            child.kill()
            child.wait()

    def test_killed_bound_process_leaves_and_its_memory_returns(self, env: Env) -> None:
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(60)"])
        try:
            env.write("device index=0", f"process device=0 kind=compute pid={child.pid} used=17179869184 bound=1")
            backend = SmiBackend(command=FAKE_CMD)
            busy = backend.snapshot(fields=Fields.WAIT).devices[0]
            assert busy.memory is not None and busy.memory.used_bytes == 16 * GIB
            assert [p.pid for p in busy.compute_processes or ()] == [child.pid]
        finally:
            child.kill()
            child.wait()
        clean = backend.snapshot(fields=Fields.WAIT).devices[0]
        assert clean.memory is not None and clean.memory.used_bytes == 0
        assert clean.processes == ()

    def test_scenario_from_the_builder(self, env: Env) -> None:
        from nvmlcheck.testing import Scenario

        scenario = Scenario.h200(devices=2)
        scenario.add_process(1, pid=4123456, used_bytes=2 * GIB)
        scenario.write(env.path)
        snap = SmiBackend(command=FAKE_CMD).snapshot(fields=Fields.WAIT)
        assert [d.memory.used_bytes if d.memory else None for d in snap.devices] == [0, 2 * GIB]
        assert [p.pid for p in snap.devices[1].processes or ()] == [4123456]

    def test_timeline_ms_lines(self, env: Env) -> None:
        env.write(
            "device index=0",
            "process device=0 kind=compute pid=4123456 used=1048576",
            "at ms=0 process device=0 kind=compute pid=4123456 remove=1",
            "at ms=100000000 device index=0 used=1048576",
            "at call=1000000 device index=0 used=5",  # not reached (at call=N: tests/contract)
        )
        d = SmiBackend(command=FAKE_CMD).snapshot(fields=Fields.WAIT).devices[0]
        assert d.processes == () and d.memory is not None and d.memory.used_bytes == 0


# --- what each snapshot runs ------------------------------------------------------------------------------------------


class TestInvocations:
    def test_memory_only_is_one_run(self, env: Env, two_gpus: SmiBackend) -> None:
        two_gpus.snapshot(fields=Fields.MEMORY)
        (run,) = env.runs()
        assert run == ["--query-gpu=index,uuid,memory.total,memory.used,memory.free,memory.reserved,mig.mode.current",
                       "--format=csv,nounits"]  # fmt: skip

    def test_wait_fields_are_two_runs(self, env: Env, two_gpus: SmiBackend) -> None:
        two_gpus.snapshot(fields=Fields.WAIT)
        runs = env.runs()
        assert len(runs) == 2 and ["-q", "-d", "PIDS"] in runs

    def test_health_without_retired_pages_adds_no_run(self, env: Env, two_gpus: SmiBackend) -> None:
        d = two_gpus.snapshot(fields=Fields.HEALTH).devices[0]
        assert len(env.runs()) == 1
        assert d.health is not None and d.health.retired_pages is None  # H200: not supported
        assert d.health.remapped_rows is not None and d.health.remapped_rows.correctable == 0
        assert "[N/A]" in (d.why_unknown("health.retired_pages") or "")
        assert d.memory is None and d.why_unknown("memory") == "not requested"

    def test_retired_pages_are_listed_when_counted(self, env: Env) -> None:
        env.write(
            "device index=0 unsupported= retired=sbe:0x1000@1700000000,dbe:0x2000@1700000100 retired_pending=1 "
            "remapped=1,2,1,0",
            "device index=1 unsupported=",
        )
        backend = SmiBackend(command=FAKE_CMD)
        env.runs()
        d0, d1 = backend.snapshot(fields=Fields.HEALTH).devices
        assert d0.health is not None and d0.health.retired_pages == (
            RetiredPage(0x1000, RetirementCause.MULTIPLE_SINGLE_BIT_ECC, 1700000000),
            RetiredPage(0x2000, RetirementCause.DOUBLE_BIT_ECC, 1700000100),
        )
        assert d0.health.retired_pages_pending is True
        assert d0.health.remapped_rows is not None
        assert (d0.health.remapped_rows.correctable, d0.health.remapped_rows.pending) == (1, True)
        assert d1.health is not None and d1.health.retired_pages == () and d1.health.retired_pages_pending is False
        runs = env.runs()
        assert len(runs) == 2 and runs[1][0].startswith("--query-retired-pages=")

    def test_clocks(self, env: Env, two_gpus: SmiBackend) -> None:
        d = two_gpus.snapshot(fields=Fields.CLOCKS).devices[1]
        assert d.clocks is not None
        assert (d.clocks.graphics_mhz, d.clocks.sm_mhz, d.clocks.memory_mhz, d.clocks.video_mhz) == (
            345,
            345,
            3201,
            765,
        )
        assert (d.clocks.max.graphics_mhz, d.clocks.max.sm_mhz, d.clocks.max.memory_mhz) == (1980, 1980, 3201)
        assert d.clocks.max.video_mhz is None and "no clocks.max.video" in (d.why_unknown("clocks.max.video_mhz") or "")
        assert d.clocks.event_reasons == ClockEventReason.GPU_IDLE

    def test_selected_indices(self, env: Env, two_gpus: SmiBackend) -> None:
        snap = two_gpus.snapshot([1], Fields.WAIT)
        assert [d.index for d in snap.devices] == [1]
        assert all(run[:2] == ["-i", "1"] for run in env.runs())
        with pytest.raises(InvalidArgument):
            two_gpus.snapshot([5])

    def test_refused_fields_are_dropped_once_and_remembered(self, env: Env) -> None:
        env.write("device index=0")
        env.knob("FAKE_SMI_REFUSE_FIELDS", "memory.reserved,remapped_rows.pending,clocks_throttle_reasons.active")
        backend = SmiBackend(command=FAKE_CMD)
        env.runs()
        d = backend.snapshot(fields=Fields.MEMORY | Fields.CLOCKS | Fields.HEALTH).devices[0]
        assert d.memory is not None and d.memory.reserved_bytes is None and d.memory.used_includes_reserved
        assert d.health is not None and d.health.remapped_rows is None
        assert "does not know" in (d.why_unknown("health.remapped_rows") or "")
        assert d.clocks is not None and d.clocks.event_reasons == ClockEventReason.GPU_IDLE  # newer name used
        assert len(env.runs()) == 4  # three refusals, then the answer
        backend.snapshot(fields=Fields.MEMORY | Fields.CLOCKS | Fields.HEALTH)
        (run,) = env.runs()
        assert "memory.reserved" not in run[0] and "clocks_event_reasons.active" in run[0]

    def test_a_driver_without_the_health_fields_of_issue_22(self, env: Env) -> None:
        # An older nvidia-smi knows no gpu_recovery_action (driver 565 added it): that value alone is unknown, the
        # rest of the health is read, and the refusal is remembered.
        env.write("device index=0 remapped=0,1,1,0 ecc_volatile=2 recovery=1")
        env.knob("FAKE_SMI_REFUSE_FIELDS", "gpu_recovery_action,ecc.errors.uncorrected.aggregate.total")
        backend = SmiBackend(command=FAKE_CMD)
        env.runs()
        h = backend.snapshot(fields=Fields.HEALTH).devices[0]
        assert h.health is not None and h.health.recovery_action is None
        assert "does not know the field gpu_recovery_action" in (h.why_unknown("health.recovery_action") or "")
        assert h.health.ecc_uncorrected_aggregate is None and h.why_unknown("health.ecc_uncorrected_aggregate")
        assert h.health.ecc_uncorrected_volatile == 2
        assert [c.code for c in h.health.causes()] == ["row-remap-pending", "ecc-uncorrected-volatile"]
        assert len(env.runs()) == 3
        backend.snapshot(fields=Fields.HEALTH)
        (run,) = env.runs()
        assert "gpu_recovery_action" not in run[0] and "ecc.errors.uncorrected.volatile.total" in run[0]


# --- failures -----------------------------------------------------------------------------------------------------


class TestFailures:
    def test_lost_gpu_is_a_device_failure_and_the_others_report(self, env: Env) -> None:
        env.write("device index=0", "device index=1")
        backend = SmiBackend(command=FAKE_CMD)
        env.write("device index=0", "device index=1 lost=1")
        snap = backend.snapshot()
        assert [d.index for d in snap.devices] == [0]
        (failure,) = snap.failures
        assert (failure.index, failure.uuid) == (1, UUID1)
        assert isinstance(failure.error, GpuLost) and "GPU is lost" in str(failure.error)

    def test_gpu_requiring_reset_is_a_device_failure(self, env: Env) -> None:
        env.write("device index=0", "device index=1")
        backend = SmiBackend(command=FAKE_CMD)
        env.write("device index=0", "device index=1 lost=1")
        env.knob("FAKE_SMI_LOST_STYLE", "placeholder")
        snap = backend.snapshot(fields=Fields.MEMORY)
        assert [d.index for d in snap.devices] == [0]
        assert isinstance(snap.failures[0].error, GpuRequiresReset)

    def test_driver_gone_during_a_session_raises(self, env: Env, two_gpus: SmiBackend) -> None:
        env.knob("FAKE_SMI_EXIT", "9")
        with pytest.raises(DriverNotLoaded):
            two_gpus.snapshot()

    def test_hanging_process_query_times_out_the_snapshot(self, env: Env) -> None:
        env.write("device index=0")
        backend = SmiBackend(command=FAKE_CMD, timeout_s=1.0)
        env.knob("FAKE_SMI_HANG", "1")
        env.knob("FAKE_SMI_MATCH", "PIDS")
        with pytest.raises(SmiTimeout) as info:
            backend.snapshot()
        # The hung -q -d PIDS, or (on loaded CI cores) the --query-gpu run beside it that could not start within its
        # 1 s: either way the snapshot ends with the timeout, never hangs.
        assert "PIDS" in str(info.value) or "--query-gpu" in str(info.value), info.value

    def test_closed_backend_refuses(self, two_gpus: SmiBackend) -> None:
        two_gpus.close()
        two_gpus.close()  # idempotent
        with pytest.raises(BackendUnavailable, match="closed"):
            two_gpus.snapshot()

    def test_a_gpu_replaced_at_its_index_is_not_read_as_the_old_one(self, env: Env) -> None:
        env.write("device index=0")
        backend = SmiBackend(command=FAKE_CMD)
        env.write('device index=0 uuid=GPU-11111111-2222-3333-4444-555555555555 name="Other"')
        snap = backend.snapshot(fields=Fields.MEMORY)
        # As NVML's handle of a GPU that went away: GPU 0 is the GPU it was when the backend was opened.
        assert snap.devices == ()
        (failure,) = snap.failures
        assert (failure.index, failure.uuid) == (0, UUID0) and isinstance(failure.error, GpuLost)
        assert "GPU-11111111-2222-3333-4444-555555555555" in str(failure.error) and "renumbered" in str(failure.error)
        env.runs()
        assert backend.snapshot(fields=Fields.MEMORY).failures  # still GPU 0's failure
        assert len(env.runs()) == 1, "the GPU that could not be pinned is looked up once, not at every poll"
        assert SmiBackend(command=FAKE_CMD).snapshot().devices[0].name == "Other"  # opened again: the new numbering


class TestAVanishedGpu:
    """GPU 0 leaves the driver's list between two runs (it fell off the bus and was removed): nvidia-smi numbers the
    GPU it still sees from 0, so its "GPU 0" is the old GPU 1. The backend reads GPUs by the UUID pinned to each index
    when it opened, so no index ever reports another GPU's reading (before: the old GPU 1's idle reading was GPU 0's,
    and a wait on a busy GPU 0 could end "clean")."""

    @pytest.fixture
    def vanished(self, env: Env) -> SmiBackend:
        env.write("device index=0 used=8589934592", "device index=1")  # GPU 0 busy (8 GiB), GPU 1 idle
        backend = SmiBackend(command=FAKE_CMD)
        env.write(f"device index=0 uuid={UUID1} pci=00000000:02:00.0")  # only the old GPU 1 is left, numbered 0
        return backend

    @pytest.mark.parametrize("indices", [[0], [0, 1], None])
    def test_the_vanished_index_is_a_failure_never_the_other_gpus_reading(
        self, vanished: SmiBackend, indices: list[int] | None
    ) -> None:
        snap = vanished.snapshot(indices)
        assert all(d.uuid != UUID1 or d.index == 1 for d in snap.devices)
        assert 0 not in [d.index for d in snap.devices]
        (failure,) = snap.failures
        assert (failure.index, failure.uuid) == (0, UUID0) and isinstance(failure.error, GpuLost)
        assert UUID1 in str(failure.error) and "renumbered" in str(failure.error)

    @pytest.mark.parametrize("indices", [[1], [0, 1], None])
    def test_the_gpu_still_there_keeps_its_index(self, vanished: SmiBackend, indices: list[int] | None) -> None:
        # -i 1 names no GPU for nvidia-smi now ("No devices were found"); the backend reads every GPU instead.
        for _ in range(2):
            d = vanished.snapshot(indices).device(1)
            assert d.uuid == UUID1 and d.memory is not None and d.memory.used_bytes == 0
            assert d.compute_processes == ()

    def test_a_wait_on_the_vanished_gpu_is_never_clean(self, vanished: SmiBackend) -> None:
        from nvmlcheck.predicates import default_predicate

        snap = vanished.snapshot([0], Fields.WAIT)
        assert not snap.devices and snap.failures
        assert not default_predicate()(snap).clean

    @pytest.mark.parametrize("indices", [[1], [0, 1], None])
    @pytest.mark.parametrize("fields", [Fields.MEMORY, Fields.WAIT])
    def test_every_gpu_gone_is_each_gpu_lost(
        self, env: Env, two_gpus: SmiBackend, indices: list[int] | None, fields: Fields
    ) -> None:
        # nvidia-smi now says "No devices were found" (exit 6) to every run: each GPU is lost, as NVML's handles
        # would answer, never an error that hides which GPUs were asked for, and never an idle GPU.
        env.knob("FAKE_SMI_EXIT", "6")
        snap = two_gpus.snapshot(indices, fields)
        assert snap.devices == ()
        assert [f.index for f in snap.failures] == (indices or [0, 1])
        assert all(isinstance(f.error, GpuLost) and "No devices were found" in str(f.error) for f in snap.failures)
        assert [f.uuid for f in snap.failures] == [[UUID0, UUID1][i] for i in indices or [0, 1]]

    def test_two_rows_for_one_gpu_are_refused(self, env: Env, two_gpus: SmiBackend) -> None:
        env.write("device index=0", "device index=1 uuid=" + UUID0)
        with pytest.raises(SmiParseError, match="a second row for GPU"):
            two_gpus.snapshot()


# --- a real GPU ---------------------------------------------------------------------------------------------------


@pytest.mark.gpu
class TestAgainstNvmlOnARealGpu:
    """On a GPU host (pytest --require-gpu): the smi snapshot equals the NVML one to the MiB (nvidia-smi rounds up),
    idle and with a process holding memory. Values that move are bracketed by an NVML read before and after."""

    def compare(self) -> None:
        from nvmlcheck.backends.nvml import NvmlBackend

        nvml = NvmlBackend()
        smi = SmiBackend()
        try:
            before = nvml.snapshot(fields=Fields.WAIT)
            middle = smi.snapshot(fields=Fields.WAIT)
            after = nvml.snapshot(fields=Fields.WAIT)
        finally:
            nvml.close()
        for d in middle.devices:
            a, b = before.device(d.index), after.device(d.index)
            assert d.uuid == a.uuid
            assert d.memory is not None and a.memory is not None and b.memory is not None
            for attr in ("total_bytes", "used_bytes", "free_bytes", "reserved_bytes"):
                seen = {ceil_mib(getattr(m, attr) or 0) for m in (a.memory, b.memory)}
                assert getattr(d.memory, attr) in seen, attr
            smi_procs = [(p.pid, p.used_bytes) for p in d.compute_processes or ()]
            nvml_procs = [
                [(p.pid, None if p.used_bytes is None else ceil_mib(p.used_bytes)) for p in s.compute_processes or ()]
                for s in (a, b)
            ]
            assert smi_procs in nvml_procs

    def test_idle_and_busy(self) -> None:
        self.compare()
        holder = subprocess.Popen(
            [sys.executable, "-m", "nvmlcheck.holder", "--bytes", "1GiB"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline().startswith("ready")
            self.compare()
        finally:
            holder.kill()
            holder.wait()
