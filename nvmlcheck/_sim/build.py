"""Compiling the stub libnvidia-ml (``stubs/stub_nvml.c``) against the real ``nvml.h``, cached by content.

Building needs a C compiler and the ``nvidia-nvml-dev`` package; ``$NVMLCHECK_STUB_CACHE`` moves the cache,
``$NVMLCHECK_NVML_H`` names the header.
"""

from __future__ import annotations

import importlib.resources
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..errors import ArgumentError, ArgumentTypeError, NvmlCheckError
from .symbols import STUB_VARIANTS

__all__ = ["StubBuildError", "StubCacheError", "build_stub", "find_nvml_header", "stub_source_dir"]

_HEADER_CANDIDATES = ("nvidia/cu13/include/nvml.h", "nvidia/cu12/include/nvml.h")
_LIBRARY_NAME = "libnvidia-ml.so.1"


class StubBuildError(NvmlCheckError, RuntimeError):
    """The stub could not be built: no compiler, the compiler failed (its stderr is included), or the build cache
    cannot be written (:class:`StubCacheError`)."""


class StubCacheError(StubBuildError):
    """The stub's build cache cannot be written (read-only, not a directory): no compiler or package would help.
    Its ``__cause__`` is the ``OSError``, naming the directory."""


def find_nvml_header() -> Path:
    """The real ``nvml.h`` to compile the stub against.

    ``$NVMLCHECK_NVML_H`` wins when set; otherwise the first ``nvidia/cu13/include/nvml.h`` (then ``cu12``) under
    an entry of ``sys.path``, which is where the ``nvidia-nvml-dev`` wheel puts it.

    Raises:
        FileNotFoundError: no header found (the message says to install ``nvidia-nvml-dev``).
    """
    override = os.environ.get("NVMLCHECK_NVML_H")
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"NVMLCHECK_NVML_H={override} is not a file")
        return path
    for candidate in _HEADER_CANDIDATES:
        for entry in sys.path:
            path = Path(entry or ".") / candidate
            if path.is_file():
                return path
    raise FileNotFoundError(
        "nvml.h not found: install the package nvidia-nvml-dev (pip install nvidia-nvml-dev) or set NVMLCHECK_NVML_H;"
        f" searched {' and '.join(_HEADER_CANDIDATES)} under every sys.path entry"
    )


def stub_source_dir() -> Path:
    """The directory holding ``stub_nvml.c`` and its ``README.md``.

    From a wheel that is ``nvmlcheck/_stubs`` (the build force-includes ``stubs/`` there); from a source checkout,
    the repository's ``stubs/`` next to the package.
    """
    packaged = importlib.resources.files("nvmlcheck") / "_stubs"
    if packaged.is_dir() and (packaged / "stub_nvml.c").is_file():
        return Path(str(packaged))
    checkout = Path(__file__).resolve().parents[2] / "stubs"
    if (checkout / "stub_nvml.c").is_file():
        return checkout
    raise FileNotFoundError(f"stub sources not found (looked in {packaged} and {checkout})")


def _find_compiler(cc: str | None) -> tuple[str, tuple[str, ...]]:
    """The compiler's path and the arguments that come with it. ``cc`` (or ``$CC``) names a program, or, as make
    reads ``$CC``, a command line: ``ccache gcc``, ``gcc -m64``."""
    import shlex
    import shutil

    candidates = [cc] if cc else [os.environ["CC"]] if os.environ.get("CC") else ["cc", "gcc"]
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found, ()
        try:
            words = shlex.split(candidate)
        except ValueError:  # unbalanced quotes: no command line either
            continue
        found = shutil.which(words[0]) if len(words) > 1 else None
        if found:
            return found, tuple(words[1:])
    raise StubBuildError(
        f"no C compiler found (tried {', '.join(candidates)}): install gcc or clang, or pass cc= / set $CC"
    )


def _validate_variant(variant: Iterable[str]) -> tuple[str, ...]:
    if isinstance(variant, str):
        raise ArgumentTypeError("variant must be an iterable of macro names, not a string")
    try:
        names = list(variant)
    except TypeError:  # None, a number: no iterable at all
        raise ArgumentTypeError(f"variant must be an iterable of macro names (() for none), not {variant!r}") from None
    if not all(isinstance(n, str) for n in names):
        raise ArgumentTypeError(f"variant must hold macro names (str), got {names!r}")
    macros = tuple(sorted(set(names)))
    unknown = [m for m in macros if m not in STUB_VARIANTS]
    if unknown:
        raise ArgumentError(f"unknown stub variant macro(s) {unknown}; known: {sorted(STUB_VARIANTS)}")
    return macros


# No -soname on purpose: without one, a later dlopen("libnvidia-ml.so.1") in the same process (the real driver, for
# a GPU test) does not match the loaded stub, whose only name is its full path.
_CFLAGS = ("-shared", "-fPIC", "-O2", "-std=c11", "-Wall", "-Wextra", "-DNVML_NO_UNVERSIONED_FUNC_DEFS")
_LDFLAGS = ("-lpthread",)


def _compile_command(
    compiler: Sequence[str], source: Path, header: Path, macros: Sequence[str], output: Path
) -> list[str]:
    """``compiler``: its path and the arguments that came with it (``$CC``)."""
    defines = [f"-D{m}" for m in macros]
    return [*compiler, *_CFLAGS, *defines, f"-I{header.parent}", str(source), "-o", str(output), *_LDFLAGS]


def build_stub(variant: Iterable[str] = (), *, cache_dir: Path | None = None, cc: str | None = None) -> Path:
    """Compile the stub (once; cached) and return the path of its ``libnvidia-ml.so.1``.

    Args:
        variant: ``STUB_NO_*`` macros (see :data:`STUB_VARIANTS`) for a build without some newer symbols.
        cache_dir: where builds live; default ``$NVMLCHECK_STUB_CACHE`` or ``~/.cache/nvmlcheck/stub``.
        cc: the C compiler, a program or a command line (``ccache gcc``); default ``$CC``, else ``cc`` or ``gcc``
            from ``PATH``.

    Each distinct (source, header, macros, compiler) gets its own directory, so variants can be loaded side by
    side. The library is written under a temporary name and renamed, so parallel test processes never see a
    half-written file.

    Raises:
        ValueError: an unknown variant macro.
        FileNotFoundError: no ``nvml.h`` (install ``nvidia-nvml-dev``) or no stub sources.
        StubBuildError: no compiler, compilation failed, or the cache directory cannot be written.
    """
    import hashlib
    import subprocess
    import tempfile

    macros = _validate_variant(variant)
    compiler, compiler_args = _find_compiler(cc)
    source = stub_source_dir() / "stub_nvml.c"
    header = find_nvml_header()
    if cache_dir is None:
        env_cache = os.environ.get("NVMLCHECK_STUB_CACHE")
        cache_dir = Path(env_cache) if env_cache else Path.home() / ".cache" / "nvmlcheck" / "stub"
    compiler_stat = os.stat(compiler)
    digest = hashlib.sha256()
    for part in (
        source.read_bytes(),
        header.read_bytes(),
        "\0".join(macros).encode(),
        "\0".join([compiler, str(compiler_stat.st_size), str(compiler_stat.st_mtime_ns), *compiler_args]).encode(),
        "\0".join(_CFLAGS + _LDFLAGS).encode(),
    ):
        digest.update(hashlib.sha256(part).digest())
    tag = "-".join(m.removeprefix("STUB_NO_").lower() for m in macros) or "full"
    target_dir = Path(cache_dir) / f"{tag}-{digest.hexdigest()[:20]}"
    target = target_dir / _LIBRARY_NAME
    if target.is_file():
        return target
    try:
        target_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{_LIBRARY_NAME}.", suffix=".tmp", dir=target_dir)
    except OSError as exc:  # a read-only or misplaced cache: the stub cannot be built, as without a compiler
        raise StubCacheError(f"cannot write the stub's build cache {target_dir}: {exc.strerror or exc}; set "
                             "$NVMLCHECK_STUB_CACHE (or pass cache_dir=) to a writable directory") from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        command = _compile_command([compiler, *compiler_args], source, header, macros, tmp)
        try:
            proc = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as exc:
            raise StubBuildError(f"could not run the C compiler {compiler}: {exc}") from exc
        if proc.returncode != 0:
            raise StubBuildError(
                f"compiling the stub failed (exit {proc.returncode}): {' '.join(command)}\n{proc.stderr.strip()}"
            )
        try:
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
        except OSError as exc:
            raise StubCacheError(f"cannot write the stub's build cache {target_dir}: {exc.strerror or exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


