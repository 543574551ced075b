"""A wrong argument to a public function is refused where it is given, naming it, as the exception tree says (an
``ArgumentError`` is a ``ValueError``, an ``ArgumentTypeError`` a ``TypeError``, both ``NvmlCheckError``): never an
``AttributeError`` from deep inside, a later failure in a wait, or a string read digit by digit."""

from __future__ import annotations

import pytest

import nvmlcheck as nc
from nvmlcheck._proc.devfiles import device_file_patterns
from nvmlcheck.cudamap import cuda_mapping
from nvmlcheck.wait import PollPolicy


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
])
def test_a_wrong_argument_is_refused_where_it_is_given(call: object, error: type[Exception]) -> None:
    with pytest.raises(error) as caught:
        call()  # type: ignore[operator]
    assert isinstance(caught.value, nc.NvmlCheckError)
