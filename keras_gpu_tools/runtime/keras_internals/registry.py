"""The registry of Keras internals: what each is, where in Keras, why the package needs it, the versions checked.

``docs/keras-internals.md`` documents every entry of :data:`INTERNALS` (a test
keeps the two in sync). Adding a use of a private Keras API means adding it here.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        "the per-backend step callers in keras_gpu_tools/backends",
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
        "CallbackList appends its History, then its ProgbarLogger, after the given callbacks and calls each "
        "one's on_epoch_end (an instance attribute first) with one logs dict; ProgbarLogger prints every key "
        "it is given, keras.callbacks.TensorBoard writes every key as epoch_<key>",
        "keras/src/callbacks/callback_list.py: _add_default_callbacks(), on_epoch_end(); "
        "keras/src/callbacks/progbar_logger.py; keras/src/callbacks/tensorboard.py: on_epoch_end()",
        "our epoch figures reach History and CSVLogger through logs while the progress bar shows one of them "
        "at most and Keras's TensorBoard none (no figure written twice); our lines print under the bar's line",
    ),
    Internal(
        "ArrayDataAdapter: every batch of a pass but the last has batch_size rows of its `_inputs`; "
        "EpochIterator starts a new pass each epoch when steps_per_epoch is None",
        "keras/src/trainers/data_adapters/array_data_adapter.py: _get_iterator(); "
        "keras/src/trainers/epoch_iterator.py: _enumerate_iterator()",
        "the OOM reducer's idle steps that need no check of the batch (array inputs); the logger's joules per sample",
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
        "global_state.get_global_attribute('global_seed_generator'): keras.random's global SeedGenerator",
        "keras/src/random/seed_generator.py; keras/src/backend/common/global_state.py",
        "plan_batch_size puts back the random state its trial steps drew from",
    ),
    Internal(
        "Layer._flatten_layers(include_self, recursive)",
        "keras/src/layers/layer.py",
        "finding BatchNormalization and activity regularizers in nested models; the layer tree of ProfilerWindow's layer table",
    ),
    Internal(
        "Layer._inbound_nodes: one Node per call of the layer on symbolic inputs",
        "keras/src/layers/layer.py; keras/src/ops/operation.py: Operation.__call__ -> Node",
        "a shared layer's call count in ProfilerWindow's layer table where the trace cannot tell its calls apart",
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
    Internal(
        "train/test/predict functions close over their compiled per-batch steps (a tf.function, a jax.jit function)",
        "keras/src/backend/tensorflow/trainer.py, keras/src/backend/jax/trainer.py: _make_function(), make_*_function()",
        "MemoryLeakDetector counts their traces per epoch (a retrace every epoch keeps a program per trace)",
    ),
    Internal(
        "Keras's global name counters (global_state object_name_uids) grow with each object named; "
        "clear_session() resets them",
        "keras/src/utils/naming.py: uniquify(); keras/src/backend/common/global_state.py: clear_session()",
        "MemoryLeakDetector tells a model built in a loop without clear_session()",
    ),
    Internal(
        "Trainer._compile_config.config: the arguments model.compile was called with, as given",
        "keras/src/trainers/trainer.py: compile()",
        "find_speedups compiles clones of the model as it was compiled, and its report re-compiles the model keeping its optimizer",
    ),
)
