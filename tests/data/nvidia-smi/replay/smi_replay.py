#!/usr/bin/env python3
"""Replays a directory of nvidia-smi outputs as if it were nvidia-smi, so the smi backend reads real (or
carefully constructed) text end to end. Usage: ``smi_replay.py DIR ARGS...`` (DIR comes first: the backend's
``command`` is ``[python, -S, smi_replay.py, DIR]``).

DIR holds:

* ``query_gpu.csv``: the full ``--query-gpu`` table as ``--format=csv,nounits`` prints it (header of canonical names
  with units). A ``--query-gpu=F1,F2,...`` run prints the header cells and row cells of the fields asked for, in that
  order; lines that are not rows (``Unable to determine the device handle ...``) are printed as they are, where they
  stand. ``query_gpu.exitcode`` (optional) is the exit status of every ``--query-gpu`` run.
* ``retired.stdout`` for any ``--query-retired-pages=`` run (printed as it is: it must hold the columns the backend
  asks for, header first);
* ``q_pids.stdout`` for ``-q -d PIDS``; ``q.stdout`` for a bare ``-q``; ``L.stdout`` for ``-L``; ``version.stdout``
  for ``--version``
  (exit 0 each; ``NAME.exitcode`` overrides). A missing file: exit 2, like an option this nvidia-smi lacks.

``-i`` is ignored (every GPU is printed): the backend must cope with more than it asked for.
"""

from __future__ import annotations

import sys
from pathlib import Path

# The requested spellings the backend uses whose header name differs (driver 580's --help-query-gpu).
ALIASES = {
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
}


def _exit_code(d: Path, name: str, default: int = 0) -> int:
    p = d / f"{name}.exitcode"
    return int(p.read_text().strip()) if p.exists() else default


def _query_gpu(d: Path, fields: list[str]) -> int:
    lines = (d / "query_gpu.csv").read_text(encoding="utf-8").splitlines()
    header = [c.strip() for c in lines[0].split(",")]
    names = [h.split(" [")[0] for h in header]
    want = [ALIASES.get(f, f) for f in fields]
    missing = [f for f, w in zip(fields, want, strict=True) if w not in names]
    if missing:
        print(f'Field "{missing[0]}" is not a valid field to query.\n')
        return 2
    cols = [names.index(w) for w in want]
    out = [", ".join(header[c] for c in cols)]
    for line in lines[1:]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(header):
            out.append(line)  # an error line such as "Unable to determine the device handle ..."
            continue
        out.append(", ".join(cells[c] for c in cols))
    sys.stdout.write("\n".join(out) + "\n")
    return _exit_code(d, "query_gpu")


def _file(d: Path, name: str) -> int:
    p = d / f"{name}.stdout"
    if not p.exists():
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
        return 2
    sys.stdout.write(p.read_text(encoding="utf-8"))
    return _exit_code(d, name)


def main(argv: list[str]) -> int:
    d = Path(argv[0])
    args = argv[1:]
    if "-i" in args:
        i = args.index("-i")
        del args[i : i + 2]
    for a in args:
        if a.startswith("--query-gpu="):
            return _query_gpu(d, a.split("=", 1)[1].split(","))
        if a.startswith("--query-retired-pages="):
            return _file(d, "retired")
    if args == ["--version"]:
        return _file(d, "version")
    if args == ["-q", "-d", "PIDS"]:
        return _file(d, "q_pids")
    if args == ["-q"]:
        return _file(d, "q")
    if args == ["-L"]:
        return _file(d, "L")
    print(f"smi_replay: no recording for {args}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
