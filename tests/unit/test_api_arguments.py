"""A wrong argument to a public function is refused where it is given, naming it, as the exception tree says (an
``ArgumentError`` is a ``ValueError``, an ``ArgumentTypeError`` a ``TypeError``, both ``NvmlCheckError``): never an
``AttributeError`` from deep inside, a later failure in a wait, or a string read digit by digit."""

from __future__ import annotations

import time

import pytest

import nvmlcheck as nc
from nvmlcheck._proc.devfiles import device_file_patterns
from nvmlcheck.cudamap import cuda_mapping
from nvmlcheck.wait import Deadline, PollPolicy


class _NoBackend:
    """A backend for argument checks: any read fails the test (an argument is refused before anything is read)."""

    name = "nvml"

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the backend was used ({name}) before the arguments were checked")


def _idle_snapshot() -> nc.Snapshot:
    return _two_gpus()


def _session() -> nc.Session:
    return nc.Session(_NoBackend())  # type: ignore[arg-type]


def _two_gpus() -> nc.Snapshot:
    return nc.Snapshot(backend="nvml", taken_ns=0, duration_ns=0, wall_time=0.0,
                       system=nc.SystemInfo(driver_version=None, nvml_version=None, cuda_driver_version=None),
                       devices=(_gpu(0), _gpu(1)))


def _gpu(index: int) -> nc.DeviceState:
    return nc.DeviceState(index=index, uuid=f"GPU-{index}", name=None, pci_bus_id=None, serial=None,
                          minor_number=None, memory=None, compute_processes=None, graphics_processes=None,
                          mps_processes=None, clocks=None, health=None)


@pytest.mark.parametrize(("call", "error"), [
    (lambda: nc.memory_back_to("x"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.on_devices([0], "x"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.on_devices([0], None), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.no_processes("cuda"), nc.ArgumentError),
    (lambda: nc.no_processes([1]), nc.ArgumentError),  # type: ignore[list-item]
    (lambda: nc.pids_gone("123"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.pids_gone(123), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.default_predicate(tolerance_bytes=-1), nc.ArgumentError),
    (lambda: cuda_mapping((), {"CUDA_VISIBLE_DEVICES": 0}), nc.ArgumentTypeError),  # type: ignore[dict-item]
    (lambda: cuda_mapping((), [1]), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: device_file_patterns(3), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: PollPolicy.every(1e300), nc.ArgumentError),  # it overflowed inside the wait
    (lambda: nc.pids_gone(None), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.pids_gone([[1]]), nc.ArgumentTypeError),  # type: ignore[list-item]
    # open()'s arguments are checked before anything is loaded or run (they raised TypeError, ValueError)
    (lambda: nc.open("nvml", library_path=3), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.open("nvml", library_path=""), nc.ArgumentError),
    (lambda: nc.open("nvml", library_path=b"/lib/libnvidia-ml.so.1"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.open("nvml", init_timeout_s="1"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.open("nvml", init_timeout_s=True), nc.ArgumentTypeError),
    (lambda: nc.open("smi", smi_timeout_s="x"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.open("smi", smi_prefix=3), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: nc.open("smi", smi_timeout_s=10**400), nc.ArgumentError),  # OverflowError
    (lambda: nc.open("nvml", init_timeout_s=10**400), nc.ArgumentError),
    (lambda: nc.open("smi", smi_command=[b"nvidia-smi"]), nc.ArgumentTypeError),  # type: ignore[list-item]
    (lambda: nc.open("smi", smi_prefix="ssh 'gpu01"), nc.ArgumentError),  # an unclosed quote
    (lambda: _session().select_clean(1, lock=True, lock_dir=3), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: _session().select_clean(1, lock=True, lock_dir=""), nc.ArgumentError),  # it locked in "."
    (lambda: _session().select_clean(1, clock=None), nc.ArgumentTypeError),  # type: ignore[arg-type]
    (lambda: _two_gpus().device(0).processes_of("cuda"), nc.ArgumentError),  # it answered the MPS list
    (lambda: _two_gpus().device(True), nc.ArgumentTypeError),  # it answered GPU 1
    (lambda: _two_gpus().device(1.0), nc.ArgumentTypeError),  # type: ignore[arg-type]
    # wait.Deadline.after, for a snapshot_fn of one's own (ValueError, OverflowError and TypeError from round())
    (lambda: Deadline.after(float("nan")), nc.ArgumentError),
    (lambda: Deadline.after(float("inf")), nc.ArgumentError),
    (lambda: Deadline.after(1e300), nc.ArgumentError),
    (lambda: Deadline.after(-1.0), nc.ArgumentError),
    (lambda: Deadline.after("1"), nc.ArgumentTypeError),  # type: ignore[arg-type]
    # a snapshot_fn of one's own that returns something else (AttributeError from inside the poller)
    (lambda: nc.poll_until(lambda: None, timeout=0), nc.ArgumentTypeError),  # type: ignore[arg-type]
    # time.monotonic (seconds) for time.monotonic_ns: the timeout was read in ns of it (30 s became ~950 years)
    (lambda: nc.poll_until(_idle_snapshot, timeout=30, clock=time.monotonic), nc.ArgumentTypeError),  # type: ignore[arg-type]
])
def test_a_wrong_argument_is_refused_where_it_is_given(call: object, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        call()  # type: ignore[operator]
    assert isinstance(caught.value, nc.NvmlCheckError)


def test_a_process_kind_given_by_its_value_names_that_list() -> None:
    from snapshots import dev, proc

    gpu = dev(0, procs=[proc(11)], graphics=[proc(12)], mps=[])
    assert gpu.processes_of("compute") == gpu.compute_processes  # it was the MPS list, ()
    assert gpu.processes_of("graphics") == gpu.graphics_processes
    assert gpu.processes_of(nc.ProcessKind.MPS) == ()


def test_a_gpu_that_could_not_be_read_is_not_said_to_be_missing_from_the_snapshot() -> None:
    from snapshots import dev, failure, snap

    lost = nc.GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1)
    taken = snap(dev(0), failures=[failure(1, lost)])
    with pytest.raises(nc.NoSuchDevice) as caught:
        taken.device(1)
    assert "not in this snapshot" not in str(caught.value)  # it is: it could not be read
    assert "could not be read" in str(caught.value) and caught.value.__cause__ is lost


def test_an_exception_given_one_line_as_a_str_keeps_it_whole() -> None:
    # A tool author's backend raising these: a str was split into one line (or word) per character.
    assert nc.WaitTimeout(1.0, 5, "GPU 0: pid 7 holds 1 GiB").culprits == ("GPU 0: pid 7 holds 1 GiB",)
    assert nc.BackendUnavailable("no backend", "nvml: no library").attempts == ("nvml: no library",)
    assert nc.SmiError("nvidia-smi", 9, "").argv == ("nvidia-smi",)
