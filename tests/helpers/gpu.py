"""Whether NVML sees an NVIDIA GPU on this machine (asked once, at import)."""


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


HAS_GPU = _gpu_present()
