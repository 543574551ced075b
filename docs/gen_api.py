"""Generate docs/api.md from the docstrings of ``nvmlcheck.__all__`` and ``nvmlcheck.testing.__all__``.

    python docs/gen_api.py           # rewrite docs/api.md
    python docs/gen_api.py --check   # exit 1 when docs/api.md is not what the docstrings say

The page is the docstrings, converted from reStructuredText roles to Markdown, arranged in the sections below. A
public name that no section places, or that has no description (docstring, ``#:`` comment or an entry in
``EXTRA``), stops the generator: the reference is complete or it is not written. tests/docs/test_api_reference.py checks
that docs/api.md is what ``render()`` makes.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "api.md"
MIB = 1 << 20
sys.path.insert(0, str(ROOT))

import nvmlcheck  # noqa: E402
from nvmlcheck import errors, study, testing  # noqa: E402
from nvmlcheck._public import NOT_STAR  # noqa: E402
from nvmlcheck.testing import pytest_plugin  # noqa: E402

# --- the outline (hand-written) ---------------------------------------------------------------------------------------

HEADER = """\
# API reference

Every public name of `nvmlcheck` (`nvmlcheck.__all__`) and of `nvmlcheck.testing` (`nvmlcheck.testing.__all__`).
This page is generated from the docstrings by `python docs/gen_api.py`; the test suite fails when it is out of date or
when a public name is missing. Edit the docstrings, then run the script.

Names resolve lazily: `import nvmlcheck` imports no submodule until a name is first used, so importing it costs
little in a launch script. Exceptions report `__module__ == "nvmlcheck"`, so `except nvmlcheck.GpuLost` is how to
catch them.

Conventions: units are in the names (`used_bytes`, `sm_mhz`, `elapsed_ns`, `timeout`/`timeout_s` in seconds); an
unknown value is `None` with a reason in `DeviceState.unknown`, never 0.
"""

# (title, introduction, names). Names of nvmlcheck.testing are written "testing.NAME".
SECTIONS: list[tuple[str, str, list[str]]] = [
    (
        "Sessions",
        "Open a session, read snapshots, wait. `open()` picks a backend; a `Session` is a context manager.",
        ["open", "Session", "wait_until_clean", "DeviceSelector"],
    ),
    (
        "CUDA devices and selecting GPUs",
        "`cuda:N` / `cuda:all` selectors through `CUDA_VISIBLE_DEVICES` and `CUDA_DEVICE_ORDER` (module "
        "`nvmlcheck.cudamap`; the rules are in [cuda.md](cuda.md)), choosing clean GPUs (`nvmlcheck.selection`, what "
        "`nvmlcheck select` runs) and their advisory locks (`nvmlcheck.locks`).",
        ["cuda_mapping", "CudaMapping", "CudaDevice", "GpuIdentity", "CudaMappingError", "select_clean", "Selection",
         "SelectTimeout", "LockSet", "LockDirError"],
    ),
    (
        "Snapshots",
        "What a snapshot holds. Frozen, slotted dataclasses shared by both backends; [backends.md](backends.md) says "
        "which NVML symbol and nvidia-smi field each value comes from.",
        [
            "Snapshot",
            "SystemInfo",
            "DeviceState",
            "DeviceFailure",
            "Memory",
            "GpuProcess",
            "ProcessKind",
            "Clocks",
            "ClockSet",
            "ClockEventReason",
            "Health",
            "HealthCause",
            "OperatorAction",
            "RecoveryAction",
            "MemoryHealth",
            "MigDevice",
            "RetiredPage",
            "RetirementCause",
            "RemappedRows",
            "Fields",
            "MIB",
            "GIB",
        ],
    ),
    (
        "Predicates",
        "What \"clean\" means. Predicates combine with `&`, `|` and `~` under three-valued logic; see "
        "[waiting.md](waiting.md).",
        [
            "Predicate",
            "Verdict",
            "DevicePredicate",
            "SnapshotPredicate",
            "default_predicate",
            "no_processes",
            "pids_gone",
            "memory_used_at_most",
            "memory_back_to",
            "memory_free_at_least",
            "on_devices",
            "always",
            "never",
        ],
    ),
    (
        "Ready",
        "Can the next job start: one verdict per GPU from clean, healthy and capacity (`Session.ready`, `ready`), "
        "each cause a structured `Culprit` (also `WaitTimeout.holders`); the rules are in [ready.md](ready.md).",
        ["ready", "ReadyReport", "GpuVerdict", "Culprit"],
    ),
    (
        "Waiting",
        "The poller behind `wait_until_clean`. The policies `DEFAULT` and `PRECISE` live in `nvmlcheck.wait`.",
        ["poll_until", "WaitOptions", "PollPolicy", "WaitResult", "TracePoint"],
    ),
    (
        "Killing",
        "Signal processes, escalate to SIGKILL, and wait until they have exited and the GPUs are clean, timing each "
        "phase. Targets are pinned (pidfd) from validation on; [killing.md](killing.md) explains the guarantees.",
        ["kill_and_wait", "prepare_kill", "KillPlan", "KillResult", "PidTimes", "SignalSent", "KillTimeout",
         "KillError", "ProcessGone", "NotPermitted", "targets_released", "not_ours"],
    ),
    (
        "Events",
        "NVML events (issue 15): `Session.listen()` starts one listener thread per session; with it running, a "
        "fatal XID on a selected GPU stops `wait_until_clean` and `kill_and_wait` with `GpuFault`. The XID table, "
        "`XID_TABLE`, lives in `nvmlcheck.events`; [events.md](events.md) gives its sources.",
        ["EventListener", "GpuEvent", "EventKind"],
    ),
    (
        "Holders",
        "Who holds the GPUs: NVML's process lists joined with a scan of open NVIDIA device files (character devices "
        "of NVIDIA's majors; tests name stand-ins).",
        ["find_holders", "Holder", "GpuUse", "HoldersIncomplete", "select_kill_holders",
         "KillSelection", "explain_unseen_holders"],
    ),
    (
        "Studies",
        "The reclamation timing study (`nvmlcheck study reclaim`), in the `nvmlcheck.study` package (`config`, "
        "`holders`, `runner`, `records`, `summary`, `plots`, `compare`; every name of the old module still imports "
        "from `nvmlcheck.study`). Until 0.3.0 its five main names also resolve from `nvmlcheck`, with a "
        "`DeprecationWarning`. [study-records.md](study-records.md) describes the method and the record fields, "
        "[reclaim-study.md](reclaim-study.md) the results.",
        ["study.run_study", "study.StudyConfig", "study.StudyError", "study.BaselineNotClean", "study.HolderError"],
    ),
    (
        "Exceptions",
        "Every exception derives from `NvmlCheckError`. The tree, from the `nvmlcheck.errors` docstring:\n\n"
        "```text\n{tree}```",
        [
            "NvmlCheckError",
            "BackendUnavailable",
            "NvmlError",
            "*NVML_CODES*",
            "SmiError",
            "SmiTimeout",
            "SmiTransportError",
            "SmiTransportTimeout",
            "SmiParseError",
            "CorruptData",
            "GpuFault",
            "WaitTimeout",
            "ArgumentError",
            "ArgumentTypeError",
            "NoSuchDevice",
            "NoSuchProcess",
            "StateError",
            "SessionClosed",
        ],
    ),
    ("Version", "", ["__version__"]),
    (
        "nvmlcheck.testing",
        "Test helpers for code that uses nvmlcheck, on machines without a GPU: build the stub libnvidia-ml, describe "
        "a scenario, point nvmlcheck at both. [testing.md](testing.md) shows them at work; the scenario format is "
        "`stubs/README.md`.",
        [
            "testing.use_stub",
            "testing.StubSession",
            "testing.BoundProcessFactory",
            "testing.Scenario",
            "testing.TimelineStep",
            "testing.build_stub",
            "testing.StubBuildError",
            "testing.find_nvml_header",
            "testing.stub_source_dir",
            "testing.stub_environment",
            "testing.read_call_log",
            "testing.LogEntry",
            "testing.StubProbe",
            "testing.StepClock",
            "testing.NVML_FUNCTIONS",
            "testing.STUB_VARIANTS",
            "testing.UNSUPPORTED_FIELDS",
            "testing.DEVICE_FIELDS",
            "testing.PROCESS_KINDS",
            "testing.CLOCK_DOMAINS",
            "testing.EVENT_KINDS",
            "testing.ProcessKindName",
            "testing.ClockDomain",
            "testing.EventKindName",
        ],
    ),
    (
        "pytest fixtures",
        "`nvmlcheck.testing.pytest_plugin`, a `pytest11` entry point: installing nvmlcheck makes these fixtures "
        "available in every pytest run (where plugin autoloading is off: `-p nvmlcheck.testing.pytest_plugin`). "
        "Each heading shows the type to annotate a test's parameter with. The stub fixtures skip the test when the "
        "stub cannot be built (no C compiler, no `nvidia-nvml-dev`: `pip install 'nvmlcheck[sim]'`); "
        "`--nvmlcheck-require-sim` (or `nvmlcheck_require_sim = true` in the ini file) makes that a failure. "
        "[testing.md](testing.md#fixtures) shows them at work.",
        [f"pytest_plugin.{name}" for name in
         ("nvml_scenario", "nvml_scenario_path", "nvml_stub", "nvml_stub_library", "nvml_bound_process",
          "fake_nvidia_smi")],
    ),
]

# Descriptions for names without a docstring or ``#:`` comment, and notes added after a docstring.
EXTRA: dict[str, str] = {
    "__version__": "The version of this package, a string (`\"0.1.0\"`). `nvmlcheck --version` prints it.",
    "testing.ProcessKindName": "The `kind` of a scenario process, as the scenario format spells it; the scenario "
    "methods also take the model's enum, `nvmlcheck.ProcessKind`, which has the same values. (Earlier releases "
    "called it `testing.ProcessKind`, a name that shadowed the enum; that name still works.)",
    "testing.EventKindName": "The event kinds `TimelineStep.raise_event` names (the values of `EVENT_KINDS`); any "
    "other `nvmlEventType` bits are given as an int.",
    "testing.ClockDomain": "The keys of `clocks_mhz`, `max_clocks_mhz` and `app_clocks_mhz` in `Scenario.add_device`.",
    "PollPolicy": "Two policies are ready-made in `nvmlcheck.wait`: `DEFAULT` (`interval_s=0.001`, "
    "`confirm_interval_s=0.00025`, `max_duty=0.05`, back-off after 10 s to at most 10 ms) and `PRECISE` "
    "(`interval_s=0`, a tight loop). `wait_until_clean(policy=...)` also takes `\"default\"`, `\"precise\"` or "
    "a number of seconds (`PollPolicy.every`).",
    "Predicate": "The three-valued logic and the reasons are described in [waiting.md](waiting.md). "
    "Operators: `a & b`, `a | b`, `~a` build new predicates; `bool(p)` raises `TypeError` (so `and`/"
    "`or`/`not` cannot be used by mistake). `str(p)` is `p.describe()`. Its hooks are private: write a predicate of "
    "your own as a [`DevicePredicate`](#devicepredicate) or a [`SnapshotPredicate`](#snapshotpredicate).",
}

# Classes whose members are documented under another class (they share a private base).
SHARED_MEMBERS: dict[str, str] = {"testing.TimelineStep": "testing.Scenario"}
# Abstract or internal-construction classes: no constructor signature.
NO_SIGNATURE = {"Predicate", "DevicePredicate", "SnapshotPredicate"}

def _public_bases(cls: type) -> list[str]:
    """The names of ``cls``'s bases a reader can look up: a private base stands for its first public ancestor
    (``DevicePredicate``'s ``_DevicePredicate`` is a ``Predicate``)."""
    names: list[str] = []
    for direct in cls.__bases__:
        base = direct
        while base.__name__.startswith("_") and base.__bases__ and base.__bases__[0] not in (object, tuple):
            base = base.__bases__[0]
        if base not in (object, tuple) and not base.__name__.startswith("_") and base.__name__ not in names:
            names.append(base.__name__)
    return names


# --- resolving names --------------------------------------------------------------------------------------------------


# Modules documented by name (``"study.StudyConfig"``) besides the top level; testing's whole ``__all__`` is placed.
SUBMODULES: dict[str, types.ModuleType] = {"testing": testing, "study": study, "pytest_plugin": pytest_plugin}


def resolve(key: str) -> Any:
    module, _, name = key.partition(".")
    if name and module in SUBMODULES:
        return getattr(SUBMODULES[module], name)
    return getattr(nvmlcheck, key)


def qualified(key: str) -> str:
    module, _, name = key.partition(".")
    return f"{SUBMODULES[module].__name__}.{name}" if name and module in SUBMODULES else key


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than ``-``/``_`` dropped, spaces to ``-``."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def all_keys() -> list[str]:
    # NOT_STAR: top-level names kept out of __all__ (``open``), documented all the same.
    return [*nvmlcheck.__all__, *sorted(NOT_STAR), *(f"testing.{n}" for n in testing.__all__)]


def _in_submodule_all(key: str) -> bool:
    module, _, name = key.partition(".")
    return module in SUBMODULES and name in getattr(SUBMODULES[module], "__all__", ())


def nvml_code_classes() -> list[type[errors.NvmlError]]:
    return [errors.error_class_for_code(code) for code in errors.KNOWN_CODES]


def placed_keys() -> set[str]:
    keys = {k for _, _, names in SECTIONS for k in names if not k.startswith("*")}
    keys |= {cls.__name__ for cls in nvml_code_classes()}
    return keys


# --- reStructuredText to Markdown -------------------------------------------------------------------------------------

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(~?)([\w.]+)`")
_LITERAL = re.compile(r"``(.+?)``")
_SECTION_HEADS = ("Args:", "Raises:", "Returns:", "Yields:")


class Linker:
    """Turns a role target into Markdown, linking to this page's heading when the name is documented here."""

    def __init__(self, headings: dict[str, str]) -> None:
        self.headings = headings  # key ("Session", "testing.Scenario") -> anchor

    def target(self, name: str, prefer_testing: bool) -> str | None:
        parts = name.split(".")
        candidates: list[str] = []
        for i in range(len(parts)):
            tail = ".".join(parts[i:])
            candidates += [f"testing.{tail}", tail] if prefer_testing else [tail, f"testing.{tail}"]
        # A method or attribute links to its class: Session.close -> Session
        if len(parts) >= 2:
            owner = parts[-2]
            candidates += [f"testing.{owner}", owner] if prefer_testing else [owner, f"testing.{owner}"]
        for c in candidates:
            if c in self.headings:
                return self.headings[c]
        return None

    def role(self, match: re.Match[str], prefer_testing: bool, kind_of: str) -> str:
        tilde, name = match.group(1), match.group(2)
        shown = name.split(".")[-1] if tilde else name
        if kind_of in (":func:", ":meth:"):
            shown += "()"
        link = self.target(name, prefer_testing)
        return f"[`{shown}`](#{link})" if link else f"`{shown}`"

    def inline(self, text: str, prefer_testing: bool = False) -> str:
        def sub(m: re.Match[str]) -> str:
            kind_of = ":" + m.group(0).split(":")[1] + ":"
            return self.role(m, prefer_testing, kind_of)

        text = _ROLE.sub(sub, text)
        return _LITERAL.sub(lambda m: f"`{m.group(1)}`", text)


def convert(doc: str, linker: Linker, prefer_testing: bool = False) -> str:
    """A cleaned docstring as Markdown: roles, literals, Google-style sections, ``>>>`` and ``::`` blocks."""
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i].strip())
                i += 1
            out += ["```pycon", *block, "```"]
            continue
        if stripped in _SECTION_HEADS and not line.startswith(" "):
            out.append(f"**{stripped[:-1]}**")
            out.append("")
            i += 1
            item: list[str] = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                text = lines[i]
                if not text.strip():
                    i += 1
                    if i < len(lines) and not lines[i].startswith("    "):
                        break
                    continue
                if text.startswith("        ") and item:
                    item.append(text.strip())
                else:
                    if item:
                        out.append(_item(item, linker, prefer_testing))
                    item = [text.strip()]
                i += 1
            if item:
                out.append(_item(item, linker, prefer_testing))
            out.append("")
            continue
        if stripped.endswith("::") and i + 1 < len(lines):
            out.append(linker.inline(line.rstrip()[:-1], prefer_testing))
            i += 1
            while i < len(lines) and not lines[i].strip():
                i += 1
            block = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                block.append(lines[i][4:])
                i += 1
            while block and not block[-1].strip():
                block.pop()
            out += ["", "```text", *block, "```", ""]
            continue
        out.append(linker.inline(line, prefer_testing))
        i += 1
    text = "\n".join(out).strip() + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)


def _item(parts: list[str], linker: Linker, prefer_testing: bool) -> str:
    first, *rest = parts
    name, sep, desc = first.partition(":")
    text = f"- `{name.strip()}`:{desc}" if sep and " " not in name.strip() else f"- {first}"
    return linker.inline(" ".join([text, *rest]), prefer_testing)


# --- signatures -------------------------------------------------------------------------------------------------------


def show_default(value: Any) -> str:
    if isinstance(value, tuple) and value:
        shown = ", ".join(show_default(v) for v in value)
        return f"({shown},)" if len(value) == 1 else f"({shown})"
    if isinstance(value, int) and not isinstance(value, bool) and value >= MIB and value % MIB == 0:
        return f"{value // MIB} * MIB"
    if isinstance(value, enum.Enum):
        owner = type(value)
        prefix = "signal" if owner.__module__ == "signal" else owner.__name__
        return f"{prefix}.{value.name}"
    if isinstance(value, (types.BuiltinFunctionType, types.FunctionType)):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


def show_annotation(ann: Any) -> str:
    if ann is inspect.Parameter.empty:
        return ""
    if isinstance(ann, typing.ForwardRef):
        return ann.__forward_arg__
    return ann if isinstance(ann, str) else inspect.formatannotation(ann)


def signature(name: str, obj: Callable[..., Any], *, drop_self: bool = False, returns: bool = True) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    params = list(sig.parameters.values())
    if drop_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    parts: list[str] = []
    star_done = False
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
            text = f"*{p.name}"
        elif p.kind is p.VAR_KEYWORD:
            text = f"**{p.name}"
        else:
            text = p.name
        ann = show_annotation(p.annotation)
        if ann:
            text += f": {ann}"
        if p.default is not p.empty:
            default = p.default
            text += f" = {show_default(default)}" if ann else f"={show_default(default)}"
        parts.append(text)
    ret = show_annotation(sig.return_annotation) if returns else ""
    one_line = f"{name}({', '.join(parts)})" + (f" -> {ret}" if ret else "")
    if len(one_line) <= 110:
        return one_line
    body = "".join(f"    {p},\n" for p in parts)
    return f"{name}(\n{body})" + (f" -> {ret}" if ret else "")


def code_block(text: str) -> str:
    return f"```text\n{text}\n```\n"


# --- ``#:`` comments from the source ----------------------------------------------------------------------------------


def source_comment(module: types.ModuleType, name: str) -> str | None:
    """The ``#:`` comment lines right above ``name = ...`` (or ``name: T = ...``) at module level."""
    try:
        lines = inspect.getsource(module).splitlines()
    except (OSError, TypeError):
        return None
    pattern = re.compile(rf"^{re.escape(name)}\s*(?::[^=]+)?=")
    for i, line in enumerate(lines):
        if pattern.match(line):
            comment: list[str] = []
            j = i - 1
            while j >= 0 and lines[j].lstrip().startswith("#:"):
                comment.insert(0, lines[j].lstrip()[2:].strip())
                j -= 1
            return " ".join(comment) or None
    return None


def member_comments(cls: type) -> dict[str, str]:
    """``#:`` comments of class attributes: trailing (``A = 1  #: text``) or on the lines above."""
    out: dict[str, str] = {}
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return out
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        m = re.match(r"^(\w+)\s*(?::[^=#]+)?=([^#]*)(?:#:\s*(.*))?$", stripped)
        if m:
            text = m.group(3) or " ".join(pending)
            if text:
                out[m.group(1)] = text
        pending = []
    return out


# --- rendering --------------------------------------------------------------------------------------------------------


def escape_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def own_doc(obj: Any) -> str | None:
    doc = obj.__doc__ if isinstance(obj, type) or callable(obj) else None
    return doc if isinstance(doc, str) and doc.strip() else None


def describe(key: str, obj: Any, linker: Linker, prefer_testing: bool) -> str:
    parts: list[str] = []
    doc = own_doc(obj) if (inspect.isclass(obj) or inspect.isfunction(obj)) else None
    if doc is not None:
        parts.append(convert(doc, linker, prefer_testing))
    else:
        module = _defining_module(key)
        comment = source_comment(module, key.removeprefix("testing.")) if module else None
        if comment:
            parts.append(linker.inline(comment, prefer_testing) + "\n")
    extra = EXTRA.get(key)
    if extra:
        parts.append(extra + "\n")
    if not parts:
        raise SystemExit(f"gen_api: {qualified(key)} has no docstring, no #: comment and no EXTRA entry")
    return "\n".join(parts)


def _defining_module(key: str) -> types.ModuleType | None:
    import importlib

    if key.startswith("testing."):  # the public face re-exports names of the private nvmlcheck._sim package
        return importlib.import_module(f"nvmlcheck._sim.{testing._LAZY[key.removeprefix('testing.')]}")
    module_name = getattr(nvmlcheck, "_LAZY", {}).get(key)
    return importlib.import_module(f"nvmlcheck.{module_name}") if module_name else None


def render_value(key: str, obj: Any) -> str:
    if isinstance(obj, (int, str)) and not isinstance(obj, bool):
        return code_block(f"{qualified(key)} = {obj!r}")
    if isinstance(obj, (tuple, frozenset)) or hasattr(obj, "items"):
        return ""  # long collections: the description says what they hold; printed below when short
    return code_block(f"{qualified(key)} = {obj!r}")


def render_collection(obj: Any) -> str:
    if hasattr(obj, "items"):
        rows = [f"| `{k}` | {escape_cell(', '.join(f'`{x}`' for x in v) if isinstance(v, tuple) else f'`{v}`')} |"
                for k, v in obj.items()]
        return "| key | value |\n| --- | --- |\n" + "\n".join(rows) + "\n"
    items = sorted(obj) if isinstance(obj, frozenset) else list(obj)
    return ", ".join(f"`{x}`" for x in items) + "\n"


def members_of(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties defined on ``cls`` or a private base (``_Changes``), in definition order."""
    seen: set[str] = set()
    out: list[tuple[str, Any]] = []
    for base in cls.__mro__:
        if base is object or (base is not cls and not base.__name__.startswith("_")):
            continue
        if issubclass(base, BaseException) and base is not cls:
            continue
        for name, value in base.__dict__.items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(value, (property, classmethod, staticmethod, types.FunctionType)):
                seen.add(name)
                out.append((name, value))
    return out


def render_class(key: str, cls: type, linker: Linker, prefer_testing: bool) -> str:
    name = qualified(key)
    out: list[str] = []
    if _is_named_tuple(cls):
        out.append("A named tuple (immutable, compares by value); its fields, in order, are in the table below.\n")
    elif dataclasses.is_dataclass(cls):
        frozen = "frozen " if cls.__dataclass_params__.frozen else ""  # type: ignore[attr-defined]
        out.append(f"A {frozen}dataclass; its fields, in order, are in the table below.\n")
    elif key not in NO_SIGNATURE and not issubclass(cls, enum.Enum) and "__init__" in _own_dicts(cls):
        out.append(code_block("class " + signature(name, cls.__init__, drop_self=True, returns=False)))
    bases = _public_bases(cls)
    if bases and bases != ["Exception"]:
        out.append(f"Bases: {', '.join(f'`{b}`' for b in bases)}.\n")
    out.append(describe(key, cls, linker, prefer_testing))
    if issubclass(cls, enum.Enum):
        notes = member_comments(cls)
        rows = [f"| `{m.name}` | `{m.value!r}` | {escape_cell(linker.inline(notes.get(str(m.name), '')))} |"
                for m in _enum_members(cls)]
        out.append("| member | value | note |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")
    elif _is_named_tuple(cls):
        annotations = inspect.get_annotations(cls)
        defaults = cls._field_defaults  # type: ignore[attr-defined]
        rows = [
            f"| `{n}` | `{escape_cell(show_annotation(annotations.get(n, inspect.Parameter.empty)))}` | "
            f"{f'`{show_default(defaults[n])}`' if n in defaults else ''} |"
            for n in cls._fields  # type: ignore[attr-defined]
        ]
        out.append("| field | type | default |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")
    elif dataclasses.is_dataclass(cls):
        rows = []
        for f in dataclasses.fields(cls):
            if f.name.startswith("_"):
                continue
            if f.default is not dataclasses.MISSING:
                default = f"`{show_default(f.default)}`"
            elif f.default_factory is not dataclasses.MISSING:
                default = "`{}`" if f.name == "unknown" else "(factory)"
            else:
                default = ""
            rows.append(f"| `{f.name}` | `{escape_cell(show_annotation(f.type))}` | {default} |")
        if rows:
            out.append("| field | type | default |\n| --- | --- | --- |\n" + "\n".join(rows) + "\n")
    comments = member_comments(cls) if not issubclass(cls, enum.Enum) else {}
    attrs = [(n, c) for n, c in comments.items() if n.isupper() and n in cls.__dict__]
    if attrs:
        rows = [f"| `{n}` | {escape_cell(linker.inline(c))} |" for n, c in attrs]
        out.append("| class attribute | meaning |\n| --- | --- |\n" + "\n".join(rows) + "\n")
    shared = SHARED_MEMBERS.get(key)
    members = members_of(cls)
    if shared is not None:
        names = ", ".join(f"`{n}`" for n, _ in members)
        out.append(f"Methods: {names}; the same as [`{qualified(shared)}`](#{anchor(heading_for(shared))}).\n")
        return "\n".join(out)
    for member_name, value in members:
        out.append(render_member(name.rsplit(".", 1)[-1], member_name, value, linker, prefer_testing))
    return "\n".join(out)


def _is_named_tuple(cls: type) -> bool:
    return issubclass(cls, tuple) and hasattr(cls, "_fields")


def _own_dicts(cls: type) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for base in reversed(cls.__mro__):
        if base is object or base.__module__ == "builtins":
            continue
        merged.update(base.__dict__)
    return merged


def _enum_members(cls: type[enum.Enum]) -> Iterable[enum.Enum]:
    if issubclass(cls, enum.Flag):
        return [m for m in cls.__members__.values()]
    return list(cls)


def render_member(owner: str, name: str, value: Any, linker: Linker, prefer_testing: bool) -> str:
    heading = f"#### `{owner}.{name}`"
    if isinstance(value, property):
        body = code_block(f"{owner}.{name}  (property)")
        doc = value.__doc__
    else:
        func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        prefix = "classmethod " if isinstance(value, classmethod) else ""
        drop = not isinstance(value, staticmethod)
        body = code_block(prefix + signature(f"{owner}.{name}", func, drop_self=drop))
        doc = func.__doc__
    text = convert(doc, linker, prefer_testing) if doc else ""
    return f"{heading}\n\n{body}\n{text}"


def heading_for(key: str) -> str:
    return f"`{qualified(key)}`"


def render_nvml_codes(linker: Linker) -> str:
    rows = []
    for cls in nvml_code_classes():
        doc = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        doc = re.sub(r"^NVML_ERROR_\w+ \(\d+\)\s*[:;,.]?\s*", "", doc)
        notes = "; ".join(x for x in (linker.inline(doc), cls.HINT + "." if cls.HINT else "") if x)
        wait = "transient" if cls.TRANSIENT else "fatal"
        rows.append(
            f"| `{cls.__name__}` | {cls.CODE} | `{cls.CODE_NAME}` | {wait} | {cls.SCOPE} | {escape_cell(notes)} |"
        )
    return (
        "### NVML return codes\n\n"
        "One `NvmlError` subclass per `nvmlReturn_t` code of nvml.h. `nvmlcheck.errors.error_class_for_code(code)` "
        "maps a code to its class; a code not listed here becomes `Unknown`, with its `.code` kept. The hint, when "
        "there is one, ends the exception's message. *In a wait* is the class's `TRANSIENT` (a transient error is "
        "retried until the deadline, a fatal one fails the wait at once), *scope* its `SCOPE` (see `NvmlError`).\n\n"
        "| class | code | NVML constant | in a wait | scope | meaning and hint |\n"
        "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
    )


def render_fixture(key: str, fixture: Any, linker: Linker) -> str:
    """A fixture: how a test asks for it (with its type: the fixture function's return annotation, less an
    ``Iterator[...]``), its scope, its docstring."""
    name = key.partition(".")[2]
    returns = str(inspect.signature(fixture).return_annotation).strip("'\"")
    returns = re.sub(r"^Iterator\[(.*)\]$", r"\1", returns)
    scope = getattr(getattr(fixture, "_fixture_function_marker", None), "scope", "function")
    usage = code_block(f"def test_it({name}: {returns}) -> None: ...")
    return f"{usage}\nA pytest fixture, scope `{scope}`.\n\n{convert(fixture.__doc__, linker, True)}"


def render_name(key: str, linker: Linker) -> str:
    obj = resolve(key)
    prefer_testing = key.startswith("testing.")
    out = [f"### {heading_for(key)}\n"]
    if key.startswith("pytest_plugin."):
        out.append(render_fixture(key, obj, linker))
    elif inspect.isclass(obj) and not _is_alias(key):
        out.append(render_class(key, obj, linker, prefer_testing))
    elif inspect.isfunction(obj):
        out.append(code_block(signature(qualified(key), obj)))
        if hasattr(obj, "__wrapped__"):
            out.append(f"A context manager: `with {qualified(key)}(...) as value:`.\n")
        out.append(describe(key, obj, linker, prefer_testing))
    else:
        out.append(render_value(key, obj))
        out.append(describe(key, obj, linker, prefer_testing))
        if isinstance(obj, (tuple, frozenset)) or hasattr(obj, "items"):
            out.append(render_collection(obj))
    return "\n".join(part for part in out if part)


def _is_alias(key: str) -> bool:
    return key in ("DeviceSelector", "testing.ProcessKind", "testing.ClockDomain")


def render() -> str:
    missing = [k for k in all_keys() if k not in placed_keys()]
    if missing:
        raise SystemExit(f"gen_api: public names not placed in a section: {missing}")
    unknown = [k for k in placed_keys() if k not in all_keys() and not _in_submodule_all(k)]
    if unknown:
        raise SystemExit(f"gen_api: names in the outline that are not public: {unknown}")
    headings = {k: anchor(heading_for(k)) for _, _, names in SECTIONS for k in names if not k.startswith("*")}
    for _, _, names in SECTIONS:
        for k in names:
            obj = None if k.startswith("*") else resolve(k)
            if inspect.isclass(obj) and not _is_alias(k) and k not in SHARED_MEMBERS:
                owner = qualified(k).rsplit(".", 1)[-1]
                prefix = k.split(".")[0] + "." if k.split(".")[0] in SUBMODULES else ""
                for member, _ in members_of(obj):
                    headings[f"{prefix}{owner}.{member}"] = anchor(f"`{owner}.{member}`")
    linker = Linker(headings)
    tree = _error_tree()
    out = [HEADER]
    out.append("## Contents\n\n" + "\n".join(f"- [{t}](#{anchor(t)})" for t, _, _ in SECTIONS) + "\n")
    for title, intro, names in SECTIONS:
        out.append(f"## {title}\n")
        if intro:
            out.append(intro.replace("{tree}", tree) + "\n")
        for key in names:
            if key == "*NVML_CODES*":
                out.append(render_nvml_codes(linker))
            else:
                out.append(render_name(key, linker))
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def _error_tree() -> str:
    doc = inspect.cleandoc(errors.__doc__ or "")
    _, _, rest = doc.partition("::\n")
    block = []
    for line in rest.splitlines():
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block).strip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
        if current != text:
            print("docs/api.md is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
