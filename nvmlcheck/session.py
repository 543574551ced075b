"""Sessions: an open backend plus device selection, snapshots and waiting.

>>> import nvmlcheck as nc
>>> with nc.open() as gpus:                       # doctest: +SKIP
...     snap = gpus.snapshot()
...     gpus.wait_until_clean(timeout=30.0)

Entry points: :func:`open` (picks a backend: NVML, else nvidia-smi), :class:`Session` (``resolve`` for indices,
UUIDs, ``MIG-…`` and ``cuda:N``; ``snapshot``; ``wait_until_clean``; ``select_clean``; ``holders``; ``ready``;
``listen``) and :func:`wait_until_clean`, which counts the opening in its timeout. The layers below and the path of
one poll: docs/architecture.md; waiting and its policies: docs/waiting.md.
"""

from __future__ import annotations

import _thread
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType

from ._text import is_digits
from ._waitdefaults import CLOCK, EVENTS, ON_POLL, POLICY, READY_TIMEOUT, SLEEP, STABLE_POLLS, TIMEOUT, TRACE
from .backends import open_backend
from .errors import ArgumentError, ArgumentTypeError, NoSuchDevice, NvmlCheckError, SessionClosed
from .model import DeviceState, Fields, Snapshot, SystemInfo

TYPE_CHECKING = False  # no typing at run time: it costs a one-shot check milliseconds (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TypeVar

    from .backends import Backend
    from .cudamap import CudaMapping
    from .errors import WaitTimeout
    from .events import EventListener
    from .holders import Holder
    from .locks import Owner
    from .model import MigDevice
    from .predicates import Predicate
    from .selection import Selection
    from .verdict import ReadyReport
    from .wait import Deadline, PollPolicy, TracePoint, WaitOptions, WaitResult

    _T = TypeVar("_T")

__all__ = ["CLOSE_TIMEOUT_S", "DeviceSelector", "Session", "open", "wait_until_clean"]

# The least time each nvidia-smi run of wait_until_clean's "auto" fallback gets (see its docstring).
_SMI_FALLBACK_FLOOR_S = 1.0
# Sleeps between polls at least this long wait on the event listener instead of time.sleep (see wait_until_clean).
_EVENT_SLEEP_MIN_S = 0.01
#: How long :meth:`Session.close` waits for the backend's release (``nvmlShutdown``) by default: as long as
#: :func:`open` gives ``nvmlInit``, which can hang on a wedged driver too.
CLOSE_TIMEOUT_S = 10.0
# The longest wait a lock takes (threading.TIMEOUT_MAX, without importing threading); a longer one is no bound.
_MAX_LOCK_WAIT_S = _thread.TIMEOUT_MAX

#: A device is named by its NVML index, by its UUID (a unique prefix such as ``"GPU-acdc9db5"`` is enough), or by a
#: CUDA selector ``"cuda:N"`` / ``"cuda:all"`` (through ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``).
DeviceSelector = int | str


def _by_uuid(item: str, uuids: Mapping[int, str], unreadable: Mapping[int, str]) -> tuple[int, ...]:
    """The GPU a UUID or unique UUID prefix names. While a GPU's UUID cannot be read (lost, ...), a prefix cannot be
    shown to name one GPU alone, and a UUID no readable GPU has may be that GPU's: those GPUs are taken (their
    reading then says why they cannot be judged), never the readable GPU a prefix happens to match. Compared in
    any case (``gpu-8932F937`` is ``GPU-8932f937``: UUIDs are hex; nvmlcheck's own selectors, where
    ``CUDA_VISIBLE_DEVICES`` takes the ``GPU-`` prefix in capitals only: docs/cuda.md)."""
    key = item.upper()
    matches = [i for i, u in uuids.items() if u.upper().startswith(key)]
    exact = [i for i, u in uuids.items() if u.upper() == key]
    if exact:
        return (exact[0],)  # a whole UUID names one GPU, whatever the others are
    # Only what can start a GPU's UUID ("GPU-…", or "G", "GPU" before it) may be an unreadable one's.
    if unreadable and (item[:4].upper() == "GPU-" or "GPU-".startswith(item.upper())):
        if matches:
            gpus = ", ".join(f"GPU {i} ({why})" for i, why in sorted(unreadable.items()))
            raise ArgumentError(f"{item!r} cannot be shown to name one GPU: the UUID of {gpus} cannot be read; give "
                                "the whole UUID or an index")
        return tuple(sorted(unreadable))
    if len(matches) != 1:
        what = "no GPU has" if not matches else f"{len(matches)} GPUs have"
        raise (ArgumentError if matches else NoSuchDevice)(f"{what} a UUID starting with {item!r}")
    return (matches[0],)


def _gpus_here(count: int) -> str:
    """How many GPUs this host has, for a message about an index it has not."""
    if count == 0:
        return "this host has no GPU"
    return "this host has 1 GPU (index 0)" if count == 1 else f"this host has {count} GPUs (indices 0..{count - 1})"


def _is_mig(item: object) -> bool:
    """Whether selector ``item`` names a MIG instance: ``MIG-...`` in any case (an nvmlcheck selector ``mig-...``
    must not be read as a GPU UUID that names nothing)."""
    return isinstance(item, str) and item[:4].upper() == "MIG-"


def _names_instance(item: str, d: DeviceState, m: MigDevice) -> bool:
    """Whether MIG selector ``item`` names MIG device ``m`` of GPU ``d``: its ``MIG-`` UUID or a prefix of it, or the
    name of drivers before R470 (older CUDA docs give it for CUDA_VISIBLE_DEVICES),
    ``MIG-<GPU UUID>/<GI id>/<CI id>``; in any case."""
    if "/" in item:
        import re  # only for this form: the module is imported by every command

        legacy = re.fullmatch(r"MIG-(GPU-[0-9A-Fa-f-]+)/([0-9]+)/([0-9]+)", item, re.IGNORECASE)
        if legacy is None:
            return False
        gpu, gi, ci = legacy.groups()
        return (d.uuid.lower() == gpu.lower() and m.gpu_instance_id == int(gi)
                and m.compute_instance_id == int(ci))
    return m.uuid is not None and m.uuid.upper().startswith(item.upper())


def _same_mig(item: str, uuid: str) -> bool:
    """Whether selector ``item`` is the whole of MIG UUID ``uuid`` (in any case)."""
    return item.upper() == uuid.upper()


def _close_bound(timeout: float | None) -> float | None:
    """:meth:`Session.close`'s ``timeout`` in seconds for a lock's wait (``None``: no bound), checked."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ArgumentTypeError(f"close()'s timeout must be a number of seconds or None, got {timeout!r}")
    if not timeout >= 0:  # NaN fails it (math.isnan overflows on an int beyond any float)
        raise ArgumentError(f"close()'s timeout must be >= 0 seconds (or None for no bound), got {timeout!r}")
    return None if timeout > _MAX_LOCK_WAIT_S else float(timeout)


def _selectors(devices: Iterable[DeviceSelector] | DeviceSelector) -> list[DeviceSelector]:
    """A selection as a list: one selector, or each of an iterable of them."""
    if isinstance(devices, int | str):
        return [devices]
    if isinstance(devices, bytes | bytearray):  # iterable, but of ints (b"0" is [48]): not a selection
        raise ArgumentTypeError(f"devices is an index, a UUID (str), a sequence of them or None, not {devices!r}")
    try:
        return list(devices)
    except TypeError:
        raise ArgumentTypeError(f"devices is an index, a UUID, a sequence of them or None, not {devices!r}") from None


def _checked_selection(devices: Iterable[DeviceSelector] | DeviceSelector | None
                      ) -> Iterable[DeviceSelector] | DeviceSelector | None:
    """``devices`` checked as far as it can be without a GPU (each selector an int or a str, at least one), as a
    list when it was an iterable (a generator reads once): what the calls that open their own session check before
    opening it, so that a bad selection is an argument error, not a backend's (no driver here) or an init's cost."""
    if devices is None:
        return None
    items = _selectors(devices)
    if not items:
        raise ArgumentError("empty device selection: name at least one GPU, or pass None for all")
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise ArgumentTypeError(f"a device is an int index or a UUID string, not {item!r}")
    return devices if isinstance(devices, int | str) else items


def _once(devices: Iterable[DeviceSelector] | DeviceSelector | None
          ) -> Iterable[DeviceSelector] | DeviceSelector | None:
    """A selection that is read twice (resolved, then its MIG instances), as a list: a generator reads only once."""
    return devices if devices is None or isinstance(devices, int | str) else _selectors(devices)


class Session:
    """An open connection to the GPUs through one backend. Use as a context manager, or call :meth:`close`.

    Sessions are cheap to keep open: NVML is initialised once per process and shared.
    """

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._closed = False
        self._listener: EventListener | None = None
        # One listener per session, whichever threads ask at once (its start registers every GPU: not instant).
        self._listener_lock = _thread.allocate_lock()
        # Held only to test and set _closed: never across a call that can hang (close is bounded).
        self._close_lock = _thread.allocate_lock()

    # --- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend answering (``.name`` is ``"nvml"`` or ``"smi"``)."""
        return self._backend

    @property
    def backend_name(self) -> str:
        """``"nvml"`` or ``"smi"``."""
        return self._backend.name

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self, timeout: float | None = CLOSE_TIMEOUT_S) -> None:
        """Release the backend (the last NVML session shuts NVML down). Idempotent, and safe from several threads:
        the backend is released once.

        ``nvmlShutdown`` can hang on a wedged driver, as ``nvmlInit`` can: ``close`` waits at most ``timeout``
        seconds for the release (default :data:`CLOSE_TIMEOUT_S`, 10 s; ``None``: no bound), then raises
        :class:`~nvmlcheck.Timeout` naming ``nvmlShutdown``. The session is closed either way: the release is left to
        finish in a daemon thread, and a second ``close`` returns at once (NVML is never shut down twice). On leaving
        a ``with`` block through an exception, that exception goes on and the timeout is added to its notes.
        """
        bound_s = _close_bound(timeout)
        with self._close_lock:
            if self._closed:
                return
            self._closed = True  # from here every call raises SessionClosed, and a second close returns
        released = _thread.allocate_lock()
        released.acquire()
        failed: list[BaseException] = []

        def release() -> None:
            try:
                # The listener lock too is waited for here, within the bound: a listen() in another thread may hold
                # it in a registration that hangs. That listen() either finished (its listener is stopped now) or
                # finds the session closed.
                with self._listener_lock:
                    if self._listener is not None:
                        self._listener.stop()  # before the backend: its NVML reference keeps the event set valid
                        self._listener = None
                self._backend.close()
            except BaseException as exc:  # handed to the caller, in its thread
                failed.append(exc)
            finally:
                released.release()

        # In a thread of its own: no thread can interrupt a call into C, so only a waiter can stop waiting for it.
        try:
            _thread.start_new_thread(release, ())
        except RuntimeError:  # no new thread at interpreter shutdown (an atexit handler): release here, unbounded
            release()
        if not (released.acquire() if bound_s is None else released.acquire(timeout=bound_s)):
            from .errors import Timeout

            raise Timeout(10, "nvmlShutdown", detail=(
                f"the release of the {self.backend_name} backend did not return within {bound_s:g} s (a wedged "
                "driver?); the session is closed and the release is left to finish in a daemon thread"))
        if failed:
            raise failed[0]

    def __enter__(self) -> Session:
        if self._closed:
            raise SessionClosed("this nvmlcheck session is closed: open a new one (nc.open())")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
        else:
            self._close_after(exc, CLOSE_TIMEOUT_S)

    def _close_after(self, exc: BaseException, timeout: float | None) -> None:
        """:meth:`close` while ``exc`` is on its way out: that exception is the better answer, and a close that
        gives up is added to its notes rather than raised in its place."""
        from .errors import Timeout

        try:
            self.close(timeout)
        except Timeout as hung:
            add_note = getattr(exc, "add_note", None)  # Python 3.11+
            if add_note is not None:
                add_note(f"then, closing the session: {hung}")

    def __reduce__(self) -> str | tuple[object, ...]:
        raise ArgumentTypeError("an nvmlcheck Session cannot be pickled or copied: it holds a reference on NVML "
                                "(or a backend's state); open a session where it is used (nc.open())")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<nvmlcheck.Session backend={self.backend_name!r} {state}>"

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed("this nvmlcheck session is closed")

    # --- events ---------------------------------------------------------------------------------------------------

    def listen(self) -> EventListener:
        """This session's NVML event listener, started on first use (one thread per session; :meth:`close` stops
        it). It covers every GPU. Where events cannot be had (the nvidia-smi backend, an old library, NOT_SUPPORTED,
        no permission, MIG) it is returned in state ``"unsupported"`` with its :attr:`~EventListener.reason`, said
        once: waits then poll as they always do. A listener that stopped (NVML re-initialised, or inherited over
        ``fork()``) is replaced by a new one. This waits for the registration however long it takes; a wait,
        ``ready`` or ``kill`` that starts the listener waits for it until its deadline (1 s at most) and then polls,
        the listener ``"starting"`` until its registration returns. See :mod:`nvmlcheck.events`.
        """
        return self._listen(None, time.monotonic_ns, bounded=False)

    def _listen(self, deadline_ns: int | None, clock: Callable[[], int], *, bounded: bool = True,
                patience_s: float | None = None) -> EventListener:
        """:meth:`listen`, its registration bounded by a wait's deadline (on ``clock``; see ``EventListener.start``)
        and, when ``bounded``, waited for :data:`~nvmlcheck.events.START_WAIT_S` at most (``patience_s``, when
        shorter), deadline or not: a registration call that hangs leaves the listener ``"starting"``, and the caller
        polls meanwhile."""
        with self._listener_lock:
            self._check_open()
            return self._listen_locked(deadline_ns, clock, bounded, patience_s)

    def _listen_locked(self, deadline_ns: int | None, clock: Callable[[], int], bounded: bool,
                       patience_s: float | None = None) -> EventListener:
        from .events import START_WAIT_S, EventListener

        current = self._listener
        # "starting": its registration had not returned by the deadline of the call that started it; "recovering":
        # its thread asks the GPUs again after a wait error; "stalled": its wait call has not returned for long. Kept,
        # not replaced: a new one would hang in the same call, one more thread each wait.
        if current is not None and current.state in ("running", "unsupported", "starting", "recovering", "stalled"):
            return current
        factory = getattr(self._backend, "event_listener", None)
        if factory is None:
            listener = EventListener.unavailable(
                f"the {self._backend.name} backend has no events (nvidia-smi cannot deliver them): waits poll"
            )
        else:
            patience = START_WAIT_S if bounded else None
            if patience is not None and patience_s is not None:
                patience = min(patience, patience_s)
            listener = factory().start(deadline_ns, clock, patience_s=patience)
        self._listener = listener
        return listener

    def _wait_listener(self, events: bool | None, timeout: float | None,
                       clock: Callable[[], int]) -> tuple[EventListener | None, float | None]:
        """The listener a wait uses (``None``: it polls alone) and the timeout left after starting it.

        ``events=None`` follows :meth:`listen`: once asked for, a listener that failed (NVML re-initialised) is
        replaced. One check (timeout 0) starts none: it would only delay the check (an event is heard after its
        registration). The registration is bounded by the wait's deadline and counts against the timeout."""
        if not (events or (events is None and self._listener is not None)):
            return None, timeout
        running = self._listener is not None and self._listener.state == "running"
        if timeout == 0 and not running:
            return None, timeout
        from ._deadline import ns_or_none

        started = clock()
        bound_ns = None if timeout is None else ns_or_none(timeout)
        # A registration call that hangs is waited for half of the timeout at most: the wait keeps the other half to
        # poll in (it polls without the listener meanwhile), rather than timing out having read nothing.
        listener = self._listen(None if bound_ns is None else started + bound_ns, clock,
                                patience_s=None if timeout is None else timeout / 2)
        timeout = _left(timeout, started, clock)  # used up by the registration: still a bound, not one check
        # Unsupported or stopped: said by its reason; the wait polls. Starting (a registration call that had not
        # returned by the deadline): the wait polls, and stops on a fatal event once the listener runs.
        # Recovering (after a wait error) or stalled (its wait call has not returned for long): it listens again once
        # the call returns; its reason says so meanwhile.
        return (listener if listener.state in ("running", "starting", "recovering", "stalled") else None), timeout

    def _with_gaps(self, result: WaitResult, listener: EventListener | None, events: bool | None, *,
                   asked: float | None, indices: tuple[int, ...] | None, since_ns: int) -> WaitResult:
        """``result`` told when events were not listened to on its GPUs since ``since_ns`` (``listening_gaps``), by
        the listener in use, or by the one asked for that cannot listen (unsupported, failed: its gap is the whole
        wait); unchanged (``None``) when the wait did not listen. Before, a wait that ran while the listener
        recovered or stalled read as if every XID had been heard."""
        heard_by = listener
        if heard_by is None and (events or (events is None and self._listener is not None)) and asked != 0:
            heard_by = self._listener
        if heard_by is None:
            return result
        import dataclasses

        return dataclasses.replace(result, listening_gaps=heard_by.gaps(indices, since_ns))

    @property
    def listener(self) -> EventListener | None:
        """The listener :meth:`listen` started, if any (it may have stopped since: see its ``state``)."""
        return self._listener

    # --- queries --------------------------------------------------------------------------------------------------

    def system(self) -> SystemInfo:
        """Driver, NVML and CUDA driver versions."""
        self._check_open()
        return self._backend.system()

    def device_count(self) -> int:
        """How many GPUs the backend sees."""
        self._check_open()
        return self._backend.device_count()

    def cuda_mapping(self, env: Mapping[str, str] | None = None) -> CudaMapping:
        """How CUDA numbers these GPUs under ``env`` (default ``os.environ``): ``CUDA_VISIBLE_DEVICES`` and
        ``CUDA_DEVICE_ORDER`` applied to the identities the backend reports. See :mod:`nvmlcheck.cudamap` for the
        rules; an unknown mapping has ``devices=None`` and the reason."""
        self._check_open()
        return self._cuda_mapping(env, None, time.monotonic_ns)

    def _cuda_mapping(self, env: Mapping[str, str] | None, deadline_ns: int | None,
                      clock: Callable[[], int]) -> CudaMapping:
        from .cudamap import ENV_VISIBLE_DEVICES, cuda_mapping, names_mig

        env = os.environ if env is None else env
        # A MIG- entry is looked up among the MIG devices, which come with the process lists.
        fields = Fields.PROCESSES if names_mig(env.get(ENV_VISIBLE_DEVICES)) else Fields(0)
        snap = self._read(fields, deadline_ns, clock)
        return cuda_mapping(snap.devices, env, unreadable=[f.index for f in snap.failures])

    def _instance_selectors(self, devices: Iterable[DeviceSelector] | DeviceSelector | None,
                            deadline_ns: int | None = None, clock: Callable[[], int] = time.monotonic_ns
                            ) -> Iterable[DeviceSelector] | DeviceSelector | None:
        """``devices`` with each ``cuda:N`` that names a MIG instance (``CUDA_VISIBLE_DEVICES=MIG-...``) replaced by
        that instance's ``MIG-`` UUID, whole GPUs it names by their indices, and a ``mig-`` name spelt ``MIG-``:
        what the MIG paths (a wait, ready, holders, a kill) judge as one instance. A list (``devices`` may be a
        generator, read once here); one selector stays as it is when there is nothing to replace. A ``cuda:N`` whose
        mapping is unknown raises, as :meth:`resolve` does."""
        if devices is None:
            return None
        items = _selectors(devices)
        from .cudamap import ENV_VISIBLE_DEVICES, names_mig

        cuda = names_mig(os.environ.get(ENV_VISIBLE_DEVICES)) and any(
            isinstance(i, str) and i[:5].lower() == "cuda:" for i in items)
        if not cuda and not any(isinstance(i, str) and _is_mig(i) and not i.startswith("MIG-") for i in items):
            return devices if isinstance(devices, int | str) else items
        mapping = self._cuda_mapping(None, deadline_ns, clock) if cuda else None
        out: list[DeviceSelector] = []
        for i in items:
            if isinstance(i, str) and _is_mig(i):
                out.append("MIG-" + i[4:])
            elif mapping is not None and isinstance(i, str) and i[:5].lower() == "cuda:":
                out.extend(d.nvml_index if d.mig_uuid is None else d.mig_uuid for d in mapping.devices_of(i))
            else:
                out.append(i)
        return out

    def _read(self, fields: Fields, deadline_ns: int | None, clock: Callable[[], int]) -> Snapshot:
        """Every GPU's ``fields`` for a selection to be resolved; stopped at ``deadline_ns`` on ``clock`` (a wait's:
        at most one query late, then :class:`~nvmlcheck.errors.DeadlinePassed`), ``None``: no bound."""
        if deadline_ns is None:
            return self._backend.snapshot(None, fields)
        from ._deadline import read_by
        from .errors import DeadlinePassed

        snap = read_by(self._backend, None, fields, deadline_ns, clock)
        if snap is None:
            raise DeadlinePassed("the deadline passed while the device selection was read")
        return snap

    def resolve(self, devices: Iterable[DeviceSelector] | DeviceSelector | None) -> tuple[int, ...] | None:
        """Turn a device selection into sorted NVML indices: NVML indices, UUIDs or unique UUID prefixes, and CUDA
        selectors ``"cuda:N"`` / ``"cuda:all"`` (read through ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``
        in ``os.environ`` at the call, :meth:`Session.cuda_mapping`).

        ``None`` means every device. A MIG device UUID (``MIG-...``, a unique prefix, or the name of drivers
        before R470, ``MIG-<GPU UUID>/<GI id>/<CI id>``) resolves to its parent GPU's index (the instance itself is
        judged by :meth:`wait_until_clean`). While a GPU's UUID cannot be read
        (lost, a failed query), a UUID no readable GPU has resolves to that GPU (its reading says why it cannot be
        judged), and a prefix is refused (it may name that GPU too). Raises
        :class:`~nvmlcheck.NoSuchDevice` (a ``KeyError`` and a ``ValueError``) for an index or UUID that names no
        device, :class:`~nvmlcheck.ArgumentError` (a ``ValueError``) for a prefix that names several,
        :class:`~nvmlcheck.ArgumentTypeError` for a selector of the wrong type, and
        :class:`~nvmlcheck.CudaMappingError` (an ``ArgumentError``) for a CUDA selector that cannot be resolved, its
        message showing the mapping seen.
        """
        self._check_open()
        return self._resolve(devices, None, time.monotonic_ns)

    def _resolve(self, devices: Iterable[DeviceSelector] | DeviceSelector | None, deadline_ns: int | None,
                 clock: Callable[[], int]) -> tuple[int, ...] | None:
        """:meth:`resolve`, its readings (UUIDs, ``cuda:N``, ``MIG-…``) stopped at ``deadline_ns`` on ``clock``
        (``None``: no bound), raising :class:`~nvmlcheck.errors.DeadlinePassed`."""
        if devices is None:
            return None
        items = _selectors(devices)
        if not items:
            raise ArgumentError("empty device selection: name at least one GPU, or pass None for all")
        count = self._backend.device_count()
        uuids: dict[int, str] | None = None
        unreadable: dict[int, str] = {}
        mapping: CudaMapping | None = None
        out: set[int] = set()
        for item in items:
            if isinstance(item, bool) or not isinstance(item, int | str):
                raise ArgumentTypeError(f"a device is an int index or a UUID string, not {item!r}")
            if isinstance(item, str) and item[:5].lower() == "cuda:":
                if mapping is None:
                    mapping = self._cuda_mapping(None, deadline_ns, clock)
                out.update(mapping.resolve(item))
                continue
            if isinstance(item, int):
                if not 0 <= item < count:
                    raise NoSuchDevice(f"no GPU with index {item}: {_gpus_here(count)}")
                out.add(item)
                continue
            if is_digits(item):
                out.update(self._resolve(int(item), deadline_ns, clock) or ())
                continue
            if not item.strip():
                raise ArgumentError(f"an empty device selector ({item!r}): give an index, a UUID or cuda:N")
            if _is_mig(item):
                out.update(self._mig_parent(item, deadline_ns, clock))
                continue
            if uuids is None:
                uuids, unreadable = self._uuids(deadline_ns, clock)
            out.update(_by_uuid(item, uuids, unreadable))
        return tuple(sorted(out))

    def _uuids(self, deadline_ns: int | None = None,
               clock: Callable[[], int] = time.monotonic_ns) -> tuple[dict[int, str], dict[int, str]]:
        """Each GPU's UUID by its index, and the GPUs whose UUID cannot be read (index -> why)."""
        snap = self._read(Fields(0), deadline_ns, clock)
        uuids = {d.index: d.uuid for d in snap.devices if d.uuid}
        uuids.update({f.index: f.uuid for f in snap.failures if f.uuid})
        unreadable = {d.index: "its UUID is unknown" for d in snap.devices if not d.uuid}
        unreadable.update({f.index: str(f.error) for f in snap.failures if not f.uuid})
        return uuids, unreadable

    def _mig_parent(self, item: str, deadline_ns: int | None = None, clock: Callable[[], int] = time.monotonic_ns
                    ) -> tuple[int, ...]:
        """The index of the GPU holding MIG device ``item`` (a UUID or unique prefix). MIG devices are read live
        (instances come and go), with the process lists: this costs one snapshot of every GPU's lists. While a
        GPU's MIG devices cannot be read (the GPU failed, or their enumeration did), a name no readable instance has
        resolves to those GPUs (their reading says why they cannot be judged), and a prefix is refused (it may name
        one of theirs too), as for GPU UUIDs."""
        snap = self._read(Fields.PROCESSES, deadline_ns, clock)
        matches = [
            (d.index, m.uuid)
            for d in snap.devices
            for m in d.mig_devices or ()
            if m.uuid is not None and _names_instance(item, d, m)
        ]
        unread = {f.index: str(f.error) for f in snap.failures}
        unread.update({d.index: d.why_unknown("mig_devices") or "its MIG devices could not be read"
                       for d in snap.devices if d.mig_mode and d.mig_devices is None})
        legacy = "/" in item
        for d in snap.devices:
            if legacy and not item.upper().startswith(f"MIG-{d.uuid.upper()}/"):
                continue
            for m in d.mig_devices or ():
                # An instance whose UUID (or, named the legacy way, whose ids) could not be read may be the one
                # named: "no MIG device has" it was a guess, and ended a wait at once.
                if m.uuid is None or (legacy and None in (m.gpu_instance_id, m.compute_instance_id)):
                    key = "uuid" if m.uuid is None else "gpu_instance_id"
                    why = m.unknown.get(key) or m.unknown.get("compute_instance_id") or "not read"
                    unread.setdefault(d.index, f"{m.label} could not be read in full: {why}")
        exact = [i for i, u in matches if _same_mig(item, u) or "/" in item]
        if unread and not exact:
            if matches:
                gpus = ", ".join(f"GPU {i} ({why})" for i, why in sorted(unread.items()))
                raise ArgumentError(f"{item!r} cannot be shown to name one MIG device: the MIG devices of {gpus} "
                                    "cannot be read; give the whole MIG- UUID")
            return tuple(sorted(unread))
        if len(matches) != 1:
            what = "no MIG device has" if not matches else f"{len(matches)} MIG devices have"
            error = ArgumentError if matches else NoSuchDevice
            raise error(f"{what} a UUID starting with {item!r} (is the GPU in MIG mode?)")
        return (matches[0][0],)

    def _mig_selection(self, devices: Iterable[DeviceSelector] | DeviceSelector | None, deadline_ns: int | None = None,
                       clock: Callable[[], int] = time.monotonic_ns) -> list[DeviceSelector]:
        """The selection with MIG prefixes expanded to full MIG UUIDs; ``[]`` when it names no MIG device. The
        reading of every GPU's MIG devices stops at ``deadline_ns`` on ``clock`` (a wait's: at most one query
        late), raising :class:`~nvmlcheck.errors.DeadlinePassed`."""
        if devices is None:
            return []
        items = _selectors(self._instance_selectors(devices, deadline_ns, clock) or ())
        if not any(_is_mig(i) for i in items):
            return []
        from ._deadline import read_by
        from .errors import DeadlinePassed

        read = read_by(self._backend, None, Fields.PROCESSES, deadline_ns, clock)  # MIG devices come with the lists
        if read is None:
            raise DeadlinePassed("the deadline passed while the GPUs' MIG devices were read")
        snap = read
        known = [(d, m) for d in snap.devices for m in d.mig_devices or () if m.uuid is not None]
        out: list[DeviceSelector] = []
        for i in items:
            if isinstance(i, str) and _is_mig(i):
                named = [m.uuid for d, m in known if m.uuid is not None and _names_instance(i, d, m)]
                # One gone since the selection was resolved stays, as given: judged missing (unknown), never
                # dropped from a selection whose other GPUs would then be judged alone.
                out.extend(named or [i])
            else:
                # Every other selector (index, UUID or prefix, cuda:N) as resolve() reads it: a selector this
                # list dropped would be read by the wait but judged by nothing.
                out.extend(self._resolve(i, deadline_ns, clock) or ())
        return out

    def _resolve_within(self, devices: Iterable[DeviceSelector] | DeviceSelector | None, timeout: float | None,
                        clock: Callable[[], int], sleep: Callable[[float], object] = time.sleep,
                        policy: PollPolicy | str | float | None = None
                        ) -> tuple[tuple[int, ...] | None, float | None, int]:
        """:meth:`resolve` for a wait with ``timeout``, the timeout it leaves, and when it began on ``clock`` (the
        wait's start): its readings (a UUID, ``cuda:N``,
        ``MIG-…`` selector reads the GPUs' identities: an nvidia-smi run, a slow GPU) are bounded by the wait's
        deadline and count against it; a :class:`~nvmlcheck.WaitTimeout` when the deadline came first. A transient
        error (``TRANSIENT``: an nvidia-smi run that failed, NVML's "Unknown Error") is asked again, paced as the
        wait's polls are, until the deadline, as the wait's polls would be. One check (``timeout`` 0) always
        completes, or fails with its error."""
        from ._deadline import ns_or_none
        from .errors import DeadlinePassed, WaitTimeout

        began = clock()
        bound = None if not timeout else ns_or_none(timeout)
        deadline = None if bound is None else began + bound
        while True:
            try:
                indices = self._resolve(devices, deadline, clock)
                break
            except DeadlinePassed:
                mig = any(_is_mig(i) for i in _selectors(devices or ()))
                what = "the GPUs' MIG devices were" if mig else "the GPUs named by the selection were"
                raise WaitTimeout(float(timeout or 0.0), clock() - began, (
                    _cut_reading(what, timeout, "(a slow or hung GPU, or nvidia-smi)"),), held=False) from None
            except NvmlCheckError as exc:
                if not timeout or not exc.TRANSIENT:
                    raise
                now = clock()
                pause_ns = self._retry_pause_ns(policy)
                if deadline is not None and now + pause_ns >= deadline:
                    raise WaitTimeout(float(timeout), now - began, (
                        "no poll finished before the deadline: the GPUs named by the selection could not be read "
                        f"({type(exc).__name__}: {exc})",), held=False) from exc
                sleep(pause_ns / 1e9)
        return indices, _left(timeout, began, clock), began

    def _retry_pause_ns(self, policy: PollPolicy | str | float | None) -> int:
        """The pause before a reading asked again after a transient error: the wait's poll interval (nvidia-smi's
        policy for the smi backend when none is given)."""
        from ._waitoptions import SMI_DEFAULT, _resolve_policy

        chosen = SMI_DEFAULT if policy is None and self._backend.name == "smi" else _resolve_policy(policy)
        return max(1, round(chosen.interval_s * 1e9))

    def _mig_instances(self, devices: Iterable[DeviceSelector] | DeviceSelector | None, timeout: float | None,
                       began: int, clock: Callable[[], int], *, asked: float | None = None,
                       called: int | None = None) -> list[DeviceSelector]:
        """:meth:`_mig_selection` for a wait that began at ``began`` with ``timeout``: read by its deadline (one check,
        ``timeout`` 0, always completes), a :class:`~nvmlcheck.WaitTimeout` when the deadline came first (naming
        ``asked``, the timeout the caller gave, and the time since ``called``, when the caller's setup took some of
        it)."""
        from ._deadline import ns_or_none
        from .errors import DeadlinePassed, WaitTimeout

        bound = None if not timeout else ns_or_none(timeout)
        try:
            return self._mig_selection(devices, None if bound is None else began + bound, clock)
        except DeadlinePassed:
            reported = timeout if called is None else asked
            raise WaitTimeout(float(reported or 0.0), clock() - (began if called is None else called), (
                _cut_reading("the GPUs' MIG devices were", timeout, "(a slow or hung GPU)"),), held=False) from None

    def snapshot(
        self, devices: Iterable[DeviceSelector] | DeviceSelector | None = None, *, fields: Fields = Fields.ALL
    ) -> Snapshot:
        """Read the selected devices (all by default) in one pass.

        ``fields`` limits what is read beyond identity. The default, ``Fields.ALL``, reads every value: right for a
        report, costly in a loop. On an H200 it costs ~3.7 ms of driver time per GPU, almost all of it the four
        application clocks (``nvmlDeviceGetApplicationsClock``, ~0.83 ms each; the max clocks are read once and
        cached), where memory and the three process lists cost ~25 µs. In a loop, read what the loop uses:
        ``fields=Fields.WAIT`` (memory and processes, what a wait polls), adding ``Fields.HEALTH`` (~2 µs) if
        needed; ``Fields.CLOCKS`` brings the application clocks. Devices that cannot be read are in
        :attr:`Snapshot.failures`, never reported as idle.
        """
        self._check_open()
        if not isinstance(fields, Fields):
            raise ArgumentTypeError(f"fields must be a Fields value (Fields.WAIT, Fields.ALL, combined with |), got "
                                    f"{fields!r}")
        return self._backend.snapshot(self.resolve(devices), fields)

    def devices(self) -> tuple[DeviceState, ...]:
        """Identity of every device (index, name, UUID, PCI bus id, serial, minor number); live parts are
        ``None`` (reason ``"not requested"``)."""
        self._check_open()
        snap = self._backend.snapshot(None, Fields(0))
        snap.raise_for_failures()
        return snap.devices

    def wait_until_clean(
        self,
        timeout: float | None = TIMEOUT,
        predicate: Predicate | None = None,
        *,
        devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
        policy: PollPolicy | str | float | None = POLICY,
        stable_polls: int = STABLE_POLLS,
        trace: bool = TRACE,
        on_poll: Callable[[TracePoint], object] | None = ON_POLL,
        clock: Callable[[], int] = CLOCK,
        sleep: Callable[[float], object] = SLEEP,
        events: bool | None = EVENTS,
        options: WaitOptions | None = None,
    ) -> WaitResult:
        """Poll until ``predicate`` holds on the selected devices, and say when it first did.

        ``timeout`` in seconds (``None``: wait forever; ``0``: one check). The default predicate is no process of
        any kind and at most 16 MiB used on every selected device, held for ``stable_polls`` consecutive polls.
        Raises :class:`~nvmlcheck.WaitTimeout` naming what still holds each GPU, or the error that made a GPU
        unreadable (lost, no permission). The deadline is overrun by at most one query (one NVML call, or the time
        to stop one nvidia-smi run), not a whole poll: the backend gets it and stops there. ``timeout=0``'s single
        check always completes. The setup counts against ``timeout`` and stops at its deadline too: reading the GPUs
        a selection names (a UUID, ``cuda:N``, ``MIG-…``), the event listener's registration; a timeout reports the
        ``timeout`` asked for and the time since the call began. Zero selected GPUs is an error, never a vacuous
        "clean". ``policy``: a
        :class:`~nvmlcheck.wait.PollPolicy`, ``"default"``, ``"precise"`` or an interval in seconds (``None``:
        ``DEFAULT``, or ``SMI_DEFAULT`` with the nvidia-smi backend). ``clock``
        (integer ns) and ``sleep`` (seconds) can be injected for tests; the deadline handed to the backend is on
        that ``clock``.

        ``events``: ``True`` starts the session's event listener (:meth:`listen`) if it is not running; ``None``
        (default) uses it if it runs; ``False`` ignores it. With a running listener, a fatal event (XID 79, 48, ...:
        :data:`nvmlcheck.events.XID_TABLE`) on a selected GPU received after the wait began stops it at once with
        :class:`~nvmlcheck.GpuFault`: the sleep between polls wakes up for it, and a wait never returns clean after
        one. Application XIDs (13, 31, 43, ...) are only recorded. Without events the wait polls as before.

        ``options``: a :class:`~nvmlcheck.wait.WaitOptions` with these settings in one value (``timeout``,
        ``policy``, ``stable_polls``, ``trace``, ``on_poll``, ``clock``, ``sleep``, ``events``); a keyword argument
        given wins over its field.
        """
        from .errors import BackendUnavailable, WaitTimeout
        from .predicates import check_predicate, default_predicate
        from .wait import WaitOptions, poll_until

        self._check_open()
        check_predicate(predicate)
        devices = _once(devices)
        opts = WaitOptions.or_default(options).with_(
            timeout=timeout, policy=policy, stable_polls=stable_polls, trace=trace, on_poll=on_poll, clock=clock,
            sleep=sleep, events=events,
        )
        timeout, policy, clock, sleep, events = opts.timeout, opts.policy, opts.clock, opts.sleep, opts.events
        since = time.monotonic_ns()  # event times are on this clock, whatever ``clock`` the wait runs on
        asked = timeout  # what a timeout reports: the setup below (selection, listener, MIG) takes from it
        indices, timeout, called = self._resolve_within(devices, timeout, clock, sleep, policy)
        backend = self._backend
        listener, timeout = self._wait_listener(events, timeout, clock)

        # The events module (and its dataclasses) is loaded only when a listener is in play: a plain wait, the
        # launch scripts' case, pays nothing for it on start-up or per poll.
        if listener is not None:
            from .events import check_fatal

            def fatal() -> None:
                check_fatal(listener, indices, since)

        else:

            def fatal() -> None:
                return None
        began = clock()  # after the listener's registration, which took its time off the timeout already
        mig = self._mig_instances(devices, timeout, began, clock, asked=asked, called=called)
        if mig:
            timeout = _left(timeout, began, clock)  # the instances were read within the wait's timeout
            # A MIG UUID selects one instance: judge it (and any other selected GPU) on its own, not the whole GPU.
            from .predicates import on_devices

            predicate = on_devices(mig, predicate if predicate is not None else default_predicate())

        # Both take the wait's deadline: a pass stops between two queries once it has come (wait.py).
        def take(deadline: Deadline | None) -> Snapshot:
            fatal()
            snap = backend.snapshot(indices, Fields.WAIT, deadline=deadline)
            if not snap.devices and not snap.failures:
                # Checked on every poll, not once before: the count is read by the snapshot itself, and a device
                # count that fails transiently at the start must not skip the check.
                raise BackendUnavailable(
                    f"the {backend.name} backend sees no GPU: refusing to call zero GPUs clean",
                    [f"{backend.name}: device count 0"],
                )
            return snap

        def probe(deadline: Deadline | None) -> Snapshot:
            # Memory alone (one NVML call per GPU) can prove "still held" at a third of a full poll's cost: the
            # poller then skips the process lists. It never declares clean on its own (wait.py).
            fatal()
            return backend.snapshot(indices, Fields.MEMORY, deadline=deadline)

        if listener is not None and sleep is time.sleep:
            # Long sleeps (back-off, the smi policy) sleep on the listener: a fatal event wakes the wait at once, and
            # the next poll raises it. Short ones keep time.sleep, whose lateness the pacer has learnt: a fault then
            # waits at most that short sleep, and the default ~1 ms polling keeps its timing exactly.
            events_on, plain_sleep = listener, time.sleep

            def sleep(seconds: float) -> object:
                if seconds < _EVENT_SLEEP_MIN_S:
                    return plain_sleep(seconds)
                return events_on.sleep(seconds, indices, since)

        if policy is None and backend.name == "smi":
            from .wait import SMI_DEFAULT

            policy = SMI_DEFAULT  # 5 % of a core is one nvidia-smi run every ~0.4 s: too late to see a reclaim
        try:
            result = poll_until(
                take,
                predicate if predicate is not None else default_predicate(),
                probe=probe,
                pass_deadline=True,
                # The duty cap counts CPU. NVML's cost is all in this thread; counting reaped children too (the
                # poller's default, for nvidia-smi runs) would charge a launch script's own reaped workers to the
                # wait and stretch its interval (docs/waiting.md, "Polling policies").
                cpu_clock=time.thread_time_ns if backend.name == "nvml" and clock is time.monotonic_ns else None,
                timeout=timeout,
                policy=policy,
                stable_polls=opts.stable_polls,
                keep_trace=opts.trace,
                on_poll=opts.on_poll,
                clock=clock,
                sleep=sleep,
            )
            fatal()  # a fault during the last poll: never clean after one
            return self._with_gaps(result, listener, events, asked=asked, indices=indices, since_ns=since)
        except WaitTimeout as exc:
            # A fault may have come during the poll that timed out: the fault is the better answer.
            fatal()
            # Memory held with no process listed: say what the device-file scan finds (a holder numbered in another
            # PID namespace, a zombie, a process in D state); read once, at the timeout.
            from .holders import timeout_explanation

            extra = [line for line in timeout_explanation(_blamed_only(exc.snapshot, predicate))
                     if line not in exc.culprits]
            if type(exc) is not WaitTimeout or (not extra and began == called and exc.timeout_s == asked):
                raise
            # The poller's holders (the GPUs its predicate refused) and its word on whether anything held them kept.
            raise _counted_from(exc, asked, began - called, extra) from None

    def select_clean(
        self,
        count: int,
        *,
        timeout: float | None = 0.0,
        predicate: Predicate | None = None,
        devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
        stable_polls: int = 1,
        lock: bool = False,
        lock_dir: str | os.PathLike[str] | None = None,
        interval: float | None = None,
        clock: Callable[[], int] = time.monotonic_ns,
        sleep: Callable[[float], object] = time.sleep,
        owner: int | Owner | None = None,
        health: bool = True,
    ) -> Selection:
        """Wait until ``count`` GPUs are clean and healthy and return them (see
        :func:`nvmlcheck.selection.select_clean`): ``timeout`` 0 checks once, ``None`` waits forever; ``lock=True``
        also takes their advisory locks and passes over GPUs locked by others; ``owner``: the process they are chosen
        for (a PID or a pinned :class:`~nvmlcheck.locks.Owner`), whose exit ends the wait; ``health=False``: pass
        over busy GPUs only, not those with a health cause (a pending row remap, ...). A GPU in MIG mode is never
        chosen, and a ``MIG-`` selector is an :class:`~nvmlcheck.ArgumentError`: CUDA never sees such a GPU whole.
        Raises
        :class:`~nvmlcheck.selection.SelectTimeout` naming why GPUs were passed over."""
        from pathlib import Path

        from .selection import select_clean

        self._check_open()
        if lock_dir is not None:
            if not isinstance(lock_dir, str | os.PathLike):
                raise ArgumentTypeError(f"lock_dir must be a directory path (str or os.PathLike) or None, got "
                                        f"{lock_dir!r}")
            if not os.fspath(lock_dir):  # Path("") is ".": locks wherever the caller happens to run
                raise ArgumentError("lock_dir is empty: name a directory, or pass None for the default")
        for name, value in (("clock", clock), ("sleep", sleep)):
            if not callable(value):
                raise ArgumentTypeError(f"{name} must be callable, got {value!r}")
        return select_clean(
            self, count, timeout=timeout, predicate=predicate, devices=devices, stable_polls=stable_polls, lock=lock,
            lock_dir=None if lock_dir is None else Path(lock_dir), interval=interval, clock=clock, sleep=sleep,
            owner=owner, health=health,
        )

    def holders(
        self,
        devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
        *,
        device_files: Sequence[str] | str | None = None,
        timeout: float | None = None,
    ) -> tuple[Holder, ...]:
        """Every process holding the selected GPUs (all by default): NVML's process lists joined with a scan of
        ``/proc/*/fd`` for NVIDIA device files (character devices of NVIDIA's majors; ``device_files``: globs of
        stand-in files that count too, for tests). Device-file holders are always included: a device file cannot say
        which GPU. Raises the error of a selected GPU that cannot be read, and an
        :class:`~nvmlcheck.NvmlCheckError` for one whose process list could not be read (its holders would be
        missing: never an idle GPU). Only the selected GPUs are read. A ``MIG-...`` UUID selects that instance
        alone: the processes that run in it, each :class:`~nvmlcheck.holders.GpuUse` named by the instance's UUID;
        one the parent lists that may run in it (no instance id) makes its holders unknown, an error. See
        :mod:`nvmlcheck.holders`. ``timeout``: seconds the whole reading may take (the selection, the process lists,
        the ``/proc`` scan; ``None``: no bound; ``0``: one complete reading, a ``/proc`` read that does not return
        in :data:`~nvmlcheck.holders.HUNG_READ_S` ending it); when it passes first, or a ``/proc`` read blocks past
        it, :class:`~nvmlcheck.HoldersIncomplete` (a ``TimeoutError``): what holds the GPUs is unknown, never
        "nothing"."""
        from ._deadline import hung_after, read_by
        from .errors import DeadlinePassed
        from .holders import HoldersIncomplete, _cut, _find_holders, _one_complete, _time_limit

        self._check_open()
        devices = _once(devices)  # read twice (resolved, then its MIG instances): a generator reads once
        clock = time.monotonic_ns
        deadline_ns = _time_limit(timeout, clock)
        timeout_s = math.inf if timeout is None else float(timeout)
        # timeout=0 (one complete reading) has no deadline; a call hung in it still ends the command line as a
        # wait's one check would (1 s on): its watchdog, if one is installed. The /proc part bounds itself.
        with hung_after(clock() if _one_complete(timeout) else None):
            try:
                indices = self._resolve(devices, deadline_ns, clock)
            except DeadlinePassed:
                raise HoldersIncomplete(timeout_s, _cut(timeout, "the GPUs named by the selection")) from None
            read = read_by(self._backend, indices, Fields.PROCESSES, deadline_ns, clock)
            if read is None:
                raise HoldersIncomplete(timeout_s, _cut(timeout, "the GPUs' process lists"))
            snap = read
            snap.raise_for_failures()
            snap = self._instances_selected(snap, devices, deadline_ns, clock)
        for d in snap.devices:
            for kind in ("compute", "graphics", "mps"):
                if getattr(d, f"{kind}_processes") is None:
                    from .errors import NvmlCheckError

                    why = d.why_unknown(f"processes.{kind}") or "no reason recorded"
                    where = f"GPU {d.index}" if not d.uuid.startswith("MIG-") else (
                        f"GPU {d.index} {(d.mig_devices or ())[0].label}")
                    raise NvmlCheckError(f"{where}: cannot tell what holds it: its {kind} process list could "
                                         f"not be read ({why})")
        return _find_holders(snap, indices, device_files, deadline_ns=deadline_ns, clock=clock, timeout_s=timeout_s)

    def _instances_selected(self, snap: Snapshot, devices: Iterable[DeviceSelector] | DeviceSelector | None,
                            deadline_ns: int | None = None, clock: Callable[[], int] = time.monotonic_ns
                            ) -> Snapshot:
        """``snap`` with each GPU that ``devices`` names only through ``MIG-`` UUIDs (or prefixes) replaced by the
        selected instances (:func:`~nvmlcheck.predicates.instance_view`: their own processes, named by their
        UUIDs), as a wait judges them: the holders of an instance are never those of its GPU's other instances.
        An instance no longer in ``snap`` (destroyed since the selection was resolved) is
        :class:`~nvmlcheck.NoSuchDevice`; one that may be on a GPU whose MIG devices could not be read, an
        :class:`~nvmlcheck.NvmlCheckError` that says so."""
        items = [] if devices is None else _selectors(self._instance_selectors(devices) or ())
        migs = [i for i in items if _is_mig(i)]
        if not migs:
            return snap
        from ._record import replace
        from .predicates import instance_view

        others = [i for i in items if i not in migs]
        whole = set(self._resolve(others, deadline_ns, clock) or ()) if others else set()
        units: list[DeviceState] = []
        found: dict[str, int] = {}
        for d in snap.devices:
            if d.index in whole:
                units.append(d)
                continue
            for m in d.mig_devices or ():
                named = [s for s in migs if isinstance(s, str) and _names_instance(s, d, m)]
                if named:
                    units.append(instance_view(d, m))
                    for s in named:
                        found[s] = found.get(s, 0) + 1
        twice = [s for s, n in found.items() if n > 1]
        if twice:
            # A prefix of one instance when the selection was resolved, of more now (one created since): holders
            # (and a kill) would take those of an instance that was not named.
            raise ArgumentError(f"{twice[0]!r} names {found[twice[0]]} MIG devices now (one was created since the "
                                "selection was read); give the whole MIG- UUID")
        gone = [s for s in migs if s not in found]
        unread = [(d.index, d.why_unknown("mig_devices") or "no reason recorded")
                  for d in snap.devices if d.mig_mode and d.mig_devices is None]
        # An instance whose UUID could not be read (or, for the legacy name, its ids) may be the one named.
        unread += [(d.index, f"{m.label}: {m.unknown.get('uuid') or m.unknown.get('gpu_instance_id') or 'not read'}")
                   for d in snap.devices for m in d.mig_devices or ()
                   if m.uuid is None or None in (m.gpu_instance_id, m.compute_instance_id)]
        if gone and unread:
            from .errors import NvmlCheckError

            index, why = unread[0]
            raise NvmlCheckError(f"{gone[0]}: cannot tell what holds it: the MIG devices of GPU {index} could not "
                                 f"be read ({why})")
        if gone:
            raise NoSuchDevice(f"no MIG device has a UUID starting with {gone[0]!r} any more (destroyed, or its GPU "
                               "left MIG mode, since the selection was read)")
        return replace(snap, devices=tuple(units))

    def ready(
        self,
        devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
        *,
        need_bytes: int | None = None,
        need_fraction: float | None = None,
        max_used_bytes: int | None = None,
        timeout: float | None = READY_TIMEOUT,
        events: bool | None = None,
        options: WaitOptions | None = None,
    ) -> ReadyReport:
        """Can the next job start on the selected GPUs (all by default), and if not, why and when? One verdict per
        GPU, from clean + healthy + capacity; ``timeout`` 0 (default; or ``options``' timeout where a caller set it)
        judges one reading, else it waits until every GPU is ready or the deadline passes, or a GPU is found
        unhealthy or stuck (waiting cannot help); ``max_used_bytes`` ``None``: the waits' 16 MiB. See
        :func:`nvmlcheck.readiness.ready_on` and docs/ready.md."""
        from .readiness import ready_on

        self._check_open()
        devices = _once(devices)
        return ready_on(self, devices, need_bytes=need_bytes, need_fraction=need_fraction,
                        max_used_bytes=max_used_bytes, timeout=timeout, events=events, options=options)


def open(
    backend: str = "auto",
    *,
    smi_command: Sequence[str] | str | None = None,
    smi_prefix: Sequence[str] | str | None = None,
    smi_timeout_s: float | None = None,
    library_path: str | os.PathLike[str] | None = None,
    init_timeout_s: float | None = None,
) -> Session:
    """Open a :class:`Session`.

    ``backend``: ``"auto"`` (NVML, else nvidia-smi; never a simulator), ``"nvml"`` or ``"smi"``.
    ``smi_prefix``: run nvidia-smi behind a command such as ``"ssh gpu01"``. ``library_path``: a specific
    libnvidia-ml, a ``str`` or a path object (else ``libnvidia-ml.so.1``; ``$NVMLCHECK_LIBNVML`` names only
    nvmlcheck's stub, for tests).
    ``init_timeout_s``: how long
    ``nvmlInit`` may take (default 10 s; it can hang on a wedged driver), after which ``"nvml"`` raises
    :class:`~nvmlcheck.Timeout` and ``"auto"`` tries nvidia-smi.

    Raises :class:`~nvmlcheck.BackendUnavailable` (listing what was tried) when no backend opens, and
    :class:`~nvmlcheck.ArgumentTypeError` or :class:`~nvmlcheck.ArgumentError` for an argument it cannot use, before
    anything is loaded or run.
    """
    if isinstance(library_path, os.PathLike):
        library_path = os.fspath(library_path)  # a bytes path stays refused below: a str names the library
    _check_open_arguments(smi_command, smi_prefix, smi_timeout_s, library_path, init_timeout_s)
    return Session(
        open_backend(
            backend,
            smi_command=smi_command,
            smi_prefix=smi_prefix,
            smi_timeout_s=smi_timeout_s,
            library_path=library_path,
            init_timeout_s=init_timeout_s,
        )
    )



def _check_open_arguments(smi_command: object, smi_prefix: object, smi_timeout_s: object, library_path: object,
                          init_timeout_s: object) -> None:
    """:func:`open`'s arguments, checked (types, ranges, the command words parsed) before a backend is tried, whichever
    backend is asked for: a wrong one is the caller's mistake, never a backend that "did not open", and ``"auto"``
    must not fall back past it (an ``init_timeout_s`` of 0 made NVML refuse and nvidia-smi answer) nor ignore the one
    of the backend it did not need."""
    for name, value in (("smi_timeout_s", smi_timeout_s), ("init_timeout_s", init_timeout_s)):
        _check_seconds(name, value)
    if library_path is not None:
        if not isinstance(library_path, str):
            raise ArgumentTypeError(f"library_path must be a str or a path object (the path of a libnvidia-ml) or "
                                    f"None, got {library_path!r}")
        if not library_path.strip():
            raise ArgumentError("library_path is empty: name a libnvidia-ml, or pass None for the system's")
        if "\x00" in library_path:
            raise ArgumentError(f"library_path holds a NUL character, which no path can: {library_path!r}")
    for name, words in (("smi_command", smi_command), ("smi_prefix", smi_prefix)):
        if words is not None:
            _check_words(name, words)


def _check_seconds(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArgumentTypeError(f"{name} must be a number of seconds or None, got {value!r}")
    if isinstance(value, int) and value > _MAX_LOCK_WAIT_S:  # 10**400 overflowed the backends' float checks
        raise ArgumentError(f"{name} must be at most {_MAX_LOCK_WAIT_S:g} seconds (or None for the default), got "
                            f"{value!r}")
    if not (value > 0 and math.isfinite(value)):  # as the backends check it (NaN fails both comparisons)
        raise ArgumentError(f"{name} must be a positive, finite number of seconds or None, got {value!r}")


def _check_words(name: str, words: object) -> None:
    if isinstance(words, str):
        import shlex

        try:
            split = shlex.split(words)
        except ValueError as exc:  # an unclosed quote
            raise ArgumentError(f"{name} cannot be split into words ({exc}): {words!r}") from None
    elif isinstance(words, bytes | bytearray) or not isinstance(words, Sequence) or not all(
            isinstance(w, str) for w in words):
        raise ArgumentTypeError(f"{name} must be a str or a sequence of str (the words of a command), got "
                                f"{words!r}")
    else:
        split = list(words)
    if name == "smi_command" and not split:
        raise ArgumentError("smi_command is empty: name the nvidia-smi executable, or pass None for nvidia-smi")
    if any("\x00" in w for w in split):
        raise ArgumentError(f"{name} holds a NUL character, which no command argument can: {words!r}")


def open_timeouts(timeout: float | None, *, backend: str = "auto",
                  prefixed: bool = False) -> tuple[float, float | None]:
    """How much of a command's ``timeout`` opening may take: ``(init_timeout_s, smi_timeout_s)`` for :func:`open`.

    ``nvmlInit`` may take half of it (at least 0.25 s, at most 10 s: ``init_timeout_for``); nvidia-smi, tried after
    the init gave up, gets what the init left, but at least 1 s (a local run takes tens of ms:
    docs/driver-facts.md) and never more than its default 10 s; with ``backend="smi"`` no init comes first, so it
    gets the whole ``timeout`` (the same floor and cap). ``prefixed`` (nvidia-smi runs behind ``smi_prefix``: ssh,
    ``pct exec``): the runs get their default 10 s whatever ``timeout`` says, since the transport's connection
    alone can take seconds: a one-shot (``timeout`` 0) over ssh then completes, as a one-shot does, and a wait's
    polls still stop at its deadline (the runner kills a run there). ``None`` (no bound): ``(10.0, None)``.
    """
    from .backends import SMI_RUN_TIMEOUT_S, init_timeout_for

    init_timeout = init_timeout_for(timeout)
    if prefixed or not (isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 <= timeout < math.inf):
        return init_timeout, None
    left = float(timeout) if backend == "smi" else float(timeout) - init_timeout
    return init_timeout, min(SMI_RUN_TIMEOUT_S, max(_SMI_FALLBACK_FLOOR_S, left))


def wait_until_clean(
    timeout: float | None = TIMEOUT,
    predicate: Predicate | None = None,
    *,
    devices: Iterable[DeviceSelector] | DeviceSelector | None = None,
    backend: str = "auto",
    policy: PollPolicy | str | float | None = POLICY,
    stable_polls: int = STABLE_POLLS,
    trace: bool = TRACE,
    events: bool | None = EVENTS,
    options: WaitOptions | None = None,
) -> WaitResult:
    """Open a session, wait until the GPUs are clean (see :meth:`Session.wait_until_clean`), close it.
    ``events=True`` listens for NVML events during the wait (:class:`~nvmlcheck.GpuFault` on a fatal one).
    ``options``: a :class:`~nvmlcheck.wait.WaitOptions`, as for :meth:`Session.wait_until_clean`; a keyword
    argument given wins over its field.

    A finite ``timeout`` (``0`` included) bounds the whole call, opening included, by this rule: ``nvmlInit`` may
    take half of it, at least 0.25 s and at most 10 s (:func:`~nvmlcheck.backends.nvml.init_timeout_for`), so that
    with ``"auto"`` nvidia-smi still has time to answer when the init hangs; each nvidia-smi run of that fallback
    may take what the init left of ``timeout``, at least 1 s and at most nvidia-smi's default 10 s; the wait gets
    what is then left of ``timeout`` (nothing left: one check). So with a hung ``nvmlInit``, ``timeout=0`` gives up
    on NVML after 0.25 s (``"nvml"`` raises :class:`~nvmlcheck.Timeout`), never after :func:`open`'s default 10 s.
    ``None`` waits forever and gives the init 10 s. Closing the session (``nvmlShutdown``) may take as long as the
    init could; a close that takes longer does not change the answer: the release is left to finish in a daemon
    thread (:meth:`Session.close`).

    >>> import nvmlcheck as nc
    >>> nc.wait_until_clean(timeout=30.0)        # doctest: +SKIP
    """
    from .predicates import check_predicate
    from .wait import WaitOptions

    opts = WaitOptions.or_default(options).with_(timeout=timeout, policy=policy, stable_polls=stable_polls,
                                                 trace=trace, events=events)
    # Checked before the session opens: a bad predicate or selection is refused with nothing opened or read.
    check_predicate(predicate)
    devices = _checked_selection(devices)
    # A fresh session has no listener: events None (the default) and False both poll.
    return in_session(backend, opts.timeout, lambda session, left: session.wait_until_clean(
        left, predicate, devices=devices, options=opts))


def in_session(backend: str, timeout: float | None, body: Callable[[Session, float | None], _T]) -> _T:
    """Open a session whose opening ``timeout`` bounds (:func:`open_timeouts`), run ``body(session, left)`` (``left``:
    what the opening left of ``timeout``), close it and return ``body``'s answer. The close takes at most what the
    init could (a wedged driver hangs nvmlShutdown too): past it the answer stands and the release goes on in a
    daemon thread (:meth:`Session.close`); an error of ``body`` goes on with a hung close in its notes."""
    import contextlib

    from .errors import Timeout

    started = time.monotonic_ns()
    bounded = isinstance(timeout, int | float) and not isinstance(timeout, bool) and 0 <= timeout < math.inf
    init_timeout, smi_timeout = open_timeouts(timeout, backend=backend)
    session = open(backend, init_timeout_s=init_timeout, smi_timeout_s=smi_timeout)
    try:
        # Used up by the opening: the least positive timeout (a bounded check), never 0 (one whole check).
        left = _left(timeout, started, time.monotonic_ns) if bounded else timeout
        answer = body(session, left)
    except BaseException as exc:
        session._close_after(exc, init_timeout)
        raise
    with contextlib.suppress(Timeout):
        session.close(init_timeout)
    return answer


def _blamed_only(snapshot: Snapshot | None, predicate: Predicate | None) -> Snapshot | None:
    """``snapshot`` with only the GPUs ``predicate`` (default: the default predicate) refused in it: what a timeout
    explains. A GPU the wait accepted (512 MiB under ``--max-used 1GiB``) is no one's to explain."""
    if snapshot is None:
        return None
    from ._record import replace
    from .predicates import blamed_devices, default_predicate

    blamed = blamed_devices(predicate if predicate is not None else default_predicate(), snapshot)
    if blamed is None:  # a reason tied to no GPU: every GPU may be to blame
        return snapshot
    return replace(snapshot, devices=tuple(d for d in snapshot.devices if d.index in blamed))


def _counted_from(exc: WaitTimeout, asked: float | None, setup_ns: int, extra: Sequence[str] = ()) -> WaitTimeout:
    """A wait's timeout as its caller sees it: the timeout asked for (not what the setup left of it) and the time
    since the wait began (the setup's ``setup_ns`` included), ``extra`` culprit lines added; the rest kept."""
    from .errors import WaitTimeout

    return WaitTimeout(float(asked or 0.0), exc.elapsed_ns + setup_ns, (*exc.culprits, *extra), exc.snapshot,
                       exc.polls, holders=exc._holders, held=exc.held)


def _left(timeout: float | None, began: int, clock: Callable[[], int]) -> float | None:
    """What is left of ``timeout`` (seconds; ``None``: no bound) since ``began`` on ``clock``; 0 stays 0 (one check),
    and a timeout used up is the least positive one: a check bounded by it, not a whole one (``_deadline.left_s``)."""
    from ._deadline import left_s

    return left_s(timeout, (clock() - began) / 1e9)


def _cut_reading(what: str, timeout: float | None, why: str) -> str:
    """A wait's line when its deadline came while ``what`` ("the GPUs named by the selection were") was being read;
    for a timeout the caller's setup used up (``_deadline.left_s``), that: nothing was still being read."""
    from ._deadline import USED_UP_S

    if timeout is not None and 0 < timeout <= USED_UP_S:
        return ("no poll finished before the deadline: the timeout was used up before the selection could be read "
                "(opening the GPUs took it)")
    return f"no poll finished before the deadline: {what} still being read {why}"
