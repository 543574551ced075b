"""The exception tree: every nvml.h return code has its class, messages stand alone, everything pickles."""

from __future__ import annotations

import pickle
import re

import pytest

import nvmlcheck as nc
from nvmlcheck import errors
from nvmlcheck.testing import find_nvml_header


def _codes_in_header() -> dict[str, int]:
    text = find_nvml_header().read_text(errors="replace")
    body = text[text.index("typedef enum nvmlReturn_enum") :]
    body = body[: body.index("} nvmlReturn_t;")]
    return {m[1]: int(m[2]) for m in re.finditer(r"\b(NVML_(?:ERROR_[A-Z_]+|SUCCESS))\s*=\s*(\d+)", body)}


def test_every_code_in_nvml_h_has_its_own_class() -> None:
    header = _codes_in_header()
    assert header.pop("NVML_SUCCESS") == 0
    assert len(header) >= 30  # the parse found the enum, not an empty slice
    for name, code in header.items():
        cls = errors.error_class_for_code(code)
        assert cls is not errors.Unknown or code == 999, f"{name} ({code}) falls back to Unknown"
        assert code == cls.CODE
        assert name == cls.CODE_NAME
    # and no class claims a code the header does not define
    assert set(errors.KNOWN_CODES) == set(header.values())


def test_classes_are_distinct_and_subclass_nvml_error() -> None:
    classes = [errors.error_class_for_code(c) for c in errors.KNOWN_CODES]
    assert len(set(classes)) == len(classes)
    for cls in classes:
        assert issubclass(cls, nc.NvmlError)
        assert issubclass(cls, nc.NvmlCheckError)
        assert cls.__module__ == "nvmlcheck"
        assert getattr(nc, cls.__name__) is cls


def test_unknown_code_keeps_its_number() -> None:
    exc = errors.error_class_for_code(4242)(4242, "nvmlDeviceGetFoo", 3)
    assert isinstance(exc, nc.Unknown)
    assert exc.code == 4242
    assert "4242" in str(exc) and "nvmlDeviceGetFoo" in str(exc) and "GPU 3" in str(exc)


@pytest.mark.parametrize("code", [9, 12, 18])
def test_driver_level_errors_are_backend_unavailable(code: int) -> None:
    exc = errors.error_class_for_code(code)(code, "nvmlInit_v2")
    assert isinstance(exc, nc.BackendUnavailable)
    assert isinstance(exc, nc.NvmlError)


def test_messages_name_function_device_and_remedy() -> None:
    exc = nc.GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1)
    text = str(exc)
    assert "nvmlDeviceGetMemoryInfo_v2" in text
    assert "GPU 1" in text
    assert "NVML_ERROR_GPU_IS_LOST (15)" in text
    assert "reset" in text


@pytest.mark.parametrize(
    "exc",
    [
        nc.GpuLost(15, "nvmlDeviceGetMemoryInfo_v2", 1, "detail"),
        nc.DriverNotLoaded(9, "nvmlInit_v2"),
        nc.BackendUnavailable("nothing", ["nvml: missing", "smi: missing"]),
        nc.SmiError(["nvidia-smi", "-q"], 9, "NVIDIA-SMI has failed", "no driver"),
        nc.SmiTimeout(["ssh", "h", "nvidia-smi"], 2.5),
        nc.SmiParseError("wrong column count", 3, "a, b"),
        nc.CorruptData("PID 0", "nvmlDeviceGetComputeRunningProcesses_v3", 0),
        nc.WaitTimeout(3.0, 3_000_000_000, ["GPU 0: pid 12 holds 1 GiB"], None, 7),
    ],
)
def test_exceptions_pickle_with_their_message(exc: Exception) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.__dict__ == exc.__dict__


def test_wait_timeout_is_a_timeout_error() -> None:
    exc = nc.WaitTimeout(1.0, 1_001_000_000, ["GPU 0: pid 7 (python3) holds 16.0 GiB (compute)"])
    assert isinstance(exc, TimeoutError)
    assert "pid 7 (python3)" in str(exc)
    assert "1.001 s" in str(exc)


def test_wait_timeout_says_still_held_only_when_something_holds() -> None:
    import nvmlcheck as nc

    unconfirmed = nc.WaitTimeout(0.0002, 300_000, [
        "clean at the last poll, but only 1 of the 2 consecutive clean polls required were seen before the deadline"
    ], None, 1)
    assert "still held" not in str(unconfirmed) and "not confirmed clean" in str(unconfirmed)
    assert "1 poll)" in str(unconfirmed)
    held = nc.WaitTimeout(1.0, 10**9, ["GPU 0: pid 5 (python) holds 1.0 GiB (compute)"], None, 3)
    assert "still held" in str(held) and "3 polls" in str(held)
