"""Numbers as people type them and the environment gives them: ASCII digits only, and durations that a deadline in
ns can hold. Python's own parsers read more (``int("1_0")`` is 10, ``int("٣")`` is 3, ``float("1e300") * 1e9`` is
``inf``); each case here was a wrong target or a traceback after a signal went out."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from nvmlcheck import slurm
from nvmlcheck._text import is_digits
from nvmlcheck.cli import main
from nvmlcheck.kill import _grace_ns
from nvmlcheck.testing import StubSession

ODD = ["1_0", "\u0663", "\u00b2", " 12_3", "\uff11"]  # underscore, Arabic-Indic three, superscript two, fullwidth 1


@pytest.mark.parametrize("word", ODD)
def test_only_ascii_digits_are_digits(word: str) -> None:
    assert not is_digits(word) and is_digits("0123") and not is_digits("")


@pytest.mark.parametrize("word", ODD)
@pytest.mark.parametrize("argv", [
    ["kill", "--dry-run", "{}"],
    ["wait", "--timeout", "{}"],
    ["kill", "--grace", "{}", "1"],
    ["select", "--count", "{}"],
    ["snapshot", "--devices", "{}"],
    ["ready", "--need", "{}GiB"],
])
def test_a_number_option_takes_ascii_digits_only(word: str, argv: list[str],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--simulate", "h200", "--json", *[a.replace("{}", word) for a in argv]])
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    # A usage error, or (a device) no GPU of that name: never read as another number.
    assert code == 2 and doc["schema"] == "nvmlcheck/error", doc


@pytest.mark.parametrize("argv", [
    ["wait", "--timeout", "1e300"], ["kill", "--grace", "1e300", "1"], ["kill", "--timeout", "1e300", "1"],
    ["select", "--count", "1", "--wait", "1e10"], ["watch", "--for", "1e300"],
])
def test_a_duration_longer_than_any_deadline_is_a_usage_error(argv: list[str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--json", *argv])
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert code == 2 and "at most 1e+09 seconds" in doc["error"]["message"], doc
    # 'none' (or inf) is how to say "no bound".
    assert main(["--simulate", "h200", "wait", "--timeout", "none"]) == 0


def test_slurm_timeouts_are_bounded_on_the_command_line_and_in_the_library(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--json", "slurm", "prolog", "--timeout", "1e300"])
    out, _ = capsys.readouterr()
    assert code == 2 and json.loads(out)["schema"] == "nvmlcheck/error"
    for bad in (1e300, math.inf, -1.0):
        with pytest.raises(ValueError, match="timeout_s must be a finite number"):
            slurm._deadline(lambda: 0, bad)


def test_a_library_grace_too_long_to_count_is_never() -> None:
    # It was int(inf): an OverflowError after the first signal had gone out, the target half-killed.
    assert _grace_ns(1e300) is None and _grace_ns(math.inf) is None and _grace_ns(2.5) == 2_500_000_000


def test_a_library_kill_with_an_endless_grace_and_timeout_signals_and_reports(nvml_stub: StubSession) -> None:
    import signal

    import nvmlcheck as nc
    from nvmlcheck import kill as kill_mod

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        plan = kill_mod.prepare_kill([child.pid])
        with plan, nc.open("nvml") as gpus:
            plan.send_first(signal.SIGTERM)
            result = plan.wait(gpus, timeout=1e300, grace_s=1e300)
        assert child.wait(30) == -signal.SIGTERM
        assert [t.pid for t in result.pids] == [child.pid]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_need_1_is_ambiguous_and_says_how_to_write_either(capsys: pytest.CaptureFixture[str]) -> None:
    # vLLM's gpu_memory_utilization=1 is all of the GPU; --need 1 was one byte, and "ready" with no capacity check.
    code = main(["--simulate", "h200", "--json", "ready", "--need", "1"])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and "1.0 (or 100%)" in doc["error"]["message"] and "1B" in doc["error"]["message"]
    assert main(["--simulate", "h200", "ready", "--need", "1B"]) == 0
    assert main(["--simulate", "h200", "ready", "--need", "1.0"]) == 1  # more than a GPU has with nothing running


@pytest.mark.parametrize("word", ["-1", "+1", "1.0", "all", "0x1"])
def test_a_device_word_that_is_no_index_uuid_or_cuda_selector_is_refused_before_opening(
        word: str, capsys: pytest.CaptureFixture[str]) -> None:
    # No --simulate: nothing would open anyway, and the refusal must come from the parser (exit 2, naming the forms).
    code = main(["--json", "snapshot", f"--devices={word}"])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and "GPU-…, MIG-…" in doc["error"]["message"], doc


def test_minus_zero_seconds_is_zero(capsys: pytest.CaptureFixture[str]) -> None:
    from nvmlcheck.cli._values import seconds_or_none

    value = seconds_or_none("-0")
    assert value == 0 and math.copysign(1.0, value or 0.0) == 1.0


@pytest.mark.parametrize("text", ["1.5B", "0.1KiB", "2.5"])
def test_a_size_is_a_whole_number_of_bytes(text: str) -> None:
    from nvmlcheck._units import parse_size

    # It was truncated (study reclaim --sizes 1.5B ran and recorded 1 byte).
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        parse_size(text)
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("0.9GiB") == round(0.9 * (1 << 30))  # off by under a byte in a million: to the nearest byte
    assert parse_size("0.3MB") == 300_000


@pytest.mark.parametrize("argv", [
    ["ready", "--need", "9" * 400 + "GiB"], ["wait", "--max-used", "9" * 400],
    ["select", "1", "--lock", "--lock-pid", "2147483648"], ["select", "1", "--lock", "--lock-pid", "9" * 20],
])
def test_numbers_too_large_to_be_sizes_or_pids_are_usage_errors(argv: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Each was an OverflowError traceback (float infinity to int; pidfd_open's int): exit 1 and no document.
    code = main(["--simulate", "h200", "--json", *argv])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and doc["schema"] == "nvmlcheck/error", doc


def test_a_byte_count_nvml_cannot_hold_is_refused_by_the_library() -> None:
    import nvmlcheck as nc

    with pytest.raises(nc.ArgumentError, match="below 2\\*\\*64"):
        nc.memory_free_at_least(10**400)


@pytest.mark.parametrize("argv", [
    ["study", "reclaim", "--run-timeout", "\u0663"], ["study", "reclaim", "--budget", "1_0"],
    ["study", "reclaim", "--run-timeout", "1e300"], ["study", "reclaim", "--stage-gap", "nan"],
    ["study", "reclaim", "--ready-timeout", "inf"], ["study", "compare", "--level", "nan", "a", "b"],
    ["study", "compare", "--seed", "1_0", "a", "b"], ["study", "compare", "--resolve-ms", "\u0665", "a", "b"],
    ["simulate", "hold", "--gpu", "0", "--bytes", "1GiB", "--release-ms", "18446744073709551615", "--", "true"],
])
def test_every_duration_and_number_option_reads_ascii_and_is_bounded(argv: list[str],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    # They were plain float()/int(): `--run-timeout ٣` ran with 3 s, `1e300` overflowed after the run started.
    code = main(["--json", *argv])
    doc = json.loads(capsys.readouterr()[0])
    assert code == 2 and doc["schema"] == "nvmlcheck/error", doc


def test_a_size_is_read_exactly_in_every_unit_its_messages_name() -> None:
    # Through a float, 2**53 + 1 bytes read as 2**53 and 2**64 - 1 as "too large"; "at most 16 EiB" named a unit
    # the parser refused.
    from nvmlcheck._units import MAX_BYTES, parse_size
    from nvmlcheck.errors import ArgumentError

    assert parse_size(str(2**53 + 1)) == 2**53 + 1
    assert parse_size(str(MAX_BYTES - 1)) == MAX_BYTES - 1
    assert parse_size("15EiB") == parse_size("15e") == 15 << 60
    assert parse_size("2PiB") == 2 << 50 and parse_size("2PB") == 2 * 10**15 and parse_size("3EB") == 3 * 10**18
    assert parse_size("1.000000000000000001GiB") == 1 << 30  # within a millionth of a byte: the nearest one
    assert parse_size("0.5KiB") == 512
    for text in ("16EiB", "16.0000000001EiB", str(MAX_BYTES), "9" * 70):
        with pytest.raises(ArgumentError, match="too large"):
            parse_size(text)
    with pytest.raises(ArgumentError, match="whole number"):
        parse_size("1.5B")
    with pytest.raises(ArgumentError, match="positive"):
        parse_size("0.0GiB")


def test_a_size_is_printed_in_the_units_it_can_be_given_in() -> None:
    # `ready --need 15EiB` printed "15728640.0 TiB needed" on the H200 (docs/data/h200-2026-12-02d).
    from nvmlcheck._units import format_bytes, parse_size

    assert format_bytes(parse_size("15EiB")) == "15.0 EiB"
    assert format_bytes(3 << 50) == "3.0 PiB" and format_bytes(-(3 << 50)) == "-3.0 PiB"
    assert format_bytes(1023 << 40) == "1023.0 TiB"


def test_an_index_the_host_has_not_is_said_in_words_that_count() -> None:
    # "this host has 1 (indices 0..0)": one GPU said as a range.
    from nvmlcheck.session import _gpus_here

    assert _gpus_here(0) == "this host has no GPU"
    assert _gpus_here(1) == "this host has 1 GPU (index 0)"
    assert _gpus_here(8) == "this host has 8 GPUs (indices 0..7)"


@pytest.mark.parametrize(("n", "text"), [
    ((1 << 30) - 1, "1.0 GiB"),  # was "1024.0 MiB": the unit chosen before rounding
    ((1 << 20) - 1, "1.0 MiB"),
    ((1 << 10) * 1023 + 1000, "1.0 MiB"),
    ((1 << 20) - 53, "1023.9 KiB"),
    (-((1 << 40) - 1), "-1.0 TiB"),
    ((1 << 60) - 1, "1.0 EiB"),
    (1023, "1023 B"),
])
def test_a_size_that_rounds_up_to_the_next_unit_is_said_in_it(n: int, text: str) -> None:
    from nvmlcheck._units import format_bytes

    assert format_bytes(n) == text
