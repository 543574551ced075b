"""The model's optional health readings (:data:`~nvmlcheck.model.Fields.HEALTH`), with the enums they use; the
clocks are in :mod:`nvmlcheck._clocks` (``ready`` reads health, not clocks).

Part of :mod:`nvmlcheck.model`, which offers every name here and creates these classes only when one is first used:
a wait reads neither clocks nor health, so it does not pay for their classes at import (docs/performance.md, "One-shot
checks"). Import them from ``nvmlcheck.model`` (or ``nvmlcheck``), never from here; their ``__module__`` says
``nvmlcheck.model``, so reprs, pickles and the API reference name them there.
"""

from __future__ import annotations

import enum

from ._record import record

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from typing import NamedTuple
else:
    from ._record import NamedTuple

__all__ = [
    "Health",
    "HealthCause",
    "MemoryHealth",
    "OperatorAction",
    "RecoveryAction",
    "RemappedRows",
    "RetiredPage",
    "RetirementCause",
]


class RetirementCause(str, enum.Enum):
    """Why a memory page was retired (``nvmlPageRetirementCause_t``)."""

    MULTIPLE_SINGLE_BIT_ECC = "single_bit_ecc"
    DOUBLE_BIT_ECC = "double_bit_ecc"


@record
class RetiredPage:
    """A retired memory page (nvmlDeviceGetRetiredPages_v2; nvidia-smi ``--query-retired-pages``).

    ``timestamp`` is the raw value NVML reports for the retirement time (``None`` when only the v1 call exists or
    the value is not available).
    """

    address: int
    cause: RetirementCause
    timestamp: int | None = None


@record
class RemappedRows:
    """Row remapping state (nvmlDeviceGetRemappedRows; nvidia-smi ``remapped_rows.*``), the Ampere+ successor of
    page retirement."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


class OperatorAction(str, enum.Enum):
    """What an operator does about an unhealthy GPU, in NVIDIA's own words, mildest first (:attr:`severity`).

    The names are those of NVIDIA's XID catalogue's resolution buckets (``IGNORE``, ``RESTART_APP``, ``RESET_GPU``,
    ``CONTACT_SUPPORT``) and of NVML's ``nvmlDeviceGpuRecoveryAction_t`` (``DRAIN_P2P``, ``DRAIN_AND_RESET``,
    ``BUS_RESET``, ``NODE_REBOOT``, ``RECOVER_IMEX_DOMAIN``); the catalogue's ``RESTART_BM`` (restart the bare-metal
    node) is ``NODE_REBOOT``; its ``CHECK_MECHANICALS`` (XID 54: the board's auxiliary power) is its own action, hands
    on the hardware, milder only than a service call. Sources and the mapping: docs/health.md.
    """

    IGNORE = "IGNORE"  #: nothing to do (informational)
    RESTART_APP = "RESTART_APP"  #: the application that hit it must restart; the GPU keeps working
    DRAIN_P2P = "DRAIN_P2P"  #: let peer-to-peer (NVLink) traffic drain before new work
    RESET_GPU = "RESET_GPU"  #: reset the GPU (``nvidia-smi -r``) before new work
    DRAIN_AND_RESET = "DRAIN_AND_RESET"  #: drain peer-to-peer traffic, then reset the GPU
    BUS_RESET = "BUS_RESET"  #: reset the GPU's PCIe bus
    RECOVER_IMEX_DOMAIN = "RECOVER_IMEX_DOMAIN"  #: recover the IMEX (multi-node NVLink) domain
    NODE_REBOOT = "NODE_REBOOT"  #: reboot the node
    CHECK_MECHANICALS = "CHECK_MECHANICALS"  #: check the board's seating and connections (its power cables)
    CONTACT_SUPPORT = "CONTACT_SUPPORT"  #: service the hardware (RMA): a reset does not help

    @property
    def severity(self) -> int:
        """0 for ``IGNORE`` up to ``CONTACT_SUPPORT``: the larger wins when several causes apply."""
        return _ACTION_ORDER.index(self)

    @property
    def waiting_helps(self) -> bool:
        """Whether the GPU can become usable again without an operator (``IGNORE`` and ``RESTART_APP``)."""
        return self in (OperatorAction.IGNORE, OperatorAction.RESTART_APP)


_ACTION_ORDER = tuple(OperatorAction)


class RecoveryAction(enum.IntEnum):
    """NVML's recommended recovery action (``nvmlDeviceGpuRecoveryAction_t``, field
    ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``; nvidia-smi ``gpu_recovery_action`` / ``GPU Recovery Action``).

    A code this version does not know is kept as a member named ``ACTION_<n>`` (the driver asks for *something*:
    :meth:`Health.causes` reports it).
    """

    NONE = 0  #: no action needed
    GPU_RESET = 1  #: reset the GPU
    NODE_REBOOT = 2  #: reboot the node
    DRAIN_P2P = 3  #: drain peer-to-peer traffic
    DRAIN_AND_RESET = 4  #: drain peer-to-peer traffic and reset the GPU
    RECOVER_IMEX_DOMAIN = 5  #: recover the IMEX domain
    BUS_RESET = 6  #: reset the GPU's PCIe bus
    SYSTEM_REBOOT = 7  #: reboot the system

    @classmethod
    def _missing_(cls, value: object) -> RecoveryAction | None:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 32:
            return None
        member = int.__new__(cls, value)
        member._name_ = f"ACTION_{value}"
        member._value_ = value
        return member

    @property
    def operator_action(self) -> OperatorAction | None:
        """The :class:`OperatorAction` it asks for (``None`` for ``NONE``; an unknown code: ``CONTACT_SUPPORT``)."""
        if self is RecoveryAction.NONE:
            return None
        return _RECOVERY_TO_OPERATOR.get(int(self), OperatorAction.CONTACT_SUPPORT)


_RECOVERY_TO_OPERATOR = {
    1: OperatorAction.RESET_GPU,
    2: OperatorAction.NODE_REBOOT,
    3: OperatorAction.DRAIN_P2P,
    4: OperatorAction.DRAIN_AND_RESET,
    5: OperatorAction.RECOVER_IMEX_DOMAIN,
    6: OperatorAction.BUS_RESET,
    7: OperatorAction.NODE_REBOOT,
}


class HealthCause(NamedTuple):
    """One reason a GPU is not healthy (:meth:`Health.causes`).

    ``code``: a stable identifier (``"row-remap-pending"``); ``text``: a sentence for people; ``action``: what an
    operator does about it, in NVIDIA's words. The codes, their sources and actions: docs/health.md.
    """

    code: str
    text: str
    action: OperatorAction


@record
class Health:
    """A GPU's health as the driver reports it. Each part is ``None`` when the device or driver cannot say (Hopper
    retires no pages, it remaps rows; ECC counters need ECC on; the recovery action needs driver 565+), with the
    reason in :attr:`DeviceState.unknown` under ``"health.<field>"``: unknown is never a cause.

    ``retired_pages``: nvmlDeviceGetRetiredPages_v2 (nvidia-smi ``--query-retired-pages``). ``retired_pages_pending``:
    nvmlDeviceGetRetiredPagesPendingStatus (``retired_pages.pending``). ``remapped_rows``: nvmlDeviceGetRemappedRows
    (``remapped_rows.*``). ``ecc_uncorrected_volatile`` / ``ecc_uncorrected_aggregate``: nvmlDeviceGetTotalEccErrors,
    uncorrected, volatile (since the driver loaded or the GPU was reset) and aggregate (the board's lifetime)
    (``ecc.errors.uncorrected.volatile.total`` / ``.aggregate.total``). ``recovery_action``: the field value
    ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (``gpu_recovery_action``).

    Issue 22 added the last three (defaults ``None``, so the three-argument constructor of ``MemoryHealth``, its
    former name, still works).
    """

    retired_pages: tuple[RetiredPage, ...] | None
    retired_pages_pending: bool | None
    remapped_rows: RemappedRows | None
    ecc_uncorrected_volatile: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    recovery_action: RecoveryAction | None = None

    def causes(self) -> tuple[HealthCause, ...]:
        """Why this GPU needs an operator before the next job, strongest action first; ``()`` when nothing known
        says so (unknown parts are not causes). Codes: ``row-remap-failure``, ``row-remap-pending``,
        ``retired-pages-pending``, ``ecc-uncorrected-volatile`` (not when the recovery action reads ``NONE``: the
        driver judged those errors and asks for nothing), ``recovery-action``."""
        out: list[HealthCause] = []
        rows = self.remapped_rows
        if rows is not None and rows.failure:
            out.append(HealthCause(
                "row-remap-failure",
                "a row remapping failed: the GPU has memory it could not take out of service",
                OperatorAction.CONTACT_SUPPORT,
            ))
        if rows is not None and rows.pending:
            out.append(HealthCause(
                "row-remap-pending",
                "a row remapping is pending: a GPU reset completes it (until then the faulty rows stay in use)",
                OperatorAction.RESET_GPU,
            ))
        if self.retired_pages_pending:
            out.append(HealthCause(
                "retired-pages-pending",
                "memory pages are pending retirement: a GPU reset (or driver reload) retires them",
                OperatorAction.RESET_GPU,
            ))
        action = self.recovery_action
        # With the recovery action read, the driver says itself whether its uncorrectable errors need anything: NONE
        # is "no recovery action is needed, the GPU can be used again by starting a new process" (NVIDIA, GPU Memory
        # Error Management, "Error Recovery and Response Flags"): a contained error (XID 94, RESTART_APP) leaves the
        # volatile count above 0 until a reset, and is no cause then. Without the action (a driver before 565, a
        # board without it, unread), the count is judged alone, as XID 48: a reset clears it.
        if self.ecc_uncorrected_volatile and action is not RecoveryAction.NONE:
            out.append(HealthCause(
                "ecc-uncorrected-volatile",
                f"{self.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the driver loaded or the GPU was "
                "last reset",
                OperatorAction.RESET_GPU,
            ))
        if action is not None and action is not RecoveryAction.NONE:
            out.append(HealthCause(
                "recovery-action",
                f"the driver asks for recovery action {action.name} ({int(action)})",
                action.operator_action or OperatorAction.CONTACT_SUPPORT,
            ))
        out.sort(key=lambda c: -c.action.severity)
        return tuple(out)

    @property
    def action(self) -> OperatorAction | None:
        """The strongest action among :meth:`causes` (``None`` when there is no cause)."""
        causes = self.causes()
        return causes[0].action if causes else None


#: The former name of :class:`Health` (before issue 22 it held only memory bookkeeping).
MemoryHealth = Health


for _cls in (Health, HealthCause, OperatorAction, RecoveryAction, RemappedRows, RetiredPage, RetirementCause):
    _cls.__module__ = "nvmlcheck.model"
