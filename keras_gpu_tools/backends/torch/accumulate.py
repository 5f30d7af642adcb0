"""torch gradient-accumulation runners: one batch as micro-batches with one optimizer update.

What ``OOMBatchSizeReducer`` runs a batch with after an out-of-memory error
(the framework-free part is :mod:`keras_gpu_tools.memory.accumulate`): each
micro-batch's gradients are summed into tensors, then applied once.
"""

from __future__ import annotations

from keras_gpu_tools.memory.accumulate import StatefulEvalRunner, StatefulRunner, measure_order
from keras_gpu_tools.runtime import deps
from keras_gpu_tools.runtime import keras_internals as ki


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
    out: list = []
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
