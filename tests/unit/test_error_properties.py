"""Transient / fatal and "value unknown" / "GPU failed" are properties of the exception class (errors.py), and every
reader (the wait, the NVML backend, the raw-code set in _nvml/calls.py) takes them from there.

These test the mechanism: each class declares its properties, the readers follow the class (changing a class's
property changes their answer), and a class that declares nothing gets the documented default.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

import nvmlcheck as nc
from nvmlcheck import errors
from nvmlcheck._nvml import calls
from nvmlcheck.backends import nvml as nvml_backend
from nvmlcheck.wait import is_transient

if TYPE_CHECKING:
    from nvmlcheck.errors import Scope

SCOPES: tuple[Scope, ...] = ("value", "read", "device")
CODE_CLASSES = [errors.error_class_for_code(code) for code in errors.KNOWN_CODES]


def _public_error_classes() -> list[type[nc.NvmlCheckError]]:
    return [
        obj
        for obj in (getattr(nc, name) for name in nc.__all__)
        if isinstance(obj, type) and issubclass(obj, nc.NvmlCheckError)
    ]


def _bare(cls: type[BaseException]) -> BaseException:
    """An instance without running ``__init__`` (the constructors differ; only the class matters here)."""
    return cls.__new__(cls)


@pytest.mark.parametrize("cls", CODE_CLASSES, ids=lambda c: c.__name__)
def test_every_nvml_code_declares_its_properties_itself(cls: type[nc.NvmlError]) -> None:
    # Declared by its own registration, not inherited by accident from NvmlError or BackendUnavailable.
    own = vars(cls)
    assert isinstance(own["TRANSIENT"], bool)
    assert own["SCOPE"] in SCOPES
    assert isinstance(own["WHY_UNKNOWN"], str)


@pytest.mark.parametrize("cls", _public_error_classes(), ids=lambda c: c.__name__)
def test_is_transient_is_the_class_property(cls: type[nc.NvmlCheckError]) -> None:
    assert isinstance(cls.TRANSIENT, bool)
    assert is_transient(_bare(cls)) is cls.TRANSIENT


@pytest.mark.parametrize("code", [*errors.KNOWN_CODES, 4242])
def test_an_instance_from_a_code_is_transient_as_its_class_says(code: int) -> None:
    cls = errors.error_class_for_code(code)
    assert is_transient(cls(code, "nvmlDeviceGetFoo", 0)) is cls.TRANSIENT


@pytest.mark.parametrize(("cls", "flipped"), [(nc.Timeout, False), (nc.NotSupported, True), (nc.SmiParseError, True)])
def test_is_transient_follows_a_changed_declaration(
    monkeypatch: pytest.MonkeyPatch, cls: type[nc.NvmlCheckError], flipped: bool
) -> None:
    assert is_transient(_bare(cls)) is not flipped
    monkeypatch.setattr(cls, "TRANSIENT", flipped)
    assert is_transient(_bare(cls)) is flipped


def test_subclasses_without_a_declaration_get_the_documented_defaults() -> None:
    class Plain(nc.NvmlCheckError):
        pass

    class Nvml(nc.NvmlError):
        pass

    class FromSmi(nc.SmiError):
        pass

    class FromTransport(nc.SmiTransportError):
        pass

    class FromUnknown(nc.Unknown):
        pass

    class FromLost(nc.GpuLost):
        pass

    assert not is_transient(_bare(Plain))  # NvmlCheckError: fatal
    assert not is_transient(_bare(Nvml)) and Nvml.SCOPE == "read" and Nvml.WHY_UNKNOWN == ""
    assert is_transient(_bare(FromSmi))  # inherited, like the class itself
    assert not is_transient(_bare(FromTransport))
    assert is_transient(_bare(FromUnknown)) and FromUnknown.SCOPE == "read"
    assert not is_transient(_bare(FromLost)) and FromLost.SCOPE == "device"


def test_foreign_exceptions_are_never_transient_even_with_the_attribute() -> None:
    class Lookalike(Exception):
        TRANSIENT = True

    assert not is_transient(Lookalike())


def test_a_registration_must_say_whether_it_is_transient() -> None:
    with pytest.raises(TypeError):
        errors._code(4000, "NVML_ERROR_SOMETHING")  # type: ignore[call-arg]


def test_a_new_code_needs_only_its_registration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_CODE_CLASSES", dict(errors._CODE_CLASSES))
    monkeypatch.setattr(errors, "_CODE_NAMES", dict(errors._CODE_NAMES))

    @errors._code(4000, "NVML_ERROR_SOMETHING_NEW", "Do something", transient=True, scope="device")
    class SomethingNew(nc.NvmlError):
        """NVML_ERROR_SOMETHING_NEW (4000)."""

    exc = errors.error_class_for_code(4000)(4000, "nvmlDeviceGetFoo", 1)
    assert type(exc) is SomethingNew and errors.code_name(4000) == "NVML_ERROR_SOMETHING_NEW"
    assert is_transient(exc)
    assert 4000 in errors.codes_in_scope("device")
    assert 4000 not in errors.codes_in_scope("read") | errors.codes_in_scope("value")
    assert "NVML_ERROR_SOMETHING_NEW (4000)" in str(exc) and "Do something" in str(exc)


def test_scopes_partition_the_known_codes() -> None:
    sets = [errors.codes_in_scope(s) for s in SCOPES]
    assert all(sets)  # each scope has at least one code
    assert sum(len(s) for s in sets) == len(errors.KNOWN_CODES)
    assert set().union(*sets) == set(errors.KNOWN_CODES)
    for scope, codes in zip(SCOPES, sets, strict=True):
        assert all(scope == errors.error_class_for_code(c).SCOPE for c in codes)


def test_the_raw_code_set_of_the_nvml_calls_is_the_device_scope() -> None:
    # Built once at import from the classes, so the per-call path stays one set lookup.
    assert isinstance(calls._DEVICE_LEVEL_CODES, frozenset)
    assert errors.codes_in_scope("device") == calls._DEVICE_LEVEL_CODES
    assert 4242 not in calls._DEVICE_LEVEL_CODES  # an unknown code has Unknown's scope, "read"


@pytest.mark.parametrize("code", [*errors.KNOWN_CODES, 4242])
def test_both_unknown_reasons_follow_the_class_wording(code: int) -> None:
    cls = errors.error_class_for_code(code)
    from_code = nvml_backend._code_reason("nvmlDeviceGetFoo", code)
    from_error = nvml_backend._reason(cls(code, "nvmlDeviceGetFoo", 0))
    if cls.WHY_UNKNOWN:
        assert from_code == from_error == cls.WHY_UNKNOWN.format(function="nvmlDeviceGetFoo")
    else:
        for text in (from_code, from_error):
            assert text.startswith("unreadable: ") and "nvmlDeviceGetFoo" in text and f"({code})" in text


def test_the_value_scope_codes_have_their_own_wording() -> None:
    # A value that does not exist here says so (not "unreadable"): every "value" code words it.
    for code in errors.codes_in_scope("value"):
        assert "{function}" in errors.error_class_for_code(code).WHY_UNKNOWN
