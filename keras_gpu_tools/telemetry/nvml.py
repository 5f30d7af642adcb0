"""One place for every NVML call.

NVML is initialised lazily, under a lock, on first use. Every query goes through
:meth:`NVML.query`, which returns :data:`NA` instead of raising when the driver
says a field is not supported, not permitted or not present on this GPU (MIG
instances, older drivers, consumer cards). The caller decides what to do with
``NA``; nothing here ever turns a missing value into a fake 0.

The ``pynvml`` module can be injected (tests pass a fake NVML), so the logic
above the driver is tested on machines without a GPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("keras_gpu_tools")


class _NotAvailable:
    """Marker for a value NVML could not provide. Falsy, never a number."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NA"


NA = _NotAvailable()

# NVML return codes that mean "this field will never work on this device".
_ERROR_NOT_SUPPORTED = 3
_ERROR_NO_PERMISSION = 4
_ERROR_NOT_FOUND = 6
_ERROR_FUNCTION_NOT_FOUND = 13
_ERROR_GPU_IS_LOST = 15
UNSUPPORTED_CODES = frozenset({_ERROR_NOT_SUPPORTED, _ERROR_NO_PERMISSION, _ERROR_NOT_FOUND, _ERROR_FUNCTION_NOT_FOUND})


class NVMLUnavailable(RuntimeError):
    """NVML cannot be used at all (no library, no driver, no permission)."""


@dataclass(frozen=True)
class GPUInfo:
    """Static facts about one GPU (or MIG instance) as NVML sees it."""

    nvml_index: int  # index of the physical GPU in NVML's (PCI bus) order
    uuid: str
    name: str
    memory_total_bytes: int | None
    compute_capability: tuple | None
    mig_index: int | None = None  # index of the MIG instance on its parent
    handle: Any = None

    @property
    def is_mig(self) -> bool:
        return self.mig_index is not None

    @property
    def label(self) -> str:
        if self.is_mig:
            return f"{self.name} MIG {self.nvml_index}:{self.mig_index} ({self.uuid})"
        return f"{self.name} #{self.nvml_index} ({self.uuid})"


class NVML:
    """Lazily initialised, thread-safe access to NVML.

    Args:
        module: the ``pynvml`` module, or a fake with the same functions.
            Defaults to importing ``pynvml`` (from the ``nvidia-ml-py``
            package) on first use.
    """

    def __init__(self, module: Any = None):
        self._module = module
        self._lock = threading.Lock()
        self._initialised = False
        self._error: str | None = None

    # -- life cycle ---------------------------------------------------------
    def _ensure(self):
        if self._initialised:
            return self._module
        with self._lock:
            if self._initialised:
                return self._module
            if self._error is not None:
                raise NVMLUnavailable(self._error)
            try:
                if self._module is None:
                    import pynvml  # nvidia-ml-py

                    self._module = pynvml
                self._module.nvmlInit()
            except ImportError as e:
                self._error = f"The NVML bindings are not installed: {e}. Install them with `pip install nvidia-ml-py`."
            except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded...
                self._error = f"NVML could not be initialised: {_describe(e)}"
            if self._error is not None:
                raise NVMLUnavailable(self._error)
            self._initialised = True
            return self._module

    def available(self) -> bool:
        try:
            self._ensure()
            return True
        except NVMLUnavailable:
            return False

    @property
    def unavailable_reason(self) -> str | None:
        return self._error

    @property
    def module(self):
        return self._ensure()

    # -- queries ------------------------------------------------------------
    def query(self, func_name: str, *args, on_unsupported: Callable | None = None):
        """Calls ``pynvml.<func_name>(*args)``.

        Returns ``NA`` when the driver reports the function unsupported, not
        permitted or not found (``on_unsupported(reason)`` is then called), or
        when the bindings lack the function. Other NVML errors are raised as
        ``NVMLQueryError`` so the caller can decide whether they are transient.
        """
        module = self._ensure()
        func = getattr(module, func_name, None)
        if func is None:
            if on_unsupported:
                on_unsupported(f"{func_name} is not in this version of nvidia-ml-py")
            return NA
        try:
            return func(*args)
        except module.NVMLError as e:
            code = getattr(e, "value", None)
            if code in UNSUPPORTED_CODES:
                if on_unsupported:
                    on_unsupported(_describe(e))
                return NA
            raise NVMLQueryError(func_name, e, lost=code == _ERROR_GPU_IS_LOST) from e

    def driver_version(self) -> str | None:
        return _text(self.query("nvmlSystemGetDriverVersion")) or None

    def cuda_driver_version(self) -> str | None:
        v = self.query("nvmlSystemGetCudaDriverVersion")
        if v is NA or not v:
            return None
        return f"{v // 1000}.{(v % 1000) // 10}"

    def device_count(self) -> int:
        return int(self.query("nvmlDeviceGetCount"))

    def gpu_info(self, handle, nvml_index: int, mig_index: int | None = None) -> GPUInfo:
        uuid = _text(self.query("nvmlDeviceGetUUID", handle))
        name = _text(self.query("nvmlDeviceGetName", handle)) or "unknown GPU"
        mem = self.query("nvmlDeviceGetMemoryInfo", handle)
        total = int(mem.total) if mem is not NA else None
        cc_handle = handle
        if mig_index is not None:
            parent = self.query("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
            cc_handle = parent if parent is not NA else handle
        cc = self.query("nvmlDeviceGetCudaComputeCapability", cc_handle)
        cc = tuple(int(x) for x in cc) if cc is not NA else None
        return GPUInfo(nvml_index, uuid, name, total, cc, mig_index, handle)

    def all_gpus(self, include_mig: bool = True) -> list:
        """Every physical GPU in NVML order, each followed by its MIG instances."""
        out = []
        for i in range(self.device_count()):
            handle = self.query("nvmlDeviceGetHandleByIndex", i)
            out.append(self.gpu_info(handle, i))
            if include_mig:
                out.extend(self.mig_instances(handle, i))
        return out

    def mig_instances(self, handle, nvml_index: int) -> list:
        mode = self.query("nvmlDeviceGetMigMode", handle)
        if mode is NA or not mode or not mode[0]:
            return []
        count = self.query("nvmlDeviceGetMaxMigDeviceCount", handle)
        if count is NA:
            return []
        out = []
        for j in range(int(count)):
            try:
                mig = self.query("nvmlDeviceGetMigDeviceHandleByIndex", handle, j)
            except NVMLQueryError:  # empty slot
                continue
            if mig is NA:
                continue
            out.append(self.gpu_info(mig, nvml_index, mig_index=j))
        return out


class NVMLQueryError(RuntimeError):
    """An NVML error that is not "unsupported": possibly transient."""

    def __init__(self, func_name: str, error: BaseException, lost: bool = False):
        super().__init__(f"{func_name} failed: {_describe(error)}")
        self.func_name = func_name
        self.lost = lost


def _describe(e: BaseException) -> str:
    try:
        text = str(e)
    except Exception:
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _text(value) -> str:
    if value is NA or value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


_default = None
_default_lock = threading.Lock()


def default_nvml() -> NVML:
    """The process-wide NVML accessor (initialised on first use)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = NVML()
        return _default
