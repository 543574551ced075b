"""What the commands share: exit codes, usage errors, opening a session, the wait predicate, the simulation."""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing costs start-up time where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import argparse
    import contextlib
    from types import TracebackType
    from typing import Any

    from ..session import Session

EXIT_CLEAN = 0
EXIT_NOT_CLEAN = 1
EXIT_USAGE = 2
EXIT_BACKEND = 3
#: A fatal GPU event (XID 79, 48, ...: docs/events.md) stopped a wait or kill: the GPU cannot become clean.
EXIT_FAULT = 4
#: ``ready``: a GPU needs an operator (unhealthy: a health cause, a fatal XID, a lost GPU; or stuck: memory that no
#: signal frees): waiting cannot make it ready (docs/ready.md). ``ready`` exits 0 when ready and 1 when not yet.
EXIT_UNHEALTHY = 5
#: Ended by a signal: 128 + its number, as a shell reports it (SIGHUP 129, SIGINT 130, SIGTERM 143).
EXIT_SIGNAL_BASE = 128
#: The output could not be written (its reader went away, the disk is full) and the command's answer was the
#: output itself, or no verdict had been decided yet: 128 + SIGPIPE, as a shell reports a writer a broken pipe ended.
EXIT_OUTPUT_FAILED = EXIT_SIGNAL_BASE + 13


#: Set by the ``nvmlcheck`` script (not by :func:`nvmlcheck.cli.main` called in-process): once the verdict is
#: printed, the process may end at once (see :func:`verdict_printed`).
FAST_EXIT = False
_simulating = False
_simulation_files: contextlib.ExitStack | None = None  # the simulation's cleanup, for a hung reading's exit
_signalled_plan: Any = None  # a kill's plan once its first signal went out: a hung reading's report names the targets
#: The exit status an output failure ends the command with (set by :func:`verdict` before the answer is printed;
#: ``None`` before any verdict: then an output failure is :data:`EXIT_OUTPUT_FAILED`).
_on_output_failure: int | None = None


def verdict(code: int, *, answer_is_output: bool = False) -> None:
    """The command's verdict is ``code``: call before printing it, so that a failed write cannot change it.

    When stdout (or stderr) cannot be written, :func:`output_failed` ends the command with ``code`` if it is not 0.
    A 0 stays 0 when the verdict stands without anyone reading it (``wait`` and ``kill``: the GPUs are clean), and
    becomes :data:`EXIT_OUTPUT_FAILED` when the answer is the output (``answer_is_output``: ``select``'s GPU list,
    ``snapshot``, ``holders``). An output failure can never turn a verdict that is not clean into 0.
    """
    global _on_output_failure
    _on_output_failure = EXIT_OUTPUT_FAILED if code == EXIT_CLEAN and answer_is_output else code


def reset_verdict() -> None:
    """Forget the verdict of an earlier command run in this process (:func:`._main.run` starts with it)."""
    global _on_output_failure
    _on_output_failure = None


def verdict_decided() -> bool:
    """Whether the command has decided its verdict and is printing it (an ``OSError`` then is the output's)."""
    return _on_output_failure is not None


def output_failed(exc: OSError, code: int = EXIT_CLEAN) -> int:
    """Writing the answer failed with ``exc``: say so on stderr if it can be written, point the standard streams
    that fail at ``/dev/null`` (so the interpreter's own flush at exit cannot fail again), and return the exit status
    :func:`verdict` decided; without one, ``code`` unless it is 0, which becomes :data:`EXIT_OUTPUT_FAILED`."""
    if _on_output_failure is not None:
        code = _on_output_failure
    elif code == EXIT_CLEAN:
        code = EXIT_OUTPUT_FAILED
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            _silence(stream)
    try:
        print(f"nvmlcheck: output failed ({exc.strerror or exc}); exit status {code}", file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        _silence(sys.stderr)
    return code


def notice(text: str) -> None:
    """A line on stderr that is not the verdict (the simulation's, the events' fallback). A stderr that cannot take it
    (a full disk, a closed pipe) is read by no one: it is pointed at ``/dev/null`` and the command goes on to its
    verdict, which its exit status still says."""
    try:
        print(text, file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        _silence(sys.stderr)


def _silence(stream: Any) -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (a test's capture): nothing to protect
        pass


def verdict_printed(code: int) -> None:
    """The command's answer is out: as the ``nvmlcheck`` script, end the process now with ``code``.

    What is skipped is only teardown the kernel does anyway: ``nvmlShutdown`` and the interpreter's finalisation
    cost a launch script milliseconds after the GPU was already verified clean (issue 12; docs/performance.md).
    Never in-process (tests, tools calling ``main``), and never under ``--simulate``, whose temporary files need
    their cleanup.
    """
    if not FAST_EXIT or _simulating:
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError as exc:  # the reader went away, the disk is full: the verdict stands (see verdict)
        code = output_failed(exc, code)
    except ValueError:  # closed by the command itself
        pass
    os._exit(code)


#: The commands that read GPUs once and exit: worth starting NVML before the rest is imported (start_nvml_early).
ONE_SHOT_COMMANDS = ("wait", "snapshot", "ready")
_VALUED = ("--backend", "--smi-prefix", "--simulate", "--devices")
_NOT_EARLY = ("-h", "--help", "--version", "--simulate", "--smi-prefix", "--host", "--hosts", "--hosts-file")


def start_nvml_early(argv: list[str]) -> bool:
    """For the ``nvmlcheck`` script: when ``argv`` is a one-shot command that will read this host's GPUs through
    NVML (``wait``, ``snapshot``, ``ready``; backend ``auto`` or ``nvml``; no ``--simulate``, ``--smi-prefix`` or
    hosts), start loading libnvidia-ml and ``nvmlInit`` in a thread now, and read the handles of the GPUs that
    ``--devices`` names by index (all when it is absent), so the driver's start overlaps Python's imports
    (docs/performance.md, "One-shot checks"). Judged on the words alone, without the parser: a command that turns out
    not to need NVML only leaves an idle thread behind. Returns whether it started.
    """
    command: str | None = None
    backend = "auto"
    devices: list[int] | None = None
    value_of: str | None = None
    for arg in argv:
        if value_of is not None:
            backend, devices = _note(value_of, arg, backend, devices)
            value_of = None
            continue
        name, eq, value = arg.partition("=")
        if name in _NOT_EARLY or arg == "--":
            return False
        if name in _VALUED:
            if eq:
                backend, devices = _note(name, value, backend, devices)
            else:
                value_of = name
        elif command is None and not arg.startswith("-"):
            command = arg
    if command not in ONE_SHOT_COMMANDS or backend not in ("auto", "nvml"):
        return False
    try:
        from .._nvml.library import start_early
    except ImportError:  # no cffi: the session says so (or falls back to nvidia-smi) when it opens
        return False
    start_early(None, devices, _slow_first_reads(command, argv))
    return True


def _slow_first_reads(command: str, argv: list[str]) -> tuple[str, ...]:
    """What the one-shot will read whose first call is slow on a real driver (the early thread makes it first):
    ready's health; snapshot's table, its current clocks; snapshot's JSON, every reading (cli/_snapshot.py)."""
    if command == "ready":
        return ("health",)
    if command != "snapshot" or "procs" in argv:
        return ()
    return ("health", "current_clocks", "clock_limits") if "--json" in argv else ("current_clocks",)


def _note(name: str, value: str, backend: str, devices: list[int] | None) -> tuple[str, list[int] | None]:
    if name == "--backend":
        return value, devices
    if name == "--devices":
        # Indices only: a UUID or cuda:N needs the session's resolution first, so nothing is read ahead for it.
        words = (w.strip() for w in value.split(","))
        return backend, (devices or []) + [int(w) for w in words if w.isascii() and w.isdigit()]
    return backend, devices


class UsageError(Exception):
    """Bad command-line input (exit 2)."""


class SimulationUnavailable(Exception):
    """``--simulate`` or ``demo`` cannot build the stub libnvidia-ml (exit 3)."""


def simulation_hint(exc: BaseException) -> str:
    """The message for a simulation that cannot be set up: no C compiler or no ``nvidia-nvml-dev`` (no header), or
    a file it could not write (the stub's cache, the scenario's temporary directory), which no package would fix."""
    from .._sim.build import StubCacheError

    if isinstance(exc, StubCacheError) and isinstance(exc.__cause__, OSError):
        exc = exc.__cause__  # the cache's own error: the directory it names, not a missing compiler
    filename = getattr(exc, "filename", None)
    if isinstance(exc, OSError) and filename is not None:
        cache = os.environ.get("NVMLCHECK_STUB_CACHE") or "~/.cache/nvmlcheck/stub"
        return (f"the simulated GPU could not be set up: {exc.strerror or exc}: {filename!s}. The stub libnvidia-ml "
                f"is built in {cache} (set $NVMLCHECK_STUB_CACHE to a writable directory to move it), the scenario "
                "is written in the temporary directory ($TMPDIR)")
    return (f"the simulated GPU needs a C compiler and the nvidia-nvml-dev package "
            f"(pip install 'nvmlcheck[sim]', or pip install -e '.[sim]' in a clone): {exc}")


def unreadable_scenario(option: str, name: str, exc: OSError) -> str:
    """The usage error for a scenario path that cannot even be looked at (``ENAMETOOLONG``, ``EACCES``)."""
    from ._output import safe

    shown = name if len(name) <= 200 else f"{name[:200]}..."
    return (f"{option} {safe(repr(shown))}: not a bundled scenario nor a readable scenario file "
            f"({exc.strerror or exc}); name one (h200, h200x8, h200-busy) or a file")


def hosts_wanted(args: argparse.Namespace) -> bool:
    """Whether the command runs on hosts (``--host``/``--hosts``/``--hosts-file``) rather than here."""
    return bool(getattr(args, "hosts", None) or getattr(args, "hosts_file", None))


def open_session(args: argparse.Namespace) -> Session:
    """Open the backend the options name; ``--simulate`` means the stub through NVML (or the fake nvidia-smi),
    handed over explicitly by :class:`simulation` as ``args.simulation``."""
    from ..session import open as open_backend

    backend = args.backend
    if args.simulate is not None and backend == "auto":
        backend = "nvml"
    stub = getattr(args, "simulation", None)
    smi_command = stub.fake_smi_command() if stub is not None and backend == "smi" else None
    library_path = str(stub.library_path) if stub is not None else None
    # nvmlInit can hang on a wedged driver, nvidia-smi too: the library's rule bounds both by the command's own
    # timeout (session.open_timeouts), so --timeout covers opening as it does for nc.wait_until_clean.
    from ..session import open_timeouts

    init_timeout_s, smi_timeout_s = open_timeouts(getattr(args, "timeout", None), backend=backend,
                                                  prefixed=args.smi_prefix is not None)
    from .._deadline import on_hung  # before the open: imported while the early thread is in nvmlInit

    session = open_backend(backend, smi_prefix=args.smi_prefix, smi_command=smi_command, library_path=library_path,
                           init_timeout_s=init_timeout_s, smi_timeout_s=smi_timeout_s)
    # Its own process (never in-process: tests, tools) can end a wait stuck in an NVML call, which no thread can
    # interrupt. nvidia-smi's runs need no watchdog: the runner kills each at its own bound (and one complete check,
    # timeout 0, over ssh can take seconds).
    if FAST_EXIT and session.backend_name == "nvml":
        on_hung(lambda late_s: _hung_reading(args, late_s))
    return session


class HungReading(Exception):
    """A GPU reading that had not returned a second after the command's deadline (``_deadline.HUNG_AFTER_NS``)."""


class proc_reading_bound:
    """``with proc_reading_bound(args):`` around a scan of every process's ``/proc`` files before anything is
    signalled (``kill --match``, ``--container``, ``--cgroup``): a read that never returns (``/proc/PID/cmdline`` is
    read under the process's memory-map lock, which a process stuck in the driver can hold for good: ``ps`` hangs
    there too) ends the command (exit 3, nothing signalled) ``--timeout`` + 1 s after the scan began. Its own process
    only (``FAST_EXIT``), as the GPU watchdog; no bound with ``--timeout none``. Made of ``_thread`` alone: it runs
    before the first signal, where ``_deadline`` (and the errors it loads) is not imported."""

    __slots__ = ("_done", "_firing")

    def __init__(self, args: argparse.Namespace) -> None:
        import _thread

        self._done: Any = None
        self._firing: Any = None
        timeout = getattr(args, "timeout", None)
        if timeout is None or not FAST_EXIT or not timeout < 1e9:  # inf, or beyond any wait: no bound
            return
        at_ns = time.monotonic_ns() + round(timeout * 1e9) + _HUNG_AFTER_NS
        done, firing = self._done, self._firing = _thread.allocate_lock(), _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_watch_proc, (args, done, firing, at_ns))

    def __enter__(self) -> proc_reading_bound:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._done is not None:
            with self._firing:  # blocks only while the handler ends the process
                self._done.release()


#: As ``_deadline.HUNG_AFTER_NS``: how long past its deadline a reading counts as hung.
_HUNG_AFTER_NS = 1_000_000_000


def _watch_proc(args: argparse.Namespace, done: Any, firing: Any, at_ns: int) -> None:
    import _thread

    while (left_s := (at_ns - time.monotonic_ns()) / 1e9) > 0:
        if done.acquire(True, min(left_s, _thread.TIMEOUT_MAX)):
            return  # the scan ended in time
    with firing:
        if done.acquire(False):
            return  # it ended just now
        _hung_reading(args, (time.monotonic_ns() - at_ns + _HUNG_AFTER_NS) / 1e9, proc=True)


def _hung_reading(args: argparse.Namespace, late_s: float, *, proc: bool = False) -> None:
    """The watchdog's handler (another thread; the main one is in a call no exception reaches): report the hung
    reading as an error, exit 3 (backend failed) without waiting for the call. A simulation's files are removed
    first. ``proc``: a ``/proc`` read of the selection before the first signal (:func:`proc_reading_bound`)."""
    code = EXIT_BACKEND
    plan = _signalled_plan
    exc = HungReading(
        f"a GPU reading has not returned {late_s:.1f} s after the deadline: an NVML call (or nvidia-smi) is hung, "
        "as on a wedged driver or a GPU that stopped answering (check dmesg for XIDs); giving up without its answer"
    ) if not proc else HungReading(
        f"a /proc read has not returned {late_s:.1f} s after the deadline: a process's command line or cgroup is "
        "read under locks that a process stuck in the kernel (in the driver) can hold for good (`ps` hangs there "
        "too); giving up without its answer; nothing was signalled"
    )
    if plan is not None:  # a kill already signalled: say what each target got, as a kill's own errors do
        import contextlib

        with contextlib.suppress(Exception):  # the report goes out whatever the plan's state
            exc._nvmlcheck_kill_pids = plan.targets  # type: ignore[attr-defined]
    try:
        from ._main import fail

        fail(bool(getattr(args, "json", False)), exc, code)
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # the reader went away: the exit status still says it
        pass
    finally:
        stack = _simulation_files
        if stack is not None:
            import contextlib

            with contextlib.suppress(Exception):
                stack.close()
        os._exit(code)


def wait_predicate(args: argparse.Namespace) -> Any:
    """No process of any kind and at most ``--max-used`` per GPU, and the ``--pids`` off every list."""
    from .. import predicates as p

    pred = p.no_processes() & p.memory_used_at_most(args.max_used)
    if getattr(args, "pids", None):
        pred = pred & p.pids_gone(args.pids)
    return pred


class simulation:
    """For ``--simulate``: build the stub and write the scenario while the block runs, and hand the
    :class:`~nvmlcheck._sim.session.StubSession` to the command as ``args.simulation`` (``None`` otherwise).

    nvmlcheck reads nothing back from the environment: :func:`open_session` passes the library path explicitly. The
    stub library and child processes (the fake nvidia-smi) still get their variables.

    A class rather than ``@contextmanager``: contextlib costs start-up time, and the fast path needs none of it.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str | None = getattr(args, "simulate", None)
        self._stack: contextlib.ExitStack | None = None
        args.simulation = None

    def __enter__(self) -> None:
        if self.name is None:
            return
        if hosts_wanted(self.args):  # refused before the stub is built or anything is printed
            raise UsageError("--simulate runs on this machine: it cannot be combined with --host/--hosts/--hosts-file")
        import contextlib

        from .._sim.build import StubBuildError
        from ..simulate import scenario_named, simulated

        try:
            scenario = scenario_named(self.name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:  # a path the system refuses to look at (too long, no permission): the user's to fix
            raise UsageError(unreadable_scenario("--simulate", self.name, exc)) from None
        stack = contextlib.ExitStack()
        self._stack = stack
        try:
            try:
                self.args.simulation = stack.enter_context(simulated(scenario))
            except (StubBuildError, OSError) as exc:  # no compiler or header, a cache that cannot be written
                raise SimulationUnavailable(simulation_hint(exc)) from None
            global _simulating, _simulation_files
            _simulating = True
            _simulation_files = stack
            from . import _output

            _output.SIMULATED = True
            if not getattr(self.args, "json", False):
                notice(f"nvmlcheck: simulated GPUs (scenario {self.name}; the bundled stub libnvidia-ml): no real "
                       "GPU is read")
        except BaseException:
            # A signal (SIGHUP, SIGTERM: Terminated) while entering: `with` calls no __exit__ then, so clean up here,
            # or the simulation's files stay and the command ends as if simulating, without its exit status.
            self.__exit__(*sys.exc_info())
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._stack is not None:  # _output.SIMULATED stays set: an error document printed after says it too
            global _simulating, _simulation_files
            _simulating = False
            _simulation_files = None
            self.args.simulation = None
            self._stack.__exit__(exc_type, exc, tb)


def start_events(args: argparse.Namespace, gpus: Session, deadline_s: float | None = None) -> None:
    """``--events``: start the session's event listener, so the wait stops at once on a fatal event (exit 4).
    Where events cannot be had, say why once on stderr; the wait polls as without the option. ``deadline_s`` (on
    ``time.monotonic``): the command's deadline, which bounds the registration; one check (a deadline already
    reached: ``--timeout 0``) starts no listener, which would only delay it."""
    if not getattr(args, "events", False):
        return
    if deadline_s is None:
        # Not listen(): a registration call that hangs is waited for START_WAIT_S at most (the wait polls meanwhile).
        listener = gpus._listen(None, time.monotonic_ns)
    elif time.monotonic() >= deadline_s:
        return
    else:
        # A hung registration is waited for half of what is left at most: the other half is the wait's, to poll in.
        listener = gpus._listen(int(deadline_s * 1e9), time.monotonic_ns,
                                patience_s=(deadline_s - time.monotonic()) / 2)
    if listener.reason is not None:
        from ._output import safe

        notice(f"nvmlcheck: events: {safe(listener.reason)}")
