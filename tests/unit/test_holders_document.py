"""The ``nvmlcheck/holders`` document keeps docs/cli.md's rule: a ``null`` field is unknown and ``unknown`` says why
(``relation`` and ``container`` excepted: ``null`` there means none)."""

from __future__ import annotations

import os

from nvmlcheck.holders import GpuUse, describe_process
from nvmlcheck.jsonout import holders_document

#: Fields whose ``null`` means "none", not "unknown".
NONE_MEANS_NONE = frozenset({"relation", "container"})


def _unexplained(holder: dict[str, object]) -> list[str]:
    unknown = holder["unknown"]
    assert isinstance(unknown, dict)
    return [key for key, value in holder.items() if value is None and key not in NONE_MEANS_NONE and key not in unknown]


def test_a_process_not_visible_here_has_a_reason_for_every_null() -> None:
    # A PID no process has (above Linux's PID_MAX_LIMIT), as NVML lists one of another PID namespace.
    gone = describe_process(4_123_456, found_by=frozenset({"nvml"}),
                            gpus=(GpuUse(0, "GPU-0", ("compute",), 1 << 30),))
    holder = holders_document("nvml", [gone])["holders"][0]
    assert holder["name"] is None and holder["user"] is None and holder["device_files"] is None
    assert _unexplained(holder) == []
    assert holder["unknown"]["user"] == holder["unknown"]["uid"]


def test_this_process_has_no_unexplained_null() -> None:
    me = describe_process(os.getpid(), found_by=frozenset({"device-file"}), device_files=("/dev/nvidia0",))
    holder = holders_document("nvml", [me])["holders"][0]
    assert holder["relation"] == "self"
    assert _unexplained(holder) == []
