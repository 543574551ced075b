"""Kill targets chosen as users choose them: a pattern on the command line (``--match``, pkill ``-f`` semantics) or
every process of one container or cgroup (``--container``, ``--cgroup``), from ``/proc`` alone.

:func:`check_pattern` and :func:`check_container` check a selector's syntax (before anything is signalled, with no
``/proc`` scan); :func:`by_match` and :func:`by_container` list ``(pid, start ticks, found_by)`` for
:func:`~nvmlcheck._proc.targets.prepare`, which pins each one, plus what was left alone and why. Never chosen:
this process, its ancestors (the shell and ``sudo`` that run it), PID 1 of this namespace, kernel threads and
zombies (nothing to signal).
"""

from __future__ import annotations

import os

from . import container, procfs

TYPE_CHECKING = False  # no typing before a signal: start-up cost where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    import re
    from collections.abc import Iterable
    from typing import TypeAlias

    #: What a --match selector searches command lines with.
    Matcher: TypeAlias = "re.Pattern[str] | Substring"

__all__ = ["Exclusion", "Substring", "by_container", "by_match", "check_container", "check_exclude", "check_pattern",
           "command_line"]

#: The characters that make a pattern more than a literal string in ``re`` syntax.
_REGEX_SYNTAX = frozenset(".^$*+?{}[]\\|()")


class Substring:
    """A ``--match`` pattern without regular-expression syntax: searched as a substring, which finds exactly what
    ``re`` would, without importing ``re`` (and the enum, functools and collections it imports: milliseconds of a
    kill's start-up before its first signal, docs/performance.md)."""

    __slots__ = ("pattern",)

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def search(self, text: str) -> Substring | None:
        """Truthy (``self``) when the pattern occurs in ``text``, as ``re.Pattern.search`` is."""
        return self if self.pattern in text else None


def check_pattern(pattern: str) -> Matcher:
    """``pattern`` compiled (Python ``re`` syntax, searched anywhere in the command line; a :class:`Substring` when it
    has no regex syntax); ValueError if it does not compile or matches the empty string (it would select every
    process)."""
    compiled = _compile(pattern, "--match")
    if compiled.search("") is not None:
        raise _argument_error(f"--match {pattern!r} matches an empty command line, so it would select every process: "
                         "give a pattern that names the command")
    return compiled


class Exclusion:
    """What ``--exclude`` keeps out of a kill, however it was found (a selector, ``--all-*``, ``--tree``): PIDs, and
    patterns searched in the command line as ``--match`` searches it. :meth:`why` says why a process is excluded."""

    __slots__ = ("patterns", "pids", "words")

    def __init__(self, pids: frozenset[int] = frozenset(), patterns: tuple[tuple[str, Matcher], ...] = (),
                 words: tuple[int | str, ...] = ()) -> None:
        self.pids = pids
        self.patterns = patterns
        self.words = words  # as given

    def __bool__(self) -> bool:
        return bool(self.pids or self.patterns)

    def why(self, pid: int) -> str | None:
        """``"excluded (--exclude WORD)"`` when ``pid`` or its command line is excluded, else ``None``. A process
        whose command line cannot be read while it is there (empty: its main thread exited while others run, as
        ``pthread_exit`` leaves it; not permitted) cannot be proven to be outside a pattern: it is left alone too,
        with why (it used to be signalled, an excluded agent among them). One that is gone is not excluded (its
        pin finds it gone)."""
        if pid in self.pids:
            return f"excluded (--exclude {pid})"
        if self.patterns:
            line = command_line(pid)
            if line is None:
                if procfs.read_stat(pid) is None:
                    return None
                words = " ".join(f"--exclude {word!r}" for word, _ in self.patterns)
                return (f"its command line cannot be read (empty: its main thread exited, or not "
                        f"permitted), so {words} cannot be checked against it (exclude by PID instead)")
            for word, matcher in self.patterns:
                if matcher.search(line) is not None:
                    return f"excluded (--exclude {word!r})"
        return None

    def split(self, chosen: list[tuple[int, int, str]]) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
        """What a selector chose, less what is excluded: ``(kept, [(pid, why excluded)])``."""
        kept: list[tuple[int, int, str]] = []
        out: list[tuple[int, str]] = []
        for entry in chosen:
            why = self.why(entry[0])
            if why is None:
                kept.append(entry)
            else:
                out.append((entry[0], why))
        return kept, out


def check_exclude(words: Iterable[int | str]) -> Exclusion:
    """The exclusions ``words`` name: an int is a PID; a str is a pattern in ``--match``'s syntax (the command line
    reads a str of ASCII digits as a PID first). ValueError for an empty or bad pattern, a PID below 1, or a thread
    ID (one of a thread that is not its process's main thread)."""
    pids: set[int] = set()
    patterns: list[tuple[str, Matcher]] = []
    words = tuple(words)
    for word in words:
        if isinstance(word, bool) or not isinstance(word, int | str):
            raise _argument_error(f"--exclude: a PID (int) or a pattern (str), not {word!r}")
        if isinstance(word, int):
            if word < 1:
                raise _argument_error(f"--exclude {word}: not a process ID")
            status = procfs.read_status(word)
            if status is not None and status.tgid is not None and status.tgid != word:
                # Matched against process IDs, a thread ID would keep nothing out: its process would be signalled.
                raise _argument_error(f"--exclude {word}: that is a thread of process {status.tgid}, not a process "
                                      f"(exclude {status.tgid})")
            pids.add(word)
        elif not word:
            raise _argument_error("--exclude '': give a PID or a pattern of the command lines to leave alone")
        else:
            patterns.append((word, _compile(word, "--exclude")))
    return Exclusion(frozenset(pids), tuple(patterns), words)


def _compile(pattern: str, option: str) -> Matcher:
    """``pattern`` as a :class:`Substring` when it has no regex syntax, else compiled; ValueError if it does not
    compile."""
    if pattern and not _REGEX_SYNTAX.intersection(pattern):
        return Substring(pattern)
    import re

    try:
        return re.compile(pattern)
    except re.error as exc:
        raise _argument_error(f"{option} {pattern!r}: not a regular expression ({exc})") from None


def check_container(spec: str, *, path_only: bool = False) -> container.ContainerSpec:
    """The parsed ``--container`` (or, ``path_only``, ``--cgroup``) selector; ValueError for a bad one."""
    parsed = container.parse_spec(spec)
    if path_only and parsed.kind not in ("path", "dir"):
        raise _argument_error(f"--cgroup {spec!r}: a cgroup path starts with '/' (as /proc/PID/cgroup prints it, or a "
                         "directory under /sys/fs/cgroup); for a container ID use --container")
    return parsed


def command_line(pid: int) -> str | None:
    """The command line as pkill ``-f`` sees it (arguments joined by spaces); ``None`` for a kernel thread, a
    zombie, or a process that is gone."""
    argv = procfs.cmdline(pid)
    return " ".join(argv) if argv else None


def _me() -> tuple[int, tuple[int, ...]]:
    return os.getpid(), procfs.ancestors()


def _keep(pid: int, me: int, lineage: tuple[int, ...]) -> str | None:
    """Why a selected ``pid`` is left alone, or ``None``."""
    if pid == me:
        return "this process"
    if pid in lineage:
        return "an ancestor of this process (signalling it would end the command that runs this one)"
    if pid == 1:
        return "PID 1 (init of this PID namespace)"
    return None


def _matched_only_as_a_selector(argv: tuple[str, ...], compiled: Matcher) -> bool:
    """Whether ``argv`` is an nvmlcheck command whose command line matches only through its own ``--match``
    value: two operators' ``kill --match train.py`` would otherwise signal each other (a hung ``nvmlcheck wait``,
    matched by its own words, is still chosen)."""
    if not any(os.path.basename(w) == "nvmlcheck" or w == "nvmlcheck" for w in argv[:3]):
        return False
    rest: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word == "--match":
            skip = True
        elif not word.startswith("--match="):
            rest.append(word)
    return compiled.search(" ".join(rest)) is None


def by_match(pattern: str | Matcher, proc: str = "/proc") -> tuple[list[tuple[int, int, str]],
                                                                 list[tuple[int, str]]]:
    """Every process whose command line ``pattern`` matches: ``([(pid, start ticks, "match")], [(pid, why left
    alone)])``, by PID."""
    compiled = check_pattern(pattern) if isinstance(pattern, str) else pattern
    me, lineage = _me()
    chosen: list[tuple[int, int, str]] = []
    skipped: list[tuple[int, str]] = []
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        pid = int(name)
        argv = procfs.cmdline(pid, proc)
        if not argv or compiled.search(" ".join(argv)) is None:
            continue
        st = procfs.read_stat(pid, proc)
        if st is None or st.pid != pid:
            continue
        # Read again after the start time: had the matched process exited and its PID been reused between the two
        # reads, the start time would be the newcomer's, pinned as if it had matched.
        again = procfs.cmdline(pid, proc)
        if not again or compiled.search(" ".join(again)) is None:
            continue
        why = _keep(pid, me, lineage)
        if pid == me:
            continue  # its own command line holds the pattern (pkill leaves itself out silently too)
        if why is None and _matched_only_as_a_selector(again, compiled):
            why = "another nvmlcheck, matched only by the pattern it selects with (--match)"
        if why is not None:
            skipped.append((pid, why))
        elif procfs.state_of(st, proc) in ("Z", "X"):
            skipped.append((pid, "a zombie: it has exited already; its parent has to reap it"))
        else:
            chosen.append((pid, st.start_ticks, "match"))
    chosen.sort()
    skipped.sort()
    return chosen, skipped


def by_container(spec: str | container.ContainerSpec, proc: str = "/proc") -> tuple[list[tuple[int, int, str]],
                                                                                   list[tuple[int, str]]]:
    """Every process of one container or cgroup (:func:`~nvmlcheck._proc.container.members`), as :func:`by_match`
    returns them (``found_by`` ``"container"``). ValueError for a bad selector or an ambiguous ID prefix."""
    me, lineage = _me()
    chosen: list[tuple[int, int, str]] = []
    skipped: list[tuple[int, str]] = []
    doubtful: list[tuple[int, str]] = []
    for pid, ticks in container.members(spec, proc, doubtful):
        why = _keep(pid, me, lineage)
        st = procfs.read_stat(pid, proc) if why is None else None
        if why is not None:
            skipped.append((pid, why))
        elif st is not None and procfs.is_kernel_thread(st):
            skipped.append((pid, "a kernel thread, not a process: it holds no GPU"))
        elif st is not None and procfs.state_of(st, proc) in ("Z", "X"):
            skipped.append((pid, "a zombie: it has exited already; its parent has to reap it"))
        else:
            chosen.append((pid, ticks, "container"))
    skipped += [(pid, why) for pid, why in doubtful if _keep(pid, me, lineage) is None]
    return chosen, sorted(skipped)


def _argument_error(message: str) -> Exception:
    """nvmlcheck's ArgumentError (a ValueError); :mod:`nvmlcheck.errors` is imported only when one is raised."""
    from ..errors import ArgumentError

    return ArgumentError(message)
