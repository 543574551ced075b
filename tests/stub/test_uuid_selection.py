"""A GPU named by UUID while another GPU's UUID cannot be read (lost, a failed query): the name must never land on a
readable GPU it may not mean. Before, a prefix matching two GPUs resolved to the readable one and `ready` said
"ready" (exit 0), a lost GPU's own UUID was a usage error (exit 2), and a UUID was matched by its position in the list
of readable GPUs, not by the GPU's index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck.cli import main
from nvmlcheck.testing import Scenario

GPU_IS_LOST = 15
UUID = "GPU-00000000-0000-0000-0000-00000000000{}"


def _three(tmp_path: Path, fault: str) -> str:
    sc = Scenario.h200(devices=3)
    sc.fault(fault, GPU_IS_LOST, device=1)
    return str(sc.write(tmp_path / "s.txt"))


def _ready(capsys: pytest.CaptureFixture[str], path: str, devices: str) -> tuple[int, Any]:
    code = main(["--simulate", path, "--json", "ready", "--devices", devices])
    out, _ = capsys.readouterr()
    return code, json.loads(out)


@pytest.mark.parametrize("fault", ["nvmlDeviceGetUUID", "nvmlDeviceGetHandleByIndex_v2"])
def test_a_uuid_with_a_gpu_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: str) -> None:
    path = _three(tmp_path, fault)
    # A whole UUID of a readable GPU names it: GPU 2, not the second readable GPU's position (1, the lost one).
    code, doc = _ready(capsys, path, UUID.format(2))
    assert code == 0 and [v["index"] for v in doc["gpus"]] == [2], doc
    # A prefix that a readable GPU matches may name the unreadable one too: refused, naming it.
    code, doc = _ready(capsys, path, UUID.format("")[:-1])
    assert code == 2 and "GPU 1" in doc["error"]["message"], doc
    # A UUID no readable GPU has may be the unreadable GPU's: that GPU is judged (never ready), not a usage error.
    code, doc = _ready(capsys, path, UUID.format(1))
    assert code not in (0, 2) and [v["index"] for v in doc["gpus"]] == [1], doc


def test_the_library_resolves_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVMLCHECK_STUB_SCENARIO", _three(tmp_path, "nvmlDeviceGetUUID"))
    from nvmlcheck.testing import build_stub

    with nc.open("nvml", library_path=str(build_stub())) as gpus:
        assert gpus.resolve([UUID.format(2)]) == (2,)
        assert gpus.resolve([UUID.format(1)]) == (1,)
        with pytest.raises(ValueError, match="cannot be shown to name one GPU"):
            gpus.resolve(["GPU-0000"])
        # What cannot be a GPU's UUID names no GPU, unreadable ones included (a typo is no lost GPU).
        for word in ("banana", " 0", "1.0"):
            with pytest.raises(nc.NoSuchDevice):
                gpus.resolve([word])
        # A start of every UUID ("G", "GPU") matches the unreadable GPU too: refused, never the readable one.
        for word in ("G", "GPU"):
            with pytest.raises(ValueError, match="cannot be shown to name one GPU"):
                gpus.resolve([word])
        for word in ("", "  "):
            with pytest.raises(ValueError, match="an empty device selector"):
                gpus.resolve([word])
        with pytest.raises(nc.ArgumentTypeError):
            gpus.resolve(b"0")
        with pytest.raises(nc.ArgumentTypeError, match="fields must be a Fields value"):
            gpus.snapshot(fields=3)  # type: ignore[arg-type]
