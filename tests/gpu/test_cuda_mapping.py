"""On a real GPU: ``cuda:N`` names the GPU that CUDA itself (through PyTorch) calls device N.

For each environment below, PyTorch runs in a subprocess with ``CUDA_VISIBLE_DEVICES`` / ``CUDA_DEVICE_ORDER`` set, and
reports the UUID of every device it sees (``torch.cuda.get_device_properties(i).uuid``); nvmlcheck's mapping for the
same environment must give the same UUIDs in the same order. ``NVMLCHECK_TORCH_PYTHON`` names an interpreter with
PyTorch when this one has none; without PyTorch the test is skipped.

Run on a GPU host with ``pytest tests/gpu --require-gpu``. With one GPU the order rules are barely exercised; the
entries that name no GPU (``-1``, an index past the end) and UUID lists still are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

import nvmlcheck as nc

pytestmark = pytest.mark.gpu

TORCH_PYTHON = os.environ.get("NVMLCHECK_TORCH_PYTHON", sys.executable)
_PROBE = (
    "import json, torch\n"
    "n = torch.cuda.device_count()\n"
    "print(json.dumps([str(torch.cuda.get_device_properties(i).uuid) for i in range(n)]))\n"
)


def _torch_available() -> bool:
    done = subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True, check=False, timeout=120)
    return done.returncode == 0


def torch_uuids(extra: dict[str, str]) -> list[str]:
    """The UUIDs PyTorch reports for cuda:0, cuda:1, ... under ``extra`` (normalised: lower case, ``GPU-`` prefix)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")} | extra
    done = subprocess.run([TORCH_PYTHON, "-c", _PROBE], env=env, capture_output=True, text=True, check=False,
                          timeout=300)
    assert done.returncode == 0, f"PyTorch failed under {extra}: {done.stderr[-2000:]}"
    return [u.lower() if u.lower().startswith("gpu-") else f"gpu-{u.lower()}" for u in json.loads(done.stdout)]


@pytest.fixture(scope="module")
def gpus() -> Iterator[nc.Session]:
    if not _torch_available():
        pytest.skip(f"PyTorch is not importable by {TORCH_PYTHON} (set NVMLCHECK_TORCH_PYTHON)")
    with nc.open("nvml") as session:
        yield session


def environments(ids: tuple[nc.DeviceState, ...]) -> list[dict[str, str]]:
    n = len(ids)
    visible = [
        None,
        "0",
        str(n - 1),
        ",".join(str(i) for i in reversed(range(n))),
        ids[-1].uuid,
        f"{ids[0].uuid[:12]},{n - 1}" if n > 1 else ids[0].uuid[:12],
        f"{n - 1},-1,0",
        str(n),  # past the end: no GPU
    ]
    out: list[dict[str, str]] = []
    for order in (None, "PCI_BUS_ID", "FASTEST_FIRST"):
        for value in visible:
            env: dict[str, str] = {}
            if value is not None:
                env["CUDA_VISIBLE_DEVICES"] = value
            if order is not None:
                env["CUDA_DEVICE_ORDER"] = order
            out.append(env)
    return out


def test_cuda_n_is_the_gpu_pytorch_calls_device_n(gpus: nc.Session) -> None:
    ids = gpus.devices()
    checked = 0
    refused: list[str] = []
    for env in environments(ids):
        mapping = gpus.cuda_mapping(env)
        if mapping.devices is None:
            refused.append(f"{env}: {mapping.unknown}")  # nvmlcheck refuses rather than guesses: nothing to compare
            continue
        ours = [d.uuid.lower() for d in mapping.devices]
        assert ours == torch_uuids(env), f"under {env}:\n{mapping.describe()}"
        checked += 1
    assert checked, f"every environment was refused: {refused}"
    print(f"\n{checked} environments agree with PyTorch; refused: {refused or 'none'}")


def test_resolve_reads_this_process_environment(gpus: nc.Session, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = gpus.devices()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", str(len(ids) - 1))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    resolved = gpus.resolve("cuda:0")
    assert resolved is not None and len(resolved) == 1
    index = resolved[0]
    expected = torch_uuids({"CUDA_VISIBLE_DEVICES": str(len(ids) - 1), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})[0]
    assert next(d.uuid for d in ids if d.index == index).lower() == expected
