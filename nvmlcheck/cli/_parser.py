"""The argument parser: every command and option, value checks, and errors that respect ``--json``.

Entry points: :func:`build_parser` (``only=`` builds one command's parser, so ``kill`` does not pay for the
others), :func:`command_in` (which command an argv names, before any parsing), :func:`wants_json`, and the value
types (:func:`seconds_or_none`, :func:`byte_size`, :func:`device_list`, ...). A single-valued option given twice is
refused (a launch script that says ``--timeout`` twice has a bug, and silently keeping the last hides it); list
options (``--devices``, ``--pids``) given twice are merged. Argument errors exit 2; under ``--json`` they print an
``nvmlcheck/error`` document like every other error. Every option, documented: docs/cli.md.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from ._common import EXIT_USAGE
from ._main import COMMANDS
from ._quick import wants_json  # noqa: F401 - part of this module's interface

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

MIB = 1 << 20


class _State:
    """Shared by the parser and its subparsers for one parse: options already seen, and the output mode."""

    def __init__(self, json_errors: bool) -> None:
        self.json_errors = json_errors
        self.seen: dict[str, str] = {}  # dest -> the option string it was first given as
        self.merged: dict[str, list[Any]] = {}
        self.parsers: list[argparse.ArgumentParser] = []  # the root, then each (sub)command the parse entered
        self.argv: list[str] = []


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized without ``shutil``: argparse builds one for every ``add_argument`` and the
    default imports shutil (and through it several modules) to read the terminal width."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            try:
                width = int(os.environ.get("COLUMNS", "0")) or os.get_terminal_size(sys.stdout.fileno()).columns
            except (AttributeError, OSError, ValueError):  # not a terminal, or a stream without a descriptor
                width = 80
            width -= 2
        super().__init__(prog, indent_increment, max_help_position, width)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, state: _State, root: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        # Options are spelled in full: argparse's abbreviations (`--dev` for --devices) would make a launch script
        # depend on which options exist (a new --dev... option breaks it), and --json's and --simulate's spelling is
        # read before parsing (wants_json: an abbreviated --json printed its argument errors as text).
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.state = state
        self.root = root

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        if self.root:  # a new parse: forget the options the last one saw (subparsers share the state)
            self.state.seen.clear()
            self.state.merged.clear()
            self.state.parsers.clear()
            self.state.argv = list(sys.argv[1:] if args is None else args)
        self.state.parsers.append(self)
        return super().parse_known_args(args, namespace)

    def _print_message(self, message: str, file: Any = None) -> None:
        # Help, usage and errors are argparse's own writes: the streams are made to escape what their encoding cannot
        # write (`µs` in wait's help on an ASCII terminal was a UnicodeEncodeError, reported as a usage error).
        from . import _output  # noqa: F401 - its import makes the standard streams usable

        file = file or sys.stderr
        if message and file is sys.stdout:
            # argparse drops an OSError of its write: `--help | head -1` exited 0 having printed nothing (the write
            # of a long help fails at once); `--version` exits 141 then. The help is the answer: its failure is
            # the output's (exit 141, said on stderr), as every answer's is. A usage error's message on a broken
            # stderr stays dropped: its exit status, 2, says it.
            from ._common import output_failed

            try:
                file.write(message)
                file.flush()
            except OSError as exc:
                self.exit(output_failed(exc))
            return
        super()._print_message(message, file)

    def _worded(self, message: str) -> str:
        """argparse's ``message``, with the fix named: the commands for a missing one (not the subparsers' internal
        name, ``simulate_command``), the option meant for an unknown one (``--dev``: ``--devices``)."""
        for action in self._actions:
            named = {action.dest, action.metavar}  # argparse names it by its metavar, when it has one
            if action.nargs == argparse.PARSER and message.partition(": ")[2] in named and message.startswith(
                    "the following arguments are required: "):
                return (f"name a command: {', '.join(action.choices or ())} "
                        f"(`{self.prog} --help` says what each does)")
            # "argument {snapshot,watch,...}: invalid choice: 'bogus' (choose from ...)" named the command by the
            # list of every command, twice.
            label = "{" + ",".join(action.choices or ()) + "}"
            if action.nargs == argparse.PARSER and message.startswith((f"argument {label}: invalid choice: ",
                                                                       f"argument {action.dest}: invalid choice: ")):
                given = message.partition("invalid choice: ")[2].partition(" (choose from")[0]
                import difflib

                meant = difflib.get_close_matches(given.strip("'\""), list(action.choices or ()), n=1, cutoff=0.6)
                hint = f"did you mean {meant[0]}? " if meant else ""
                message = (f"unknown command {given}: {hint}one of {', '.join(action.choices or ())} "
                           f"(`{self.prog} --help` says what each does)")
                break  # and the options meant, below: `--sim h200 snapshot` made h200 the command
        # An unknown option may not be what argparse names (`snapshot --dev 0`: "invalid choice: '0'").
        known = {option for parser in self.state.parsers or [self] for option in parser._option_string_actions}
        hints: list[str] = []
        first: list[str] = []  # said before argparse's message, which names a consequence (a host read as K)
        for word in self.state.argv[:self.state.argv.index("--")] if "--" in self.state.argv else self.state.argv:
            name = word.partition("=")[0]
            if not name.startswith("--") or name in known:
                continue
            if name in HOST_OPTIONS:
                # `select --hosts gpu01` was told "argument K: not an integer: 'gpu01'": the host was read as K.
                command = (self.state.parsers[-1] if self.state.parsers else self).prog.removeprefix("nvmlcheck")
                said = f"{command.strip()} runs on this machine only" if command else \
                    "not an option of nvmlcheck itself"
                first.append(f"{name}: {said}; {', '.join(HOST_COMMANDS)} take --host/--hosts/--hosts-file, after "
                             "the command (`nvmlcheck wait --host gpu01`: docs/hosts.md)")
                continue
            meant = sorted(option for option in known if option.startswith(name))
            if not meant:
                import difflib

                meant = difflib.get_close_matches(name, sorted(known), n=2, cutoff=0.8)
            if meant:
                hints.append(f"{name}: did you mean {' or '.join(meant)}? (options are spelled in full)")
        return "; ".join([*first[:1], message, *hints])

    def _as_typed(self, message: str) -> str:
        """argparse names an option with aliases by all of them (``argument --wait/--timeout: ...``): the one the
        user typed instead, when only one of them was."""
        head, colon, rest = message.partition(": ")
        if not colon or not head.startswith("argument ") or "/" not in head:
            return message
        names = head.removeprefix("argument ").split("/")
        argv = self.state.argv[:self.state.argv.index("--")] if "--" in self.state.argv else self.state.argv
        given = {name for name in names for word in argv if word == name or word.startswith(name + "=")}
        return f"argument {given.pop()}: {rest}" if len(given) == 1 else message

    def error(self, message: str) -> NoReturn:
        from .._text import printable_lines

        message = self._worded(self._as_typed(message))
        line = f"{self.prog}: error: {printable_lines(message)}\n"  # argv words raw would reach the terminal
        if self.state.json_errors:
            from ..jsonout import usage_error_document
            from ._common import output_failed, verdict
            from ._output import print_json

            verdict(EXIT_USAGE)  # a document that cannot be written (a full disk) leaves the usage error's 2
            try:
                print_json(usage_error_document(message, EXIT_USAGE))
            except OSError as exc:
                output_failed(exc)
            self.exit(EXIT_USAGE, line)
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, line)


class _Stateful(argparse.Action):
    """An action that sees the parse's shared :class:`_State` (passed as ``state=`` to ``add_argument``)."""

    def __init__(self, *args: Any, state: _State, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.state = state


class _Version(_Stateful):
    """``--version``: ``nvmlcheck 0.1.0``, or under ``--json`` the one document every ``--json`` run prints."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        from ..jsonout import document
        from ._common import output_failed, verdict
        from ._output import print_json

        verdict(0, answer_is_output=True)  # the answer is the output: unwritten (a full disk), it is 141 (docs/cli.md)
        try:
            if self.state.json_errors:
                print_json(document("version", nvmlcheck=__version__))
            else:
                sys.stdout.write(f"nvmlcheck {__version__}\n")
                sys.stdout.flush()
        except OSError as exc:
            parser.exit(output_failed(exc))
        parser.exit()


class _Once(_Stateful):
    """Store a value; the same option a second time (before or after the command) is a usage error."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        name = option or self.dest
        first = self.state.seen.get(self.dest)
        if first is not None:
            # An option with aliases (select --wait/--timeout) is named as typed, both spellings when both were.
            twice = name if first == name else f"{name} (as {first} and {name})"
            parser.error(f"{twice} given twice: give it once")
        self.state.seen[self.dest] = name
        setattr(namespace, self.dest, values)
        if len(self.option_strings) > 1 and option is not None:
            setattr(namespace, f"typed_{self.dest}", option)


def typed(args: argparse.Namespace | Any, dest: str, default: str) -> str:
    """The spelling the user typed of the option stored in ``dest`` (one with aliases: ``select --timeout`` is
    ``--wait``), for a message that names it: a message names the option the user typed; ``default`` (the option's
    first name) when it was not given."""
    found = getattr(args, f"typed_{dest}", None)
    return found if isinstance(found, str) else default


class _Merge(_Stateful):
    """Extend a list; repeated occurrences merge, duplicates dropped, order kept."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        # A value given before the command lives in the parent's namespace, which the subparser does not see:
        # the merged list is kept in the shared state.
        items = values if isinstance(values, list) else [values]
        merged = list(dict.fromkeys([*self.state.merged.get(self.dest, []), *items]))
        self.state.merged[self.dest] = merged
        setattr(namespace, self.dest, merged)


# --- value types ----------------------------------------------------------------------------------------------------
# Those the quick parse uses live in ._values (no argparse there): imported here, for the parser and its callers.
from ._values import (  # noqa: E402
    SIZE_UNITS,
    byte_size,
    command_words,
    device_list,
    grace_seconds,
    integer,
    milliseconds,
    need_amount,
    non_negative_int,
    number,
    pid_number,
    positive_int,
    positive_seconds,
    seconds,
    seconds_or_none,
    signal_name,
    watched_pid,
)

#: The commands that run on hosts through ssh (``hosts.COMMANDS``, in the usage's order) and the options that say
#: which hosts: another command given one is told so, not that the host is its positional argument.
HOST_COMMANDS = ("snapshot", "wait", "kill", "ready", "holders")
HOST_OPTIONS = frozenset({"--host", "--hosts", "--hosts-file"})


def host_spec(text: str) -> str:
    """``[USER@]HOST[:PORT]`` (IPv6 in brackets), checked here so a bad one is a usage error naming it."""
    from ..hosts import Host

    try:
        return str(Host.parse(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def host_list(text: str) -> list[str]:
    """``a,root@b,c:2222``: host specs, comma-separated."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"empty host in {text!r}")
    return [host_spec(part) for part in parts]


def size_list(text: str) -> list[int]:
    """``1GiB,16GiB``."""
    from .._units import parse_size

    try:
        return [parse_size(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def connect_seconds(text: str) -> float:
    """``--connect-timeout``: seconds > 0, at most a day (``hosts.MAX_CONNECT_TIMEOUT_S``). Its own bound, said once:
    ``-1`` was told "at most 1e+09" and ``1e9`` then "at most 86400"."""
    from ..hosts import MAX_CONNECT_TIMEOUT_S

    try:
        value = positive_seconds(text)
    except argparse.ArgumentTypeError:
        value = -1.0  # not a number, or out of the general range: one message, with this option's bound
    if not 0 < value <= MAX_CONNECT_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds and at most {MAX_CONNECT_TIMEOUT_S:g} (a day), "
                                         f"got {text!r}")
    return value


def count_list(text: str) -> list[int]:
    """``0,1,2,4``: integers >= 0 (the study's importer counts)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of counts: {text!r} (example: 0,1,2,4)") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be >= 0: {text!r}")
    return values


def size_list_zero(text: str) -> list[int]:
    """``0,8GiB,32GiB``: sizes, 0 allowed (the study's pinned host bytes)."""
    parts = [p for p in text.split(",")]
    zero = [p.strip() in ("0", "0B") for p in parts]
    rest = ",".join(p for p, z in zip(parts, zero, strict=True) if not z)
    sizes = iter(size_list(rest) if rest else [])
    return [0 if z else next(sizes) for z in zero]


def word_list(*allowed: str) -> Any:
    """A comma-separated list of ``allowed`` words."""
    def parse(text: str) -> list[str]:
        words = [w.strip() for w in text.split(",")]
        bad = [w for w in words if w not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"{', '.join(map(repr, bad))}: use {' or '.join(allowed)}")
        return words
    return parse


def ending_list(text: str) -> list[str]:
    """``KILL,TERM,exit,free``."""
    from ..study import parse_ending

    try:
        return [parse_ending(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# --- the parser -----------------------------------------------------------------------------------------------------

#: The options every command except ``demo`` reads; accepted before and after the command.
GLOBAL_OPTIONS = ("backend", "smi_prefix", "simulate", "devices")


#: The commands, and the global options that take a value (to find the command in argv without parsing it).
COMMAND_NAMES = tuple(COMMANDS)
#: The commands in the order the parser adds them (its help's order): the usage line names them all, also when
#: only one command's parser is built (``tests/unit/test_quick_parse.py`` holds it to the parser's own order).
USAGE_ORDER = ("snapshot", "watch", "wait", "kill", "select", "ready", "holders", "demo", "simulate", "study", "slurm")
_VALUED_GLOBALS = ("--backend", "--smi-prefix", "--simulate", "--devices")


def command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names, found without parsing (``None`` when help or the version is asked for before
    it, or it names none): the parser is then built for that command alone."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("-h", "--help", "--version", "--"):
            return None
        elif arg in _VALUED_GLOBALS:
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in COMMAND_NAMES else None
    return None


def build_parser(*, json_errors: bool = False, only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests). A fresh one per parse: it tracks repeats.

    ``only``: build that command's parser alone (a launch script's ``kill`` need not pay for ``study``'s options);
    ``None`` builds every command.
    """
    state = _State(json_errors)

    def wanted(name: str) -> bool:
        return only is None or only == name

    def once(p: argparse.ArgumentParser | Any, *names: str, **kw: Any) -> None:
        p.add_argument(*names, action=_Once, state=state, **kw)

    def global_options(p: argparse.ArgumentParser, *, top: bool, gpu: bool = True) -> None:
        # The command's copies default to SUPPRESS so they do not overwrite a value given before the command.
        def d(value: object) -> object:
            return value if top else argparse.SUPPRESS

        g = p.add_argument_group("global options")
        if gpu:
            once(g, "--backend", choices=("auto", "nvml", "smi"), default=d("auto"),
                 help="where to read GPUs from (default auto: NVML, else nvidia-smi)")
            once(g, "--smi-prefix", type=command_words, metavar="CMD", default=d(None),
                 help='run nvidia-smi behind a command, e.g. "ssh gpu01"')
            once(g, "--simulate", metavar="SCENARIO", default=d(None),
                 help="use the bundled stub libnvidia-ml with a named scenario (h200, h200x8, h200-busy) or a "
                      "scenario file: explicit simulation, never chosen automatically")
            g.add_argument("--devices", type=device_list, action=_Merge, state=state, metavar="LIST",
                           default=d(None),
                           help="GPU indices, UUIDs or cuda:N / cuda:all (through CUDA_VISIBLE_DEVICES and "
                                "CUDA_DEVICE_ORDER), comma-separated (repeats merge)")
        g.add_argument("--json", action="store_true", default=d(False),
                       help="print one JSON document (versioned schema, docs/cli.md); errors too")

    def host_options(p: argparse.ArgumentParser) -> None:
        # Command options (after the command): the command runs on each host through ssh (docs/hosts.md).
        g = p.add_argument_group("hosts (run on each host through ssh; docs/hosts.md)")
        g.add_argument("--host", dest="hosts", type=host_spec, action=_Merge, state=state, default=None,
                       metavar="[USER@]HOST[:PORT]", help="run on this host (repeatable; IPv6 in brackets)")
        g.add_argument("--hosts", dest="hosts", type=host_list, action=_Merge, state=state, default=None,
                       metavar="LIST", help="hosts, comma-separated (repeats merge with --host)")
        once(g, "--hosts-file", metavar="FILE", default=None,
             help="hosts, one per line (# comments)")
        once(g, "--remote-prefix", metavar="CMD", default=None,
             help='run nvmlcheck behind this command on each host, e.g. "pct exec 129 --" (split like a shell)')
        once(g, "--remote-python", metavar="PYTHON", default="python3",
             help="the interpreter on the hosts (default python3)")
        once(g, "--fanout", type=positive_int, default=32, metavar="N", help="hosts at once (default 32)")
        once(g, "--connect-timeout", type=connect_seconds, default=10.0, metavar="S",
             help="ssh's connect timeout in seconds (default 10)")
        once(g, "--ssh-options", metavar="WORDS", default=None,
             help='extra ssh options, put right after "ssh" (split like a shell), e.g. "-F /etc/gpu/ssh_config"')

    def sub_parser(subs: Any, name: str, **kw: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = subs.add_parser(name, state=state, **kw)
        return p

    parser = _Parser(
        prog="nvmlcheck", state=state, root=True, description="Tell precisely and fast whether NVIDIA GPUs are clean.",
        epilog="exit codes: 0 clean/ok, 1 not clean at timeout, 2 usage, 3 backend unavailable or failed, "
               "4 a fatal GPU event (XID) stopped the wait, 5 ready: a GPU needs an operator (unhealthy or stuck), "
               "129/130/143 ended by SIGHUP/SIGINT/SIGTERM, 141 the answer could not be written (docs/cli.md)",
    )
    parser.add_argument("--version", action=_Version, state=state, help="print nvmlcheck's version and exit "
                        "(with --json, an nvmlcheck/version document)")
    global_options(parser, top=True)
    # The usage names every command, also when only one command's parser is built (`wait --bogus` printed
    # "{wait} ...", as if wait were the only command there is).
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="{" + ",".join(USAGE_ORDER) + "}")

    if wanted("snapshot"):
        snap = sub_parser(sub, "snapshot", help="show devices (default) or processes",
                          description="Read every selected GPU once and print one line per GPU (devices, the "
                                      "default: memory, processes, SM clock) or per process (procs); each table "
                                      "reads only what it shows, --json reads and prints every field (memory, "
                                      "process lists, clocks, memory health). Exit 0; 3 when a GPU could not be "
                                      "read (it is still printed, as UNREADABLE) or the backend sees no GPU.")
        global_options(snap, top=False)
        snap.add_argument("view", nargs="?", choices=("devices", "procs"), default="devices")
        host_options(snap)

    if wanted("watch"):
        watch = sub_parser(sub, "watch", help="stream NVML events (XID, ECC, clocks, power) until interrupted",
                           description="Print every NVML event of the selected GPUs (all by default) as it comes: "
                                       "one line each, or with --json one nvmlcheck/event document per line (JSON "
                                       "Lines), until Ctrl-C (exit 130) or SIGTERM (143). Exit 3 when events "
                                       "cannot be had on any selected GPU (the nvidia-smi backend, NOT_SUPPORTED, "
                                       "no permission) or the listener fails while watching.")
        global_options(watch, top=False)
        once(watch, "--for", dest="duration", type=seconds_or_none, default=None, metavar="S",
             help="stop after S seconds (exit 0; default: until interrupted)")

    def wait_options(p: argparse.ArgumentParser) -> None:
        once(p, "--timeout", type=seconds_or_none, default=30.0, metavar="S",
             help="seconds (default 30; 0: check once; 'none': forever)")
        once(p, "--max-used", type=byte_size, default=16 * MIB, metavar="BYTES",
             help=f"clean means at most this much used per GPU (default 16MiB; {SIZE_UNITS})")
        once(p, "--stable-polls", type=positive_int, default=2, metavar="N",
             help="consecutive clean polls required (default 2)")
        p.add_argument("--events", action="store_true",
                       help="listen for NVML events: a fatal XID (79, 48, ...) on a selected GPU stops the wait "
                            "at once with exit 4 (where events are not supported, says why and polls)")

    if wanted("wait"):
        wait = sub_parser(sub, "wait", help="wait until the GPUs are clean (exit 0) or time out (1)",
                          description="Poll the selected GPUs (all by default) until each is clean: no process of "
                                      "any kind, at most --max-used bytes used, the --pids off every list, on "
                                      "--stable-polls consecutive polls. Prints when they first were; at the timeout "
                                      "exits 1 naming what still holds each GPU. --timeout bounds the whole "
                                      "command, opening NVML included.",
                          epilog="exit codes: 0 clean, 1 not clean at the timeout, 2 usage, 3 backend unavailable or "
                                 "failed, 4 a fatal GPU event (--events)")
        global_options(wait, top=False)
        wait_options(wait)
        wait.add_argument("--pids", type=watched_pid, nargs="+", action=_Merge, state=state, default=[], metavar="PID",
                          help="also require these PIDs off every GPU (repeats merge)")
        wait.add_argument("--precise", action="store_true", help="tight polling loop (~100 µs resolution, one core)")
        host_options(wait)

    if wanted("kill"):
        kill = sub_parser(
            sub, "kill", help="signal processes, escalate to SIGKILL, wait until they exited and the GPUs are clean",
            description="Signal the named PIDs (and with --tree their descendants) first, then open NVML and wait "
                        "until every target exited and the selected GPUs are clean. A target still running after "
                        "--grace gets SIGKILL. Targets are pinned (pidfd): a recycled PID is never signalled.",
            epilog="exit codes: 0 every target exited and the GPUs are clean, 1 not clean at the timeout, 2 usage (a "
                   "refused, missing or unsignallable PID; a selector without --yes), 3 backend unavailable or "
                   "failed, 4 a fatal GPU event (--events)",
        )
        global_options(kill, top=False)
        kill.add_argument("pids", type=pid_number, nargs="*", metavar="PID")
        wait_options(kill)
        once(kill, "--grace", type=grace_seconds, default=5.0, metavar="S",
             help="seconds before SIGKILL (default 5; 'never': no SIGKILL)")
        once(kill, "--signal", type=signal_name, default="SIGTERM", help="first signal (default TERM)")
        kill.add_argument("--tree", action="store_true",
                          help="also signal the targets' descendants (found at the first signal and on every poll)")
        kill.add_argument("--all-holders", action="store_true",
                          help="also kill every process in this PID namespace with an NVIDIA device file open, except "
                               "daemons (nvidia-persistenced, display servers, ...), this process and its ancestors")
        kill.add_argument("--all-on-gpu", action="store_true",
                          help="also kill every process on the selected GPUs' NVML process lists that has an NVIDIA "
                               "device file open here")
        kill.add_argument("--yes", action="store_true",
                          help="do not ask for confirmation with --all-holders/--all-on-gpu/--match/--container/"
                               "--cgroup (needed without a terminal)")
        once(kill, "--match", metavar="REGEX",
             help="also kill every process whose full command line matches REGEX (pkill -f; never this process, "
                  "its ancestors or PID 1); with --tree and --devices as for PIDs")
        once(kill, "--container", metavar="ID",
             help="also kill every process of one container: a docker/containerd/podman/cri-o ID (or its first 12+ "
                  "hex digits), lxc/NAME, a pod UID, slurm/JOBID, a systemd unit, pidns:INODE, or a cgroup path")
        once(kill, "--cgroup", metavar="PATH",
             help="also kill every process of one cgroup and the cgroups below it (/docker/ID as /proc/PID/cgroup "
                  "prints it, or a directory under /sys/fs/cgroup)")
        kill.add_argument("--exclude", action="append", metavar="PID|REGEX",
                          help="never signal this PID, or any process whose full command line matches REGEX (as "
                               "--match), however it was found (--all-holders, --all-on-gpu, a selector, --tree: "
                               "with what it started); repeat for more (a monitoring agent that keeps the GPUs open)")
        kill.add_argument("--dry-run", action="store_true",
                          help="print the plan (targets, how each was found, its container, whether SIGKILL goes at "
                               "once) and signal nothing")
        kill.add_argument("--missing-ok", action="store_true",
                          help="a named PID already gone (or a selector that selects nothing) is not an error")
        kill.add_argument("--only-targets", action="store_true",
                          help="judge only what the targets held (a shared GPU): clean when they exited and the "
                               "memory they held at the signal is back; other tenants are named 'not ours' (opens "
                               "NVML before the signal, to see what they held)")
        host_options(kill)

    if wanted("select"):
        select = sub_parser(
            sub, "select", help="wait until COUNT GPUs are clean and print them for CUDA_VISIBLE_DEVICES",
            description="Wait (up to --wait seconds) until --count GPUs are clean (no process of any kind, at most "
                        "--max-used bytes used) and healthy (no cause `ready` refuses a GPU for: a pending row "
                        "remap, ...) and print them comma-separated on stdout: "
                        "GPUS=$(nvmlcheck select --count 2 --wait 600) || exit 1; export CUDA_VISIBLE_DEVICES=$GPUS. "
                        "--devices limits the candidates (cuda:all: those CUDA_VISIBLE_DEVICES shows).",
            epilog="exit codes: 0 found, 1 not enough clean GPUs at the timeout (stderr says why), 2 usage, 3 backend",
        )
        global_options(select, top=False)
        once(select, "--count", type=positive_int, default=None, metavar="K",
             help="how many GPUs (required: --count K, or K alone after select)")
        select.add_argument("count_word", nargs="?", type=positive_int, default=None, metavar="K",
                            help="how many GPUs, as --count K")
        once(select, "--wait", "--timeout", dest="wait", type=seconds_or_none, default=0.0, metavar="S",
             help="seconds to wait for them (default 0: check once; 'none': forever); --timeout is the same option, "
                  "as for the other commands")
        once(select, "--max-used", type=byte_size, default=16 * MIB, metavar="BYTES",
             help=f"clean means at most this much used per GPU (default 16MiB; {SIZE_UNITS})")
        once(select, "--stable-polls", type=positive_int, default=1, metavar="N",
             help="consecutive clean polls a GPU needs (default 1)")
        select.add_argument("--no-health", action="store_true",
                            help="do not read the GPUs' health: a GPU that needs a reset (a pending row remap, ...) "
                                 "can be chosen")
        once(select, "--format", choices=("cuda", "index", "uuid"), default="cuda",
             help="cuda (default): numbers for CUDA_VISIBLE_DEVICES in CUDA's numbering of all GPUs (replacing any "
                  "current value); index: NVML/nvidia-smi indices; uuid: UUIDs (valid in CUDA_VISIBLE_DEVICES too)")
        select.add_argument("--lock", action="store_true",
                            help="lock the chosen GPUs (a lock file per UUID, $NVMLCHECK_LOCK_DIR or "
                                 "/tmp/nvmlcheck-locks-UID) and pass over GPUs others locked; the locks are kept by a "
                                 "holder process until --lock-pid exits")
        once(select, "--lock-pid", type=pid_number, default=None, metavar="PID",
             help="keep the locks until this process exits (default: the process that ran nvmlcheck, e.g. the "
                  "launch script's shell; implies --lock)")

    if wanted("ready"):
        ready = sub_parser(
            sub, "ready", help="is each GPU ready for the next job: clean, healthy, enough free memory (exit 0)?",
            description="One verdict per GPU: ready, or why not: reclaiming (its holders exited; with an ETA), held "
                        "(a live holder: pid, name, container, bytes), stuck (memory no signal frees), unhealthy (row "
                        "remap or page retirement pending, uncorrectable ECC, the driver's recovery action, a fatal "
                        "XID: each with the operator's action), short (clean, free < --need; a need beyond the GPU; "
                        "MIG mode with no instance), unknown (a query failed, or a clean reading the deadline left "
                        "unconfirmed). --timeout 0 (default) judges once; a longer one polls until ready, listening "
                        "for XIDs. docs/ready.md has the decision table.",
            epilog="exit codes: 0 ready, 1 not ready (yet) at the timeout, 5 a GPU needs an operator (unhealthy or "
                   "stuck: waiting cannot help), 2 usage, 3 backend unavailable or failed",
        )
        global_options(ready, top=False)
        once(ready, "--need", type=need_amount, default=None, metavar="BYTES|FRACTION",
             help="memory the next job allocates per GPU: a size (80GiB) or a fraction of each GPU's total (0.9, "
                  "90%%, like vLLM's gpu_memory_utilization); free = total - reserved - used must reach it")
        once(ready, "--timeout", type=seconds_or_none, default=0.0, metavar="S",
             help="seconds to wait until ready (default 0: judge once; 'none': forever)")
        once(ready, "--max-used", type=byte_size, default=16 * MIB, metavar="BYTES",
             help=f"clean means at most this much used per GPU (default 16MiB; {SIZE_UNITS})")
        once(ready, "--stable-polls", type=positive_int, default=2, metavar="N",
             help="consecutive ready polls required when waiting (default 2)")
        ready.add_argument("--no-events", action="store_true",
                           help="do not listen for XIDs while waiting (a fatal one makes the GPU unhealthy, exit 5)")
        host_options(ready)

    if wanted("holders"):
        holders = sub_parser(sub, "holders", help="every process that holds a GPU: NVML lists joined with open "
                                                   "NVIDIA device files",
                             description="List every process that holds a selected GPU: the NVML process lists "
                                         "joined with the processes of this PID namespace that have an NVIDIA device "
                                         "file open (a character device of NVIDIA's majors, whatever its path; no "
                                         "variable changes that), and how each was found. A process on a list but not "
                                         "seen here (another PID namespace, no permission) shows ? for what cannot "
                                         "be read; --json says why under unknown. What `kill --all-holders`/"
                                         "--all-on-gpu would choose from.")
        global_options(holders, top=False)
        once(holders, "--timeout", type=seconds_or_none, default=30.0, metavar="S",
             help="seconds the reading may take (default 30; 'none': no bound; 0: one complete reading); cut by it, "
                  "exit 3: the holders are unknown, never 'none'")
        host_options(holders)

    if wanted("demo"):
        demo = sub_parser(sub, "demo",
                          help="a simulated H200: a real child holds memory, is killed, and the wait sees the reclaim",
                          description="Runs on the bundled simulated H200 only; it reads no real GPU and takes no "
                                      "backend or device options.")
        global_options(demo, top=False, gpu=False)

    if wanted("simulate"):
        simulate = sub_parser(
            sub, "simulate", help="rehearse on simulated GPUs: run a command on them, or hold one with a process",
            description="Rehearse a launch script in the shell on the bundled stub libnvidia-ml (needs a C compiler "
                        "and nvidia-nvml-dev: pip install 'nvmlcheck[sim]'). Every output on simulated GPUs says so.",
        )
        sims = simulate.add_subparsers(dest="simulate_command", required=True, parser_class=_Parser)
        sim_run = sub_parser(
            sims, "run", help="run a command with every nvmlcheck in it reading the simulated GPUs",
            description="Run COMMAND with an `nvmlcheck` first on its PATH that adds --simulate FILE to every "
                        "nvmlcheck command it runs, and $NVMLCHECK_LIBNVML and $NVMLCHECK_STUB_SCENARIO (for Python "
                        "code calling nvmlcheck.open()) pointing at the scenario. Exits with COMMAND's status.",
            epilog="example: nvmlcheck simulate run --scenario h200x8 -- ./launch.sh",
        )
        once(sim_run, "--scenario", "--simulate", dest="scenario", metavar="SCENARIO", default=None,
             help="a bundled scenario (h200, h200x8, h200-busy; copied to a file for the run) or a scenario file "
                  "(default h200); --simulate is the same option")
        sim_run.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]")
        hold = sub_parser(
            sims, "hold", help="start a command as a process that holds memory on a simulated GPU until it exits",
            description="Start COMMAND (a real process) and add it to the scenario file, bound to its PID: listed on "
                        "--gpu with --bytes while it runs; after it exits, off the list --list-ms and its memory back "
                        "--release-ms later, as a driver does, then the entry is removed. Exits with COMMAND's "
                        f"status. Sizes: {SIZE_UNITS}.",
            epilog="example: nvmlcheck simulate hold --gpu 0 --bytes 8GiB -- sleep 30 &",
        )
        once(hold, "--gpu", type=non_negative_int, required=True, metavar="N", help="the GPU index (required)")
        once(hold, "--bytes", type=byte_size, required=True, metavar="SIZE", help="memory it holds, e.g. 8GiB")
        once(hold, "--kind", choices=("compute", "graphics", "mps"), default="compute",
             help="which process list shows it (default compute)")
        once(hold, "--list-ms", type=milliseconds, default=90, metavar="MS",
             help="ms from its exit until it leaves the list (default 90)")
        once(hold, "--release-ms", type=milliseconds, default=120, metavar="MS",
             help="ms from its exit until its memory is back (default 120)")
        once(hold, "--scenario", "--simulate", dest="scenario", metavar="FILE", default=None,
             help="the scenario file to add it to (default: the file of a --simulate given before `simulate`, which "
                  "`simulate run` passes); --simulate is the same option")
        hold.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARG ...]")
        show = sub_parser(sims, "scenario", help="print a bundled scenario, to start a scenario file from",
                          epilog="example: nvmlcheck simulate scenario h200x8 > gpus.txt")
        show.add_argument("name", choices=("h200", "h200x8", "h200-busy"))

    if wanted("study"):
        study = sub_parser(sub, "study", help="measurement studies (reclaim: how fast the driver gives memory back)")
        global_options(study, top=False)
        studies = study.add_subparsers(dest="study", required=True, parser_class=_Parser)
        reclaim = sub_parser(
            studies, "reclaim", help="time the driver's reclamation of GPU memory after a holder process ends",
            description="Start a process holding memory on each selected GPU, end it, and time when its PID leaves "
                        "the NVML list, when the memory is back, and when waitpid returns. Refuses to start unless the "
                        "GPUs are clean.",
            epilog="exit codes: 0 every run completed (or --budget stopped the study), 1 a run timed out or the GPUs "
                   "were not clean at baseline, 2 usage, 3 backend or holder failure, or a study that cannot run here "
                   "(skipped: --kind mps without nvidia-cuda-mps-control, --kind nccl with one GPU)",
        )
        global_options(reclaim, top=False)
        # 0 is the study's to refuse, by holder kind: pinned and nccl may hold no device memory, context holds none.
        once(reclaim, "--sizes", type=size_list_zero, default=None, metavar="LIST",
             help="bytes held per GPU, comma-separated (default 1GiB,4GiB,16GiB; 0 or none with --holder context; "
                  "0 allowed with pinned and nccl)")
        once(reclaim, "--repeats", type=positive_int, default=5, metavar="N",
             help="measured runs per size and ending (default 5)")
        once(reclaim, "--endings", type=ending_list, default=["KILL", "TERM"], metavar="LIST",
             help="how the holder ends: KILL, TERM, exit, free (comma-separated; default KILL,TERM)")
        once(reclaim, "--mode", choices=("precise", "default"), default="precise",
             help="polling: precise (tight loop, one busy core; default) or default (~1.5 ms)")
        once(reclaim, "--out", metavar="FILE.jsonl", default=None,
             help="write one JSON Lines record per run (schema nvmlcheck/reclaim-run, version 1)")
        reclaim.add_argument("--trace", action="store_true", help="keep the per-poll trace in each record")
        once(reclaim, "--plot", metavar="DIR", default=None,
             help="write PNG plots to DIR (needs matplotlib: pip install 'nvmlcheck[plot]')")
        reclaim.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                             help="one discarded warm-up run before each size and ending (default on)")
        reclaim.add_argument("--events", action="store_true",
                             help="listen for NVML events during each run and record them (field 'events')")
        once(reclaim, "--run-timeout", type=positive_seconds, default=30.0, metavar="S",
             help="seconds from the signal until clean and reaped, else the run times out (default 30)")
        once(reclaim, "--chunks", type=positive_int, default=1, metavar="N",
             help="allocations per holder (python -m nvmlcheck.holder --chunks; default 1)")
        # --- study reclaim, second edition (issue 18): holder kinds, concurrency, phases; study compare ---------
        once(reclaim, "--holder", "--kind", dest="holder",
             choices=("alloc", "context", "chunks", "contexts", "streams", "destroy", "pinned", "ipc", "managed",
                      "mps", "nccl"),
             default="alloc",
             help="what each holder sets up: alloc (default), context (no allocation: the floor), chunks (--count "
                  "allocations), contexts (--count contexts), streams (--count streams with work queued at the "
                  "end), destroy (cuCtxDestroy before exiting on exit/free); pinned (--pinned host memory), ipc "
                  "(an exporter and --importers), managed (cuMemAllocManaged touched on the GPU), mps (a client of "
                  "a daemon the study starts), nccl (a communicator across the selected GPUs)")
        once(reclaim, "--count", type=positive_int, default=None, metavar="N",
             help="allocations, contexts or streams per holder, by --holder (default --chunks; 4 for chunks, "
                  "contexts and streams)")
        once(reclaim, "--per-gpu", type=positive_int, default=1, metavar="N",
             help="holders on each GPU, ended together (default 1)")
        once(reclaim, "--concurrent", choices=("gpus", "none"), default="gpus",
             help="gpus: end the holders of every selected GPU at the same instant (default); none: one GPU per run, "
                  "in turn")
        reclaim.add_argument("--phases", action=argparse.BooleanOptionalAction, default=True,
                             help="watch /proc for the leader zombie, the pidfd exit and the device files closing "
                                  "(default on)")
        once(reclaim, "--device-files", metavar="GLOBS", default=None,
             help="':'-separated globs of the files whose closing the study watches in its holders (default "
                  "/dev/nvidia*)")
        compare = sub_parser(
            studies, "compare", help="do two studies differ? per cell, the median difference with a bootstrap interval",
            description="Compare two JSON Lines files of study reclaim records cell by cell (size, ending, holder "
                        "kind, GPU): median of B minus median of A with a percentile-bootstrap confidence interval, "
                        "a plain verdict at the level, outliers listed (kept), and how many runs would resolve 5 ms.",
            epilog="exit codes: 0 compared, 2 usage or unreadable records",
        )
        global_options(compare, top=False, gpu=False)
        compare.add_argument("a", metavar="A.jsonl", help="the reference study's records")
        compare.add_argument("b", metavar="B.jsonl", help="the study compared with it")
        once(compare, "--level", type=number, default=0.95, metavar="P",
             help="confidence level, within (0, 1) (default 0.95)")
        once(compare, "--resamples", type=positive_int, default=5000, metavar="N",
             help="bootstrap resamples (default 5000)")
        once(compare, "--seed", type=integer, default=0, metavar="S",
             help="random seed: same records and seed, same output (default 0)")
        once(compare, "--measure", default="memory_back",
             choices=("zombie", "exited", "files_closed", "off_list", "memory_back", "first_clean", "waitpid"),
             help="which time from the signal to compare (default memory_back)")
        once(compare, "--across", metavar="PARTS", default="",
             help="comma-separated cell parts (size, ending, holder, device, pinned, importers, first, role) or "
                  "conditions (simulated, mode, backend, driver, gpu, count, per_gpu, concurrent, pin_mode, "
                  "stage_gap) left out of the matching, to compare "
                  "conditions that differ in them, e.g. --across ending for exit.jsonl against free.jsonl; runs "
                  "that differ in a condition not named are never pooled nor compared")
        once(compare, "--resolve-ms", type=number, default=5.0, metavar="MS",
             help="the difference the repeats guidance aims to resolve, ms (default 5)")
        # --- end of the second-edition block ---------------------------------------------------------------------
        # --- third edition (issue 26): sweeps of pinned memory and importers, a time budget; study fit ----------
        once(reclaim, "--pinned", type=size_list_zero, default=None, metavar="LIST",
             help="pinned host memory per holder, swept (--kind pinned), e.g. 0,8GiB,32GiB (default 0)")
        once(reclaim, "--pin-mode", choices=("alloc", "register"), default="alloc",
             help="pin with cuMemHostAlloc (alloc, default) or cuMemHostRegister of mapped memory (register)")
        once(reclaim, "--importers", type=count_list, default=None, metavar="LIST",
             help="IPC importers beside each exporter, swept (--kind ipc), e.g. 0,1,2,4 (default 0)")
        once(reclaim, "--first", type=word_list("exporter", "importers"), default=None, metavar="LIST",
             help="which side of an IPC group is ended first, comma-separated and swept: exporter, importers, or "
                  "exporter,importers for both (default exporter)")
        once(reclaim, "--stage-gap", type=seconds, default=0.3, metavar="S",
             help="seconds between the first side being reaped and the other side's end (default 0.3)")
        once(reclaim, "--budget", type=positive_seconds, default=None, metavar="S",
             help="start no run after S seconds, nor one the cell's last run says would end after them")
        once(reclaim, "--ready-timeout", type=positive_seconds, default=60.0, metavar="S",
             help="seconds for NVML to show a ready holder and its memory, else the study fails (default 60)")
        fit = sub_parser(
            studies, "fit", help="fit the reclaim-time model to study records",
            description="Fit the reclaim-time model (nvmlcheck.reclaim_model) to JSON Lines study records: time "
                        "from the last signal to the memory back, against contexts, device GiB, pinned host GiB and "
                        "IPC importers; prints each coefficient, the error, every cell against the model, and the "
                        "code that registers it.",
            epilog="exit codes: 0 fitted, 2 usage, unreadable records or nothing to fit",
        )
        global_options(fit, top=False, gpu=False)
        fit.add_argument("records", metavar="RECORDS.jsonl", nargs="+", help="study reclaim records")
        once(fit, "--kinds", default=None, metavar="LIST",
             help="holder kinds fitted (default alloc,chunks,context,contexts,pinned,ipc)")
        once(fit, "--endings", type=ending_list, default=None, metavar="LIST",
             help="endings fitted (default: one ending, the first of KILL, TERM, exit the records have, the others "
                  "shown against the model; all three with --across ending)")
        once(fit, "--driver", default=None, metavar="VERSION",
             help="the driver the model is for (default: the records', which must be of one branch)")
        once(compare, "--stage", choices=("all", "last"), default="all",
             help="every holder (all, default) or only each run's last stage (last: the IPC side ended last)")
        # --- end of the third-edition block ----------------------------------------------------------------------
        # --- simulated runs kept apart (records say whether they were simulated) -------------------------------
        fit.add_argument("--include-simulated", action="store_true",
                         help="fit simulated runs too (--simulate: the stub's timings, not a driver's; left out by "
                              "default, and refused when every run is simulated)")
        # --- populations kept apart: one fit, one set of conditions ---------------------------------------------
        once(fit, "--across", metavar="PARTS", default="",
             help="comma-separated conditions the model has no term for (gpu, backend, mode, ending, pin_mode, "
                  "holder) to fit as one model anyway, e.g. --across ending for KILL and TERM runs; runs that differ "
                  "in a condition not named are refused (each condition stays its own cell)")
    if wanted("slurm"):
        slurm_parser(sub, sub_parser, global_options, once)
    return parser


def slurm_parser(sub: Any, sub_parser: Any, global_options: Any, once: Any) -> None:
    """``slurm epilog | prolog | health`` (issue 25; docs/slurm.md)."""
    slurm = sub_parser(sub, "slurm", help="the GPU gate between Slurm jobs: Epilog, Prolog, HealthCheckProgram",
                       description="Run by slurmd (docs/slurm.md). The job's GPUs come from SLURM_JOB_GPUS (else "
                                   "CUDA_VISIBLE_DEVICES); --devices replaces them.")
    global_options(slurm, top=False)
    gates = slurm.add_subparsers(dest="slurm_command", required=True, parser_class=_Parser)
    helps = {
        "epilog": ("kill what the ended job left on its GPUs, wait until they are ready, else drain the node", 60.0),
        "prolog": ("wait until the job's GPUs are ready, else drain the node and refuse the job", 30.0),
        "health": ("HealthCheckProgram: drain on an unhealthy GPU (row remap pending, ...), return to service "
                   "what nvmlcheck drained once ready", 20.0),
    }
    for name, (text, timeout) in helps.items():
        p = sub_parser(gates, name, help=text, description=text[0].upper() + text[1:] + ".",
                       epilog="exit codes: 0 ready (health: the node is as its GPUs say), 1 not ready (drained), "
                              "2 usage, 3 no GPU backend (drained)")
        global_options(p, top=False)
        once(p, "--timeout", type=positive_seconds, default=timeout, metavar="S",
             help=f"bound for the whole run, scontrol included (default {timeout:g}); keep it below Slurm's "
                  "PrologEpilogTimeout (HealthCheckProgram: 60 s)")
        once(p, "--max-used", type=byte_size, default=16 * MIB, metavar="BYTES",
             help="clean means at most this much used per GPU (default 16MiB)")
        p.add_argument("--dry-run", action="store_true",
                       help="print the scontrol commands instead of running them" +
                            (", and signal nothing" if name == "epilog" else ""))
        p.add_argument("--no-drain", action="store_true", help="never drain: the exit code alone says not ready")
        once(p, "--record", metavar="FILE", default=None,
             help="append the nvmlcheck/slurm JSON document of this run to FILE, one line")
        once(p, "--scontrol", metavar="PATH", default=None,
             help="the scontrol to run (default: on PATH, else /usr/bin, /usr/local/bin, /opt/slurm/bin)")
        once(p, "--node", metavar="NAME", default=None,
             help="the node to drain (default $SLURMD_NODENAME, else the short host name)")
        if name != "health":
            once(p, "--gpu-ids", choices=("minor", "index"), default="minor",
                 help="what Slurm's GPU IDs count, as gres.conf numbers them: minor, the N of /dev/nvidiaN (File= "
                      "lists /dev/nvidia0..N in order; the default); index, NVML's index in PCI bus order "
                      "(AutoDetect=nvml)")
        if name == "epilog":
            once(p, "--grace", type=grace_seconds, default=2.0, metavar="S",
                 help="seconds from SIGTERM to SIGKILL for the job's leftovers (default 2; at the latest, and with "
                      "'never', once half of the time left is gone)")
            once(p, "--device-files", metavar="GLOBS", default=None,
                 help="':'-separated globs of the files that count as NVIDIA device files (default /dev/nvidia*)")
        if name == "health":
            p.add_argument("--no-resume", action="store_true",
                           help="never return a node to service (default: an idle node nvmlcheck drained, once its "
                                "GPUs are ready)")

