"""A fake of ``nvmlcheck._nvml.calls.EventCalls`` for the event listener's unit tests (no library, no GPU).

``FakeEventCalls`` answers the five event calls as told: the supported mask, the masks it refuses with
NOT_SUPPORTED, an error from registration, creation or each wait, and the records its waits deliver, in order. It
records what it was asked (``masks``, ``timeouts``, ``freed``). A wait with nothing to deliver sleeps its timeout
(or, with ``block=True``, until the test sets ``release``: a call in flight the test ends); nothing here measures
time.
``instant=True`` answers TIMEOUT at once instead; ``fail_after=N`` makes every wait after the N-th fail.
``hang=("register",)`` (any of ``"create"``, ``"supported"``, ``"register"``) makes those calls block until the test
sets ``unhang`` (a wedged driver); ``hang_device=N`` only GPU N's; ``hang_after=K`` lets the first K of them pass.
``push_error(exc)`` makes the next wait raise ``exc`` once; ``device_errors[N]`` is raised by ``supported`` for
GPU N (a GPU lost after its registration), on every call; a list there is raised one error a call, in order, and the
calls after it answer (a transient error). ``probes`` lists the GPU index of every ``supported`` call.

``EventListener(FakeEventCalls(...), [EventTarget(0, object(), "GPU-0")], id)`` is a listener over it; ``id`` maps
a handle to its address, so a record for GPU 0 is ``(id(handle), event_type, data, gi, ci)``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from nvmlcheck.errors import NotSupported

#: One delivered event, as ``EventCalls.wait`` returns it: (handle address, nvmlEventType bits, eventData, gi, ci).
Record = tuple[int, int, int, "int | None", "int | None"]


class FakeEventCalls:
    """The event calls of a library, scripted (see the module docstring)."""

    missing: str | None = None

    def __init__(
        self,
        *,
        supported: int = 0xFFFF,
        refuse_bits: int = 0,
        create_error: BaseException | None = None,
        register_error: BaseException | None = None,
        wait_error: BaseException | None = None,
        records: Iterable[Record] = (),
        block: bool = False,
        instant: bool = False,
        fail_after: int | None = None,
        hang: Iterable[str] = (),
        hang_device: int | None = None,
        hang_after: int = 0,
    ) -> None:
        self.supported_mask = supported
        self.refuse_bits = refuse_bits  # a mask with any of these is refused with NOT_SUPPORTED (naming no type)
        self.create_error = create_error
        self.register_error = register_error
        self.wait_error = wait_error  # raised by each wait once the records are delivered
        self.block = block
        self.instant = instant  # a wait with nothing to deliver answers TIMEOUT at once (a signal, a scripted fault)
        self.fail_after = fail_after  # after this many waits, each raises wait_error (default RuntimeError)
        self.masks: list[int] = []  # every mask registration was asked for, in order
        self.timeouts: list[int] = []  # every wait's timeout_ms
        self.freed: list[object] = []  # every event set freed
        self.waiting = threading.Event()  # set once a wait found nothing to deliver
        self.release = threading.Event()  # block=True: the wait in flight returns when the test sets it
        self.hang = frozenset(hang)
        self.hang_device = hang_device
        self.hang_after = hang_after  # how many of the calls that would hang pass first
        self.unhang = threading.Event()  # the hung calls return when the test sets it
        self.hung = threading.Event()  # set once a call hangs
        self.device_errors: dict[int, BaseException | list[BaseException]] = {}
        self.probes: list[int] = []  # the GPU index of every supported() call, in order
        self.registered: list[tuple[int, int, object]] = []  # (index, mask, set) of every registration that worked
        self._errors: deque[BaseException] = deque()
        self._records: deque[Record] = deque(records)
        self._lock = threading.Lock()
        self._idle = threading.Event()  # never set: what a wait with nothing to deliver sleeps on

    def push(self, *records: Record) -> None:
        """Deliver ``records`` from the next waits."""
        with self._lock:
            self._records.extend(records)

    def push_error(self, exc: BaseException) -> None:
        """The next wait raises ``exc`` (once)."""
        with self._lock:
            self._errors.append(exc)

    def _maybe_hang(self, call: str, index: int | None) -> None:
        if call in self.hang and (self.hang_device is None or index in (None, self.hang_device)):
            with self._lock:
                self.hang_after -= 1
                if self.hang_after >= 0:
                    return
            self.hung.set()
            self.unhang.wait(30.0)

    def create(self) -> object:
        self._maybe_hang("create", None)
        if self.create_error is not None:
            raise self.create_error
        return object()

    def supported(self, handle: object, index: int) -> int:
        self.probes.append(index)
        self._maybe_hang("supported", index)
        error = self.device_errors.get(index)
        if isinstance(error, list):
            error = error.pop(0) if error else None
        if error is not None:
            raise error
        return self.supported_mask

    def register(self, handle: object, index: int, mask: int, event_set: object) -> None:
        self._maybe_hang("register", index)
        self.masks.append(mask)
        if self.register_error is not None:
            raise self.register_error
        if mask & self.refuse_bits:
            raise NotSupported(3, "nvmlDeviceRegisterEvents", index)
        self.registered.append((index, mask, event_set))

    def wait(self, event_set: object, timeout_ms: int) -> Record | None:
        self.timeouts.append(timeout_ms)
        if self.fail_after is not None and len(self.timeouts) > self.fail_after:
            raise self.wait_error or RuntimeError(f"the fake's {self.fail_after} waits are done")
        with self._lock:
            if self._errors:
                raise self._errors.popleft()
            if self._records:
                return self._records.popleft()
        if self.wait_error is not None:
            raise self.wait_error
        self.waiting.set()
        if self.instant:
            return None
        if self.block:
            self.release.wait(5.0)  # a real call returns at its timeout; here the test decides when
        else:
            self._idle.wait(timeout_ms / 1000)
        return None

    def free(self, event_set: object) -> int:
        self.freed.append(event_set)
        return 0
