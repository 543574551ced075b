"""Every `nvmlcheck/kill` document has every field of its form, whatever the path that printed it: named PIDs, a
selector, `--all-*` with targets or with nothing to signal, `--missing-ok` with nothing left, `--only-targets`, each
clean and at the timeout. The fields are one list per form (below), held to docs/cli.md's examples, and docs/killing.md
names the version the output carries. The processes hold a stand-in device file in dev/ next to the scenario."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nvmlcheck import cli
from nvmlcheck.jsonout._values import SCHEMA_VERSIONS
from nvmlcheck.testing import Scenario

pytestmark = pytest.mark.stub
GIB = 1 << 30
DOCS = Path(__file__).resolve().parents[2] / "docs"

#: The fields of every nvmlcheck/kill document, by its ``clean``: the documented ones (docs/cli.md), no more, no less.
KILL_FIELDS: dict[bool, frozenset[str]] = {
    True: frozenset({"schema", "version", "clean", "signal", "tree", "pids", "clean_ns", "confirmed_ns",
                     "resolution_ns", "missing", "judged", "not_ours", "left_alone", "vanished", "holders",
                     "snapshot", "listening_gaps"}),
    # The "not clean" form of nvmlcheck/wait, plus the kill's fields.
    False: frozenset({"schema", "version", "clean", "elapsed_ns", "timeout_s", "polls", "culprits", "holders",
                      "snapshot", "signal", "tree", "pids", "tree_hint", "left_alone", "vanished", "missing",
                      "judged"}),
}

# argv[1]: a device file to hold ("-": none); argv[2]: "ignore" survives SIGTERM (a handler that does nothing: SIG_IGN
# would get SIGKILL at once); argv[3]: a word for --match.
HOLD = ("import signal, sys, time\n"
        "f = open(sys.argv[1]) if sys.argv[1] != '-' else None\n"
        "if sys.argv[2] == 'ignore': signal.signal(signal.SIGTERM, lambda n, f: None)\n"
        "print('ready', flush=True); time.sleep(60)")


def documented_example(marker: str) -> dict[str, Any]:
    """The JSON example after ``output-of="<marker>"`` in docs/cli.md."""
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    at = text.index(f'output-of="{marker}"')
    block = re.search(r"```json\n(.*?)\n```", text[at:], re.S)
    assert block is not None
    loaded: dict[str, Any] = json.loads(block.group(1))
    return loaded


def test_the_field_lists_are_the_documented_ones() -> None:
    clean = documented_example("nvmlcheck --json kill $SERVER_PID")
    assert set(clean) == KILL_FIELDS[True]
    wait_timeout = documented_example("nvmlcheck --json wait --timeout 0.2")
    kill_only = {"signal", "tree", "pids", "tree_hint", "left_alone", "vanished", "missing", "judged"}
    assert set(wait_timeout) | kill_only == KILL_FIELDS[False]
    kill_section = (DOCS / "cli.md").read_text(encoding="utf-8").split("### nvmlcheck/kill\n", 1)[1]
    row = next(line for line in kill_section.splitlines() if line.startswith("| `clean` |"))
    assert all(f"`{name}`" in row for name in kill_only), row  # the timeout form's row names each kill field


def test_killing_md_names_the_version_the_output_carries() -> None:
    headings = re.findall(r"^## JSON \(`nvmlcheck/kill`, version (\d+)\)$",
                          (DOCS / "killing.md").read_text(encoding="utf-8"), re.M)
    assert headings == [str(SCHEMA_VERSIONS["kill"])]
    assert documented_example("nvmlcheck --json kill $SERVER_PID")["version"] == SCHEMA_VERSIONS["kill"]


# --- every path -------------------------------------------------------------------------------------------------------


@pytest.fixture
def start(python_child: Callable[..., subprocess.Popen[bytes]]) -> Callable[..., subprocess.Popen[bytes]]:
    def run(device_file: str = "-", mode: str = "", word: str = "") -> subprocess.Popen[bytes]:
        return python_child(HOLD, device_file, mode, word)

    return run


def scenario(tmp_path: Path, *holders: int, foreign: bool = False) -> str:
    sc = Scenario.h200()
    for pid in holders:
        sc.add_process(0, pid, used_bytes=4 * GIB, bound=True, list_ms=20, release_ms=40)
    if foreign:  # a PID that names no process here: the GPU stays busy whatever is killed
        sc.add_process(0, 4_100_001, used_bytes=GIB)
    return str(sc.write(tmp_path / "scenario.txt"))


def kill_document(capsys: pytest.CaptureFixture[str], sc: str, *argv: str, exit_code: int) -> dict[str, Any]:
    code = cli.main(["--simulate", sc, "--json", "kill", *argv])
    out, err = capsys.readouterr()
    assert code == exit_code, err
    doc: dict[str, Any] = json.loads(out)
    assert doc["schema"] == "nvmlcheck/kill" and doc["version"] == SCHEMA_VERSIONS["kill"]
    assert doc.pop("simulated") is True  # the simulation's mark, right after the header
    assert set(doc) == KILL_FIELDS[doc["clean"]], sorted(set(doc) ^ KILL_FIELDS[doc["clean"]])
    assert doc["clean"] is (exit_code == 0)
    return doc


PATHS = ["named", "match", "all-holders", "only-targets", "missing-ok gone", "missing-ok no match",
         "all-holders nothing", "all-on-gpu nothing"]


@pytest.mark.parametrize("path", PATHS)
def test_a_clean_kill_document_has_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, path: str,
) -> None:
    nothing = path.startswith("missing-ok") or path.endswith("nothing")  # nothing to signal: an idle GPU
    word = f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"
    p = start("-" if nothing else device_file, "", word)
    sc = scenario(tmp_path) if nothing else scenario(tmp_path, p.pid)
    gone = start()
    gone.kill()
    gone.wait()
    argv = {
        "named": [str(p.pid)],
        "match": ["--match", word, "--yes"],
        "all-holders": ["--all-holders", "--yes"],
        "only-targets": [str(p.pid), "--only-targets"],
        "missing-ok gone": [str(gone.pid), "--missing-ok"],
        "missing-ok no match": ["--match", word + "-none", "--missing-ok"],
        "all-holders nothing": ["--all-holders", "--yes"],
        "all-on-gpu nothing": ["--all-on-gpu", "--yes"],
    }[path]
    doc = kill_document(capsys, sc, *argv, "--timeout", "20", exit_code=0)
    if nothing:
        assert doc["pids"] == [] and doc["judged"] == "gpus" and doc["not_ours"] == []
        assert doc["missing"] == ([gone.pid] if path == "missing-ok gone" else [])
    else:
        assert [t["pid"] for t in doc["pids"]] == [p.pid]
        assert doc["judged"] == ("targets" if path == "only-targets" else "gpus")


@pytest.mark.parametrize("path", ["named", "match", "all-holders", "all-holders nothing", "missing-ok no match"])
def test_a_kill_document_at_the_timeout_has_every_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], start: Callable[..., subprocess.Popen[bytes]],
    device_file: str, path: str,
) -> None:
    # Nothing to signal: no holder here (no device file held), and the GPU busy with a PID of no process here.
    nothing = path in ("all-holders nothing", "missing-ok no match")
    word = f"nvmlcheck-test-{uuid.uuid4().hex[:12]}"
    stubborn = start("-" if nothing else device_file, "ignore", word)  # survives SIGTERM; --grace never: it stays
    argv = {
        "named": [str(stubborn.pid)],
        "match": ["--match", word, "--yes"],
        "all-holders": ["--all-holders", "--yes"],
        "all-holders nothing": ["--all-holders", "--yes", "--devices", "0"],
        "missing-ok no match": ["--match", word + "-none", "--missing-ok"],
    }[path]
    sc = scenario(tmp_path, foreign=True) if nothing else scenario(tmp_path, stubborn.pid)
    # --timeout bounds the holders reading (a scan of every process's /proc entry) as well as the wait: 0.3 s raced
    # the scan on a loaded host (cut: exit 3, HoldersIncomplete); 2 s leaves it time, and the wait still times out.
    timeout = "2" if path.startswith("all-holders") else "0.3"
    doc = kill_document(capsys, sc, *argv, "--grace", "never", "--timeout", timeout, exit_code=1)
    assert doc["tree"] is False and doc["missing"] == [] and doc["judged"] == "gpus"
    if nothing:
        assert doc["pids"] == [] and doc["tree_hint"] == []
    else:
        assert [t["pid"] for t in doc["pids"]] == [stubborn.pid]
