"""The package namespace: every public name resolves, the type stub agrees with it, and importing stays cheap."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import nvmlcheck

PACKAGE = Path(nvmlcheck.__file__).parent


def test_every_public_name_resolves() -> None:
    for name in nvmlcheck.__all__:
        assert getattr(nvmlcheck, name) is not None, name
    assert sorted(nvmlcheck.__all__) == sorted(set(nvmlcheck.__all__)), "duplicates in __all__"


def test_type_stub_declares_the_same_names() -> None:
    tree = ast.parse((PACKAGE / "__init__.pyi").read_text())
    stub_all: list[str] = []
    imported: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            stub_all = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom):
            imported.update(alias.asname or alias.name for alias in node.names)
    assert sorted(stub_all) == sorted(nvmlcheck.__all__)
    assert set(nvmlcheck.__all__) - {"__version__"} <= imported


def test_import_loads_no_submodule_and_no_typing() -> None:
    code = "import sys, nvmlcheck; print(sorted(m for m in sys.modules if m.startswith('nvmlcheck') or m == 'typing'))"
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    ).stdout
    assert out.strip() == "['nvmlcheck']"


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        nvmlcheck.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
