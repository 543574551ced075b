"""How long the driver takes to give GPU memory back after its holders exit: a fitted model, per driver.

``expected_ns(...)`` is the time from the last holder's exit to the memory being back, from the number of contexts
torn down, the device memory they held, the pinned host memory they held and the CUDA IPC importers still alive.
``stuck_after_ns(...)`` is the bound past which memory held with no holder is judged *stuck* (a reset is needed)
rather than still being reclaimed. The coefficients are per driver branch (a table code can extend with
:func:`register`); an unknown driver gets the most conservative entry. ``ready``'s ETA and its "stuck" verdict read
this module; the reclaim study (docs/reclaim-study.md, "the model") fits and publishes the numbers. It imports only
the standard library, so the launch path can read it.
"""

from __future__ import annotations

import math

from ._record import record
from .errors import ArgumentError, ArgumentTypeError

__all__ = ["COEFFICIENTS", "ReclaimModel", "expected_ns", "model_for", "register", "stuck_after_ns", "terms"]

_GIB = 1 << 30

#: The model's coefficients (fields of :class:`ReclaimModel`), in the order of :func:`terms`.
COEFFICIENTS: tuple[str, ...] = ("base_ns", "per_context_ns", "per_device_gib_ns", "per_pinned_gib_ns",
                                 "per_importer_ns")


def terms(contexts: int = 1, device_bytes: int = 0, pinned_host_bytes: int = 0,
          importers: int = 0) -> tuple[float, ...]:
    """What each of :data:`COEFFICIENTS` multiplies: 1, the contexts beyond the first, device GiB, pinned host GiB,
    importers; all 0 when nothing is torn down (no context and no importer). The study's fit uses the same terms.
    ``contexts`` counts the processes' own contexts, ``importers`` the CUDA IPC importers (each with its context)."""
    _check_counts(contexts=contexts, device_bytes=device_bytes, pinned_host_bytes=pinned_host_bytes,
                  importers=importers)
    if contexts == 0 and importers == 0:
        return (0.0,) * len(COEFFICIENTS)
    return (1.0, float(max(contexts - 1, 0)), device_bytes / _GIB, pinned_host_bytes / _GIB, float(importers))


@record  # not @dataclass: `ready` reads this module, and dataclasses costs its start-up milliseconds
class ReclaimModel:
    """Linear model of the time to memory-back after the holders exit, in ns, with its error.

    ``base_ns``: one context; ``per_context_ns``: each further context (teardowns are serialised);
    ``per_device_gib_ns`` / ``per_pinned_gib_ns``: each GiB of device / pinned host memory held;
    ``per_importer_ns``: each CUDA IPC importer; ``error_ns``: the largest residual of the fit (the ETA's ±);
    ``stuck_factor``: how many times the expected time (plus the error) memory may stay held with no holder before it
    is called stuck; ``source``: where the figures come from (document and data set).

    What the figures were measured on, so that an ETA outside it is said to be an extrapolation (:meth:`beyond`):
    ``gpu``, the GPU model(s) of the runs fitted (``", "``-joined when pooled); ``max_contexts``,
    ``max_device_bytes``, ``max_pinned_bytes``, ``max_importers``, the largest of each term in a run fitted (0: no
    run had it, the coefficient is not this data's). ``None``: not recorded (an entry measured on nothing, such as
    the conservative fallback): every ETA of it is a guess.
    """

    driver: str
    base_ns: int
    per_context_ns: int
    per_device_gib_ns: int
    per_pinned_gib_ns: int
    per_importer_ns: int
    error_ns: int
    stuck_factor: float
    source: str
    gpu: str | None = None
    max_contexts: int | None = None
    max_device_bytes: int | None = None
    max_pinned_bytes: int | None = None
    max_importers: int | None = None

    def expected_ns(self, contexts: int = 1, device_bytes: int = 0, pinned_host_bytes: int = 0,
                    importers: int = 0) -> int:
        """The expected time from the holders' exit to the memory being back (ns): the sum of each coefficient times
        its :func:`terms`; 0 when nothing is torn down (no context, no importer)."""
        row = terms(contexts, device_bytes, pinned_host_bytes, importers)
        return int(sum(getattr(self, name) * t for name, t in zip(COEFFICIENTS, row, strict=True)))

    def beyond(self, contexts: int = 1, device_bytes: int = 0, pinned_host_bytes: int = 0, importers: int = 0,
               gpu: str | None = None) -> str | None:
        """Why :meth:`expected_ns` of these inputs is not backed by the data the model was fitted to (an
        extrapolation, or a model measured on nothing or on another GPU model), in words; ``None`` when every input
        is within what was measured (nothing torn down is always within it). ``gpu``: the GPU model the ETA is for
        (``None``: not known, not judged). The ETA's error within the data is :attr:`error_ns`."""
        _check_counts(contexts=contexts, device_bytes=device_bytes, pinned_host_bytes=pinned_host_bytes,
                      importers=importers)
        if contexts == 0 and importers == 0:
            return None
        ranges = (self.max_contexts, self.max_device_bytes, self.max_pinned_bytes, self.max_importers)
        if any(r is None for r in ranges):
            if self.driver == _FALLBACK:
                return "a driver not measured: the conservative fallback's figures, not a fit"
            return f"the driver {self.driver} entry records no measured range: not known to be within its data"
        why = []
        for name, value, most, size in (("contexts", contexts, self.max_contexts, False),
                                        ("device memory", device_bytes, self.max_device_bytes, True),
                                        ("pinned host memory", pinned_host_bytes, self.max_pinned_bytes, True),
                                        ("IPC importers", importers, self.max_importers, False)):
            assert most is not None
            if value > most:
                shown = (f"{value / _GIB:.1f} GiB {name} (measured up to {most / _GIB:.1f} GiB)" if size else
                         f"{value} {name} (measured up to {most})")
                why.append(shown)
        # The fit names each GPU model of its runs: ", " between pooled ones, " + " within a run on several.
        if gpu is not None and self.gpu is not None and gpu not in self.gpu.replace(" + ", ", ").split(", "):
            why.append(f"GPU model {gpu} (measured on {self.gpu})")
        return "beyond the measured data: " + ", ".join(why) if why else None

    def stuck_after_ns(self, contexts: int = 1, device_bytes: int = 0, pinned_host_bytes: int = 0,
                       importers: int = 0) -> int:
        """How long memory may stay held with no live holder before it is judged stuck (ns): never below 1 s."""
        expect = self.expected_ns(max(contexts, 1), device_bytes, pinned_host_bytes, importers)
        return max(1_000_000_000, math.ceil((expect + self.error_ns) * self.stuck_factor))


def _check_counts(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ArgumentError(f"{name} must be an int >= 0, got {value!r}")


# Driver branch ("580") -> model. The 580 figures are the reclaim study's fit of its third edition (one NVIDIA H200,
# 2026-12-01: pinned host memory, CUDA IPC importers, 64 GiB device memory) together with its second edition (two
# NVIDIA H200s, 2026-11-30: contexts), driver 580.159.04: 238 runs in 22 cells, each pin mode of pinned host memory
# (cuMemHostAlloc, cuMemHostRegister) its own cell, as `nvmlcheck study fit ... --across ending,pin_mode` prints it
# (docs/reclaim-study.md, "the model"; docs/data/h200-2026-12-01-study3/fit-pin-modes.txt; tests/unit/test_fit.py
# fits the committed records again and finds these figures). The device-memory slope fitted below 0 and is 0. The
# model has no pin-mode term: the pinned slope is of both modes, and a cuMemHostRegister teardown comes back faster
# than it says (736 ms measured for 8 GiB against 1298 ms).
#
# The error is the fit's LARGEST residual (1.49 s, from the 32 GiB pinned cell), not its 95th percentile (0.53 s).
# error_ns feeds only the stuck bound (the ETA is expected_ns alone), and that bound must never call a teardown
# stuck. ready cannot see the pinned host memory of a process that has exited, so it judges a killed 32 GiB-pinned
# holder (a zombie still listed for 4.3-6.4 s) with pinned = 0: (108 ms + 1.49 s) x 4 = 6.40 s exceeds every run
# measured (max 6.36 s), while the 95th percentile would give 2.56 s and call all 8 of those runs stuck. The price:
# memory truly stuck is called so after ~6.4 s, not 1 s. Pinned memory beyond 32 GiB (not measured here; SGLang saw
# 25.9 s for 243 GB) can still outlast the bound when ready does not know it.
#
# What the fit measured (the same fit prints it): up to 4 contexts in one teardown, 64 GiB of device memory, 32 GiB of
# pinned host memory and 4 importers, on NVIDIA H200s. An ETA beyond any of them, or for another GPU model, is an
# extrapolation, and ReclaimModel.beyond says so; the fallback entry was measured on nothing (its range is None).
_MODELS: dict[str, ReclaimModel] = {}
_FALLBACK = "default"


def register(model: ReclaimModel) -> None:
    """Add or replace the model of a driver branch (``model.driver``: ``"580"``, or ``"default"`` for any other)."""
    if not isinstance(model, ReclaimModel):
        raise ArgumentTypeError(f"expected a ReclaimModel, got {type(model).__name__}")
    # Checked here, not when ready judges: a NaN factor or a negative time would fail (or quietly bend) every
    # verdict on that driver later, far from the call that made it.
    _check_counts(**{name: getattr(model, name) for name in (*COEFFICIENTS, "error_ns")})
    for name in ("max_contexts", "max_device_bytes", "max_pinned_bytes", "max_importers"):
        if getattr(model, name) is not None:
            _check_counts(**{name: getattr(model, name)})
    factor = model.stuck_factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not (1.0 <= factor < math.inf):
        raise ArgumentError(f"stuck_factor must be a finite number >= 1 (the bound is that many times the expected "
                            f"time), got {factor!r}")
    _MODELS[model.driver] = model


register(ReclaimModel(
    driver="580", base_ns=107_816_022, per_context_ns=83_665_649, per_device_gib_ns=0,
    per_pinned_gib_ns=148_781_217, per_importer_ns=39_110_460, error_ns=1_491_129_152, stuck_factor=4.0,
    source="nvmlcheck study fit --across ending,pin_mode of 238 runs (22 cells), driver 580.159.04, NVIDIA H200: "
           "docs/reclaim-study.md (third edition, one H200, 2026-12-01, with the second edition's runs; each pin mode "
           "its own cell); error_ns = the largest residual (p95 532.8 ms)",
    gpu="NVIDIA H200", max_contexts=4, max_device_bytes=64 * _GIB, max_pinned_bytes=32 * _GIB, max_importers=4,
))
register(ReclaimModel(
    driver=_FALLBACK, base_ns=200_000_000, per_context_ns=100_000_000, per_device_gib_ns=2_000_000,
    per_pinned_gib_ns=150_000_000, per_importer_ns=100_000_000, error_ns=2_000_000_000, stuck_factor=5.0,
    source="conservative fallback for drivers not measured (at least the 580 figures; error above the 580's largest)",
))


def model_for(driver_version: str | None) -> ReclaimModel:
    """The model of a driver version (``"580.159.04"`` → branch ``"580"``); the fallback when unknown."""
    if driver_version:
        branch = driver_version.strip().split(".", 1)[0]
        if branch in _MODELS:
            return _MODELS[branch]
    return _MODELS[_FALLBACK]


def expected_ns(driver_version: str | None, contexts: int = 1, device_bytes: int = 0, pinned_host_bytes: int = 0,
                importers: int = 0) -> int:
    """:meth:`ReclaimModel.expected_ns` of :func:`model_for` ``(driver_version)``."""
    return model_for(driver_version).expected_ns(contexts, device_bytes, pinned_host_bytes, importers)


def stuck_after_ns(driver_version: str | None, contexts: int = 1, device_bytes: int = 0, pinned_host_bytes: int = 0,
                   importers: int = 0) -> int:
    """:meth:`ReclaimModel.stuck_after_ns` of :func:`model_for` ``(driver_version)``."""
    return model_for(driver_version).stuck_after_ns(contexts, device_bytes, pinned_host_bytes, importers)
