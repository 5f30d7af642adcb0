"""Planning the batch size on torch (``plan_batch_size``): trial steps and the allocator's peak.

On a CPU, whose allocator keeps no statistics, the peak is counted op by op
(:class:`_LiveTensors`).
"""

from __future__ import annotations

from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.torch.flops import counted
from keras_gpu_tools.backends.torch.memory import available_cuda


def _nbytes(t) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        return 0


class _LiveTensors:
    """Counts the bytes of tensor storage alive at once while the block runs, op by op; ``peak`` is the most.

    A ``TorchDispatchMode`` sees every ATen op, the backward pass's too: each
    op's outputs are added once per storage, and storages that died are
    taken off before (their memory may be reused by the op's outputs).
    Storage that existed before the block (the weights) is not counted.
    """

    def __enter__(self):
        import torch
        from torch.multiprocessing.reductions import StorageWeakRef
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_leaves

        tracker = self
        self.live: dict[int, tuple[Any, int]] = {}
        self.current = 0
        self.peak = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for key, (ref, size) in list(tracker.live.items()):
                    if ref.expired():
                        del tracker.live[key]
                        tracker.current -= size
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                        storage = t.untyped_storage()
                        key = storage.data_ptr()
                        if key and key not in tracker.live:
                            size = int(storage.nbytes())
                            tracker.live[key] = (StorageWeakRef(storage), size)
                            tracker.current += size
                tracker.peak = max(tracker.peak, tracker.current)
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self.live = {}
        return False


class TorchPlanner(Backend):
    """The planner's side of the torch backend."""

    def device_capacities(self, model, replicas: int) -> list[int | None]:
        cuda = available_cuda()
        if cuda is None:
            return [None] * replicas
        return [int(cuda.mem_get_info(cuda.current_device())[1])] * replicas

    def plan_restore(self, model, snapshot) -> None:
        """Puts the model back, then hands the trial steps' cached blocks back to the device.

        The caching allocator keeps what the trial steps (the ones that ran out
        of memory too) reserved; left there, it fragments the memory that the
        planned batch's own steps then need: the planned batch could run out
        of memory in the process that planned it.
        """
        super().plan_restore(model, snapshot)
        cuda = available_cuda()
        if cuda is not None and cuda.is_initialized():
            cuda.empty_cache()

    def forget_compiled_trials(self) -> None:
        """Resets dynamo: its cache holds a graph of Keras's one ``train_step`` per model it compiled.

        Dynamo runs a function eager for good once it reached its recompile
        limit (8): left in, the trial clones' graphs would use up that limit,
        and the user's own ``jit_compile=True`` fit after them could run eager
        without a word. A model compiled before compiles again at its next step.
        """
        import torch._dynamo

        torch._dynamo.reset()

    def rng_state(self) -> dict[str, Any]:
        """The base's random states, and torch's global generators (CPU, and CUDA once initialised)."""
        import torch

        state = super().rng_state()
        cuda = available_cuda()
        state["torch"] = torch.get_rng_state()
        state["torch_cuda"] = cuda.get_rng_state_all() if cuda is not None and cuda.is_initialized() else None
        return state

    def set_rng_state(self, state: dict[str, Any]) -> None:
        import torch

        super().set_rng_state(state)
        torch.set_rng_state(state["torch"])
        cuda = available_cuda()
        if state.get("torch_cuda") is not None and cuda is not None:
            cuda.set_rng_state_all(state["torch_cuda"])

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """One warm-up trial step, then one measured: the CUDA allocator's peak, or on a CPU the peak of live tensors."""
        x, y = batch
        cuda = available_cuda()
        if cuda is not None and cuda.is_initialized():
            # Each trial from an empty cache, as the planned fit starts (plan_restore): the blocks a
            # larger trial had cached fragment the memory, and the plan would vary from run to run.
            cuda.empty_cache()
        model.train_on_batch(x, y)
        if cuda is not None and cuda.is_initialized():
            i = cuda.current_device()
            cuda.synchronize(i)
            cuda.reset_peak_memory_stats(i)
            model.train_on_batch(x, y)
            cuda.synchronize(i)
            return [float(cuda.max_memory_allocated(i))], self.plan_method(model)
        from keras_gpu_tools.runtime import keras_internals as ki

        state = sum(_nbytes(v.value) for v in ki.variables_of(model, "all"))
        with _LiveTensors() as live:
            model.train_on_batch(x, y)
        return [float(state + live.peak)], self.plan_method(model)

    def plan_step_flops(self, model, batch, replicas: int) -> float | None:
        """The FLOPs torch counts over one trial step on zeros of ``batch``'s shapes (the planner puts the model back)."""
        import numpy as np

        def zeros(a):
            if a is None or isinstance(a, np.ndarray):
                return a
            if isinstance(a, dict):
                return {k: zeros(v) for k, v in a.items()}
            if isinstance(a, (list, tuple)):
                return type(a)(zeros(v) for v in a)
            return np.zeros(tuple(a.shape), a.dtype)

        x, y = zeros(batch[0]), zeros(batch[1])
        _, flops = counted(lambda: model.train_on_batch(x, y))
        return flops or None

    def plan_method(self, model) -> str:
        cuda = available_cuda()
        if cuda is not None and cuda.is_initialized():
            return "trial steps (one warm-up, one measured): torch.cuda.max_memory_allocated"
        return (
            "trial steps (one warm-up, one measured) on the CPU, whose allocator keeps no statistics: the peak of "
            "tensor storage alive at once during the step, counted op by op (a TorchDispatchMode), plus the "
            "model's variables and optimizer state"
        )
