"""The study's exceptions: a study that cannot go on, a dirty baseline, a failed holder, a study that cannot run
here (skipped, with its reason), a bad record file, no matplotlib for a plot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import NvmlCheckError

if TYPE_CHECKING:
    from .records import RunRecord

__all__ = ["BaselineNotClean", "HolderError", "PlotUnavailable", "RecordFormatError", "StudyError", "StudySkipped"]

class StudyError(NvmlCheckError):
    """A study could not go on."""

    __module__ = "nvmlcheck.study"


class BaselineNotClean(StudyError):
    """The selected GPUs were not clean before a run, so its times would mean nothing. ``culprits`` says what held
    them; ``records`` holds the runs completed before (their JSON Lines were already handed to ``on_record``)."""

    __module__ = "nvmlcheck.study"

    def __init__(self, culprits: Sequence[str], waited_s: float, records: Sequence[RunRecord] = ()) -> None:
        self.culprits = tuple(culprits)
        self.waited_s = waited_s
        self.records = tuple(records)
        lines = "\n".join(f"  - {c}" for c in self.culprits) or "  - (no detail available)"
        waited = f" after waiting {waited_s:g} s" if waited_s > 0 else ""
        super().__init__(
            f"GPUs not clean at baseline{waited}: refusing to start a run (its times would mean nothing); "
            f"free them first (nvmlcheck snapshot procs):\n{lines}"
        )


class HolderError(StudyError):
    """A holder process could not be started, did not become ready, or its memory never became visible."""

    __module__ = "nvmlcheck.study"


class StudySkipped(StudyError):
    """The study cannot run here, for a reason that is no fault (``reason``): an MPS study on a host without
    ``nvidia-cuda-mps-control``, an NCCL study with one GPU. Nothing was measured."""

    __module__ = "nvmlcheck.study"

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"study skipped: {reason}")


class RecordFormatError(StudyError, ValueError):
    """A JSON Lines file that is not a valid run record file (wrong schema, newer version, bad line). Also a
    ``ValueError``."""

    __module__ = "nvmlcheck.study"


class PlotUnavailable(StudyError, ImportError):
    """Plotting needs matplotlib: ``pip install 'nvmlcheck[plot]'``. Also an ``ImportError``."""

    __module__ = "nvmlcheck.study"
