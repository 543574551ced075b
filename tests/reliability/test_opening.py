"""Opening a backend when the driver is missing, mismatched, denied, hung or broken, and what ``"auto"`` and the CLI
make of it. Sources: FACTS.md ("nvmlInit can hang (go-nvml #152) or start failing with 'Unknown Error' after hours
(nvidia-docker #1671)"; nvidia-smi exit codes 9 and 18)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import nvmlcheck as nc
from nvmlcheck import cli
from nvmlcheck import session as session_module
from nvmlcheck._nvml import library
from nvmlcheck.backends.nvml import init_timeout_for
from nvmlcheck.testing import Scenario, StepClock
from nvmlcheck.wait import TracePoint, WaitOptions, is_transient

from ._support import GIB, Stub, wait_for

pytestmark = pytest.mark.stub


def _main(*args: str) -> int:
    return cli.main(list(args))


# --- library missing ----------------------------------------------------------------------------------------------


def test_library_missing_auto_falls_back_to_nvidia_smi(stub: Stub, tmp_path: Path) -> None:
    stub.write(Scenario.h200())
    with nc.open("auto", library_path=str(tmp_path / "libnvidia-ml.so.1")) as gpus:
        assert gpus.backend_name == "smi"
        assert [d.index for d in gpus.snapshot().devices] == [0]


def test_library_missing_and_no_nvidia_smi_cli_exits_3(
    stub: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "libnvidia-ml.so.1"
    monkeypatch.setenv("NVMLCHECK_LIBNVML", str(missing))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert _main("wait", "--timeout", "1") == cli.EXIT_BACKEND
    err = capsys.readouterr().err
    assert str(missing) in err and "nvidia-smi" in err  # says what was tried, both ways


# --- driver not loaded, driver/library mismatch ---------------------------------------------------------------------


def test_driver_not_loaded_both_backends_say_so(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVMLCHECK_STUB_SCENARIO")  # the stub's nvmlInit answers DRIVER_NOT_LOADED; the fake exits 9
    with pytest.raises(nc.DriverNotLoaded) as nvml:
        stub.open()
    assert isinstance(nvml.value, nc.BackendUnavailable) and "kernel driver" in str(nvml.value)
    with pytest.raises(nc.BackendUnavailable) as auto:
        nc.open("auto")
    text = str(auto.value)
    assert "NVML_ERROR_DRIVER_NOT_LOADED" in text and "couldn't communicate with the NVIDIA driver" in text
    assert _main("snapshot") == cli.EXIT_BACKEND


def test_driver_library_version_mismatch_both_backends_say_so(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlInit_v2", code=18)
    stub.write(sc)
    monkeypatch.setenv("FAKE_SMI_EXIT", "18")
    with pytest.raises(nc.LibraryVersionMismatch) as nvml:
        stub.open()
    assert isinstance(nvml.value, nc.BackendUnavailable) and "reboot" in str(nvml.value)
    with pytest.raises(nc.BackendUnavailable) as auto:
        nc.open("auto")
    lines = {line.strip().split(":", 1)[0]: line.lower() for line in str(auto.value).splitlines()[1:]}
    assert "mismatch" in lines["- nvml"] and "mismatch" in lines["- smi"], lines  # NVML's code, nvidia-smi's text
    assert _main("wait", "--timeout", "1") == cli.EXIT_BACKEND
    assert stub.balanced()


# --- permission denied at init ---------------------------------------------------------------------------------------


def test_permission_denied_at_init(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = Scenario.h200()
    sc.fault("nvmlInit_v2", code=4)
    stub.write(sc)
    with pytest.raises(nc.NoPermission) as info:
        stub.open()
    assert "nvmlInit_v2" in str(info.value) and "root" in str(info.value)
    with nc.open("auto") as gpus:  # nvidia-smi may still be allowed (another user, a setuid wrapper)
        assert gpus.backend_name == "smi"
    monkeypatch.setenv("FAKE_SMI_EXIT", "4")
    with pytest.raises(nc.BackendUnavailable) as both:
        nc.open("auto")
    assert "NVML_ERROR_NO_PERMISSION" in str(both.value) and "smi" in str(both.value)
    assert stub.probe.init_refcount() == 0


@pytest.mark.parametrize(("nvml_code", "smi_exit", "cls"), [
    (4, 4, nc.NoPermission),  # "Failed to initialize NVML: Insufficient Permissions"
    (15, 15, nc.GpuLost),
    (999, 255, nc.Unknown),  # nvidia-smi's 255 is "other error": "Failed to initialize NVML: Unknown Error"
])
def test_failed_init_is_the_same_class_on_both_backends(
    stub: Stub, monkeypatch: pytest.MonkeyPatch, nvml_code: int, smi_exit: int, cls: type[nc.NvmlError]
) -> None:
    # It was BackendUnavailable ("nvidia-smi did not answer") on the smi backend, whose reads raise the code's class.
    sc = Scenario.h200()
    sc.fault("nvmlInit_v2", code=nvml_code)
    stub.write(sc)
    monkeypatch.setenv("FAKE_SMI_EXIT", str(smi_exit))
    with pytest.raises(nc.NvmlCheckError) as nvml:
        stub.open()
    with pytest.raises(nc.NvmlCheckError) as smi:
        nc.open("smi")
    assert type(nvml.value) is cls and type(smi.value) is cls, (nvml.value, smi.value)
    assert "did not answer" not in str(smi.value) and is_transient(smi.value) == is_transient(nvml.value)
    with pytest.raises(nc.BackendUnavailable) as auto:
        nc.open("auto")
    lines = [line.strip() for line in str(auto.value).splitlines()[1:]]
    for backend in ("nvml", "smi"):  # each backend's own reason is kept
        assert any(line.startswith(f"- {backend}:") and cls.CODE_NAME in line for line in lines), (backend, lines)
    assert stub.probe.init_refcount() == 0


# --- init that hangs ------------------------------------------------------------------------------------------------


def _init_given_back(stub: Stub) -> bool:
    """The abandoned init has returned and been shut down again. ``stub.balanced()`` alone holds while the init is
    still asleep in the stub (nothing counted yet), and a later test's open would then join it."""
    loaded = library._loaded.get(str(stub.library))
    return (loaded is None or loaded._pending is None) and stub.balanced()


def _hung_init(delay_ms: int) -> Scenario:
    sc = Scenario.h200()
    sc.fault("nvmlInit_v2", delay_ms=delay_ms)  # answers, successfully, after the delay
    return sc


def test_hung_init_is_bounded_and_its_late_success_is_given_back(stub: Stub) -> None:
    stub.write(_hung_init(4000))  # long enough that the second open below comes while the first init still runs
    inits = stub.probe.call_count("nvmlInit_v2")
    with pytest.raises(nc.Timeout) as info:
        stub.open(init_timeout_s=0.2)
    # The bound that gave up is the one asked for (no wall-clock assertion: CI machines are loaded).
    assert "nvmlInit_v2" in str(info.value) and "0.2 s" in str(info.value)
    assert is_transient(info.value)
    with pytest.raises(nc.Timeout):
        stub.open(init_timeout_s=0.2)  # joins the init in flight instead of starting a second one
    assert stub.probe.call_count("nvmlInit_v2") == inits + 1
    # The init returns at 4 s with nobody waiting: nvmlcheck shuts NVML down again, so the count stays balanced.
    wait_for(lambda: _init_given_back(stub), 15.0, "the abandoned init to be given back")
    loaded = library._loaded[str(stub.library)]
    assert loaded.refcount == 0 and not loaded._initialised


@dataclass
class Opened:
    """What module-level ``wait_until_clean`` asked of ``open`` and then of the session's wait."""

    open_kwargs: list[dict[str, Any]] = field(default_factory=list)
    wait_timeouts: list[float | None] = field(default_factory=list)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Opened:
    """Spy on the bounds ``nc.wait_until_clean`` hands down: the init and nvidia-smi timeouts given to ``open``, and
    the timeout left to the wait (the mechanism, instead of wall-clock assertions)."""
    seen = Opened()
    real_open = session_module.open
    real_wait = session_module.Session.wait_until_clean

    def spy_open(*args: Any, **kwargs: Any) -> nc.Session:
        seen.open_kwargs.append(kwargs)
        return real_open(*args, **kwargs)

    def spy_wait(self: nc.Session, timeout: float | None = 30.0, *args: Any, **kwargs: Any) -> nc.WaitResult:
        seen.wait_timeouts.append(timeout)
        return real_wait(self, timeout, *args, **kwargs)

    monkeypatch.setattr(session_module, "open", spy_open)
    monkeypatch.setattr(session_module.Session, "wait_until_clean", spy_wait)
    return seen


def test_hung_init_auto_falls_back_to_nvidia_smi_within_the_callers_deadline(stub: Stub, opened: Opened) -> None:
    # 4 s, not 1: the fake nvidia-smi (a Python script) must open and poll twice in what the init's half leaves,
    # which a loaded CI machine did not do in 0.5 s. The init hangs past its 2 s half.
    stub.write(_hung_init(3000))
    # The wait runs on a step clock, so its two clean polls do not depend on how fast a loaded machine runs the fake
    # nvidia-smi (only the opening, which the rule under test bounds, is on the real clock).
    t = StepClock(0.000_001)
    try:  # NVML's init gets half of it, nvidia-smi the rest
        result = nc.wait_until_clean(timeout=4.0, options=WaitOptions(clock=t.clock, sleep=t.sleep))
    except nc.BackendUnavailable as exc:
        # A loaded machine where the fake nvidia-smi did not answer within its 2 s: the bound held, which is the
        # point; the fallback's answer is then that it did not answer.
        assert "smi: nvidia-smi did not answer within 2 s" in str(exc), exc
    else:
        assert result.snapshot.backend == "smi" and [d.index for d in result.snapshot.devices] == [0]
        assert result.polls >= 2  # time was left for a real wait (two clean polls), not a single check
    (kwargs,) = opened.open_kwargs
    assert kwargs["init_timeout_s"] == 2.0 and kwargs["smi_timeout_s"] == 2.0
    for left in opened.wait_timeouts:  # none when nvidia-smi did not answer in time
        assert left is not None and left <= 2.0  # the wait got what the init's half left of the 4 s
    wait_for(lambda: _init_given_back(stub), 5.0, "the abandoned init to be given back")


@pytest.mark.parametrize(
    ("timeout", "init_s"),
    [
        (0, 0.25),
        (0.2, 0.25),
        (0.5, 0.25),
        (1.0, 0.5),
        (3, 1.5),
        (20, 10.0),
        (1e9, 10.0),
        (None, 10.0),
        (math.inf, 10.0),
    ],
)
def test_init_timeout_rule(timeout: float | None, init_s: float) -> None:
    # The documented rule: half of the timeout, at least 0.25 s, at most 10 s; None and inf get the 10 s default.
    assert init_timeout_for(timeout) == init_s


def test_timeout_zero_bounds_a_hung_init_too(stub: Stub, opened: Opened) -> None:
    # A user's report: nc.wait_until_clean(timeout=0) with a hanging nvmlInit blocked 10 s (the default bound) although
    # the timeout bounds the whole call. The init is the stub's, hung 1.5 s: past the 0.25 s that timeout=0 allows.
    stub.write(_hung_init(1500))
    with pytest.raises(nc.Timeout) as info:
        nc.wait_until_clean(timeout=0, backend="nvml")
    assert "nvmlInit_v2" in str(info.value) and "0.25 s" in str(info.value)
    assert [kw["init_timeout_s"] for kw in opened.open_kwargs] == [0.25]
    wait_for(lambda: _init_given_back(stub), 5.0, "the abandoned init to be given back")


def test_timeout_zero_with_a_hung_init_falls_back_to_one_nvidia_smi_check(stub: Stub, opened: Opened) -> None:
    stub.write(_hung_init(1500))
    try:
        result = nc.wait_until_clean(timeout=0)
    except nc.BackendUnavailable as exc:
        # A loaded machine where the fake nvidia-smi did not answer within its 1 s: the bound held.
        assert "smi: nvidia-smi did not answer within 1 s" in str(exc), exc
        assert opened.wait_timeouts == []
    else:
        assert result.snapshot.backend == "smi" and result.polls == 1
        assert opened.wait_timeouts == [0.0]
    assert opened.open_kwargs[0]["init_timeout_s"] == 0.25 and opened.open_kwargs[0]["smi_timeout_s"] == 1.0
    wait_for(lambda: _init_given_back(stub), 5.0, "the abandoned init to be given back")


def test_hung_init_that_finishes_in_time_opens_nvml(stub: Stub) -> None:
    stub.write(_hung_init(100))
    with stub.open(init_timeout_s=2.0) as gpus:
        assert gpus.backend_name == "nvml" and gpus.device_count() == 1
    assert stub.balanced()


# --- "Unknown Error" after working: re-init on the next poll ------------------------------------------------------


def _breaks_after(memory_calls: int) -> Scenario:
    """An H200 whose memory query starts answering NVML_ERROR_UNKNOWN for good after ``memory_calls`` calls."""
    sc = Scenario.h200()
    sc.fault("nvmlDeviceGetMemoryInfo_v2", code=999, after=memory_calls)
    return sc


def test_unknown_error_after_working_reinitialises_on_the_next_poll(stub: Stub) -> None:
    with stub.open(_breaks_after(2)) as gpus:  # the first snapshot reads memory twice (total, then live)
        assert not gpus.snapshot().failures
        inits, shutdowns = stub.probe.init_total(), stub.probe.shutdown_total()
        stub.write(Scenario.h200())  # what a fresh init finds: a working driver
        broken = gpus.snapshot()
        (failure,) = broken.failures
        assert isinstance(failure.error, nc.Unknown) and is_transient(failure.error)
        assert stub.probe.init_total() == inits  # reported first, not retried behind the caller's back
        healed = gpus.snapshot()
        assert not healed.failures and healed.devices[0].memory is not None
        assert (stub.probe.init_total(), stub.probe.shutdown_total()) == (inits + 1, shutdowns + 1)
        assert stub.probe.init_refcount() == 1
    assert stub.balanced()


def test_wait_survives_an_init_that_answers_unknown_error_until_the_driver_recovers(stub: Stub) -> None:
    broken_init = Scenario.h200()
    broken_init.fault("nvmlInit_v2", code=999)  # every re-init fails while this is the scenario file
    polls: list[TracePoint] = []

    def on_poll(point: TracePoint) -> None:
        polls.append(point)
        if len(polls) == 5:
            stub.write(Scenario.h200())  # the driver recovers

    with stub.open(_breaks_after(2)) as gpus:
        gpus.snapshot()
        stub.write(broken_init)
        result = gpus.wait_until_clean(timeout=10, on_poll=on_poll, policy=0.001)
        assert stub.probe.init_refcount() == 1
    errors = [p.error or "" for p in polls]
    assert polls[0].error is None and polls[0].failures == 1  # poll 1: the memory read fails on the device
    assert all("nvmlInit_v2 failed: NVML_ERROR_UNKNOWN" in e for e in errors[1:5])  # polls 2-5: the re-init
    assert all(not p.clean for p in polls[:5])
    assert result.polls == len(polls) >= 7 and result.snapshot.backend == "nvml"
    assert stub.balanced()


def test_a_reinit_inside_a_wait_gets_only_the_time_left(stub: Stub) -> None:
    # An Unknown Error makes the next poll re-initialise NVML; when that init hangs (5 s here: a loaded CI machine
    # must still find it running when the 0.3 s wait has given up), the re-init may take only what is left of the
    # wait, not the session's 10 s init timeout: the wait gives up while the init is still running. Without the bound
    # it waited for the init to return, seconds past its deadline.
    with stub.open(_breaks_after(2)) as gpus:
        gpus.snapshot()
        stub.write(_hung_init(5000))
        assert gpus.snapshot().failures  # the Unknown Error: a re-init is now due
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=0.3)
        loaded = library._loaded[str(stub.library)]
        assert loaded._pending is not None, "the wait waited for the hung re-init instead of its own deadline"
        assert info.value.polls == 0 and "no poll finished before the deadline" in str(info.value)
        wait_for(lambda: _init_given_back(stub) or stub.probe.init_refcount() == 1, 15.0, "the late init to return")
    wait_for(lambda: _init_given_back(stub), 15.0, "the abandoned init to be given back")


def test_wait_names_an_init_that_keeps_answering_unknown_error(stub: Stub) -> None:
    broken_init = Scenario.h200()
    broken_init.fault("nvmlInit_v2", code=999)
    with stub.open(_breaks_after(2)) as gpus:
        gpus.snapshot()
        stub.write(broken_init)
        t = StepClock(2.0)  # a fake clock: the timeout comes after a completed poll, however loaded the machine
        with pytest.raises(nc.WaitTimeout) as info:
            gpus.wait_until_clean(timeout=30, policy=0.01, clock=t.clock, sleep=t.sleep)
        assert "nvmlInit_v2 failed: NVML_ERROR_UNKNOWN" in str(info.value)
        assert stub.probe.init_refcount() == 0  # NVML is down; the session still counts itself
    assert stub.balanced()


def test_lost_initialisation_is_restored_within_the_same_snapshot(stub: Stub) -> None:
    with stub.open(Scenario.h200()) as gpus:
        gpus.snapshot()
        lib = stub.probe._lib
        lib.nvmlShutdown()  # someone else in the process (a second NVML user) shut NVML down under us
        assert stub.probe.init_refcount() == 0
        snap = gpus.snapshot()
        assert not snap.failures and snap.devices[0].memory is not None
        assert stub.probe.init_refcount() == 1
        assert gpus.wait_until_clean(timeout=2).clean
    assert stub.balanced()


# --- zero GPUs -------------------------------------------------------------------------------------------------------


def test_zero_gpus_is_never_clean(stub: Stub, capsys: pytest.CaptureFixture[str]) -> None:
    with stub.open(Scenario()) as gpus:  # a driver that sees no GPU
        snap = gpus.snapshot()
        assert snap.devices == () and snap.failures == ()
        verdict = nc.default_predicate().evaluate(snap)
        assert not verdict.clean and "no GPU" in verdict.reasons[0]
        with pytest.raises(nc.BackendUnavailable, match="refusing to call zero GPUs clean"):
            gpus.wait_until_clean(timeout=5)
        with pytest.raises(nc.BackendUnavailable, match="no GPU"):
            nc.kill_and_wait(gpus, [2**22], timeout=1)  # refused before any PID is looked at
    assert _main("wait", "--backend", "nvml", "--timeout", "5") == cli.EXIT_BACKEND
    assert "zero GPUs" in capsys.readouterr().err
    assert _main("wait", "--backend", "smi", "--timeout", "5") == cli.EXIT_BACKEND


def test_zero_gpus_after_a_busy_start_is_not_clean(stub: Stub) -> None:
    sc = Scenario.h200()
    sc.add_process(0, 4_000_001, used_bytes=GIB)
    with stub.open(sc) as gpus:
        assert gpus.device_count() == 1
        stub.write(Scenario())  # after the next re-init the driver sees no GPU at all
        stub.probe._lib.nvmlShutdown()
        with pytest.raises(nc.BackendUnavailable, match="zero GPUs"):
            gpus.wait_until_clean(timeout=5)


# --- the caller's mistakes are refused whichever backend is asked for -----------------------------------------------


@pytest.mark.parametrize("kwargs", [
    {"init_timeout_s": 0},  # "auto": NVML refused it, and nvidia-smi opened instead
    {"init_timeout_s": math.nan},
    {"smi_timeout_s": 0},  # "auto": ignored when NVML opened; "did not open" when it did not
    {"smi_timeout_s": math.inf},
    {"smi_command": ""},
    {"smi_command": []},
    {"smi_command": "nvidia-smi\x00"},  # a bare ValueError ("embedded null byte") from the OS
    {"smi_prefix": ["ssh\x00"]},
    {"library_path": "/usr/lib/libnvidia-ml.so.1\x00"},  # a bare TypeError from cffi
])
@pytest.mark.parametrize("backend", ["auto", "nvml", "smi"])
def test_a_bad_opening_argument_is_an_argument_error_on_every_backend(
    stub: Stub, backend: str, kwargs: dict[str, Any]
) -> None:
    stub.write(Scenario.h200())  # both backends would open: only the argument can be refused
    with pytest.raises(nc.ArgumentError) as info:
        nc.open(backend, **kwargs)
    (name,) = kwargs
    assert name in str(info.value) and "could be opened" not in str(info.value)
    assert stub.probe.init_refcount() == 0


def test_a_backends_own_argument_error_is_not_a_fallback_reason(stub: Stub) -> None:
    # open_backend (the CLI's way in) checks nothing itself: "auto" recorded NVML's ArgumentError as a reason to try
    # nvidia-smi, which opened.
    from nvmlcheck.backends import open_backend

    stub.write(Scenario.h200())
    with pytest.raises(nc.ArgumentError, match="init_timeout_s"):
        open_backend("auto", init_timeout_s=-1)
    with pytest.raises(nc.ArgumentError, match="NUL"):
        open_backend("auto", library_path="libnvidia-ml.so.1\x00")
