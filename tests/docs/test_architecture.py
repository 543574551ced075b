"""docs/architecture.md's layer table against the code: every module of the package is in it, once, and a module
imports only from its own layer or below, except for the known exceptions the page lists (kept in step here)."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "nvmlcheck"
PAGE = ROOT / "docs" / "architecture.md"
#: The package's face, in no layer: the lazy public table (names as strings), its source and ``python -m``.
FACE = frozenset({"nvmlcheck", "nvmlcheck._public", "nvmlcheck.__main__"})
#: "Known exceptions" of docs/architecture.md: (importer, imported), each a module or a package prefix.
EXCEPTIONS = frozenset({
    ("nvmlcheck._nvml", "nvmlcheck.model"),
    ("nvmlcheck._nvml", "nvmlcheck.errors"),
    ("nvmlcheck._proc", "nvmlcheck.errors"),
    ("nvmlcheck._proc.container", "nvmlcheck._record"),
    ("nvmlcheck._proc.container", "nvmlcheck._text"),
    ("nvmlcheck._proc.targets", "nvmlcheck._text"),
    ("nvmlcheck.errors", "nvmlcheck.verdict"),
    ("nvmlcheck.hosts", "nvmlcheck.jsonout"),
    ("nvmlcheck.study.stub_holder", "nvmlcheck._sim"),
    ("nvmlcheck.cli._common", "nvmlcheck._sim"),
    ("nvmlcheck.cli._common", "nvmlcheck.simulate"),
    ("nvmlcheck.cli._demo", "nvmlcheck._sim"),
    ("nvmlcheck.cli._demo", "nvmlcheck.simulate"),
    ("nvmlcheck.cli._simulate", "nvmlcheck._sim"),
    ("nvmlcheck.cli._simulate", "nvmlcheck.simulate"),
})
_PATH = re.compile(r"`([\w/]+(?:\.py|/))`")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def documented_layers() -> dict[str, int]:
    """Module (``nvmlcheck.x``) or package prefix (``nvmlcheck.study``) -> layer, from the page's layer table; the
    test kit is the layer after the CLI's."""
    table = PAGE.read_text(encoding="utf-8").split("## Layers", 1)[1].split("\n\n")[2]
    out: dict[str, int] = {}
    for row in table.splitlines()[2:]:
        cells = row.split("|")
        head, modules = cells[1].strip(), cells[2]
        layer = 7 if head == "test kit" else int(head.split(".")[0])
        for token in _PATH.findall(modules):
            name = "nvmlcheck." + token.removesuffix(".py").removesuffix("/").replace("/", ".")
            if token.startswith("stubs/"):
                continue  # the C stub and the fake nvidia-smi live outside the package
            assert out.get(name, layer) == layer, f"{token} is in two layers of docs/architecture.md"
            out[name] = layer
    return out


def layer_of(module: str, layers: dict[str, int]) -> int | None:
    """The layer of ``module``: its own row, its package's, or (a package's ``__init__``) the one of all its
    modules."""
    members = {layer for name, layer in layers.items() if name.startswith(module + ".")}
    while module:
        if module in layers:
            return layers[module]
        module = module.rpartition(".")[0]
    return members.pop() if len(members) == 1 else None


@functools.cache
def _imports(path: Path, module: str) -> frozenset[str]:
    """The package's modules ``path`` imports at run time (anywhere in it, not under ``if TYPE_CHECKING``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target == "nvmlcheck" or (target.startswith("nvmlcheck.") and not child.module):
                    found.update(f"{target}.{a.name}" for a in child.names)  # from . import wait
                elif target.startswith("nvmlcheck"):
                    found.add(target)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("nvmlcheck"))
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return frozenset(found)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_every_module_has_one_layer() -> None:
    layers = documented_layers()
    missing = [m for m in _modules() if m not in FACE and layer_of(m, layers) is None]
    assert not missing, f"modules docs/architecture.md's layer table does not name: {missing}"
    stale = [m for m in layers if m not in _modules() and not any(k.startswith(m + ".") for k in _modules())]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_imports_follow_the_layers() -> None:
    layers = documented_layers()
    modules = _modules()
    upward: list[str] = []
    for module, path in modules.items():
        mine = layer_of(module, layers)
        if mine is None:
            continue
        for imported in sorted(_imports(path, module)):
            # from .x import name: the module x
            target = imported.rpartition(".")[0] if imported not in modules and imported.rpartition(".")[0] in modules \
                else imported
            theirs = layer_of(target, layers)
            if theirs is None or theirs <= mine:
                continue
            if any(module.startswith(a) and target.startswith(b) for a, b in EXCEPTIONS):
                continue
            upward.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
    assert not upward, "imports against docs/architecture.md's layers, not among its known exceptions:\n" + "\n".join(
        upward)


def test_exceptions_still_happen() -> None:
    """Every known exception is still an import somewhere: one that went away is removed from the page too."""
    layers = documented_layers()
    modules = _modules()
    seen = {
        (a, b)
        for a, b in EXCEPTIONS
        for module, path in modules.items()
        if module.startswith(a) and any(t.startswith(b) for t in _imports(path, module))
    }
    assert seen == EXCEPTIONS, f"known exceptions no module makes any more: {sorted(EXCEPTIONS - seen)}"
    assert layers  # parsed
