"""``nvmlcheck/_record_methods.py``: every record class of the package takes its methods from the generated module
(no ``compile`` at import), a record defined elsewhere still compiles its own, the methods are the same either way,
and ``python -m nvmlcheck._record --check`` tells a stale module from the current one."""

from __future__ import annotations

import inspect
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import _record, _record_methods
from nvmlcheck._record import field, record

ROOT = Path(__file__).resolve().parents[2]
GENERATED = Path(_record_methods.__file__)
NAMES = _record._METHOD_NAMES


@record
class _Local:
    """A record of this test module: no layout of the generated module has its fields, so its text is compiled."""

    number: int
    label_of_a_local_record: str = "x"
    tags: tuple[str, ...] = field(default_factory=tuple, compare=False)


def _package_records() -> list[type]:
    assert _record._import_package() == []  # every module of the package imports, so every record class is made
    made = [c for c in _record._RECORDS if c.__module__.startswith("nvmlcheck.")]
    assert len(made) >= 14  # model, _clocks, _readings, wait, predicates, verdict, reclaim_model
    return made


def test_every_record_of_the_package_takes_the_generated_methods() -> None:
    for cls in _package_records():
        for name in NAMES:
            function = cls.__dict__[name]
            assert function.__code__.co_filename == _record_methods.__file__, f"{cls.__qualname__}.{name} was compiled"
            assert function.__qualname__ == f"{cls.__qualname__}.{name}"
            # the module that made the class (the classes of _readings, _clocks and _waitoptions name their public
            # module afterwards, for reprs and pickling)
            made_in = ("nvmlcheck._readings", "nvmlcheck._clocks", "nvmlcheck._waitoptions")
            assert function.__module__ in (cls.__module__, *made_in)


def test_a_record_outside_the_package_compiles_its_text() -> None:
    for name in NAMES:
        function = _Local.__dict__[name]
        assert function.__code__.co_filename == "<string>"
        assert function.__qualname__ == f"_Local.{name}" and function.__module__ == __name__
    one = _Local(1)
    assert one == _Local(1, tags=("a",)) and hash(one) == hash(_Local(1)) and one != _Local(2)
    assert repr(one) == "_Local(number=1, label_of_a_local_record='x', tags=())"
    assert pickle.loads(pickle.dumps(one)) == one


def test_the_generated_methods_are_what_the_text_compiles_to() -> None:
    # Same signatures, defaults (the very objects) and behaviour as the exec of the same text would give.
    for cls in _package_records():
        spec: Any = cls.__record_spec__  # type: ignore[attr-defined]
        env = _record._env(spec)
        exec(_record._methods(spec), env)
        for name in NAMES:
            ours, compiled = cls.__dict__[name], env[name]
            assert inspect.signature(ours) == inspect.signature(compiled), (cls, name)
            assert ours.__defaults__ == compiled.__defaults__ and ours.__kwdefaults__ == compiled.__kwdefaults__
            assert all(a is b for a, b in zip(ours.__defaults__ or (), compiled.__defaults__ or (), strict=True))


def test_one_factory_per_distinct_text_in_sorted_order() -> None:
    texts = list(_record_methods.METHODS)
    assert texts == sorted(texts)
    assert len(set(map(id, _record_methods.METHODS.values()))) == len(texts)
    needed = {_record._methods(c.__record_spec__) for c in _package_records()}  # type: ignore[attr-defined]
    assert set(texts) == needed


def test_check_passes_on_the_current_module(capsys: pytest.CaptureFixture[str]) -> None:
    assert _record.main(["--check"]) == 0
    assert "_record_methods.py is up to date" in capsys.readouterr().out


def test_write_makes_the_committed_text(tmp_path: Path) -> None:
    target = tmp_path / "_record_methods.py"
    assert _record.main(["--write"], target=str(target)) == 0
    assert target.read_text() == GENERATED.read_text()
    assert _record.main(["--check"], target=str(target)) == 0


@pytest.mark.parametrize("damage", ["drop a layout", "extra layout", "edited", "missing", "broken"])
def test_check_fails_on_a_stale_module(tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    target = tmp_path / "_record_methods.py"
    current = GENERATED.read_text()
    if damage == "drop a layout":  # a record added (or its fields changed) since the module was generated
        first = min(_record_methods.METHODS)
        target.write_text(current.replace(repr(first.splitlines(keepends=True)[0]), repr("def nothing():\n"), 1))
    elif damage == "extra layout":  # a record removed since
        assert current.endswith("\n}\n")
        target.write_text(current.removesuffix("}\n") + "    'def __init__(self):\\n    pass\\n': None,\n}\n")
    elif damage == "edited":
        target.write_text(current.replace("return NotImplemented", "return False", 1))
    elif damage == "broken":  # a bad merge
        target.write_text(current + "<<<<<<< HEAD\n")
    assert _record.main(["--check"], target=str(target)) == 1
    err = capsys.readouterr().err
    assert f"{target} is stale (" in err and "run `python -m nvmlcheck._record --write` and commit it" in err
    expected = {
        "drop a layout": "it lacks the methods of nvmlcheck.",
        "extra layout": "it holds 1 methods text(s) that no record of the package uses",
        "edited": "its text differs",
        "missing": "it is missing",
        "broken": "it does not run: SyntaxError",
    }[damage]
    assert expected in err


def test_the_ci_command_runs_as_a_module() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "nvmlcheck._record", "--check"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    assert "is up to date" in out.stdout and not out.stderr


def test_record_and_its_methods_import_no_typing() -> None:
    def loaded_by(code: str) -> set[str]:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        code = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        return set(out.stdout.split())

    # A record made (the first one imports _record_methods), over what `import nvmlcheck` loads anyway.
    added = loaded_by(
        "import nvmlcheck._record as r\n@r.record\nclass Point:\n    x: int = 0\n"
        "assert Point() == Point(0) and r._TABLE is not None"
    ) - loaded_by("import nvmlcheck")
    assert {"nvmlcheck._record", "nvmlcheck._record_methods"} <= added
    assert "nvmlcheck._record_methods" not in loaded_by("import nvmlcheck._record")  # only when a record is made
    heavy = {"typing", "dataclasses", "inspect", "ast", "dis", "re", "hashlib", "pathlib", "argparse", "pkgutil"}
    assert not added & heavy, sorted(added & heavy)
