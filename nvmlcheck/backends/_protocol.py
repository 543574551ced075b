"""The :class:`Backend` protocol, in its own module: ``typing.Protocol`` is imported only by what needs it (a
one-shot check does not: docs/performance.md). Offered as :class:`nvmlcheck.backends.Backend`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..model import Fields, Snapshot, SystemInfo

if TYPE_CHECKING:
    from .._deadline import Deadline

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """What a session needs from a backend. Implementations are not required to be thread-safe beyond what their
    docstring says; :class:`nvmlcheck.Session` serialises nothing itself."""

    #: ``"nvml"`` or ``"smi"``; copied into :attr:`Snapshot.backend`.
    name: str

    def system(self) -> SystemInfo:
        """Driver, NVML and CUDA driver versions."""
        ...

    def device_count(self) -> int:
        """How many GPUs the backend sees (0 is possible; callers decide whether that is an error)."""
        ...

    def snapshot(
        self, indices: Sequence[int] | None = None, fields: Fields = Fields.ALL, *, deadline: Deadline | None = None
    ) -> Snapshot:
        """Read the devices ``indices`` (all when ``None``) in one pass. Devices that fail appear in
        :attr:`Snapshot.failures`; errors that stop the whole pass (driver gone) are raised.

        ``deadline`` (a wait's): no query of the pass may run past it by more than one query; once it has come the
        pass is abandoned with :class:`~nvmlcheck.errors.DeadlinePassed`, which the poller turns into its timeout."""
        ...

    def close(self) -> None:
        """Release what the backend holds (NVML reference, child processes). Idempotent."""
        ...
