"""Running one batch as micro-batches with one optimizer update: what all backends share.

The runners' contract is :mod:`keras_gpu_tools.memory.runners`; each backend's
runners live with it (``backends/<framework>/accumulate.py``), TensorFlow's and
torch's built on :class:`StatefulRunner` here. In mode ``accumulate`` the
model's own ``train_step`` runs on every micro-batch with the optimizer's apply
routed to an accumulator (``ki.capture_apply``) and each compiled loss routed
through :class:`LossRouting`, so the gradient, the loss and the per-output loss
metrics are those of the whole batch; metrics and non-trainable updates run per
micro-batch. A guarded attempt keeps a host copy of every variable when the
state is at most ``full_snapshot_max_bytes``; other attempts keep a device copy
of the small state (non-trainable and metric variables, the optimizer's
counters), which cannot undo an update the optimizer had started.

No module-level framework import.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.errors import InexactAccumulationError, UnrecoverableOOM
from keras_gpu_tools.memory.runners import Snapshot
from keras_gpu_tools.memory.split import split_sizes
from keras_gpu_tools.runtime import keras_internals as ki

logger = logging.getLogger("keras_gpu_tools")

FULL_SNAPSHOT_MAX_BYTES = 4 * 2**30


def slice_batch(batch, a: int, b: int):
    if batch is None:
        return None
    if isinstance(batch, tuple):
        return tuple(slice_batch(x, a, b) for x in batch)
    if isinstance(batch, list):
        return [slice_batch(x, a, b) for x in batch]
    if isinstance(batch, dict):
        return {k: slice_batch(v, a, b) for k, v in batch.items()}
    return batch[a:b]


def micro_batches(batch, n: int, k: int) -> list[tuple[Any, float]]:
    """``(micro_batch, n_i / n)`` pairs of a batch of ``n`` split in ``k``."""
    out, start = [], 0
    for size in split_sizes(n, k):
        out.append((slice_batch(batch, start, start + size), size / n))
        start += size
    return out


def nbytes(x) -> int:
    try:
        return int(x.nbytes)
    except Exception:
        try:
            import numpy as np

            return int(np.prod(x.shape)) * 4
        except Exception:
            return 0


def refusal(reason: str) -> InexactAccumulationError:
    """The error that refuses accumulation, with the reason and what to do instead."""
    return InexactAccumulationError(
        "OOMBatchSizeReducer(mode='accumulate') cannot reproduce the unsplit batch exactly: "
        f"{reason}. Use `mode='split'` to train on truly smaller batches instead (one optimizer update per "
        "micro-batch), or lower the batch size."
    )


def accumulation_problem(model) -> str | None:
    """Why accumulation cannot be exact for ``model``, told from the model alone (before the first step)."""
    others = ki.other_optimizers(model)
    if others:
        names = ", ".join(type(o).__name__ for o in others)
        return (
            f"the model holds {len(others) + 1} optimizers (model.optimizer and {names}): only model.optimizer's "
            "update can be accumulated; another one would step once per micro-batch"
        )
    return ki.loss_reduction_problem(model)


class LossRouting:
    """Weights each compiled loss of a micro-batch by what the loss averages over in the whole batch.

    Keras's loss ``j`` of a batch is ``N_j / D_j`` (``ki.loss_parts``: ``N`` the
    weighted, masked sum of the values, ``D`` what the reduction divides by).
    Over micro-batches ``i`` of ``n_i`` samples (``w_i = n_i / n``),
    ``L_j = sum_i N_ij / D_j``. The step multiplies the loss it differentiates
    by ``w_i`` (``scale_loss``, or the gradient sink), and Keras weights the
    loss tracker and the per-output loss metrics by ``n_i``; so the routed loss
    returns ``V_ij = N_ij / (D_j * w_i)``, which makes all three those of the
    whole batch. ``D_j`` is, per kind of loss:

    - ``"count"`` (no mask, and no sample weights under
      ``mean_with_sample_weight``): proportional to the samples,
      ``D_j = D_ij / w_i``, so ``V_ij`` is Keras's own micro-batch loss;
    - ``"sum"``: 1;
    - ``"total"`` (a mask, or sample weights under ``mean_with_sample_weight``):
      the sum of ``D_ij`` over the batch, measured by a forward pass of each
      micro-batch before they train (:meth:`measuring`).

    Losses a layer adds (``model.losses``) are weighted by ``w_i``: exact for
    Keras's weight and activity regularizers; others are refused. The kinds
    are learnt from the first measuring pass and checked at every trace.
    """

    def __init__(self, model):
        self.model = model
        self.kinds: dict[int, str] = {}
        self.measured = False  # a measuring pass has run: the kinds are known
        self.calls = 0  # compiled-loss calls in the step being traced (or run, torch)
        self.additional = 0
        self._expected_additional: int | None = None
        self._measured: set[int] = set()  # losses whose denominators a measuring pass returns
        self.lenient = False  # tracing for a memory analysis only: nothing runs, nothing is refused for lack of totals

    def needs_totals(self) -> bool:
        """Whether the micro-batches need the whole batch's denominators (a measuring pass)."""
        return not self.measured or any(kind == "total" for kind in self.kinds.values())

    @staticmethod
    def kind_of(facts: dict[str, Any]) -> str:
        if facts["reduction"] == "sum":
            return "sum"
        if facts["mask"] or (facts["reduction"] == "mean_with_sample_weight" and facts["weights"]):
            return "total"
        return "count"

    def _facts(self, j: int, loss, facts: dict[str, Any]) -> str:
        if facts["scalar"]:
            raise refusal(
                f"the loss {getattr(loss, 'name', type(loss).__name__)!r} returns one value per batch: it averages "
                "by itself, over what cannot be known"
            )
        kind = self.kind_of(facts)
        known = self.kinds.get(j)
        if known is None:
            self.kinds[j] = kind
        elif known != kind:
            raise refusal(
                f"the loss {getattr(loss, 'name', j)!r} averaged over {known!r} in one batch and {kind!r} in "
                "another (a mask or sample weights that come and go)"
            )
        return kind

    def _count_additional(self) -> None:
        self.additional += 1

    @contextlib.contextmanager
    def micro(self, w, totals):
        """Routes the compiled losses of one micro-batch step (``w``: its share of the samples).

        ``w`` and ``totals`` may be functions returning them when the loss is
        computed (each replica of a ``tf.distribute`` strategy has its own).
        """
        from keras import ops

        self.calls = 0
        self.additional = 0
        w_of = w if callable(w) else (lambda: w)
        totals_of = totals if callable(totals) else (lambda: totals)

        def on_loss(j, loss, y_true, y_pred, sample_weight):
            self.calls += 1
            numerator, denominator, facts = ki.loss_parts(loss, y_true, y_pred, sample_weight)
            kind = self._facts(j, loss, facts)
            ww = ops.cast(w_of(), numerator.dtype)
            if kind == "count":
                return ops.divide_no_nan(numerator, denominator)
            if kind == "sum":
                return numerator / ww
            if j not in self._measured and not self.lenient:
                raise refusal(
                    f"the loss {getattr(loss, 'name', j)!r} is masked or weighted inside train_step but was not "
                    "when the model was called on the batch alone"
                )
            return ops.divide_no_nan(numerator, ops.cast(totals_of()[j], numerator.dtype)) / ww

        with ki.routed_losses(self.model, on_loss), ki.counted_additional_losses(self.model, self._count_additional):
            yield

    def check_step(self, replicas: int = 1) -> None:
        """After ``train_step``/``test_step`` ran (or was traced) under :meth:`micro`, on ``replicas`` replicas."""
        if self.calls == 0:
            raise refusal(
                "train_step did not compute the compiled loss (`self.compute_loss`), so the loss it "
                "differentiates (or test_step reports) is its own, and what it averages over is unknown"
            )
        if self._expected_additional is None:
            self._expected_additional = ki.expected_additional_losses(self.model)
        extra = self.additional - replicas * self._expected_additional
        if extra > 0:
            raise refusal(
                f"the model adds {extra} loss(es) of its own with `add_loss`, whose averaging over the batch is "
                "the layer's (only Keras's weight and activity regularizers are known to be means)"
            )

    @contextlib.contextmanager
    def measuring(self, out: list[tuple[int, Any]]):
        """Routes the compiled losses to record each one's denominator ``(j, D)`` in ``out``; they return 0."""
        from keras import ops

        def on_loss(j, loss, y_true, y_pred, sample_weight):
            numerator, denominator, facts = ki.loss_parts(loss, y_true, y_pred, sample_weight)
            self._facts(j, loss, facts)
            self._measured.add(j)
            out.append((j, denominator))
            return ops.zeros_like(numerator)

        with ki.routed_losses(self.model, on_loss), ki.muted_loss_metrics(self.model):
            yield

    def totals(self, per_part: list[list[float]]) -> list[float]:
        """The whole batch's denominator of each compiled loss, from each micro-batch's measured ones."""
        width = max((len(p) for p in per_part), default=0)
        sums = [0.0] * max(1, width)
        for part in per_part:
            for j, d in enumerate(part):
                sums[j] += float(d)
        return sums


def measure_order(recorded: list[tuple[int, Any]]) -> list[Any]:
    """The denominators of one measuring pass, in the order of the compiled losses."""
    return [d for _, d in sorted(recorded, key=lambda jd: jd[0])]


class StatefulRunner(ABC):
    """TensorFlow and torch: Keras variables hold the state (a :class:`~keras_gpu_tools.memory.runners.TrainRunner`)."""

    backend = ""
    _scaled = False  # train_step called optimizer.scale_loss, which weighted the loss

    def _mark_scaled(self) -> None:
        self._scaled = True

    def __init__(
        self,
        model,
        original: Callable,
        mode: str = "accumulate",
        full_snapshot_max_bytes: int = FULL_SNAPSHOT_MAX_BYTES,
    ):
        self.model = model
        self.original = original
        self.mode = mode
        self.full_snapshot_max_bytes = full_snapshot_max_bytes
        self._index = {id(v): i for i, v in enumerate(model.trainable_variables)}
        self._counted: tuple[int, int] | None = None
        self.routing = LossRouting(model)
        self._handed: dict[int, None] = {}  # the variables train_step handed the optimizer, in its order
        self._got_grad: set[int] = set()  # ... and those of them that ever got a gradient
        self.applies = 0  # optimizer applies in the step being traced (TensorFlow) or run (torch)
        self._refresh()

    def _refresh(self) -> None:
        # Compiled metrics (TensorFlow) and optimizer slots are built at the
        # first trace: collect the variables again until their number settles.
        count = (
            len(self.model.metrics_variables),
            len(getattr(getattr(self.model, "optimizer", None), "variables", []) or []),
        )
        if count == self._counted:
            return
        self._counted = count
        self._all = ki.variables_of(self.model, "all")
        self._small = ki.variables_of(self.model, "small")
        self.state_bytes = sum(nbytes(v) for v in self._all)
        self._small_changed()

    def _small_changed(self) -> None:
        """Called when the small state's variables were collected again (TensorFlow drops its copying function)."""
        return None

    def _host(self, v):
        """A host copy of variable ``v``."""
        import keras

        return keras.ops.convert_to_numpy(v.value)

    def _reset_new_metrics(self, snap: Snapshot) -> None:
        """Metric variables created by the failed attempt itself go back to zero (their initial value)."""
        import keras

        known = {id(v) for v, _ in snap.items}
        for v in self.model.metrics_variables:
            if id(v) not in known:
                v.assign(keras.ops.zeros(tuple(v.shape), dtype=v.dtype))

    # -- state ---------------------------------------------------------------
    def protect(self, state, guarded: bool) -> Snapshot:
        if guarded:
            self._refresh()
        if guarded and self.state_bytes <= self.full_snapshot_max_bytes:
            return Snapshot("full", [(v, self._host(v)) for v in self._all])
        return Snapshot(
            "small",
            list(zip(self._small, self._copy_small())),
            ki.iterations_value(self.model) if guarded else None,
        )

    def restore(self, snap: Snapshot, state):
        self._reset_accumulator()
        if snap.kind == "full":
            for v, value in snap.items:
                v.assign(value)
            self._reset_new_metrics(snap)
            self._refresh()
            return state
        before = snap.iterations
        if before is None:
            before = self._iterations_from_small(snap)
        now = ki.iterations_value(self.model)
        if before is not None and now is not None and now != before:
            raise UnrecoverableOOM(
                "OOMBatchSizeReducer: the out-of-memory error came after the optimizer had started to update the "
                f"weights (optimizer.iterations went from {before} to {now}), and no full copy of the state was kept, "
                "so the step cannot be retried without applying part of an update twice."
            )
        for v, value in snap.items:
            v.assign(value)
        self._reset_new_metrics(snap)
        self._refresh()
        return state

    def _iterations_from_small(self, snap: Snapshot) -> int | None:
        it = ki.iterations_variable(getattr(self.model, "optimizer", None))
        for v, value in snap.items:
            if v is it:
                try:
                    import keras

                    return int(keras.ops.convert_to_numpy(value))
                except Exception:
                    return None
        return None

    def finish(self, result, guarded: bool):
        return result

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        return None, None  # TensorFlow and torch cannot tell before running

    # -- running -------------------------------------------------------------
    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if k == 1:
            return self._run_original(batch)
        parts = micro_batches(batch, n, k)
        if self.mode == "split":
            out = None
            for part, _ in parts:
                out = self._run_original(part)
            return out
        return self._run_accumulated(parts, self.totals(parts))

    def totals(self, parts) -> list[float] | None:
        """The whole batch's denominator of each compiled loss, where a loss needs it (masks, weights)."""
        if not self.routing.needs_totals():
            return None
        first = self._measure(parts[0][0])
        self.routing.measured = True
        if not self.routing.needs_totals():
            return None
        return self.routing.totals([first] + [self._measure(part) for part, _ in parts[1:]])

    def _variables_of_apply(self, optimizer, variables):
        if variables is not None:
            return list(variables)
        # apply(grads) without variables: the optimizer's own, in the order it was built with.
        found = ki.optimizer_variables_list(optimizer) or ki.optimizer_variables_list(
            getattr(optimizer, "inner_optimizer", None)
        )
        return found or list(self.model.trainable_variables)

    def _hand(self, grads, variables) -> list[tuple[int, Any]]:
        """``(index, grad)`` of each variable ``train_step`` handed the optimizer; records them."""
        self.applies += 1
        if self.applies > 1:
            raise refusal(
                "train_step applied gradients more than once (a second optimizer, or the same one twice): "
                "one accumulated update per batch cannot reproduce that"
            )
        out = []
        for g, v in zip(grads, self._variables_of_apply(self.model.optimizer, variables)):
            i = self._index.get(id(v))
            if i is None:
                raise refusal(
                    f"train_step applied gradients to {getattr(v, 'path', getattr(v, 'name', v))!r}, which is not "
                    "one of the model's trainable variables"
                )
            self._handed[i] = None
            if g is not None:
                self._got_grad.add(i)
            out.append((i, g))
        return out

    def _applied(self) -> list[tuple[int, bool]]:
        """``(index, has_gradient)`` of the variables to update once, in ``train_step``'s order."""
        return [(i, i in self._got_grad) for i in self._handed]

    @abstractmethod
    def _run_original(self, batch: Any) -> Any:
        """Keras's own step on ``batch``, whole."""

    @abstractmethod
    def _run_accumulated(self, parts: list[tuple[Any, float]], totals: list[float] | None) -> Any:
        """The step on ``parts`` (``(micro-batch, its share)``), one update; ``totals``: :meth:`totals`."""

    @abstractmethod
    def _measure(self, part: Any) -> list[float]:
        """Each compiled loss's denominator on ``part`` (a forward pass, no update)."""

    @abstractmethod
    def _copy_small(self) -> list[Any]:
        """A device copy of each of the small state's variables, in their order."""

    def _reset_accumulator(self) -> None:
        """Empties what a failed attempt accumulated (TensorFlow's accumulators outlive a step)."""
        return None


def concat_outputs(outputs: list) -> Any:
    """Predictions of micro-batches joined along the batch axis, in their structure."""
    import keras

    if len(outputs) == 1:
        return outputs[0]
    return keras.tree.map_structure(lambda *xs: keras.ops.concatenate(list(xs), axis=0), *outputs)


class StatefulEvalRunner(ABC):
    """TensorFlow and torch: one evaluation (``test``) or prediction (``predict``) step, split (an ``EvalRunner``).

    A test step's state is the metrics (a small copy of them puts a failed
    attempt back); a predict step has none. Split, a test step runs the
    model's own ``test_step`` per micro-batch with the compiled losses routed
    (:class:`LossRouting`: the loss the logs show is the whole batch's), and a
    predict step runs Keras's own function per micro-batch and joins the
    outputs. In mode ``split`` a test step runs Keras's own function per
    micro-batch (each micro-batch's loss weighted by its samples).
    """

    def __init__(self, model, kind: str, original: Callable, mode: str = "accumulate"):
        self.model = model
        self.kind = kind
        self.original = original
        self.mode = mode
        self.routing = LossRouting(model)

    @property
    def idle_recoverable(self) -> bool:
        """Whether an out-of-memory error on the idle path (no copy) can be retried: a predict step has no state."""
        return self.kind == "predict"

    def run(self, batch, n: int, k: int, state=None, guarded: bool = False):
        if k == 1:
            return self._run_original(batch)
        parts = micro_batches(batch, n, k)
        if self.kind == "predict":
            return concat_outputs([self._run_original(part) for part, _ in parts])
        if self.mode == "split":
            out = None
            for part, _ in parts:
                out = self._run_original(part)
            return out
        totals = None
        if self.routing.needs_totals():
            first = self._measure(parts[0][0])
            self.routing.measured = True
            if self.routing.needs_totals():
                totals = self.routing.totals([first] + [self._measure(part) for part, _ in parts[1:]])
        logs = None
        for part, w in parts:
            logs = self._micro_test(part, w, totals if totals else [1.0])
        return logs

    def protect(self, state, guarded: bool) -> Snapshot:
        if self.kind == "predict":
            return Snapshot("none", None)

        variables = list(self.model.metrics_variables)
        return Snapshot("small", [(v, self._host(v)) for v in variables])

    def _host(self, v):
        """A host copy of variable ``v``."""
        import keras

        return keras.ops.convert_to_numpy(v.value)

    def restore(self, snap: Snapshot, state):
        if snap.kind == "small":
            import keras

            for v, value in snap.items:
                v.assign(value)
            known = {id(v) for v, _ in snap.items}
            for v in self.model.metrics_variables:  # built by the failed attempt itself (TensorFlow's first trace)
                if id(v) not in known:
                    v.assign(keras.ops.zeros(tuple(v.shape), dtype=v.dtype))
        return state

    def predict(self, batch, n: int, k: int, state) -> tuple[bool | None, int | None]:
        return None, None

    @abstractmethod
    def _run_original(self, batch: Any) -> Any:
        """Keras's own step on ``batch``, whole."""

    @abstractmethod
    def _micro_test(self, part: Any, w: float, totals: list[float]) -> Any:
        """The model's ``test_step`` on micro-batch ``part`` (share ``w``) with its losses routed; its logs."""

    @abstractmethod
    def _measure(self, part: Any) -> list[float]:
        """Each compiled loss's denominator on ``part`` (a forward pass, no update)."""
