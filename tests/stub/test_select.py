"""``cuda:N`` selectors, ``nvmlcheck select`` / ``Session.select_clean`` and the advisory GPU locks, on the stub.

No wall-clock durations are asserted: waits are driven by the stub's timeline (a lower bound at most), and the lock
tests wait for an event (a holder's exit) with a generous cap that only guards against a hang.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck.cudamap import CudaMappingError
from nvmlcheck.locks import lock_info, try_lock
from nvmlcheck.selection import SelectTimeout
from nvmlcheck.testing import Scenario, StubProbe, build_stub, use_stub

from .conftest import gone_within

pytestmark = pytest.mark.stub
GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[2]


def uuid(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012d}"


def mixed(devices: int = 4, busy: tuple[int, ...] = (1,)) -> Scenario:
    """Idle H200s (stub UUIDs ...000i, PCI bus i+1) with a 16 GiB process on each ``busy`` GPU."""
    sc = Scenario.h200(devices=devices)
    for n, d in enumerate(busy):
        sc.add_process(d, 4_100_000 + n, used_bytes=16 * GIB)
    return sc


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No CUDA variables from the machine running the tests; a private lock directory; NVML shut down after."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("NVMLCHECK_LOCK_DIR", str(tmp_path / "locks"))
    yield
    assert StubProbe(build_stub()).init_refcount() == 0, "this test left NVML initialised"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- cuda:N in every --devices ----------------------------------------------------------------------------------------


def test_cuda_selectors_resolve_through_cuda_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{uuid(3)},{uuid(1)}")
    with use_stub(mixed(), tmp_dir=tmp_path), nc.open("nvml") as gpus:
        assert gpus.resolve("cuda:0") == (3,)
        assert gpus.resolve(["cuda:1", 0]) == (0, 1)
        assert gpus.resolve("cuda:all") == (1, 3)
        assert [d.index for d in gpus.snapshot("cuda:0").devices] == [3]
        mapping = gpus.cuda_mapping()
        assert mapping.devices is not None and [d.uuid for d in mapping.devices] == [uuid(3), uuid(1)]
        with pytest.raises(CudaMappingError) as err:
            gpus.resolve("cuda:2")
    text = str(err.value)
    assert "cuda:2: no such CUDA device" in text
    assert f"CUDA_VISIBLE_DEVICES='{uuid(3)},{uuid(1)}'" in text and f"cuda:0 -> GPU 3 {uuid(3)}" in text


def test_cli_devices_cuda_and_its_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(mixed().write(tmp_path / "sc.txt"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    code, out, _ = run(capsys, "--simulate", path, "--json", "snapshot", "--devices", "cuda:0")
    assert code == 0 and [d["index"] for d in json.loads(out)["devices"]] == [2]
    # `wait --devices cuda:all` judges GPUs 2 and 0 only: GPU 1's process does not matter.
    code, _, _ = run(capsys, "--simulate", path, "wait", "--timeout", "0", "--devices", "cuda:all")
    assert code == 0
    code, _, err = run(capsys, "--simulate", path, "wait", "--timeout", "0", "--devices", "cuda:5")
    assert code == 2
    assert "cuda:5: no such CUDA device" in err and "CUDA_VISIBLE_DEVICES='2,0'" in err and "cuda:1 -> GPU 0" in err
    code, out, _ = run(capsys, "--simulate", path, "--json", "snapshot", "--devices", "cuda:5")
    doc = json.loads(out)
    assert code == 2 and doc["schema"] == "nvmlcheck/error" and "cuda:1 -> GPU 0" in doc["error"]["message"]
    code, _, err = run(capsys, "--simulate", path, "snapshot", "--devices", "cuda:x")
    assert code == 2 and "expected cuda:N" in err
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    code, _, err = run(capsys, "--simulate", path, "snapshot", "--devices", "cuda:0")
    assert code == 2 and "MIG" in err


def test_fastest_first_with_mixed_models_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario()
    sc.add_device(name="NVIDIA A100-SXM4-80GB")
    sc.add_device(name="NVIDIA H200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with use_stub(sc, tmp_dir=tmp_path), nc.open("nvml") as gpus:
        with pytest.raises(CudaMappingError, match="not all one model"):
            gpus.resolve("cuda:0")
        monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        assert gpus.resolve("cuda:0") == (1,)


# --- select: the API --------------------------------------------------------------------------------------------------


def test_select_clean_picks_the_lowest_clean_gpus_and_says_why_others_were_passed_over(tmp_path: Path) -> None:
    with use_stub(mixed(busy=(0, 2)), tmp_dir=tmp_path), nc.open("nvml") as gpus:
        chosen = gpus.select_clean(2)
        assert chosen.indices == (1, 3) and chosen.uuids == (uuid(1), uuid(3))
        assert chosen.locks is None and chosen.polls == 1
        assert any(line.startswith("GPU 0: pid 4100000") for line in chosen.passed_over)
        with pytest.raises(SelectTimeout) as err:
            gpus.select_clean(3, timeout=0)
        assert err.value.count == 3 and err.value.clean == (1, 3)
        assert "2 of the 3 asked for" in str(err.value) and "GPU 2: pid 4100001" in str(err.value)
        again = pickle.loads(pickle.dumps(err.value))
        assert (again.count, again.clean, str(again)) == (3, (1, 3), str(err.value))
        # The candidates can be narrowed; asking for more than there are is a usage error, not a timeout.
        assert gpus.select_clean(1, devices=[2, 3]).indices == (3,)
        with pytest.raises(ValueError, match="asked for 3 clean GPU"):
            gpus.select_clean(3, devices=[2, 3])
        with pytest.raises(ValueError, match="count must be"):
            gpus.select_clean(0)


def test_select_passes_over_a_gpu_that_needs_a_reset_or_whose_health_is_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An idle GPU with a pending row remap is clean but not usable (ready refuses it): select chose it before.
    sc = mixed(devices=3, busy=())
    sc.set_device(0, remapped_rows=(0, 0, 1, 0))
    sc.fault("nvmlDeviceGetRemappedRows", 999, device=1)  # NVML_ERROR_UNKNOWN: supported, but unreadable
    with use_stub(sc, tmp_dir=tmp_path):
        with nc.open("nvml") as gpus:
            assert gpus.select_clean(1).indices == (2,)
            with pytest.raises(SelectTimeout) as err:
                gpus.select_clean(2)
            assert err.value.clean == (2,)
            assert any(line.startswith("GPU 0: a row remapping is pending") for line in err.value.culprits)
            assert any(line.startswith("GPU 1: health.remapped_rows could not be read") for line in err.value.culprits)
            assert [(h.gpu, h.class_) for h in err.value.holders] == [(0, "unhealthy"), (1, "unknown")]
            assert gpus.select_clean(3, health=False).indices == (0, 1, 2)  # the predicate alone, as asked
        code, out, err_text = run(capsys, "select", "1")
        assert (code, out.strip()) == (0, "2")
        code, out, err_text = run(capsys, "select", "2")
        assert code == 1 and out == "" and "row remapping is pending" in err_text
        code, out, _ = run(capsys, "select", "3", "--no-health", "--format", "index")
        assert (code, out.strip()) == (0, "0,1,2")


def test_select_clean_waits_for_a_gpu_to_become_clean(tmp_path: Path) -> None:
    sc = mixed(devices=2, busy=(1,))
    sc.at_call(40).remove_process(1, 4_100_000)
    calls: list[float] = []
    with use_stub(sc, tmp_dir=tmp_path), nc.open("nvml") as gpus:
        # The injected sleep records the pauses: the clean moment is reached by the stub's call count, not by time.
        chosen = gpus.select_clean(2, timeout=None, interval=0.0, sleep=calls.append)
    assert chosen.indices == (0, 1) and chosen.polls > 1 and len(calls) == chosen.polls - 1


def test_select_clean_stable_polls(tmp_path: Path) -> None:
    with use_stub(mixed(devices=1, busy=()), tmp_dir=tmp_path), nc.open("nvml") as gpus:
        assert gpus.select_clean(1, stable_polls=3, timeout=None, interval=0.0).polls == 3
        with pytest.raises(SelectTimeout, match="clean for 1 of 3 polls"):
            gpus.select_clean(1, stable_polls=3, timeout=0)


def test_select_clean_with_lock_passes_over_locked_gpus(tmp_path: Path) -> None:
    locks = tmp_path / "api-locks"
    with use_stub(mixed(devices=3, busy=()), tmp_dir=tmp_path), nc.open("nvml") as gpus:
        first = gpus.select_clean(2, lock=True, lock_dir=locks)
        assert first.indices == (0, 1) and first.locks is not None and first.locks.uuids == (uuid(0), uuid(1))
        # flock belongs to the open file: a second selection, even in this process, cannot take them.
        second = gpus.select_clean(1, lock=True, lock_dir=locks)
        assert second.indices == (2,)
        assert any("GPU 0: locked by another process" in line for line in second.passed_over)
        with pytest.raises(SelectTimeout, match="locked by another process"):
            gpus.select_clean(1, lock=True, lock_dir=locks)
        assert second.locks is not None
        second.locks.release()
        first.locks.release()
        assert gpus.select_clean(3, lock=True, lock_dir=locks).indices == (0, 1, 2)


# --- select: the CLI --------------------------------------------------------------------------------------------------


def test_cli_select_formats_and_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(mixed(devices=4, busy=(0,)).write(tmp_path / "sc.txt"))
    assert run(capsys, "--simulate", path, "select", "--count", "2")[:2] == (0, "1,2\n")
    assert run(capsys, "--simulate", path, "select", "--count", "2", "--format", "index")[:2] == (0, "1,2\n")
    assert run(capsys, "--simulate", path, "select", "--count", "1", "--format", "uuid")[:2] == (0, uuid(1) + "\n")
    # --format cuda numbers GPUs for a *new* CUDA_VISIBLE_DEVICES (absolute, not relative to the current one), and
    # --devices cuda:all limits the candidates to what the current one shows.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,0")
    assert run(capsys, "--simulate", path, "select", "--count", "1", "--devices", "cuda:all")[:2] == (0, "3\n")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    code, out, err = run(capsys, "--simulate", path, "select", "--count", "4")
    assert code == 1 and out == ""
    assert "3 of the 4 asked for" in err and "GPU 0: pid 4100000" in err
    code, out, _ = run(capsys, "--simulate", path, "--json", "select", "--count", "4")
    doc: dict[str, Any] = json.loads(out)
    assert code == 1 and (doc["schema"], doc["version"], doc["found"], doc["value"]) == ("nvmlcheck/select", 2, False,
                                                                                          None)
    assert any("GPU 0" in line for line in doc["passed_over"])
    code, out, _ = run(capsys, "--simulate", path, "--json", "select", "--count", "2", "--max-used", "32GiB",
                       "--format", "index")
    doc = json.loads(out)
    # --max-used does not forgive a process: GPU 0 still has one.
    assert code == 0 and doc["found"] is True and doc["value"] == "1,2" and doc["lock"] is None
    assert [d["uuid"] for d in doc["selected"]] == [uuid(1), uuid(2)]
    # The nvidia-smi backend gives the same answer (the fake nvidia-smi renders the same scenario).
    code, out, _ = run(capsys, "--simulate", path, "--backend", "smi", "select", "--count", "2", "--format", "uuid")
    assert (code, out) == (0, f"{uuid(1)},{uuid(2)}\n")
    assert run(capsys, "--simulate", path, "select", "--count", "5")[0] == 2
    assert run(capsys, "--simulate", path, "select")[0] == 2  # --count is required
    assert run(capsys, "--simulate", path, "select", "--count", "1", "--count", "2")[0] == 2


def test_cli_select_format_cuda_refuses_before_waiting_when_numbers_are_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sc = Scenario()
    sc.add_device(name="NVIDIA A100-SXM4-80GB")
    sc.add_device(name="NVIDIA H200")
    path = str(sc.write(tmp_path / "sc.txt"))
    code, _, err = run(capsys, "--simulate", path, "select", "--count", "1", "--wait", "600")
    assert code == 2 and "--format uuid" in err and "not all one model" in err
    assert run(capsys, "--simulate", path, "select", "--count", "1", "--format", "uuid")[:2] == (0, uuid(0) + "\n")


# --- locks across processes -------------------------------------------------------------------------------------------


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["NVMLCHECK_LOCK_DIR"] = str(tmp_path / "locks")
    return env


def _select(path: str, env: dict[str, str], owner: int, count: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nvmlcheck", "--simulate", path, "--json", "select", "--count", str(count),
         "--format", "index", "--lock-pid", str(owner), *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )



@pytest.mark.parametrize(("devices", "winners"), [(4, 2), (3, 1)])
def test_racing_selects_get_disjoint_sets_and_locks_end_with_their_owner(
    tmp_path: Path, owner: subprocess.Popen[bytes], devices: int, winners: int
) -> None:
    path = str(mixed(devices=devices, busy=()).write(tmp_path / "sc.txt"))
    env = _env(tmp_path)
    racers = [_select(path, env, owner.pid, 2) for _ in range(2)]
    results = [(r.wait(timeout=60), *r.communicate()) for r in racers]
    docs = [json.loads(out) for _, out, _ in results]
    won = [set(d["selected"][i]["index"] for i in range(2)) for d in docs if d["found"]]
    assert len(won) == winners, results
    assert [code for code, _, _ in results].count(0) == winners
    if winners == 2:
        assert not won[0] & won[1]  # disjoint
    else:
        loser = next(d for d in docs if not d["found"])
        assert any("locked by another process" in line for line in loser["passed_over"])
    holders = {d["lock"]["holder_pid"] for d in docs if d["found"]}
    assert all(d["lock"]["owner_pid"] == owner.pid for d in docs if d["found"])
    # The locks outlive the select processes: a third select finds every locked GPU busy.
    third = _select(path, env, owner.pid, devices)
    assert third.wait(timeout=60) == 1
    # The owner exits; each holder sees it and exits, which releases the locks: a waiting select then gets them all.
    waiting = _select(path, env, os.getpid(), devices, "--wait", "60")
    owner.kill()
    owner.wait()
    assert all(gone_within(pid) for pid in holders)
    out, err = waiting.communicate(timeout=90)
    assert waiting.returncode == 0, err
    assert json.loads(out)["value"] == ",".join(map(str, range(devices)))
    lock_dir = Path(env["NVMLCHECK_LOCK_DIR"])
    (holder,) = {json.loads(out)["lock"]["holder_pid"]}
    assert lock_info(uuid(0), lock_dir) is not None and f"holder={holder}" in (lock_info(uuid(0), lock_dir) or "")
    os.kill(holder, 15)  # killing the holder releases the locks early
    assert gone_within(holder)
    taken = try_lock(uuid(0), lock_dir)
    assert taken is not None
    os.close(taken.fd)


def test_lock_pid_must_be_a_running_process(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = str(mixed(devices=1, busy=()).write(tmp_path / "sc.txt"))
    dead = subprocess.Popen([sys.executable, "-S", "-c", "pass"])
    dead.wait()
    code, out, err = run(capsys, "--simulate", path, "select", "--count", "1", "--lock-pid", str(dead.pid))
    assert code == 2 and out == "" and "no such process" in err


def test_locks_of_an_answer_not_delivered_do_not_outlive_the_command(
    tmp_path: Path, owner: subprocess.Popen[bytes]
) -> None:
    # `select --lock > /dev/full`: exit 141 (the answer was not delivered), but its holder kept GPUs 0 and 1 locked
    # until the owner exited, and nobody would ever use them.
    path = str(mixed(devices=2, busy=()).write(tmp_path / "sc.txt"))
    env = _env(tmp_path)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "nvmlcheck", "--simulate", path, "select", "--count", "2", "--lock-pid",
             str(owner.pid)], env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    assert done.returncode == 141, done.stderr
    lock_dir = Path(env["NVMLCHECK_LOCK_DIR"])
    for index in range(2):
        taken = try_lock(uuid(index), lock_dir)  # free at once: the holder was ended before the command returned
        assert taken is not None, lock_info(uuid(index), lock_dir)
        os.close(taken.fd)


def test_the_cuda_numbering_is_read_within_the_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `select --format cuda --wait 0.5` read every identity unbounded (4.2 s with a 1 s memory call), and the wait
    # left was 0: one whole check more. A deadline that has passed stops the read at once.
    import time

    from nvmlcheck.cli._select import _cuda_mapping

    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", str(Scenario.h200(devices=2).write(tmp_path / "s.txt")))
    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        # Not found within --wait (exit 1, as with --format index), not a backend failure (exit 3).
        with pytest.raises(nc.SelectTimeout, match="not read within --wait"):
            _cuda_mapping(gpus, time.monotonic() - 1.0)
        assert _cuda_mapping(gpus, time.monotonic() + 60).devices is not None


@pytest.mark.parametrize("fmt", ["cuda", "index", "uuid"])
def test_a_wait_too_short_to_read_the_gpus_is_not_found_in_every_format(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    # --format cuda said exit 3 (an error document: "backend failed") where index and uuid said exit 1 (the select
    # document, found false) for the same --wait: the time ran out before the GPUs were read, nothing failed.
    import json

    from nvmlcheck import cli

    path = str(Scenario.h200().write(tmp_path / "s.txt"))
    code = cli.main(["--simulate", path, "--json", "select", "1", "--format", fmt, "--wait", "1e-9"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, doc
    assert doc["schema"] == "nvmlcheck/select" and doc["found"] is False and doc["timeout_s"] == 1e-9


def test_a_gpu_named_twice_is_said_when_the_selection_is_too_small(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``select 2 --devices 0,cuda:0`` said "the selection has 1" to a user who listed two: it names the GPU named
    twice (one GPU counts once)."""
    path = str(Scenario.h200(devices=4).write(tmp_path / "s.txt"))
    code, _, err = run(capsys, "--simulate", path, "select", "2", "--devices", "0,cuda:0")
    assert code == 2 and "the selection has 1" in err and "2 selectors name GPU 0" in err and "counts once" in err
    code, _, err = run(capsys, "--simulate", path, "select", "3", "--devices", "0,1")
    assert code == 2 and "the selection has 2" in err and "counts once" not in err
