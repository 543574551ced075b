"""``@record``: the part of ``@dataclass(frozen=True, slots=True)`` the model uses, without importing ``dataclasses``.

A one-shot check creates a handful of value classes at import; ``dataclasses`` (with the ``inspect``, ``ast`` and
``dis`` it imports) and its class processing cost it more than everything else of ours (docs/performance.md,
"One-shot checks"). A record is a frozen, slotted class with ``__init__`` (positional or keyword, or keyword-only;
it calls ``__post_init__``), ``__repr__``, ``__eq__``/``__hash__`` over its compared fields, ``__match_args__`` and
pickling. It stays a dataclass to every caller: ``dataclasses.fields``, ``replace``, ``asdict`` and
``is_dataclass`` work, and assigning raises ``dataclasses.FrozenInstanceError``; the ``dataclasses`` module is imported
(and the class's ``__dataclass_fields__`` made) only when one of those asks.
tests/unit/test_record.py holds each record to what ``@dataclass`` makes of the same body.

The methods are the source text :func:`_methods` writes for the record's field layout. Compiling that text costs
0.2-0.4 ms a class at import, so the texts of every record of the package are compiled ahead of time:
``nvmlcheck/_record_methods.py`` (generated; ``METHODS``) maps each text to a function that defines the methods, and
a record whose text is there costs no ``compile``. Any other record (one defined outside the package, or one whose
layout changed since the module was generated) is made by ``exec`` of the text, as before. The generator:

    python -m nvmlcheck._record --write   # rewrite _record_methods.py from the package's records
    python -m nvmlcheck._record --check   # exit 1 when it is stale (CI runs this)
"""

from __future__ import annotations

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, NamedTuple, TypeVar, overload

    from typing_extensions import dataclass_transform

    _C = TypeVar("_C", bound=type)
    _T = TypeVar("_T")
else:
    Any = object

    def dataclass_transform(**_kwargs):  # the typing decorators only inform type checkers
        return lambda f: f

    def overload(f):
        return f


__all__ = ["NamedTuple", "field", "light_tuple", "record", "replace"]


def light_tuple(name: str, fields: str, defaults: tuple[object, ...] = (), module: str | None = None) -> Any:
    """A named tuple class (fields, defaults, keywords, ``_fields``, ``_replace``, a repr, pickling) made without
    ``collections``, whose import (with keyword, operator, reprlib) costs a kill milliseconds before its first
    signal: for the private tuples of the code that runs before it (``_proc``). Subclass it to add methods."""
    from _collections import _tuplegetter  # type: ignore[import-not-found]  # namedtuple's own field accessor (C)

    names = tuple(fields.split())
    given = dict(zip(names[len(names) - len(defaults):], defaults, strict=True))

    def __new__(cls: type, *args: object, **kwargs: object) -> Any:
        if len(args) > len(names) or set(kwargs) - set(names[len(args):]):
            raise TypeError(f"{name}() takes the fields {names}: not {args}, {kwargs}")
        values = list(args)
        for n in names[len(args):]:
            if n not in kwargs and n not in given:
                raise TypeError(f"{name}() missing argument {n!r}")
            values.append(kwargs.get(n, given.get(n)))
        return tuple.__new__(cls, values)

    def __repr__(self: tuple[object, ...]) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, self, strict=True)) + ")"

    def __getnewargs__(self: tuple[object, ...]) -> tuple[object, ...]:  # pickling: the values, as __new__ takes
        return tuple(self)

    def _replace(self: tuple[object, ...], **changes: object) -> Any:
        return type(self)(**{**dict(zip(names, self, strict=True)), **changes})

    body: dict[str, object] = {
        "__slots__": (), "__new__": __new__, "__repr__": __repr__, "__getnewargs__": __getnewargs__,
        "_replace": _replace, "_fields": names, "__match_args__": names, "__module__": module or __name__,
    }  # fmt: skip
    body.update({n: _tuplegetter(i, f"Alias for field number {i}") for i, n in enumerate(names)})
    return type(name, (tuple,), body)


class _NamedTupleMeta(type):
    """Makes ``class X(NamedTuple): ...`` a ``collections.namedtuple`` with the class body's annotations as fields,
    its defaults, docstring, methods and properties: what ``typing.NamedTuple`` makes, without importing typing."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Any:
        import collections
        import itertools

        namedtuple: Any = collections.namedtuple  # a call mypy need not check as a declaration
        if not bases:  # the NamedTuple base below
            return super().__new__(mcls, name, bases, namespace)
        fields = list(namespace.get("__annotations__", {}))
        defaults = [namespace[f] for f in fields if f in namespace]
        for before, after in itertools.pairwise(fields):
            if before in namespace and after not in namespace:
                raise TypeError(f"non-default named tuple field {after} cannot follow default field {before}")
        made = namedtuple(name, fields, defaults=defaults, module=namespace["__module__"])
        for key, value in namespace.items():
            if key not in fields and key not in ("__module__", "__qualname__", "__annotations__", "__dict__"):
                setattr(made, key, value)
        made.__annotations__ = dict(namespace.get("__annotations__", {}))
        made.__qualname__ = namespace.get("__qualname__", name)  # a nested class pickles by its qualified name
        return made


if not TYPE_CHECKING:  # type checkers see typing's NamedTuple (imported above)
    NamedTuple = type.__new__(_NamedTupleMeta, "NamedTuple", (), {"__doc__": "A typed named tuple base."})


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()


class _Field:
    """A field's options beyond a plain default (what ``dataclasses.field`` would say)."""

    __slots__ = ("compare", "default", "default_factory", "repr")

    def __init__(
        self, default: object, default_factory: Callable[[], object] | None, compare: bool, repr: bool
    ) -> None:
        self.default = default
        self.default_factory = default_factory
        self.compare = compare
        self.repr = repr


def field(
    *,
    default: Any = _MISSING,
    default_factory: Callable[[], Any] | None = None,
    compare: bool = True,
    repr: bool = True,
) -> Any:
    """Like ``dataclasses.field`` for a record: a default or a default factory, whether ``==``/``hash`` look at the
    field, and whether ``repr`` shows it."""
    return _Field(default, default_factory, compare, repr)


class _Spec:
    """A record's fields: names in order, defaults, factories, the compared ones, and whether ``__init__`` takes
    keywords only."""

    __slots__ = ("compare", "defaults", "factories", "kw_only", "names", "post_init", "shown")

    def __init__(self, cls: type, kw_only: bool) -> None:
        self.names: list[str] = []
        self.defaults: dict[str, object] = {}
        self.factories: dict[str, Callable[[], object]] = {}
        self.compare: list[str] = []
        self.shown: list[str] = []
        self.kw_only = kw_only
        self.post_init = hasattr(cls, "__post_init__")
        for name in _annotations(cls):
            value = cls.__dict__.get(name, _MISSING)
            compared = shown = True
            if isinstance(value, _Field):
                compared, shown = value.compare, value.repr
                if value.default_factory is not None:
                    self.factories[name] = value.default_factory
                elif value.default is not _MISSING:
                    self.defaults[name] = value.default
            elif value is not _MISSING:
                self.defaults[name] = value
            if not kw_only and self.names and name not in self.defaults and name not in self.factories:
                previous = self.names[-1]
                if previous in self.defaults or previous in self.factories:
                    raise TypeError(f"non-default field {name!r} follows a field with a default in {cls.__name__}")
            self.names.append(name)
            if compared:
                self.compare.append(name)
            if shown:
                self.shown.append(name)


def _annotations(cls: type) -> dict[str, Any]:
    # The class's own annotations, in order (not inspect.get_annotations: importing inspect is what this module
    # avoids); modules using records have ``from __future__ import annotations``, so these are strings.
    own = cls.__dict__.get("__annotations__")  # noqa: RUF063
    return dict(own if own is not None else getattr(cls, "__annotations__", {}))


#: The methods a record gets, in the order a factory of ``_record_methods`` returns them.
_METHOD_NAMES = ("__init__", "__repr__", "__eq__", "__hash__", "__getstate__", "__setstate__")
#: ``_record_methods.METHODS`` (source text -> factory), imported when the first record is made.
_TABLE: dict[str, Callable[..., tuple[Any, ...]]] | None = None
#: Every record class made in this process, in order: the generator reads the package's from here.
_RECORDS: list[type] = []


def _env(spec: _Spec) -> dict[str, Any]:
    """The names the methods' text uses beyond builtins: ``exec``'s globals, or a factory's keyword arguments."""
    env: dict[str, Any] = {"_MISSING": _MISSING, "_set": object.__setattr__}
    env.update({f"_d_{n}": v for n, v in spec.defaults.items()})
    env.update({f"_f_{n}": f for n, f in spec.factories.items()})
    return env


def _methods(spec: _Spec) -> str:
    params = []
    for name in spec.names:
        if name in spec.factories:
            params.append(f"{name}=_MISSING")
        elif name in spec.defaults:
            params.append(f"{name}=_d_{name}")
        else:
            params.append(name)
    star = "*, " if spec.kw_only and params else ""
    body = []
    for name in spec.names:
        value = f"_f_{name}() if {name} is _MISSING else {name}" if name in spec.factories else name
        body.append(f"    _set(self, {name!r}, {value})")
    if spec.post_init:
        body.append("    self.__post_init__()")
    compared = "".join(f"self.{n}, " for n in spec.compare)
    other = "".join(f"other.{n}, " for n in spec.compare)
    shown = ", ".join(f"{n}={{self.{n}!r}}" for n in spec.shown)
    values = "".join(f"self.{n}, " for n in spec.names)
    return "\n".join(
        [
            f"def __init__(self, {star}{', '.join(params)}):",
            *(body or ["    pass"]),
            "def __repr__(self):",
            f"    return f'{{type(self).__qualname__}}({shown})'",
            "def __eq__(self, other):",
            "    if other.__class__ is self.__class__:",
            f"        return ({compared}) == ({other})",
            "    return NotImplemented",
            "def __hash__(self):",
            f"    return hash(({compared}))",
            "def __getstate__(self):",
            f"    return ({values})",
            "def __setstate__(self, state):",
            f"    for name, value in zip({tuple(spec.names)!r}, state):",
            "        _set(self, name, value)",
            "",
        ]
    )


def _frozen(self: object, name: str, value: object = None) -> None:
    import dataclasses

    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


class _DataclassInfo:
    """``__dataclass_fields__`` / ``__dataclass_params__`` of a record, made (with ``dataclasses``) on first access:
    from a shadow dataclass with the same fields, so they are exactly what ``@dataclass`` would have made."""

    __slots__ = ("attr",)

    def __init__(self, attr: str) -> None:
        self.attr = attr

    def __get__(self, obj: object, cls: type) -> Any:
        import dataclasses

        spec: _Spec = cls.__record_spec__  # type: ignore[attr-defined]
        namespace: dict[str, Any] = {"__annotations__": dict(_annotations(cls))}
        for name in spec.names:
            compared, shown = name in spec.compare, name in spec.shown
            if name in spec.factories:
                namespace[name] = dataclasses.field(default_factory=spec.factories[name], compare=compared, repr=shown)
            elif name in spec.defaults:
                namespace[name] = dataclasses.field(default=spec.defaults[name], compare=compared, repr=shown)
            else:
                namespace[name] = dataclasses.field(compare=compared, repr=shown)
        shadow: Any = dataclasses.dataclass(frozen=True, kw_only=spec.kw_only)(type(cls.__name__, (), namespace))
        cls.__dataclass_fields__ = shadow.__dataclass_fields__  # type: ignore[attr-defined]
        cls.__dataclass_params__ = shadow.__dataclass_params__  # type: ignore[attr-defined]
        return getattr(cls, self.attr)


# F811: ruff cannot tell that the run-time overload above stands for typing's.
@overload
def record(cls: _C, /) -> _C: ...
@overload
def record(*, kw_only: bool = False) -> Callable[[_C], _C]: ...  # noqa: F811
@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: _C | None = None, /, *, kw_only: bool = False) -> Any:  # noqa: F811
    """Make ``cls`` a frozen slotted record (see the module docstring); ``@record`` or ``@record(kw_only=True)``."""

    def wrap(cls: type) -> type:
        global _TABLE
        spec = _Spec(cls, kw_only)
        skip = {*spec.names, "__dict__", "__weakref__"}
        namespace = {k: v for k, v in cls.__dict__.items() if k not in skip}
        env = _env(spec)
        text = _methods(spec)
        if _TABLE is None:  # the first record: the ahead-of-time methods (imported here, not with this module)
            from ._record_methods import METHODS

            _TABLE = METHODS
        factory = _TABLE.get(text)
        if factory is not None:
            functions: dict[str, Any] = dict(zip(_METHOD_NAMES, factory(**env), strict=True))
        else:  # a layout _record_methods.py does not hold: compile it now
            exec(text, env)
            functions = env
        for name in _METHOD_NAMES:
            function = functions[name]
            function.__qualname__ = f"{cls.__qualname__}.{name}"
            function.__module__ = cls.__module__
            namespace[name] = function
        namespace.update(
            __slots__=tuple(spec.names),
            __match_args__=tuple(spec.names),
            __setattr__=_frozen,
            __delattr__=_frozen,
            __record_spec__=spec,
            __record_fields__=tuple(spec.names),
            __dataclass_fields__=_DataclassInfo("__dataclass_fields__"),
            __dataclass_params__=_DataclassInfo("__dataclass_params__"),
        )
        made: type = type(cls)(cls.__name__, cls.__bases__, namespace)
        _RECORDS.append(made)
        return made

    return wrap if cls is None else wrap(cls)


def replace(obj: _T, /, **changes: Any) -> _T:
    """``dataclasses.replace`` for a record without importing ``dataclasses`` (any other dataclass: that function)."""
    names = getattr(type(obj), "__record_fields__", None)
    if names is None:
        import dataclasses

        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    unknown = set(changes) - set(names)
    if unknown:
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"{type(obj).__name__} has no field(s) {sorted(unknown)}")
    values = {n: changes[n] if n in changes else getattr(obj, n) for n in names}
    made: _T = type(obj)(**values)
    return made


# --- the generator of _record_methods.py (python -m nvmlcheck._record --write / --check); nothing below runs at
# import, and what it imports it imports when called.

_GENERATED = "# GENERATED by `python -m nvmlcheck._record --write` from the package's @record classes; do not edit.\n"


def _import_package() -> list[str]:
    """Import every module of nvmlcheck, so that every record class of the package is made (and in ``_RECORDS``);
    return what kept a module from importing. A module that cannot import because an optional third-party package
    is missing is skipped when it uses no records; one that uses them is a problem (its records would be left out)."""
    import importlib
    from pathlib import Path

    package = Path(__file__).resolve().parent
    problems = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package.parent).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        if relative.name in ("__main__", "_record_methods") or "__pycache__" in parts:
            continue  # __main__ runs the command; _record_methods is what is being made
        name = ".".join(parts)
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = exc.name or "?"
            if missing.partition(".")[0] != "nvmlcheck" and "_record" not in path.read_text():
                continue  # an optional dependency (matplotlib, pytest) of a module without records
            problems.append(f"cannot import {name} ({exc}): its record classes would be left out")
        except Exception as exc:
            problems.append(f"cannot import {name} ({type(exc).__name__}: {exc})")
    return problems


def _package_records() -> dict[str, list[type]]:
    """Each methods text of the package's record classes (imported by ``_import_package``) -> the classes using it."""
    by_text: dict[str, list[type]] = {}
    for cls in _RECORDS:
        if cls.__module__ == "nvmlcheck" or cls.__module__.startswith("nvmlcheck."):
            spec: _Spec = cls.__record_spec__  # type: ignore[attr-defined]
            by_text.setdefault(_methods(spec), []).append(cls)
    return by_text


def _render(by_text: dict[str, list[type]]) -> str:
    """The text of ``_record_methods.py`` for these methods texts: one factory per text, in the order of the texts."""
    lines = [
        _GENERATED.rstrip("\n"),
        "# ruff: noqa",  # generated: the methods' text as _record._methods writes it (long lines, zip without strict)
        "# mypy: allow-untyped-defs",
        '"""The methods of every ``@record`` class of nvmlcheck, compiled ahead of time (see nvmlcheck/_record.py).',
        "",
        "``METHODS`` maps the source text ``_record._methods`` writes for a record's field layout to a factory: called",
        "with the names that text uses (``_MISSING``, ``_set``, a default ``_d_<field>``, a default factory",
        "``_f_<field>``), it returns ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``, ``__getstate__`` and",
        "``__setstate__``. Records with the same layout share a factory.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "TYPE_CHECKING = False",
        "if TYPE_CHECKING:",
        "    from collections.abc import Callable",
        "    from typing import Any",
    ]
    texts = sorted(by_text)
    for number, text in enumerate(texts):
        users = sorted(f"{c.__module__}.{c.__qualname__}" for c in by_text[text])
        params = ", ".join(_env(by_text[text][0].__record_spec__))  # type: ignore[attr-defined]
        lines += ["", ""]
        lines += [f"# {user}" for user in users]
        lines.append(f"def _methods_{number}(*, {params}):")
        lines += [f"    {line}" if line else "" for line in text.split("\n")]
        lines.append(f"    return {', '.join(_METHOD_NAMES)}")
    lines += ["", "", "METHODS: dict[str, Callable[..., tuple[Any, ...]]] = {"]
    for number, text in enumerate(texts):
        pieces = text.splitlines(keepends=True)
        lines.append("    (")
        lines += [f"        {piece!r}" for piece in pieces]
        lines.append(f"    ): _methods_{number},")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _stale(current: str, by_text: dict[str, list[type]]) -> str:
    """Why ``current`` (the committed module's text) is not what the package's records need; "" when it is."""
    if current == _render(by_text):
        return ""
    if not current:
        return "it is missing"
    held: dict[str, Any] = {}
    try:  # which records it lacks (without importing it: it may be broken)
        exec(compile(current, "_record_methods.py", "exec"), held)
    except Exception as exc:
        return f"it does not run: {type(exc).__name__}: {exc}"
    methods = held.get("METHODS", {})
    lacking = sorted(f"{c.__module__}.{c.__qualname__}" for t, cs in by_text.items() if t not in methods for c in cs)
    unused = len(set(methods) - set(by_text))
    if lacking:
        return f"it lacks the methods of {', '.join(lacking)}"
    if unused:
        return f"it holds {unused} methods text(s) that no record of the package uses"
    return "its text differs from what the generator writes"


def main(argv: list[str] | None = None, *, target: str | None = None) -> int:
    """``python -m nvmlcheck._record --write`` / ``--check`` (``target``: another path for the module, for tests)."""
    import argparse
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="python -m nvmlcheck._record", description="Generate nvmlcheck/_record_methods.py (see its docstring)."
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help="rewrite the module (what no option does too)")
    action.add_argument("--check", action="store_true", help="exit 1 when the committed module is stale")
    args = parser.parse_args(argv)
    path = Path(target) if target is not None else Path(__file__).resolve().with_name("_record_methods.py")
    global _TABLE
    if _TABLE is None:
        try:
            from ._record_methods import METHODS

            _TABLE = METHODS
        except Exception:  # a broken module (a bad merge): the records compile their text, and --write repairs it
            _TABLE = {}
    problems = _import_package()
    if problems:
        print("\n".join(["cannot collect the package's record classes:", *problems]), file=sys.stderr)
        return 1
    by_text = _package_records()
    if args.check:
        why = _stale(path.read_text() if path.exists() else "", by_text)
        if why:
            print(f"{path} is stale ({why}): run `python -m nvmlcheck._record --write` and commit it", file=sys.stderr)
            return 1
        print(f"{path.name} is up to date ({len(by_text)} methods texts)")
        return 0
    path.write_text(_render(by_text))
    print(f"wrote {path} ({len(by_text)} methods texts for {sum(map(len, by_text.values()))} record classes)")
    return 0


if __name__ == "__main__":  # run as nvmlcheck._record, whose _RECORDS the package's modules fill, not as __main__
    from nvmlcheck._record import main as _main

    raise SystemExit(_main())
