"""Every Python example in README.md and docs/*.md passes ``mypy --strict``, as a tool author's code would have to.

``test_examples.py`` runs each block; this test type-checks them: each ``python`` block (and each ``pycon`` block,
its prompts stripped) becomes one module, and one mypy run checks them all against the installed nvmlcheck. A
block marked ``no-test`` is type-checked too: it is skipped at run time for what it needs (ssh hosts, a GPU), not
for what it says. An error is reported at its line in the page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_examples import BLOCKS, ROOT, Block, pycon_to_python

TYPED_LANGS = frozenset({"python", "pycon"})
_ERROR = re.compile(r"^(?P<file>block_\d+\.py):(?P<line>\d+): (?P<kind>error|note): (?P<text>.*)$")


def _code(block: Block) -> str:
    return pycon_to_python(block.code) if block.lang == "pycon" else block.code


def _page_line(block: Block, code_line: int) -> int:
    """The line in the page of ``code_line`` (1-based) of the block's code (a pycon block: of its code lines)."""
    if block.lang == "pycon":
        kept = [i for i, line in enumerate(block.code.splitlines(), start=1)
                if line.lstrip().startswith((">>>", "..."))]
        offset = kept[code_line - 1] if 0 < code_line <= len(kept) else 1
    else:
        offset = code_line
    return block.line + offset  # block.line is the opening fence


def test_every_python_example_passes_mypy_strict(tmp_path: Path) -> None:
    blocks = [b for b in BLOCKS if b.lang in TYPED_LANGS]
    assert len(blocks) > 30, "fewer Python examples than expected: is the docs directory where this test expects it?"
    files: dict[str, Block] = {}
    for n, block in enumerate(blocks):
        name = f"block_{n:03d}.py"
        (tmp_path / name).write_text(_code(block), encoding="utf-8")
        files[name] = block
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.10", "--no-error-summary",
         "--show-error-codes", "--cache-dir", str(tmp_path / ".mypy_cache"), *sorted(files)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    problems: list[str] = []
    for line in result.stdout.splitlines():
        m = _ERROR.match(line)
        if m is None:
            if line.strip():
                problems.append(line)
            continue
        block = files[m["file"]]
        where = f"{block.path.relative_to(ROOT)}:{_page_line(block, int(m['line']))}"
        problems.append(f"{where}: {m['kind']}: {m['text']}")
    if result.returncode != 0 or problems:
        pytest.fail(f"docs examples that fail mypy --strict (exit {result.returncode}):\n" + "\n".join(problems)
                    + (f"\n{result.stderr}" if result.stderr.strip() else ""), pytrace=False)


def _docstring_examples() -> dict[str, str]:
    """Each docstring's ``>>>`` example in nvmlcheck's modules, as code: name -> source."""
    import doctest
    import importlib
    import pkgutil

    import nvmlcheck

    finder = doctest.DocTestFinder(exclude_empty=True)
    found: dict[str, str] = {}
    names = ["nvmlcheck", *(m.name for m in pkgutil.walk_packages(nvmlcheck.__path__, "nvmlcheck."))]
    for name in names:
        if name.endswith(("__main__", "pytest_plugin")):
            continue  # running them would start the CLI / needs pytest's plugin machinery
        for test in finder.find(importlib.import_module(name)):
            if test.examples:
                found[test.name] = "".join(example.source for example in test.examples)
    return found


def test_every_docstring_example_passes_mypy_strict(tmp_path: Path) -> None:
    # What help() and docs/api.md show a tool author is copied into code: it must type-check as docs/*.md does.
    examples = _docstring_examples()
    assert len(examples) >= 10, "fewer docstring examples than expected"
    files: dict[str, str] = {}
    for n, (name, code) in enumerate(sorted(examples.items())):
        files[f"doc_{n:03d}.py"] = name
        (tmp_path / f"doc_{n:03d}.py").write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-version", "3.10", "--no-error-summary",
         "--cache-dir", str(tmp_path / ".mypy_cache"), *sorted(files)],
        cwd=tmp_path, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
        check=False,
    )
    problems = [f"{files.get(line.split(':', 1)[0], '?')}: {line}" for line in result.stdout.splitlines()
                if line.strip()]
    assert result.returncode == 0 and not problems, "docstring examples that fail mypy --strict:\n" + "\n".join(
        problems)


def test_page_lines_point_into_the_block() -> None:
    block = next(b for b in BLOCKS if b.lang == "python")
    first = block.code.splitlines()[0]
    page = block.path.read_text(encoding="utf-8").splitlines()
    assert page[_page_line(block, 1) - 1] == first
