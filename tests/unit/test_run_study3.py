"""benchmarks/gpu/run_study3.sh spends scarce GPU time: every study it runs must be a valid ``study reclaim`` (a typo
would cost its cell), every comparison must name studies it runs, and the must-have cells must fit its time limit.
(The whole script runs on the stub with GLOBAL="--simulate h200": see its header.)"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from nvmlcheck.cli._parser import build_parser
from nvmlcheck.cli._study import _config as _study_config

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "run_study3.sh"


def _studies() -> list[tuple[str, int, list[str]]]:
    text = SCRIPT.read_text()
    arrays = {m[1]: shlex.split(m[2]) for m in re.finditer(r"^(\w+)=\((.*)\)$", text, re.M)}
    out = []
    for raw in text.splitlines():
        line = re.sub(r"^NEED=\d+ ", "", raw)
        if line.startswith("study ") and not line.startswith("study()"):
            words = shlex.split(line)
            opts: list[str] = []
            for w in words[3:]:
                m = re.fullmatch(r"\$\{(\w+)\[@\]\}", w)
                opts.extend(arrays[m[1]] if m else [w])
            out.append((words[1], int(words[2]), opts))
    return out


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_every_study_is_a_valid_study_reclaim() -> None:
    studies = _studies()
    assert len(studies) >= 12 and len({name for name, _, _ in studies}) == len(studies)
    parser = build_parser()
    for name, cap, opts in studies:
        args = parser.parse_args(["study", "reclaim", "--devices", "0", "--repeats", "10", "--trace", "--budget",
                                  str(cap), "--out", f"/tmp/{name}.jsonl", *opts])
        config = _study_config(args)  # raises (exit 2 on the device) for a bad combination
        assert config.repeats == 10 and len(config.cells()) == 1, name  # one cell per file: compare pairs files


def test_comparisons_name_studies_the_script_runs_and_the_core_fits_its_limit() -> None:
    text = SCRIPT.read_text()
    names = {name for name, _, _ in _studies()}
    for line in text.splitlines():
        words = shlex.split(line) if line.strip().startswith("cmp ") else []
        if words:
            assert words[2] in names and words[3] in names, line
    limit = int(re.search(r"LIMIT=\$\{LIMIT:-(\d+)\}", text)[1])  # type: ignore[index]
    caps = dict((name, cap) for name, cap, _ in _studies())
    core = ["pinned-0-dev8", "pinned-8-dev8", "pinned-32-dev8", "ipc-1-exporter-first", "ipc-1-importers-first",
            "ipc-2-exporter-first", "ipc-2-importers-first", "managed-dev8", "mps-dev8", "nccl-dev8"]
    order = [name for name, _, _ in _studies()]
    assert order[:len(core)] == core  # the must-have cells run first
    # and fit the limit even when every one uses its whole cap (plus ~2 s each to start it and wait for clean GPUs)
    assert sum(caps[n] + 2 for n in core) <= limit
    assert limit + 60 <= 540  # the script's share of the device (9 minutes), with the tail (compare, fit, tar)
