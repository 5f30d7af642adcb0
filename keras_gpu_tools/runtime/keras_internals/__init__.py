"""Every use of Keras internals, in one package, with why and the versions checked.

Keras gives a callback no supported way to time a training step, retry a batch
or profile chosen steps. This package is the only place that touches private
Keras attributes or relies on undocumented behaviour; each use is listed in
:data:`INTERNALS` (what, where in Keras, why we need it, the Keras versions it
was checked against) and documented for maintainers in
``docs/keras-internals.md``. Each helper checks what it needs and raises
:class:`~keras_gpu_tools.errors.KerasInternalsError`, naming the installed
Keras version, when a release has changed it; :func:`check_keras_version`
warns once (at ``on_train_begin``) when Keras is outside the tested range.

One module per concern:

- ``registry``: :data:`INTERNALS` and the tested Keras versions;
- ``version``: the installed version against them, the error for a changed internal;
- ``fit``: fit()'s frame and locals, the train/test/predict functions, ``steps_per_execution``;
- ``callback_list``: what Keras's progress bar, History and TensorBoard callbacks see of the epoch logs;
- ``compiled_step``: Keras's compiled per-batch step inside the TensorFlow and JAX train functions;
- ``input_data``: the data adapter, the epoch's batches, the fetch timer, the tf.data pipeline;
- ``optimizer``: the optimizer's apply routed to an accumulator, its step counter and variables;
- ``losses``: the compiled losses and what each averages over (exact micro-batch weighting);
- ``model``: the model's layers, variables and the JAX train state;
- ``patching``: an attribute set for the duration of a block.

Callers use ``from keras_gpu_tools.runtime import keras_internals as ki`` and
``ki.<name>``. No module here imports Keras or a framework at import time.
"""

from __future__ import annotations

import logging

from keras_gpu_tools.runtime.keras_internals.callback_list import epoch_log_readers, view_epoch_end
from keras_gpu_tools.runtime.keras_internals.compiled_step import (
    compiled_in,
    jax_batch_step,
    jax_step_function,
    tf_batch_step,
    tf_is_graph_iterator,
    tf_run_batches,
    tf_step_function,
)
from keras_gpu_tools.runtime.keras_internals.fit import (
    eval_function,
    find_callback_list,
    find_epoch_iterator,
    find_fit_frame,
    fit_locals,
    get_train_function,
    set_eval_function,
    set_train_function,
    steps_per_execution,
    training_data,
)
from keras_gpu_tools.runtime.keras_internals.input_data import (
    array_epoch_batches,
    array_epoch_samples,
    describe_pipeline,
    inspect_tf_dataset,
    time_epoch_iterator,
)
from keras_gpu_tools.runtime.keras_internals.losses import (
    KNOWN_REDUCTIONS,
    compute_loss_of,
    counted_additional_losses,
    expected_additional_losses,
    flat_losses,
    loss_parts,
    loss_reduction_problem,
    muted_loss_metrics,
    routed_losses,
)
from keras_gpu_tools.runtime.keras_internals.model import (
    all_layers,
    build_for_training,
    compile_arguments,
    global_seed_generator,
    jax_batch_sharding,
    jax_data_parallel,
    jax_hand_back_state,
    jax_state_of,
    jax_state_parts,
    jax_write_variables,
    named_objects,
    sublayers,
    symbolic_calls,
    training_kwargs,
    variables_of,
)
from keras_gpu_tools.runtime.keras_internals.optimizer import (
    capture_apply,
    iterations_value,
    iterations_variable,
    optimizer_variables_list,
    other_optimizers,
)
from keras_gpu_tools.runtime.keras_internals.registry import INTERNALS, TESTED, TESTED_KERAS, Internal
from keras_gpu_tools.runtime.keras_internals.version import check_keras_version, internals_error, keras_version

logger = logging.getLogger("keras_gpu_tools")

__all__ = [
    "INTERNALS",
    "global_seed_generator",
    "KNOWN_REDUCTIONS",
    "TESTED",
    "TESTED_KERAS",
    "Internal",
    "all_layers",
    "sublayers",
    "symbolic_calls",
    "array_epoch_batches",
    "array_epoch_samples",
    "build_for_training",
    "capture_apply",
    "compile_arguments",
    "check_keras_version",
    "compiled_in",
    "compute_loss_of",
    "counted_additional_losses",
    "describe_pipeline",
    "epoch_log_readers",
    "eval_function",
    "expected_additional_losses",
    "find_callback_list",
    "find_epoch_iterator",
    "find_fit_frame",
    "fit_locals",
    "flat_losses",
    "get_train_function",
    "inspect_tf_dataset",
    "internals_error",
    "iterations_value",
    "iterations_variable",
    "jax_batch_sharding",
    "jax_batch_step",
    "jax_data_parallel",
    "jax_hand_back_state",
    "jax_state_of",
    "jax_state_parts",
    "jax_step_function",
    "jax_write_variables",
    "keras_version",
    "logger",
    "loss_parts",
    "loss_reduction_problem",
    "muted_loss_metrics",
    "named_objects",
    "optimizer_variables_list",
    "other_optimizers",
    "routed_losses",
    "set_eval_function",
    "set_train_function",
    "steps_per_execution",
    "tf_batch_step",
    "tf_is_graph_iterator",
    "tf_run_batches",
    "tf_step_function",
    "time_epoch_iterator",
    "training_data",
    "training_kwargs",
    "variables_of",
    "view_epoch_end",
]
