"""Private: what nvmlcheck reads from the operating system about processes, with no NVML involved.

``procfs`` reads ``/proc/PID/stat``, ``status``, ``cmdline``, children and ancestry; ``pin`` holds a process's
identity (a pidfd, else its start time) so that a signal reaches only the process meant; ``devfiles`` scans
``/proc/*/fd`` for NVIDIA device files. docs/killing.md explains the guarantees.
"""

#: Set when this process loaded nvmlcheck's stub through ``$NVMLCHECK_LIBNVML`` (``devfiles.stub_loaded_from_env``):
#: kept here, in a module with no imports, so that the NVML thread of a one-shot can set it without importing devfiles.
stub_from_env = False
