"""What the CLI prints: byte sizes, the device and process tables, the live status line, JSON documents, and
:func:`safe` / :func:`safe_lines`, through which every text output passes data from processes, GPUs and remote hosts
(control characters escaped: :mod:`nvmlcheck._text`)."""

from __future__ import annotations

import os
import sys
import time

from .._text import ascii_fallback
from .._text import printable as safe
from .._text import printable_lines as safe_lines
from .._units import format_bytes

__all__ = ["UNKNOWN_PROCESS_USED", "StatusLine", "device_table", "human_bytes", "load_json_output", "plural",
           "print_json", "process_table", "safe", "safe_lines", "status_updater"]

TYPE_CHECKING = False  # typing costs start-up time where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from typing import Any, TextIO

    from ..model import DeviceFailure, DeviceState, Snapshot


class _ClosedStdout:
    """``sys.stdout`` when the command was started with it closed (``>&-``: Python then sets it to ``None``, and
    ``print`` drops every line while ``json.dump`` and a flush raise AttributeError). A write fails as into a closed
    pipe, so the answer that could not be delivered ends the command as ``| head -0`` does (docs/cli.md, "Exit
    codes"): the verdict stands, an answer that *is* the output exits 141."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        import errno

        raise BrokenPipeError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        """Nothing is buffered."""

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        import errno

        raise OSError(errno.EBADF, "stdout is closed")  # descriptor 1 may name another file by now


def _usable_streams() -> None:
    """A closed stdout writes nowhere and says so (:class:`_ClosedStdout`); a closed stderr is ``/dev/null`` (what
    would go there is read by no one either way, and the exit status still says the verdict). A stream whose
    encoding cannot write every character (``PYTHONIOENCODING=ascii``, a POSIX locale, a Latin-1 terminal) writes
    what it cannot as :func:`nvmlcheck._text.ascii_spelling` does: nvmlcheck's own ``µs``, ``…`` and ``·`` as
    ``us``, ``...`` and ``-`` (``\\xb5s`` was not readable), a process's name escaped (``\\xe9``); a character
    must not turn a verdict into an error. A UTF-8 stream is left as it is."""
    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's stderr from now on
    import codecs  # loaded already: the interpreter's own streams use it

    codecs.register_error(_ERRORS, ascii_fallback)
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("_", "-")
        # stderr's default handler is backslashreplace and a POSIX locale's stdout surrogateescape: either wrote
        # `\xb5s` or failed on nvmlcheck's own text; a handler chosen on purpose (a test's, the user's) is kept.
        errors = getattr(stream, "errors", "strict")
        if reconfigure is not None and errors in _REPLACED and encoding not in _UTF:
            try:  # noqa: SIM105 - contextlib is start-up this module avoids
                reconfigure(errors=_ERRORS)
            except (ValueError, OSError):  # a stream of a test harness that cannot be reconfigured: left as it is
                pass


#: The encodings that write every character.
_UTF = ("utf-8", "utf8", "utf-16", "utf-32")
#: The streams' handlers replaced by :data:`_ERRORS` (Python's defaults for its standard streams).
_REPLACED = ("strict", "backslashreplace", "surrogateescape")
#: The name of :func:`nvmlcheck._text.ascii_fallback` as an encoding error handler.
_ERRORS = "nvmlcheck-ascii"

_usable_streams()


def human_bytes(n: int | None) -> str:
    """``16.0 GiB``, ``615.1 MiB``, ``512 B`` (:func:`nvmlcheck._units.format_bytes`); ``?`` for unknown."""
    return "?" if n is None else format_bytes(n)


def plural(n: int, word: str) -> str:
    """``1 poll``, ``2 polls``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


#: Set while the command reads simulated GPUs (``--simulate``, ``demo``): every document
#: then says ``"simulated": true`` after its version.
SIMULATED = False


def load_json_output(wanted: bool) -> None:
    """With ``--json``, import ``json`` and the document builders now rather than once the answer is known: before
    a one-shot opens its session they overlap the driver's start, after the reading they add to the command's time,
    and after a kill's signal they overlap the teardown (docs/performance.md, "One-shot checks")."""
    if wanted:
        import json  # noqa: F401

        from .. import jsonout  # noqa: F401


#: Set while the command's stdout is a JSON Lines stream (``watch --json``): the error document that ends the stream
#: (an interrupt, a device that does not exist) is then one line, as every event is.
JSON_LINES = False


def print_json(doc: dict[str, Any]) -> None:
    """One document on stdout (``json`` is imported only when a document is printed: it costs start-up time); one
    compact line under :data:`JSON_LINES`. Written whole (:func:`write_whole`): a signal while a slow reader takes
    it never leaves half a document followed by an error document."""
    import json

    if SIMULATED:
        doc = marked_simulated(doc)

    global JSON_LINES
    if JSON_LINES:
        JSON_LINES = False  # the document that ends the stream: a later command run in this process prints its own
        write_whole(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        write_whole(json.dumps(doc, indent=1) + "\n")


def write_whole(text: str, *, stream: bool = False) -> None:
    """Write ``text`` to stdout with SIGINT, SIGTERM and SIGHUP held until it is out. A command's answer: the
    verdict is decided and the command ends right after with it, so a signal that came meanwhile is not raised
    (that would print an error document after the answer, a second document on stdout). ``stream``: one line of a
    stream (``watch --json``), which goes on: the signal is raised once the line is out, and the stream ends with
    its error document on a line of its own.

    Written with ``os.write`` on the descriptor: a signal whose handler returns while ``sys.stdout`` blocks on a
    full pipe can make the buffered writer drop what it had not written yet (seen with CPython 3.11);
    ``os.write`` retries (PEP 475) and says how much it wrote."""
    from .._proc import signals  # not the signal module: its enums would cost a one-shot's answer milliseconds

    caught: list[int] = []

    def hold(signum: int, frame: object) -> None:
        caught.append(signum)

    previous: dict[int, object] = {}
    try:
        for sig in (signals.SIGINT, signals.SIGTERM, signals.SIGHUP):
            old = signals.get_handler(sig)
            if old is None:  # a handler not installed from Python: leave it
                continue
            try:
                signals.set_handler(sig, hold)
            except ValueError:  # not the main thread: nothing to hold
                break
            previous[sig] = old
        try:
            fd = sys.stdout.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (a test's capture, a closed stdout): its own write
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        sys.stdout.flush()
        data = memoryview(text.encode(sys.stdout.encoding or "utf-8", getattr(sys.stdout, "errors", None) or "strict"))
        while data:
            data = data[os.write(fd, data):]
    finally:
        for number, handler in previous.items():
            signals.set_handler(number, handler)
    if caught and stream:
        signals.raise_signal(caught[0])  # its handler raises here, after the whole line


def no_signal_words(exited_ns: int | None) -> str:
    """What a kill's line says of a target that was sent no signal: it had exited before its turn, or (not seen to
    exit: refused, or the kill was interrupted before its turn) it was not signalled at all."""
    return "no signal (it had exited)" if exited_ns is not None else "no signal sent"


def marked_simulated(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``"simulated": true`` right after its schema and version."""
    head: dict[str, Any] = {k: doc[k] for k in ("schema", "version") if k in doc}
    return {**head, "simulated": True, **doc}


def _procs_text(d: DeviceState) -> str:
    procs = d.processes
    if procs is None:
        known = [p for kind in ("compute", "graphics", "mps") for p in (getattr(d, f"{kind}_processes") or ())]
        return f"{len(known)}+?" if known else "?"
    return str(len(procs))


def _in_order(snap: Snapshot) -> list[DeviceState | DeviceFailure]:
    """The snapshot's GPUs, read and unreadable, in index order (an unreadable GPU 1 came after GPU 7 and its MIG
    rows, where a reader of GPU 1's line does not look)."""
    rows: list[DeviceState | DeviceFailure] = [*snap.devices, *snap.failures]
    return sorted(rows, key=lambda r: r.index)


def _unreadable(f: DeviceFailure, out: TextIO) -> None:
    print(f"{f.index:<4}UNREADABLE: {safe(f.error)}", file=out)


def _unknown_cells(d: DeviceState) -> list[str]:
    """Why each ``?`` of a device row is one (an unknown value is shown with its reason, never alone); values unknown
    for the same reason share it (nvidia-smi's one ``N/A`` for the three process lists is said once)."""
    from ..model import unknown_key

    found: list[tuple[str, str]] = []
    if d.name is None:
        found.append(("name", d.why_unknown("name") or "not read"))
    if d.memory is None:
        found.append(("memory", d.why_unknown("memory") or "not read"))
    elif d.memory.reserved_bytes is None and not d.memory.used_includes_reserved:  # (the v1 line says why)
        found.append(("reserved", d.why_unknown("memory.reserved_bytes") or "not reported"))
    for kind in ("compute", "graphics", "mps"):
        if getattr(d, f"{kind}_processes") is None:
            found.append((f"{kind} processes", d.why_unknown(unknown_key("processes", kind)) or "not read"))
    if d.clocks is None or d.clocks.sm_mhz is None:
        found.append(("SM clock", d.why_unknown("clocks.current.sm_mhz") or d.why_unknown("clocks") or "not read"))
    by_reason: dict[str, list[str]] = {}
    for what, why in found:
        by_reason.setdefault(why, []).append(what)
    return [f"{', '.join(whats)}: {why}" for why, whats in by_reason.items()]


def device_table(snap: Snapshot, out: TextIO) -> None:
    """The ``snapshot devices`` view: one row per GPU in index order (an unreadable one as UNREADABLE, with why),
    each ``?`` explained on the line under it."""
    from ..model import DeviceFailure  # loaded already: snap is one of its objects
    print(f"{'GPU':<4}{'name':<22}{'used':>11}{'total':>11}{'reserved':>11}{'procs':>7}{'SM MHz':>8}  uuid", file=out)
    for d in _in_order(snap):
        if isinstance(d, DeviceFailure):
            _unreadable(d, out)
            continue
        m = d.memory
        sm = d.clocks.sm_mhz if d.clocks else None
        print(
            f"{d.index:<4}{safe(d.name or '?')[:21]:<22}"
            f"{human_bytes(m.used_bytes if m else None):>11}"
            f"{human_bytes(m.total_bytes if m else None):>11}{human_bytes(m.reserved_bytes if m else None):>11}"
            f"{_procs_text(d):>7}{sm if sm is not None else '?':>8}  {safe(d.uuid)}",
            file=out,
        )
        if m is not None and m.used_includes_reserved:
            print("    (v1 driver: used includes the driver's reserved memory)", file=out)
        unknown = _unknown_cells(d)
        if unknown:
            print(f"    (unknown: {safe('; '.join(unknown))})", file=out)
        _mig_rows(d, out)
    driver = safe(snap.system.driver_version or "?")
    print(f"backend {snap.backend}, driver {driver}, read in {snap.duration_ns / 1e3:.0f} µs", file=out)


def _mig_rows(d: DeviceState, out: TextIO) -> None:
    """Under a GPU's row: its MIG instances, one row each (their own memory and processes), or why they are not
    shown (MIG mode unknown, instances unreadable, none created). Nothing for a GPU not in MIG mode."""
    if d.mig_mode is None:
        if "mig" in d.unknown:  # read and failed (a GPU whose mode was not read says nothing)
            print(f"    (MIG mode unknown: {safe(d.unknown['mig'])})", file=out)
        return
    if not d.mig_mode:
        return
    if d.mig_devices is None:
        why = d.why_unknown("mig_devices") or "not read"
        print(f"    (MIG mode: its MIG devices are unknown: {safe(why)})", file=out)
        return
    if not d.mig_devices:
        print("    (MIG mode: no MIG instance created: no CUDA job can run on it)", file=out)
        return
    for m in d.mig_devices:
        gi = "?" if m.gpu_instance_id is None else m.gpu_instance_id
        ci = "?" if m.compute_instance_id is None else m.compute_instance_id
        mm = m.memory
        procs = "?" if m.processes is None else str(len(m.processes))
        print(
            f"{'':<4}{f'- MIG {m.index} GI {gi} CI {ci}'[:21]:<22}"
            f"{human_bytes(mm.used_bytes if mm else None):>11}{human_bytes(mm.total_bytes if mm else None):>11}"
            f"{human_bytes(mm.reserved_bytes if mm else None):>11}{procs:>7}{'':>8}  {safe(m.uuid or '?')}",
            file=out,
        )


def _instance_cells(d: DeviceState, gi: int | None, ci: int | None) -> str:
    """The GI and CI cells of a process row (as nvidia-smi's process table has them): ``-`` outside MIG."""
    if not d.mig_mode and gi is None:
        return f"{'-':>4}{'-':>4}"
    return f"{'?' if gi is None else gi:>4}{'?' if ci is None else ci:>4}"


def process_table(snap: Snapshot, out: TextIO) -> None:
    """The ``snapshot procs`` view; with a GPU in MIG mode, each process's GPU-instance and compute-instance ids
    (``GI``, ``CI``) too."""
    from ..model import DeviceFailure, unknown_key  # loaded already: snap is one of its objects

    mig = any(d.mig_mode for d in snap.devices)
    print(f"{'GPU':<4}{'  GI  CI' if mig else ''}{'pid':>8}  {'kind':<9}{'used':>11}  name", file=out)
    rows = 0
    unknown_used = unknown_name = False
    for d in _in_order(snap):
        if isinstance(d, DeviceFailure):
            _unreadable(d, out)
            rows += 1
            continue
        listed: set[tuple[int, str]] = set()
        for kind in ("compute", "graphics", "mps"):
            procs = getattr(d, f"{kind}_processes")
            if procs is None:
                why = d.why_unknown(unknown_key("processes", kind))
                cells = f"{'':>8}" if mig else ""
                print(f"{d.index:<4}{cells}{'?':>8}  {kind:<9}{'':>11}  ({safe(why)})", file=out)
                rows += 1
                continue
            for p in procs:
                unknown_used = unknown_used or p.used_bytes is None
                unknown_name = unknown_name or p.name is None
                listed.add((p.pid, kind))
                cells = _instance_cells(d, p.gpu_instance_id, p.compute_instance_id) if mig else ""
                print(f"{d.index:<4}{cells}{p.pid:>8}  {kind:<9}{human_bytes(p.used_bytes):>11}  "
                      f"{safe(p.name or '?')}", file=out)
                rows += 1
        for m in d.mig_devices or ():
            for p in m.processes or ():
                if (p.pid, p.kind.value) in listed:
                    continue  # shown on the parent's list
                gi = m.gpu_instance_id if p.gpu_instance_id is None else p.gpu_instance_id
                ci = m.compute_instance_id if p.compute_instance_id is None else p.compute_instance_id
                unknown_used = unknown_used or p.used_bytes is None
                unknown_name = unknown_name or p.name is None
                print(f"{d.index:<4}{_instance_cells(d, gi, ci)}{p.pid:>8}  {p.kind.value:<9}"
                      f"{human_bytes(p.used_bytes):>11}  {safe(p.name or '?')}", file=out)
                rows += 1
    if unknown_used:
        print(UNKNOWN_PROCESS_USED, file=out)
    if unknown_name:
        print(UNKNOWN_PROCESS_NAME, file=out)
    if not rows:
        # A header alone read as a failure, or as "clean": the lists are empty, which alone never means clean.
        print("(no process listed on the selected GPUs; memory may still be held: `nvmlcheck wait --timeout 0` "
              "judges whether they are clean)", file=out)


#: Under a process table with a ``?`` in its ``name`` column: why (the name comes from ``/proc``).
UNKNOWN_PROCESS_NAME = ("(name ?: no process with that PID is visible here: it exited, runs in another PID "
                        "namespace (NVML may report those PIDs), or its /proc entry cannot be read)")

#: Under a process table with a ``?`` in its ``used`` column: why (NVML's "not available" for that process).
UNKNOWN_PROCESS_USED = ("(used ?: the driver does not report that process's memory (NVML \"not available\": WDDM, "
                        "some MIG and container setups); the GPU's used memory still counts it)")


class StatusLine:
    """A live one-line status on a terminal (stderr), at most 10 updates a second; nothing when not a TTY, nor on a
    terminal that says it cannot move the cursor (``TERM=dumb``: Emacs' shell, some CI log viewers, where each
    ``\r`` left a line behind)."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled and stream.isatty() and os.environ.get("TERM") != "dumb"
        self._last = 0.0
        self._width = 0

    def update(self, text: str) -> None:
        """Replace the line (rate-limited); ``text`` is shown escaped (:func:`safe`): it carries process names."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < 0.1:
            return
        self._last = now
        # Within the terminal's width, always: a line that wraps is not rewritten by "\r" (each update would leave
        # a line behind), on a narrow terminal (it was cut at 20 columns at least) or one narrowed since the last
        # update (the padding to the old width wrapped). Counted in columns: a wide character takes two.
        room = self._room()
        text, width = _fit(_as_written(safe(text), self.stream), room)
        self._write("\r" + text + " " * (min(self._width, room) - width))
        self._width = width

    def clear(self) -> None:
        """Erase the line; a second call writes nothing."""
        if self.enabled and self._width:
            self._write("\r" + " " * min(self._width, self._room()) + "\r")
            self._width = 0

    def _room(self) -> int:
        """The columns a status line may take: the terminal's width less one (the cursor's column)."""
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):  # a TTY-like stream without a real terminal behind it
            columns = 80
        if columns <= 0:  # a terminal that reports no width (0 columns): the default, not no room at all
            columns = 80
        return max(1, columns - 1)

    def _write(self, text: str) -> None:
        # A terminal that fails (EIO once it is gone) ends the status line, not the wait: it is not the verdict.
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False


def _as_written(text: str, stream: TextIO) -> str:
    """``text`` as ``stream`` will write it: on a stream whose encoding lacks a character, as its error handler
    spells it (``…`` is ``...``, a name's ``\u65e5`` six columns): measured as drawn, not as meant, or the line
    wraps."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return text.encode(encoding, _ERRORS).decode(encoding)
    except LookupError:  # an encoding Python does not know (a test's stream): as it is
        pass
    return text


def _fit(text: str, room: int) -> tuple[str, int]:
    """``text`` cut to ``room`` terminal columns, and the columns it takes (an East Asian wide or full-width
    character takes two, a combining mark none)."""
    import unicodedata

    used = 0
    for n, ch in enumerate(text):
        w = 0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
        if used + w > room:
            return text[:n], used
        used += w
    return text, used


def status_updater(status: StatusLine, predicate: Any, start: float) -> Any:
    """An ``on_poll`` callback that shows the first reason the GPUs are not clean yet."""

    def on_poll(point: Any) -> None:
        if not status.enabled or point.snapshot is None:
            return
        reasons = predicate.evaluate(point.snapshot).reasons
        first = reasons[0] if reasons else "clean, confirming"
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        held = human_bytes(point.total_used_bytes)
        status.update(f"waiting {time.monotonic() - start:5.1f} s · {held} used · {first}{more}")

    return on_poll
