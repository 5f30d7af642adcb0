"""Every use of Keras internals, in one place, with why and the versions checked.

Keras gives a callback no supported way to time a training step, retry a batch
or profile chosen steps. This module is the only one in the package that
touches private Keras attributes or relies on undocumented behaviour; each
use is listed in :data:`INTERNALS` (what, where in Keras, why we need it, the
Keras versions it was checked against) and documented for maintainers in
``docs/keras-internals.md``. Each helper checks what it needs and raises
:class:`~keras_gpu_tools.errors.KerasInternalsError`, naming the installed
Keras version, when a release has changed it; :func:`check_keras_version`
warns once (at ``on_train_begin``) when Keras is outside the tested range.

No module-level Keras import: this module is part of ``_core``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keras_gpu_tools.errors import KerasInternalsError, KerasVersionWarning
from keras_gpu_tools.runtime import deps

logger = logging.getLogger("keras_gpu_tools")

#: The Keras releases the internals below were read from and tested with (CI
#: runs the lowest and the highest). ``setup.cfg`` allows ``keras>=3.15,<4``.
TESTED_KERAS = ("3.15.0", "3.15.1")
TESTED = TESTED_KERAS[-1]


@dataclass(frozen=True)
class Internal:
    """One private Keras API or undocumented behaviour the package relies on."""

    what: str
    where: str  # the Keras source it lives in
    why: str
    checked: tuple[str, ...] = TESTED_KERAS


INTERNALS: tuple[Internal, ...] = (
    Internal(
        "fit() calls make_train_function() before on_train_begin and reads model.train_function anew at every step",
        "keras/src/backend/{tensorflow,jax,torch}/trainer.py: fit()",
        "the step hook replaces model.train_function in on_train_begin to time, mark and retry steps",
    ),
    Internal(
        "fit() calls model.train_function directly from its own frame",
        "keras/src/backend/*/trainer.py: fit()",
        "a hook left by a fit() that died recognises a later fit() by its caller frame and steps aside",
    ),
    Internal(
        "train function signatures: TF f(iterator), JAX f(state, iterator) -> (logs, state), torch f(batches)",
        "keras/src/backend/*/trainer.py: make_train_function()",
        "the per-backend step callers in keras_gpu_tools/_backends",
    ),
    Internal(
        "TF: a non-tf.data iterable makes the train function call one_step_on_data per element",
        "keras/src/backend/tensorflow/trainer.py: make_train_function()",
        "sampled steps and the OOM reducer fetch batches in Python and run the same compiled step on them",
    ),
    Internal(
        "TF: the train function closes over `one_step_on_data`, which wraps its compiled per-batch "
        "tf.function as `step_func` (_autoconvert_optionals)",
        "keras/src/backend/tensorflow/trainer.py: _make_function(), _autoconvert_optionals()",
        "the OOM reducer's idle step calls that function's concrete function for the batch's signature",
    ),
    Internal(
        "JAX: the train function closes over the jitted per-batch step as `step_function`",
        "keras/src/backend/jax/trainer.py: make_train_function()",
        "XLA cost and memory analysis of the step (FLOPs, MFU, OOM prediction)",
    ),
    Internal(
        "JAX: the state is the 4-tuple (trainable, non-trainable, optimizer, metrics variables); "
        "model._jax_state / _jax_state_synced are written back by fit()'s jax_state_sync",
        "keras/src/backend/jax/trainer.py",
        "gradient accumulation on JAX; handing the state from before a failed step back to fit()",
    ),
    Internal(
        "fit() locals `epoch_iterator` (EpochIterator with _get_iterator() and data_adapter), `callbacks`, `x`",
        "keras/src/backend/*/trainer.py: fit(); keras/src/trainers/epoch_iterator.py",
        "torch fetch timing (wrapping _get_iterator), describing the input pipeline, finding sibling callbacks",
    ),
    Internal(
        "ArrayDataAdapter: every batch of a pass but the last has batch_size rows of its `_inputs`; "
        "EpochIterator starts a new pass each epoch when steps_per_epoch is None",
        "keras/src/trainers/data_adapters/array_data_adapter.py: _get_iterator(); "
        "keras/src/trainers/epoch_iterator.py: _enumerate_iterator()",
        "the OOM reducer's idle steps that need no check of the batch (array inputs)",
    ),
    Internal(
        "train_step hands gradients to optimizer.apply (TF, torch) or optimizer.stateless_apply (JAX), "
        "after optimizer.scale_loss on the loss",
        "keras/src/backend/*/trainer.py: train_step()",
        "the OOM reducer accumulates micro-batch gradients and applies once",
    ),
    Internal(
        "optimizer._iterations (and a LossScaleOptimizer's inner_optimizer)",
        "keras/src/optimizers/base_optimizer.py",
        "telling whether a failed step already applied an update before retrying it",
    ),
    Internal(
        "CompileLoss._flat_losses: (path, loss, loss_weights, name) entries read at every call; "
        "model._compile_loss and its _user_loss",
        "keras/src/trainers/compile_utils.py: CompileLoss.build(), call()",
        "the OOM reducer routes each compiled loss of a micro-batch to weight it by what it averages over",
    ),
    Internal(
        "Loss.__call__ reduces call()'s values with reduce_weighted_values/apply_mask (private helpers "
        "keras.src.losses.loss.apply_mask, squeeze_or_expand_to_same_rank; masks from "
        "keras.src.backend.common.masking.get_keras_mask)",
        "keras/src/losses/loss.py",
        "each loss's numerator and denominator per reduction, so micro-batches add up to the batch's loss",
    ),
    Internal(
        "Loss.__call__ ends with keras.src.losses.loss.scale_loss_for_distribution (1 / replicas of a "
        "tf.distribute strategy, in the replica context)",
        "keras/src/losses/loss.py",
        "a routed loss divides by the replicas as Keras's does, so the optimizer's sum over replicas is the mean",
    ),
    Internal(
        "Trainer.compute_loss adds each of model.losses through _aggregate_additional_loss; activity "
        "regularizers are divided by the batch size (Layer.__call__)",
        "keras/src/trainers/trainer.py: compute_loss(); keras/src/layers/layer.py: __call__()",
        "counting the losses a layer adds, to refuse accumulation where their averaging is unknown",
    ),
    Internal(
        "optimizer._trainable_variables: what apply(grads) without variables updates",
        "keras/src/optimizers/base_optimizer.py: apply()",
        "a custom train_step's apply(grads) is accumulated for the variables it means",
    ),
    Internal(
        "test/predict function signatures (TF f(iterator) / f(batches), JAX f(state, iterator) with donated "
        "state, torch f(batches)), read anew at every step after on_test_begin/on_predict_begin",
        "keras/src/backend/*/trainer.py: evaluate(), predict(), make_test_function(), make_predict_function()",
        "the OOM reducer retries evaluation and prediction steps too",
    ),
    Internal(
        "JAX: Callback.model calls model.jax_state_sync(), which marks the state synced",
        "keras/src/callbacks/callback.py: model",
        "never read inside a step (it would make evaluate() drop later metric updates)",
    ),
    Internal(
        "model._call_has_training_arg: stateless_call passes keywords to call() as they are",
        "keras/src/layers/layer.py",
        "the forward pass that measures a loss's mask passes training=False only where call() takes it",
    ),
    Internal(
        "Trainer._symbolic_build(data_batch=...) builds the model, compiled losses and metrics and the "
        "optimizer; JAXTrainer._get_jax_state(...)",
        "keras/src/trainers/trainer.py; keras/src/backend/jax/trainer.py",
        "plan_batch_size builds and copies the whole state before trial steps, and lowers the JAX step",
    ),
    Internal(
        "Layer._flatten_layers(include_self, recursive)",
        "keras/src/layers/layer.py",
        "finding BatchNormalization and activity regularizers in nested models",
    ),
    Internal(
        "Keras disables JAX profiling on Python < 3.12",
        "keras/src/callbacks/tensorboard.py",
        "ProfilerWindow refuses JAX profiling there with the same reason",
    ),
    Internal(
        "tf.data dataset objects keep their inputs (_inputs()); file readers their _num_parallel_reads",
        "tensorflow/python/data/ops/dataset_ops.py; tensorflow/python/data/ops/readers.py",
        "InputBoundDetector's advice reads the pipeline's transformations",
    ),
)

_version_warned = False


# -- fit() itself ------------------------------------------------------------------------------
_FIT_NAMES = ("fit",)


def find_fit_frame(model, start=None):
    """The innermost frame of ``model.fit`` on the current stack, or None.

    Keras's ``fit`` is wrapped by its traceback filter; the frame we want is
    the trainer's own ``fit`` (its code is named ``fit`` and ``self`` is the model).
    """
    frame = start or sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in _FIT_NAMES and frame.f_locals.get("self") is model:
            return frame
        frame = frame.f_back
    return None


def keras_version() -> str:
    try:
        import keras

        return keras.__version__
    except Exception:  # pragma: no cover - keras is a requirement
        return "unknown"


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def check_keras_version(version: str | None = None) -> bool:
    """Warns once per process when Keras is outside :data:`TESTED_KERAS`; returns whether it is inside."""
    global _version_warned
    v = version or keras_version()
    low, high = _version_tuple(TESTED_KERAS[0]), _version_tuple(TESTED_KERAS[-1])
    inside = v != "unknown" and low <= _version_tuple(v) <= high
    if not inside and not _version_warned:
        _version_warned = True
        warnings.warn(
            f"keras_gpu_tools relies on Keras internals checked with keras {TESTED_KERAS[0]} to {TESTED_KERAS[-1]}; "
            f"this is keras {v}. It fails with a clear error where an internal has changed; please report it.",
            KerasVersionWarning,
            stacklevel=3,
        )
    return inside


def _fail(what: str) -> KerasInternalsError:
    return KerasInternalsError(
        f"keras_gpu_tools relies on a Keras internal that this Keras ({keras_version()}) "
        f"does not have: {what}. It was written against keras {TESTED}; "
        "please report this with your Keras version."
    )


def get_train_function(model) -> Callable:
    if not hasattr(model, "train_function") or not hasattr(model, "make_train_function"):
        raise _fail("`model.train_function` / `model.make_train_function`")
    fn = model.train_function
    if fn is None:  # on_train_begin runs after make_train_function; be safe anyway
        model.make_train_function()
        fn = model.train_function
    if not callable(fn):
        raise _fail("a callable `model.train_function` at on_train_begin")
    return fn


def set_train_function(model, fn: Callable) -> None:
    model.train_function = fn


_EVAL_ATTRIBUTES = {"test": "test_function", "predict": "predict_function"}


def eval_function(model, kind: str) -> Callable | None:
    """``model.test_function`` (``kind="test"``) or ``model.predict_function`` (``"predict"``), or None."""
    return getattr(model, _EVAL_ATTRIBUTES[kind], None)


def set_eval_function(model, kind: str, fn: Callable) -> None:
    """Replaces the test or predict function; evaluate()/predict() read it anew at every step."""
    setattr(model, _EVAL_ATTRIBUTES[kind], fn)


def steps_per_execution(model) -> int:
    return int(getattr(model, "steps_per_execution", 1) or 1)


def tf_is_graph_iterator(iterator) -> bool:
    """True for the iterators that make Keras run its compiled multi-step loop."""
    tf = deps.loaded("tensorflow")
    if tf is None:
        return False
    return isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator))


def tf_run_batches(train_function: Callable, batches: list[Any]):
    """Runs already fetched batches through Keras's Python branch.

    Any non-``tf.data`` iterable makes the TensorFlow train function call its
    compiled per-batch ``one_step_on_data`` once per element (at most
    ``steps_per_execution`` elements): the same step on the same batches.
    """
    return train_function(iter(batches))


def tf_batch_step(train_function: Callable, batch) -> Callable | None:
    """Keras's compiled per-batch TF step for this batch's signature, as a concrete function, or None.

    Keras's Python branch (``tf_run_batches``) calls ``one_step_on_data``: a
    wrapper that maps ``tf.experimental.Optional`` leaves to None, around a
    ``tf.function``. Resolving that function for the batch's shapes and
    dtypes once, and calling the concrete function it dispatches to, runs
    the same traced graph without the per-call dispatch (on a 2-core CPU
    about a quarter of a tiny model's step: ``benchmarks/RESULTS.md``).
    None where there is no such function (``run_eagerly``, another Keras),
    where functions are set to run eagerly
    (``tf.config.run_functions_eagerly``), or the batch holds an ``Optional``.
    """
    tf = deps.loaded("tensorflow")
    function = tf_step_function(train_function)
    if tf is None or function is None or tf.config.functions_run_eagerly():
        return None
    if any(isinstance(leaf, tf.experimental.Optional) for leaf in tf.nest.flatten(batch)):
        return None
    return function.get_concrete_function(batch)


def tf_step_function(train_function: Callable):
    """The ``tf.function`` of Keras's per-batch TF step (inside ``one_step_on_data``), or None."""
    function = _closure_var(_closure_var(train_function, "one_step_on_data"), "step_func")
    return function if hasattr(function, "get_concrete_function") else None


def jax_step_function(train_function: Callable) -> Callable | None:
    """The jitted per-batch step the JAX train function closes over, or None."""
    fn = _closure_var(train_function, "step_function")
    return fn if hasattr(fn, "lower") else None


def jax_batch_step(train_function: Callable) -> Callable | None:
    """``step(state, batch)`` where ``train_function`` is Keras's one-batch JAX function, else None.

    With ``steps_per_execution=1`` Keras's function is
    ``iterator_step(state, iterator) = step_function(state, next(iterator))``
    (closing over ``step_function`` alone): a batch in hand then runs through
    ``step_function`` with no iterator built for it.
    """
    code = getattr(train_function, "__code__", None)
    if code is None or code.co_name != "iterator_step" or code.co_freevars != ("step_function",):
        return None
    fn = _closure_var(train_function, "step_function")
    return fn if callable(fn) else None


def _closure_var(fn, name: str):
    """The value of the variable ``name`` that the function ``fn`` closes over, or None."""
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return None
    cell = dict(zip(code.co_freevars, cells)).get(name)
    return cell.cell_contents if cell is not None else None


def fit_locals(model) -> dict[str, Any]:
    """The locals of the running ``model.fit`` (empty outside fit)."""
    frame = find_fit_frame(model, sys._getframe(1))
    if frame is None:
        return {}
    try:
        return dict(frame.f_locals)
    finally:
        del frame


def find_callback_list(model) -> list[Any]:
    """The callbacks of the running fit(), or [] where they cannot be found."""
    cbs = fit_locals(model).get("callbacks")
    inner = getattr(cbs, "callbacks", None)
    return list(inner) if isinstance(inner, list) else []


def find_epoch_iterator(model):
    """The training ``EpochIterator`` of the running fit(), or None."""
    ei = fit_locals(model).get("epoch_iterator")
    if ei is None or not hasattr(ei, "_get_iterator") or not hasattr(ei, "data_adapter"):
        return None
    return ei


def array_epoch_batches(model) -> int | None:
    """The batches of each epoch where every one but an epoch's last has one shape, else None.

    So it is where fit() cuts dense arrays into batches: Keras's own
    ``ArrayDataAdapter`` (not a subclass) slices ``batch_size`` rows for each
    batch of a pass but the last, whose rows are what is left, and every
    batch holds the same arrays with their dtypes; with no ``steps_per_epoch``
    each epoch is one new pass. Anything else (a dataset, a generator, a set
    ``steps_per_epoch``, a pass of one batch, a ragged or sparse array among
    the inputs): None.
    """
    ei = find_epoch_iterator(model)
    adapter = getattr(ei, "data_adapter", None)
    kind = type(adapter)
    if kind.__name__ != "ArrayDataAdapter" or not kind.__module__.startswith("keras.src.trainers.data_adapters"):
        return None
    if getattr(ei, "steps_per_epoch", None) is not None:
        return None
    from keras import tree

    try:
        if not all(_dense(a) for a in tree.flatten(adapter._inputs)):
            return None
    except Exception:  # the adapter's inputs not where they were
        return None
    n = getattr(adapter, "num_batches", None)
    return n if isinstance(n, int) and n > 1 else None


def _dense(a) -> bool:
    """Whether every batch sliced from the array ``a`` keeps its trailing shape and dtype.

    A ragged tensor is padded per batch (to the batch's longest row) and a
    sparse one may change its stored entries: neither qualifies. Dense
    arrays of NumPy, JAX, TensorFlow and torch, and pandas frames, do.
    """
    import numpy as np

    if a is None or isinstance(a, np.ndarray):
        return True
    name, module = type(a).__name__, type(a).__module__
    if module.startswith("pandas"):
        return name in ("DataFrame", "Series")
    if module.startswith("tensorflow"):
        return name not in ("RaggedTensor", "SparseTensor") and hasattr(a, "shape")
    if module.startswith(("jax", "jaxlib")):
        return not module.startswith("jax.experimental.sparse") and hasattr(a, "shape")
    if module.startswith("torch"):
        return getattr(a, "layout", None) is not None and str(a.layout) == "torch.strided"
    return False


def training_data(model) -> dict[str, Any]:
    """What fit() is training on: the adapter and the user's ``x``."""
    loc = fit_locals(model)
    ei = loc.get("epoch_iterator")
    return {"adapter": getattr(ei, "data_adapter", None), "x": loc.get("x")}


class _TimedIterable:
    def __init__(self, inner, on_fetch: Callable[[float], None], clock: Callable[[], float], when):
        self._inner = inner
        self._on_fetch = on_fetch
        self._clock = clock
        self._when = when

    def __iter__(self):
        t = self._clock()
        it = iter(self._inner)  # DataLoader workers start here
        if self._when():  # part of the first call's fetch, when that call is timed
            self._on_fetch(self._clock() - t)
        return _TimedIterator(it, self._on_fetch, self._clock, self._when)


class _TimedIterator:
    __slots__ = ("_it", "_on_fetch", "_clock", "_when")

    def __init__(self, it, on_fetch, clock, when):
        self._it = it
        self._on_fetch = on_fetch
        self._clock = clock
        self._when = when

    def __iter__(self):
        return self

    def __next__(self):
        if not self._when():  # a fetch nobody measures costs one call
            return next(self._it)
        t = self._clock()
        try:
            return next(self._it)
        finally:
            self._on_fetch(self._clock() - t)


def time_epoch_iterator(
    epoch_iterator,
    on_fetch: Callable[[float], None],
    clock: Callable[[], float],
    when: Callable[[], bool] = lambda: True,
) -> Callable[[], None]:
    """Times every batch fetch of a fit()'s epoch iterator; returns the undo.

    Wraps the iterator that ``EpochIterator._get_iterator()`` returns (built
    at the start of each epoch), so each ``next()`` reports its duration, when
    ``when()`` says it is wanted. The batches and their order are unchanged.
    """
    original = epoch_iterator._get_iterator

    @functools.wraps(original)
    def timed():
        return _TimedIterable(original(), on_fetch, clock, when)

    epoch_iterator._get_iterator = timed

    def undo():
        if epoch_iterator.__dict__.get("_get_iterator") is timed:
            del epoch_iterator.__dict__["_get_iterator"]

    return undo


def describe_pipeline(model) -> dict[str, Any]:
    """What kind of input fit() consumes, and what can be read about it.

    Returns a dict with ``kind`` (``"tf.data"``, ``"PyDataset"``, ``"generator"``,
    ``"arrays"``, ``"torch DataLoader"``, ``"grain"`` or ``"unknown"``) and
    details per kind. Never raises.
    """
    try:
        found = training_data(model)
    except Exception:
        return {"kind": "unknown"}
    adapter, x = found["adapter"], found["x"]
    name = type(adapter).__name__ if adapter is not None else ""
    info: dict[str, Any] = {"kind": "unknown", "adapter": name}
    try:
        if name == "TFDatasetAdapter":
            info["kind"] = "tf.data"
            info.update(inspect_tf_dataset(x if x is not None else getattr(adapter, "_dataset", None)))
        elif name == "PyDatasetAdapter":
            ds = getattr(adapter, "py_dataset", x)
            info["kind"] = "PyDataset"
            info["workers"] = getattr(ds, "workers", None)
            info["use_multiprocessing"] = getattr(ds, "use_multiprocessing", None)
            info["max_queue_size"] = getattr(ds, "max_queue_size", None)
        elif name == "GeneratorDataAdapter":
            info["kind"] = "generator"
        elif name == "ArrayDataAdapter":
            info["kind"] = "arrays"
            info["batch_size"] = getattr(adapter, "batch_size", None)
        elif name == "TorchDataLoaderAdapter":
            loader = getattr(adapter, "_dataloader", x)
            info["kind"] = "torch DataLoader"
            info["num_workers"] = getattr(loader, "num_workers", None)
            info["pin_memory"] = getattr(loader, "pin_memory", None)
            info["persistent_workers"] = getattr(loader, "persistent_workers", None)
        elif name == "GrainDatasetAdapter":
            info["kind"] = "grain"
    except Exception:
        pass
    return info


def inspect_tf_dataset(dataset) -> dict[str, Any]:
    """The transformations of a ``tf.data.Dataset``, from the end backwards.

    Reads the Python dataset objects (``_inputs()``), which TensorFlow keeps
    for every transformation. ``ops`` lists them last first;
    ``ends_with_prefetch``, ``parallel_map``, ``sequential_map``, ``cache`` and
    ``interleave`` summarise what matters for input speed; ``after_cache``
    lists the transformations after ``cache()`` (last first): once the cache
    is filled, they are all that runs.
    """
    ops: list[str] = []
    seen = 0
    stack = [dataset]
    while stack and seen < 200:
        ds = stack.pop(0)
        if ds is None:
            continue
        seen += 1
        cls = type(ds).__name__.lstrip("_")
        op = _TF_OP_NAMES.get(cls, cls)
        if op in ("tfrecord", "text_line", "fixed_length_record") and getattr(ds, "_num_parallel_reads", None):
            op = "parallel_interleave"  # a reader with num_parallel_reads interleaves its files
        ops.append(op)
        inputs = getattr(ds, "_inputs", None)
        try:
            stack = list(inputs()) + stack if callable(inputs) else stack
        except Exception:
            pass
    tail = [op for op in ops if op not in ("options",)]
    # What runs after the cache once it is filled (last first); the source and
    # the maps before it run only while it fills.
    after_cache = ops[: ops.index("cache")] if "cache" in ops else []
    return {
        "ops": ops,
        "ends_with_prefetch": bool(tail) and tail[0] == "prefetch",
        "parallel_map": "parallel_map" in ops,
        "sequential_map": "map" in ops,
        "cache": "cache" in ops,
        "after_cache": after_cache,
        "interleave": "interleave" in ops or "parallel_interleave" in ops,
    }


_TF_OP_NAMES = {
    "PrefetchDataset": "prefetch",
    "ParallelMapDataset": "parallel_map",
    "MapDataset": "map",
    "CacheDataset": "cache",
    "BatchDataset": "batch",
    "ParallelBatchDataset": "parallel_batch",
    "ShuffleDataset": "shuffle",
    "InterleaveDataset": "interleave",
    "ParallelInterleaveDataset": "parallel_interleave",
    "FlatMapDataset": "flat_map",
    "RepeatDataset": "repeat",
    "OptionsDataset": "options",
    "TakeDataset": "take",
    "TensorSliceDataset": "from_tensor_slices",
    "TensorDataset": "from_tensors",
    "RangeDataset": "range",
    "TFRecordDatasetV2": "tfrecord",
    "TFRecordDatasetV1": "tfrecord",
    "TFRecordDataset": "tfrecord",
    "TextLineDataset": "text_line",
    "FixedLengthRecordDataset": "fixed_length_record",
    "TextLineDatasetV2": "text_line",
    "FixedLengthRecordDatasetV2": "fixed_length_record",
}


# -- the optimizer's apply and the JAX state (the OOM reducer) ---------------------------------
@contextlib.contextmanager
def capture_apply(optimizer, sink: Callable, weight=None, on_scaled: Callable | None = None, stateless: bool = False):
    """Routes the optimizer call of ``train_step`` to ``sink`` while the block runs.

    ``sink(grads, variables)`` replaces ``optimizer.apply`` (TensorFlow, torch).
    With ``stateless`` (JAX), ``sink(grads)`` is called by a replacement of ``stateless_apply`` that
    returns the variables unchanged.

    With ``weight``, ``optimizer.scale_loss`` (which every backend's
    ``train_step`` calls on the loss before differentiating it; it applies the
    loss scale of ``mixed_float16``) also multiplies the loss by ``weight``, so
    a micro-batch's gradients are computed at the magnitude they have in the
    whole batch (a float16 backward pass would otherwise overflow sooner);
    ``on_scaled()`` tells that it was called.
    """
    name = "stateless_apply" if stateless else "apply"
    if not callable(getattr(optimizer, name, None)):
        raise KerasInternalsError(f"keras_gpu_tools: the optimizer has no `{name}` to accumulate gradients through.")
    with _patched(
        optimizer, "scale_loss", _weighted_scale_loss(optimizer, weight, on_scaled) if weight is not None else None
    ):
        with _capture(optimizer, name, stateless, sink):
            yield


def _weighted_scale_loss(optimizer, weight, on_scaled):
    original = optimizer.scale_loss

    def scale_loss(loss):
        if on_scaled is not None:
            on_scaled()
        return original(loss) * (weight() if callable(weight) else weight)  # a function: per replica

    return scale_loss


@contextlib.contextmanager
def _patched(obj, name: str, value):
    if value is None:
        yield
        return
    had = name in obj.__dict__
    old = obj.__dict__.get(name)
    object.__setattr__(obj, name, value)
    try:
        yield
    finally:
        if had:
            object.__setattr__(obj, name, old)
        else:
            try:
                object.__delattr__(obj, name)
            except AttributeError:
                pass


def _capture(optimizer, name: str, stateless: bool, sink: Callable):
    """Replaces ``optimizer.<name>`` (apply / stateless_apply) by a sink while the block runs."""
    if stateless:

        def replacement(optimizer_variables, grads, trainable_variables):
            sink(list(grads))
            return list(trainable_variables), list(optimizer_variables)
    else:

        def replacement(grads, trainable_variables=None):
            sink(list(grads), list(trainable_variables) if trainable_variables is not None else None)

    return _patched(optimizer, name, replacement)


def jax_state_parts(state):
    if not isinstance(state, (tuple, list)) or len(state) != 4:
        raise KerasInternalsError("keras_gpu_tools: the JAX train function's state is not the 4-tuple of Keras 3.15")
    return state


def jax_hand_back_state(model, state) -> None:
    """Lets fit()'s final ``jax_state_sync`` write ``state`` into the model's variables.

    After an error in the first step Keras has no state to write back and the
    model's variables stay purged; this gives it the state from before the
    failed attempt.
    """
    try:
        tv, ntv, ov, mv = jax_state_parts(state)
        model._jax_state = {
            "trainable_variables": tv,
            "non_trainable_variables": ntv,
            "optimizer_variables": ov,
            "metrics_variables": mv,
        }
        model._jax_state_synced = False
    except Exception:
        logger.debug("keras_gpu_tools: could not hand the JAX state back to the model", exc_info=True)


def jax_write_variables(model, kind: str, state) -> None:
    """Writes a JAX evaluation (``test``: tv, ntv, mv) or prediction (``predict``: tv, ntv) state into the model.

    After an error inside ``evaluate()``/``predict()``, Keras never syncs the
    state it took from the model (and purged from its variables); this puts
    the state from before the failed attempt back.
    """
    try:
        groups = [model.trainable_variables, model.non_trainable_variables]
        if kind == "test":
            groups.append(model.metrics_variables)
        for variables, values in zip(groups, state):
            for v, value in zip(variables, values):
                v.assign(value)
    except Exception:
        logger.debug("keras_gpu_tools: could not write the JAX state back into the model", exc_info=True)


def variables_of(model, which: str) -> list[Any]:
    """Keras variables of ``model``: ``all``, or ``small`` (non-trainable, metrics, the optimizer's counters)."""
    out, seen = [], set()

    def add(vs):
        for v in vs or []:
            if id(v) not in seen:
                seen.add(id(v))
                out.append(v)

    opt = getattr(model, "optimizer", None)
    if which == "all":
        add(model.trainable_variables)
        add(model.non_trainable_variables)
        add(getattr(opt, "variables", None))
        add(model.metrics_variables)
    else:
        add(model.non_trainable_variables)
        add(model.metrics_variables)
        if opt is not None:
            # The optimizer's scalar variables: its step counter, and a
            # LossScaleOptimizer's scale and counter.
            add([v for v in getattr(opt, "variables", []) or [] if len(getattr(v, "shape", (1,))) == 0])
    return out


def iterations_variable(optimizer):
    """The optimizer's own step counter variable (``optimizer.iterations`` may be a derived tensor)."""
    for opt in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        v = getattr(opt, "_iterations", None) if opt is not None else None
        if v is not None and hasattr(v, "assign"):
            return v
    return None


def iterations_value(model) -> int | None:
    v = iterations_variable(getattr(model, "optimizer", None))
    if v is None:
        return None
    try:
        import keras

        return int(keras.ops.convert_to_numpy(v.value))
    except Exception:
        return None


# -- the compiled losses: what each averages over (the OOM reducer's exact accumulation) ----------
#: The reductions of a Keras `Loss` whose numerator and denominator :func:`loss_parts` knows.
KNOWN_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight", "sum")


def flat_losses(model) -> list[Any] | None:
    """The compiled losses, one per output (``CompileLoss._flat_losses``), or None before they are built."""
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None:
        return []
    flat = getattr(compile_loss, "_flat_losses", None)
    return list(flat) if flat is not None else None


def loss_reduction_problem(model) -> str | None:
    """Why the compiled losses' averaging cannot be reproduced over micro-batches, or None.

    Keras builds the compiled losses before ``on_train_begin`` (``_symbolic_build``);
    each is a :class:`keras.losses.Loss` whose ``__call__`` reduces the values
    ``call`` returns. A subclass that overrides ``__call__`` reduces in its own
    way, and ``reduction=None`` returns a loss per sample that Keras's step
    itself then differentiates as a sum on some backends and refuses on others.
    """
    import keras

    if type(model).compute_loss is not keras.Model.compute_loss:
        return (
            f"{type(model).__name__} overrides `compute_loss`, so the loss of a batch is defined by that code, "
            "and what it averages over (and so how to weight each micro-batch) is unknown"
        )
    flat = flat_losses(model)
    if flat is not None:
        losses = [entry.loss for entry in flat]
    else:  # not built yet (TensorFlow builds at the first trace): the losses compile() was given
        from keras.src import tree

        given = getattr(getattr(model, "_compile_loss", None), "_user_loss", None)
        losses = [x for x in tree.flatten(given) if isinstance(x, keras.losses.Loss)] if given is not None else []
    for loss in losses:
        name = getattr(loss, "name", None) or type(loss).__name__
        if type(loss).__call__ is not keras.losses.Loss.__call__:
            return (
                f"the loss {name!r} ({type(loss).__name__}) overrides `Loss.__call__`: a custom reduction, whose "
                "average over a batch cannot be rebuilt from micro-batches"
            )
        if getattr(loss, "reduction", None) not in KNOWN_REDUCTIONS:
            return (
                f"the loss {name!r} has reduction={getattr(loss, 'reduction', None)!r}: it returns a loss per "
                "sample, not one value per batch"
            )
    return None


def other_optimizers(model) -> list[Any]:
    """Optimizers the model holds besides ``model.optimizer`` (a GAN's second one, say)."""
    import keras

    own = getattr(model, "optimizer", None)
    mine = {id(own), id(getattr(own, "inner_optimizer", None))}
    found, seen = [], set()

    def visit(value, depth):
        if isinstance(value, keras.optimizers.Optimizer):
            if id(value) not in mine and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
        elif depth < 2 and isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)
        elif depth < 2 and isinstance(value, dict):
            for v in value.values():
                visit(v, depth + 1)

    for name, value in vars(model).items():
        if name != "optimizer":
            visit(value, 0)
    return found


def optimizer_variables_list(optimizer) -> list[Any]:
    """The variables an optimizer was built for (what ``apply(grads)`` without variables updates)."""
    return list(getattr(optimizer, "_trainable_variables", None) or [])


def all_layers(model) -> list[Any]:
    """Every layer of the model, nested ones included (``Layer._flatten_layers``)."""
    flatten = getattr(model, "_flatten_layers", None)
    if callable(flatten):
        return list(flatten(include_self=True, recursive=True))
    return [model, *getattr(model, "layers", [])]


def expected_additional_losses(model) -> int:
    """The losses Keras adds to the compiled ones by itself: weight and activity regularizers.

    Weight regularization is one scalar per regularized trainable weight; an
    activity regularizer adds one per layer output, divided by the batch size
    (``Layer.__call__``). Both are exact when each micro-batch's is weighted
    by its share of the samples. Anything beyond that count came from a
    layer's own ``add_loss``, whose averaging is the layer's.
    """
    weights = sum(1 for v in model.trainable_weights if getattr(v, "regularizer", None) is not None)
    activity = sum(1 for layer in all_layers(model) if getattr(layer, "activity_regularizer", None) is not None)
    return weights + activity


def loss_parts(loss, y_true, y_pred, sample_weight) -> tuple[Any, Any, dict[str, Any]]:
    """``(numerator, denominator, facts)`` of one compiled loss on one (micro-)batch.

    Mirrors ``Loss.__call__`` and ``reduce_weighted_values`` of Keras 3.15: the
    value Keras returns is ``divide_no_nan(numerator, denominator)``, where the
    numerator is the sum of the values weighted by the sample weights and the
    mask, and the denominator is

    - ``"sum"``: 1;
    - ``"sum_over_batch_size"``/``"mean"``: the number of values, times the
      mask's valid fraction when there is a mask (``apply_mask`` weights valid
      entries by ``total / valid``);
    - ``"mean_with_sample_weight"``: the sum of the (masked) sample weights, or
      the number of values without either.

    ``facts``: ``mask`` (a mask was applied), ``weights`` (sample weights were
    given), ``scalar`` (the loss function returned one value: it averaged by
    itself), ``reduction``.
    """
    import keras
    from keras import ops
    from keras.src import tree
    from keras.src.backend.common.masking import get_keras_mask
    from keras.src.losses.loss import apply_mask, squeeze_or_expand_to_same_rank

    reduction = loss.reduction
    in_mask = get_keras_mask(y_pred)
    with keras.name_scope(loss.name):
        y_pred = tree.map_structure(lambda x: ops.convert_to_tensor(x, dtype=loss.dtype), y_pred)
        y_true = tree.map_structure(lambda x: ops.convert_to_tensor(x, dtype=loss.dtype), y_true)
        values = loss.call(y_true, y_pred)
        out_mask = get_keras_mask(values)
        if in_mask is not None and out_mask is not None:
            mask = in_mask & out_mask
        else:
            mask = in_mask if in_mask is not None else out_mask
        values = ops.convert_to_tensor(values, dtype=loss.dtype)
        facts = {
            "mask": mask is not None,
            "weights": sample_weight is not None,
            "scalar": tuple(values.shape) in ((), (0,)),
            "reduction": reduction,
        }
        if sample_weight is not None:
            # A copy: `apply_mask` multiplies in place (`*=`), which on torch would scale the
            # batch's own weights that the metrics read next.
            sample_weight = ops.copy(ops.convert_to_tensor(sample_weight, dtype=loss.dtype))
        if mask is not None:
            mask = ops.convert_to_tensor(mask, dtype=loss.dtype)
        # The plain mask (0/1): the numerator is the same for every reduction.
        weights = apply_mask(sample_weight, mask, dtype=values.dtype, reduction="sum")
        if weights is not None:
            weights = ops.cast(weights, values.dtype)
            values, weights = squeeze_or_expand_to_same_rank(values, weights)
            numerator = ops.sum(values * weights)
        else:
            numerator = ops.sum(values)
        count = ops.cast(ops.prod(ops.convert_to_tensor(ops.shape(values), dtype="int32")), values.dtype)
        if facts["scalar"] or reduction == "sum":
            denominator = ops.ones((), dtype=values.dtype)
        elif reduction == "mean_with_sample_weight":
            denominator = ops.sum(weights) if weights is not None else count
        elif mask is not None:
            total = ops.cast(ops.prod(ops.convert_to_tensor(ops.shape(mask), dtype="int32")), values.dtype)
            denominator = count * ops.divide_no_nan(ops.sum(mask), total)
        else:
            denominator = count
    return numerator, denominator, facts


class _RoutedLoss:
    """Stands in for one compiled loss: ``CompileLoss.call`` calls it as ``loss(y_true, y_pred, sample_weight)``."""

    def __init__(self, index: int, loss, on_loss: Callable):
        self.index = index
        self.loss = loss
        self.on_loss = on_loss

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Loss.__call__ ends with scale_loss_for_distribution (divided by the replicas of a
        # tf.distribute strategy, which the optimizer sums over): so does the routed loss.
        from keras.src.losses.loss import scale_loss_for_distribution

        return scale_loss_for_distribution(self.on_loss(self.index, self.loss, y_true, y_pred, sample_weight))

    def __getattr__(self, name):  # name, reduction, dtype, ... of the loss itself
        return getattr(self.loss, name)


@contextlib.contextmanager
def routed_losses(model, on_loss: Callable):
    """While the block runs, each compiled loss ``j`` is computed by ``on_loss(j, loss, y_true, y_pred, sample_weight)``.

    ``CompileLoss.call`` reads ``self._flat_losses`` (``(path, loss,
    loss_weights, name)`` entries) at every call; the entries are replaced by
    ones whose loss is routed, and put back after. Everything else of
    ``CompileLoss.call`` (the structure of outputs, the per-output loss
    metrics, ``loss_weights``) stays Keras's.
    """
    compile_loss = getattr(model, "_compile_loss", None)
    flat = getattr(compile_loss, "_flat_losses", None) if compile_loss is not None else None
    if flat is None:
        yield
        return
    routed = [
        type(entry)(entry.path, _RoutedLoss(j, entry.loss, on_loss), entry.loss_weights, entry.name)
        if isinstance(entry, tuple) and hasattr(entry, "_fields")
        else entry
        for j, entry in enumerate(flat)
    ]
    compile_loss._flat_losses = routed
    try:
        yield
    finally:
        compile_loss._flat_losses = flat


@contextlib.contextmanager
def muted_loss_metrics(model):
    """The per-output loss metrics of ``CompileLoss`` do not update while the block runs (a measuring pass)."""
    compile_loss = getattr(model, "_compile_loss", None)
    metrics = list(getattr(compile_loss, "metrics", None) or []) if compile_loss is not None else []
    with contextlib.ExitStack() as stack:
        for m in metrics:
            stack.enter_context(_patched(m, "update_state", lambda *a, **k: None))
        yield


@contextlib.contextmanager
def counted_additional_losses(model, count: Callable[[], None]):
    """Calls ``count()`` for each additional loss (``model.losses``) ``Trainer.compute_loss`` adds."""
    original = model._aggregate_additional_loss

    def aggregate(loss):
        count()
        return original(loss)

    with _patched(model, "_aggregate_additional_loss", aggregate):
        yield


def training_kwargs(model, training: bool) -> dict[str, Any]:
    """``{"training": training}`` where the model's ``call`` takes it: ``stateless_call`` passes keywords on as they are."""
    return {"training": training} if getattr(model, "_call_has_training_arg", True) else {}


def compute_loss_of(model, y, y_pred, sample_weight):
    """The compiled loss of ``(y, y_pred)`` alone (no ``model.losses``): ``CompileLoss.__call__``."""
    compile_loss = getattr(model, "_compile_loss", None)
    if compile_loss is None:
        return None
    return compile_loss(y, y_pred, sample_weight)


# -- planning the batch size ------------------------------------------------------------------
def build_for_training(model, batch) -> None:
    """Builds the model, its compiled losses and metrics and the optimizer for ``batch`` (``Trainer._symbolic_build``).

    What ``fit()`` does before its first step, from the batch's shapes only:
    afterwards every variable a training step touches exists, so a copy of
    them taken now is the whole state.
    """
    x, y = batch
    build = getattr(model, "_symbolic_build", None)
    if not callable(build):
        raise _fail("`Trainer._symbolic_build(data_batch=...)`")
    build(data_batch=(x, y) if y is not None else (x,))


def jax_state_of(model) -> tuple:
    """The 4-tuple state a JAX train step takes, from the model's variables (``JAXTrainer._get_jax_state``)."""
    get = getattr(model, "_get_jax_state", None)
    if not callable(get):
        raise _fail("`JAXTrainer._get_jax_state`")
    return jax_state_parts(
        get(
            trainable_variables=True,
            non_trainable_variables=True,
            optimizer_variables=True,
            metrics_variables=True,
            purge_model_variables=False,
        )
    )


def jax_data_parallel() -> tuple[int, Any]:
    """``(replicas, distribution)`` of the Keras distribution in effect (1, None without one)."""
    import keras

    dist = keras.distribution.distribution()
    if dist is None:
        return 1, None
    mesh = getattr(dist, "device_mesh", None)
    if mesh is None:
        return 1, dist
    names = list(getattr(mesh, "axis_names", []) or [])
    batch_dim = getattr(dist, "batch_dim_name", None) or (names[0] if names else None)
    shape = list(getattr(mesh, "shape", []) or [])
    if batch_dim in names and len(shape) == len(names):
        return int(shape[names.index(batch_dim)]), dist
    return 1, dist


def jax_batch_sharding(dist, shape: tuple[int, ...]):
    """The sharding fit() gives an input of ``shape`` under ``dist`` (its data layout), or None."""
    if dist is None:
        return None
    try:
        return dist.get_data_layout(shape).backend_layout
    except Exception:
        return None
