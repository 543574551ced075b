"""The package namespace: every public name resolves, the type stub agrees with it, and importing stays cheap."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_dir_lists_every_public_name_and_no_deprecated_one() -> None:
    from nvmlcheck import _public

    listed = set(dir(nvmlcheck))
    public = {name for names in _public.EXPORTS.values() for name in names}
    assert public - listed == set()  # `open` was missing: no completion for the entry point
    assert {"open", "__version__"} <= listed
    assert not set(_public.DEPRECATED) & listed


def test_unknown_attribute_is_an_attribute_error() -> None:
    try:
        nvmlcheck.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("expected AttributeError")


def test_generated_namespace_files_are_what_the_one_list_says() -> None:
    from nvmlcheck import _public

    assert _public.check() == []


def test_a_top_level_name_its_module_does_not_offer_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck import _public

    monkeypatch.setitem(_public.EXPORTS, "locks", (*_public.EXPORTS["locks"], "NoSuchLock"))
    problems = _public.check()
    assert any("NoSuchLock" in p and "nvmlcheck.locks" in p for p in problems), problems
    assert any("__init__.pyi is stale" in p for p in problems), problems


def test_the_generator_rewrites_only_the_marked_part() -> None:
    from nvmlcheck import _public

    text = "head\n" + _public._BEGIN + "old table\n" + _public._END + "tail\n"
    out = _public.render_init(text)
    assert out.startswith("head\n" + _public._BEGIN) and out.endswith(_public._END + "tail\n")
    assert "old table" not in out and '"Session": "session",' in out
    with pytest.raises(SystemExit, match="markers"):
        _public.render_init("no markers here\n")


def test_deprecated_names_still_resolve_with_a_warning_and_are_not_public() -> None:
    from nvmlcheck import _public

    assert _public.DEPRECATED, "nothing deprecated: drop this test and the mechanism"
    for name, (module, release) in _public.DEPRECATED.items():
        assert name not in nvmlcheck.__all__
        with pytest.warns(DeprecationWarning, match=rf"nvmlcheck\.{name} .*{release}.*nvmlcheck\.{module}"):
            value = getattr(nvmlcheck, name)
        assert value is getattr(importlib.import_module(f"nvmlcheck.{module}"), name)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        _ = nvmlcheck.NoSuchName  # type: ignore[attr-defined]


def test_a_class_that_says_it_lives_at_the_top_level_does() -> None:
    # Exceptions report __module__ == "nvmlcheck" so that `except nvmlcheck.X` reads naturally and pickle finds them
    # there; a class that says so but is not a (non-deprecated) top-level name would pickle through a warning or fail.
    import inspect
    import pkgutil

    claimed = set()
    for info in pkgutil.walk_packages(nvmlcheck.__path__, "nvmlcheck."):
        if info.name.endswith(("__main__", "pytest_plugin")) or info.name.startswith("nvmlcheck.cli"):
            continue
        for value in vars(importlib.import_module(info.name)).values():
            if inspect.isclass(value) and value.__module__ == "nvmlcheck":
                claimed.add(value.__name__)
    assert claimed and claimed <= set(nvmlcheck.__all__), sorted(claimed - set(nvmlcheck.__all__))


def test_the_testing_face_is_generated_from_the_same_list(monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck import _public, testing

    assert sorted(testing.__all__) == sorted(n for names in _public.TESTING.values() for n in names)
    for old, new in _public.TESTING_ALIASES.items():
        assert old not in testing.__all__ and getattr(testing, old) is getattr(testing, new)
    monkeypatch.setitem(_public.TESTING, "clock", ("StepClock", "NoSuchClock"))
    problems = _public.check()
    assert any("testing.NoSuchClock" in p and "nvmlcheck._sim.clock" in p for p in problems), problems
    assert any("testing/__init__.py is stale" in p for p in problems), problems


def test_star_import_does_not_shadow_the_builtin_open() -> None:
    namespace: dict[str, object] = {}
    exec("from nvmlcheck import *", namespace)
    assert "open" not in namespace and "Session" in namespace and "GIB" in namespace
    assert "open" not in nvmlcheck.__all__
    from nvmlcheck import open as open_session  # still offered, typed and documented

    assert nvmlcheck.open is open_session is importlib.import_module("nvmlcheck.session").open


def test_the_generator_takes_write_as_the_default_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nvmlcheck import _public

    for name in ("__init__.py", "__init__.pyi", "testing/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text((PACKAGE / name).read_text())
    (tmp_path / "__init__.py").write_text(_public.render_init((PACKAGE / "__init__.py").read_text()).replace(
        '"open": "session",\n', ""))  # stale: a name missing from the table
    monkeypatch.setattr(_public, "PACKAGE", tmp_path)
    assert _public.main(["--write"]) == 0  # `--write` was an unrecognised argument (exit 2)
    assert (tmp_path / "__init__.py").read_text() == (PACKAGE / "__init__.py").read_text()


def test_dir_offers_public_names_and_submodules_only() -> None:
    """``dir()`` is what completion offers: `from __future__ import annotations` made `nvmlcheck.annotations` (a
    ``__future__`` feature) look like a public name, and `typing.TYPE_CHECKING` did in ``nvmlcheck.testing``."""
    import types

    from nvmlcheck import testing

    testing.ProcessKind  # noqa: B018 - a deprecated alias, once used, is a global of the module; still not offered
    for module in (nvmlcheck, testing):
        public = set(module.__all__) | {"open"}
        odd = [name for name in dir(module) if not name.startswith("_") and name not in public
               and not isinstance(getattr(module, name), types.ModuleType)]
        assert odd == [], module.__name__
