"""The nvidia-smi parser against real captures (tests/data/nvidia-smi/) and hand-made damage.

Every real capture must parse to the numbers a person reads in it; everything the parser cannot understand must raise
SmiParseError (never a value), and values that cannot be true must raise CorruptData.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import pytest

from nvmlcheck.backends import smi_csv
from nvmlcheck.backends.smi_csv import (
    GpuRecord,
    ProcessLists,
    build_device_state,
    parse_compute_apps,
    parse_pids_query,
    parse_query_gpu,
    parse_remapped_rows,
    parse_retired_pages,
    parse_table,
    parse_version_output,
)
from nvmlcheck.errors import CorruptData, GpuLost, NoPermission, SmiParseError, Unknown
from nvmlcheck.model import (
    MIB,
    ClockEventReason,
    Fields,
    GpuProcess,
    ProcessKind,
    RemappedRows,
    RetiredPage,
    RetirementCause,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
CAP1 = DATA / "h200-driver-580.159.04"
CAP2 = DATA / "h200-driver-580.159.04-host2"
UUID1 = "GPU-5d8f27a5-002a-ffba-d62e-d05aa034c235"
UUID2 = "GPU-3662ec51-6e6b-0373-bf24-ad373e870d61"

# The $Q of CAP1/COMMANDS.md and the $ALL of CAP2/COMMANDS.md, as requested (short spellings).
Q1 = [
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "serial",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "clocks.sm",
    "clocks.mem",
    "clocks.gr",
    "clocks.video",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks.applications.graphics",
    "clocks_event_reasons.active",
    "retired_pages.sbe",
    "retired_pages.dbe",
    "retired_pages.pending",
    "ecc.mode.current",
    "persistence_mode",
    "compute_mode",
    "pstate",
    "temperature.gpu",
    "power.draw",
    "fan.speed",
    "gpu_recovery_action",
]
ALL2 = [
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "serial",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "clocks.sm",
    "clocks.mem",
    "clocks.gr",
    "clocks.video",
    "clocks.max.sm",
    "clocks.max.mem",
    "clocks.max.gr",
    "clocks.applications.graphics",
    "clocks.applications.memory",
    "clocks_throttle_reasons.active",
    "retired_pages.sbe",
    "retired_pages.dbe",
    "retired_pages.pending",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
]
POLL = ["index", "uuid", "memory.total", "memory.used", "memory.free", "memory.reserved"]
APPS = ["gpu_uuid", "pid", "process_name", "used_memory"]
RETIRED = ["gpu_uuid", "retired_pages.address", "retired_pages.timestamp", "retired_pages.cause"]
REMAPPED = [
    "gpu_uuid",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
]


def read(directory: Path, name: str) -> str:
    return (directory / f"{name}.stdout").read_text(encoding="utf-8")


def one_gpu(text: str, requested: list[str] | None = None, header: bool = True) -> GpuRecord:
    records, failures = parse_query_gpu(text, requested, header=header)
    assert failures == ()
    assert len(records) == 1
    return records[0]


def same_values(a: GpuRecord, b: GpuRecord) -> bool:
    """Equal apart from the line number (output with and without a header)."""
    return dataclasses.replace(a, line_no=0) == dataclasses.replace(b, line_no=0)


# --- real captures ----------------------------------------------------------------------------------------------------


class TestQueryGpuCaptures:
    def test_units_capture_reads_as_printed(self) -> None:
        r = one_gpu(read(CAP1, "query_gpu_units"), Q1)
        assert (r.index, r.uuid, r.name, r.pci_bus_id) == (0, UUID1, "NVIDIA H200", "00000000:00:06.0")
        assert (r.serial, r.driver_version) == ("1655024027015", "580.159.04")
        assert r.memory is not None
        assert r.memory.total_bytes == 143771 * MIB
        assert r.memory.used_bytes == 0
        assert r.memory.free_bytes == 143156 * MIB
        assert r.memory.reserved_bytes == 616 * MIB
        assert r.memory.granularity_bytes == MIB
        assert r.memory.used_includes_reserved is False
        assert r.clocks is not None
        assert (r.clocks.sm_mhz, r.clocks.memory_mhz, r.clocks.graphics_mhz, r.clocks.video_mhz) == (
            1980,
            3201,
            1980,
            1545,
        )
        assert (r.clocks.max.sm_mhz, r.clocks.max.memory_mhz, r.clocks.applications.graphics_mhz) == (1980, 3201, 1980)
        assert r.clocks.event_reasons == ClockEventReason.NONE
        # Hopper does not retire pages: [N/A], never 0.
        assert (r.retired_sbe, r.retired_dbe, r.retired_pending) == (None, None, None)
        assert "[N/A]" in r.unknown["health.retired_pages"]
        assert "retired_pages.pending" in r.unknown["health.retired_pages_pending"]

    def test_nounits_noheader_capture_equals_the_units_capture(self) -> None:
        units = one_gpu(read(CAP1, "query_gpu_units"), Q1)
        bare = one_gpu(read(CAP1, "query_gpu_nounits"), Q1, header=False)
        assert same_values(units, bare)

    def test_busy_capture_reads_1551_mib_used(self) -> None:
        requested = ["index", "uuid", "memory.used", "memory.reserved", "memory.free"]
        table = parse_table(read(CAP1, "query_gpu_busy"), smi_csv.QUERY_GPU_ALIASES, requested, header=False)
        assert table.rows[0].cells == ("0", UUID1, "1551", "616", "141606")
        # memory.total was not asked for: no Memory can be built from the rest, and the record says why.
        r = one_gpu(read(CAP1, "query_gpu_busy"), requested, header=False)
        assert r.memory is None
        assert r.unknown["memory"] == "memory.total not asked for"

    def test_busy_poll_with_all_memory_fields(self) -> None:
        r = one_gpu(read(CAP2, "busy_poll_again"), POLL)
        assert r.memory is not None
        assert (r.memory.total_bytes, r.memory.used_bytes, r.memory.free_bytes, r.memory.reserved_bytes) == (
            143771 * MIB,
            2587 * MIB,
            140570 * MIB,
            616 * MIB,
        )

    def test_nvidia_smi_rounds_memory_up(self) -> None:
        # bytes_busy.txt: NVML read used 2,712,076,288 B (2586.44 MiB) and free 147,397,804,032 B (140569.5 MiB);
        # nvidia-smi printed 2587 and 140570 at the same moment, and 616 for the 644,939,776 B (615.06 MiB) reservation.
        nvml = (CAP2 / "bytes_busy.txt").read_text().split()
        total, used, free, reserved = (int(x) for x in nvml[1:5])
        r = one_gpu(read(CAP2, "busy_all_units"), ALL2)
        assert r.memory is not None
        for smi_bytes, exact in ((r.memory.used_bytes, used), (r.memory.free_bytes, free),
                                 (r.memory.reserved_bytes, reserved), (r.memory.total_bytes, total)):  # fmt: skip
            assert smi_bytes == math.ceil(exact / MIB) * MIB
        assert used % MIB != 0 and r.memory.used_bytes != round(used / MIB) * MIB  # rules out round-to-nearest

    def test_all_fields_with_remapped_rows_and_old_throttle_name(self) -> None:
        for name, busy_mib in (("idle_all_units", 0), ("idle_all_nounits", 0), ("busy_all_units", 2587)):
            r = one_gpu(read(CAP2, name), ALL2)
            assert r.uuid == UUID2
            assert r.memory is not None and r.memory.used_bytes == busy_mib * MIB
            assert r.clocks is not None and r.clocks.max.graphics_mhz == 1980
            assert r.clocks.applications.memory_mhz == 3201
            assert r.remapped_rows == RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)
        idle = one_gpu(read(CAP2, "idle_all_units"), ALL2)
        assert idle.clocks is not None and idle.clocks.event_reasons == ClockEventReason.GPU_IDLE

    def test_noheader_units_poll(self) -> None:
        r = one_gpu(read(CAP2, "noheader_units"), POLL, header=False)
        assert r.memory is not None and r.memory.free_bytes == 143156 * MIB

    def test_reference_figures_parse(self) -> None:
        # ../shared/reference/h200-baseline.json's query_gpu (a third host): current SM clock 345 MHz at idle.
        text = (
            "index, name, uuid, pci.bus_id, driver_version, memory.total [MiB], memory.used [MiB], "
            "memory.reserved [MiB], memory.free [MiB], clocks.current.sm [MHz], clocks.current.memory [MHz], "
            "clocks.max.sm [MHz], retired_pages.pending, persistence_mode, compute_mode\n"
            "0, NVIDIA H200, GPU-acdc9db5-97f7-57e3-53d2-3061aececeec, 00000000:00:06.0, 580.159.04, 143771 MiB, "
            "0 MiB, 616 MiB, 143156 MiB, 345 MHz, 3201 MHz, 1980 MHz, [N/A], Enabled, Default\n"
        )
        r = one_gpu(text)
        assert r.clocks is not None and r.clocks.sm_mhz == 345
        assert r.memory is not None and r.memory.reserved_bytes == 616 * MIB
        assert r.unknown["clocks.graphics_mhz"] == "clocks.current.graphics was not asked for"


class TestProcessCaptures:
    def test_busy_apps_units(self) -> None:
        listing = parse_compute_apps(read(CAP1, "apps_busy_units"))
        assert listing.by_gpu == {
            UUID1: (GpuProcess(pid=432, kind=ProcessKind.COMPUTE, used_bytes=1542 * MIB, name="python3"),)
        }

    def test_busy_apps_nounits_noheader(self) -> None:
        listing = parse_compute_apps(read(CAP1, "apps_busy_nounits"), APPS, header=False)
        assert listing.by_gpu[UUID1][0].used_bytes == 1542 * MIB

    def test_idle_apps_empty_output_without_header_is_no_process(self) -> None:
        assert read(CAP1, "apps_idle") == ""
        assert parse_compute_apps("", APPS, header=False).by_gpu == {}

    def test_idle_apps_header_only_is_no_process(self) -> None:
        assert parse_compute_apps(read(CAP2, "idle_apps"), APPS).by_gpu == {}

    def test_comma_in_a_name_prints_as_question_mark_in_csv(self) -> None:
        listing = parse_compute_apps(read(CAP2, "busy_apps_units"))
        procs = listing.by_gpu[UUID2]
        assert [(p.pid, p.name, p.used_bytes) for p in procs] == [
            (508, "/tmp/cap/holder", 1542 * MIB),
            (509, "/tmp/cap/dir? with space/my holder? x", 1030 * MIB),
        ]
        assert parse_compute_apps(read(CAP2, "busy_apps_nounits"), APPS) == listing

    def test_mps_server_and_client_are_compute_apps(self) -> None:
        procs = parse_compute_apps(read(CAP2, "mps_apps")).by_gpu[UUID2]
        assert [(p.pid, p.name, p.used_bytes) for p in procs] == [
            (871, "nvidia-cuda-mps-server", 66 * MIB),
            (867, "/tmp/cap/holder", 772 * MIB),
        ]

    def test_q_pids_busy_keeps_commas_in_names(self) -> None:
        listing = parse_pids_query(read(CAP2, "busy_q_pids"))
        pci = "00000000:00:06.0"
        assert [(p.pid, p.name, p.used_bytes) for p in listing.compute[pci]] == [
            (508, "/tmp/cap/holder", 1542 * MIB),
            (509, "/tmp/cap/dir, with space/my holder, x", 1030 * MIB),
        ]
        assert listing.graphics[pci] == () and listing.mps[pci] == ()
        assert (listing.driver_version, listing.cuda_version) == ("580.159.04", "13.0")
        assert listing.compute[pci][0].gpu_instance_id is None

    def test_q_pids_idle_is_an_empty_list_because_nvidia_smi_said_none(self) -> None:
        listing = parse_pids_query(read(CAP2, "idle_q_pids"))
        assert listing.compute == {"00000000:00:06.0": ()}
        assert listing.unknown == {}

    def test_full_q_is_read_for_processes_and_versions(self) -> None:
        listing = parse_pids_query(read(CAP1, "q_full"))
        assert listing.compute == {"00000000:00:06.0": ()}
        assert listing.cuda_version == "13.0"

    @pytest.mark.parametrize(
        "name",
        [
            # A name with a line break whose second line closes the Processes section: what followed (its own
            # bytes, and every later process of the GPU) was skipped, so pid 509 vanished from the list.
            "evil\n            Used GPU Memory               : 0 MiB\n    X",
            "evil\n            Used GPU Memory               : 0 MiB\n    Processes X",
            "evil\n            Used GPU Memory               : 0 MiB\nbar",
        ],
    )
    def test_q_pids_process_lines_outside_the_section_are_refused_not_skipped(self, name: str) -> None:
        text = read(CAP2, "busy_q_pids").replace("/tmp/cap/holder\n", name + "\n", 1)
        listing = parse_pids_query(text)
        error = listing.failed["00000000:00:06.0"]  # the GPU fails: its list is never read short
        assert isinstance(error, SmiParseError) and "outside a Processes section" in error.reason
        assert "00000000:00:06.0" not in listing.compute

    def test_q_pids_one_gpu_printed_twice_is_refused(self) -> None:
        text = read(CAP2, "busy_q_pids")
        gpu = text[text.index("GPU 00000000:00:06.0"):]
        with pytest.raises(SmiParseError, match="printed twice"):
            parse_pids_query(text + gpu.replace("Processes\n", "Processes                    : None\n", 1)
                             .split("        GPU instance ID")[0])

    @pytest.mark.parametrize("after", ["", "\n", "GPU 00000000:00:07.0\n    Processes                    : None\n"])
    def test_q_pids_processes_title_without_entries_is_not_no_process(self, after: str) -> None:
        # Output cut right after the bare "Processes" title (or a next block after it): nvidia-smi prints
        # "Processes : None" for none, so an empty title lost its entries. It read as an empty list: an idle GPU.
        text = read(CAP2, "busy_q_pids")
        cut = text[: text.index("        GPU instance ID")] + after
        listing = parse_pids_query(cut)
        error = listing.failed["00000000:00:06.0"]
        assert isinstance(error, SmiParseError) and "lists no process" in error.reason
        assert "00000000:00:06.0" not in listing.compute
        if after.startswith("GPU"):
            assert listing.compute["00000000:00:07.0"] == ()  # "Processes : None" is still none

    def test_a_byte_order_mark_is_not_part_of_the_first_line(self) -> None:
        # It made the whole output unreadable ("header cell '\\ufeffindex' is not a field name").
        q = read(CAP2, "busy_q_pids")
        assert parse_pids_query("\ufeff" + q).compute == parse_pids_query(q).compute
        apps = read(CAP2, "busy_apps_units")
        assert parse_compute_apps("\ufeff" + apps).by_gpu == parse_compute_apps(apps).by_gpu
        gpu = read(CAP1, "query_gpu_units")
        assert parse_query_gpu("\ufeff" + gpu)[0] == parse_query_gpu(gpu)[0]

    def test_q_without_a_processes_section_is_not_no_process(self) -> None:
        # -q -d MEMORY,... prints no Processes section: reading it as "no process" would be a lie.
        error = parse_pids_query(read(CAP1, "q_memory")).failed["00000000:00:06.0"]
        assert isinstance(error, SmiParseError) and "no Processes section" in error.reason


class TestHealthAndVersionCaptures:
    def test_retired_pages_on_hopper_are_placeholder_rows(self) -> None:
        for listing in (
            parse_retired_pages(read(CAP1, "retired"), RETIRED, header=False),
            parse_retired_pages(read(CAP2, "retired_header")),
        ):
            assert listing.by_gpu == {}
            (uuid, reason), *_ = listing.unsupported.items()
            assert uuid in (UUID1, UUID2) and "[N/A]" in reason

    def test_remapped_rows(self) -> None:
        expected = RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False)
        assert parse_remapped_rows(read(CAP1, "remapped"), REMAPPED, header=False) == {UUID1: expected}
        assert parse_remapped_rows(read(CAP2, "remapped_header")) == {UUID2: expected}

    def test_version_output(self) -> None:
        v = parse_version_output(read(CAP2, "version"))
        assert v["cuda version"] == "13.0" and v["driver version"] == "580.159.04"
        assert smi_csv.cuda_version_number(v["cuda version"]) == 13000
        assert smi_csv.cuda_version_number("12.4") == 12040

    @pytest.mark.parametrize(
        ("directory", "name"),
        [(CAP1, "table_busy"), (CAP1, "bogus_field"), (CAP1, "bad_index"), (CAP2, "mps_table"), (CAP1, "q_full")],
    )
    def test_other_real_outputs_are_refused_by_the_csv_parser(self, directory: Path, name: str) -> None:
        with pytest.raises(SmiParseError):
            parse_query_gpu(read(directory, name), POLL)

    def test_the_table_is_refused_by_the_q_parser(self) -> None:
        with pytest.raises(SmiParseError):
            parse_pids_query(read(CAP1, "table_busy"))


# --- synthetic rows ---------------------------------------------------------------------------------------------------

HEADER = (
    "index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB], "
    "clocks.current.sm [MHz], clocks_event_reasons.active, retired_pages.pending, remapped_rows.correctable, "
    "remapped_rows.uncorrectable, remapped_rows.pending, remapped_rows.failure"
)
ROW_UNITS = "0, GPU-1, 1000 MiB, 10 MiB, 974 MiB, 16 MiB, 345 MHz, 0x0000000000000005, No, 1, 2, Yes, No"
ROW_BARE = "0, GPU-1, 1000, 10, 974, 16, 345, 0x0000000000000005, No, 1, 2, Yes, No"
ROW1_BARE = "1, GPU-2, 1000, 10, 974, 16, 345, 0x0000000000000005, No, 1, 2, Yes, No"
PLACEHOLDERS = ["[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]", "[GPU requires reset]",
                "N/A", "[Some Future Text]"]  # fmt: skip
# Column -> (key in unknown, how to read the value back) for the synthetic header.
COLUMN_PARTS = {
    2: "memory",
    3: "memory",
    4: "memory",
    5: "memory.reserved_bytes",
    6: "clocks.current.sm_mhz",
    7: "clocks.event_reasons",
    8: "health.retired_pages_pending",
    9: "health.remapped_rows",
    10: "health.remapped_rows",
    11: "health.remapped_rows",
    12: "health.remapped_rows",
}


def with_cell(row: str, column: int, value: str) -> str:
    cells = row.split(", ")
    cells[column] = value
    return ", ".join(cells)


class TestSyntheticRows:
    def test_units_and_nounits_read_the_same(self) -> None:
        a = one_gpu(f"{HEADER}\n{ROW_UNITS}\n")
        b = one_gpu(f"{HEADER}\n{ROW_BARE}\n")
        assert same_values(a, b)
        assert a.memory is not None and a.memory.used_bytes == 10 * MIB
        assert a.clocks is not None
        assert a.clocks.event_reasons == ClockEventReason.GPU_IDLE | ClockEventReason.SW_POWER_CAP
        assert a.remapped_rows == RemappedRows(1, 2, True, False)
        assert a.retired_pending is False

    def test_crlf_and_blank_lines_read_the_same(self) -> None:
        plain = one_gpu(f"{HEADER}\n{ROW_UNITS}\n")
        assert same_values(plain, one_gpu(f"{HEADER}\r\n{ROW_UNITS}\r\n"))
        assert same_values(plain, one_gpu(f"\n\n{HEADER}\n\n  \n{ROW_UNITS}\n\n"))

    @pytest.mark.parametrize("placeholder", PLACEHOLDERS)
    @pytest.mark.parametrize("column", sorted(COLUMN_PARTS))
    def test_every_placeholder_in_every_column_is_none_with_its_reason(self, column: int, placeholder: str) -> None:
        fails = placeholder == "[GPU requires reset]" or (
            COLUMN_PARTS[column].startswith("memory") and placeholder not in ("[N/A]", "[Not Supported]", "N/A")
        )
        if fails:
            # What NVML answers with an error failing the GPU (device scope anywhere; any but NOT_SUPPORTED from the
            # memory call a wait judges) fails it here too, with that error's code: never a reading.
            records, (failure,) = parse_query_gpu(f"{HEADER}\n{with_cell(ROW_BARE, column, placeholder)}\n")
            assert records == () and (failure.index, failure.uuid) == (0, "GPU-1") and failure.error is None
            assert placeholder in failure.message
            assert failure.code == {"[Insufficient Permissions]": 4, "[GPU requires reset]": 16}.get(placeholder, 999)
            return
        r = one_gpu(f"{HEADER}\n{with_cell(ROW_BARE, column, placeholder)}\n")
        key = COLUMN_PARTS[column]
        assert placeholder in r.unknown[key]
        state = build_device_state(r, Fields.MEMORY | Fields.CLOCKS | Fields.HEALTH)
        assert state.why_unknown(key) is not None
        if key == "memory":
            assert state.memory is None
        elif key == "memory.reserved_bytes":
            assert state.memory is not None and state.memory.reserved_bytes is None
            assert state.memory.used_bytes == 10 * MIB  # the rest is still read
        elif key == "clocks.current.sm_mhz":
            assert state.clocks is not None and state.clocks.sm_mhz is None
            assert state.why_unknown("clocks.sm_mhz") == r.unknown[key]
        elif key == "clocks.event_reasons":
            assert state.clocks is not None and state.clocks.event_reasons is None
        elif key == "health.retired_pages_pending":
            assert state.health is not None and state.health.retired_pages_pending is None
        else:
            assert state.health is not None and state.health.remapped_rows is None

    @pytest.mark.parametrize("placeholder", PLACEHOLDERS)
    def test_placeholder_uuid_is_a_device_failure(self, placeholder: str) -> None:
        records, failures = parse_query_gpu(f"{HEADER}\n{with_cell(ROW_BARE, 1, placeholder)}\n")
        assert records == ()
        assert failures[0].index == 0 and placeholder in failures[0].message
        if placeholder == "[GPU requires reset]":
            assert failures[0].code == 16

    @pytest.mark.parametrize(("placeholder", "code"), [("[N/A]", 3), ("[Unknown Error]", 999), ("[GPU is lost]", 15)])
    def test_placeholder_index_is_a_failure_named_by_its_uuid(self, placeholder: str, code: int) -> None:
        records, (failure,) = parse_query_gpu(f"{HEADER}\n{ROW_BARE}\n{with_cell(ROW1_BARE, 0, placeholder)}\n")
        assert [r.uuid for r in records] == ["GPU-1"]
        assert (failure.index, failure.uuid, failure.code) == (None, "GPU-2", code) and placeholder in failure.message
        with pytest.raises(SmiParseError, match="second row for GPU GPU-1"):  # its UUID another row's: whose?
            parse_query_gpu(f"{HEADER}\n{ROW_BARE}\n{with_cell(ROW_BARE, 0, placeholder)}\n")

    def test_device_handle_lines_are_failures_not_rows(self) -> None:
        text = (
            f"{HEADER}\n{ROW_BARE}\n"
            "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover "
            "this GPU\nUnable to determine the device handle for GPU0000:03:00.0: Unknown Error\n"
        )
        records, failures = parse_query_gpu(text)
        assert [r.index for r in records] == [0]
        assert [(f.pci_bus_id, f.code) for f in failures] == [("00000000:02:00.0", 15), ("00000000:03:00.0", 999)]

    def test_renamed_and_old_header_names_map_to_one_field(self) -> None:
        old = "index, uuid, clocks.sm [MHz], clocks_throttle_reasons.active\n0, GPU-1, 345, 0x1\n"
        new = "index, uuid, clocks.current.sm [MHz], clocks_event_reasons.active\n0, GPU-1, 345, 0x1\n"
        a = one_gpu(old, ["index", "uuid", "clocks.sm", "clocks_throttle_reasons.active"])
        b = one_gpu(new, ["index", "uuid", "clocks.sm", "clocks_throttle_reasons.active"])
        assert same_values(a, b)
        assert a.clocks is not None and a.clocks.event_reasons == ClockEventReason.GPU_IDLE

    def test_unknown_reason_bits_are_kept(self) -> None:
        r = one_gpu("index, uuid, clocks.current.sm, clocks_event_reasons.active\n0, GPU-1, 1, 0x0000000000100001\n")
        assert r.clocks is not None and r.clocks.event_reasons is not None
        assert int(r.clocks.event_reasons) == 0x100001
        assert "0x100000" in r.clocks.event_reasons.names

    def test_no_reserved_column_means_v1_used(self) -> None:
        r = one_gpu("index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB]\n0, GPU-1, 100, 20, 80\n")
        assert r.memory is not None and r.memory.used_includes_reserved is True
        assert r.memory.reserved_bytes is None

    def test_commas_and_spaces_in_process_names(self) -> None:
        text = (
            "gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n"
            "GPU-1, 12, my, weird  name, with commas , 100 MiB\n"
            "GPU-1, 13, ,leading comma, [N/A]\n"
            "GPU-2, 14, plain, 5\n"
        )
        listing = parse_compute_apps(text)
        assert [(p.pid, p.name, p.used_bytes) for p in listing.by_gpu["GPU-1"]] == [
            (12, "my, weird  name, with commas", 100 * MIB),
            (13, ",leading comma", None),
        ]
        assert listing.by_gpu["GPU-2"][0].name == "plain"

    def test_process_name_column_first_or_last(self) -> None:
        first = "process_name, pid, gpu_uuid, used_gpu_memory [MiB]\na, b, 7, GPU-1, 3\n"
        last = "gpu_uuid, pid, used_gpu_memory [MiB], process_name\nGPU-1, 7, 3, a, b\n"
        for text in (first, last):
            (proc,) = parse_compute_apps(text).by_gpu["GPU-1"]
            assert (proc.pid, proc.name, proc.used_bytes) == (7, "a, b", 3 * MIB)

    def test_unattributable_process_row_makes_lists_unknown(self) -> None:
        listing = parse_compute_apps("gpu_uuid, pid, used_gpu_memory [MiB]\n[Unknown Error], 7, 3\n")
        assert listing.by_gpu == {}
        assert listing.unattributed is not None and "[Unknown Error]" in listing.unattributed

    def test_retired_pages_listed(self) -> None:
        text = (
            "gpu_uuid, retired_pages.address, retired_pages.timestamp, retired_pages.cause\n"
            "GPU-1, 0x0000000000001000, 1700000000, Single Bit ECC\n"
            "GPU-1, 0x2000, Mon Jan  1 00:00:00 2024, Double Bit ECC\n"
        )
        listing = parse_retired_pages(text)
        assert listing.by_gpu["GPU-1"] == (
            RetiredPage(0x1000, RetirementCause.MULTIPLE_SINGLE_BIT_ECC, 1700000000),
            RetiredPage(0x2000, RetirementCause.DOUBLE_BIT_ECC, None),
        )

    def test_q_pids_kinds_and_mig_ids(self) -> None:
        text = (
            "Driver Version : 1.2\nCUDA Version : 12.4\nAttached GPUs : 2\nGPU 0000:01:00.0\n    Processes\n"
            "        GPU instance ID : 1\n        Compute instance ID : 0\n        Process ID : 10\n"
            "            Type : M+C\n            Name : a: b, c\n            Used GPU Memory : 2 MiB\n"
            "        GPU instance ID : N/A\n        Compute instance ID : N/A\n        Process ID : 11\n"
            "            Type : C+G\n            Name : x\n            Used GPU Memory : N/A\n"
            "            Used GPU CC Protected Memory : 0 MiB\n"
            "GPU 00000000:02:00.0\n    Processes : [Not Supported]\n"
        )
        listing = parse_pids_query(text)
        a, b = "00000000:01:00.0", "00000000:02:00.0"
        assert listing.mps[a] == (GpuProcess(10, ProcessKind.MPS, 2 * MIB, "a: b, c", 1, 0),)
        assert [p.pid for p in listing.compute[a]] == [10, 11]
        assert listing.graphics[a] == (GpuProcess(11, ProcessKind.GRAPHICS, None, "x"),)
        assert "[Not Supported]" in listing.unknown[b]
        assert listing.cuda_version == "12.4"


# --- refusals -----------------------------------------------------------------------------------------------------


class TestRefusals:
    @pytest.mark.parametrize(
        ("text", "match"),
        [
            (f"{HEADER}\n{ROW_BARE}", "cut short"),  # no final newline
            (f"{HEADER.replace('[MiB]', '[GiB]')}\n{ROW_BARE}\n", "GiB"),
            (f"{HEADER}, index\n{ROW_BARE}, 0\n", "twice"),
            (f"0, GPU-1\n{ROW_BARE}\n", "header"),
            ("", "no header"),
            ("\x00\x01garbage\n", "header"),
            (f"{HEADER}\n{ROW_BARE}\n{ROW_BARE}\n", "second row for GPU 0"),  # one GPU twice: whose reading?
            (f"{HEADER}\n{ROW_BARE}\n{with_cell(ROW_BARE, 0, '1')}\n", "second row for GPU GPU-"),  # one UUID twice
            # A damaged row that names a GPU another row reads: which of the two is that GPU's?
            (f"{HEADER}\n{ROW_BARE}\n{with_cell(ROW_BARE, 3, 'x')}\n", "second row for GPU 0"),
            (f"{HEADER}\n{ROW_BARE}\n{with_cell(ROW_BARE, 0, '1')[:-4]}\n", "damaged second row for GPU GPU-1"),
        ],
    )
    def test_query_gpu_refuses(self, text: str, match: str) -> None:
        with pytest.raises(SmiParseError, match=match) as info:
            parse_query_gpu(text)
        assert info.value.line_no >= 1

    @pytest.mark.parametrize(
        ("row", "match", "readable"),
        [
            (ROW1_BARE[:-9], "columns", (1, "GPU-2")),  # a cell lost
            (f"{ROW1_BARE}, 7", "columns", (1, "GPU-2")),  # a cell too many (no free-text column)
            (with_cell(ROW1_BARE, 3, "1O"), "whole number", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 3, "-1"), "whole number", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 3, "1.5"), "whole number", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 3, "1,5"), "columns", (1, "GPU-2")),  # a localised decimal comma
            (with_cell(ROW1_BARE, 3, "10 MHz"), "whole number", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 3, ""), "whole number", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 3, "99999999999999999999999"), "whole number", (1, "GPU-2")),  # 23 digits
            (with_cell(ROW1_BARE, 7, "5"), "hex", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 8, "maybe"), "Yes/No", (1, "GPU-2")),
            (with_cell(ROW1_BARE, 1, "not-a-uuid"), "UUID", (1, None)),
            (with_cell(ROW1_BARE, 0, "one"), "whole number", (None, "GPU-2")),
            ("1 GPU-2, 1000, 10", "columns", (None, None)),  # nothing of it can be read
        ],
    )
    def test_a_damaged_row_fails_its_gpu_alone(
        self, row: str, match: str, readable: tuple[int | None, str | None]
    ) -> None:
        # GPU 1's row cannot be read: GPU 1 fails (with the error, and what of the row tells whose it is), never read
        # as data; GPU 0 still reports. NVML fails one GPU alone in the same way.
        records, failures = parse_query_gpu(f"{HEADER}\n{ROW_BARE}\n{row}\n")
        assert [r.uuid for r in records] == ["GPU-1"]
        (failure,) = failures
        assert (failure.index, failure.uuid) == readable
        assert isinstance(failure.error, SmiParseError) and re.search(match, failure.error.reason)
        assert (failure.line_no, failure.line) == (3, row)

    def test_header_must_match_the_request(self) -> None:
        with pytest.raises(SmiParseError, match="does not match"):
            parse_query_gpu(f"{HEADER}\n{ROW_BARE}\n", POLL)

    def test_index_and_uuid_are_required(self) -> None:
        with pytest.raises(SmiParseError, match="uuid"):
            parse_query_gpu("index, memory.used [MiB]\n0, 1\n")

    def test_noheader_needs_the_request(self) -> None:
        with pytest.raises(ValueError, match="requested"):
            parse_table("0, 1\n", {}, header=False)

    def test_error_carries_line_number_and_line(self) -> None:
        bad = with_cell(ROW1_BARE, 2, "x")
        _, (failure,) = parse_query_gpu(f"{HEADER}\n{ROW_BARE}\n{bad}\n")
        assert isinstance(failure.error, SmiParseError)
        assert (failure.error.line_no, failure.error.line) == (3, bad)

    @pytest.mark.parametrize(
        "row",
        [
            "GPU-1, 7, name",  # a column lost (even with a free-text column)
            "GPU-1, seven, name, 5",
            "GPU-1, 7, name, 5 GiB",
            "GPU-1, 7, name, 5.5",
        ],
    )
    def test_compute_apps_row_that_cannot_be_read_fails_its_gpu(self, row: str) -> None:
        listing = parse_compute_apps(f"gpu_uuid, pid, process_name, used_gpu_memory [MiB]\nGPU-2, 8, b, 1\n{row}\n")
        assert isinstance(listing.failed["GPU-1"], SmiParseError)
        assert "GPU-1" not in listing.by_gpu and [p.pid for p in listing.by_gpu["GPU-2"]] == [8]
        assert listing.unattributed is None

    def test_compute_apps_row_naming_no_gpu_makes_every_list_unknown(self) -> None:
        listing = parse_compute_apps("gpu_uuid, pid, process_name, used_gpu_memory [MiB]\nGPU-2, 8, b, 1\nGPU 1 7\n")
        assert listing.unattributed is not None and "line 3" in listing.unattributed

    @pytest.mark.parametrize(
        "text",
        [
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes\n        Process ID : 1\n",  # no Type / memory
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes\n        Process ID : x\n            Type : C\n"
            "            Used GPU Memory : 1 MiB\n",
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes\n        Process ID : 1\n            Type : X\n"
            "            Used GPU Memory : 1 MiB\n",
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes\n        Process ID : 1\n            Type : C\n"
            "            Used GPU Memory : 1 GiB\n",
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes : Some\n",
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes : None\n    Processes : None\n",
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes\n        ??? garbage\n",
            "CUDA Version : 1\nGPU 0000:01:00.0\n    Processes : None\n",  # no Driver Version: not -q output
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes : None",  # cut short
        ],
    )
    def test_q_pids_gpu_block_that_cannot_be_read_fails_that_gpu_alone(self, text: str) -> None:
        if "Driver Version" not in text or not text.endswith("\n"):
            with pytest.raises(SmiParseError):  # not -q output at all, or cut short: nothing of it is read
                parse_pids_query(text)
            return
        other = "GPU 0000:02:00.0\n    Processes : None\n"
        for whole in (text + other, text.replace("GPU 0000:01", other + "GPU 0000:01")):
            listing = parse_pids_query(whole)
            assert isinstance(listing.failed["00000000:01:00.0"], SmiParseError)
            assert "00000000:01:00.0" not in listing.compute  # never an empty (idle) list
            assert listing.compute["00000000:02:00.0"] == ()  # the other GPU, before or after it, still reads

    def test_q_pids_header_that_cannot_be_read_refuses_everything(self) -> None:
        with pytest.raises(SmiParseError, match="key : value"):
            parse_pids_query("Driver Version : 1\n??? garbage\nGPU 0000:01:00.0\n    Processes : None\n")

    def test_unknown_retirement_cause_makes_that_gpus_pages_unknown(self) -> None:
        # As NVML leaves one health value unknown: the GPU's pages are None with the line, the other GPU's are read.
        listing = parse_retired_pages(
            "gpu_uuid, retired_pages.address, retired_pages.cause\nGPU-1, 0x1, Double Bit ECC\nGPU-1, 0x2, Cosmic Ray\n"
            "GPU-2, 0x3, Single Bit ECC\nGPU-3, 0x4\n"
        )
        assert "GPU-1" not in listing.by_gpu and "line 3" in listing.unsupported["GPU-1"]
        assert "cause" in listing.unsupported["GPU-1"]
        assert "line 5" in listing.unsupported["GPU-3"] and "columns" in listing.unsupported["GPU-3"]
        assert [p.address for p in listing.by_gpu["GPU-2"]] == [3]

    def test_a_retired_page_row_naming_no_gpu_is_refused(self) -> None:
        with pytest.raises(SmiParseError, match="columns"):
            parse_retired_pages("gpu_uuid, retired_pages.address, retired_pages.cause\nGPU-1 0x1, Cosmic Ray\n")


class TestCorruptData:
    # Each impossible value fails its GPU alone (as NVML's CorruptData does), never the others, never read as data.
    @pytest.mark.parametrize("reserved", ["0", "[N/A]"])
    def test_no_memory_at_all_is_corrupt_not_an_idle_gpu(self, reserved: str) -> None:
        # 0 MiB in total with 0 used read as an idle GPU; NVML's backend refuses the same reading alike.
        text = ("index, uuid, memory.total [MiB], memory.used [MiB], memory.free [MiB], memory.reserved [MiB]\n"
                f"0, {UUID1}, 0, 0, 0, {reserved}\n")
        records, failures = parse_query_gpu(text)
        assert records == ()
        (failure,) = failures
        assert isinstance(failure.error, CorruptData) and "memory.total 0 MiB" in str(failure.error)

    def test_used_above_total(self) -> None:
        records, (failure,) = parse_query_gpu(
            "index, uuid, memory.total, memory.used, memory.free\n0, GPU-1, 10, 11, 0\n1, GPU-2, 10, 1, 9\n"
        )
        assert [r.uuid for r in records] == ["GPU-2"]
        assert (failure.index, failure.uuid) == (0, "GPU-1")
        assert isinstance(failure.error, CorruptData) and "exceed" in str(failure.error)

    @pytest.mark.parametrize("pid", ["0", "4194305"])
    def test_impossible_pid_csv(self, pid: str) -> None:
        listing = parse_compute_apps(f"gpu_uuid, pid, used_gpu_memory\nGPU-1, {pid}, 1\nGPU-2, 5, 1\n")
        assert isinstance(listing.failed["GPU-1"], CorruptData) and "impossible" in str(listing.failed["GPU-1"])
        assert "GPU-1" not in listing.by_gpu and [p.pid for p in listing.by_gpu["GPU-2"]] == [5]

    def test_impossible_pid_q(self) -> None:
        text = (
            "Driver Version : 1\nGPU 0000:01:00.0\n    Processes\n        Process ID : 0\n            Type : C\n"
            "            Used GPU Memory : 1 MiB\nGPU 0000:02:00.0\n    Processes : None\n"
        )
        listing = parse_pids_query(text)
        assert isinstance(listing.failed["00000000:01:00.0"], CorruptData)
        assert "00000000:01:00.0" not in listing.compute and listing.compute["00000000:02:00.0"] == ()

    def test_clock_beyond_32_bits(self) -> None:
        row = with_cell(ROW1_BARE, 6, "4294967296")  # NVML's clocks are unsigned int
        records, (failure,) = parse_query_gpu(f"{HEADER}\n{ROW_BARE}\n{row}\n")
        assert [r.uuid for r in records] == ["GPU-1"] and (failure.index, failure.uuid) == (1, "GPU-2")
        assert isinstance(failure.error, CorruptData) and "2^32" in str(failure.error)
        assert one_gpu(f"{HEADER}\n{with_cell(ROW_BARE, 6, '4294967295')}\n").clocks is not None

    def test_process_using_more_than_the_gpu_has(self) -> None:
        r = one_gpu("index, uuid, memory.total, memory.used, memory.free\n0, GPU-1, 10, 1, 9\n")
        lists = ProcessLists((GpuProcess(5, ProcessKind.COMPUTE, 11 * MIB),), (), ())
        with pytest.raises(CorruptData, match="more than"):
            build_device_state(r, Fields.ALL, processes=lists)


class TestBuildDeviceState:
    def test_parts_not_requested_are_none_with_reason(self) -> None:
        r = one_gpu(f"{HEADER}\n{ROW_BARE}\n")
        state = build_device_state(r, Fields.MEMORY, identity={"name": "N", "pci_bus_id": "P", "serial": "S"})
        assert state.memory is not None and state.clocks is None and state.health is None
        assert state.why_unknown("clocks") == "not requested"
        assert state.why_unknown("processes.compute") == "not requested"
        assert (state.name, state.pci_bus_id, state.serial) == ("N", "P", "S")
        assert state.minor_number is None and state.why_unknown("minor_number") is not None

    def test_retired_page_counts_decide_the_listing(self) -> None:
        header = "index, uuid, retired_pages.single_bit_ecc.count, retired_pages.double_bit.count\n"
        zero = one_gpu(header + "0, GPU-1, 0, 0\n")
        assert build_device_state(zero, Fields.HEALTH).health.retired_pages == ()  # type: ignore[union-attr]
        some = one_gpu(header + "0, GPU-1, 1, 0\n")
        page = RetiredPage(0x1000, RetirementCause.MULTIPLE_SINGLE_BIT_ECC, 1)
        listed = build_device_state(some, Fields.HEALTH, retired_pages=(page,))
        assert listed.health is not None and listed.health.retired_pages == (page,)
        unlisted = build_device_state(some, Fields.HEALTH)
        assert unlisted.health is not None and unlisted.health.retired_pages is None
        assert unlisted.why_unknown("health.retired_pages") is not None

    def test_process_lists_and_their_reasons(self) -> None:
        r = one_gpu(f"{HEADER}\n{ROW_BARE}\n")
        lists = ProcessLists((GpuProcess(5, ProcessKind.COMPUTE, MIB),), None, None, {"processes.graphics": "why"})
        state = build_device_state(r, Fields.WAIT, processes=lists)
        assert state.compute_processes == lists.compute
        assert state.processes is None
        assert state.why_unknown("processes.graphics") == "why"


@pytest.mark.parametrize(
    ("value", "failure"),
    [
        ("N/A", None),
        ("[N/A]", None),
        ("Not Supported", None),  # a bare phrase, as -q prints where a number belongs
        ("[Not Supported]", None),
        ("[Insufficient Permissions]", NoPermission),
        ("Insufficient Permissions", NoPermission),
        ("[Unknown Error]", Unknown),
        ("[GPU is lost]", GpuLost),
    ],
)
def test_q_processes_placeholder_is_unknown_or_fails_the_gpu_as_nvml_would(
    value: str, failure: type[Exception] | None
) -> None:
    # NVML: NOT_SUPPORTED leaves a list unknown; NO_PERMISSION, UNKNOWN, GPU_IS_LOST fail the GPU.
    text = f"Driver Version : 1\nGPU 0000:01:00.0\n    Processes : {value}\nGPU 0000:02:00.0\n    Processes : None\n"
    listing = parse_pids_query(text)
    assert "00000000:01:00.0" not in listing.compute or listing.compute["00000000:01:00.0"] == ()
    if failure is None:
        assert value.strip("[]") in listing.unknown["00000000:01:00.0"] and not listing.failed
    else:
        assert type(listing.failed["00000000:01:00.0"]) is failure
        assert "00000000:01:00.0" not in listing.compute
    assert listing.compute["00000000:02:00.0"] == ()


# --- digits of other scripts ------------------------------------------------------------------------------------------
# Python's \d and str.isdigit() take any script's digits (U+0661, U+00B2); int() reads U+0661 as 1 and refuses U+00B2. A
# number nvidia-smi prints is ASCII: anything else is garbage, never a value, and never a bare ValueError.


def test_other_scripts_digits_are_not_read_as_numbers() -> None:
    from nvmlcheck.backends._smi.queries import parse_recovery_action

    assert smi_csv.cuda_version_number("13.\u0661") is None  # read as 13.1 (13010)
    assert parse_recovery_action("\u00b2") is None  # a bare ValueError from int()
    assert parse_recovery_action("\u0661") is None  # read as action 1 (GPU reset)
    with pytest.raises(SmiParseError, match="not a GPU or MIG device line"):
        smi_csv.parse_list_gpus("GPU \u0661: NVIDIA H200 (UUID: GPU-x)\n")  # read as GPU 1


def test_q_process_bytes_in_another_scripts_digits_fail_the_gpu() -> None:
    text = read(CAP2, "busy_q_pids").replace("1542 MiB", "\u0661\u0665\u0664\u0662 MiB", 1)  # read as 1542 MiB
    listing = parse_pids_query(text)
    error = listing.failed["00000000:00:06.0"]
    assert isinstance(error, SmiParseError) and "Used GPU Memory" in error.reason
