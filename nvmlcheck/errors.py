"""The exceptions nvmlcheck raises.

Every exception derives from :class:`NvmlCheckError`; all pickle, and their messages stand alone. The tree::

    NvmlCheckError
    ├── BackendUnavailable              no library / no nvidia-smi / no driver; ``.attempts`` says what was tried
    ├── NvmlError(code, function)       an NVML call returned an error code; one subclass per code in nvml.h
    │   ├── DriverNotLoaded, LibraryNotFound, LibraryVersionMismatch: also BackendUnavailable
    │   ├── GpuLost, GpuRequiresReset, NoPermission, NotSupported, Timeout, InUse, NotReady, ... (every other code)
    │   └── Unknown                     NVML_ERROR_UNKNOWN (999) and any code not known here (``.code`` kept)
    ├── SmiError(argv, returncode, stderr)
    │   ├── SmiTimeout                  nvidia-smi (or its prefix, e.g. ssh) did not answer in time; group killed
    │   ├── SmiTransportError           the command prefix (ssh, pct exec) or the spawn itself failed; never GPU state
    │   │   └── SmiTransportTimeout (also TimeoutError)  ssh's own connect timeout: transient, as a host's HostTimeout
    │   └── SmiParseError(line_no, line)
    ├── CorruptData                     values that cannot be true (PID 0, used > total): a struct layout mismatch
    ├── GpuFault(index, uuid, kind, xid, meaning)  a fatal NVML event (XID 79, 48, ...) on a GPU a wait judges
    ├── WaitTimeout (also TimeoutError) the GPUs were not clean at the deadline; carries the last snapshot and culprits
    ├── ArgumentError (also ValueError)  a value nvmlcheck cannot use (a bad size, timeout, selector, scenario field)
    │   ├── NoSuchDevice (also KeyError) an index or UUID that names no GPU (of the host, or of a snapshot)
    │   └── NoSuchProcess (also ProcessLookupError)  a PID that names no running process
    ├── ArgumentTypeError (also TypeError)  an argument of the wrong type
    └── StateError (also RuntimeError)  a call the object cannot take now (a kill plan used out of order)
        └── SessionClosed (also ValueError)  a call on a closed session

Other modules add their own subclasses (``KillError``, ``HostError``, ``StudyError``, ``CudaMappingError``, ...): every
exception nvmlcheck raises on purpose is an :class:`NvmlCheckError`, and the classes that stand for a built-in kind
keep it as a second base, so ``except ValueError`` goes on working.

How an error is handled is declared once, on its class: ``TRANSIENT`` (a wait retries it until its deadline) and,
for NVML codes, ``SCOPE`` (what it leaves unreadable). A new NVML return code is one ``@_code(...)`` class here.
"""

from __future__ import annotations

from collections.abc import Sequence

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, ClassVar, Literal, TypeAlias

    from .model import Snapshot
    from .verdict import Culprit

    #: See :attr:`NvmlError.SCOPE`.
    Scope: TypeAlias = Literal["value", "read", "device"]

__all__ = [
    "AlreadyInitialized",
    "ArgumentError",
    "ArgumentTypeError",
    "ArgumentVersionMismatch",
    "BackendUnavailable",
    "CorruptData",
    "CorruptedInforom",
    "Deprecated",
    "DriverNotLoaded",
    "FreqNotSupported",
    "FunctionNotFound",
    "GpuFault",
    "GpuLost",
    "GpuNotFound",
    "GpuRequiresReset",
    "InUse",
    "InsufficientPower",
    "InsufficientResources",
    "InsufficientSize",
    "InvalidArgument",
    "InvalidState",
    "IrqIssue",
    "LibraryNotFound",
    "LibraryVersionMismatch",
    "NoData",
    "NoPermission",
    "NoSuchDevice",
    "NoSuchProcess",
    "NotFound",
    "NotReady",
    "NotSupported",
    "NvmlCheckError",
    "NvmlError",
    "NvmlMemoryError",
    "OperatingSystemError",
    "ResetTypeNotSupported",
    "SessionClosed",
    "SmiError",
    "SmiParseError",
    "SmiTimeout",
    "SmiTransportError",
    "SmiTransportTimeout",
    "StateError",
    "Timeout",
    "Uninitialized",
    "Unknown",
    "VgpuEccNotSupported",
    "WaitTimeout",
    "error_class_for_code",
]


def _lines(value: Sequence[str]) -> tuple[str, ...]:
    """A sequence of lines (or words) as a tuple; one ``str`` is one line, not a line per character."""
    return (value,) if isinstance(value, str) else tuple(value)


class NvmlCheckError(Exception):
    """Base class of every exception nvmlcheck raises. A caller tells how to handle one by its class and
    :attr:`TRANSIENT`, never by its message:

    - a bad argument: :class:`ArgumentError` (also a ``ValueError``; :class:`NoSuchDevice`, :class:`NoSuchProcess`)
      and :class:`ArgumentTypeError` (also a ``TypeError``): fix the call, asking again gives the same answer;
    - a call the object cannot take now: :class:`StateError` (:class:`SessionClosed`): open a new session or follow
      the object's order;
    - a verdict, not a failure: :class:`WaitTimeout` (also a ``TimeoutError``): the GPUs were not clean in time,
      ``holders`` says what holds them;
    - retry later: an error whose ``TRANSIENT`` is ``True`` (``nvmlcheck.wait.is_transient(exc)``): NVML's
      :class:`Timeout`, :class:`Unknown`, :class:`NotReady`, :class:`InUse`, nvidia-smi's failures and
      :class:`SmiTimeout`, a host's :class:`~nvmlcheck.hosts.HostTimeout`, ...; a wait retries these itself until
      its deadline (a fleet's call does not: its deadline is spent; a caller polling hosts may);
    - give up or call an operator: every other error (``TRANSIENT`` ``False``): :class:`BackendUnavailable`,
      :class:`GpuLost`, :class:`GpuRequiresReset`, :class:`NoPermission`, :class:`CorruptData`, :class:`GpuFault`,
      :class:`SmiParseError`, ...

    Every exception pickles to an equal one (class, message, every attribute): to carry it between processes that
    run the same nvmlcheck (``multiprocessing``, ``concurrent.futures``, a job queue's workers). Across versions a
    pickle is not promised: one made by an earlier version loads where its class's form allows (those of 0.1.0
    do, :class:`KillTimeout`'s, :class:`SelectTimeout`'s and :class:`CudaMappingError`'s included), an attribute
    added since is then missing, and one made by a later version may not load in an earlier one. To keep an error,
    keep ``str(exc)`` or the CLI's ``nvmlcheck/error`` JSON document.
    """

    __module__ = "nvmlcheck"
    #: Whether asking again may help: a wait retries a transient error until its deadline and fails at once on any
    #: other (fatal) one. Declared by each class below; a subclass that does not declare it inherits its parent's.
    TRANSIENT: ClassVar[bool] = False

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle every exception of the package the same way: its class and ``args`` (so its message) rebuilt
        without calling ``__init__`` (whose signature differs from class to class, and could not be called again
        with ``args`` alone), then every attribute restored as it was, including those set after it was raised
        (``add_note``'s notes) and the built-in base's own (an ``ImportError``'s ``name``, an ``OSError``'s
        ``errno``). The unpickled exception is equal to the original, attribute for attribute. As for any Python
        exception, the chain (``__cause__``, ``__context__``) and the traceback are not pickled: the message
        stands alone."""
        state = dict(self.__dict__)
        for base, names in _BUILTIN_STATE:
            if isinstance(self, base):
                # Only those set: OSError's message reads an attribute set to None as one given ("None -> None").
                state.update((name, value) for name in names if (value := getattr(self, name)) is not None)
        return (_rebuild, (type(self), self.args), state)


#: The attributes of built-in exception bases kept outside ``__dict__`` (C slots), which pickling restores.
_BUILTIN_STATE: tuple[tuple[type[BaseException], tuple[str, ...]], ...] = (
    (OSError, ("errno", "strerror", "filename", "filename2")),
    (ImportError, ("msg", "name", "path")),
)


def _rebuild(cls: type[NvmlCheckError], args: tuple[Any, ...]) -> NvmlCheckError:
    """An exception of ``cls`` with ``args``, made without ``__init__``; pickle then restores its attributes."""
    exc = cls.__new__(cls, *args)
    exc.args = args  # OSError's __new__ leaves them to an __init__ of a subclass that has one
    return exc


class BackendUnavailable(NvmlCheckError):
    """No backend could be opened: no libnvidia-ml, no nvidia-smi, no driver.

    ``attempts`` holds one line per thing that was tried and why it failed.
    """

    __module__ = "nvmlcheck"
    TRANSIENT = False  # no library, driver or nvidia-smi: asking again will not load one

    def __init__(self, message: str, attempts: Sequence[str] = ()) -> None:
        self.attempts: tuple[str, ...] = _lines(attempts)
        full = message
        if self.attempts:
            full += "\n" + "\n".join(f"  - {a}" for a in self.attempts)
        super().__init__(full)
        self.message = message


class NvmlError(NvmlCheckError):
    """An NVML call returned an error code.

    ``code`` is the numeric ``nvmlReturn_t``, ``function`` the C symbol that returned it (for example
    ``"nvmlDeviceGetMemoryInfo_v2"``), ``device_index`` the device it was asked about, when there was one.

    Each code's class declares ``TRANSIENT`` (see :class:`NvmlCheckError`) and ``SCOPE``, what the error leaves
    unreadable when a backend reads one value of a GPU:

    - ``"value"``: that value does not exist here (not supported, function missing): it is ``None`` with a reason,
      whatever it is;
    - ``"read"`` (the default): this read failed: an optional value (clocks, memory health, MIG) is ``None`` with a
      reason, a value a wait judges (memory, processes) or the identity (serial number excepted) fails the GPU;
    - ``"device"``: the GPU or NVML itself is unusable (lost, reset required, no driver): every read fails the GPU.
    """

    __module__ = "nvmlcheck"
    #: The nvml.h constant this class stands for (``None`` on the base class).
    CODE: ClassVar[int | None] = None
    #: NVML's own name for the code.
    CODE_NAME: ClassVar[str] = "NVML_ERROR"
    #: What a person can do about it; appended to the message.
    HINT: ClassVar[str] = ""
    #: What the error leaves unreadable when one value is read: ``"value"``, ``"read"`` or ``"device"`` (above).
    SCOPE: ClassVar[Scope] = "read"
    #: How ``DeviceState.unknown`` words a value this error left unknown (``{function}``: the C symbol); empty:
    #: ``"unreadable: "`` and the error's message.
    WHY_UNKNOWN: ClassVar[str] = ""

    def __init__(self, code: int, function: str, device_index: int | None = None, detail: str = "") -> None:
        self.code = code
        self.function = function
        self.device_index = device_index
        self.detail = detail
        super().__init__(self._compose())

    def _compose(self) -> str:
        where = f" for GPU {self.device_index}" if self.device_index is not None else ""
        name = _CODE_NAMES.get(self.code, f"unknown NVML return code {self.code}")
        msg = f"{self.function}{where} failed: {name} ({self.code})"
        if self.detail:
            msg += f": {self.detail}"
        if self.HINT:
            msg += f". {self.HINT}"
        return msg


class SmiError(NvmlCheckError):
    """nvidia-smi (or its command prefix) failed: it exited non-zero or printed an error instead of data.

    Transient: the next run may answer (the subclasses say otherwise where it cannot)."""

    __module__ = "nvmlcheck"
    TRANSIENT = True

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, message: str = "") -> None:
        self.argv: tuple[str, ...] = _lines(argv)
        self.returncode = returncode
        self.stderr = stderr
        self.message = message
        text = message or f"nvidia-smi failed with exit code {returncode}"
        cmd = " ".join(self.argv)
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        super().__init__(f"{text} (command: {cmd})" + (f": {detail}" if detail else ""))


class SmiTimeout(SmiError):
    """nvidia-smi (or its prefix, such as ``ssh``) did not answer in time; its whole process group was killed."""

    __module__ = "nvmlcheck"
    TRANSIENT = True  # a wedged GPU can make one run hang and the next answer

    def __init__(self, argv: Sequence[str], timeout_s: float, stderr: str = "") -> None:
        self.timeout_s = timeout_s
        super().__init__(
            argv,
            None,
            stderr,
            f"nvidia-smi did not answer within {timeout_s:g} s and was killed with its process group "
            "(a wedged GPU or an unreachable host)",
        )


class SmiTransportError(SmiError):
    """The way to nvidia-smi failed, not nvidia-smi: the command prefix's own error (``ssh`` exit 255, a remote shell's
    "command not found" 127 or "not executable" 126) or the executable could not be started at all. It says nothing
    about the GPUs and is never read as GPU state."""

    __module__ = "nvmlcheck"
    TRANSIENT = False  # command not found, ssh refused: running it again will not fix it


class SmiTransportTimeout(SmiTransportError, TimeoutError):
    """The command prefix timed out on its own: ssh's exit 255 with ``Connection timed out`` (``Operation timed
    out``, ``... during banner exchange``) as its last word. Transient, unlike the other transport errors: the host
    may answer the next call, and a fleet (:mod:`nvmlcheck.hosts`) calls the same failure a transient
    :class:`~nvmlcheck.hosts.HostTimeout`. Still no GPU state, never clean."""

    __module__ = "nvmlcheck"
    TRANSIENT = True  # a lost packet or a loaded host: the next connect may succeed


class SmiParseError(SmiError):
    """nvidia-smi printed something the parser cannot read; nothing is guessed from it."""

    __module__ = "nvmlcheck"
    TRANSIENT = False  # the output format is not what we read: the next run prints the same

    def __init__(self, reason: str, line_no: int, line: str, argv: Sequence[str] = ()) -> None:
        self.reason = reason
        self.line_no = line_no
        self.line = line
        super().__init__(argv, 0, "", f"cannot parse nvidia-smi output line {line_no} ({reason}): {line!r}")


class CorruptData(NvmlCheckError):
    """A value that cannot be true (PID 0, used bytes above total): most likely a struct layout mismatch between
    this library and the driver (as NVML 535.43 caused). It is never reported as data."""

    __module__ = "nvmlcheck"
    TRANSIENT = False  # a layout mismatch does not go away

    def __init__(self, message: str, function: str = "", device_index: int | None = None) -> None:
        self.function = function
        self.device_index = device_index
        self.message = message
        where = f"{function}" + (f" for GPU {device_index}" if device_index is not None else "")
        prefix = f"{where}: " if where else ""
        super().__init__(
            f"{prefix}{message}. The driver's struct layout probably differs from the one nvmlcheck was built for; "
            "the value is discarded rather than reported"
        )


#: Culprit lines that name no holder (see :class:`WaitTimeout`).
_NOT_HOLDERS = ("clean at the last poll, but only", "no poll finished before the deadline")


class WaitTimeout(NvmlCheckError, TimeoutError):
    """The GPUs were not clean when the deadline passed.

    ``timeout_s`` is the timeout asked for, ``elapsed_ns`` the time actually waited, ``snapshot`` the last snapshot
    taken (``None`` if not even one poll succeeded), ``culprits`` one line per thing still holding a GPU.
    ``holders`` is the same as data: one :class:`~nvmlcheck.verdict.Culprit` per cause (GPU, PID, name, bytes,
    kind, class, container, action), given by the raiser or, when it gave none, judged from ``snapshot`` on first
    use (:func:`nvmlcheck.verdict.holders_of`). ``held``: whether the last poll saw something hold a GPU (the
    predicate was ``False``), as the raiser knows it; ``False`` when the GPUs could not be judged (an unknown value,
    an unreadable GPU, a failed poll): the message then says "not confirmed clean", not "still held". ``None`` (the
    default): told from the culprit lines. The attribute ``held`` is the answer.
    """

    __module__ = "nvmlcheck"

    def __init__(
        self,
        timeout_s: float,
        elapsed_ns: int,
        culprits: Sequence[str],
        snapshot: Snapshot | None = None,
        polls: int = 0,
        *,
        holders: Sequence[Culprit] | None = None,
        held: bool | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.elapsed_ns = elapsed_ns
        self.culprits: tuple[str, ...] = _lines(culprits)
        self.snapshot = snapshot
        self.polls = polls
        self._holders: tuple[Culprit, ...] | None = None if holders is None else tuple(holders)
        lines = "\n".join(f"  - {c}" for c in self.culprits) if self.culprits else "  - (no detail available)"
        # "Still held" only when something was seen holding: a clean poll that could not be confirmed in time, a
        # poll that never finished, a GPU that could not be judged, is not a holder (a user read "still held" on an
        # idle GPU as a busy one).
        if held is None:
            held = not self.culprits or not all(c.startswith(_NOT_HOLDERS) for c in self.culprits)
        #: Whether the last poll saw something hold a GPU ("still held"), or the GPUs could not be judged.
        self.held: bool = held
        head, verdict = ("GPUs not clean", "still held") if held else ("GPUs not confirmed clean", "why")
        noun = "poll" if polls == 1 else "polls"
        super().__init__(
            f"{head} after {elapsed_ns / 1e9:.3f} s (timeout {timeout_s:g} s, {polls} {noun}); {verdict}:\n{lines}"
        )

    @property
    def holders(self) -> tuple[Culprit, ...]:
        """What still holds the GPUs, as data (see the class docstring); judged from :attr:`snapshot` once when the
        raiser gave none (the holders' ``/proc`` state and container are read then)."""
        if self._holders is None:
            from .verdict import holders_of  # layer 3, loaded only when asked for

            self._holders = holders_of(self.snapshot)
        return self._holders

    def __reduce__(self) -> tuple[Any, ...]:
        # The holders are judged here if they were not yet, so the copy holds what the original holds and would
        # hold: judged again after unpickling (another process, another host, later), a holder's /proc state and
        # container would be read anew or not at all, and the copy would name other holders, or none.
        # Holders that cannot be judged stay unjudged: the copy then fails to judge them as the original does, and
        # the timeout still travels (a pickling that raised would lose it: multiprocessing cannot send it).
        import contextlib  # here, not at the top: errors.py is on every one-shot's import path

        with contextlib.suppress(Exception):
            self.holders  # noqa: B018 - read for its side effect: the holders judged and kept
        return super().__reduce__()


class GpuFault(NvmlCheckError):
    """A fatal NVML event on a GPU a wait or kill judges: it cannot become clean without an operator (a reset, a
    reboot, a replaced board), so the wait stops at once instead of polling to its timeout.

    ``index`` and ``uuid`` name the GPU, ``kind`` the event kind (``"xid"`` or ``"double_bit_ecc"``), ``xid`` the
    XID code (``None`` for an ECC event) and ``meaning`` what NVIDIA's XID catalogue says it is (docs/events.md).
    ``time_ns`` is when the listener received it (``time.monotonic_ns``), ``wall_time`` the same moment in
    ``time.time`` seconds.
    """

    __module__ = "nvmlcheck"
    TRANSIENT = False  # the GPU needs an operator

    def __init__(
        self,
        index: int,
        uuid: str | None,
        kind: str,
        xid: int | None,
        meaning: str,
        *,
        time_ns: int = 0,
        wall_time: float = 0.0,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.kind = kind
        self.xid = xid
        self.meaning = meaning
        self.time_ns = time_ns
        self.wall_time = wall_time
        gpu = f"GPU {index}" + (f" ({uuid})" if uuid else "")
        what = f"XID {xid}" if xid is not None else kind.replace("_", "-")
        super().__init__(
            f"{gpu} reported {what}: {meaning}; it cannot become clean without an operator, so the wait stopped "
            "(see docs/events.md)"
        )


class ArgumentError(NvmlCheckError, ValueError):
    """An argument nvmlcheck cannot use: a value out of range, a malformed size, timeout or device selector, an
    unknown name. Also a ``ValueError`` (the CLI exits 2 on it); the message names the argument and what it
    accepts."""

    __module__ = "nvmlcheck"


class NoSuchDevice(ArgumentError, KeyError):
    """An index or UUID that names no GPU: none of this host's (``devices=``, ``--devices``), or none of a snapshot's
    (:meth:`~nvmlcheck.Snapshot.device`). Also a ``KeyError`` and a ``ValueError``."""

    __module__ = "nvmlcheck"

    def __str__(self) -> str:
        return Exception.__str__(self)  # not KeyError's: a message is not a key to quote


class NoSuchProcess(ProcessLookupError, ArgumentError):
    """A PID that names no running process where one was needed. Also a ``ProcessLookupError`` (first: its
    instance layout is ``OSError``'s) and a ``ValueError``."""

    __module__ = "nvmlcheck"


class ArgumentTypeError(NvmlCheckError, TypeError):
    """An argument of the wrong type (a PID that is not an int, a predicate used as a bool). Also a
    ``TypeError``."""

    __module__ = "nvmlcheck"


class StateError(NvmlCheckError, RuntimeError):
    """A call the object cannot take in the state it is in: a kill plan waited on before its first signal or used
    after it closed, a stopped fleet. Also a ``RuntimeError``."""

    __module__ = "nvmlcheck"


class SessionClosed(StateError, ValueError):
    """A call on a session that was closed. Also a ``ValueError``, as for a closed file."""

    __module__ = "nvmlcheck"


class DeadlinePassed(Exception):
    """Internal: a backend abandoned a snapshot because the wait's deadline passed between two of its queries.

    Raised by a backend's ``snapshot(..., deadline=...)`` and turned into :class:`WaitTimeout` by the poller; it
    never reaches a caller of the public API. Deliberately not an :class:`NvmlCheckError`, so that no handler for
    real errors (a device failure, a transient error to retry) can take it for one.
    """


# --- one class per nvmlReturn_t code --------------------------------------------------------------------------------

_CODE_NAMES: dict[int, str] = {}
_CODE_CLASSES: dict[int, type[NvmlError]] = {}


def _code(
    code: int, name: str, hint: str = "", *, transient: bool, scope: Scope = "read", why_unknown: str = ""
) -> Any:
    """Class decorator registering an NvmlError subclass for one nvml.h return code.

    ``transient`` has no default, so that every code says whether a wait retries it; ``scope`` and ``why_unknown``
    set :attr:`NvmlError.SCOPE` and :attr:`NvmlError.WHY_UNKNOWN`.
    """

    def register(cls: type[NvmlError]) -> type[NvmlError]:
        cls.CODE = code
        cls.CODE_NAME = name
        cls.HINT = hint
        cls.TRANSIENT = transient
        cls.SCOPE = scope
        cls.WHY_UNKNOWN = why_unknown
        cls.__module__ = "nvmlcheck"
        _CODE_NAMES[code] = name
        _CODE_CLASSES[code] = cls
        return cls

    return register


@_code(
    1,
    "NVML_ERROR_UNINITIALIZED",
    "NVML was used before nvmlInit or after nvmlShutdown; open a new session",
    transient=False,
    scope="device",
)
class Uninitialized(NvmlError):
    """NVML_ERROR_UNINITIALIZED (1)."""


@_code(2, "NVML_ERROR_INVALID_ARGUMENT", transient=False)
class InvalidArgument(NvmlError):
    """NVML_ERROR_INVALID_ARGUMENT (2): a bad device index, handle or struct version."""


@_code(
    3,
    "NVML_ERROR_NOT_SUPPORTED",
    transient=False,
    scope="value",
    why_unknown="not supported: {function} returned NVML_ERROR_NOT_SUPPORTED",
)
class NotSupported(NvmlError):
    """NVML_ERROR_NOT_SUPPORTED (3): the device or driver does not offer this query (reported as ``None``)."""


@_code(4, "NVML_ERROR_NO_PERMISSION", "Run as a user allowed to query the GPU (or root)", transient=False)
class NoPermission(NvmlError):
    """NVML_ERROR_NO_PERMISSION (4)."""


@_code(5, "NVML_ERROR_ALREADY_INITIALIZED", transient=False)
class AlreadyInitialized(NvmlError):
    """NVML_ERROR_ALREADY_INITIALIZED (5), deprecated by NVML."""


@_code(6, "NVML_ERROR_NOT_FOUND", transient=False)
class NotFound(NvmlError):
    """NVML_ERROR_NOT_FOUND (6): no such device or object."""


# Transient: the process list kept growing between the size query and the fill; the next poll may fit.
@_code(7, "NVML_ERROR_INSUFFICIENT_SIZE", transient=True)
class InsufficientSize(NvmlError):
    """NVML_ERROR_INSUFFICIENT_SIZE (7): a buffer was too small (nvmlcheck grows and retries a bounded number of
    times; this escapes only when the list kept growing)."""


@_code(8, "NVML_ERROR_INSUFFICIENT_POWER", "Check the GPU's external power cables", transient=False)
class InsufficientPower(NvmlError):
    """NVML_ERROR_INSUFFICIENT_POWER (8)."""


@_code(
    9,
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "Load the NVIDIA kernel driver (is this a GPU host?)",
    transient=False,
    scope="device",
)
class DriverNotLoaded(NvmlError, BackendUnavailable):
    """NVML_ERROR_DRIVER_NOT_LOADED (9); also a :class:`BackendUnavailable`."""

    def __init__(self, code: int, function: str, device_index: int | None = None, detail: str = "") -> None:
        NvmlError.__init__(self, code, function, device_index, detail)
        self.attempts = ()
        self.message = str(self)


@_code(10, "NVML_ERROR_TIMEOUT", transient=True)
class Timeout(NvmlError):
    """NVML_ERROR_TIMEOUT (10)."""


@_code(
    11,
    "NVML_ERROR_IRQ_ISSUE",
    "The kernel reported an interrupt problem with the GPU; check dmesg",
    transient=False,
)
class IrqIssue(NvmlError):
    """NVML_ERROR_IRQ_ISSUE (11)."""


@_code(12, "NVML_ERROR_LIBRARY_NOT_FOUND", "Install the NVIDIA driver's libnvidia-ml", transient=False, scope="device")
class LibraryNotFound(NvmlError, BackendUnavailable):
    """NVML_ERROR_LIBRARY_NOT_FOUND (12); also a :class:`BackendUnavailable`."""

    def __init__(self, code: int, function: str, device_index: int | None = None, detail: str = "") -> None:
        NvmlError.__init__(self, code, function, device_index, detail)
        self.attempts = ()
        self.message = str(self)


@_code(
    13,
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "The installed driver is older than this call",
    transient=False,
    scope="value",
    why_unknown="not available: {function} is missing from this driver's libnvidia-ml",
)
class FunctionNotFound(NvmlError):
    """NVML_ERROR_FUNCTION_NOT_FOUND (13), also raised when a symbol is missing from the loaded library."""


@_code(14, "NVML_ERROR_CORRUPTED_INFOROM", "The GPU's infoROM is corrupted; contact the vendor", transient=False)
class CorruptedInforom(NvmlError):
    """NVML_ERROR_CORRUPTED_INFOROM (14)."""


@_code(
    15,
    "NVML_ERROR_GPU_IS_LOST",
    "The GPU fell off the bus or stopped answering; it needs a reset or a reboot",
    transient=False,
    scope="device",
)
class GpuLost(NvmlError):
    """NVML_ERROR_GPU_IS_LOST (15)."""


@_code(16, "NVML_ERROR_RESET_REQUIRED", "Reset the GPU (nvidia-smi -r) or reboot", transient=False, scope="device")
class GpuRequiresReset(NvmlError):
    """NVML_ERROR_RESET_REQUIRED (16)."""


@_code(17, "NVML_ERROR_OPERATING_SYSTEM", transient=True)
class OperatingSystemError(NvmlError):
    """NVML_ERROR_OPERATING_SYSTEM (17)."""


@_code(
    18,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "The kernel driver and libnvidia-ml differ in version (a driver upgrade without reboot?); reboot or reload it",
    transient=False,
    scope="device",
)
class LibraryVersionMismatch(NvmlError, BackendUnavailable):
    """NVML_ERROR_LIB_RM_VERSION_MISMATCH (18); also a :class:`BackendUnavailable`."""

    def __init__(self, code: int, function: str, device_index: int | None = None, detail: str = "") -> None:
        NvmlError.__init__(self, code, function, device_index, detail)
        self.attempts = ()
        self.message = str(self)


@_code(19, "NVML_ERROR_IN_USE", transient=True)
class InUse(NvmlError):
    """NVML_ERROR_IN_USE (19)."""


@_code(20, "NVML_ERROR_MEMORY", transient=True)
class NvmlMemoryError(NvmlError):
    """NVML_ERROR_MEMORY (20): NVML ran out of host memory."""


@_code(21, "NVML_ERROR_NO_DATA", transient=True)
class NoData(NvmlError):
    """NVML_ERROR_NO_DATA (21)."""


@_code(22, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", transient=False)
class VgpuEccNotSupported(NvmlError):
    """NVML_ERROR_VGPU_ECC_NOT_SUPPORTED (22)."""


@_code(23, "NVML_ERROR_INSUFFICIENT_RESOURCES", transient=True)
class InsufficientResources(NvmlError):
    """NVML_ERROR_INSUFFICIENT_RESOURCES (23)."""


@_code(24, "NVML_ERROR_FREQ_NOT_SUPPORTED", transient=False)
class FreqNotSupported(NvmlError):
    """NVML_ERROR_FREQ_NOT_SUPPORTED (24)."""


@_code(25, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", "A struct version is not what this driver expects", transient=False)
class ArgumentVersionMismatch(NvmlError):
    """NVML_ERROR_ARGUMENT_VERSION_MISMATCH (25)."""


@_code(26, "NVML_ERROR_DEPRECATED", transient=False)
class Deprecated(NvmlError):
    """NVML_ERROR_DEPRECATED (26)."""


@_code(27, "NVML_ERROR_NOT_READY", transient=True)
class NotReady(NvmlError):
    """NVML_ERROR_NOT_READY (27)."""


@_code(28, "NVML_ERROR_GPU_NOT_FOUND", transient=False)
class GpuNotFound(NvmlError):
    """NVML_ERROR_GPU_NOT_FOUND (28)."""


@_code(29, "NVML_ERROR_INVALID_STATE", transient=False)
class InvalidState(NvmlError):
    """NVML_ERROR_INVALID_STATE (29)."""


@_code(30, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", transient=False)
class ResetTypeNotSupported(NvmlError):
    """NVML_ERROR_RESET_TYPE_NOT_SUPPORTED (30)."""


# Transient, though it can be sticky (nvidia-docker #1671): retried until the deadline, which then names it.
@_code(999, "NVML_ERROR_UNKNOWN", transient=True)
class Unknown(NvmlError):
    """NVML_ERROR_UNKNOWN (999), and any return code this version of nvmlcheck does not know (``.code`` is kept)."""


#: Every return code nvml.h defines other than NVML_SUCCESS (0), for tests and documentation.
KNOWN_CODES: tuple[int, ...] = tuple(sorted(_CODE_CLASSES))


def codes_in_scope(scope: Scope) -> frozenset[int]:
    """The known return codes whose class has :attr:`NvmlError.SCOPE` ``scope``: for code that tests raw return
    codes in a loop (``rc in codes``) without building an exception per call. Codes not known here map to
    :class:`Unknown` and have its scope."""
    return frozenset(code for code, cls in _CODE_CLASSES.items() if scope == cls.SCOPE)


def error_class_for_code(code: int) -> type[NvmlError]:
    """The exception class for an ``nvmlReturn_t`` value; unknown codes map to :class:`Unknown`."""
    return _CODE_CLASSES.get(code, Unknown)


def code_name(code: int) -> str:
    """NVML's constant name for ``code``, or a description when the code is unknown."""
    return "NVML_SUCCESS" if code == 0 else _CODE_NAMES.get(code, f"unknown NVML return code {code}")
