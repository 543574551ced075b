"""``--host``/``--hosts``/``--hosts-file`` on ``snapshot``, ``wait``, ``kill``, ``holders`` and ``ready``: the command
runs on each host through ssh (:mod:`nvmlcheck.hosts`), and one verdict comes back.

:func:`wanted` tells whether hosts were given; :func:`run_hosts` builds each host's remote command
(:func:`remote_command`: the command's own options, passed on), runs it on every host and prints one line per host
or one ``nvmlcheck/hosts`` document. Imported only when hosts are given: a local launch script never pays for
threads, json or ssh. Options, the document and what runs where: docs/hosts.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import TYPE_CHECKING, Any

from ._common import UsageError, verdict, verdict_printed
from ._output import UNKNOWN_PROCESS_USED, StatusLine, human_bytes, plural, print_json, safe, write_whole

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from ..hosts import Host, HostResult, SmiFallback


def _hosts(args: argparse.Namespace) -> list[Host]:
    from ..hosts import hosts_file_lines, parse_hosts

    specs = list(args.hosts or [])
    if args.hosts_file is not None:
        try:
            lines = hosts_file_lines(args.hosts_file)
        except OSError as exc:
            raise UsageError(f"--hosts-file {args.hosts_file}: {exc.strerror or exc}") from None
        except ValueError as exc:  # a device, a directory, too large, not UTF-8
            raise UsageError(f"--hosts-file: {exc}") from None
        if not lines:
            # Even beside --host: a fleet file emptied (truncated, every line commented out) would have left its
            # hosts unchecked and the verdict that of the --host alone.
            raise UsageError(f"--hosts-file {args.hosts_file}: no host in it (only blank lines and # comments)")
        for no, spec in lines:  # each line alone first: an error names its line
            try:
                parse_hosts([spec])
            except ValueError as exc:
                raise UsageError(f"--hosts-file {args.hosts_file}:{no}: {exc}") from None
        specs += [spec for _, spec in lines]
    try:
        hosts = parse_hosts(specs)
    except ValueError as exc:
        where = f" (in {args.hosts_file})" if args.hosts_file is not None else ""
        raise UsageError(f"{exc}{where}") from None
    if not hosts:
        raise UsageError(f"--hosts-file {args.hosts_file}: no host in it")
    return hosts


def _seconds(value: float | None) -> str:
    return "none" if value is None else repr(float(value))


#: The options of a command run on hosts that stay here: how the hosts are reached, what is printed here, and what
#: --host refuses (--simulate, --smi-prefix).
LOCAL_OPTIONS = frozenset({"hosts", "hosts_file", "remote_prefix", "remote_python", "fanout", "connect_timeout",
                           "ssh_options", "json", "view", "simulate", "smi_prefix"})


def remote_command(args: argparse.Namespace) -> list[str]:
    """The command's words for the remote nvmlcheck, rebuilt from the parsed options (``--json`` is added by the
    fleet; the view of ``snapshot`` only changes what is printed here). Every option of the command reaches the
    remote side but those of :data:`LOCAL_OPTIONS` (tests/unit/test_hosts_spec.py checks each command's parser)."""
    words = [args.command]
    if args.backend != "auto":
        words += ["--backend", args.backend]
    if args.devices:
        words += ["--devices", ",".join(map(str, args.devices))]
    if args.command in ("wait", "kill", "ready"):
        words += ["--timeout", _seconds(args.timeout), "--max-used", str(args.max_used),
                  "--stable-polls", str(args.stable_polls)]
        if getattr(args, "events", False):
            words.append("--events")  # a fatal XID on a remote GPU ends its wait there (exit 4), as it does here
    if args.command == "holders":
        words += ["--timeout", _seconds(args.timeout)]  # the bound of each host's reading, there as here
    if args.command == "ready":
        if args.need is not None:
            need_bytes, need_fraction = args.need
            # In bytes with their unit: a bare number under 1 MiB is refused there as ambiguous (80: GiB? %?).
            words += ["--need", f"{need_bytes}B" if need_fraction is None else repr(need_fraction)]
        if args.no_events:
            words.append("--no-events")
    if args.command == "wait":
        if args.pids:
            words += ["--pids", *map(str, args.pids)]
        if args.precise:
            words.append("--precise")
    if args.command == "kill":
        # The signal as the user spelled it, not as this host names it: a real-time signal's number depends on the C
        # library (SIGRTMIN is 34 with glibc, 35 with musl). `--signal 35` named here "SIGRTMIN+1" sent 36 on a musl
        # host; the number is passed as the number, `RTMIN+1` as each host's own SIGRTMIN + 1 (what a program built
        # there handles). A word this host refuses is refused before any host runs; one a host refuses (RTMIN+30 on
        # musl) is that host's usage error.
        signal = getattr(args.signal, "given", args.signal)
        words += ["--grace", "never" if args.grace is None else repr(float(args.grace)), "--signal", signal]
        words += [flag for flag, on in (("--tree", args.tree), ("--all-holders", args.all_holders),
                                        ("--all-on-gpu", args.all_on_gpu), ("--yes", args.yes),
                                        ("--dry-run", args.dry_run), ("--missing-ok", args.missing_ok),
                                        ("--only-targets", args.only_targets)) if on]
        # FLAG=VALUE: a value of the user's (a pattern, an ID) may begin with "-", which the remote parser would
        # read as an option of its own.
        for flag, value in (("--match", args.match), ("--container", args.container), ("--cgroup", args.cgroup)):
            if value is not None:
                words.append(f"{flag}={value}")
        words += [f"--exclude={value}" for value in args.exclude or ()]  # what must never be signalled, there too
        if args.pids:
            words += ["--", *map(str, args.pids)]
    return words


def _fallback(args: argparse.Namespace) -> SmiFallback | None:
    from ..hosts import SmiFallback

    devices = tuple(args.devices) if args.devices else None
    if args.command == "snapshot":
        return SmiFallback("snapshot", devices)
    if args.command == "wait":
        return SmiFallback("wait", devices, args.timeout, args.max_used, args.stable_polls, tuple(args.pids or ()))
    return None


def _check(args: argparse.Namespace) -> None:
    from ..hosts import MAX_CONNECT_TIMEOUT_S

    if not args.connect_timeout <= MAX_CONNECT_TIMEOUT_S:
        raise UsageError(f"--connect-timeout must be at most {MAX_CONNECT_TIMEOUT_S:g} seconds (a day), "
                         f"got {args.connect_timeout:g}")
    if args.simulate is not None:
        raise UsageError("--simulate runs on this machine: it cannot be combined with --host/--hosts/--hosts-file")
    if args.smi_prefix is not None:
        raise UsageError("--smi-prefix cannot be combined with --host: the hosts are reached through ssh "
                         "(use --remote-prefix for a command to run behind on each host)")
    if args.command == "kill":
        chooses = args.all_holders or args.all_on_gpu or args.match is not None or args.container is not None or \
            args.cgroup is not None
        if not (args.pids or chooses):
            raise UsageError("name at least one PID (or --match, --container, --cgroup, --all-holders, --all-on-gpu)")
        if chooses and not (args.yes or args.dry_run):
            raise UsageError("--all-holders/--all-on-gpu/--match/--container/--cgroup on hosts need --yes: nothing "
                             "can be confirmed host by host; run with --dry-run first to see what would be killed")


def run_hosts(args: argparse.Namespace) -> int:
    """Run the command on every host; print one line per GPU (or per holder) with the host in front, a verdict per
    host and one summary, or one ``nvmlcheck/hosts`` document; return the one verdict."""
    from ..hosts import Fleet, overall_exit_code

    _check(args)
    hosts = _hosts(args)
    if os.environ.get("NVMLCHECK_SSH_OPTIONS"):
        # It used to add ssh options; an environment variable that changes what ssh does reaches root through
        # sudo -E and CI jobs unseen, so it is no longer read (issue 27): say so rather than ignore it silently.
        print("nvmlcheck: NVMLCHECK_SSH_OPTIONS is no longer read: pass --ssh-options instead", file=sys.stderr)
    try:
        fleet = Fleet(remote_prefix=args.remote_prefix or (), remote_python=args.remote_python,
                      connect_timeout_s=args.connect_timeout, fanout=args.fanout, ssh_options=args.ssh_options)
    except ValueError as exc:  # an unbalanced quote in --remote-prefix or --ssh-options
        raise UsageError(str(exc).replace("remote_prefix", "--remote-prefix")
                         .replace("remote_python", "--remote-python").replace("ssh_options", "--ssh-options")) from None
    timeout = args.timeout if args.command in ("wait", "kill", "ready") else 0.0
    deadline: float | None = None  # the fleet's default: timeout + the connect and start allowances
    if args.command == "holders":
        # Its --timeout bounds each host's reading, there as here: the host's deadline is it plus the allowances.
        # With the default (0) a reading the host was told it had 30 s for was killed at the connect timeout + 5 s.
        from ..hosts import START_ALLOWANCE_S

        timeout = None
        deadline = None if args.timeout is None else args.timeout + args.connect_timeout + START_ALLOWANCE_S
    status = StatusLine(sys.stderr, not args.json)

    def progress(pending: Sequence[Host], done: Sequence[HostResult]) -> None:
        if pending:
            # Of the hosts that run: the fleet runs a host given in two spellings once (ssh -G), so not len(hosts).
            names = ", ".join(map(str, pending[:8])) + (", ..." if len(pending) > 8 else "")
            status.update(f"{len(done)}/{len(done) + len(pending)} hosts answered · waiting on {names}")

    try:
        with fleet:
            results = fleet.run(hosts, remote_command(args), timeout_s=timeout, deadline_s=deadline,
                                fallback=_fallback(args), on_progress=progress)
    finally:
        status.clear()
    code = overall_exit_code(results)
    verdict(code, answer_is_output=args.command not in ("wait", "kill"))
    # The answer is rendered first and written whole: a fleet's document is megabytes (64 hosts of 8 GPUs), and a
    # Ctrl-C or SIGTERM while a slow reader takes it must not leave half a JSON document (or half the lines).
    rendered = io.StringIO()
    with contextlib.redirect_stdout(rendered):
        if args.json:
            from ..jsonout import hosts_document

            print_json(hosts_document(args.command, results, code))
        else:
            _print(args, results)
    write_whole(rendered.getvalue())
    verdict_printed(code)
    return code


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _bytes(value: Any) -> str:
    """A remote byte count as text; anything but an integer (a hostile or broken host) shows as ``?``."""
    return human_bytes(value) if isinstance(value, int) and not isinstance(value, bool) else "?"


_READY_WORDS = {"clean": "ready", "not-clean": "NOT READY", "unhealthy": "NEEDS AN OPERATOR", "failed": "FAILED"}


# A remote document is another machine's word: every value shown goes through safe() (a GPU name could set the
# terminal title, a message forge a line), and a value of the wrong type shows as "?" rather than raising.


def _in_order(snap: dict[str, Any]) -> list[tuple[dict[str, Any], bool]]:
    """A host's GPUs, read and unreadable (``True``), in index order, as the local table has them: an unreadable
    GPU 1 printed after GPU 7 was where a reader of GPU 1's line does not look. A row whose index is not a number
    (a broken host) keeps its place after the others."""
    rows = [(d, False) for d in map(_dict, _list(snap.get("devices")))]
    rows += [(f, True) for f in map(_dict, _list(snap.get("failures")))]

    def key(row: tuple[dict[str, Any], bool]) -> tuple[int, int]:
        index = row[0].get("index")
        return (0, index) if isinstance(index, int) and not isinstance(index, bool) else (1, 0)

    return sorted(rows, key=key)  # stable: the host's own order among equals


def _why(d: dict[str, Any], key: str) -> str:
    """The host's reason for the unknown field ``key`` (its document's ``unknown``; a whole part's reason answers for
    its fields, as ``DeviceState.why_unknown`` reads it), or that the host gave none."""
    unknown = _dict(d.get("unknown"))
    why = unknown.get(key)
    if why is None and "." in key:
        why = unknown.get(key.split(".", 1)[0])
    return str(why) if why is not None else "no reason given by the host"


def _unknown_line(name: str, d: dict[str, Any]) -> str | None:
    """Under a GPU's line: why each ``?`` of it is one (as the local table says it); values unknown for the same
    reason share it."""
    from ..model import unknown_key

    found: list[tuple[str, str]] = []
    m = d.get("memory")
    if not isinstance(m, dict):
        found.append(("memory", _why(d, "memory")))
    else:
        found += [(what, _why(d, f"memory.{field}")) for what, field in (("used", "used_bytes"), ("total",
                  "total_bytes")) if not _is_int(m.get(field))]
    procs = _dict(d.get("processes"))
    for kind in ("compute", "graphics", "mps"):
        if not isinstance(procs.get(kind), list):
            found.append((f"{kind} processes", _why(d, unknown_key("processes", kind))))
    if not found:
        return None
    by_reason: dict[str, list[str]] = {}
    for what, why in found:
        by_reason.setdefault(why, []).append(what)
    said = "; ".join(", ".join(whats) + f": {why}" for why, whats in by_reason.items())
    return f"{name}    " + safe(f"(unknown: {said})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _gpu_lines(name: str, snap: dict[str, Any]) -> list[str]:
    lines = []
    for d, unreadable in _in_order(snap):
        if unreadable:
            lines.append(_failure_line(name, d))
            continue
        m = _dict(d.get("memory"))
        procs = _dict(d.get("processes"))
        known = [p for kind in ("compute", "graphics", "mps") for p in _list(procs.get(kind))]
        unknown = any(not isinstance(procs.get(kind), list) for kind in ("compute", "graphics", "mps"))
        count = (f"{len(known)}+?" if known else "?") if unknown else str(len(known))
        lines.append(f"{name}  GPU {safe(d.get('index'))}  {safe(d.get('name') or '?')[:21]:<21} "
                     f"used {_bytes(m.get('used_bytes')):>10} of {_bytes(m.get('total_bytes')):>10}  "
                     f"procs {count:>3}  {safe(d.get('uuid') or '?')}")
        why = _unknown_line(name, d)
        if why is not None:
            lines.append(why)
    return lines


def _failure_line(name: str, f: dict[str, Any]) -> str:
    return f"{name}  GPU {safe(f.get('index'))}  UNREADABLE: {safe(_dict(f.get('error')).get('message', '?'))}"


def _proc_lines(name: str, snap: dict[str, Any]) -> list[str]:
    """``snapshot procs`` with the host in front: one line per process, ``?`` where a list is unknown (with why),
    GPUs in index order."""
    from ..model import unknown_key  # the documents' "unknown" keys are DeviceState.unknown's

    lines = []
    unknown_used = False
    for d, unreadable in _in_order(snap):
        if unreadable:
            lines.append(_failure_line(name, d))
            continue
        procs = _dict(d.get("processes"))
        for kind in ("compute", "graphics", "mps"):
            listed = procs.get(kind)
            if not isinstance(listed, list):
                why = _why(d, unknown_key("processes", kind))
                lines.append(f"{name}  GPU {safe(d.get('index'))}  {'?':>8}  {kind:<9}  ({safe(why)})")
                continue
            for p in map(_dict, listed):
                unknown_used = unknown_used or not _is_int(p.get("used_bytes"))
                lines.append(f"{name}  GPU {safe(d.get('index'))}  {safe(p.get('pid')):>8}  {kind:<9}"
                             f"{_bytes(p.get('used_bytes')):>11}  {safe(p.get('name') or '?')}")
    if unknown_used:
        lines.append(f"{name}  {UNKNOWN_PROCESS_USED}")
    return lines


def _gpu_where(g: dict[str, Any]) -> str:
    """``GPU 0``, or the MIG instance a host's holder runs in (``GPU 0 MIG 1``), as the local table says it
    (``holders.GpuUse.where``); a host too old to send the instance gives ``GPU 0``."""
    where = f"GPU {g.get('index')}"
    if g.get("mig_index") is not None:
        return f"{where} MIG {g.get('mig_index')}"
    if g.get("gpu_instance_id") is not None:
        ci = f" CI {g.get('compute_instance_id')}" if g.get("compute_instance_id") is not None else ""
        return f"{where} GI {g.get('gpu_instance_id')}{ci}"
    return where


def _holder_lines(name: str, doc: dict[str, Any]) -> list[str]:
    from ._kill import _HOLDER_HEADER

    holders = [_dict(h) for h in _list(doc.get("holders"))]
    lines = [f"{name}  {_HOLDER_HEADER}" if holders else f"{name}  no process holds a selected GPU"]
    for h in holders:
        gpus = ", ".join(f"{_gpu_where(g)} {_bytes(g.get('used_bytes'))}" for g in map(_dict, _list(h.get("gpus"))))
        cmdline = _list(h.get("cmdline"))
        cmd = " ".join(map(str, cmdline)) if cmdline else str(h.get("name") or "?")
        found_by = "+".join(map(str, _list(h.get("found_by"))))
        lines.append(f"{name}  " + safe(f"{h.get('pid')!s:>8}  {str(h.get('user') or '?')[:10]:<10} "
                                        f"{str(h.get('state') or '?')[:8]:<8} {found_by:<19} {gpus or '-':<24} "
                                        f"{cmd[:80]}"))
        why = _holder_unknown(h)
        if why:
            lines.append(f"{name}    " + safe(f"(unknown: {why})"))
    return lines


def _holder_unknown(h: dict[str, Any]) -> str:
    """Why each ``?`` of a holder's line is one, from its document (``unknown``; each GPU's ``why_unknown``);
    values unknown for one reason share it."""
    unknown = _dict(h.get("unknown"))
    found: list[tuple[str, Any]] = []
    if not h.get("user"):
        found.append(("user", unknown.get("user") or unknown.get("uid")))
    if not h.get("state"):
        found.append(("state", unknown.get("state")))
    if not _list(h.get("cmdline")) and not h.get("name"):
        found.append(("command", unknown.get("cmdline") or unknown.get("name")))
    for g in map(_dict, _list(h.get("gpus"))):
        if not _is_int(g.get("used_bytes")):
            found.append((f"{_gpu_where(g)} used", g.get("why_unknown")))
    by_reason: dict[str, list[str]] = {}
    for what, why in found:
        by_reason.setdefault(str(why) if why else "no reason given by the host", []).append(what)
    return "; ".join(", ".join(whats) + f": {why}" for why, whats in by_reason.items())


def _ms(v: Any) -> str:
    if v is None:
        return "not seen"
    return f"+{v / 1e6:.1f} ms" if isinstance(v, int | float) and not isinstance(v, bool) else "?"


def _cmd(t: dict[str, Any]) -> str:
    cmdline = _list(t.get("cmdline"))
    return " ".join(map(str, cmdline)) if cmdline else str(t.get("name") or "?")


def _kill_lines(name: str, r: HostResult, doc: dict[str, Any]) -> None:
    """A remote kill: each target with its signals and phases, what was left alone, then the host's verdict. Every
    value through safe() and the type checks of the other views: a broken or hostile host's document shows ``?``,
    never a traceback halfway through the output, nor a terminal escape."""
    if doc.get("schema") == "nvmlcheck/kill-plan":
        for t in map(_dict, _list(doc.get("targets"))):
            fate = f" -> SIGKILL at once: {t['discarded']}" if t.get("discarded") else ""
            print(f"{name}  " + safe(f"would signal pid {t.get('pid')} ({t.get('found_by')}): {_cmd(t)[:80]}{fate}"))
        for t in map(_dict, _list(doc.get("left_alone"))):
            print(f"{name}  " + safe(f"left alone: pid {t.get('pid')}: {t.get('reason')}"))
        print(f"{name}  dry run: nothing was signalled")
        return
    for t in map(_dict, _list(doc.get("pids"))):
        signals = [_dict(s) for s in _list(t.get("signals"))]
        sent = ", ".join(f"{s.get('signal')} {_ms(s.get('sent_ns'))}" for s in signals) or "no signal"
        first = [s.get("signal") for s in signals][:1]
        why = "" if not t.get("discarded") else (f" (SIGKILL at once: {t['discarded']})" if first == ["SIGKILL"]
                                                 else f" (the kernel discards it: {t['discarded']})")
        print(f"{name}  " + safe(f"pid {t.get('pid')} ({t.get('name') or '?'}, {t.get('found_by')}): {sent}{why}, "
                                 f"exited {_ms(t.get('exited_ns'))}, off the GPU process list "
                                 f"{_ms(t.get('off_gpu_ns'))}"))
    for t in map(_dict, _list(doc.get("left_alone"))):
        print(f"{name}  " + safe(f"left alone: pid {t.get('pid')} ({t.get('name') or '?'}): {t.get('reason')}"))
    for pid in _list(doc.get("missing")):
        print(f"{name}  " + safe(f"pid {pid}: gone already (--missing-ok)"))
    for line in _list(doc.get("not_ours")):
        print(f"{name}  {safe(line)}")
    if r.verdict == "clean":
        if doc.get("pids"):
            print(f"{name}  clean: every target exited and memory back {_ms(doc.get('clean_ns'))} (confirmed "
                  f"{_ms(doc.get('confirmed_ns'))}, on the host)")
        else:
            print(f"{name}  clean: nothing to kill, GPUs clean {_ms(doc.get('clean_ns'))} (on the host)")
    else:
        culprits = "; ".join(map(str, _list(doc.get("culprits")))) or "no detail"
        print(f"{name}  NOT CLEAN: {safe(culprits)}")


def _print(args: argparse.Namespace, results: Sequence[HostResult]) -> None:
    width = max(len(str(r.host)) for r in results)
    for r in results:
        name = str(r.host).ljust(width)
        doc = r.document or {}
        if r.note:
            print(f"{name}  note: {safe(r.note)}")
        if r.error is not None:
            print(f"{name}  FAILED ({r.error.kind}): {safe(r.error.message)}")
            continue
        if args.command == "holders":
            for line in _holder_lines(name, doc):
                print(line)
            continue
        if args.command == "ready":
            for entry in _list(doc.get("gpus")):
                gpu = _dict(entry)
                print(f"{name}  {safe(str(gpu.get('line') or gpu.get('class')))}")
            print(f"{name}  {_READY_WORDS.get(r.verdict, r.verdict)}")
            continue
        snap = doc if args.command == "snapshot" else _dict(doc.get("snapshot"))
        lines = _proc_lines(name, snap) if getattr(args, "view", None) == "procs" else _gpu_lines(name, snap)
        for line in lines:
            print(line)
        if args.command == "kill":
            _kill_lines(name, r, doc)
        elif args.command in ("wait", "kill"):
            if r.verdict == "clean":
                polls = doc.get("polls")
                took = doc.get("elapsed_ns") or doc.get("confirmed_ns") or 0
                polls_text = plural(polls, "poll") if isinstance(polls, int) else "? polls"
                took_text = f"{took / 1e6:.1f}" if isinstance(took, int | float) else "?"
                print(f"{name}  clean ({polls_text}, {took_text} ms on the host)")
            else:
                culprits = "; ".join(map(str, _list(doc.get("culprits")))) or "no detail"
                print(f"{name}  NOT CLEAN: {safe(culprits)}")
        elif r.verdict != "clean":
            print(f"{name}  FAILED: exit {r.exit_code}")
    clean = [str(r.host) for r in results if r.verdict == "clean"]
    dirty = [str(r.host) for r in results if r.verdict == "not-clean"]
    sick = [str(r.host) for r in results if r.verdict == "unhealthy"]
    failed = [f"{r.host} ({r.error.kind if r.error else 'error'})" for r in results if r.verdict == "failed"]
    # A dry run judges nothing: "2 hosts: 2 clean" was said of a kill plan for a host whose GPU was held. It answered.
    answered = args.command in ("snapshot", "holders") or (args.command == "kill" and getattr(args, "dry_run", False))
    word = "ok" if answered else "ready" if args.command == "ready" else "clean"
    parts = [f"{len(clean)} {word}"]
    if dirty:
        parts.append(f"{len(dirty)} not {word}: {', '.join(dirty)}")
    if sick:
        parts.append(f"{len(sick)} need an operator: {', '.join(sick)}")
    if failed:
        parts.append(f"{len(failed)} failed: {', '.join(failed)}")
    print(f"{plural(len(results), 'host')}: {'; '.join(parts)}")
