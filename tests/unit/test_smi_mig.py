"""Issue 11, MIG through the smi backend: the full ``-q``'s MIG sections and ``-L``'s MIG UUIDs, read from the fake
nvidia-smi (stubs/fake_nvidia_smi.py) rendering a MIG scenario, and the parser on a constructed capture."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import nvmlcheck as nc
from nvmlcheck.backends import smi_csv
from nvmlcheck.backends.smi import SmiBackend
from nvmlcheck.model import MIB, Fields

ROOT = Path(__file__).resolve().parents[2]
FAKE = [sys.executable, "-S", str(ROOT / "stubs" / "fake_nvidia_smi.py")]
GIB = 1 << 30
MIG0 = "MIG-11111111-2222-3333-4444-000000000000"
MIG1 = "MIG-11111111-2222-3333-4444-000000000001"
IDLE_H100_MIG = 59 * MIB  # public capture, driver 590.48.01


def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *lines: str) -> Path:
    path = tmp_path / "scenario.txt"
    path.write_text("\n".join(["nvmlcheck-stub-scenario 1", *lines]) + "\n", encoding="utf-8")
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(path))
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_SMI_ARGV_LOG", str(log))
    return log


MIG_GPU = (
    f"device index=0 name=NVIDIA_H100 total={81559 * MIB} reserved={550 * MIB} used={IDLE_H100_MIG} mig=1",
    f"mig device=0 index=0 gi=1 ci=0 uuid={MIG0} total={9856 * MIB} used=0",
    f"mig device=0 index=1 gi=2 ci=0 uuid={MIG1} total={9856 * MIB} used=0",
)


def test_idle_mig_gpu_is_clean_and_carries_its_instances(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = scenario(tmp_path, monkeypatch, *MIG_GPU)
    with SmiBackend(command=FAKE) as b:
        snap = b.snapshot(fields=Fields.WAIT)
        d = snap.device(0)
        assert d.mig_mode is True
        assert d.mig_devices is not None
        assert [(m.index, m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in d.mig_devices] == [
            (0, MIG0, 1, 0),
            (1, MIG1, 2, 0),
        ]
        assert all(m.memory is not None and m.memory.total_bytes == 9856 * MIB for m in d.mig_devices)
        assert all(m.processes == () for m in d.mig_devices)
        assert d.memory is not None and d.memory.used_bytes == IDLE_H100_MIG
        assert nc.default_predicate().evaluate(snap).clean
        b.snapshot(fields=Fields.WAIT)
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    # Once MIG was seen, each poll reads the full -q and -L instead of -q -d PIDS (started together, so the log
    # order varies); -q -d PIDS ran once, in the first snapshot, before MIG was known.
    last = runs[-3:]
    assert ["-q"] in last and ["-L"] in last and any(r[0].startswith("--query-gpu=") for r in last)
    assert runs.count(["-q", "-d", "PIDS"]) == 1


def test_loaded_instance_is_not_clean_and_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario(tmp_path, monkeypatch, *MIG_GPU, f"process device=0 kind=compute pid=4242 used={2 * GIB} gi=2 ci=0")
    with SmiBackend(command=FAKE) as b:
        snap = b.snapshot(fields=Fields.WAIT)
    d = snap.device(0)
    assert d.mig_devices is not None
    assert [p.pid for p in d.mig_devices[1].processes or ()] == [4242]
    assert d.mig_devices[0].processes == ()
    assert d.mig_devices[1].memory is not None and d.mig_devices[1].memory.used_bytes == 2 * GIB
    verdict = nc.default_predicate().evaluate(snap)
    assert verdict.satisfied is False
    assert any("pid 4242" in r and MIG1 in r and "GI 2" in r for r in verdict.reasons)


def test_non_mig_gpu_keeps_the_cheap_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = scenario(tmp_path, monkeypatch, "device index=0")
    with SmiBackend(command=FAKE) as b:
        d = b.snapshot(fields=Fields.WAIT).device(0)
    assert d.mig_mode is False and d.mig_devices == ()
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert ["-q"] not in runs and ["-L"] not in runs


def test_mig_unsupported_reads_as_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario(tmp_path, monkeypatch, "device index=0 unsupported=mig")
    with SmiBackend(command=FAKE) as b:
        d = b.snapshot(fields=Fields.WAIT).device(0)
    assert d.mig_mode is False and d.mig_devices == ()


DATA = ROOT / "tests" / "data" / "nvidia-smi" / "constructed-mig-h100"


def test_parser_on_a_constructed_mig_capture() -> None:
    listing = smi_csv.parse_pids_query((DATA / "q.stdout").read_text(encoding="utf-8"))
    bus = "00000000:18:00.0"
    assert listing.mig_mode[bus] is True
    devices = listing.mig_devices[bus]
    assert [(m.index, m.gpu_instance_id, m.compute_instance_id) for m in devices] == [(0, 1, 0), (1, 2, 0)]
    assert devices[0].memory is not None and devices[0].memory.used_bytes == 2057 * MIB
    assert devices[1].memory is not None and devices[1].memory.used_bytes == 13 * MIB
    (p,) = listing.compute[bus]
    assert (p.pid, p.gpu_instance_id, p.compute_instance_id, p.used_bytes) == (31337, 1, 0, None)
    uuids = smi_csv.parse_list_gpus((DATA / "L.stdout").read_text(encoding="utf-8"))
    assert uuids[0][1].startswith("MIG-")


def test_an_unreadable_mig_block_makes_the_mig_devices_unknown_not_the_snapshot() -> None:
    text = (DATA / "q.stdout").read_text(encoding="utf-8").replace("2057 MiB", "2057 GiB")
    listing = smi_csv.parse_pids_query(text)
    bus = "00000000:18:00.0"
    assert bus not in listing.mig_devices
    line_no = text.split("\n").index("                Used                                   : 2057 GiB") + 1
    assert "2057 GiB" in listing.mig_unknown[bus] and f"line {line_no}:" in listing.mig_unknown[bus]
    assert [p.pid for p in listing.compute[bus]] == [31337]  # the process list still stands


def test_an_nvidia_smi_without_the_mig_field_leaves_mig_unknown_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario(tmp_path, monkeypatch, *MIG_GPU)
    monkeypatch.setenv("FAKE_SMI_REFUSE_FIELDS", "mig.mode.current")
    with SmiBackend(command=FAKE) as b:
        snap = b.snapshot(fields=Fields.WAIT)
        again = b.snapshot(fields=Fields.WAIT)
    d = snap.device(0)
    assert d.mig_mode is None and d.mig_devices is None
    assert "mig.mode.current" in (d.why_unknown("mig") or "")
    assert again.device(0).mig_mode is None
    # Judged as before MIG: 59 MiB with no process is not clean (the allowance needs MIG mode known).
    assert not nc.default_predicate().evaluate(snap).clean


def test_real_h200_capture_reads_mig_off() -> None:
    text = (ROOT / "tests/data/nvidia-smi/h200x2-mig-mode/query_mig_mode.stdout").read_text(encoding="utf-8")
    text = text.replace("index, mig", "index, uuid, mig").replace("0, Disabled", "0, GPU-0, Disabled")
    text = text.replace("1, Disabled", "1, GPU-1, Disabled")
    records, failures = smi_csv.parse_query_gpu(text)
    assert not failures and [r.mig_mode for r in records] == [False, False]


def test_replayed_mig_capture_end_to_end() -> None:
    replay = ROOT / "tests" / "data" / "nvidia-smi" / "replay" / "smi_replay.py"
    with SmiBackend(command=[sys.executable, "-S", str(replay), str(DATA)]) as b:
        snap = b.snapshot(fields=Fields.WAIT)
    d = snap.device(0)
    assert d.mig_mode is True and d.mig_devices is not None
    busy, idle = d.mig_devices
    assert busy.uuid == "MIG-3b0a1c5e-7d2f-5a8b-9c4e-1f6a2b7c8d90" and [p.pid for p in busy.processes or ()] == [31337]
    assert idle.processes == () and idle.memory is not None and idle.memory.used_bytes == 13 * MIB
    assert "Not available" in (d.why_unknown("processes.used_bytes") or "")
    verdict = nc.default_predicate().evaluate(snap)
    assert verdict.satisfied is False
    assert any("pid 31337" in r and "unknown amount" in r and "GI 1" in r for r in verdict.reasons)
    assert nc.on_devices([idle.uuid or ""], nc.default_predicate()).evaluate(snap).clean


def test_a_mig_device_using_more_than_it_has_fails_its_gpu_not_the_output() -> None:
    # As NVML's CorruptData on a MIG handle fails that GPU: its lists and MIG devices are not given, and no error
    # escapes for the output as a whole (another GPU's block would still be read).
    text = (DATA / "q.stdout").read_text(encoding="utf-8")
    used = "Used                                   : 2057 MiB"
    assert used in text
    listing = smi_csv.parse_pids_query(text.replace(used, used.replace("2057", "99999"), 1))
    (gpu, error), = listing.failed.items()
    assert gpu == "00000000:18:00.0" and isinstance(error, nc.CorruptData) and "99999 MiB" in str(error)
    assert gpu not in listing.compute and gpu not in listing.mig_devices


def test_a_gpu_nvidia_smi_L_cannot_read_costs_only_its_own_mig_uuids() -> None:
    text = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)\n"
            "  MIG 1g.18gb     Device  0: (UUID: MIG-aaaaaaaa-0000-5000-8000-000000000000)\n"
            "Unable to determine the device handle for GPU0000:02:00.0: Unknown Error\n"
            "GPU 2: NVIDIA H200 (UUID: GPU-cccccccc-0000-0000-0000-000000000000)\n"
            "  MIG 1g.18gb     Device  0: (UUID: MIG-GPU-cccccccc-0000-0000-0000-000000000000/7/0)\n")
    uuids = smi_csv.parse_list_gpus(text)
    assert dict(uuids[0]) == {0: "MIG-aaaaaaaa-0000-5000-8000-000000000000"}
    assert dict(uuids[2]) == {0: "MIG-GPU-cccccccc-0000-0000-0000-000000000000/7/0"}  # the name before R470
    assert 1 not in uuids


def test_a_mig_line_after_an_unreadable_gpu_is_never_given_to_the_gpu_before_it() -> None:
    text = ("GPU 0: NVIDIA H200 (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)\n"
            "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost\n"
            "  MIG 1g.18gb     Device  0: (UUID: MIG-bbbbbbbb-0000-5000-8000-000000000000)\n")
    with pytest.raises(nc.SmiParseError):
        smi_csv.parse_list_gpus(text)


@pytest.mark.parametrize("mig", [True, False])
def test_the_identity_alone_carries_the_mig_mode_as_with_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mig: bool
) -> None:
    # The CUDA mapping reads identities only (Fields(0)): a mode left None there refused every cuda:N with this
    # backend, MIG or not.
    lines = MIG_GPU if mig else (MIG_GPU[0].replace(" mig=1", ""),)
    scenario(tmp_path, monkeypatch, *lines, "device index=1 name=NVIDIA_H100")
    with SmiBackend(command=FAKE) as b:
        ident = b.snapshot(fields=Fields(0))
    assert [d.mig_mode for d in ident.devices] == [mig, False]
    mapping = nc.cuda_mapping(ident.devices, {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert (mapping.devices is None) is mig


def test_a_gpu_line_without_a_readable_uuid_keeps_its_mig_devices_and_the_others() -> None:
    text = ("GPU 0: NVIDIA H200 (UUID: [GPU requires reset])\n"
            "  MIG 1g.18gb     Device  0: (UUID: MIG-aaaaaaaa-0000-5000-8000-000000000000)\n"
            "GPU 1: NVIDIA H200 (UUID: GPU-bbbbbbbb-0000-0000-0000-000000000000)\n"
            "  MIG 1g.18gb     Device  3: (UUID: MIG-bbbbbbbb-0000-5000-8000-000000000003)\n")
    uuids = smi_csv.parse_list_gpus(text)
    assert dict(uuids[0]) == {0: "MIG-aaaaaaaa-0000-5000-8000-000000000000"}
    assert dict(uuids[1]) == {3: "MIG-bbbbbbbb-0000-5000-8000-000000000003"}


def _run_L(text: str) -> object:
    from nvmlcheck.backends.smi import SmiResult

    return SmiResult(("nvidia-smi", "-L"), ("-L",), 0, text, "", 0)


@pytest.mark.parametrize(("listed", "why"), [
    # An instance destroyed between -q and -L: -L's "Device 0" is what -q read as device 1.
    ("  MIG 1g.18gb     Device  0: (UUID: MIG-bbbbbbbb-0000-5000-8000-000000000000)\n", "changed between"),
    # The name of drivers before R470 carries GI/CI: -L's device 0 is GI 2, -q's device 0 is GI 1.
    ("  MIG 1g.18gb     Device  0: (UUID: MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/2/0)\n"
     "  MIG 1g.18gb     Device  1: (UUID: MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/1/0)\n", "changed between"),
])
def test_mig_uuids_are_never_matched_to_another_instance(
    listed: str, why: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """-q and -L are two runs: matched by device index, a UUID could land on another instance when instances came
    or went between them, and a wait on that UUID would judge the other tenant. Unknown, with the reason."""
    import dataclasses as dc
    from types import SimpleNamespace

    from nvmlcheck.backends._smi_state import ProcessLists
    from nvmlcheck.model import MigDevice

    q = (MigDevice(0, None, 1, 0, None, None), MigDevice(1, None, 2, 0, None, None))
    lists = {"GPU-a": ProcessLists((), (), (), {}, q)}
    text = "GPU 0: NVIDIA H200 (UUID: GPU-aaaaaaaa-0000-0000-0000-000000000000)\n" + listed
    scenario(tmp_path, monkeypatch, *MIG_GPU)
    b = SmiBackend(command=FAKE)
    b._add_mig_uuids(_run_L(text), [SimpleNamespace(index=0, uuid="GPU-a")], lists)  # type: ignore[arg-type, list-item]
    got = lists["GPU-a"].mig_devices or ()
    assert [m.uuid for m in got] == [None, None]
    assert all(why in m.unknown["uuid"] for m in got), [m.unknown for m in got]
    # Both lists agree: matched as before.
    lists = {"GPU-a": ProcessLists((), (), (), {}, q)}
    same = ("  MIG 1g.18gb     Device  0: (UUID: MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/1/0)\n"
            "  MIG 1g.18gb     Device  1: (UUID: MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/2/0)\n")
    b._add_mig_uuids(_run_L(text.splitlines(True)[0] + same), [SimpleNamespace(index=0, uuid="GPU-a")],  # type: ignore[arg-type, list-item]
                     lists)
    assert [m.uuid for m in lists["GPU-a"].mig_devices or ()] == [
        "MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/1/0", "MIG-GPU-aaaaaaaa-0000-0000-0000-000000000000/2/0"]
    assert dc.is_dataclass(lists["GPU-a"])
    b.close()
