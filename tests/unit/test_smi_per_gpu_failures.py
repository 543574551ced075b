"""One GPU's part of nvidia-smi's output that cannot be read fails that GPU alone (a ``DeviceFailure`` with the parse
error or ``CorruptData``), as NVML fails one GPU alone; the others still report. Output that no single GPU explains is
refused whole, and a damaged reading is never an idle GPU. Replayed end to end through
tests/data/nvidia-smi/replay/smi_replay.py from text written here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.backends.smi import SmiBackend
from nvmlcheck.errors import CorruptData, SmiParseError
from nvmlcheck.model import Fields

REPLAY = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi" / "replay" / "smi_replay.py"
HEADER = (
    "index, name, uuid, pci.bus_id, serial, driver_version, memory.total [MiB], memory.used [MiB], "
    "memory.free [MiB], memory.reserved [MiB], mig.mode.current"
)
VERSION = "NVIDIA-SMI version  : 580.159.04\nNVML version        : 580.159\nDRIVER version      : 580.159.04\n" \
          "CUDA Version        : 13.0\n"  # fmt: skip
Q_HEAD = "\n==============NVSMI LOG==============\n\nDriver Version : 580.159.04\nCUDA Version : 13.0\n\n"


def uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def row(i: int, used: str = "0") -> str:
    pci = f"00000000:{i + 1:02X}:00.0"
    return f"{i}, NVIDIA H200, {uuid(i)}, {pci}, 1653, 580.159.04, 143771, {used}, 143155, 616, [N/A]"


def process(pid: str, used: str = "1024 MiB", kind: str = "C", name: str = "/bin/holder") -> str:
    return (
        f"        GPU instance ID : N/A\n        Compute instance ID : N/A\n        Process ID : {pid}\n"
        f"            Type : {kind}\n            Name : {name}\n            Used GPU Memory : {used}\n"
    )


def block(i: int, *processes: str) -> str:
    if not processes:
        return f"GPU 00000000:{i + 1:02X}:00.0\n    Processes : None\n"
    return f"GPU 00000000:{i + 1:02X}:00.0\n    Processes\n" + "".join(processes)


class Replay:
    """A directory of recorded answers, rewritten between snapshots."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        (tmp / "version.stdout").write_text(VERSION)
        self.gpus(row(0), row(1), row(2))
        self.pids(block(0), block(1), block(2))

    def gpus(self, *rows: str) -> None:
        (self.dir / "query_gpu.csv").write_text("\n".join([HEADER, *rows]) + "\n")

    def pids(self, *blocks: str) -> None:
        (self.dir / "q_pids.stdout").write_text(Q_HEAD + "".join(blocks))

    def open(self) -> SmiBackend:
        return SmiBackend(command=[sys.executable, "-S", str(REPLAY), str(self.dir)])


@pytest.fixture
def replay(tmp_path: Path) -> Replay:
    return Replay(tmp_path)


def assert_gpu1_alone_failed(snap: nc.Snapshot, error: type[Exception], text: str) -> Exception:
    assert [d.index for d in snap.devices] == [0, 2]
    (failure,) = snap.failures
    assert (failure.index, failure.uuid) == (1, uuid(1))
    assert isinstance(failure.error, error) and text in str(failure.error)
    return failure.error


@pytest.mark.parametrize(
    ("damaged", "error", "text"),
    [
        (row(1, used="abc"), SmiParseError, "'abc' is not a whole number"),
        (row(1, used="1,5"), SmiParseError, "columns"),  # a localised decimal comma
        (row(1, used="99999999999999999999999"), SmiParseError, "not a whole number"),  # no 23-digit MiB
        (row(1, used="200000"), CorruptData, "exceed memory.total"),
        (row(1).replace("143771", "99999999999999999999"), CorruptData, "more than 2^64 bytes"),  # 20 digits
    ],
)
def test_a_damaged_query_gpu_row_fails_its_gpu_alone(
    replay: Replay, damaged: str, error: type[Exception], text: str
) -> None:
    with replay.open() as backend:
        replay.gpus(row(0), damaged, row(2))
        snap = backend.snapshot(fields=Fields.MEMORY)
        err = assert_gpu1_alone_failed(snap, error, text)
        if isinstance(err, SmiParseError):
            assert err.argv and any(a.startswith("--query-gpu=") for a in err.argv)  # names the command
        assert nc.default_predicate().evaluate(snap).satisfied is not True


def test_a_damaged_row_that_names_no_gpu_fails_the_gpu_without_a_row(replay: Replay) -> None:
    with replay.open() as backend:
        replay.gpus(row(0), "1 GPU-?, 143771", row(2))  # neither its index nor its UUID can be read
        snap = backend.snapshot(fields=Fields.MEMORY)
        assert_gpu1_alone_failed(snap, SmiParseError, "columns")


def test_a_damaged_row_that_names_no_gpu_when_every_gpu_has_a_row_refuses_the_output(replay: Replay) -> None:
    # Whose row was it? A second row for one of them, say: nvidia-smi contradicts itself, and nothing is read.
    with replay.open() as backend:
        replay.gpus(row(0), row(1), row(2), "1 GPU-?, 143771")
        with pytest.raises(SmiParseError, match="columns"):
            backend.snapshot(fields=Fields.MEMORY)


@pytest.mark.parametrize(
    ("damaged", "error", "text"),
    [
        (block(1, process("0")), CorruptData, "process id 0 is impossible"),
        (block(1, process("77", used="999999 MiB")), CorruptData, "more than the GPU's"),
        (block(1, process("77", kind="X")), SmiParseError, "process Type 'X'"),
        (block(1, process("77", used="12 GiB")), SmiParseError, "is not 'N MiB'"),
        ("GPU 00000000:02:00.0\n    Processes : Some\n", SmiParseError, "Processes reads 'Some'"),
    ],
)
def test_a_damaged_q_block_fails_its_gpu_alone(
    replay: Replay, damaged: str, error: type[Exception], text: str
) -> None:
    with replay.open() as backend:
        replay.pids(block(0, process("55")), damaged, block(2))
        snap = backend.snapshot(fields=Fields.WAIT)
    assert_gpu1_alone_failed(snap, error, text)
    assert [p.pid for p in snap.device(0).processes or ()] == [55]
    assert snap.device(2).processes == ()


def test_a_damaged_block_of_a_gpu_not_read_refuses_the_output(replay: Replay) -> None:
    # A process name with line breaks can print a made-up GPU block: the lines after it are GPU 1's, not that GPU's,
    # so failing the made-up GPU alone would read GPU 1 short (pid 78 lost). The whole output is refused instead.
    evil = "evil\n            Used GPU Memory : 0 MiB\nGPU 00000000:77:00.0\n    Processes : None"
    with replay.open() as backend:
        replay.pids(block(0), block(1, process("77", name=evil), process("78")), block(2))
        with pytest.raises(SmiParseError, match="outside a Processes section"):
            backend.snapshot(fields=Fields.WAIT)


def test_one_gpu_block_printed_twice_refuses_the_output(replay: Replay) -> None:
    with replay.open() as backend:
        replay.pids(block(0), block(1, process("77")), block(2), block(1))
        with pytest.raises(SmiParseError, match="printed twice"):
            backend.snapshot(fields=Fields.WAIT)


def test_an_impossible_pid_in_compute_apps_fails_its_gpu_alone(replay: Replay) -> None:
    apps = (
        f"gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n{uuid(0)}, 55, a, 1\n{uuid(1)}, 0, b, 1\n"
    )
    (replay.dir / "apps.stdout").write_text(apps)
    script = replay.dir / "apps-smi.sh"
    # The replay has no --query-compute-apps: answer it here, everything else through the replay.
    script.write_text(
        f'#!/bin/sh\ncase "$*" in *--query-compute-apps*) cat "{replay.dir}/apps.stdout"; exit 0;; esac\n'
        f'exec "{sys.executable}" -S "{REPLAY}" "{replay.dir}" "$@"\n'
    )
    script.chmod(0o755)
    with SmiBackend(command=[str(script)], process_query="compute-apps") as backend:
        snap = backend.snapshot(fields=Fields.WAIT)
    assert_gpu1_alone_failed(snap, CorruptData, "process id 0 is impossible")
    assert [p.pid for p in snap.device(0).compute_processes or ()] == [55]


def test_a_damaged_identity_row_fails_its_gpu_until_it_reads(replay: Replay) -> None:
    # GPU 1's PCI bus id is no bus id when the backend opens: GPU 1 fails (as NVML fails a GPU whose identity it cannot
    # read), with that error, on every pass until its identity reads; it is never taken for a GPU that moved.
    replay.gpus(row(0), row(1).replace("00000000:02:00.0", "bogus"), row(2))
    with replay.open() as backend:
        assert backend.device_count() == 3
        for _ in range(2):
            snap = backend.snapshot(fields=Fields.WAIT)
            err = assert_gpu1_alone_failed(snap, SmiParseError, "'bogus' is not a PCI bus id")
            assert "renumbered" not in str(err)
        replay.gpus(row(0), row(1), row(2))  # it reads now
        snap = backend.snapshot(fields=Fields.WAIT)
        assert [d.index for d in snap.devices] == [0, 1, 2] and snap.failures == ()
        d1 = snap.device(1)
        assert (d1.uuid, d1.pci_bus_id, d1.name) == (uuid(1), "00000000:02:00.0", "NVIDIA H200")
        assert d1.processes == ()
        assert [d.index for d in backend.snapshot([1], Fields.WAIT).devices] == [1]  # -i still names it


def test_a_damaged_identity_row_without_its_index_pins_no_uuid_to_a_guessed_index(replay: Replay) -> None:
    # GPU 1's index cannot be read when the backend opens: index 1 (the gap) is a failure until a row reads, and its
    # UUID is not pinned there on a guess; once it reads, it is GPU 1 with its own index.
    replay.gpus(row(0), "x" + row(1), row(2))
    with replay.open() as backend:
        snap = backend.snapshot(fields=Fields.MEMORY)
        assert [d.index for d in snap.devices] == [0, 2] and [f.index for f in snap.failures] == [1]
        assert backend._identity[1].uuid == ""
        replay.gpus(row(0), row(1), row(2))
        snap = backend.snapshot(fields=Fields.MEMORY)
        assert [(d.index, d.uuid) for d in snap.devices] == [(i, uuid(i)) for i in range(3)]


def test_a_row_whose_index_is_a_placeholder_fails_the_gpu_its_uuid_names(replay: Replay) -> None:
    with replay.open() as backend:
        replay.gpus(row(0), "[Unknown Error]" + row(1)[1:], row(2))
        snap = backend.snapshot(fields=Fields.MEMORY)
    assert_gpu1_alone_failed(snap, nc.Unknown, "its index reads [Unknown Error]")
