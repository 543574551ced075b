"""CUDA device numbering: which NVML GPU ``cuda:N`` names under ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``.

Turns the two environment variables plus the identities NVML reports (index, UUID, name, PCI bus id, MIG devices)
into a table ``cuda index -> NVML index / UUID`` (or MIG instance: ``CUDA_VISIBLE_DEVICES=MIG-...`` makes ``cuda:0``
that instance, as CUDA does). It is pure (no NVML call; no environment read unless you pass ``os.environ``),
so the rules are unit-tested on their own. Where CUDA's answer cannot be known (mixed models under
``FASTEST_FIRST``, a GPU in MIG mode named by number, what follows a ``MIG-`` entry, an ambiguous UUID prefix, a GPU
listed twice, an unreadable GPU) the mapping is refused with the reason, never guessed. Entry points:
:func:`cuda_mapping`, :class:`CudaMapping` (``resolve``, ``devices_of``), :func:`parse_cuda_selector`,
:func:`is_cuda_selector`, :func:`is_mig_selector`, :class:`GpuIdentity`, :class:`CudaMappingError`.
The rules, their sources and what was measured: docs/cuda.md, "The mapping rules".

>>> from nvmlcheck.cudamap import GpuIdentity, cuda_mapping
>>> gpus = [GpuIdentity(i, f"GPU-{i}aaa", "NVIDIA H200", f"00000000:{0x10 + i:02X}:00.0") for i in range(4)]
>>> m = cuda_mapping(gpus, {"CUDA_VISIBLE_DEVICES": "3,1"})
>>> m.resolve("cuda:0"), m.resolve("cuda:all")
((3,), (3, 1))
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ._text import printable
from .errors import ArgumentError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .model import MigDevice

__all__ = [
    "ENV_DEVICE_ORDER",
    "ENV_VISIBLE_DEVICES",
    "CudaDevice",
    "CudaMapping",
    "CudaMappingError",
    "GpuIdentity",
    "Identity",
    "cuda_mapping",
    "is_cuda_selector",
    "is_mig_selector",
    "names_mig",
    "parse_cuda_selector",
]

#: The environment variable that lists the GPUs a CUDA program sees.
ENV_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: The environment variable that picks CUDA's numbering: ``FASTEST_FIRST`` (default) or ``PCI_BUS_ID``.
ENV_DEVICE_ORDER = "CUDA_DEVICE_ORDER"

_PCI = re.compile(r"^([0-9A-Fa-f]{1,8}):([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})\.([0-7])$")
_SELECTOR = re.compile(r"^cuda:(.*)$", re.IGNORECASE)


class Identity(Protocol):
    """What the mapping reads of a GPU: :class:`~nvmlcheck.DeviceState` and :class:`GpuIdentity` both fit."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def pci_bus_id(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """A GPU as NVML names it: ``index`` (NVML/nvidia-smi numbering), ``uuid``, ``name`` and ``pci_bus_id``
    (``None`` when unknown), and ``mig_mode`` (``True``: in MIG mode, ``None``: unknown; a GPU in MIG mode, or one
    whose mode is unknown, makes CUDA's numbering unknown where it counts). Build these to use the mapping without a
    session (tests, other tools)."""

    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    mig_mode: bool | None = False
    #: The GPU's MIG devices (:class:`~nvmlcheck.model.MigDevice`: UUID and instance ids are read), ``None`` when
    #: unknown or not read; what a ``MIG-`` entry of ``CUDA_VISIBLE_DEVICES`` is looked up in.
    mig_devices: tuple[MigDevice, ...] | None = None


@dataclass(frozen=True, slots=True)
class CudaDevice:
    """One row of the mapping: ``cuda_index`` (what ``cuda:N`` says) and the GPU it is (``nvml_index``, ``uuid``,
    ``name``, ``pci_bus_id``). ``mig_uuid``: the MIG instance it is, when ``CUDA_VISIBLE_DEVICES`` named one (the
    GPU fields are then its parent's), else ``None`` (a whole GPU)."""

    cuda_index: int
    nvml_index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    mig_uuid: str | None = None


class CudaMappingError(ArgumentError):
    """A CUDA selector that cannot be resolved (or a mapping that is unknown). An :class:`~nvmlcheck.ArgumentError`
    (so a ``ValueError``): the CLI exits 2.

    The message shows the mapping it saw: the two environment variables, the order, and the ``cuda:N -> GPU``
    table (or why it is unknown); :attr:`mapping` is the :class:`CudaMapping` itself (``None`` when none was built).
    """

    __module__ = "nvmlcheck"

    def __init__(self, message: str, mapping: CudaMapping | None = None) -> None:
        text = message if mapping is None else f"{message}\n{mapping.describe()}"
        super().__init__(text)
        self.mapping = mapping


def _rebuild_error(text: str, mapping: CudaMapping | None) -> CudaMappingError:
    """Loads a :class:`CudaMappingError` pickled by nvmlcheck 0.1.0 (its message, the mapping's table included, and
    the mapping; since then every exception pickles through ``errors._rebuild``): without this name such a pickle
    did not load at all."""
    err = CudaMappingError(text)
    err.mapping = mapping
    return err


def parse_cuda_selector(text: str) -> int | None:
    """``"cuda:N"`` -> ``N``; ``"cuda:all"`` -> ``None``. Raises ``ValueError`` for any other text (check with
    :func:`is_cuda_selector` first)."""
    match = _SELECTOR.match(text)
    if match is None:
        raise ArgumentError(f"not a CUDA device selector: {text!r} (expected cuda:N or cuda:all)")
    rest = match.group(1)
    if rest.lower() == "all":
        return None
    if not re.fullmatch(r"[0-9]+", rest):
        raise ArgumentError(f"bad CUDA device selector {text!r}: expected cuda:N (N = 0, 1, ...) or cuda:all")
    return int(rest)


def is_mig_selector(item: object) -> bool:
    """Whether selector ``item`` (``--devices``, ``devices=``) names a MIG instance: a string starting ``MIG-`` in
    any case (nvmlcheck's selectors take ``mig-...`` too; CUDA_VISIBLE_DEVICES does not: :func:`names_mig`)."""
    return isinstance(item, str) and item[:4].upper() == "MIG-"


def names_mig(visible: str | None) -> bool:
    """Whether a ``CUDA_VISIBLE_DEVICES`` value has a ``MIG-`` entry (``cuda:N`` may then name a MIG instance).
    The prefix in capitals, as CUDA reads it (docs/cuda.md: ``mig-...`` names no device)."""
    return visible is not None and any(e.startswith("MIG-") for e in visible.split(","))


def _mig_key(text: str) -> str:
    """A MIG name compared without regard to case (``mig-`` and ``MIG-``, hex digits of either case)."""
    return text.upper()


def is_cuda_selector(item: object) -> bool:
    """Whether ``item`` is a string of the form ``cuda:...`` (well-formed or not: :func:`parse_cuda_selector`
    says which)."""
    return isinstance(item, str) and _SELECTOR.match(item) is not None


def _pci_key(bus_id: str) -> tuple[int, int, int, int] | None:
    match = _PCI.match(bus_id.strip())
    if match is None:
        return None
    domain, bus, device, function = (int(part, 16) for part in match.groups())
    return domain, bus, device, function


@dataclass(frozen=True, slots=True)
class CudaMapping:
    """How CUDA numbers the GPUs in one environment.

    ``visible_devices``: ``CUDA_VISIBLE_DEVICES`` as read (``None``: unset). ``device_order``: ``CUDA_DEVICE_ORDER``
    as read (``None``: unset, which CUDA treats as ``FASTEST_FIRST``). ``gpus``: every GPU NVML reported, by NVML
    index. ``order``: NVML indices in CUDA's numbering of *all* GPUs (what a bare number in
    ``CUDA_VISIBLE_DEVICES`` refers to), ``None`` when unknown with the reason in ``order_unknown``. ``devices``:
    the GPUs a CUDA program sees, ``devices[i]`` being ``cuda:i``; ``None`` when unknown, with the reason in
    ``unknown``. ``notes``: what the reader should know (an entry that ended the list, the tie rule used).
    ``known``: when ``devices`` is ``None``, the first CUDA devices that are known all the same (``cuda:0`` of
    ``CUDA_VISIBLE_DEVICES=MIG-a,MIG-b``: what CUDA enumerates after a MIG device is not documented, the first is
    certain); ``()`` otherwise.
    """

    visible_devices: str | None
    device_order: str | None
    gpus: tuple[GpuIdentity, ...]
    order: tuple[int, ...] | None
    order_unknown: str | None
    devices: tuple[CudaDevice, ...] | None
    unknown: str | None
    notes: tuple[str, ...] = ()
    known: tuple[CudaDevice, ...] = ()

    def _known(self) -> tuple[CudaDevice, ...]:
        if self.devices is None:
            raise CudaMappingError(f"cannot tell which GPU a CUDA device is: {self.unknown}", self)
        return self.devices

    def devices_of(self, selector: str) -> tuple[CudaDevice, ...]:
        """The rows ``"cuda:N"`` (one) or ``"cuda:all"`` (every visible device, in CUDA order) names: a whole GPU,
        or a MIG instance (:attr:`CudaDevice.mig_uuid`). Raises :class:`CudaMappingError` when the selector names
        no visible device or the mapping is unknown."""
        number = parse_cuda_selector(selector)
        if self.devices is None and number is not None and number < len(self.known):
            return (self.known[number],)
        devices = self._known()
        if number is None:
            if not devices:
                raise CudaMappingError(f"{selector}: CUDA sees no GPU in this environment", self)
            return devices
        if number >= len(devices):
            seen = "no GPU" if not devices else f"{len(devices)} GPU(s), cuda:0..cuda:{len(devices) - 1}"
            raise CudaMappingError(f"{selector}: no such CUDA device (CUDA sees {seen})", self)
        return (devices[number],)

    def resolve(self, selector: str) -> tuple[int, ...]:
        """NVML indices of ``"cuda:N"`` (one) or ``"cuda:all"`` (every visible GPU, in CUDA order); a MIG instance
        (``CUDA_VISIBLE_DEVICES=MIG-...``) gives its parent GPU's (:meth:`devices_of` says which instance). Raises
        :class:`CudaMappingError` when the selector names no visible GPU or the mapping is unknown."""
        return tuple(d.nvml_index for d in self.devices_of(selector))

    def nvml_index(self, cuda_index: int) -> int:
        """The NVML index of ``cuda:<cuda_index>`` (:class:`CudaMappingError` if there is none)."""
        return self.resolve(f"cuda:{cuda_index}")[0]

    def cuda_index(self, nvml_index: int) -> int | None:
        """The ``cuda:N`` number of a GPU in this environment (``None``: hidden from CUDA); raises
        :class:`CudaMappingError` when the mapping is unknown."""
        for d in self._known():
            if d.nvml_index == nvml_index and d.mig_uuid is None:  # an instance is not its whole GPU
                return d.cuda_index
        return None

    def visible_value(self, nvml_indices: Iterable[int]) -> str:
        """A ``CUDA_VISIBLE_DEVICES`` value naming these GPUs by number, in the given order: each GPU's position in
        CUDA's numbering of *all* GPUs (the value replaces any current ``CUDA_VISIBLE_DEVICES``, it is not read
        relative to it). Raises :class:`CudaMappingError` when that order is unknown (name GPUs by UUID then)."""
        if self.order is None:
            raise CudaMappingError(
                f"cannot number GPUs for CUDA_VISIBLE_DEVICES: {self.order_unknown}; name them by UUID instead "
                "(nvmlcheck select --format uuid)", self)
        position = {nvml: i for i, nvml in enumerate(self.order)}
        out: list[str] = []
        for index in nvml_indices:
            if index not in position:
                raise CudaMappingError(f"no GPU with NVML index {index}", self)
            out.append(str(position[index]))
        return ",".join(out)

    def describe(self) -> str:
        """The mapping as lines of text: the environment, the order, the ``cuda:N -> GPU`` table, the notes."""
        visible = "unset" if self.visible_devices is None else repr(self.visible_devices)
        order = ("unset (FASTEST_FIRST)" if self.device_order in (None, "") else repr(self.device_order))
        lines = [f"mapping seen: {ENV_VISIBLE_DEVICES}={visible}, {ENV_DEVICE_ORDER}={order}"]
        if self.order is not None:
            lines.append("  CUDA numbering of all GPUs (NVML indices): " + ", ".join(map(str, self.order)))
        else:
            lines.append(f"  CUDA numbering of all GPUs: unknown ({self.order_unknown})")
        if self.devices is None:
            lines.append(f"  visible CUDA devices: unknown ({self.unknown})")
            if self.known:
                lines.append(f"  known all the same: cuda:0..cuda:{len(self.known) - 1}")
        elif not self.devices:
            lines.append("  visible CUDA devices: none")
        for d in self.devices if self.devices is not None else self.known:
            what = f"GPU {d.nvml_index} {d.uuid}" if d.mig_uuid is None else (
                f"{d.mig_uuid}, a MIG instance of GPU {d.nvml_index} {d.uuid}")
            lines.append(f"  cuda:{d.cuda_index} -> {what} ({d.pci_bus_id or 'PCI bus id unknown'}"
                         f", {printable(d.name) if d.name else 'name unknown'})")
        if self.devices is None or len(self.devices) < len(self.gpus):
            lines.append("  GPUs NVML sees:" + ("" if self.gpus else " none"))
            lines.extend(f"    GPU {g.index} {g.uuid} ({g.pci_bus_id or 'PCI bus id unknown'}, "
                         f"{printable(g.name) if g.name else 'name unknown'}"
                         f"{'' if g.mig_mode is False else ', MIG mode' if g.mig_mode else ', MIG mode unknown'})"
                         for g in self.gpus)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _mapping_setstate(self: CudaMapping, state: Sequence[object]) -> None:
    """Restores a pickled :class:`CudaMapping` (its values in field order); one pickled by an earlier version, with
    fewer fields (0.1.0 had no ``known``), gets the defaults of those it lacks instead of failing on first use."""
    import dataclasses

    fields = dataclasses.fields(self)
    values = list(state)
    if len(values) > len(fields):
        raise TypeError(f"a pickled CudaMapping with {len(values)} values; this version has {len(fields)} fields")
    for f, value in zip(fields, values + [f.default for f in fields[len(values):]], strict=True):
        if value is dataclasses.MISSING:
            raise TypeError(f"a pickled CudaMapping without {f.name!r}, which has no default")
        object.__setattr__(self, f.name, value)


# After the class is made: a frozen slotted dataclass sets its own __setstate__, over one in the class body (3.10).
setattr(CudaMapping, "__setstate__", _mapping_setstate)  # noqa: B010 - mypy refuses assigning a method


def _base_order(
    gpus: Sequence[GpuIdentity], order_env: str | None, unreadable: Sequence[int]
) -> tuple[tuple[int, ...] | None, str | None, str | None]:
    """(NVML indices in CUDA's numbering of all GPUs or None, why unknown, a note)."""
    if unreadable:
        return None, (f"GPU(s) {', '.join(map(str, unreadable))} could not be read, so their place in CUDA's "
                      "numbering is unknown"), None
    mig = [g for g in gpus if g.mig_mode is not False]
    if mig:
        return None, _mig_reason(mig[0]), None
    if order_env not in (None, "", "FASTEST_FIRST", "PCI_BUS_ID"):
        return None, f"{ENV_DEVICE_ORDER}={order_env!r} is not FASTEST_FIRST or PCI_BUS_ID", None
    keys: list[tuple[tuple[int, int, int, int], int]] = []
    for g in gpus:
        key = None if g.pci_bus_id is None else _pci_key(g.pci_bus_id)
        if key is None:
            if len(gpus) == 1:
                return (g.index,), None, None
            return None, f"GPU {g.index} has no readable PCI bus id ({g.pci_bus_id!r})", None
        keys.append((key, g.index))
    by_pci = tuple(index for _, index in sorted(keys))
    if order_env == "PCI_BUS_ID" or len(gpus) <= 1:
        return by_pci, None, None
    names = {g.name for g in gpus}
    if len(names) == 1 and None not in names:
        # CUDA's fastest-first heuristic ranks models; equal models keep PCI bus order (docs/cuda.md).
        return by_pci, None, (f"{ENV_DEVICE_ORDER} is FASTEST_FIRST and every GPU is the same model "
                              f"({next(iter(names))}): CUDA numbers equal GPUs by PCI bus id")
    models = ", ".join(sorted(repr(n) if n is not None else "unknown" for n in names))
    return None, (f"{ENV_DEVICE_ORDER} is FASTEST_FIRST (the default) and the GPUs are not all one model "
                  f"({models}): CUDA's fastest-first heuristic cannot be reproduced from NVML data; set "
                  f"{ENV_DEVICE_ORDER}=PCI_BUS_ID or name GPUs by UUID"), None


def _lowercase(entry: str) -> str:
    """Words for an entry whose ``GPU-``/``MIG-`` prefix is not in capitals (which CUDA reads as naming nothing)."""
    return " (CUDA reads GPU- and MIG- in capitals only)" if entry[:4].upper() in ("GPU-", "MIG-") else ""


def _rows(chosen: Sequence[int], by_index: Mapping[int, GpuIdentity], mig: str | None) -> tuple[CudaDevice, ...]:
    """The mapping's rows for NVML indices ``chosen`` in CUDA order; ``mig``: the MIG UUID ``cuda:0`` is."""
    return tuple(CudaDevice(i, n, by_index[n].uuid, by_index[n].name, by_index[n].pci_bus_id,
                            mig if i == 0 else None) for i, n in enumerate(chosen))


def _first_mig(entries: Sequence[str], gpus: Sequence[GpuIdentity], notes: list[str]
               ) -> tuple[tuple[int, str] | None, str | None, list[int]]:
    """A ``CUDA_VISIBLE_DEVICES`` list that starts with a MIG entry: ``(its (parent, MIG UUID) or None, why the
    rest is unknown or None, the NVML indices known)``; an entry of no instance ends the list (noted in
    ``notes``)."""
    entry = entries[0]
    parent, why = _mig_entry(entry, gpus)
    if why is not None:
        return None, f"entry {entry!r}: {why}", []
    if parent is None:
        notes.append(f"entry {entry!r} names no MIG instance: CUDA ignores it and what follows ({','.join(entries)!r})")
        return None, None, []
    if len(entries) > 1:
        # CUDA 11 (R450) and 12 (R525) enumerate one MIG device per process (NVIDIA's MIG user guide, "CUDA Device
        # Enumeration"); what newer ones make of the entries after it is not documented.
        return parent, (f"entries after the MIG instance {entry!r} ({','.join(entries[1:])!r}): whether CUDA "
                        "enumerates them is not documented (CUDA 11 and 12 see one MIG device per process); cuda:0 "
                        "is the instance"), [parent[0]]
    return parent, None, [parent[0]]


def _mig_entry(entry: str, gpus: Sequence[GpuIdentity]) -> tuple[tuple[int, str] | None, str | None]:
    """What MIG entry ``entry`` of ``CUDA_VISIBLE_DEVICES`` names: ``((parent NVML index, MIG UUID), None)``,
    ``(None, None)`` for no instance (CUDA then ignores it and what follows), or ``(None, why)`` when that cannot be
    told (an instance list unread, a prefix). The whole ``MIG-`` UUID (any case) or the name of drivers before R470,
    ``MIG-GPU-<uuid>/<GI>/<CI>``, as CUDA documents."""
    key = _mig_key(entry)
    legacy = re.fullmatch(r"MIG-GPU-([0-9A-Fa-f-]+)/([0-9]+)/([0-9]+)", entry)
    hits: list[tuple[int, str]] = []
    prefix = False
    # An instance whose UUID (or, for the legacy form, whose ids) could not be read may be the one named: with no
    # certain hit, "names no instance" (CUDA then sees nothing) would be a guess.
    unsure: list[tuple[int, str]] = []
    for g in gpus:
        for m in g.mig_devices or ():
            if legacy is not None:
                if _mig_key(g.uuid) != "GPU-" + _mig_key(legacy.group(1)):
                    continue
                if m.gpu_instance_id is None or m.compute_instance_id is None:
                    unsure.append((g.index, m.label))
                elif (m.gpu_instance_id, m.compute_instance_id) == (int(legacy.group(2)), int(legacy.group(3))):
                    if m.uuid is None:
                        return None, (f"names {m.label} of GPU {g.index}, whose MIG- UUID could not be read "
                                      f"({m.unknown.get('uuid', 'no reason given')}): nvmlcheck names instances by "
                                      "MIG- UUID")
                    hits.append((g.index, m.uuid))
            elif m.uuid is None:
                unsure.append((g.index, m.label))
            elif _mig_key(m.uuid) == key:
                hits.append((g.index, m.uuid))
            elif _mig_key(m.uuid).startswith(key):
                prefix = True
    if len(hits) == 1:
        return hits[0], None
    if len(hits) > 1:
        return None, f"names {len(hits)} MIG instances"
    unread = [g for g in gpus if g.mig_mode is not False and g.mig_devices is None]
    if unread:
        g = unread[0]
        state = "MIG mode" if g.mig_mode else "MIG mode (unknown)"
        return None, (f"the MIG instances of GPU {g.index} ({state}) are unknown, so which instance it names (if "
                      "any) cannot be told")
    if unsure:
        index, label = unsure[0]
        what = "instance ids" if legacy is not None else "MIG- UUID"
        return None, (f"the {what} of {label} of GPU {index} could not be read, so whether it is the instance named "
                      "cannot be told")
    if any(_mig_key(g.uuid)[4:] == key[4:] for g in gpus):
        # Measured (docs/cuda.md): CUDA took MIG-<a GPU's UUID digits> as that GPU. Not documented: refused.
        return None, ("has the UUID digits of a whole GPU, not of a MIG instance: what CUDA makes of it is not "
                      "documented")
    if prefix:
        return None, ("is a prefix of a MIG instance's UUID: CUDA documents abbreviated GPU- UUIDs only; give the "
                      "whole MIG- UUID")
    return None, None


def _mig_reason(g: GpuIdentity) -> str:
    """Why CUDA's view of GPU ``g`` (in MIG mode, or its mode unknown) cannot be told."""
    mode = "is in MIG mode" if g.mig_mode else "has a MIG mode that could not be read"
    # CUDA enumerates a MIG-mode GPU's MIG devices (one per process), not the GPU: where that device falls in its
    # numbering, and which instance it is, is not documented (NVIDIA's MIG user guide, "CUDA Device Enumeration").
    return (f"GPU {g.index} {mode}: CUDA sees one of its MIG devices, not the GPU, and where in CUDA's numbering is "
            "not documented; name whole GPUs by GPU- UUID, or a MIG instance by its MIG- UUID in --devices")


def _checked_env(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env``, whose two CUDA variables must be text as in ``os.environ`` (an int fails deep inside otherwise)."""
    if not isinstance(env, Mapping):
        from .errors import ArgumentTypeError

        raise ArgumentTypeError(f"env is a mapping of variable names to values (as os.environ), got {env!r}")
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"):
        if name in env and not isinstance(env[name], str):
            from .errors import ArgumentTypeError

            raise ArgumentTypeError(f"env[{name!r}] must be a str, as in os.environ, got {env[name]!r}")
    return env


def _mig_mode(gpu: object) -> bool | None:
    """A GPU's MIG mode for the mapping: one the tool does not have (an nvidia-smi older than MIG: its driver has
    none) is no MIG mode, as ``ready`` and ``select`` judge it (:func:`nvmlcheck.model.unsupported`); one whose
    reading failed stays unknown."""
    mode = getattr(gpu, "mig_mode", False)
    if mode is None:
        why = (getattr(gpu, "unknown", None) or {}).get("mig")
        if isinstance(why, str):
            from .model import unsupported

            return False if unsupported(why) else None
    return mode if mode is None else bool(mode)


def cuda_mapping(
    gpus: Iterable[Identity],
    env: Mapping[str, str] | None = None,
    *,
    unreadable: Sequence[int] = (),
) -> CudaMapping:
    """The CUDA numbering of ``gpus`` (every GPU NVML sees) under ``env`` (default: empty, i.e. both variables
    unset; pass ``os.environ`` for this process's view). ``unreadable``: NVML indices of GPUs that could not be
    read (the numbering is then unknown). Never raises for what the environment says: an unknown mapping has
    ``devices=None`` and the reason; :meth:`CudaMapping.resolve` raises when asked about it."""
    env = _checked_env({} if env is None else env)
    ids = tuple(sorted((GpuIdentity(g.index, g.uuid, g.name, g.pci_bus_id, _mig_mode(g),
                                    getattr(g, "mig_devices", None))
                        for g in gpus), key=lambda g: g.index))
    by_index = {g.index: g for g in ids}
    if len(by_index) != len(ids):
        raise ArgumentError("two GPUs with the same NVML index")
    visible = env.get(ENV_VISIBLE_DEVICES)
    order_env = env.get(ENV_DEVICE_ORDER)
    order, order_unknown, order_note = _base_order(ids, order_env, tuple(unreadable))
    notes: list[str] = []

    # known: the rows known when devices are not; first: the MIG UUID cuda:0 is (a list that starts with MIG-).
    def done(devices: list[int] | None, unknown: str | None, known: list[int] | None = None,
             first: str | None = None) -> CudaMapping:
        if order_note is not None and (visible is None or any(
                re.fullmatch(r"[0-9]+", e) for e in visible.split(","))):
            notes.append(order_note)
        return CudaMapping(visible, order_env, ids, order, order_unknown,
                           None if devices is None else _rows(devices, by_index, first), unknown, tuple(notes),
                           _rows(known, by_index, first) if devices is None and known else ())

    if visible is None:
        if order is None:
            return done(None, f"{ENV_VISIBLE_DEVICES} is unset and CUDA's numbering of all GPUs is unknown")
        return done(list(order), None)
    if unreadable:
        return done(None, order_unknown)
    if visible == "":
        notes.append(f"{ENV_VISIBLE_DEVICES} is empty: CUDA sees no GPU")
        return done([], None)
    entries = visible.split(",")
    if entries[0].startswith("MIG-") and entries[0] == entries[0].strip():
        mig, why, chosen = _first_mig(entries, ids, notes)
        return done(chosen if why is None else None, why, chosen, None if mig is None else mig[1])
    chosen = []
    first_kind = "index"
    for position, entry in enumerate(entries):
        if entry != entry.strip():
            return done(None, f"entry {entry!r} has spaces: CUDA's handling of them is not documented; "
                              "write the list without spaces")
        if entry.startswith("MIG-"):
            return done(None, f"entry {entry!r} is a MIG instance after another entry: where CUDA numbers it then "
                              "is not documented; list the MIG instance alone, or first")
        found: int | None = None
        # The prefix in capitals, the hex digits in either case: as CUDA reads them (measured: docs/cuda.md).
        kind = "index" if re.fullmatch(r"[0-9]+", entry) else "uuid" if entry.startswith("GPU-") else None
        if position > 0 and kind is not None and kind != first_kind:
            if first_kind == "index":
                # Not measured: refuse rather than guess (the other way round is measured, below).
                return done(None, f"entry {entry!r} is a UUID after indices: CUDA's handling of a mixed list is "
                                  "measured only for an index after UUIDs; use one kind")
            # Measured with PyTorch (docs/driver-facts.md): an index after UUIDs ends the list, as an entry that
            # names no GPU does.
            rest = ",".join(entries[position:])
            notes.append(f"entry {entry!r} is an index after UUIDs: CUDA ignores it and what follows ({rest!r})")
            break
        if position == 0 and kind is not None:
            first_kind = kind
        if re.fullmatch(r"[0-9]+", entry):
            if order is None:
                return done(None, f"entry {entry!r} is a number, and CUDA's numbering of all GPUs is unknown")
            number = int(entry)
            if number < len(order):
                found = order[number]
        elif entry.startswith("GPU-") and len(entry) > 4:
            matches = [g.index for g in ids if g.uuid.lower().startswith(entry.lower())]
            if len(matches) > 1:
                return done(None, f"entry {entry!r} is a prefix of {len(matches)} GPUs' UUIDs")
            found = matches[0] if matches else None
        if found is None:
            rest = ",".join(entries[position:])
            notes.append(f"entry {entry!r} names no GPU{_lowercase(entry)}: CUDA ignores it and what follows "
                         f"({rest!r})")
            break
        if found is not None and by_index[found].mig_mode is not False:
            return done(None, f"entry {entry!r}: {_mig_reason(by_index[found])}")
        if found in chosen:
            return done(None, f"GPU {found} is listed twice (entry {entry!r}); what CUDA does with a repeat is not "
                              "documented")
        chosen.append(found)
    return done(chosen, None)
