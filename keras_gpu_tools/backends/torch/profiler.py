"""The torch profiler session (``torch.profiler``), which can only be stopped from the thread that started it."""

from __future__ import annotations

import os
import socket
import time

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.profiling.trace import ProfilerBusy, TracerOptions


class _Torch:
    name = "torch"
    owner_thread_only = True  # stop() only from the thread that called start()
    pattern = "*.pt.trace.json"

    def __init__(self):
        self._prof = None
        self._run_dir = ""  # start()'s: where stop() writes the trace

    def available(self) -> tuple[bool, str]:
        return True, ""

    def start(self, run_dir: str, options: TracerOptions) -> None:
        import torch

        if torch.autograd.profiler._is_profiler_enabled:
            raise ProfilerBusy("another torch profiler session is running")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and options.device_tracer_level:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        # profile_memory: the allocator's events, for each layer's peak memory (the layer table).
        self._prof = torch.profiler.profile(
            activities=activities, with_stack=options.python_tracer, profile_memory=True
        )
        self._prof.start()
        self._run_dir = run_dir

    def step(self, step_num: int):
        import torch

        # The name torch.profiler.profile.step() gives its step ranges.
        return torch.profiler.record_function(f"ProfilerStep#{step_num}")

    def stop(self, outputs=None) -> None:
        import torch

        prof, self._prof = self._prof, None
        if prof is None:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        prof.stop()
        folder = os.path.join(self._run_dir, "plugins", "profile", time.strftime("%Y_%m_%d_%H_%M_%S"))
        os.makedirs(folder, exist_ok=True)
        prof.export_chrome_trace(os.path.join(folder, f"{socket.gethostname()}.pt.trace.json"))

    def scope_layers(self, model, layers):
        """A ``keras_layer::<path>`` range around each layer's calls (``layer_scopes.py``), and their removal.

        Not on a compiled step: torch.compile would recompile it for the new calls (measured: 2 s a step
        instead of 0.14 s), and its graph keeps no range per layer.
        """
        from keras_gpu_tools.backends.torch.layer_scopes import install

        if getattr(model, "jit_compile", False):
            why = (
                "the torch step is compiled (jit_compile=True): a range per layer would make torch.compile "
                "recompile it; compile with jit_compile=False for a layer table"
            )
            return _nothing, why
        return install(layers), ""


class TorchProfiler(Backend):
    """The profiler side of the torch backend."""

    def profiler(self):
        return _Torch()


def _nothing() -> None:
    pass
