"""A selector never chooses an ancestor of the kill, even where its own reading of the ancestry was cut short.

``selectors.by_match``/``by_container`` read the lineage without raising: a link that cannot be read (out of
descriptors, EACCES) ends the chain early, and an ancestor beyond it (the ``bash -c`` or ``sudo`` that runs the
kill, whose command line holds the pattern) used to be chosen and pinned, to be signalled next. ``targets.prepare``
now checks every chosen process against the lineage it reads strictly. Nothing is signalled here: only pinned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Run by a shell whose command line holds the token (its parent): the ancestry the selector reads is cut short (as a
# failed read would leave it), then prepare_kill(match=TOKEN) pins what it chose; prints targets and left alone.
CHECK = r"""
import json, os, sys
from nvmlcheck._proc import selectors
selectors._me = lambda: (os.getpid(), ())  # the selector's lineage, cut short
import nvmlcheck as nc
with nc.prepare_kill(match=sys.argv[1]) as plan:
    print(json.dumps({"parent": os.getppid(), "targets": [t.pid for t in plan.targets],
                      "left_alone": [list(e) for e in plan.left_alone]}))
"""


def test_an_ancestor_the_selector_missed_is_left_alone() -> None:
    token = f"nvmlcheck-lineage-{os.getpid()}"
    # "; exit" keeps the shell from exec-ing python: it stays the parent, its command line holding the token.
    script = f'{sys.executable} -c "$0" {token}; exit $?'
    out = subprocess.run(["sh", "-c", script, CHECK], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["parent"] not in doc["targets"]
    assert any(pid == doc["parent"] and "parent" in why for pid, why in doc["left_alone"]), doc


def test_another_nvmlcheck_matched_only_by_its_own_pattern_is_left_alone(tmp_path: Path) -> None:
    """Two operators' ``kill --match TOKEN`` chose each other: an nvmlcheck's command line holds the pattern it
    selects with. One matched only there is left alone, saying why; one matched by its own words (a hung
    ``nvmlcheck wait TOKEN``) is still chosen. Nothing is signalled here."""
    from nvmlcheck._proc import selectors

    token = f"nvmlcheck-selector-{os.getpid()}"
    script = tmp_path / "nvmlcheck"  # an nvmlcheck command line as the console script gives it
    script.write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    other = subprocess.Popen([sys.executable, str(script), "kill", "--match", token, "--yes"])
    also = subprocess.Popen([sys.executable, str(script), "kill", f"--match={token}"])
    hung = subprocess.Popen([sys.executable, str(script), "wait", token])
    try:
        # Each has exec'd (a child between fork and exec shows its parent's command line): wait for its own.
        for p in (other, also, hung):
            for _ in range(3000):
                if token in (selectors.command_line(p.pid) or ""):
                    break
                time.sleep(0.01)
        chosen, skipped = selectors.by_match(token)
        assert [pid for pid, _, _ in chosen] == [hung.pid]
        why = dict(skipped)
        assert "another nvmlcheck" in why[other.pid] and "another nvmlcheck" in why[also.pid], skipped
    finally:
        for p in (other, also, hung):
            p.kill()
            p.wait()
