"""Property tests of the nvidia-smi CSV parser.

Generated rows (placeholders, units or not, commas and spaces in names, stray whitespace, CRLF, blank lines) parse back
to the values they were generated from; damaged output raises SmiParseError and never yields a value; arbitrary text
never crashes the parser with anything but SmiParseError.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from nvmlcheck.backends.smi_csv import PID_MAX_LIMIT, parse_compute_apps, parse_pids_query, parse_query_gpu
from nvmlcheck.errors import CorruptData, SmiParseError
from nvmlcheck.model import MIB, ClockEventReason

PLACEHOLDERS = ["[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "[GPU requires reset]",
                "N/A"]  # fmt: skip
pads = st.text(alphabet=" \t", max_size=3)
placeholder = st.sampled_from(PLACEHOLDERS)
# What may stand in a row that is still read (its GPU not failed): "not supported" in the memory columns (any other
# placeholder there fails the GPU, as NVML's memory call failing does), and anything of no device scope elsewhere.
memory_placeholder = st.sampled_from(["[N/A]", "[Not Supported]", "N/A"])
value_placeholder = st.sampled_from([p for p in PLACEHOLDERS if p != "[GPU requires reset]"])
uuids = st.uuids().map(lambda u: f"GPU-{u}")


@dataclass
class Rendered:
    text: str
    structural_commas: list[int]  # offsets of the commas that separate cells (not those inside names)


def render(header: str, rows: list[list[str]], *, crlf: bool, blanks: list[int], pad: list[str]) -> Rendered:
    """Join cells with ',' (plus generated padding), lines with LF or CRLF, with blank lines inserted."""
    newline = "\r\n" if crlf else "\n"
    text = header + newline
    commas: list[int] = []
    for i, row in enumerate(rows):
        if i in blanks:
            text += newline
        line = ""
        for j, cell in enumerate(row):
            if j:
                commas.append(len(text) + len(line))
                line += ","
            line += pad[(i + j) % len(pad)] + cell + pad[(i * 7 + j) % len(pad)]
        text += line + newline
    return Rendered(text, commas)


# --- compute apps -----------------------------------------------------------------------------------------------------

names = st.text(
    alphabet=st.characters(exclude_categories=("Cs", "Cc"), exclude_characters="\n\r\x85\u2028\u2029"),
    min_size=1,
    max_size=30,
).filter(lambda s: s.strip() not in PLACEHOLDERS and not (s.strip().startswith("[") and s.strip().endswith("]")))


@st.composite
def app_rows(draw: st.DrawFn) -> tuple[list[tuple[str, int, str, int | None]], list[list[str]]]:
    expected: list[tuple[str, int, str, int | None]] = []
    cells: list[list[str]] = []
    gpus = draw(st.lists(uuids, min_size=1, max_size=3, unique=True))
    for _ in range(draw(st.integers(0, 6))):
        uuid = draw(st.sampled_from(gpus))
        pid = draw(st.integers(1, PID_MAX_LIMIT))
        name = draw(names)
        if draw(st.booleans()):
            used: int | None = draw(st.integers(0, 1 << 22))
            used_cell = f"{used} MiB" if draw(st.booleans()) else str(used)
        else:
            used, used_cell = None, draw(placeholder)
        expected.append((uuid, pid, name.strip(), None if used is None else used * MIB))
        cells.append([uuid, str(pid), name, used_cell])
    return expected, cells


@given(app_rows(), st.booleans(), st.lists(st.integers(0, 6), max_size=3), st.lists(pads, min_size=1, max_size=4))
def test_generated_process_rows_parse_back(
    generated: tuple[list[tuple[str, int, str, int | None]], list[list[str]]],
    crlf: bool,
    blanks: list[int],
    pad: list[str],
) -> None:
    expected, cells = generated
    text = render("gpu_uuid, pid, process_name, used_gpu_memory [MiB]", cells, crlf=crlf, blanks=blanks, pad=pad).text
    listing = parse_compute_apps(text)
    got = [(uuid, p.pid, p.name, p.used_bytes) for uuid, procs in listing.by_gpu.items() for p in procs]
    assert sorted(got, key=repr) == sorted(expected, key=repr)
    for uuid in listing.by_gpu:  # order within a GPU is nvidia-smi's order
        assert [p.pid for p in listing.by_gpu[uuid]] == [e[1] for e in expected if e[0] == uuid]


@given(app_rows(), st.data())
def test_removing_a_separator_in_a_process_row_is_refused_or_fails_its_gpu(
    generated: tuple[list[tuple[str, int, str, int | None]], list[list[str]]], data: st.DataObject
) -> None:
    _, cells = generated
    assume(cells)
    # A name that starts or ends with a comma makes a lost separator undetectable by any parser: "1, ,b" with the first
    # comma lost reads "1 ,b", which is also the correct output for the name "b". (One more reason the backend lists
    # processes from -q, where a name runs to the end of its line.)
    assume(all(not row[2].strip().startswith(",") and not row[2].strip().endswith(",") for row in cells))
    rendered = render("gpu_uuid, pid, process_name, used_gpu_memory [MiB]", cells, crlf=False, blanks=[], pad=[" "])
    at = data.draw(st.sampled_from(rendered.structural_commas))
    damaged = rendered.text[:at] + rendered.text[at + 1 :]
    try:
        listing = parse_compute_apps(damaged)
    except SmiParseError:
        return
    # Or the damaged row's GPU fails (or, when its UUID cannot be read, no list is trusted); what is read is exactly
    # what the undamaged output says.
    assert listing.failed or listing.unattributed, f"a row with a separator removed was read: {damaged!r}"
    original = parse_compute_apps(rendered.text)
    for uuid, procs in {} if listing.unattributed else listing.by_gpu.items():  # unattributed: no list is read
        assert procs == original.by_gpu[uuid], damaged


# --- query-gpu --------------------------------------------------------------------------------------------------------

GPU_HEADER = (
    "index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB], "
    "clocks.current.sm [MHz], clocks_event_reasons.active, retired_pages.pending"
)


@dataclass
class GpuRow:
    index: int
    uuid: str
    memory: tuple[int, int, int] | None  # total, used, free in MiB; None: one of them is a placeholder
    reserved: int | None
    sm: int | None
    reasons: int | None
    pending: bool | None


@st.composite
def gpu_rows(draw: st.DrawFn) -> tuple[list[GpuRow], list[list[str]]]:
    rows: list[GpuRow] = []
    cells: list[list[str]] = []
    for index in range(draw(st.integers(0, 8))):
        units = draw(st.booleans())

        def number(value: int, unit: str, units: bool = units) -> str:
            return f"{value} {unit}" if units else str(value)

        total = draw(st.integers(1, 1 << 22))  # 0 MiB in total is no reading (CorruptData: test_smi_csv.py)
        used = draw(st.integers(0, total))
        free = draw(st.integers(0, total))
        mem_cells = [number(total, "MiB"), number(used, "MiB"), number(free, "MiB")]
        memory: tuple[int, int, int] | None = (total, used, free)
        if draw(st.booleans()):
            mem_cells[draw(st.integers(0, 2))] = draw(memory_placeholder)
            memory = None
        reserved = draw(st.none() | st.integers(0, total))
        sm = draw(st.none() | st.integers(0, 5000))
        reasons = draw(st.none() | st.integers(0, (1 << 64) - 1))
        pending = draw(st.none() | st.booleans())
        rows.append(GpuRow(index, draw(uuids), memory, reserved, sm, reasons, pending))
        cells.append(
            [
                str(index),
                rows[-1].uuid,
                *mem_cells,
                draw(memory_placeholder) if reserved is None else number(reserved, "MiB"),
                draw(value_placeholder) if sm is None else number(sm, "MHz"),
                draw(value_placeholder) if reasons is None else f"0x{reasons:016x}",
                draw(value_placeholder) if pending is None else ("Yes" if pending else "No"),
            ]
        )
    return rows, cells


@given(gpu_rows(), st.booleans(), st.lists(st.integers(0, 8), max_size=3), st.lists(pads, min_size=1, max_size=4))
def test_generated_gpu_rows_parse_back(
    generated: tuple[list[GpuRow], list[list[str]]], crlf: bool, blanks: list[int], pad: list[str]
) -> None:
    rows, cells = generated
    records, failures = parse_query_gpu(render(GPU_HEADER, cells, crlf=crlf, blanks=blanks, pad=pad).text)
    assert failures == ()
    assert len(records) == len(rows)
    for want, got in zip(rows, records, strict=True):
        assert (got.index, got.uuid) == (want.index, want.uuid)
        if want.memory is None:
            assert got.memory is None and "memory" in got.unknown
        else:
            assert got.memory is not None
            assert (got.memory.total_bytes, got.memory.used_bytes, got.memory.free_bytes) == tuple(
                v * MIB for v in want.memory
            )
            assert got.memory.reserved_bytes == (None if want.reserved is None else want.reserved * MIB)
        assert got.clocks is not None and got.clocks.sm_mhz == want.sm
        assert got.clocks.event_reasons == (None if want.reasons is None else ClockEventReason(want.reasons))
        assert got.retired_pending == want.pending


NOT_A_VALUE = st.text(alphabet="abcxyz!#%&*+-./:;<=>?@^_~ ", min_size=1, max_size=8).filter(
    lambda s: s.strip() not in ("", "N/A") and not s.strip().startswith(("Yes", "No"))
)


@given(gpu_rows(), st.data())
@settings(max_examples=200)
def test_damaged_gpu_output_is_refused_or_fails_its_gpu(
    generated: tuple[list[GpuRow], list[list[str]]], data: st.DataObject
) -> None:
    _, cells = generated
    assume(cells)
    rendered = render(GPU_HEADER, cells, crlf=data.draw(st.booleans()), blanks=[], pad=[" "])
    text = rendered.text
    kind = data.draw(st.sampled_from(["cut", "drop-comma", "add-comma", "bad-cell"]))
    if kind == "cut":
        # Cut anywhere but at a line end: the last line is then incomplete.
        at = data.draw(st.integers(1, len(text) - 1))
        assume(not text[:at].endswith("\n"))
        damaged = text[:at]
    elif kind == "drop-comma":
        at = data.draw(st.sampled_from(rendered.structural_commas))
        damaged = text[:at] + text[at + 1 :]
    elif kind == "add-comma":
        at = data.draw(st.sampled_from(rendered.structural_commas))
        damaged = text[:at] + "," + text[at:]
    else:
        row = data.draw(st.integers(0, len(cells) - 1))
        column = data.draw(st.sampled_from([0, 2, 3, 4, 5, 6, 7, 8]))  # every typed column
        bad = [list(r) for r in cells]
        bad[row][column] = data.draw(NOT_A_VALUE)
        damaged = render(GPU_HEADER, bad, crlf=False, blanks=[], pad=[" "]).text
    try:
        records, failures = parse_query_gpu(damaged)
    except SmiParseError:
        return
    # Or the damaged row is its GPU's failure (as NVML fails one GPU alone), and every row read is an undamaged one.
    assert any(f.error is not None for f in failures), f"damaged output ({kind}) was read as {records!r}: {damaged!r}"
    original, _ = parse_query_gpu(text)
    assert all(r in original for r in records), f"damaged output ({kind}) was read as {records!r}: {damaged!r}"


@given(st.text(max_size=300))
@settings(max_examples=300)
def test_arbitrary_text_raises_only_parse_errors(text: str) -> None:
    for parse in (parse_query_gpu, parse_compute_apps):
        try:
            result = parse(text)
        except (SmiParseError, CorruptData):
            continue
        # The only thing random text can be is a bare header: no device, no process.
        if isinstance(result, tuple):
            assert result[0] == ()
        else:
            assert not result.by_gpu
    with contextlib.suppress(SmiParseError, CorruptData):
        listing = parse_pids_query(text)
        assert not any(listing.compute.values())  # no process out of thin air
