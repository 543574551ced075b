"""The stub's symbol tables: every NVML function it exports and the build variants that leave some out.

``stubs/stub_nvml.c`` is the source of truth; tests/stub/test_stub_build.py checks these tables against the built
library's exports.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["NVML_FUNCTIONS", "STUB_VARIANTS"]

#: Every NVML function the stub exports in its full build (plus ``stub_*`` test symbols, not listed here).
NVML_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetNVMLVersion",
    "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetPciInfo_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses_v2",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetApplicationsClock",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetGpuInstanceId",
    "nvmlDeviceGetComputeInstanceId",
    "nvmlEventSetCreate",
    "nvmlDeviceRegisterEvents",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
)

#: The functions whose fault ``device=`` can restrict: those taking a device handle or index (``F_DEVICE`` /
#: ``F_INDEX`` in stub_nvml.c). Not the calls on a MIG device handle (its instance ids, its parent): the stub refuses
#: ``device=`` on them.
DEVICE_FUNCTIONS: frozenset[str] = frozenset(
    name for name in NVML_FUNCTIONS
    if name.startswith("nvmlDevice") and name not in (
        "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2", "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    )
)  # fmt: skip

_PROC_PREFIXES = (
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetGraphicsRunningProcesses",
    "nvmlDeviceGetMPSComputeRunningProcesses",
)

#: Build variants (``-D`` macros) and the symbols each one lacks, as an older driver would.
STUB_VARIANTS: Mapping[str, tuple[str, ...]] = {
    "STUB_NO_PROC_V3": tuple(p + "_v3" for p in _PROC_PREFIXES),
    "STUB_NO_PROC_V2": tuple(p + "_v2" for p in _PROC_PREFIXES),
    "STUB_NO_MEMORY_V2": ("nvmlDeviceGetMemoryInfo_v2",),
    "STUB_NO_INIT_V2": ("nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"),
    "STUB_NO_EVENT_REASONS": ("nvmlDeviceGetCurrentClocksEventReasons",),
    "STUB_NO_RETIRED_V2": ("nvmlDeviceGetRetiredPages_v2",),
    "STUB_NO_CUDA_V2": ("nvmlSystemGetCudaDriverVersion_v2",),
    "STUB_NO_PCI_V3": ("nvmlDeviceGetPciInfo_v3",),
    "STUB_NO_EVENTS": (
        "nvmlEventSetCreate",
        "nvmlDeviceRegisterEvents",
        "nvmlDeviceGetSupportedEventTypes",
        "nvmlEventSetWait_v2",
        "nvmlEventSetFree",
    ),
    "STUB_NO_FIELD_VALUES": ("nvmlDeviceGetFieldValues",),
    "STUB_NO_MIG": (
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
        "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId",
    ),
}

