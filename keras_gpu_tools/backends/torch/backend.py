"""The torch backend: step calls, syncs, profiler, OOM, accumulation, memory.

torch's train function is ``f(batches)`` with the batches already fetched by
fit()'s epoch iterator, so fetch time is measured by wrapping that iterator
(``keras_internals.time_epoch_iterator``) and falls before the call. A sync is
``torch.cuda.synchronize()``, on CUDA only. torch's profiler can only be
stopped from the thread that started it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from keras_gpu_tools.backends.base import Backend, Stats
from keras_gpu_tools.memory.accumulate import StatefulEvalRunner, StatefulRunner, concat_outputs, measure_order
from keras_gpu_tools.memory.explain import fragmentation_note, parse_message
from keras_gpu_tools.profiling.trace import ProfilerBusy, TracerOptions
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki
from keras_gpu_tools.runtime.batches import batch_signature, leading_dim, shape_and_dtype

logger = logging.getLogger("keras_gpu_tools")

# The message of a CPU allocation failure in torch ("DefaultCPUAllocator: can't
# allocate memory"): torch raises a plain RuntimeError there, not
# torch.OutOfMemoryError (which it raises for CUDA).
_CPU_OOM = "can't allocate memory"


# -- the step ------------------------------------------------------------------------------
def _call_torch(hook, data):
    rec = hook.begin(lambda: hook.sync(True))
    rec.start = hook.clock()
    out = hook.around(rec, lambda: hook.inner(data))
    if rec.sampled:
        hook.sync(True)
    rec.end = hook.clock()
    rec.steps = _steps_of(data)
    try:
        n = leading_dim(data[0])
        rec.samples = n * len(data) if n is not None else None
    except (TypeError, IndexError):
        pass
    if rec.sampled:
        rec.compute = rec.end - rec.start
        try:
            hook.check_signature(rec, data[0])
        except (TypeError, IndexError):
            pass
    return out


def _light_torch(hook, data):
    """The light path: Keras's step; its fetch, timed before the call, goes to the pending record."""
    seconds = hook.take_fetch()
    out = hook.inner(data)
    hook.add_covered_fetch(seconds, _steps_of(data))
    return out


def _steps_of(data) -> int:
    """The steps of one train-function call: Keras hands torch's a list of batches, one per step."""
    try:
        return max(len(data), 1)
    except TypeError:
        return 1


def _install_fetch_timer(hook) -> None:
    ei = ki.find_epoch_iterator(hook.model_ref)
    if ei is None:
        logger.warning(
            "keras_gpu_tools: could not find fit()'s epoch iterator (Keras %s); input fetch time is not measured on torch.",
            ki.keras_version(),
        )
        return
    hook.fetch_known = True
    hook.undo_fetch_timer = ki.time_epoch_iterator(ei, hook.on_fetch, hook.clock, when=hook.wants_full)


# -- profiler ------------------------------------------------------------------------------
class _Torch:
    name = "torch"
    owner_thread_only = True  # stop() only from the thread that called start()
    pattern = "*.pt.trace.json"

    def __init__(self):
        self._prof = None
        self._run_dir = None

    def available(self) -> tuple[bool, str]:
        return True, ""

    def start(self, run_dir: str, options: TracerOptions) -> None:
        import torch

        if torch.autograd.profiler._is_profiler_enabled:
            raise ProfilerBusy("another torch profiler session is running")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and options.device_tracer_level:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities, with_stack=options.python_tracer)
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


# -- gradient accumulation -----------------------------------------------------------------
class TorchRunner(StatefulRunner):
    backend = "torch"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import torch

        self.torch = torch
        self._acc = {}
        self._w = 1.0

    def _run_original(self, batch):
        return self.original([batch])

    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if guarded:
            # Keras's torch loss scales a masked batch's sample weights in place
            # (`apply_mask`: `sample_weight *= mask`); an attempt that fails after
            # that must leave the batch it retries as it was.
            batch = _fresh_sample_weights(batch)
        return super().run(batch, n, k, state, guarded)

    def _sink(self, grads, variables):
        with self.torch.no_grad():
            for i, g in self._hand(grads, variables):
                if g is None:
                    continue
                w = 1.0 if self._scaled else self._w
                if i in self._acc:
                    self._acc[i].add_(g, alpha=w)
                else:
                    self._acc[i] = g.detach() * w

    def _measure(self, part) -> list[float]:
        return _measure(self, part)

    def _run_accumulated(self, parts, totals):
        model = self.model
        logs = None
        self._acc = {}
        vector = totals if totals else [1.0]
        try:
            for part, w in parts:
                self._w = w
                self._scaled = False
                self.applies = 0
                with ki.capture_apply(model.optimizer, self._sink, weight=w, on_scaled=self._mark_scaled):
                    with self.routing.micro(w, vector):
                        logs = model.train_step(part)
                self.routing.check_step()
            applied = self._applied()
            if applied:
                variables = model.trainable_variables
                grads = [self._acc.get(i) if has else None for i, has in applied]
                with self.torch.no_grad():
                    model.optimizer.apply(grads, [variables[i] for i, _ in applied])
        finally:
            self._acc = {}
        return logs

    def _copy_small(self):
        return [v.value.detach().clone() for v in self._small]


class TorchEvalRunner(StatefulEvalRunner):
    """torch: a test or predict step (``f(batches)``), split."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        import torch

        self.torch = torch

    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if guarded:
            batch = _fresh_sample_weights(batch)  # see TorchRunner.run
        return super().run(batch, n, k, state, guarded)

    def _run_original(self, batch):
        return self.original([batch])

    def _micro_test(self, part, w: float, totals: list[float]):
        with self.torch.no_grad():
            with self.routing.micro(w, totals):
                logs = self.model.test_step(part)
        self.routing.check_step()
        return logs

    def _measure(self, part) -> list[float]:
        return _measure(self, part)


def _measure(runner, part) -> list[float]:
    """Each compiled loss's denominator on ``part`` (a forward pass in inference mode, no update)."""
    import keras

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(part)
    out = []
    with runner.torch.no_grad():
        y_pred = runner.model(x, training=False)
        with runner.routing.measuring(out):
            ki.compute_loss_of(runner.model, y, y_pred, sample_weight)
    return [float(d) for d in measure_order(out)]


def _fresh_sample_weights(batch):
    """The batch with its sample weights (the third element of ``(x, y, sample_weight)``) copied."""
    if not (isinstance(batch, tuple) and len(batch) == 3 and batch[2] is not None):
        return batch
    torch = deps.loaded("torch")

    def clone(t):
        if torch is not None and isinstance(t, torch.Tensor):
            return t.clone()
        if isinstance(t, dict):
            return {k: clone(v) for k, v in t.items()}
        if isinstance(t, (list, tuple)):
            return type(t)(clone(v) for v in t)
        return t

    return (batch[0], batch[1], clone(batch[2]))


def _describe_block(block: dict, segment: dict) -> str:
    """A snapshot block in words: where it was allocated (the innermost frame outside torch), where known."""
    frames = block.get("frames") or []
    for frame in frames:
        name = str(frame.get("filename", ""))
        if name and "/torch/" not in name and not name.startswith("??"):
            return f"block at {os.path.basename(name)}:{frame.get('line')} ({frame.get('name')})"
    return f"block in a {segment.get('segment_type', '')} segment".replace("a  segment", "a segment")


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


def _cuda():
    torch = deps.loaded("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda


class TorchBackend(Backend):
    """torch (batches fetched before the step, CUDA syncs, ``torch.profiler``)."""

    install_hint = "install a CUDA build of torch (see pytorch.org for the command matching your driver's CUDA version)"

    fetches_inside_step = False
    counts_idle_batches = True

    def __init__(self):
        super().__init__("torch")

    # -- devices and memory
    def gpu_devices(self) -> list[str]:
        cuda = _cuda()
        if cuda is None:
            return []
        return [f"cuda:{i} ({cuda.get_device_name(i)})" for i in range(cuda.device_count())]

    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        cuda = _cuda()
        out: Stats = {}
        if cuda is None:
            return out
        n = cuda.device_count()
        for i in indices:
            if i < n:
                out[i] = (float(cuda.memory_allocated(i)), float(cuda.max_memory_allocated(i)))
        return out

    def device_memory(self) -> dict:
        torch = deps.loaded("torch")
        if torch is None:
            return {}
        try:
            if not torch.cuda.is_available():
                return {}
            i = torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(i)
            return {
                "device": torch.cuda.get_device_name(i),
                "bytes_limit": int(total),
                "bytes_in_use": int(torch.cuda.memory_allocated(i)),
                "peak_bytes_in_use": int(torch.cuda.max_memory_allocated(i)),
            }
        except Exception:
            return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        cuda = _cuda()
        if cuda is None or not cuda.is_initialized():
            return {}
        out = {}
        for i in range(cuda.device_count()):
            out[i] = (float(cuda.max_memory_allocated(i)), float(cuda.mem_get_info(i)[1]))
        return out

    def uses_tf32(self) -> bool:
        torch = deps.loaded("torch")
        return bool(torch is not None and torch.backends.cuda.matmul.allow_tf32)

    def framework_facts(self, facts) -> None:
        import torch

        facts.version = torch.__version__
        facts.built_with_cuda = torch.version.cuda is not None
        facts.cuda_version = torch.version.cuda
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        facts.cudnn_version = str(cudnn) if cudnn else None
        if torch.cuda.is_available():
            facts.gpus = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]

    def distribution_notes(self, topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
        if gpus < 2:
            return []
        return [
            (
                "warn",
                f"{gpus} GPUs are visible, but Keras's fit() on the torch backend trains on one (the current "
                "CUDA device); the others stay idle. For data parallelism with fit(), use the JAX backend "
                "(keras.distribution.DataParallel) or TensorFlow (tf.distribute.MirroredStrategy).",
            )
        ]

    # -- the step
    def sync(self, outputs) -> None:
        torch = deps.loaded("torch")
        if outputs is not None and torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def step_caller(self, hook) -> Callable:
        return lambda data: _call_torch(hook, data)

    def fetch_caller(self, hook) -> Callable:
        return lambda data: _light_torch(hook, data)

    def prepare_hook(self, hook) -> None:
        _install_fetch_timer(hook)

    # -- planning the batch size
    def device_capacities(self, model, replicas: int) -> list[int | None]:
        cuda = _cuda()
        if cuda is None:
            return [None] * replicas
        return [int(cuda.mem_get_info(cuda.current_device())[1])] * replicas

    def plan_restore(self, model, snapshot) -> None:
        """Puts the model back, then hands the trial steps' cached blocks back to the device.

        The caching allocator keeps what the trial steps (the ones that ran out
        of memory too) reserved; left there, it fragments the memory that the
        planned batch's own steps then need (seen on an H200: the planned batch
        ran out of memory in the process that planned it).
        """
        super().plan_restore(model, snapshot)
        cuda = _cuda()
        if cuda is not None and cuda.is_initialized():
            cuda.empty_cache()

    def step_memory(self, model, batch, replicas: int) -> tuple[list[float], str]:
        """One warm-up trial step, then one measured: the CUDA allocator's peak, or on a CPU the peak of live tensors."""
        x, y = batch
        cuda = _cuda()
        if cuda is not None and cuda.is_initialized():
            # Each trial from an empty cache, as the planned fit starts (plan_restore): with the blocks a
            # larger trial had cached, an H100 planned 65536 in one run and 75776 in another; from an
            # empty cache, 80896 in both (and it trains).
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

    def plan_method(self, model) -> str:
        cuda = _cuda()
        if cuda is not None and cuda.is_initialized():
            return "trial steps (one warm-up, one measured): torch.cuda.max_memory_allocated"
        return (
            "trial steps (one warm-up, one measured) on the CPU, whose allocator keeps no statistics: the peak of "
            "tensor storage alive at once during the step, counted op by op (a TorchDispatchMode), plus the "
            "model's variables and optimizer state"
        )

    # -- profiler
    def profiler(self):
        return _Torch()

    # -- out of memory
    def is_oom(self, exc: BaseException) -> bool:
        torch = deps.loaded("torch")
        if torch is None:
            return False
        cls = getattr(torch, "OutOfMemoryError", None) or getattr(
            getattr(torch, "cuda", None), "OutOfMemoryError", None
        )
        if cls is not None and isinstance(exc, cls):
            return True
        return type(exc) is RuntimeError and "DefaultCPUAllocator" in str(exc) and _CPU_OOM in str(exc)

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        made = type(original)(message)
        return made if isinstance(made, BaseException) else None

    def explain_oom(self, error, context) -> tuple[dict, dict]:
        """The CUDA allocator's statistics and a summary of ``torch.cuda.memory_snapshot()``; with the
        allocation history recording (``start_memory_history``), the snapshot file PyTorch's memory
        visualizer (https://pytorch.org/memory_viz) opens."""
        cuda = _cuda()
        figures: dict[str, Any] = {"sources": []}
        artifacts: dict[str, bytes] = {}
        if cuda is None or not cuda.is_initialized():
            return figures, artifacts
        try:
            i = cuda.current_device()
            free, total = cuda.mem_get_info(i)
            stats = cuda.memory_stats(i)
            figures.update(
                device=f"cuda:{i} ({cuda.get_device_name(i)})",
                free_bytes=int(free),
                capacity_bytes=int(total),
                in_use_bytes=int(stats.get("allocated_bytes.all.current", 0)),
                peak_bytes=int(stats.get("allocated_bytes.all.peak", 0)),
                reserved_bytes=int(stats.get("reserved_bytes.all.current", 0))
                - int(stats.get("allocated_bytes.all.current", 0)),
            )
            figures["sources"].append("torch.cuda.mem_get_info / memory_stats")
            # The message's figures where it gives them: the moment of the failed request, as the lines show.
            said = parse_message(str(error)) if error is not None else {}
            conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
            note = fragmentation_note(
                said.get("requested_bytes"),
                said.get("free_bytes", figures["free_bytes"]),
                said.get("reserved_bytes", figures["reserved_bytes"]),
                "expandable_segments:true" in conf.lower(),
            )
            if note:
                figures["notes"] = [note]
            blocks = []
            for segment in cuda.memory_snapshot():
                for block in segment.get("blocks", []):
                    if block.get("state") == "active_allocated":
                        blocks.append((_describe_block(block, segment), int(block.get("size", 0))))
            blocks.sort(key=lambda b: -b[1])
            figures["largest"] = blocks[:5]
            figures["sources"].append("torch.cuda.memory_snapshot()")
        except Exception:
            logger.debug("keras_gpu_tools: torch memory figures failed", exc_info=True)
        if context.get("files") and self._recording:
            try:
                import pickle

                artifacts["memory_snapshot.pickle"] = pickle.dumps(cuda.memory._snapshot())
            except Exception:
                logger.debug("keras_gpu_tools: no memory snapshot", exc_info=True)
        return figures, artifacts

    _recording = False

    def start_memory_history(self) -> str | None:
        cuda = _cuda()
        if cuda is None:
            return "torch records allocation history on CUDA devices only; this process has none"
        try:
            cuda.memory._record_memory_history(max_entries=100000)
        except Exception as e:
            return f"torch.cuda.memory._record_memory_history failed: {e}"
        self._recording = True
        return None

    def stop_memory_history(self) -> None:
        cuda = _cuda()
        if cuda is not None and self._recording:
            self._recording = False
            try:
                cuda.memory._record_memory_history(enabled=None)
            except Exception:
                logger.debug("keras_gpu_tools: could not stop the memory history", exc_info=True)

    def reducer_problem(self, model) -> str | None:
        return None

    def accumulation_runner(self, model, original: Callable, mode: str = "accumulate", **kwargs):
        return TorchRunner(model, original, mode, **kwargs)

    def eval_runner(self, model, kind: str, original: Callable, mode: str = "accumulate"):
        return TorchEvalRunner(model, kind, original, mode)

    def eval_call(self, kind: str, one: Callable, steps_per_execution: int, replicas: int = 1) -> Callable:
        if kind == "predict":

            def predict_function(data):
                return concat_outputs([one(batch) for batch in data])

            return predict_function

        def test_function(data):
            logs = None
            for batch in data:
                logs = one(batch)
            return logs

        return test_function

    def reducer_call(self, one: Callable, idle, runner, steps_per_execution: int, replicas: int = 1) -> Callable:
        original, run_idle = runner.original, idle.run

        def train_function(data):
            if len(data) != 1:
                logs = None
                for batch in data:
                    logs = train_function([batch])
                return logs
            if idle.free:  # one of the epoch's full batches, whose shape ran whole: unchecked (IdlePath), inline
                idle.free -= 1
                try:
                    logs = original(data)
                except Exception as e:
                    idle.failed(e, idle.full)
                    raise
                idle.steps += 1
                return logs
            batch = data[0]
            # batch_signature(batch), with its common case inline: a call less on every step,
            # whose tensors' attributes are out of the caches after Keras's step (3 us here on the CPU).
            try:
                sig = tuple(map(shape_and_dtype, batch)) if type(batch) is tuple else batch_signature(batch)
            except AttributeError:  # a None or a nested leaf
                sig = batch_signature(batch)
            if sig == idle.signature:  # the idle path (IdlePath), on Keras's own list
                return run_idle(original, data)
            return one(batch)

        return train_function


BACKEND = TorchBackend()
