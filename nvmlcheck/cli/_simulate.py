"""``nvmlcheck simulate``: rehearse a launch script in the shell, on simulated GPUs.

``simulate run [--scenario S] -- CMD ...`` runs CMD with the simulation in its environment: every ``nvmlcheck``
command in it reads the scenario (an ``nvmlcheck`` first on its ``PATH`` that passes ``--simulate FILE``, printed
like any option: nvmlcheck itself reads no variable to decide it), and so does Python code that calls
``nvmlcheck.open()`` (``$NVMLCHECK_LIBNVML``, ``$NVMLCHECK_STUB_SCENARIO``: the test kit's stub, proven by its symbol).
``simulate hold --gpu N --bytes SIZE -- CMD ...`` starts CMD as a real process that the scenario file lists on GPU N
with SIZE bytes until it exits (then, like a driver, off the list and its memory back ``--list-ms``/``--release-ms``
later). ``simulate scenario NAME`` prints a bundled scenario, to start a file from. docs/cli.md, "simulate".
"""

from __future__ import annotations

import os
import subprocess
import sys

from ._common import SimulationUnavailable, UsageError, simulation_hint, unreadable_scenario

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from pathlib import Path

#: How long a command gets to end after ``simulate`` was asked to end (and passed it on), before SIGKILL.
END_GRACE_S = 10.0


def cmd_simulate(args: argparse.Namespace) -> int:
    """Dispatch ``simulate run``, ``simulate hold`` and ``simulate scenario``."""
    if args.simulate_command == "scenario":
        from ..simulate import scenario_named

        scenario = scenario_named(args.name)
        assert not isinstance(scenario, os.PathLike)  # the parser offers the bundled names only
        sys.stdout.write(scenario.render())
        return 0
    argv = _command(args.argv)
    if args.simulate_command == "run":
        return _run(argv, args.scenario or getattr(args, "simulate", None) or "h200", _scenario_option(args))
    return _hold(argv, args)


def _scenario_option(args: argparse.Namespace) -> str:
    """How the user named the scenario, for a message about it: ``--scenario`` or ``--simulate`` as typed after
    ``run``/``hold`` (one option, two names), else ``--simulate`` given before ``simulate``."""
    from ._parser import typed

    return typed(args, "scenario", "--scenario") if args.scenario else "--simulate"


def _command(words: list[str]) -> list[str]:
    argv = words[1:] if words[:1] == ["--"] else list(words)
    if not argv:
        raise UsageError("no command given: nvmlcheck simulate run|hold [OPTIONS] -- COMMAND [ARG ...]")
    return argv


def _run(argv: list[str], name: str, option: str = "--scenario") -> int:
    import contextlib
    import tempfile
    from pathlib import Path

    from .._sim.build import StubBuildError, build_stub
    from .._sim.session import ENV_LIBRARY, ENV_SCENARIO
    from ..simulate import scenario_named

    try:
        scenario = scenario_named(name)
    except ValueError as exc:
        raise UsageError(str(exc).replace("--simulate", option)) from None
    except OSError as exc:  # a path the system refuses to look at (too long, no permission)
        raise UsageError(unreadable_scenario(option, name, exc)) from None
    try:
        library = build_stub()
    except (StubBuildError, OSError) as exc:  # a cache that cannot be written too
        raise SimulationUnavailable(simulation_hint(exc)) from None
    with contextlib.ExitStack() as stack:
        if isinstance(scenario, Path):
            path = scenario.resolve()
        else:  # a bundled scenario: a file of its own for the run, which `simulate hold` inside it may change
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nvmlcheck-simulate-")))
            path = scenario.write(directory / f"{name}.txt")
        shim = _nvmlcheck_shim(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="nvmlcheck-bin-"))), path)
        env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', '')}", ENV_LIBRARY: str(library),
               ENV_SCENARIO: str(path)}
        print(f"nvmlcheck: simulated GPUs for {argv[0]}: scenario {name} ({path}); the `nvmlcheck` commands it runs "
              "read them and say so (python -m nvmlcheck and the library read them as under the test kit, unmarked)",
              file=sys.stderr)
        return _wait_for(_start(argv, env))


def _hold(argv: list[str], args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..simulate import SCENARIOS, _not_a_scenario, add_bound_process, bound_process_line, remove_bound_process
    from ._output import human_bytes

    # Inside `simulate run`, `nvmlcheck` is its shim, which passes --simulate FILE: that file is the default.
    name = args.scenario or getattr(args, "simulate", None)
    if not name:
        raise UsageError("no scenario file: give --scenario FILE (or --simulate FILE), or run under `nvmlcheck "
                         "simulate run`, whose `nvmlcheck` passes its scenario")
    if name in SCENARIOS:
        raise UsageError(f"{name!r} is a bundled scenario: hold adds a process to a scenario file (`nvmlcheck "
                         f"simulate scenario {name} > FILE` writes one; `simulate run` gives its command one)")
    path = Path(name)
    if not path.is_file():
        raise UsageError(f"{_scenario_option(args)} {name!r}: no such scenario file")
    why = _not_a_scenario(path)
    if why is not None:  # as `simulate run` and --simulate say it, not as a file that declares no GPU
        raise UsageError(f"{_scenario_option(args)} {name!r}: not a scenario file ({why}); write one with "
                         "`nvmlcheck simulate scenario` or Scenario.write (docs/testing.md)")
    options = {"kind": args.kind, "list_ms": args.list_ms, "release_ms": args.release_ms}
    try:  # checked before anything starts: a refused hold leaves no process behind
        bound_process_line(path, args.gpu, os.getpid(), args.bytes, **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    child = _start(argv, dict(os.environ), _stand_ins(path, args.gpu))
    try:
        add_bound_process(path, args.gpu, child.pid, args.bytes, **options)
        print(f"nvmlcheck: simulated: pid {child.pid} ({argv[0]}) holds {human_bytes(args.bytes)} on GPU "
              f"{args.gpu} of {path} until it exits", file=sys.stderr)
        code = _wait_for(child)
        # As a driver: off the list list_ms after the exit, memory back release_ms after it (the stub does that in
        # every process that had loaded the scenario); then the entry goes, so that a later reader, or a new
        # process with the same PID, does not see it.
        import time

        time.sleep(max(args.list_ms, args.release_ms) / 1000)
        remove_bound_process(path, args.gpu, child.pid, kind=args.kind)
        return code
    except BaseException:
        if child.poll() is None:
            child.kill()
            child.wait()
        with _suppressed():
            remove_bound_process(path, args.gpu, child.pid, kind=args.kind)
        raise


def _nvmlcheck_shim(directory: Path, scenario: Path) -> Path:
    """A directory holding an ``nvmlcheck`` that runs this interpreter's nvmlcheck with ``--simulate scenario``:
    first on the command's ``PATH``, so the simulation is an option on every command line, not a variable."""
    import shlex

    script = directory / "nvmlcheck"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m nvmlcheck --simulate "
                      f"{shlex.quote(str(scenario))} \"$@\"\n", encoding="utf-8")
    script.chmod(0o755)
    return directory


class _suppressed:
    """Ignore an ``Exception`` in a clean-up step (not a signal's exception): the error being raised matters more."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        return exc_type is not None and issubclass(exc_type, Exception)


def _stand_ins(scenario: Path, gpu: int) -> list[str]:
    """The simulation's stand-ins of ``/dev/nvidia<gpu>`` and ``/dev/nvidiactl`` beside the scenario: a held
    process keeps them open, as a CUDA process keeps the real ones, so ``holders`` and ``kill --all-on-gpu`` on
    this scenario find it (as they find the pytest fixture's ``nvml_bound_process``)."""
    from .._proc.devfiles import SIMULATED_DEVICE_DIR
    from .._sim.session import stand_in_device_files

    return [str(p) for p in stand_in_device_files(scenario.resolve().parent / SIMULATED_DEVICE_DIR, gpu)]


def _start(argv: list[str], env: dict[str, str], hold_open: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start ``argv``; it inherits ``hold_open`` opened read-only (closed here once it has them)."""
    fds = [os.open(path, os.O_RDONLY) for path in hold_open]
    try:
        return subprocess.Popen(argv, env=env, pass_fds=fds)
    except OSError as exc:
        raise UsageError(_cannot_start(argv[0], exc)) from None
    finally:
        for fd in fds:
            os.close(fd)


def _cannot_start(program: str, exc: OSError) -> str:
    """Why COMMAND did not start, in the shell's terms: not found (on ``PATH``, for a bare name), a directory, not
    executable ("Permission denied" said all three alike for a directory)."""
    where = "" if os.sep in program else " on PATH"
    if isinstance(exc, FileNotFoundError):
        return f"cannot start {program!r}: not found{where}"
    if os.path.isdir(program):
        return f"cannot start {program!r}: it is a directory"
    if isinstance(exc, PermissionError):
        return f"cannot start {program!r}: not executable ({exc.strerror})"
    return f"cannot start {program!r}: {exc.strerror or exc}"


def _wait_for(child: subprocess.Popen[bytes]) -> int:
    """Wait for ``child``; its exit status as a shell reports it (128 + N when signal N ended it).

    Asked to end (SIGTERM, SIGHUP: :mod:`._signals`), pass the signal on and wait ``END_GRACE_S``, then SIGKILL.
    Ctrl-C reaches the child from the terminal itself, so SIGINT is not passed on; it is given the same grace.
    """
    from ._signals import Terminated

    deadline: float | None = None
    while True:
        try:
            code = child.wait(timeout=None if deadline is None else max(0.0, deadline - _now()))
        except subprocess.TimeoutExpired:
            child.kill()
            code = child.wait()
        except (KeyboardInterrupt, Terminated) as exc:
            if isinstance(exc, Terminated):
                with _suppressed():
                    child.send_signal(exc.signum)
            if deadline is None:
                deadline = _now() + END_GRACE_S
            continue
        return code if code >= 0 else 128 - code


def _now() -> float:
    import time

    return time.monotonic()
