"""The layout test: every struct nvmlcheck declares in cdefs.h must match the real nvml.h byte for byte.

A C program generated here (from the ffi types, so a field added to cdefs.h is covered without touching this test)
is compiled against the real header from nvidia-nvml-dev and prints sizeof/_Alignof of each struct and offsetof/sizeof
of each field; cffi's view of cdefs.h must agree on every number.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nvmlcheck._nvml._ffi import ffi
from nvmlcheck.testing import find_nvml_header

pytestmark = pytest.mark.stub

# ffi typedef names of the structs in cdefs.h, and the nvml.h types they stand for. cdefs.h uses the v2 struct for
# the _v3 process calls, whose parameter type in nvml.h is nvmlProcessInfo_t: that pairing is checked too.
ALIASES = {"nvmlProcessInfo_v2_t": ("nvmlProcessInfo_v2_t", "nvmlProcessInfo_t")}


def struct_typedefs() -> list[str]:
    typedefs, _structs, _unions = ffi.list_types()
    return sorted(name for name in typedefs if ffi.typeof(name).kind == "struct")


def expected_lines() -> list[tuple[str, str, str]]:
    """(C type name, ffi type name, field or '') for every struct and field."""
    rows = []
    for name in struct_typedefs():
        for c_name in ALIASES.get(name, (name,)):
            rows.append((c_name, name, ""))
            rows.extend((c_name, name, field) for field, _ in ffi.typeof(name).fields)
    return rows


def c_program(rows: list[tuple[str, str, str]]) -> str:
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <nvml.h>", "int main(void) {"]
    for c_name, _, field in rows:
        if field:
            lines.append(
                f'    printf("{c_name}.{field} %zu %zu\\n", offsetof({c_name}, {field}), '
                f"sizeof((({c_name} *)0)->{field}));"
            )
        else:
            lines.append(f'    printf("{c_name} %zu %zu\\n", sizeof({c_name}), _Alignof({c_name}));')
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def test_struct_list_covers_cdefs() -> None:
    assert set(struct_typedefs()) >= {
        "nvmlMemory_t",
        "nvmlMemory_v2_t",
        "nvmlProcessInfo_v1_t",
        "nvmlProcessInfo_v2_t",
        "nvmlPciInfo_t",
        "nvmlEventData_t",
        "nvmlFieldValue_t",
    }


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_cdefs_structs_match_nvml_h(tmp_path: Path) -> None:
    rows = expected_lines()
    source = tmp_path / "layout.c"
    source.write_text(c_program(rows))
    binary = tmp_path / "layout"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc is not None
    build = subprocess.run(
        [cc, "-std=c11", "-DNVML_NO_UNVERSIONED_FUNC_DEFS", f"-I{find_nvml_header().parent}", str(source), "-o",
         str(binary)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(binary)], capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == len(rows)
    actual = {}
    for line in out:
        key, a, b = line.split()
        actual[key] = (int(a), int(b))
    expected = {}
    for c_name, ffi_name, field in rows:
        if field:
            ctype = dict(ffi.typeof(ffi_name).fields)[field].type
            expected[f"{c_name}.{field}"] = (ffi.offsetof(ffi_name, field), ffi.sizeof(ctype))
        else:
            expected[c_name] = (ffi.sizeof(ffi_name), ffi.alignof(ffi_name))
    assert actual == expected
