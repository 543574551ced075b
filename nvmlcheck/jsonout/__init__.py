"""Every JSON document nvmlcheck prints: model objects to plain dicts, under a versioned schema.

Every document has ``"schema"`` (``"nvmlcheck/snapshot"``, ``"nvmlcheck/wait"``, ``"nvmlcheck/kill"``,
``"nvmlcheck/holders"``, ``"nvmlcheck/select"``, ``"nvmlcheck/ready"``, ``"nvmlcheck/hosts"``, ``"nvmlcheck/error"``,
``"nvmlcheck/demo"``, ``"nvmlcheck/study-reclaim"``, ``"nvmlcheck/study-compare"``, ``"nvmlcheck/study-fit"``,
``"nvmlcheck/kill-plan"``, ``"nvmlcheck/slurm"``, ``"nvmlcheck/version"``; ``watch``'s ``"nvmlcheck/event"`` and
``"nvmlcheck/listening"`` lines come from :mod:`nvmlcheck.events`) and ``"version"`` (:data:`SCHEMA_VERSION`, or
the document's own in ``SCHEMA_VERSIONS``). Within a version, fields are only ever added; a removal or change of
meaning bumps the version. Bytes are integers in bytes, times integers in ns, and unknown values are ``null`` with
the reason under the device's ``"unknown"``. docs/cli.md documents each field (tests/docs/test_json_fields.py holds
every document to it). ``_values`` turns model values into dicts; ``_commands`` builds each command's document.
"""

# One module per kind of content: model values (and the header), and the commands' documents built from them.
from ._commands import (
    compare_document,
    demo_document,
    error_document,
    holders_document,
    hosts_document,
    kill_document,
    kill_plan_document,
    kill_timeout_document,
    left_alone_json,
    nothing_to_kill_document,
    nothing_to_kill_timeout_document,
    ready_document,
    select_document,
    select_timeout_document,
    slurm_document,
    snapshot_document,
    study_fit_document,
    study_reclaim_document,
    usage_error_document,
    wait_document,
    wait_timeout_document,
)
from ._values import SCHEMA_VERSION, device_json, document, error_json, holder_json, snapshot_json

__all__ = [
    "SCHEMA_VERSION",
    "compare_document",
    "demo_document",
    "device_json",
    "document",
    "error_document",
    "error_json",
    "holder_json",
    "holders_document",
    "hosts_document",
    "kill_document",
    "kill_plan_document",
    "kill_timeout_document",
    "left_alone_json",
    "nothing_to_kill_document",
    "nothing_to_kill_timeout_document",
    "ready_document",
    "select_document",
    "select_timeout_document",
    "slurm_document",
    "snapshot_document",
    "snapshot_json",
    "study_fit_document",
    "study_reclaim_document",
    "usage_error_document",
    "wait_document",
    "wait_timeout_document",
]
