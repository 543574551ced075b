"""Every JSON document the CLI prints, held to its field table in the docs.

Each schema of docs/cli.md's table of JSON documents is printed here in each of its forms (clean, timeout, error,
usage error, ended by a signal) on the simulated GPUs (``--simulate h200``, ``h200x8``, ``h200-busy``), and:

* every top-level key is named in the first column of the schema's field table (or, for a schema documented in
  prose, in that prose), and every key of a nested object (devices, culprits, pids, holders, gaps, ...) is named in
  the schema's section;
* every top-level field the table names is in a document of that schema, and a row that says ``clean only`` (or
  ``not clean only``) holds for each form;
* every document has ``schema`` and ``version`` (``"simulated": true`` right after them under ``--simulate``), bytes
  are integers, times integer ns, and a ``null`` next to an ``unknown`` map has its reason there;
* ``--json`` prints exactly one document on stdout for every exit path.

Nothing here depends on timing: each form is one that the scenario forces (a GPU that never lets go, a timeout of 0,
a signal sent once the command has loaded the stub).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.testing import Scenario

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN_TIMEOUT_S = 120.0
#: In the command line of this file's holder alone: what its kills select (never --all-holders, which on a host with
#: a GPU would signal the real CUDA processes).
WORD = f"nvmlcheck-json-fields-{uuid.uuid4().hex[:12]}"


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def section(page: str, heading: str, *, examples: bool = False) -> str:
    """The text under ``heading`` (a whole heading line) up to the next heading of its level or above, without its
    fenced code blocks unless ``examples`` (they are generated: the table and prose are what documents a field)."""
    text = _text(page)
    level = len(heading) - len(heading.lstrip("#"))
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, start)
    body = text[start: len(text) if end is None else end.start()]
    return body if examples else re.sub(r"^```.*?^```", "", body, flags=re.MULTILINE | re.DOTALL)


def _words(text: str) -> set[str]:
    """The names inside the backtick spans of ``text`` (``{"pid", "name"}`` and ``a.b[]`` give each part)."""
    return {w for span in re.findall(r"`([^`\n]+)`", text) for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span)}


@dataclass(frozen=True)
class Schema:
    """Where a schema is documented: its section, and whether its fields are in a table (else in prose)."""

    page: str
    heading: str
    table: bool = True
    row: str | None = None  # documented in one row of cli.md's table of documents (its first cell)
    also: tuple[str, ...] = ()  # the schemas (or "page#heading" sections) its text refers nested objects to

    def text(self) -> str:
        if self.row is not None:
            table = section("cli.md", "## JSON documents")
            return next(line for line in table.splitlines() if line.startswith(f"| `{self.row}` |"))
        return section(self.page, self.heading)

    def rows(self) -> list[tuple[list[str], str]]:
        """Each row of the section's field tables (``| field | meaning |``; not its option tables): the field
        names of its first cell and its meaning."""
        out, in_fields = [], False
        for line in self.text().splitlines():
            if not line.startswith("|"):
                in_fields = False
            elif line.startswith("| field |"):
                in_fields = True
            elif in_fields and line.startswith("| `"):
                first, meaning = line[2:].split(" | ", 1)
                out.append((re.findall(r"`([^`]+)`", first), meaning))
        return out

    def top_level(self) -> set[str]:
        """The top-level fields the documentation names."""
        if not self.table or self.row is not None:
            return _words(self.text())
        top = set()
        for names, _ in self.rows():
            # `devices[].index`, `uuid`: the names after a nested one are its siblings
            nested = any("." in name for name in names[:1])
            top |= {re.split(r"[.\[]", name, maxsplit=1)[0] for name in (names[:1] if nested else names)}
        return top

    def words(self) -> set[str]:
        """Every name the section gives, and those of the sections it refers nested objects to ("as in ...")."""
        words = _words(self.text())
        for other in self.also:
            if "#" in other:  # a page that documents its fields in an example and bullets: its keys count
                page, heading = other.split("#", 1)
                text = section(page, heading, examples=True)
                words |= _words(text) | set(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)":', text))
            else:
                words |= SCHEMAS[other].words()
        return words


SCHEMAS: dict[str, Schema] = {
    "snapshot": Schema("cli.md", "### nvmlcheck/snapshot", also=("error",)),
    "wait": Schema("cli.md", "### nvmlcheck/wait"),
    "kill": Schema("cli.md", "### nvmlcheck/kill", also=("wait",)),
    "kill-plan": Schema("cli.md", "### nvmlcheck/kill-plan", table=False, also=("holders",)),
    "ready": Schema("cli.md", "### nvmlcheck/ready"),
    "holders": Schema("cli.md", "### nvmlcheck/holders", table=False),
    "error": Schema("cli.md", "### nvmlcheck/error", also=("kill",)),
    "version": Schema("cli.md", "### nvmlcheck/version", table=False),
    "demo": Schema("cli.md", "### nvmlcheck/demo", table=False),
    "study-reclaim": Schema("cli.md", "### nvmlcheck/study-reclaim", also=(
        "study-records.md### Records (JSON Lines, schema `nvmlcheck/reclaim-run` version 1)",)),
    "study-compare": Schema("cli.md", "", row="nvmlcheck/study-compare"),
    "study-fit": Schema("cli.md", "", row="nvmlcheck/study-fit"),
    "select": Schema("cuda.md", "## `nvmlcheck select`"),
    "hosts": Schema("hosts.md", "## Options"),
    "slurm": Schema("slurm.md", "## The record: `nvmlcheck/slurm`", also=("ready", "kill")),
}
#: Documents embedded in others, checked against their own section: (schema, key) -> the embedded schema.
EMBEDDED = {"snapshot": "snapshot"}
#: Objects whose keys are data (a dotted path, a cell, a step), not fields.
DATA_KEYED = frozenset({"unknown", "holder_steps", "phase_resolution_ns", "conditions", "kept", "excluded", "pooled"})
#: Documented fields of forms this file does not print: (schema, field) -> the form.
NOT_PRINTED_HERE: dict[tuple[str, str], str] = {}


# --- the documents ---------------------------------------------------------------------------------------------------


@dataclass
class Printed:
    """One command's run: its stdout parsed as exactly one document."""

    name: str
    argv: list[str]
    code: int
    doc: dict[str, Any]
    simulated: bool


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NVMLCHECK_STUB_SCENARIO"))}
    env.pop("NVMLCHECK_LIBNVML", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(extra)
    return env


def _one_document(name: str, out: bytes) -> dict[str, Any]:
    text = out.decode()
    decoder = json.JSONDecoder()
    doc, end = decoder.raw_decode(text.lstrip())
    assert not text.lstrip()[end:].strip(), f"{name}: more than one document on stdout: {text[:2000]}"
    assert isinstance(doc, dict), f"{name}: stdout is not a JSON object"
    return doc


def _run(name: str, argv: list[str], expect: set[int], env: dict[str, str] | None = None,
         cwd: Path | None = None) -> Printed:
    proc = subprocess.run([sys.executable, "-m", "nvmlcheck", *argv], capture_output=True, env=env or _env(),
                          cwd=cwd, check=False, timeout=RUN_TIMEOUT_S)
    assert proc.returncode in expect, f"{name}: exit {proc.returncode}, not {expect}: {proc.stderr.decode()[-2000:]}"
    return Printed(name, argv, proc.returncode, _one_document(name, proc.stdout), "--simulate" in argv)


def _stub_loaded(pid: int) -> bool:
    try:
        return "libnvidia-ml" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def _sigint_default() -> None:
    """``preexec_fn`` of a child a test interrupts: a background job of a non-interactive shell (a CI runner) starts
    the suite with SIGINT ignored, the child inherits it and nvmlcheck rightly keeps it so: the Ctrl-C forms hung."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _signalled(name: str, argv: list[str], signum: int) -> Printed:
    """``argv`` (a command that would run for a minute) ended by ``signum`` once it has loaded the stub: it has
    parsed its options and installed its handlers, whatever the load of the machine."""
    proc = subprocess.Popen([sys.executable, "-m", "nvmlcheck", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(),
                            preexec_fn=_sigint_default)  # noqa: PLW1509 - one call, no locks
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not _stub_loaded(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, f"{name}: exit {proc.returncode}: {err.decode()[-2000:]}"
    return Printed(name, argv, proc.returncode, _one_document(name, out), True)


def _fake_ssh(tmp: Path) -> dict[str, str]:
    """An environment whose ``ssh`` runs the remote command here, reading the stub (a busy H200) through the
    variables the "remote" nvmlcheck inherits: the hosts document with each host's own (tests/hosts does it over
    real sshd); the host ``down`` refuses the connection, as ssh says it."""
    from nvmlcheck.testing import build_stub

    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for name, text in (("python3", f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n'),  # this venv's
                       ("ssh", '#!/bin/sh\n# options, then "--", the host, and the command\n'
                               'while [ "$1" != "--" ]; do shift; done\nshift\n'
                               'if [ "$1" = down ]; then\n'
                               '  echo "ssh: connect to host down port 22: Connection refused" >&2; exit 255\n'
                               'fi\nshift\nexec sh -c "$*"\n')):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    busy = Scenario.h200()
    busy.add_process(0, 4_123_456, used_bytes=16 << 30)
    return _env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", NVMLCHECK_LIBNVML=str(build_stub()),
                NVMLCHECK_STUB_SCENARIO=str(busy.write(tmp / "remote.txt")))


def _interrupted_kill(tmp: Path) -> Printed:
    """Ctrl-C to a kill after its first signal (the target says when SIGTERM came, and survives it): the error
    document carries ``pids``, what each target got."""
    target = subprocess.Popen(
        [sys.executable, "-S", "-c", "import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda n, f: print('term', flush=True))\n"
         "print('ready', flush=True)\ntime.sleep(600)"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    argv = ["--simulate", "h200", "--json", "kill", "--grace", "600", "--timeout", "600", str(target.pid)]
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == b"ready"
        proc = subprocess.Popen([sys.executable, "-m", "nvmlcheck", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=_env(), cwd=tmp,
                                preexec_fn=_sigint_default)  # noqa: PLW1509 - one call, no locks
        try:
            assert target.stdout.readline().strip() == b"term"
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        target.kill()
        target.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    doc = _one_document("kill Ctrl-C after the signal", out)
    assert [p["pid"] for p in doc["pids"]] == [target.pid], doc
    return Printed("kill Ctrl-C after the signal", argv, proc.returncode, doc, True)


def _child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> list[Printed]:
    pytest.importorskip("cffi")
    tmp = tmp_path_factory.mktemp("json-fields")
    sim = ["--simulate"]
    runs: list[Printed] = []

    def run(name: str, *argv: str, expect: set[int] | None = None, env: dict[str, str] | None = None) -> None:
        runs.append(_run(name, list(argv), {0} if expect is None else expect, env=env, cwd=tmp))

    run("version", "--json", "--version")
    first = _run("snapshot h200", [*sim, "h200", "--json", "snapshot"], {0, 3})
    if first.doc["schema"] == "nvmlcheck/error" and first.doc["error"]["type"] == "SimulationUnavailable":
        pytest.skip(first.doc["error"]["message"])
    runs.append(first)
    run("snapshot h200x8", *sim, "h200x8", "--json", "snapshot")
    run("snapshot h200-busy", *sim, "h200-busy", "--json", "snapshot")
    run("snapshot smi", *sim, "h200-busy", "--backend", "smi", "--json", "snapshot")
    run("wait clean", *sim, "h200", "--json", "wait", "--timeout", "60")
    run("wait timeout smi", *sim, "h200-busy", "--backend", "smi", "--json", "wait", "--timeout", "0", expect={1})
    run("ready smi", *sim, "h200x8", "--backend", "smi", "--json", "ready")
    run("wait clean, listening", *sim, "h200x8", "--json", "wait", "--timeout", "60", "--events")
    run("wait timeout", *sim, "h200-busy", "--json", "wait", "--timeout", "0", expect={1})
    run("ready", *sim, "h200x8", "--json", "ready")
    run("ready not ready", *sim, "h200-busy", "--json", "ready", "--timeout", "0", "--need", "0.95", expect={1})
    run("select found", *sim, "h200x8", "--json", "select", "--count", "2")
    run("select locked", *sim, "h200x8", "--json", "select", "--count", "1", "--lock")
    run("select not found", *sim, "h200-busy", "--json", "select", "--count", "1", "--timeout", "0", expect={1})
    run("holders", *sim, "h200-busy", "--json", "holders")
    # No --all-holders that signals: on a host with a GPU it would signal the real CUDA processes. A --match of a
    # word no process has, --missing-ok: nothing to signal, the GPUs waited for.
    nobody = ["--match", f"{WORD}-nobody", "--missing-ok"]
    run("kill nothing to kill", *sim, "h200", "--json", "kill", *nobody, "--timeout", "60")
    run("kill nothing to kill, timeout", *sim, "h200-busy", "--json", "kill", *nobody, "--timeout", "0", expect={1})
    gone = _child()
    gone.kill()
    gone.wait()
    run("kill missing", *sim, "h200", "--json", "kill", str(gone.pid), "--missing-ok", "--timeout", "60")
    child = _child()
    try:
        run("kill plan", *sim, "h200", "--json", "kill", "--dry-run", str(child.pid))
        run("kill clean", *sim, "h200", "--json", "kill", str(child.pid), "--timeout", "60")
    finally:
        child.kill()
        child.wait()
    child = _child()
    try:
        # The GPU is held by a process that never lets go: the target exits, the GPU is never clean. --timeout 0 is
        # one check, which always completes (a short timeout could cut the reading first: exit 3, under load).
        run("kill timeout", *sim, "h200-busy", "--json", "kill", str(child.pid), "--timeout", "0", expect={1})
    finally:
        child.kill()
        child.wait()
    # A lost GPU (snapshot: exit 3 with it under failures), a GPU in MIG mode, and retired pages (health's lists).
    (tmp / "lost.txt").write_text("nvmlcheck-stub-scenario 1\ndevice index=0\ndevice index=1 lost=1\n")
    (tmp / "mig.txt").write_text(
        "nvmlcheck-stub-scenario 1\ndevice index=0 mig=1 used=57671680\n"
        "mig device=0 index=0 gi=1 ci=0 total=17179869184\nmig device=0 index=1 gi=2 ci=0 total=34359738368\n"
        "process device=0 kind=compute pid=4242 used=1073741824 gi=2 ci=0\n")
    (tmp / "retired.txt").write_text(
        "nvmlcheck-stub-scenario 1\ndevice index=0 retired=sbe:0x1000@1700000000,dbe:0x2000@1700000100 "
        "retired_pending=0 unsupported=\n")
    run("snapshot lost GPU", *sim, str(tmp / "lost.txt"), "--json", "snapshot", expect={3})
    run("wait lost GPU", *sim, str(tmp / "lost.txt"), "--json", "wait", "--timeout", "0", expect={3})
    run("snapshot MIG", *sim, str(tmp / "mig.txt"), "--json", "snapshot")
    run("holders MIG", *sim, str(tmp / "mig.txt"), "--json", "holders")
    run("ready MIG", *sim, str(tmp / "mig.txt"), "--json", "ready", "--timeout", "0", expect={1})
    run("snapshot retired pages", *sim, str(tmp / "retired.txt"), "--json", "snapshot")
    # A real holder: listed by the scenario (bound to its PID) and holding the simulation's stand-in /dev/nvidia0 (in
    # dev/ beside the scenario), so holders and kill --all-holders find it both ways (kill --match signals it).
    (tmp / "dev").mkdir()
    (tmp / "dev" / "nvidia0").write_text("")
    holder = subprocess.Popen(
        [sys.executable, "-S", "-c", "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); "
         "time.sleep(600)", str(tmp / "dev" / "nvidia0"), WORD], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"ready"
        held = Scenario.h200()
        held.add_process(0, holder.pid, used_bytes=1 << 30, bound=True, list_ms=90, release_ms=120)
        held.write(tmp / "held.txt")
        run("holders of a real process", *sim, str(tmp / "held.txt"), "--json", "holders")
        run("kill plan of every holder", *sim, str(tmp / "held.txt"), "--json", "kill", "--dry-run", "--all-holders")
        run("kill every holder", *sim, str(tmp / "held.txt"), "--json", "kill", "--match", WORD, "--yes",
            "--timeout", "60")
    finally:
        holder.kill()
        holder.wait()
    run("error no such GPU", *sim, "h200", "--json", "snapshot", "--devices", "5", expect={2})
    run("error usage", "--json", "snapshot", "--no-such-option", expect={2})
    run("error usage, no command", "--json", expect={2})
    run("error usage, simulated", *sim, "h200", "--json", "wait", "--timeout", "soon", expect={2})
    run("error no backend", "--json", "--backend", "nvml", "snapshot", expect={3},
        env=_env(NVMLCHECK_LIBNVML=str(tmp / "no-such-libnvidia-ml.so")))
    hosts_env = _fake_ssh(tmp)
    run("hosts failed", "--json", "wait", "--host", "gpu01", "--host", "down", "--timeout", "0", expect={3},
        env=hosts_env)
    for command, expect in (("snapshot", 0), ("holders", 0), ("wait", 1), ("ready", 1), ("kill", 1)):
        extra = {"wait": ["--timeout", "0"], "ready": ["--timeout", "0"],
                 "kill": ["--match", f"{WORD}-nobody", "--missing-ok", "--yes", "--timeout", "0"]}.get(command, [])
        # kill on one host: here every "host" is this machine, and a second one's command line (which holds the
        # --match pattern) would be a process the first may select.
        hosts = ["--host", "gpu01"] if command == "kill" else ["--host", "gpu01", "--host", "gpu02"]
        run(f"hosts {command}", "--json", command, *hosts, *extra, expect={expect}, env=hosts_env)
    run("demo", "--json", "demo")
    # Two sizes, three runs each: what a fit of one ending needs (3 runs more than its 2 coefficients, and more).
    run("study reclaim", *sim, "h200", "--json", "study", "reclaim", "--sizes", "1GiB,4GiB", "--repeats", "3",
        "--endings", "KILL", "--no-warmup", "--out", str(tmp / "runs.jsonl"))
    run("study compare", "--json", "study", "compare", str(tmp / "runs.jsonl"), str(tmp / "runs.jsonl"))
    run("study fit", "--json", "study", "fit", "--include-simulated", str(tmp / "runs.jsonl"))
    run("slurm epilog", *sim, "h200", "slurm", "epilog", "--json",
        env=_env(SLURM_JOB_ID="42", SLURM_JOB_GPUS="0", SLURMD_NODENAME="gpu07"), expect={0})
    runs.append(_interrupted_kill(tmp))
    runs.append(_signalled("wait Ctrl-C", [*sim, "h200-busy", "--json", "wait", "--timeout", "600"], signal.SIGINT))
    runs.append(_signalled("ready SIGTERM", [*sim, "h200-busy", "--json", "ready", "--timeout", "600"],
                           signal.SIGTERM))
    return runs


def _schema(p: Printed) -> str:
    schema = p.doc.get("schema")
    assert isinstance(schema, str) and schema.startswith("nvmlcheck/"), f"{p.name}: schema {schema!r}"
    return schema.split("/", 1)[1]


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, str, Any, dict[str, Any]]]:
    """(path of the object, key, value, the object) of every key below ``value``, data-keyed maps not entered."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path, key, item, value
            if key not in DATA_KEYED:
                yield from _walk(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for item in value:
            yield from _walk(item, f"{path}[]")


# --- the checks ------------------------------------------------------------------------------------------------------


def test_every_form_was_printed(printed: list[Printed]) -> None:
    schemas = {_schema(p) for p in printed}
    assert schemas >= set(SCHEMAS), f"schemas this test did not print: {sorted(set(SCHEMAS) - schemas)}"


def test_every_document_has_schema_and_version_first(printed: list[Printed]) -> None:
    wrong = []
    for p in printed:
        keys = list(p.doc)
        head = ["schema", "version", "simulated"] if p.simulated or _schema(p) == "demo" else ["schema", "version"]
        if keys[: len(head)] != head or ("simulated" in p.doc) != (head[-1] == "simulated"):
            wrong.append(f"{p.name}: starts {keys[:3]}")
        if not isinstance(p.doc["version"], int) or isinstance(p.doc["version"], bool):
            wrong.append(f"{p.name}: version {p.doc['version']!r}")
        if p.doc.get("simulated") not in (None, True):
            wrong.append(f"{p.name}: simulated {p.doc['simulated']!r}")
    assert not wrong, "\n".join(wrong)


def _undocumented(schema: str, doc: dict[str, Any]) -> Iterator[str]:
    spec = SCHEMAS[schema]
    top, words = spec.top_level(), spec.words()
    for key in doc:
        if key not in ("schema", "version", "simulated") and key not in top:
            yield f"nvmlcheck/{schema}: top-level `{key}` is not in its field table"
    own = {k: v for k, v in doc.items() if k not in EMBEDDED}
    if schema == "hosts":  # each host's own document is checked against its own schema, below
        own["hosts"] = [{**h, "document": None} for h in doc["hosts"]]
    for path, key, _value, _ in _walk(own):
        if path and key not in words:
            yield f"nvmlcheck/{schema}: `{path}.{key}` is not named in its section"
    for key, inner in EMBEDDED.items():
        if isinstance(doc.get(key), dict):
            yield from _undocumented(inner, {"schema": f"nvmlcheck/{inner}", "version": 1, **doc[key]})
    if schema == "hosts":
        for host in doc["hosts"]:
            if isinstance(host.get("document"), dict):
                inner = _schema(Printed("", [], 0, host["document"], False))
                if f"`nvmlcheck/{inner}`" not in spec.text():
                    yield f"nvmlcheck/hosts: a host's document can be `nvmlcheck/{inner}`: its row does not say so"
                yield from _undocumented(inner, host["document"])


def test_every_field_printed_is_documented(printed: list[Printed]) -> None:
    missing = sorted({line for p in printed for line in _undocumented(_schema(p), p.doc)})
    assert not missing, "fields printed but not documented:\n" + "\n".join(missing)


def test_every_documented_field_is_printed(printed: list[Printed]) -> None:
    seen: dict[str, set[str]] = {}
    for p in printed:
        seen.setdefault(_schema(p), set()).update(p.doc)
    missing = []
    for schema, spec in SCHEMAS.items():
        if not spec.table or spec.row is not None:
            continue
        for field in sorted(spec.top_level() - seen.get(schema, set())):
            if (schema, field) not in NOT_PRINTED_HERE:
                missing.append(f"nvmlcheck/{schema}: `{field}` is in its table, in no document printed")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("schema", ["wait", "kill"])
def test_clean_only_fields_follow_their_form(printed: list[Printed], schema: str) -> None:
    wrong = []
    for names, meaning in SCHEMAS[schema].rows():
        only = re.match(r"(not clean|clean) only\b", meaning)
        if only is None:
            continue
        for p in (p for p in printed if _schema(p) == schema):
            wanted = p.doc["clean"] is (only.group(1) == "clean")
            for name in names:
                if (name in p.doc) != wanted:
                    wrong.append(f"{p.name}: `{name}` ({only.group(0)}) {'missing' if wanted else 'present'}")
    assert not wrong, "\n".join(wrong)


def test_bytes_and_times_are_integers(printed: list[Printed]) -> None:
    wrong = []
    for p in printed:
        for path, key, value, _ in _walk(p.doc):
            if not key.endswith(("_bytes", "_ns")):
                continue
            values = value.values() if isinstance(value, dict) else [value]  # a map of times: each one
            if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in values):
                wrong.append(f"{p.name}: {path}.{key} = {value!r}")
    assert not wrong, "bytes and times must be integers (or null):\n" + "\n".join(wrong)


#: The study's run records (``nvmlcheck/reclaim-run``, docs/study-records.md) key a null's reason by their own names
#: (``phase_resolution_ns.waitpid`` under ``unknown.waitpid_resolution``): tests/study holds them to that page.
RECORDS = "records[]"
#: Fields whose ``null`` means something documented, not unknown (docs/cli.md says which).
NULL_MEANS = frozenset({"relation", "container", "mig_index", "mig_uuid", "gpu_instance_id", "compute_instance_id"})


def _nulls(obj: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in obj.items():
        if key == "unknown" or key in NULL_MEANS:
            continue
        if value is None:
            yield f"{prefix}{key}"
        elif isinstance(value, dict) and "unknown" not in value:
            yield from _nulls(value, f"{prefix}{key}.")


def test_unknown_values_are_null_with_a_reason(printed: list[Printed]) -> None:
    wrong = []
    for p in printed:
        for path, key, value, obj in _walk(p.doc):
            if key != "unknown" or not isinstance(value, dict) or path.startswith(RECORDS):
                continue
            for name in _nulls(obj):
                reasons = [k for k in value if name == k or name.startswith(f"{k}.")]
                if not reasons:
                    wrong.append(f"{p.name}: {path or '.'}: `{name}` is null with no reason under `unknown`")
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_signals_and_errors_print_one_error_document(printed: list[Printed]) -> None:
    errors = {p.name: p for p in printed if _schema(p) == "error"}
    assert {"wait Ctrl-C", "ready SIGTERM", "error usage", "error no backend"} <= set(errors)
    for p in errors.values():
        assert p.doc["exit_code"] == p.code, p.name
        assert p.doc["error"]["type"] and p.doc["error"]["message"], p.name
    assert errors["wait Ctrl-C"].doc["error"]["type"] == "KeyboardInterrupt"
    assert errors["ready SIGTERM"].doc["error"]["type"] == "Terminated"
    assert errors["error usage"].doc["error"]["type"] == "UsageError"
    assert errors["error no backend"].doc["error"]["type"] == "BackendUnavailable"


def _watch_examples() -> dict[str, set[str]]:
    """The keys of each JSON Lines example in docs/events.md's ``## nvmlcheck watch`` (its documentation)."""
    text = section("events.md", "## nvmlcheck watch", examples=True)
    docs = [json.loads(block) for block in re.findall(r"^```json\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]
    return {doc["schema"]: set(doc) for doc in docs}


def test_watch_prints_documented_json_lines(tmp_path: Path) -> None:
    """``watch --json``: one document per line, each with the keys of docs/events.md's example of its schema, and the
    error that ends the stream (here SIGTERM, sent once both events were read: no ``--for`` to race the
    registration) is its last line."""
    pytest.importorskip("cffi")
    scenario = tmp_path / "xid.txt"
    bundled = subprocess.run([sys.executable, "-m", "nvmlcheck", "simulate", "scenario", "h200"], capture_output=True,
                             text=True, env=_env(), check=True).stdout
    # Raised at load: the stub hands a set every event since the scenario loaded, whenever it registers.
    scenario.write_text(bundled + "at ms=0 event device=0 type=xid data=79\nat ms=0 event device=0 type=xid data=13\n")
    proc = subprocess.Popen([sys.executable, "-m", "nvmlcheck", "--simulate", str(scenario), "--json", "watch"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=_sigint_default)  # noqa: PLW1509 - one call, no locks
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    try:
        while sum(doc["schema"] == "nvmlcheck/event" for doc in lines) < 2:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(json.loads(line))
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines += [json.loads(line) for line in rest.splitlines()]
    if lines and lines[-1].get("error", {}).get("type") == "SimulationUnavailable":
        pytest.skip(lines[-1]["error"]["message"])
    assert proc.returncode == 128 + signal.SIGTERM, err
    events = [doc for doc in lines if doc["schema"] == "nvmlcheck/event"]
    assert [e["xid"] for e in events] == [79, 13], lines  # every event the scenario raises, in order
    assert lines[-1]["schema"] == "nvmlcheck/error" and lines[-1]["error"]["type"] == "Terminated", lines[-1]
    examples = _watch_examples()
    for doc in lines[:-1]:
        keys = set(doc) - {"simulated"}
        assert keys == examples[doc["schema"]], f"{doc['schema']}: {sorted(keys ^ examples[doc['schema']])}"
        assert list(doc)[:3] == ["schema", "version", "simulated"]
        assert isinstance(doc["time_ns"], int)


def test_the_forms_with_data_have_it(printed: list[Printed]) -> None:
    """The runs meant to fill a document's lists did (else their nested keys would go unchecked)."""
    by_name = {p.name: p.doc for p in printed}
    holders = by_name["holders of a real process"]["holders"]
    assert [h["found_by"] for h in holders] == [["device-file", "nvml"]], holders
    assert by_name["kill plan of every holder"]["targets"][0]["gpus"], by_name["kill plan of every holder"]
    assert by_name["kill every holder"]["clean"] is True and by_name["kill every holder"]["pids"]
    assert by_name["kill timeout"]["pids"] and by_name["kill timeout"]["clean"] is False
    assert by_name["snapshot lost GPU"]["failures"] and by_name["snapshot MIG"]["devices"][0]["mig_devices"]
    assert by_name["snapshot retired pages"]["devices"][0]["health"]["retired_pages"]
    assert by_name["select locked"]["lock"] is not None
    for command in ("snapshot", "holders", "wait", "ready", "kill"):
        hosts = by_name[f"hosts {command}"]["hosts"]
        assert [h["document"]["schema"] for h in hosts] == [f"nvmlcheck/{command}"] * len(hosts), hosts
