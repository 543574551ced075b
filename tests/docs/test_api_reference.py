"""docs/api.md documents every public name and is what docs/gen_api.py makes of the current docstrings."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import nvmlcheck
import nvmlcheck.testing

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "docs" / "api.md"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_api", ROOT / "docs" / "gen_api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documented(text: str) -> set[str]:
    """Names with a heading (``### `X` ``) or a table row (``| `X` |``) of their own."""
    headings = re.findall(r"^### `([^`]+)`\s*$", text, re.MULTILINE)
    rows = re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE)
    return set(headings) | set(rows)


def test_every_public_name_is_documented() -> None:
    documented = _documented(API.read_text(encoding="utf-8"))
    missing = [name for name in nvmlcheck.__all__ if name not in documented]
    testing_names = [f"nvmlcheck.testing.{n}" for n in nvmlcheck.testing.__all__]
    missing += [name for name in testing_names if name not in documented]
    assert not missing, f"public names missing from docs/api.md (run python docs/gen_api.py): {missing}"


def test_api_md_is_up_to_date() -> None:
    generated = _generator().render()
    current = API.read_text(encoding="utf-8")
    assert current == generated, (
        "docs/api.md differs from the docstrings: run python docs/gen_api.py (and place new public names in its "
        "SECTIONS)"
    )


def test_every_nvml_error_class_has_a_row() -> None:
    from nvmlcheck import errors

    documented = _documented(API.read_text(encoding="utf-8"))
    for code in errors.KNOWN_CODES:
        assert errors.error_class_for_code(code).__name__ in documented


def test_every_fixture_is_documented_with_its_type() -> None:
    from nvmlcheck.testing import pytest_plugin

    text = API.read_text(encoding="utf-8")
    documented = _documented(text)
    fixtures = [n for n in pytest_plugin.__all__ if not n.startswith("pytest_")]
    assert fixtures
    for name in fixtures:
        assert f"nvmlcheck.testing.pytest_plugin.{name}" in documented, name
        assert re.search(rf"^def test_it\({name}: \w+\) -> None: \.\.\.$", text, re.MULTILINE), name
