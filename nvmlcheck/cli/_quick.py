"""The quick parse: the plain argv of a launch script's ``kill``, ``wait``, ``snapshot`` or ``ready``, without argparse.

argparse (with ``re``, ``gettext``, ``locale``) and building a command's parser cost a one-shot or a kill several
milliseconds before its first NVML call or signal (docs/performance.md, "Start-up"). :func:`quick_parse` reads the
common forms here, with the value types argparse uses (:mod:`._values`), into a namespace with the very attributes
argparse's would have; anything else (help, an unknown or abbreviated option, a repeat, a bad value, ``--``, hosts,
``wait --pids``) returns ``None`` and argparse parses it, errors included. ``tests/unit/test_quick_parse.py`` holds
the two parses equal, defaults included, for every form read here.
"""

from __future__ import annotations

from ._values import (
    byte_size,
    command_words,
    device_list,
    grace_seconds,
    need_amount,
    pid_number,
    positive_int,
    seconds_or_none,
    signal_name,
)

TYPE_CHECKING = False  # no typing: it costs start-up where site has not loaded it (docs/performance.md)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any

MIB = 1 << 20


class Namespace:
    """What the command reads its options from: attributes, as ``argparse.Namespace`` (equal by attributes)."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __eq__(self, other: object) -> bool:
        return vars(self) == vars(other) if hasattr(other, "__dict__") else NotImplemented

    def __contains__(self, key: str) -> bool:
        return key in self.__dict__

    def __repr__(self) -> str:
        return f"Namespace({', '.join(f'{k}={v!r}' for k, v in sorted(vars(self).items()))})"

    __hash__ = None  # type: ignore[assignment]


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text not in allowed:
            raise ValueError(text)  # not ours to word: argparse says it
        return text
    return check


def _text(text: str) -> str:
    return text


#: The global options (before or after the command): option → (dest, type, default). ``--devices`` merges.
_GLOBAL: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "--backend": ("backend", _choice("auto", "nvml", "smi"), "auto"),
    "--smi-prefix": ("smi_prefix", command_words, None),
    "--simulate": ("simulate", _text, None),
    "--devices": ("devices", device_list, None),
}
_HOST_DEFAULTS = {"hosts": None, "hosts_file": None, "remote_prefix": None, "remote_python": "python3", "fanout": 32,
                  "connect_timeout": 10.0, "ssh_options": None}
_WAIT_VALUED: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "--timeout": ("timeout", seconds_or_none, 30.0),
    "--max-used": ("max_used", byte_size, 16 * MIB),
    "--stable-polls": ("stable_polls", positive_int, 2),
}

#: command → (its valued options, its flags (dest, default False), the defaults of what the quick parse refuses).
_COMMANDS: dict[str, tuple[dict[str, tuple[str, Callable[[str], Any], Any]], tuple[str, ...], dict[str, Any]]] = {
    "wait": (_WAIT_VALUED, ("--events", "--precise"), {"pids": [], **_HOST_DEFAULTS}),
    "snapshot": ({}, (), dict(_HOST_DEFAULTS)),
    "ready": ({"--need": ("need", need_amount, None), "--timeout": ("timeout", seconds_or_none, 0.0),
               "--max-used": ("max_used", byte_size, 16 * MIB), "--stable-polls": ("stable_polls", positive_int, 2)},
              ("--no-events",), dict(_HOST_DEFAULTS)),
    "kill": ({**_WAIT_VALUED, "--grace": ("grace", grace_seconds, 5.0), "--signal": ("signal", signal_name, "SIGTERM"),
              "--match": ("match", _text, None), "--container": ("container", _text, None),
              "--cgroup": ("cgroup", _text, None)},
             ("--events", "--tree", "--all-holders", "--all-on-gpu", "--yes", "--dry-run", "--missing-ok",
              "--only-targets"),
             {"exclude": None, **_HOST_DEFAULTS}),
}


def _flag_dest(option: str) -> str:
    return option[2:].replace("-", "_")


def quick_parse(argv: Sequence[str]) -> Namespace | None:
    """The namespace argparse would give for ``argv``, or ``None`` where argparse must parse it (anything but the
    plain forms of ``kill``, ``wait``, ``snapshot`` and ``ready``; every error)."""
    try:
        return _parse(argv)
    except (ValueError, TypeError, ArithmeticError):
        return None
    except Exception as exc:  # the value types' ArgumentTypeError: argparse says it
        if type(exc).__name__ == "ArgumentTypeError":
            return None
        raise


def _parse(argv: Sequence[str]) -> Namespace | None:
    read = _read(argv)
    if read is None:
        return None
    command, values, positionals = read
    command_valued, command_flags, others = _COMMANDS[command]
    out: dict[str, Any] = {dest: default for dest, _, default in _GLOBAL.values()}
    out.update(json=False, command=command, **others)
    # A string default goes through its type, as argparse does (--signal's "SIGTERM" is a SignalWord there).
    out.update({dest: convert(default) if isinstance(default, str) else default
                for dest, convert, default in command_valued.values()})
    out.update({_flag_dest(option): False for option in command_flags})
    if command == "kill":
        out["pids"] = [pid_number(p) for p in positionals]
    elif command == "snapshot":
        if len(positionals) > 1 or (positionals and positionals[0] not in ("devices", "procs")):
            return None
        out["view"] = positionals[0] if positionals else "devices"
    elif positionals:
        return None
    out.update(values)
    return Namespace(**out)


def _read(argv: Sequence[str]) -> tuple[str, dict[str, Any], list[str]] | None:
    """The command, the options' values by dest, and the positionals (one run of them), or ``None``."""
    values: dict[str, Any] = {}
    command: str | None = None
    valued = _GLOBAL
    flags: tuple[str, ...] = ("--json",)
    positionals: list[str] = []
    runs = 0
    words = iter(argv)
    previous_positional = False
    for word in words:
        positional = not word.startswith("-") or word == "-"
        if positional and command is None:
            if word not in _COMMANDS:
                return None
            command = word
            valued = {**_GLOBAL, **_COMMANDS[word][0]}
            flags = ("--json", *_COMMANDS[word][1])
        elif positional:
            runs += 0 if previous_positional else 1
            positionals.append(word)
        elif not _option(word, words, valued, flags, values):
            return None
        previous_positional = positional and command is not None and bool(positionals)
    if command is None or runs > 1:
        return None
    return command, values, positionals


def _option(word: str, words: Iterator[str], valued: dict[str, tuple[str, Callable[[str], Any], Any]],
            flags: tuple[str, ...], values: dict[str, Any]) -> bool:
    """Read the option ``word`` (and its value from ``words``) into ``values``; ``False``: argparse's to read."""
    name, eq, value = word.partition("=")
    if not name.startswith("--"):
        return False  # -h, a negative number, short options
    if name in flags and not eq:
        values[_flag_dest(name)] = True
        return True
    spec = valued.get(name)
    if spec is None:
        return False
    if not eq:
        given = next(words, None)
        if given is None or given.startswith("-"):
            return False
        value = given
    dest, convert, _ = spec
    parsed = convert(value)
    if dest == "devices":
        values[dest] = list(dict.fromkeys([*values.get(dest, []), *parsed]))
    elif dest in values:
        return False  # given twice: argparse's usage error
    else:
        values[dest] = parsed
    return True


def wants_simulation(argv: Sequence[str]) -> bool:
    """Whether ``--simulate`` is among the options (before a ``--``): a usage error's document then says
    ``"simulated": true`` as every other document of the run would."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--simulate" or arg.startswith("--simulate="):
            return True
    return False


def wants_json(argv: Sequence[str]) -> bool:
    """Whether ``--json`` is among the options (before a ``--``): argument errors then print a document too."""
    for arg in argv:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False
