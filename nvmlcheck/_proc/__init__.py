"""Private: what nvmlcheck reads from the operating system about processes, with no NVML involved.

``procfs`` reads ``/proc/PID/stat``, ``status``, ``cmdline``, children and ancestry; ``pin`` holds a process's
identity (a pidfd, else its start time) so that a signal reaches only the process meant; ``devfiles`` scans
``/proc/*/fd`` for NVIDIA device files. docs/killing.md explains the guarantees.
"""


def error(kind: str, message: str) -> Exception:
    """nvmlcheck's exception class ``kind`` (``"ArgumentError"``, ``"StateError"``, ...) with ``message``.
    :mod:`nvmlcheck.errors` (layer 1) is imported only when one is raised: a kill signals before loading more than
    this layer."""
    from .. import errors

    cls: type[Exception] = getattr(errors, kind)
    return cls(message)


#: Set when this process loaded nvmlcheck's stub through ``$NVMLCHECK_LIBNVML`` (``devfiles.stub_loaded_from_env``):
#: kept here, in a module with no imports, so that the NVML thread of a one-shot can set it without importing devfiles.
stub_from_env = False

