"""The two small outputs that are neither CSV nor ``-q``: ``nvidia-smi --version`` and ``nvidia-smi -L``.

``--version`` gives the driver and CUDA versions when ``--query-gpu`` cannot (:func:`parse_version_output`,
:func:`cuda_version_number`); ``-L`` gives the ``MIG-...`` UUIDs that ``-q`` does not print
(:func:`parse_list_gpus`). Both are one item a line; a line not understood raises :class:`~nvmlcheck.SmiParseError`.
Rules and reasons: docs/backends.md, "How nvidia-smi output is read".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from ...errors import SmiParseError
from .text import handle_failure_line, numbered_lines, strip_deprecation

__all__ = ["cuda_version_number", "parse_list_gpus", "parse_version_output"]

_VERSION_LINE = re.compile(r"([A-Za-z][A-Za-z -]*?)\s*:\s*(\S.*)")


def parse_version_output(text: str) -> Mapping[str, str]:
    """Parse ``nvidia-smi --version`` (``NVIDIA-SMI version : 580.159.04``, ``DRIVER version``, ``CUDA Version``,
    ``NVML version``) into a mapping with lower-cased keys (``"cuda version"``).

    A ``[Deprecated; ...]`` note beside a value is dropped; driver 610's ``CUDA Version: Deprecated, see ...`` stays
    as printed (it is not a version: :func:`cuda_version_number` reads it as unknown)."""
    out: dict[str, str] = {}
    for no, line in numbered_lines(text):
        m = _VERSION_LINE.fullmatch(line.strip())
        if m is None:
            raise SmiParseError("not a 'name : version' line", no, line)
        out[m.group(1).strip().lower()] = strip_deprecation(m.group(2).strip())[0] or m.group(2).strip()
    if not out:
        raise SmiParseError("nvidia-smi --version printed nothing", 1, "")
    return MappingProxyType(out)


def cuda_version_number(text: str) -> int | None:
    """``"13.0"`` -> 13000, ``"12.4"`` -> 12040 (the encoding of nvmlSystemGetCudaDriverVersion_v2); ``None`` for
    anything else."""
    m = re.fullmatch(r"([0-9]{1,3})\.([0-9]{1,2})", text.strip())  # ASCII: \d takes U+0661, which int() reads as 1
    return None if m is None else int(m.group(1)) * 1000 + int(m.group(2)) * 10


# Any UUID text: the index is what the MIG lines below it are matched by (the CSV queries print
# ``[GPU requires reset]`` where such a GPU's UUID goes; -L may too).
# Indices in ASCII digits (\d takes any script's digits, which int() reads as numbers).
_L_GPU = re.compile(r"GPU ([0-9]+): .*\(UUID: ([^)]*)\)")
_L_MIG = re.compile(r"MIG\s+(\S+)\s+Device\s+([0-9]+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


def parse_list_gpus(text: str) -> Mapping[int, Mapping[int, str]]:
    """Parse ``nvidia-smi -L``: GPU index -> {MIG device index: ``MIG-...`` UUID}. ``-q`` does not print a MIG
    device's UUID; ``-L`` prints ``  MIG 1g.10gb     Device  0: (UUID: MIG-...)`` under its GPU's line. A GPU it
    could not read (``Unable to determine the device handle for GPU ...``) is left out: the others are listed."""
    out: dict[int, dict[int, str]] = {}
    gpu: int | None = None
    for no, line in numbered_lines(text):
        stripped = line.strip()
        g = _L_GPU.fullmatch(stripped)
        if g is not None:
            gpu = int(g.group(1))
            out.setdefault(gpu, {})
            continue
        if handle_failure_line(no, line) is not None:
            # One lost GPU used to cost every GPU's MIG UUIDs (so every MIG- selection). Nothing that follows
            # belongs to the GPU before it.
            gpu = None
            continue
        m = _L_MIG.fullmatch(stripped)
        if m is not None and gpu is not None:
            out[gpu][int(m.group(2))] = m.group(3)
            continue
        raise SmiParseError("not a GPU or MIG device line of nvidia-smi -L", no, line)
    return MappingProxyType({k: MappingProxyType(v) for k, v in out.items()})
