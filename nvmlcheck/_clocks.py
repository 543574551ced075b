"""The model's clock readings (:data:`~nvmlcheck.model.Fields.CLOCKS`): :class:`ClockSet`, :class:`Clocks` and the
event-reason flags.

Part of :mod:`nvmlcheck.model`, which offers every name here and creates these classes only when one is first used
(a wait or a ``ready`` reads no clocks: docs/performance.md, "One-shot checks"). Import them from
``nvmlcheck.model`` (or ``nvmlcheck``), never from here; their ``__module__`` says ``nvmlcheck.model``.
"""

from __future__ import annotations

import enum

from ._record import record

__all__ = ["ClockEventReason", "ClockSet", "Clocks"]


class ClockEventReason(enum.IntFlag):
    """Why clocks are below their maximum (NVML "clocks event reasons", formerly "throttle reasons").

    Bit values are NVML's ``nvmlClocksEventReason*`` / ``nvmlClocksThrottleReason*`` constants; bits this version
    does not know are kept in the value.
    """

    NONE = 0
    GPU_IDLE = 0x1
    APPLICATIONS_CLOCKS_SETTING = 0x2
    SW_POWER_CAP = 0x4
    HW_SLOWDOWN = 0x8
    SYNC_BOOST = 0x10
    SW_THERMAL_SLOWDOWN = 0x20
    HW_THERMAL_SLOWDOWN = 0x40
    HW_POWER_BRAKE_SLOWDOWN = 0x80
    DISPLAY_CLOCK_SETTING = 0x100
    BOARD_LIMIT = 0x200
    RELIABILITY = 0x400

    @property
    def names(self) -> tuple[str, ...]:
        """The decoded reason names, lowest bit first; unknown bits appear as ``"0x..."``."""
        out: list[str] = []
        rest = int(self)
        for member in type(self):
            if member.value and int(self) & member.value == member.value:
                out.append(str(member.name).lower())
                rest &= ~member.value
        if rest:
            out.append(hex(rest))
        return tuple(out)


@record
class ClockSet:
    """Clock frequencies of the four NVML clock domains, in MHz (``None`` when not supported)."""

    graphics_mhz: int | None
    sm_mhz: int | None
    memory_mhz: int | None
    video_mhz: int | None


@record
class Clocks:
    """Clocks of one device.

    ``current``: nvmlDeviceGetClockInfo (nvidia-smi ``clocks.gr/sm/mem/video``); ``max``: nvmlDeviceGetMaxClockInfo
    (``clocks.max.*``); ``applications``: nvmlDeviceGetApplicationsClock (``clocks.applications.*``);
    ``event_reasons``: nvmlDeviceGetCurrentClocksEventReasons (``clocks_event_reasons.active``).
    """

    current: ClockSet
    max: ClockSet
    applications: ClockSet
    event_reasons: ClockEventReason | None

    @property
    def sm_mhz(self) -> int | None:
        """Current SM clock, MHz."""
        return self.current.sm_mhz

    @property
    def graphics_mhz(self) -> int | None:
        """Current graphics clock, MHz."""
        return self.current.graphics_mhz

    @property
    def memory_mhz(self) -> int | None:
        """Current memory clock, MHz."""
        return self.current.memory_mhz

    @property
    def video_mhz(self) -> int | None:
        """Current video clock, MHz."""
        return self.current.video_mhz


for _cls in (ClockEventReason, ClockSet, Clocks):
    _cls.__module__ = "nvmlcheck.model"
