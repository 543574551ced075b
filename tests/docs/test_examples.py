"""Every code block in README.md and docs/*.md runs here, against the stub libnvidia-ml, so the examples cannot rot.

How a block is classified (by the language of its fence):

* ``python``: written to a file and run with this interpreter.
* ``pycon``: the ``>>>``/``...`` prompts are stripped, the output lines dropped, and the code is run as ``python``.
* ``bash``: run with ``bash -e -o pipefail``.
* ``console``: each ``$ command`` line is run with bash; the lines after it are the expected output (stdout and
  stderr together). ``...`` inside a line matches any text; a line that is only ``...`` matches any number of lines.
* ``json``: must parse. With ``<!-- test: output-of="nvmlcheck ..." -->`` the command is run and its JSON document
  must have the same keys, at every level, as the block (the schema cannot drift from the docs).
* ``text``: a listing (program output, a tree, a format): nothing to run.

Any other fence (or a fence without a language) fails the inventory test: every block must be classified.

Each run happens in a fresh temporary directory, with a ``bin/`` first on ``PATH`` holding ``nvmlcheck`` and ``python``
(this interpreter) and ``nvidia-smi`` (the fake one from ``stubs/``, which renders the same scenario), and with
``NVMLCHECK_LIBNVML``/``NVMLCHECK_STUB_SCENARIO`` pointing at the stub and a scenario. The HTML comment right before a
block (blank lines allowed in between) sets the options:

* ``<!-- no-test: REASON -->``: not run (it needs a real GPU, installs packages, ...); counted and reported as a skip.
* ``<!-- test: scenario=NAME exit=N output-of="CMD" -->``: the scenario (default ``h200``, see :data:`SCENARIOS`), the
  expected exit status of the block (of its last command for ``console``; default 0), the command for ``json``.

The ``server`` scenario starts a real child process (it stands for a GPU server), binds it in the scenario as a
compute process holding 16 GiB on GPU 0 (the stub drops it from the list 90 ms after it dies and gives the memory back
at 120 ms, as in ``nvmlcheck demo``), and hands its PID to the block as ``$SERVER_PID`` and in the file ``server.pid``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck.testing import Scenario, build_stub, stub_source_dir

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Pages other people own and test themselves; everything else in docs/ is checked here.
NOT_OURS = frozenset({"performance.md", "reclaim-study.md", "reliability.md"})
GIB = 1 << 30
BLOCK_TIMEOUT_S = 30.0

RUN_LANGS = frozenset({"python", "pycon", "bash", "console"})
CHECK_LANGS = frozenset({"json"})
LISTING_LANGS = frozenset({"text"})


# --- scenarios ------------------------------------------------------------------------------------------------------


@dataclass
class Setup:
    """What a scenario prepares before a block runs."""

    scenario: Scenario
    variant: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _idle(devices: int = 1) -> Callable[[Path], Setup]:
    return lambda tmp: Setup(Scenario.h200(devices=devices))


def _busy(tmp: Path) -> Setup:
    # The same as `--simulate h200-busy`: a process that never lets go of 16 GiB (not a real PID here).
    scenario = Scenario.h200()
    scenario.add_process(0, 4_123_456, used_bytes=16 * GIB)
    return Setup(scenario)


def _busy4(tmp: Path) -> Setup:
    # Four H200s, GPU 0 held by a process that never lets go: what `nvmlcheck select` examples choose from.
    scenario = Scenario.h200(devices=4)
    scenario.add_process(0, 4_123_456, used_bytes=16 * GIB)
    return Setup(scenario)


def _server(tmp: Path) -> Setup:
    # Like a CUDA process, the server has an NVIDIA device file open (a stand-in: CI has no /dev/nvidia*), so
    # `kill --all-on-gpu` can prove the NVML PID names it.
    dev = tmp / "dev"
    dev.mkdir()
    (dev / "nvidia0").write_text("")
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", "import sys, time; f = open(sys.argv[1]); print('ready', flush=True); "
         "time.sleep(3600)", str(dev / "nvidia0")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
    scenario = Scenario.h200(devices=2)
    scenario.add_process(0, child.pid, used_bytes=16 * GIB, bound=True, list_ms=90, release_ms=120)
    env = {"SERVER_PID": str(child.pid)}  # dev/ next to the scenario: the simulation's stand-ins
    return Setup(scenario, env=env, files={"server.pid": f"{child.pid}\n"}, children=[child])


def _hidden(tmp: Path) -> Setup:
    # Memory in use with an empty process list, as inside a PID namespace.
    scenario = Scenario.h200()
    scenario.set_device(0, used_bytes=16 * GIB)
    return Setup(scenario)


def _v1(tmp: Path) -> Setup:
    # A driver without nvmlDeviceGetMemoryInfo_v2: `used` counts the driver's reserved memory.
    return Setup(Scenario.h200(), variant=("STUB_NO_MEMORY_V2",))


def _remap(tmp: Path) -> Setup:
    # An idle H200 with a pending row remap: clean, but it needs a reset (docs/ready.md).
    scenario = Scenario.h200()
    scenario.set_device(0, remapped_rows=(0, 1, True, False))
    return Setup(scenario)


#: Scenario name -> what it prepares.
SCENARIOS: dict[str, Callable[[Path], Setup]] = {
    "h200": _idle(1),
    "h200x2": _idle(2),
    "busy": _busy,
    "busy4": _busy4,
    "server": _server,
    "hidden": _hidden,
    "v1": _v1,
    "remap": _remap,
}


# --- blocks ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One fenced code block and the marker comment before it."""

    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    skip_reason: str | None
    options: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


_FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)\s*$")
_MARKER = re.compile(r"^<!--\s*(no-test|test)\s*:(.*?)-->\s*$")


class DocFormatError(Exception):
    """A page cannot be read as a set of blocks (an unclosed fence, a stray marker)."""


def doc_pages() -> list[Path]:
    """README.md and the docs/*.md pages this test owns."""
    return [ROOT / "README.md", *sorted(p for p in DOCS.glob("*.md") if p.name not in NOT_OURS)]


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` with their markers. Raises :class:`DocFormatError` on a malformed page."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    marker: tuple[int, str, str] | None = None  # (line, kind, text)
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _MARKER.match(line.strip())
        if m is not None:
            if marker is not None:
                raise DocFormatError(f"{path.name}:{marker[0]}: marker not followed by a code block")
            marker = (i + 1, m.group(1), m.group(2).strip())
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip() and marker is not None:
                raise DocFormatError(f"{path.name}:{marker[0]}: marker not followed by a code block")
            if line.startswith("```"):
                raise DocFormatError(f"{path.name}:{i + 1}: fence with an unreadable info string: {line!r}")
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise DocFormatError(f"{path.name}:{start + 1}: code block never closed")
        i += 1
        skip: str | None = None
        options: dict[str, str] = {}
        if marker is not None:
            if marker[1] == "no-test":
                skip = marker[2]
                if not skip:
                    raise DocFormatError(f"{path.name}:{marker[0]}: no-test needs a reason")
            else:
                options = _options(path, marker[0], marker[2])
        blocks.append(Block(path, start + 1, fence.group(1), "\n".join(body) + "\n", skip, options))
        marker = None
    if marker is not None:
        raise DocFormatError(f"{path.name}:{marker[0]}: marker not followed by a code block")
    return blocks


def _options(path: Path, line: int, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for word in shlex.split(text):
        key, sep, value = word.partition("=")
        if not sep or key not in ("scenario", "exit", "output-of"):
            raise DocFormatError(f"{path.name}:{line}: unknown test option {word!r}")
        if key == "scenario" and value not in SCENARIOS:
            raise DocFormatError(f"{path.name}:{line}: unknown scenario {value!r}; known: {sorted(SCENARIOS)}")
        out[key] = value
    return out


def all_blocks() -> list[Block]:
    out: list[Block] = []
    for page in doc_pages():
        with contextlib.suppress(DocFormatError):  # reported by test_pages_parse
            out.extend(parse_blocks(page))
    return out


BLOCKS = all_blocks()


# --- the environment a block runs in --------------------------------------------------------------------------------


@contextlib.contextmanager
def block_environment(options: dict[str, str], tmp: Path) -> Iterator[dict[str, str]]:
    """A working directory and environment that point nvmlcheck, python and nvidia-smi at the stub."""
    setup = SCENARIOS[options.get("scenario", "h200")](tmp)
    try:
        library = build_stub(setup.variant)
        scenario_path = setup.scenario.write(tmp / "scenario.txt")
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        fake_smi = stub_source_dir() / "fake_nvidia_smi.py"
        wrappers = {
            "nvmlcheck": f'exec {shlex.quote(sys.executable)} -m nvmlcheck "$@"\n',
            "python": f'exec {shlex.quote(sys.executable)} "$@"\n',
            "nvidia-smi": f'exec {shlex.quote(sys.executable)} -S {shlex.quote(str(fake_smi))} "$@"\n',
        }
        for name, body in wrappers.items():
            script = bin_dir / name
            script.write_text("#!/bin/sh\n" + body, encoding="utf-8")
            script.chmod(0o755)
        work = tmp / "work"
        work.mkdir()
        for name, content in setup.files.items():
            (work / name).write_text(content, encoding="utf-8")
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("NVMLCHECK_STUB_", "PYTEST_", "COV_", "CUDA_"))
            and key not in ("NVMLCHECK_LIBNVML", "NVMLCHECK_LOCK_DIR", "NVMLCHECK_SIMULATE")
        }
        env.update(
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            NVMLCHECK_LIBNVML=str(library),
            NVMLCHECK_STUB_SCENARIO=str(scenario_path),
            PYTHONPATH=str(ROOT),
            # `select --lock` examples: locks in the block's own directory, not the machine's.
            NVMLCHECK_LOCK_DIR=str(tmp / "locks"),
            PYTHONUNBUFFERED="1",
            # An example that uses a name nvmlcheck deprecated fails: the docs show the current API.
            PYTHONWARNINGS="error:nvmlcheck.:DeprecationWarning",
            COLUMNS="120",
            **setup.env,
        )
        env["PWD"] = str(work)
        # Every process the block starts inherits this: what it leaves running (a `sleep 30 &` owner, the lock
        # holder of `select --lock`, whose owner may be this very test process) is ended with the block.
        env["NVMLCHECK_DOCS_BLOCK"] = str(tmp)
        yield env
    finally:
        for child in setup.children:
            if child.poll() is None:
                child.kill()
            child.wait()
        _end_block_processes(f"NVMLCHECK_DOCS_BLOCK={tmp}".encode())


def _end_block_processes(marker: bytes) -> None:
    """SIGKILL every process whose environment holds ``marker`` (the block's own variable)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def _run(argv: list[str], env: dict[str, str], *, merge: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=env["PWD"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge else subprocess.PIPE,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )


def _explain(block: Block, result: subprocess.CompletedProcess[str], what: str) -> str:
    return (
        f"{block.id}: {what}\n--- code ---\n{block.code}--- exit {result.returncode} ---\n"
        f"--- stdout ---\n{result.stdout}--- stderr ---\n{result.stderr or ''}"
    )


# --- runners --------------------------------------------------------------------------------------------------------


def pycon_to_python(code: str) -> str:
    """The code of an interactive session: ``>>>``/``...`` lines without their prompts; output lines dropped."""
    out: list[str] = []
    for line in code.splitlines():
        stripped = line.lstrip()
        if stripped.startswith((">>> ", "... ")) or stripped in (">>>", "..."):
            out.append(re.sub(r"\s*#\s*doctest:.*$", "", stripped[4:]))
    return "\n".join(out) + "\n"


def run_python(block: Block, env: dict[str, str], code: str) -> None:
    script = Path(env["PWD"]) / "example.py"
    script.write_text(code, encoding="utf-8")
    result = _run([sys.executable, str(script)], env)
    expected = int(block.options.get("exit", "0"))
    assert result.returncode == expected, _explain(block, result, f"expected exit {expected}")


def run_bash(block: Block, env: dict[str, str]) -> None:
    script = Path(env["PWD"]) / "example.sh"
    script.write_text(block.code, encoding="utf-8")
    result = _run(["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", str(script)], env)
    expected = int(block.options.get("exit", "0"))
    assert result.returncode == expected, _explain(block, result, f"expected exit {expected}")


def console_commands(code: str) -> list[tuple[str, list[str]]]:
    """``(command, expected output lines)`` for each ``$ `` line of a console block (``\\`` continues a command)."""
    out: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            raise DocFormatError(f"console block: expected a '$ ' command line, got {line!r}")
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + " " + lines[i].strip()
        i += 1
        expected: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        out.append((command, expected))
    if not out:
        raise DocFormatError("console block without a '$ ' command")
    return out


def output_pattern(expected: list[str]) -> re.Pattern[str]:
    """A regex for expected output: ``...`` in a line is any text; a line of only ``...`` is any lines."""
    parts: list[str] = []
    for line in expected:
        text = line.rstrip()
        if text.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(piece) for piece in text.split("...")) + r"\n")
    return re.compile("".join(parts), re.DOTALL)


def normalise_output(text: str) -> str:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return "".join(line + "\n" for line in lines)


def run_console(block: Block, env: dict[str, str]) -> None:
    commands = console_commands(block.code)
    for n, (command, expected) in enumerate(commands):
        result = _run(["bash", "--noprofile", "--norc", "-o", "pipefail", "-c", command], env, merge=True)
        want_exit = int(block.options.get("exit", "0")) if n == len(commands) - 1 else 0
        assert result.returncode == want_exit, _explain(block, result, f"$ {command}: expected exit {want_exit}")
        actual = normalise_output(result.stdout)
        wanted = normalise_output("\n".join(expected))
        if not output_pattern(wanted.splitlines()).fullmatch(actual):
            pytest.fail(
                f"{block.id}: output of `{command}` differs from the docs\n"
                f"--- docs ---\n{wanted}--- actual ---\n{actual}",
                pytrace=False,
            )


def key_shape(value: Any) -> Any:
    """The keys of a JSON value at every level (lists: the union over their items); leaves become ``None``."""
    if isinstance(value, dict):
        return {k: key_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        merged: Any = None
        for item in value:
            shape = key_shape(item)
            merged = _merge_shapes(merged, shape)
        return [merged] if merged is not None else []
    return None


def _merge_shapes(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge_shapes(a.get(k), b.get(k)) for k in {**a, **b}}
    return a if a is not None else b


def _shape_differences(doc: Any, real: Any, where: str = "$") -> list[str]:
    if isinstance(doc, dict) and isinstance(real, dict):
        out = [f"{where}.{k}: in the docs, not in the output" for k in doc if k not in real]
        out += [f"{where}.{k}: in the output, not in the docs" for k in real if k not in doc]
        for k in doc:
            if k in real:
                out += _shape_differences(doc[k], real[k], f"{where}.{k}")
        return out
    if isinstance(doc, list) and isinstance(real, list) and doc and real:
        return _shape_differences(doc[0], real[0], f"{where}[]")
    return []


def check_json(block: Block, env: dict[str, str] | None) -> None:
    try:
        documented = json.loads(block.code)
    except json.JSONDecodeError as exc:
        pytest.fail(f"{block.id}: not valid JSON: {exc}")
    command = block.options.get("output-of")
    if command is None:
        return
    assert env is not None
    result = _run(["bash", "--noprofile", "--norc", "-c", command], env)
    expected = int(block.options.get("exit", "0"))
    assert result.returncode == expected, _explain(block, result, f"$ {command}: expected exit {expected}")
    real = json.loads(result.stdout)
    problems = _shape_differences(key_shape(documented), key_shape(real))
    assert not problems, f"{block.id}: the documented JSON differs from `{command}`:\n" + "\n".join(problems)


# --- tests ----------------------------------------------------------------------------------------------------------


def test_pages_parse() -> None:
    """Every page reads as a set of blocks: fences closed, markers attached to a block, options known."""
    for page in doc_pages():
        parse_blocks(page)


def test_inventory() -> None:
    """Every block is classified; the count of run and skipped blocks is reported (-rA shows it)."""
    unknown = [f"{b.id}: ```{b.lang}" for b in BLOCKS if b.lang not in RUN_LANGS | CHECK_LANGS | LISTING_LANGS]
    known = "python, pycon, bash, console, json, text"
    assert not unknown, f"blocks in a language this test does not know (use {known}):\n" + "\n".join(unknown)
    listed_with_marker = [b.id for b in BLOCKS if b.lang in LISTING_LANGS and (b.skip_reason or b.options)]
    assert not listed_with_marker, f"text blocks are never run; their markers mean nothing: {listed_with_marker}"
    code = [b for b in BLOCKS if b.lang in RUN_LANGS]
    skipped = [b for b in code if b.skip_reason is not None]
    assert code, "no code blocks found: is the docs directory where this test expects it?"
    # Most examples must run: a page of skipped examples is a page that can rot.
    assert len(skipped) * 3 <= len(code), f"{len(skipped)} of {len(code)} code blocks are marked no-test"
    print(f"\ndocs examples: {len(code) - len(skipped)} run, {len(skipped)} marked no-test, "
          f"{sum(b.lang in CHECK_LANGS for b in BLOCKS)} JSON checked, {sum(b.lang in LISTING_LANGS for b in BLOCKS)} "
          "text listings")
    for b in skipped:
        print(f"  no-test {b.id}: {b.skip_reason}")


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in RUN_LANGS], ids=lambda b: b.id)
def test_code_block(block: Block, tmp_path: Path) -> None:
    if block.skip_reason is not None:
        pytest.skip(f"marked no-test: {block.skip_reason}")
    with block_environment(block.options, tmp_path) as env:
        if block.lang == "python":
            run_python(block, env, block.code)
        elif block.lang == "pycon":
            run_python(block, env, pycon_to_python(block.code))
        elif block.lang == "bash":
            run_bash(block, env)
        else:
            run_console(block, env)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in CHECK_LANGS], ids=lambda b: b.id)
def test_json_block(block: Block, tmp_path: Path) -> None:
    if "output-of" not in block.options:
        check_json(block, None)
        return
    with block_environment(block.options, tmp_path) as env:
        check_json(block, env)


# --- the harness itself ---------------------------------------------------------------------------------------------


def test_output_pattern() -> None:
    pattern = output_pattern(["clean after ... ms", "...", "done"])
    assert pattern.fullmatch("clean after 1.5 ms\nline\nother\ndone\n")
    assert pattern.fullmatch("clean after 1.5 ms\ndone\n")
    assert not pattern.fullmatch("clean after 1.5 ms\ndone\nmore\n")
    assert not output_pattern(["a"]).fullmatch("b\n")


def test_pycon_to_python() -> None:
    code = textwrap.dedent(
        """\
        >>> x = 1  # doctest: +SKIP
        >>> for i in range(2):
        ...     x += i
        >>> x
        2
        """
    )
    assert pycon_to_python(code) == "x = 1\nfor i in range(2):\n    x += i\nx\n"


def test_parse_blocks_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n<!-- no-test: needs a real GPU -->\n\n```bash\nnvidia-smi\n```\n"
        '<!-- test: scenario=busy exit=1 -->\n```console\n$ nvmlcheck wait --timeout 0\n```\n```text\nout\n```\n',
        encoding="utf-8",
    )
    blocks = parse_blocks(page)
    assert [(b.lang, b.skip_reason, b.options) for b in blocks] == [
        ("bash", "needs a real GPU", {}),
        ("console", None, {"scenario": "busy", "exit": "1"}),
        ("text", None, {}),
    ]
    page.write_text("<!-- no-test: x -->\nprose\n```bash\nls\n```\n", encoding="utf-8")
    with pytest.raises(DocFormatError, match="marker not followed"):
        parse_blocks(page)
    page.write_text("<!-- no-test: -->\n```bash\nls\n```\n", encoding="utf-8")
    with pytest.raises(DocFormatError, match="needs a reason"):
        parse_blocks(page)
    page.write_text("```bash\nls\n", encoding="utf-8")
    with pytest.raises(DocFormatError, match="never closed"):
        parse_blocks(page)


def test_key_shape() -> None:
    doc = {"a": 1, "b": [{"c": 1}], "d": None}
    assert not _shape_differences(key_shape(doc), key_shape({"a": 2, "b": [{"c": 3}, {"c": 4}], "d": {"x": 1}}))
    assert _shape_differences(key_shape(doc), key_shape({"a": 2, "b": [{"e": 3}]})) == [
        "$.d: in the docs, not in the output",
        "$.b[].c: in the docs, not in the output",
        "$.b[].e: in the output, not in the docs",
    ]
