"""Loading libnvidia-ml: where it is, which versioned symbols it has, and NVML's init/shutdown reference count.

The path is an explicit one, else ``libnvidia-ml.so.1``, then ``libnvidia-ml.so`` (the dynamic loader's search).
``$NVMLCHECK_LIBNVML`` reaches a test's child processes and names only nvmlcheck's stub: :func:`library_from_env`.
Versioned symbols (``_v2``/``_v3``) are probed once at load, newest first. One NVML initialisation per process and
library is shared by every session, counted under a lock and started afresh after ``fork()``; ``nvmlInit`` runs in
a daemon thread bounded by a timeout because it can hang. :meth:`LoadedLibrary.reinit` recovers from "Unknown
Error" or a lost initialisation; ``init_generation``, ``reinit_epoch`` and ``reinit_in_progress`` let readers tell
another thread's re-init from a real loss. Entry points: :func:`load` and :class:`LoadedLibrary` (``acquire``,
``release``, ``reinit``). The driver facts behind each rule, with their sources: docs/driver-facts.md, "Loading
libnvidia-ml".
"""

from __future__ import annotations

import _thread
import os
import sys
import time

from ._ffi import ffi

# Lean on purpose: the one-shot commands import this module first of all, to start nvmlInit while Python is still
# importing the rest (start_early). The error classes are imported where an error is raised; threads and locks are
# _thread's (threading and the functools and collections it imports would delay nvmlInit by milliseconds).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from ..model import ProcessKind

__all__ = [
    "ENV_LIBRARY",
    "STUB_MARKER",
    "LoadedLibrary",
    "Symbols",
    "fork_generation",
    "library_from_env",
    "load",
    "start_early",
]

#: Environment variable naming nvmlcheck's stub library for a test's child processes (nothing else is loaded from it).
ENV_LIBRARY = "NVMLCHECK_LIBNVML"
#: A symbol only nvmlcheck's stub exports: what proves that ``$NVMLCHECK_LIBNVML`` names the stub.
STUB_MARKER = "stub_loaded_ns"
DEFAULT_NAMES = ("libnvidia-ml.so.1", "libnvidia-ml.so")

# Candidate symbols per capability, newest first. The _v3 and _v2 process calls share the 24-byte struct; the
# legacy call uses the 16-byte v1 struct (calls.py picks the struct from the chosen name).
# Keyed by ProcessKind's values: this module does not import the model.
_PROCESS_SYMBOLS: dict[str, tuple[str, ...]] = {
    "compute": (
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses",
    ),
    "graphics": (
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v2",
        "nvmlDeviceGetGraphicsRunningProcesses",
    ),
    "mps": (
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        "nvmlDeviceGetMPSComputeRunningProcesses",
    ),
}
_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "init": ("nvmlInit_v2", "nvmlInit"),
    "device_count": ("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"),
    "handle_by_index": ("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"),
    "memory": ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"),
    "pci_info": ("nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"),
    "cuda_driver_version": ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"),
    "clock_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
    "retired_pages": ("nvmlDeviceGetRetiredPages_v2", "nvmlDeviceGetRetiredPages"),
}


class Symbols:
    """Which symbol answers each capability in the loaded library (``None``: the library has none of them).
    Immutable; compares by value. (A plain class, not a dataclass: see the module's first comment.)"""

    __slots__ = _SYMBOL_FIELDS = (
        "init",
        "device_count",
        "handle_by_index",
        "memory",
        "pci_info",
        "cuda_driver_version",
        "clock_event_reasons",
        "retired_pages",
        "compute_processes",
        "graphics_processes",
        "mps_processes",
    )
    init: str | None
    device_count: str | None
    handle_by_index: str | None
    memory: str | None
    pci_info: str | None
    cuda_driver_version: str | None
    clock_event_reasons: str | None
    retired_pages: str | None
    compute_processes: str | None
    graphics_processes: str | None
    mps_processes: str | None

    def __init__(self, **names: str | None) -> None:
        if set(names) != set(self._SYMBOL_FIELDS):
            raise TypeError(f"Symbols needs exactly {self._SYMBOL_FIELDS}, got {sorted(names)}")
        for key in self._SYMBOL_FIELDS:
            object.__setattr__(self, key, names[key])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Symbols is immutable: cannot set {name!r}")

    def _values(self) -> tuple[str | None, ...]:
        return tuple(getattr(self, key) for key in self._SYMBOL_FIELDS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Symbols) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        return "Symbols(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self._SYMBOL_FIELDS) + ")"

    def processes(self, kind: ProcessKind | str) -> str | None:
        """The process-list symbol for ``kind`` (a :class:`~nvmlcheck.ProcessKind` or its value)."""
        name: str | None = getattr(self, f"{getattr(kind, 'value', kind)}_processes")
        return name


def _has(lib: Any, name: str) -> bool:
    try:
        getattr(lib, name)
    except (AttributeError, ffi.error):  # cffi ABI mode raises ffi.error: "symbol 'x' not found in library"
        return False
    return True


def _probe(lib: Any) -> Symbols:
    def first(names: tuple[str, ...]) -> str | None:
        return next((n for n in names if _has(lib, n)), None)

    caps = {cap: first(names) for cap, names in _CAPABILITIES.items()}
    return Symbols(
        compute_processes=first(_PROCESS_SYMBOLS["compute"]),
        graphics_processes=first(_PROCESS_SYMBOLS["graphics"]),
        mps_processes=first(_PROCESS_SYMBOLS["mps"]),
        **caps,
    )


# Bumped in every forked child, so sessions can tell that their NVML state and handles are stale.
_fork_generation = 0


def fork_generation() -> int:
    """A counter incremented in each child after ``fork()``."""
    return _fork_generation


class _Latch:
    """A one-shot event (``set`` once, ``wait`` by any number of threads) on a bare lock: threading.Event's part
    this module needs, without importing threading."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()

    def set(self) -> None:
        """Open the latch (call once)."""
        self._lock.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the latch opened within ``timeout`` seconds (``None``: wait for it)."""
        if timeout is not None and timeout <= 0:
            got = self._lock.acquire(False)
        else:
            got = self._lock.acquire(True, -1 if timeout is None else timeout)
        if got:
            self._lock.release()  # for the next waiter
        return got


class _PendingInit:
    """One ``nvmlInit`` running in its own thread; ``waiters`` counts the callers waiting for it (under the lock)."""

    __slots__ = ("calling", "done", "name", "rc", "reads", "switch_interval_s", "waiters", "warmed")

    def __init__(self, name: str) -> None:
        self.name = name
        self.reads: tuple[str, ...] = ()  # what the thread warms after the handles (start_early)
        self.switch_interval_s: float | None = None  # the interpreter's, restored when the thread ends
        self.calling = _Latch()  # set by the thread as it calls nvmlInit (begin_early waits for it)
        self.done = _Latch()
        self.warmed = _Latch()  # set after the handles were read ahead (start_early), or right after done
        self.rc: int | None = None
        self.waiters = 0


class LoadedLibrary:
    """One dlopen'ed libnvidia-ml with its probed symbols and shared init reference count."""

    def __init__(self, path: str, lib: Any) -> None:
        self.path = path
        self.lib = lib
        # Probed now, before any init: during nvmlInit the probe's dlsym calls wait for the dynamic loader's lock,
        # which the init holds for its first ~1.5 ms (1.4-1.9 ms on an H200 against 0.14 ms before it).
        self.symbols = _probe(lib)
        self._lock = _thread.allocate_lock()
        self._refcount = 0  # sessions using NVML through this library
        self._initialised = False  # whether this library holds one NVML initialisation (NVML's own count)
        self._pending: _PendingInit | None = None  # the init in flight, if any
        # Held while the last user's nvmlShutdown runs, outside _lock: it can hang on a wedged driver, and an open
        # (acquire) must stay within its bound; it waits for this, within that bound, before initialising again.
        self._shutting: Any = None
        self._init_generation = 0
        self._reinit_epoch = 0  # re-inits started (each one shuts NVML down under every other thread's calls)
        self._settled_epoch = 0  # the re-init epoch when an init last returned: below reinit_epoch while one runs
        self._generation = _fork_generation
        # An init begun by start_early, holding its initialisation (as one waiter) for the first acquire().
        self._early: _PendingInit | None = None
        # The handles its thread read, by GPU index, with the init generation they belong to (handle_read_ahead).
        self._handles_ahead: tuple[int, dict[int, Any]] | None = None

    def function(self, name: str) -> Callable[..., int]:
        """The C function ``name`` (``AttributeError`` if the library lacks it)."""
        try:
            fn: Callable[..., int] = getattr(self.lib, name)
        except ffi.error as exc:  # cffi's own error type for a missing symbol; callers expect AttributeError
            raise AttributeError(str(exc)) from None
        return fn

    @property
    def refcount(self) -> int:
        """How many sessions hold NVML initialised in this process."""
        return self._refcount

    @property
    def init_generation(self) -> int:
        """Bumped by every successful ``nvmlInit`` this library makes: device handles read before are stale."""
        return self._init_generation

    @property
    def reinit_epoch(self) -> int:
        """Bumped when a :meth:`reinit` shuts NVML down, before the call: a read that saw another value before its
        calls may have had NVML pulled from under it by another thread (it answered "Uninitialized" for that)."""
        return self._reinit_epoch

    @property
    def reinit_in_progress(self) -> bool:
        """Whether a :meth:`reinit` has shut NVML down and its init has not returned yet (calls now answer
        "Uninitialized" because of it)."""
        return self._settled_epoch != self._reinit_epoch

    def acquire(self, timeout_s: float | None = None) -> None:
        """Count one user, initialising NVML if it is not (first user, a forked child, or after a failed re-init).

        ``timeout_s`` bounds the wait for ``nvmlInit`` (``None``: no bound); past it :class:`~nvmlcheck.Timeout` is
        raised and nothing is counted. Init failures raise the class of their return code. A caller that takes over
        an early start (:func:`start_early`) also waits, within the same bound, for its thread's handles and warm
        reads: its own calls then neither race nor repeat them.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        taken: _PendingInit | None = None
        while True:
            with self._lock:
                self._forget_parent_state()
                shutting = self._shutting
            if shutting is not None:
                self._await_shutdown(shutting, deadline)
                continue
            with self._lock:
                self._forget_parent_state()
                if self._shutting is not None:
                    continue  # another release began between the two
                early, self._early = self._early, None
                if early is not None:
                    early.waiters -= 1  # the early start's hold passes to this caller (or ends: it failed)
                    taken = early
                if self._initialised:
                    self._refcount += 1
                    break
                pending = self._start_init()
            self._await(pending, deadline, timeout_s)
            with self._lock:
                if self._initialised:
                    self._refcount += 1
                    break
            # The last session closed (and shut NVML down) between the init and here: initialise again.
        if taken is not None:
            # The caller's first calls wait for the early thread's: a handle asked for while the thread's first
            # nvmlDeviceGetHandleByIndex is in flight is not served from it but costs a second attach (~4-5 ms on an
            # H200: docs/driver-facts.md). Bounded by the same timeout; a warm-up that overruns is only left behind.
            taken.warmed.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _await_shutdown(shutting: Any, deadline: float | None) -> None:
        """Wait for a shutdown in flight (its lock), until ``deadline``: :class:`~nvmlcheck.Timeout` past it."""
        left = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if shutting.acquire(True, left):
            shutting.release()
            return
        from ..errors import Timeout

        raise Timeout(10, "nvmlShutdown", detail=(
            "NVML is still shutting down for the session closed before (nvmlShutdown has not returned: a wedged "
            "driver?): it cannot be initialised again until it does"))

    def reinit(self, seen_generation: int, timeout_s: float | None = None) -> None:
        """Shut NVML down and initialise it again, for a session whose calls fail with "Unknown Error" or
        "Uninitialized" although it holds an initialisation. The count of users is unchanged.

        Nothing is done when another thread has re-initialised since ``seen_generation`` (the caller just re-reads
        its handles); a re-init in flight is joined. Raises like :meth:`acquire`; NVML is then left uninitialised
        and the next call to this method tries again.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            if self._generation != _fork_generation:
                return  # a forked child: acquire() initialises there
            if self._initialised and self._init_generation != seen_generation:
                return
            if self._initialised:
                self._initialised = False
                self._reinit_epoch += 1  # first: a reader that fails from here on must see it changed
                if _has(self.lib, "nvmlShutdown"):
                    self.lib.nvmlShutdown()  # its error, if any, changes nothing: init follows
            pending = self._start_init()
        self._await(pending, deadline, timeout_s)

    def begin_early(self, devices: Sequence[int] | None = (), reads: tuple[str, ...] = ()) -> _PendingInit | None:
        """Start ``nvmlInit`` now, for an :meth:`acquire` that comes later (see :func:`start_early`): the init runs in
        its thread and, should it finish first, stays initialised for that caller. ``None`` when NVML is already
        initialised or an early init is already held."""
        with self._lock:
            self._forget_parent_state()
            if self._initialised or self._early is not None or self._shutting is not None:
                return None
            # The thread holds the GIL only between its C calls, but waits for it after each, up to the switch
            # interval while the main thread imports: at 5 ms (the default) that wait can outlast the call; at
            # 0.5 ms it cost the H200's warm-up of five calls ~1 ms. The main thread pays a switch only when the
            # thread asks, so 0.1 ms until the thread ends.
            previous = sys.getswitchinterval()
            sys.setswitchinterval(min(previous, _EARLY_SWITCH_INTERVAL_S))
            early = self._early = self._start_init(devices, reads)
            early.switch_interval_s = previous
        # Let the thread reach nvmlInit before this one imports on: a new thread needs the GIL to start, and an
        # importing thread gives it up only between bytecodes, which a long import step delays by milliseconds
        # (measured: ~3 ms from the thread's start to its nvmlInit with the stub; docs/performance.md). Bounded:
        # a thread that does not start in time only starts later.
        early.calling.wait(_EARLY_CALL_WAIT_S)
        return early

    def _start_init(self, warm: Sequence[int] | None = (), reads: tuple[str, ...] = ()) -> _PendingInit:
        """The init in flight, or a new one started in a daemon thread; counts the caller as a waiter (lock held).
        ``warm``: device indices whose handles the thread reads after a successful init (``None``: all)."""
        pending = self._pending
        if pending is None:
            name = self.symbols.init
            if name is None:
                from ..errors import BackendUnavailable

                raise BackendUnavailable(
                    f"{self.path} exports neither nvmlInit_v2 nor nvmlInit: it is not a usable libnvidia-ml"
                )
            pending = self._pending = _PendingInit(name)
            pending.reads = reads
            _thread.start_new_thread(self._run_init, (pending, warm))  # a daemon thread, as threading's would be
        pending.waiters += 1
        return pending

    def _run_init(self, pending: _PendingInit, warm: Sequence[int] | None = ()) -> None:
        fn = self.function(pending.name)
        pending.calling.set()
        rc = fn()
        generation = None
        with self._lock:
            self._settled_epoch = self._reinit_epoch  # whatever re-init was running has its answer now
            pending.rc = rc
            if self._pending is pending:
                self._pending = None
            if rc == 0:
                if pending.waiters == 0 and self._refcount == 0:
                    # Everyone gave up waiting (a hung init that finally returned) and no session needs NVML:
                    # give the initialisation back so NVML's count stays balanced.
                    self._shutdown_quietly()
                else:
                    self._initialised = True
                    self._init_generation += 1
                    generation = self._init_generation
            pending.done.set()
        try:
            if generation is not None and warm != ():
                handles = self._warm_handles(warm)
                with self._lock:
                    self._handles_ahead = (generation, handles)
                self._warm_reads(list(handles.values()), pending.reads)
        finally:
            if pending.switch_interval_s is not None:
                sys.setswitchinterval(pending.switch_interval_s)
            pending.warmed.set()

    def _warm_handles(self, devices: Sequence[int] | None) -> dict[int, Any]:
        """Read the handle of each of ``devices`` (``None``: every GPU) once, for the session to take
        (:meth:`handle_read_ahead`). Errors are left to the session's own calls. Returns the handles read, by
        index."""
        handle, count_name = self.symbols.handle_by_index, self.symbols.device_count
        if handle is None or (devices is None and count_name is None):
            return {}
        if devices is None:
            count = ffi.new("unsigned int *")
            if self.function(str(count_name))(count) != 0:
                return {}
            devices = range(count[0])
        fn = self.function(handle)
        handles = {}
        for index in devices:
            out = ffi.new("nvmlDevice_t *")
            if fn(index, out) == 0:
                handles[index] = out[0]
        return handles

    def handle_read_ahead(self, index: int) -> Any | None:
        """The handle of GPU ``index`` an early start's thread read under the current initialisation, or ``None``
        (none read, or NVML was initialised again since, or this is a forked child). A session takes it rather than
        calling ``nvmlDeviceGetHandleByIndex`` again: that call, even for a GPU already attached, makes the driver's
        next page-retirement read pay its first cost again (0.4 ms per GPU on an H200: docs/driver-facts.md)."""
        with self._lock:
            ahead = self._handles_ahead
            if ahead is None or self._generation != _fork_generation or not self._initialised:
                return None
            generation, handles = ahead
            return handles.get(index) if generation == self._init_generation else None

    def _warm_reads(self, handles: list[Any], reads: tuple[str, ...]) -> None:
        """Make once per GPU the calls whose first one costs milliseconds on a real driver, results discarded: the
        session's own reads then find them warm (docs/performance.md, "One-shot checks": on an H200 the first
        nvmlDeviceGetRemappedRows took 3.2 ms, the first application clock 4.2 ms). Every one-shot reads the compute
        processes (0.4 ms the first time, then µs); ``reads`` adds any of ``"health"``, ``"current_clocks"``,
        ``"clock_limits"`` (the max and application clocks). Not the MIG mode: it costs 0.4 ms on every call, so
        warming it only adds a call. A missing symbol or a failing call is skipped: the session reports its own."""
        u32 = ffi.new("unsigned int[4]")
        u64 = ffi.new("unsigned long long *")
        state = ffi.new("nvmlEnableState_t *")
        count = ffi.new("unsigned int *")  # 0: the list calls answer with their size only
        null = ffi.NULL
        calls: list[tuple[str | None, tuple[Any, ...]]] = [(self.symbols.compute_processes, (count, null))]
        if "health" in reads:
            field = ffi.new("nvmlFieldValue_t[1]")
            field[0].fieldId = NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
            calls += [("nvmlDeviceGetRemappedRows", (u32, u32 + 1, u32 + 2, u32 + 3)),
                      ("nvmlDeviceGetRetiredPagesPendingStatus", (state,)),
                      ("nvmlDeviceGetTotalEccErrors", (1, 0, u64)),  # uncorrected, volatile
                      ("nvmlDeviceGetFieldValues", (1, field))]  # fmt: skip
            # Not the retired-page list: it shares the pending flag's first cost, and the session's own call ~1 ms
            # after the thread's still cost 0.38 ms in every run (docs/performance.md, "The fourth round").
        if "current_clocks" in reads:
            calls.append(("nvmlDeviceGetClockInfo", (0, u32)))
        if "clock_limits" in reads:
            calls += [(name, (0, u32)) for name in ("nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetApplicationsClock")]
        for name, args in calls:
            if name is None or not _has(self.lib, name):
                continue
            fn = self.function(name)
            for h in handles:
                count[0] = 0
                fn(h, *args)

    def _await(self, pending: _PendingInit, deadline: float | None, timeout_s: float | None) -> None:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        finished = pending.done.wait(remaining)
        with self._lock:
            pending.waiters -= 1
            rc = pending.rc
        if not finished:
            from ..errors import Timeout

            raise Timeout(
                10,
                pending.name,
                detail=f"it did not return within {timeout_s:g} s (a wedged driver?); it is left to finish in a "
                "daemon thread and its initialisation is given back if nobody needs it",
            )
        if rc:
            from ..errors import error_class_for_code

            raise error_class_for_code(rc)(rc, pending.name, detail=self._stub_says() or "")

    def _stub_says(self) -> str | None:
        """nvmlcheck's stub (a test's simulated GPUs) says why its init failed (a scenario line it refused) on its own
        stderr only: its words, for the error a test sees. ``None`` for a real libnvidia-ml."""
        import ctypes  # only on a failed init: a real run never imports it

        try:
            lib = ctypes.CDLL(self.path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # the copy loaded already
            if not hasattr(lib, STUB_MARKER):
                return None
            said = lib.stub_last_error
            said.restype = ctypes.c_char_p
            text: bytes | None = said()
        except (OSError, AttributeError):
            return None
        return f"the stub says: {text.decode('utf-8', 'replace')}" if text else None

    def _shutdown_quietly(self) -> None:
        if _has(self.lib, "nvmlShutdown"):
            self.lib.nvmlShutdown()

    def release(self) -> None:
        """Drop one user; the last one shuts NVML down. Errors from ``nvmlShutdown`` are ignored (nothing to do)."""
        with self._lock:
            if self._generation != _fork_generation:
                # A session inherited from the parent: its reference belongs to the parent's NVML state.
                return
            if self._refcount <= 0:
                return
            self._refcount -= 1
            if self._refcount != 0 or not self._initialised:
                return
            self._initialised = False
            shutting = self._shutting = _thread.allocate_lock()
            shutting.acquire()
        try:
            self._shutdown_quietly()  # outside the lock: a hung one holds up only the acquire that must wait for it
        finally:
            with self._lock:
                if self._shutting is shutting:
                    self._shutting = None
            shutting.release()

    def _forget_parent_state(self) -> None:
        if self._generation != _fork_generation:
            self._generation = _fork_generation
            self._refcount = 0
            self._initialised = False
            self._pending = None  # its thread did not survive the fork
            self._shutting = None  # nor did a shutdown's
            self._early = None
            self._handles_ahead = None

    def _after_fork_in_child(self) -> None:
        # The lock may have been held by another thread of the parent at fork time.
        self._lock = _thread.allocate_lock()


#: The field ID of NVML's recommended recovery action (nvml.h), read by calls.py and warmed by the early thread.
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
#: The GIL switch interval while an early start's thread runs (the interpreter's is given back when it ends).
_EARLY_SWITCH_INTERVAL_S = 0.0001
#: How long an early start waits for its thread to call nvmlInit (it takes ~0.1 ms; this bounds a starved thread).
_EARLY_CALL_WAIT_S = 0.05

_loaded: dict[str, LoadedLibrary] = {}
_loaded_lock = _thread.allocate_lock()


def _untrusted(path: str) -> str | None:
    """Why this process must not load ``path`` named by its environment (``None``: it may): the file and its
    directory are to be owned by this user or root and writable by no one else, so that a variable that travelled
    into a root process (``sudo -E``, ``docker run -e``) cannot make it run another user's code."""
    euid = os.geteuid()
    for item in (path, os.path.dirname(os.path.abspath(path)) or "/"):
        try:
            st = os.stat(item)
        except OSError as exc:
            return f"{item}: {exc.strerror}"
        if st.st_uid not in (euid, 0):
            return f"{item} is owned by uid {st.st_uid}, not by this user ({euid}) or root"
        if st.st_mode & 0o022:
            return f"{item} is writable by other users (mode {st.st_mode & 0o777:o})"
    return None


def _is_stub(path: str) -> bool:
    import ctypes

    try:
        return hasattr(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY), STUB_MARKER)
    except OSError:
        return False


def _check_stub(path: str) -> None:
    if not _is_stub(path):
        from ..errors import BackendUnavailable

        raise BackendUnavailable(
            f"${ENV_LIBRARY} names {path!r}, which is not nvmlcheck's stub library: the variable is a test seam; "
            "load another libnvidia-ml with library_path= or the dynamic loader's path", [f"{path}: no {STUB_MARKER}"])
    from .. import _proc

    # The stub's scenario's stand-in device files count (docs/testing.md): the flag devfiles.stub_loaded_from_env
    # sets, set here without importing devfiles (and its dataclasses) into a one-shot's NVML thread.
    _proc.stub_from_env = True


def library_from_env() -> str | None:
    """The library ``$NVMLCHECK_LIBNVML`` names, for a process a test started with the stub in its environment;
    ``None`` when unset. It is honoured only for nvmlcheck's stub, in a file this user (or root) owns and no one
    else may write: anything else raises :class:`~nvmlcheck.BackendUnavailable`, so a test setting that leaks
    into a real run cannot load another library, nor stand in for the driver without saying so."""
    path = os.environ.get(ENV_LIBRARY)
    if not path:
        return None
    why = _untrusted(path)
    if why is not None:
        from ..errors import BackendUnavailable

        raise BackendUnavailable(f"${ENV_LIBRARY} names {path!r}, which is not loaded: {why}", [f"{path}: {why}"])
    return path


def load(path: str | None = None) -> LoadedLibrary:
    """dlopen libnvidia-ml (once per path) and probe its symbols.

    Raises :class:`~nvmlcheck.BackendUnavailable` listing every path tried and why it failed.
    """
    attempts: list[str] = []
    from_env = None if path else library_from_env()
    with _loaded_lock:
        for candidate in (path,) if path else (from_env,) if from_env else DEFAULT_NAMES:
            loaded = _loaded.get(candidate)
            if loaded is None:
                try:
                    lib = ffi.dlopen(candidate)
                except OSError as exc:
                    attempts.append(f"{candidate}: {exc}")
                    continue
                loaded = LoadedLibrary(candidate, lib)
            if from_env is not None:
                _check_stub(candidate)
            _loaded[candidate] = loaded
            return loaded
    from ..errors import BackendUnavailable

    source = f" (${ENV_LIBRARY})" if from_env else ""
    raise BackendUnavailable(
        f"libnvidia-ml could not be loaded{source}; install the NVIDIA driver (or put its directory on the dynamic "
        "loader's path, or pass library_path=)",
        attempts,
    )


def start_early(
    path: str | None = None, devices: Sequence[int] | None = (), reads: tuple[str, ...] = ()
) -> _PendingInit | None:
    """Load libnvidia-ml here and start ``nvmlInit`` in its thread, now: a one-shot command calls this before it
    imports the rest of nvmlcheck, so the driver initialises while Python imports, and the session it opens later
    finds NVML initialised (or joins the init in flight: :meth:`LoadedLibrary.acquire` bounds it as usual).

    ``devices``: once initialised, the same thread reads the handle of each of these GPU indices (``None``: every
    GPU), whose first ``nvmlDeviceGetHandleByIndex`` costs milliseconds on a real driver (docs/performance.md);
    then, for ``reads`` (``"health"``, ``"current_clocks"``, ``"clock_limits"``), it makes once per GPU the calls
    whose first one is slow (results discarded: the session reads its own). The ``dlopen`` is made in the caller's
    thread: the init thread then holds the GIL only between C calls, so it takes next to nothing from the imports
    it overlaps. Never raises and reports nothing: whatever failed here fails again, and is reported, in the
    ``acquire`` that follows.
    Returns the init in flight (``None`` if none was started), whose ``warmed`` event tests wait on.
    """
    try:
        return load(path).begin_early(devices, reads)
    except Exception:
        return None


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1
    global _loaded_lock
    _loaded_lock = _thread.allocate_lock()
    for loaded in _loaded.values():
        loaded._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
