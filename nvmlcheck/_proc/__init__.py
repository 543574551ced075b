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


#: Linux's largest possible PID, the hard upper bound on ``/proc/sys/kernel/pid_max`` (``PID_MAX_LIMIT`` of
#: include/linux/threads.h, 4 Mi on 64-bit): used when that file cannot be read, and the one definition in the package
#: (a process list naming a larger PID is corrupt data, from NVML or nvidia-smi). Here, not in ``procfs``: the NVML
#: calls check every PID against it, and a wait reads no ``/proc`` file, so need not import that module.
PID_MAX_LIMIT = 4_194_304

#: Set when this process loaded nvmlcheck's stub through ``$NVMLCHECK_LIBNVML`` (``devfiles.stub_loaded_from_env``):
#: kept here, in a module with no imports, so that the NVML thread of a one-shot can set it without importing devfiles.
stub_from_env = False

