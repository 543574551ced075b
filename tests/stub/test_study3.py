"""The reclamation study's third edition (issue 26) on the stub: pinned host memory, CUDA IPC groups ended in two
stages, managed memory, MPS clients and NCCL ranks (simulated by the stub holder), the skip reasons, the time budget,
the sweeps and their validation, the MPS daemon's plumbing (a fake control program) and the real factory's group
starts (scripted holders: no CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nvmlcheck
from nvmlcheck.cli import main
from nvmlcheck.study import (
    CudaHolderFactory,
    HolderError,
    HolderSpec,
    StudyConfig,
    StudySkipped,
    format_summary,
    run_study,
    summarize,
)
from nvmlcheck.study.compare import compare_records
from nvmlcheck.study.config import Cell
from nvmlcheck.study.holders import LineReader, start_holders
from nvmlcheck.study.mps import MpsDaemon
from nvmlcheck.study.runner import _Budget
from nvmlcheck.study.stub_holder import CONTEXT_BYTES, StubHolderFactory
from nvmlcheck.testing import Scenario, use_stub

pytestmark = [pytest.mark.stub, pytest.mark.usefixtures("nvml_released")]

GIB = 1 << 30
MS = 1_000_000


def _open() -> nvmlcheck.Session:
    return nvmlcheck.open("nvml")


def run(scenario: Scenario, config: StudyConfig, **factory: float) -> list[nvmlcheck.study.RunRecord]:
    with use_stub(scenario) as stub:
        holders = StubHolderFactory(stub.scenario_path, list_ms=10, release_ms=20, kind=config.holder,
                                    **factory)  # type: ignore[arg-type]
        records = run_study(config, session_factory=_open, holder_factory=holders).records
        assert stub.scenario_path.read_text() == scenario.render()  # every holder taken out again
        assert holders.entries == {}
    return list(records)


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        assert isinstance(exc.code, int)
        return exc.code


# --- the sweeps --------------------------------------------------------------------------------------------------


def test_cells_cover_every_combination_once() -> None:
    config = StudyConfig(sizes=(GIB,), holder="ipc", importers=(0, 2), first=("exporter", "importers"), repeats=2,
                         endings=("KILL",))
    assert config.cells() == [Cell(GIB, "KILL", 0, 0, None),  # an exporter alone has no order
                              Cell(GIB, "KILL", 0, 2, "exporter"), Cell(GIB, "KILL", 0, 2, "importers")]
    runs = config.runs()
    assert [(r.cell.importers, r.cell.first, r.repeat, r.warmup) for r in runs[:3]] == [
        (0, None, 0, True), (0, None, 0, False), (0, None, 1, False)]
    assert len(runs) == 9 and config.plan()[1] == (GIB, "KILL", 0, False)
    pinned = StudyConfig(sizes=(0, 8 * GIB), holder="pinned", pinned=[0, 8 * GIB, 0], endings=("KILL",))  # type: ignore[arg-type]
    assert pinned.pinned == (0, 8 * GIB) and [(c.size_bytes, c.pinned_bytes) for c in pinned.cells()] == [
        (0, 0), (0, 8 * GIB), (8 * GIB, 0), (8 * GIB, 8 * GIB)]


@pytest.mark.parametrize(("fields", "match"), [
    ({"pinned": (GIB,)}, "needs the pinned holder"),
    ({"holder": "pinned", "pinned": ()}, "at least one value"),
    ({"holder": "pinned", "pinned": (-1,)}, "int counts >= 0"),
    ({"importers": (1,)}, "needs the ipc holder"),
    ({"holder": "ipc", "importers": (17,)}, "at most 16"),
    ({"holder": "ipc", "first": ("both",)}, "first must name"),
    ({"holder": "pinned", "pin_mode": "mlock"}, "pin_mode"),
    ({"stage_gap_s": -0.1}, "stage_gap_s"),
    ({"stage_gap_s": float("inf")}, "stage_gap_s"),
    # A gap the run's timeout (from the first side's signal) cannot hold: every run of two sides timed out.
    ({"holder": "ipc", "importers": (0, 1), "stage_gap_s": 30.0}, r"stage_gap_s \(30 s\) must be shorter than"),
    ({"holder": "ipc", "importers": (1,), "stage_gap_s": 5.0, "run_timeout_s": 2.0}, "run_timeout_s .2 s."),
    ({"budget_s": 0}, "budget_s"),
    ({"budget_s": float("nan")}, "budget_s"),
    ({"holder": "ipc", "per_gpu": 2}, "per_gpu must be 1"),
    ({"holder": "nccl", "concurrent": "none"}, "concurrent must be 'gpus'"),
    ({"sizes": (0,), "holder": "managed"}, "positive sizes"),
])
def test_bad_sweeps_are_refused(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StudyConfig(**{"sizes": (GIB,), **fields})  # type: ignore[arg-type]


def test_a_long_stage_gap_is_fine_without_a_second_side() -> None:
    assert StudyConfig(sizes=(GIB,), holder="ipc", importers=(0,), stage_gap_s=60.0).stage_gap_s == 60.0
    assert StudyConfig(sizes=(GIB,), holder="ipc", importers=(1,), stage_gap_s=1.9, run_timeout_s=2.0)


def test_budget_refuses_runs_that_would_end_past_it() -> None:
    now = [0.0]
    budget = _Budget(10.0, clock=lambda: now[0])
    a, b = Cell(GIB, "KILL"), Cell(GIB, "TERM")
    assert budget.refuse(a, 0, 5) is None
    budget.took(a, 4.0)
    now[0] = 7.0
    why = budget.refuse(a, 1, 5)
    assert why is not None and "after 1 of 5 runs at 7.0 s" in why and "about 4.0 s" in why
    assert budget.refuse(b, 1, 5) is None  # no estimate for this cell yet: it may start
    now[0] = 10.5
    assert budget.refuse(b, 1, 5) is not None
    assert _Budget(None).refuse(a, 0, 1) is None


def test_a_spent_budget_stops_the_study_with_what_it_has() -> None:
    config = StudyConfig(sizes=(GIB,), repeats=3, endings=("KILL",), warmup="none", budget_s=1e-9)
    with use_stub(Scenario.h200()) as stub:
        result = run_study(config, session_factory=_open,
                           holder_factory=StubHolderFactory(stub.scenario_path, list_ms=10, release_ms=20))
    assert result.records == () and result.stopped is not None and "after 0 of 3 runs" in result.stopped


# --- the kinds on the stub ----------------------------------------------------------------------------------------


def test_pinned_memory_delays_the_release_on_the_stub() -> None:
    config = StudyConfig(sizes=(GIB,), holder="pinned", pinned=(0, 2 * GIB), repeats=1, endings=("KILL",),
                         warmup="none")
    records = run(Scenario.h200(), config, pinned_ms_per_gib=100)
    assert [(r.pinned_bytes, r.pin_mode, r.holder) for r in records] == [(0, "alloc", "pinned"),
                                                                        (2 * GIB, "alloc", "pinned")]
    plain, pinned = (r.devices[0] for r in records)
    assert plain.role == pinned.role == "holder" and plain.held_at_signal_bytes == GIB
    # Lower bounds only (the stub never frees early): 20 ms, and 20 + 2 x 100 ms with 2 GiB pinned.
    assert plain.memory_back_ns is not None and plain.memory_back_ns >= 20 * MS
    assert pinned.memory_back_ns is not None and pinned.memory_back_ns >= 220 * MS
    rows = summarize(records)
    assert [(row.pinned_bytes, row.n) for row in rows] == [(0, 1), (2 * GIB, 1)]
    assert "holder pinned, 2.0 GiB pinned" in format_summary(rows)


def test_ipc_groups_end_in_two_stages() -> None:
    config = StudyConfig(sizes=(GIB,), holder="ipc", importers=(2,), first=("exporter", "importers"), repeats=1,
                         endings=("KILL",), warmup="none", stage_gap_s=0.05)
    exporter_first, importers_first = run(Scenario.h200(), config)
    for r, first_role in ((exporter_first, "exporter"), (importers_first, "importer")):
        assert r.first == ("exporter" if first_role == "exporter" else "importers") and r.stage_gap_s == 0.05
        assert sorted(d.role for d in r.devices) == ["exporter", "importer", "importer"]
        firsts = [d for d in r.devices if d.role == first_role]
        lasts = [d for d in r.devices if d.role != first_role]
        reaped = max((d.signal_ns + (d.waitpid_ns or 0)) for d in firsts)
        # The last side is ended only after the first was reaped, and the gap after that.
        assert all(d.signal_ns >= reaped + 50 * MS for d in lasts)
        assert all(d.memory_back_ns is not None and d.zombie_ns is not None and d.zombie_ns >= 0 for d in r.devices)
    # Ended first, the exporter's allocation stays with the importers (the stub's keeper): still held at their end.
    assert all((d.held_at_signal_bytes or 0) >= GIB for d in exporter_first.devices if d.role == "importer")
    (exporter,) = [d for d in importers_first.devices if d.role == "exporter"]
    assert exporter.held_at_signal_bytes is not None and GIB <= exporter.held_at_signal_bytes <= GIB + 2 * CONTEXT_BYTES
    rows = summarize([exporter_first])
    assert [(row.role, row.n) for row in rows] == [("exporter", 1), ("importer", 2)]
    assert "2 importers, exporter ended first: the importers" in format_summary(rows)
    # Compared from each run's last signal, whichever side it was: one cell, the importers' against the exporter's,
    # and the two importers count once, with the later of their times (when both had exited).
    c = compare_records([exporter_first], [importers_first], across=("first", "role"), stage="last", measure="exited")
    (cell,) = c.cells
    assert (cell.n_a, cell.n_b, cell.role, cell.first) == (1, 1, "*", "*")
    assert cell.median_a == max(d.exited_ns or 0 for d in exporter_first.devices if d.role == "importer")


def test_nccl_ranks_on_two_gpus_and_skipped_on_one() -> None:
    config = StudyConfig(sizes=(GIB,), holder="nccl", repeats=1, endings=("KILL",), warmup="none")
    (r,) = run(Scenario.h200(devices=2), config)
    assert [(d.index, d.role) for d in r.devices] == [(0, "root"), (1, "rank")]
    with use_stub(Scenario.h200()) as stub, pytest.raises(StudySkipped, match="two or more GPUs; 1 selected"):
        run_study(config, session_factory=_open, holder_factory=StubHolderFactory(stub.scenario_path, kind="nccl"))


def test_mps_clients_and_managed_memory_on_the_stub() -> None:
    (mps,) = run(Scenario.h200(), StudyConfig(sizes=(GIB,), holder="mps", repeats=1, endings=("KILL",),
                                              warmup="none"))
    assert mps.devices[0].role == "client" and mps.devices[0].memory_back_ns is not None
    (managed,) = run(Scenario.h200(), StudyConfig(sizes=(GIB,), holder="managed", repeats=1, endings=("KILL",),
                                                  warmup="none"))
    assert managed.holder == "managed" and managed.devices[0].held_at_signal_bytes == GIB


def test_mps_without_a_control_program_is_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    config = StudyConfig(sizes=(GIB,), holder="mps", repeats=1, endings=("KILL",), warmup="none")
    with use_stub(Scenario.h200()), pytest.raises(StudySkipped, match="nvidia-cuda-mps-control is not on PATH"):
        monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control here (the stub is built already)
        run_study(config, session_factory=_open, holder_factory=CudaHolderFactory(kind="mps"))


# --- the MPS daemon, with a fake control program --------------------------------------------------------------------

_CONTROL = """import os, sys
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
assert os.path.isdir(os.environ["CUDA_MPS_LOG_DIRECTORY"])
mode = {mode!r}
if sys.argv[1:] == ["-d"]:
    if mode == "fail":
        print("cannot start", file=sys.stderr); sys.exit(1)
    if mode != "silent":
        open(os.path.join(pipe, "control"), "w").close()
    sys.exit(0)
command = sys.stdin.read().strip()
if command == "get_server_list":
    print("4242"); print("4343")
elif command == "quit" and mode != "stuck":
    os.remove(os.path.join(pipe, "control"))
"""


def fake_control(tmp_path: Path, mode: str = "ok") -> str:
    path = tmp_path / f"control-{mode}"
    path.write_text(f"#!{sys.executable}\n" + _CONTROL.format(mode=mode))
    path.chmod(0o755)
    return str(path)


def test_mps_daemon_starts_answers_and_quits(tmp_path: Path) -> None:
    daemon = MpsDaemon(control=fake_control(tmp_path))
    with daemon:
        assert daemon.control_pipe is not None and daemon.control_pipe.exists()
        directory = daemon.directory
        assert set(daemon.env) == {"CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"}
        assert daemon.server_pids() == frozenset({4242, 4343})
    assert daemon.directory is None and directory is not None and not directory.exists()
    assert daemon.env == {} and daemon.server_pids() == frozenset() and daemon.stop() is None


def test_mps_daemon_failures_skip_the_study(tmp_path: Path) -> None:
    with pytest.raises(StudySkipped, match=r"-d failed \(exit status 1\): cannot start"):
        MpsDaemon(control=fake_control(tmp_path, "fail")).start()
    with pytest.raises(StudySkipped, match="no control pipe"):
        MpsDaemon(control=fake_control(tmp_path, "silent"), timeout_s=0.2).start()
    stuck = MpsDaemon(control=fake_control(tmp_path, "stuck"), timeout_s=0.2)
    stuck.start()
    pipe = stuck.control_pipe
    left = stuck.stop()
    assert left is not None and "still had its control pipe" in left
    assert pipe is not None and pipe.exists()  # left in place: the daemon may still use it
    pipe.unlink()


# --- the real factory's group starts, with scripted holders -----------------------------------------------------

_HOLDER = r"""import json, os, sys
args = sys.argv[1:]
def opt(name, default=None):
    return args[args.index(name) + 1] if name in args else default
with open(os.path.join(os.environ["ARGV_DIR"], str(os.getpid())), "w") as f:
    json.dump(args, f)
role = opt("--role", "holder")
if os.environ.get("FAIL_ROLE") == role:
    sys.exit(3)
if role == "root":
    print("nccl-id " + "ef" * 128, flush=True)
words = " ipc:" + "ab" * 64 if role == "exporter" else ""
print("ready", os.getpid(), args[0], args[1], "init=1" + words, flush=True)
sys.stdin.readline()
"""


class ScriptedGroup(CudaHolderFactory):
    def command(self, device: int, nbytes: int) -> list[str]:
        return [sys.executable, "-S", "-c", _HOLDER, str(nbytes), str(device)]


def _end(holders: list[nvmlcheck.study.Holder]) -> None:
    for h in holders:
        h.exit()
        h.process.wait(10)
        h.close()


def test_group_starts_hand_the_handle_and_the_id_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGV_DIR", str(tmp_path))
    factory = ScriptedGroup(kind="ipc", start_timeout_s=20)
    group = factory.start_group([0], HolderSpec(kind="ipc", nbytes=GIB, importers=2, first="exporter"), 1)
    argv = {h.pid: json.loads((tmp_path / str(h.pid)).read_text()) for h in group}
    assert [(h.role, h.nbytes) for h in group] == [("exporter", GIB), ("importer", 0), ("importer", 0)]
    assert group[0].words == {"ipc": "ab" * 64} and group[0].steps == {"init": 1}
    for h in group[1:]:
        assert argv[h.pid][-4:] == ["--role", "importer", "--ipc-handle", "ab" * 64]
    _end(group)
    ranks = ScriptedGroup(kind="nccl", start_timeout_s=20).start_group([0, 1, 2], HolderSpec(kind="nccl", nbytes=5), 1)
    assert [(h.role, h.device) for h in ranks] == [("root", 0), ("rank", 1), ("rank", 2)]
    second = json.loads((tmp_path / str(ranks[2].pid)).read_text())
    assert second[-8:] == ["--role", "rank", "--rank", "2", "--nranks", "3", "--nccl-id", "ef" * 128]
    _end(ranks)
    pinned = ScriptedGroup(kind="pinned").start_group([0], HolderSpec(kind="pinned", nbytes=0, pinned_bytes=GIB,
                                                                      pin_mode="register"), 2)
    assert len(pinned) == 2
    assert json.loads((tmp_path / str(pinned[0].pid)).read_text())[-4:] == ["--pinned", str(GIB), "--pin-mode",
                                                                           "register"]
    _end(pinned)


def test_a_failed_member_leaves_no_holder_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGV_DIR", str(tmp_path))
    monkeypatch.setenv("FAIL_ROLE", "importer")
    with pytest.raises(HolderError, match=r"holder \(importer\) for 0 B on GPU 0 failed"):
        ScriptedGroup(kind="ipc", start_timeout_s=20).start_group([0], HolderSpec(kind="ipc", nbytes=GIB,
                                                                                  importers=2), 1)
    for name in os.listdir(tmp_path):  # every member, the exporter included, is gone (and reaped)
        assert not Path(f"/proc/{name}").exists()


def test_plain_factories_cannot_start_groups_and_lines_are_kept() -> None:
    class Plain:
        def start(self, device: int, nbytes: int) -> nvmlcheck.study.Holder:
            raise AssertionError("not reached")

        def finish(self, holders: object) -> None:
            pass

    with pytest.raises(HolderError, match="cannot start pinned holders"):
        start_holders(Plain(), [0], HolderSpec(kind="pinned"), 1)
    proc = subprocess.Popen([sys.executable, "-S", "-c", "print('one\\ntwo', flush=True); input()"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    reader = LineReader(proc)
    assert (reader.line(10), reader.line(10)) == (b"one", b"two")  # one read, two lines
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(10)
    assert proc.stdout is not None
    proc.stdout.close()


# --- the CLI ----------------------------------------------------------------------------------------------------


def test_cli_sweeps_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--simulate", "h200", "--json", "study", "reclaim", "--kind", "pinned", "--sizes", "1GiB",
                 "--pinned", "0,1GiB", "--repeats", "1", "--no-warmup", "--endings", "KILL", "--no-phases"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["stopped"] is None
    assert [(r["pinned_bytes"], r["pin_mode"]) for r in doc["records"]] == [(0, "alloc"), (GIB, "alloc")]
    assert [row["pinned_bytes"] for row in doc["summary"]] == [0, GIB]
    for bad in (["--pinned", "8GiB"], ["--kind", "pinned", "--pinned", "8XB"], ["--importers", "1"],
                ["--kind", "ipc", "--importers", "1,x"], ["--kind", "ipc", "--first", "both"],
                ["--stage-gap", "-1"], ["--budget", "0"], ["--kind", "managed", "--sizes", "0"]):
        assert exit_code(["--simulate", "h200", "study", "reclaim", "--sizes", "1GiB", *bad]) == 2, bad
    capsys.readouterr()
    assert exit_code(["--simulate", "h200", "--json", "study", "reclaim", "--kind", "nccl", "--sizes", "1GiB"]) == 3
    err = json.loads(capsys.readouterr().out)
    assert err["error"]["type"] == "StudySkipped" and "two or more GPUs" in err["error"]["message"]


def test_a_value_swept_twice_is_run_once() -> None:
    # --sizes 1GiB,1GiB --repeats 1 ran two runs of one cell (repeat 0 twice); the other sweeps were deduplicated.
    config = StudyConfig(sizes=(GIB, GIB, 2 * GIB), endings=("KILL", "TERM", "KILL"), repeats=1,
                         warmup="none")
    assert config.sizes == (GIB, 2 * GIB) and config.endings == ("KILL", "TERM")
    assert len(config.runs()) == 4


def test_a_size_no_gpu_can_hold_names_the_options_typed(capsys: pytest.CaptureFixture[str]) -> None:
    """The run's own check (room on the GPUs, read once the GPUs are open) names --sizes and --per-gpu as the
    configuration's errors do, not the library's fields (sizes, per_gpu); the library keeps its field names."""
    assert main(["--simulate", "h200", "study", "reclaim", "--sizes", "100GiB", "--per-gpu", "2", "--repeats", "1",
                 "--no-warmup"]) == 2
    err = capsys.readouterr().err
    assert "--sizes 100.0 GiB with --per-gpu 2: 200.0 GiB per GPU is more than GPU 0 can hold" in err, err
