"""MixedPrecisionCheck: warns when training starts if mixed precision is set up wrong."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from keras_gpu_tools.callbacks._lean import LeanCallback
from keras_gpu_tools.mixed_precision.check import (
    MixedPrecisionFinding,
    check_mixed_precision,
    validate_compute_capabilities,
    validate_ignore,
    warn_findings,
)
from keras_gpu_tools.runtime.typing_compat import override

logger = logging.getLogger("keras_gpu_tools")


class MixedPrecisionCheck(LeanCallback):
    """Runs `check_mixed_precision` on the model when training starts.

    In `on_train_begin` (of every `fit()` call) the model being trained is
    checked, and each finding not warned about before by this callback is
    issued as a `MixedPrecisionWarning`: a float16 or bfloat16 output, a
    softmax or sigmoid in float16, float16 without loss scaling, a GPU
    without tensor cores for the dtype, matrix sizes that are not multiples
    of 8. A model computing in float32 gets no warning. The check runs once
    per `fit()`, before the first step, and costs nothing per batch; if it
    fails, that is logged and training goes on.

    The findings of the last check are kept in `findings`.

    Args:
        ignore: kinds of finding not to warn about (see `FINDING_KINDS`),
            e.g. `["tensor_core_alignment"]`. Defaults to `()`.
        compute_capabilities: the `(major, minor)` compute capabilities of
            the GPUs in use, instead of asking NVML. Defaults to `None`.

    Example:

    ```python
    import keras
    from keras_gpu_tools import MixedPrecisionCheck

    keras.mixed_precision.set_dtype_policy("mixed_float16")
    model.fit(x, y, epochs=5, callbacks=[MixedPrecisionCheck()])
    # MixedPrecisionWarning: MixedPrecisionCheck: Output `dense_1` of the
    # model is float16: ...
    ```
    """

    def __init__(
        self,
        ignore: Iterable[str] = (),
        compute_capabilities: Sequence[tuple[int, int]] | None = None,
    ):
        super().__init__()
        self.ignore = sorted(validate_ignore(ignore))
        self.compute_capabilities = validate_compute_capabilities(compute_capabilities)
        self.findings: list[MixedPrecisionFinding] = []
        self._warned: set[MixedPrecisionFinding] = set()

    @override
    def on_train_begin(self, logs: dict | None = None) -> None:
        try:
            self.findings = check_mixed_precision(
                self.model, compute_capabilities=self.compute_capabilities, ignore=self.ignore
            )
        except Exception as e:  # a check must never stop training
            logger.warning("MixedPrecisionCheck: the check failed (%s: %s); training goes on.", type(e).__name__, e)
            self.findings = []
            return
        new = [f for f in self.findings if f not in self._warned]
        self._warned.update(new)
        warn_findings(new, "MixedPrecisionCheck")
