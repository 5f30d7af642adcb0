"""Checks a Keras model for the usual ways mixed precision goes wrong.

:func:`check_mixed_precision` returns a list of :class:`MixedPrecisionFinding`,
one per problem, each naming the layer (or GPU) and saying what to change. It is
used by the `MixedPrecisionCheck` callback and by `keras-gpu-tools doctor`.

Keras is imported inside the functions, never at module level, and only once a
model (or the global policy) is being checked. GPU compute capabilities come
from NVML; they can be passed in instead, so the GPU findings are tested
without a GPU. Without NVML or a GPU those findings are simply not produced.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from keras_gpu_tools.errors import MixedPrecisionWarning
from keras_gpu_tools.runtime.validation import check_choices, check_pairs

logger = logging.getLogger("keras_gpu_tools")

# The kinds of finding, in the order they are reported.
OUTPUT_DTYPE = "output_dtype"
LOW_PRECISION_ACTIVATION = "low_precision_activation"
NO_LOSS_SCALING = "no_loss_scaling"
NO_TENSOR_CORES = "no_tensor_cores"
TENSOR_CORE_ALIGNMENT = "tensor_core_alignment"
FINDING_KINDS = (OUTPUT_DTYPE, LOW_PRECISION_ACTIVATION, NO_LOSS_SCALING, NO_TENSOR_CORES, TENSOR_CORE_ALIGNMENT)

LOW_PRECISION_DTYPES = ("float16", "bfloat16")
# Lowest compute capability whose tensor cores run the dtype (Volta: float16,
# Ampere: bfloat16). Below it the 16-bit math is emulated or runs on the
# ordinary cores, and mixed precision brings little or nothing.
MIN_COMPUTE_CAPABILITY = {"float16": (7, 0), "bfloat16": (8, 0)}
# Matrix sizes that are multiples of this keep float16/bfloat16 tensor cores busy.
TENSOR_CORE_MULTIPLE = 8
# Kernels with fewer weights than this are left out of the alignment check:
# their matrix products are too small for tensor cores to matter (a
# classifier's last Dense with 10 or 1 units, the first convolution of an RGB
# image), and flagging them would bury the findings that do matter.
MIN_ALIGNMENT_KERNEL_SIZE = 65536
_FLOAT16_TINY = 6e-8  # smallest positive float16 (subnormal): 2**-24

# Activations that lose their small values (or their values near 1) in float16.
_SATURATING_ACTIVATIONS = ("softmax", "sigmoid")
# Variables that are the weight matrix of a matrix product or convolution.
_KERNEL_ATTRIBUTES = ("kernel", "recurrent_kernel", "pointwise_kernel")

ComputeCapability = tuple[int, int]


@dataclass(frozen=True)
class MixedPrecisionFinding:
    """One problem found by `check_mixed_precision`.

    Attributes:
        kind: what was found, one of `FINDING_KINDS`: `"output_dtype"`,
            `"low_precision_activation"`, `"no_loss_scaling"`,
            `"no_tensor_cores"`, `"tensor_core_alignment"`.
        message: what is wrong and what to change.
        layer: the name of the layer concerned, or None where the finding is
            about the model's optimizer or the GPU.
    """

    kind: str
    message: str
    layer: str | None = None

    def __str__(self) -> str:
        return self.message


def check_mixed_precision(
    model: Any = None,
    *,
    compute_capabilities: Sequence[ComputeCapability] | None = None,
    ignore: Iterable[str] = (),
) -> list[MixedPrecisionFinding]:
    """Finds what keeps a model from training well under mixed precision.

    Which precision the model runs in is read from its layers' dtype policies
    (not from the global policy, which may have changed since the model was
    built or loaded). A model whose layers all compute in float32 gets no
    finding. Otherwise the check reports:

    - `"output_dtype"`: a model output is float16 or bfloat16 (functional and
      Sequential models; a subclassed model's outputs are not known before it
      runs). Softmax or sigmoid probabilities in float16 lose everything below
      6e-8 and large logits overflow past 65504.
    - `"low_precision_activation"`: a softmax or sigmoid runs in float16
      inside the model (a `Dense(..., activation="sigmoid")` gate, a
      `Softmax` layer). Sublayers of Keras's own layers (the softmax inside
      `MultiHeadAttention`) are left out: they are Keras's choice, not yours.
    - `"no_loss_scaling"`: a layer computes in float16 and the compiled
      optimizer is not a `keras.optimizers.LossScaleOptimizer` (compiled with
      `auto_scale_loss=False`, or the model's own policy is not
      `mixed_float16` so `compile()` did not wrap it). Small gradients then
      flush to zero. Not checked before `compile()`.
    - `"no_tensor_cores"`: a GPU the process uses has no tensor cores for the
      dtype (compute capability below 7.0 for float16, below 8.0 for
      bfloat16), so mixed precision brings little or is slower.
    - `"tensor_core_alignment"`: a layer computing in 16 bits multiplies
      matrices whose sizes (units, filters, input features, vocabulary) are
      not multiples of 8, which leaves tensor cores idle. Kernels with fewer
      than 65,536 weights are left out.

    Args:
        model: the Keras model (or layer) to check, built or not; None checks
            the global dtype policy against the GPUs only. Defaults to `None`.
        compute_capabilities: the compute capabilities of the GPUs the process
            uses, as `(major, minor)` pairs in the framework's order, instead
            of asking NVML. Defaults to `None` (NVML; no GPU finding where it
            is unavailable).
        ignore: kinds of finding to leave out, from `FINDING_KINDS`. Defaults
            to `()`.

    Returns:
        A list of `MixedPrecisionFinding`, empty when nothing was found.

    Example:

    ```python
    import keras
    from keras_gpu_tools import check_mixed_precision

    keras.mixed_precision.set_dtype_policy("mixed_float16")
    model = keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    for finding in check_mixed_precision(model):
        print(finding)
    # Output `dense_1` of the model is float16: ...
    ```
    """
    ignored = validate_ignore(ignore)
    capabilities = validate_compute_capabilities(compute_capabilities)
    import keras

    if model is not None and not isinstance(model, keras.layers.Layer):
        raise TypeError(
            "Invalid value for argument `model`. "
            f"Received: model={model!r} of type {type(model).__name__}. "
            "Expected a Keras model or layer, or None to check the global dtype policy."
        )
    if model is None:
        policy = keras.config.dtype_policy()
        dtypes = {policy.compute_dtype} & set(LOW_PRECISION_DTYPES)
        policy_findings = _gpu_findings(dtypes, capabilities, f"The global dtype policy `{policy.name}`")
        return [f for f in policy_findings if f.kind not in ignored]

    layers = _all_layers(model)
    dtypes = {_compute_dtype(layer) for layer in layers} & set(LOW_PRECISION_DTYPES)
    if not dtypes:
        return []
    findings: list[MixedPrecisionFinding] = []
    output_layers = set()  # their activation is part of the output finding
    for finding, layer in _output_findings(model):
        output_layers.add(id(layer))
        if OUTPUT_DTYPE not in ignored:
            findings.append(finding)
    if LOW_PRECISION_ACTIVATION not in ignored:
        findings += _activation_findings(model, skip=output_layers)
    if NO_LOSS_SCALING not in ignored and "float16" in dtypes:
        findings += _loss_scaling_findings(model, layers)
    if NO_TENSOR_CORES not in ignored:
        findings += _gpu_findings(dtypes, capabilities, f"Model `{model.name}`")
    if TENSOR_CORE_ALIGNMENT not in ignored:
        findings += _alignment_findings(layers)
    return findings


def warn_findings(findings: Sequence[MixedPrecisionFinding], source: str, stacklevel: int = 2) -> None:
    """Issues one `MixedPrecisionWarning` per finding, prefixed by `source`."""
    for f in findings:
        warnings.warn(f"{source}: {f.message}", MixedPrecisionWarning, stacklevel=stacklevel + 1)


def gpu_compute_capabilities(nvml=None) -> list[ComputeCapability]:
    """Compute capabilities of the GPUs this process can use, from NVML.

    Empty where NVML, its driver or a GPU is missing: never raises.
    """
    from keras_gpu_tools.telemetry.devices import visible_gpus
    from keras_gpu_tools.telemetry.nvml import default_nvml

    try:
        gpus = visible_gpus(nvml or default_nvml())
    except Exception as e:  # NVMLUnavailable, a broken driver: no GPU findings
        logger.debug("mixed precision check: no compute capabilities from NVML (%s)", e)
        return []
    return [tuple(g.compute_capability) for g in gpus if g.compute_capability]


# -- argument checks (shared with the callback) ----------------------------------
def validate_ignore(ignore) -> frozenset:
    return frozenset(check_choices("ignore", ignore, FINDING_KINDS))


def validate_compute_capabilities(capabilities) -> list[ComputeCapability] | None:
    return check_pairs("compute_capabilities", capabilities, fields=("major", "minor"), lows=(0, 0), allow_none=True)


# -- walking the model ----------------------------------------------------------
def _sublayers(layer) -> list:
    """The layers directly inside `layer` (Keras 3 tracks them in `_flatten_layers`)."""
    flatten = getattr(layer, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=False, recursive=False))
    return list(getattr(layer, "layers", None) or [])  # models, should the internal go


def _walk(model, descend) -> list:
    """`model` and the layers inside it, depth first, entering those `descend` accepts."""
    out, stack, seen = [], [model], set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        out.append(layer)
        if layer is model or descend(layer):
            stack.extend(reversed(_sublayers(layer)))
    return out


def _all_layers(model) -> list:
    """The model and every layer inside it, at any depth."""
    return _walk(model, lambda layer: True)


def _user_layers(model) -> list:
    """Layers the user placed: the walk does not enter Keras's own composite layers."""
    return _walk(model, lambda layer: not _is_keras_builtin(layer) or _is_model(layer))


def _is_keras_builtin(layer) -> bool:
    return type(layer).__module__.split(".", 1)[0] == "keras"


def _is_model(layer) -> bool:
    import keras

    return isinstance(layer, keras.Model)


def _compute_dtype(layer) -> str | None:
    import keras

    if isinstance(layer, keras.layers.InputLayer):
        return None
    policy = getattr(layer, "dtype_policy", None)
    return getattr(policy, "compute_dtype", None)


def _describe(layer) -> str:
    return f"{type(layer).__name__} `{layer.name}`"


def _activation_name(layer) -> str | None:
    """'softmax' or 'sigmoid' where the layer ends in one, else None."""
    import keras

    if isinstance(layer, keras.layers.Softmax):
        return "softmax"
    fn = getattr(layer, "activation", None)
    name = getattr(fn, "__name__", None)
    return name if name in _SATURATING_ACTIVATIONS else None


# -- the findings -----------------------------------------------------------------
def _output_findings(model):
    import keras

    try:
        outputs = list(model.outputs)
    except (AttributeError, ValueError, TypeError):
        return []  # subclassed or unbuilt: the outputs are not known before a call
    out = []
    for i, tensor in enumerate(outputs):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if dtype not in LOW_PRECISION_DTYPES:
            continue
        history = getattr(tensor, "_keras_history", None)
        layer = history[0] if history is not None else None
        name = layer.name if layer is not None else f"#{i}"
        activation = _activation_name(layer) if layer is not None else None
        where = f"Output `{name}` of the model is {dtype}"
        if activation and dtype == "float16":
            why = (
                f"its {activation} runs in float16, which rounds probabilities below {_FLOAT16_TINY:g} to 0 "
                "(their log is -inf) and turns logits beyond 65504 into inf and NaN."
            )
        elif activation:
            why = f"its {activation} runs in bfloat16, whose 8-bit mantissa rounds the probabilities to 2-3 digits."
        else:
            why = f"{dtype} outputs are rounded to {'3' if dtype == 'float16' else '2-3'} significant digits" + (
                " and overflow past 65504." if dtype == "float16" else "."
            )
        if activation and hasattr(layer, "units"):
            fix = (
                f"Make {_describe(layer)} linear (`activation=None`) and add "
                f"`MixedPrecisionOutput({activation!r})` after it"
            )
        elif activation:
            fix = f"Replace {_describe(layer)} by `MixedPrecisionOutput({activation!r})`"
        else:
            fix = (
                f"Add `MixedPrecisionOutput()` after {_describe(layer) if layer is not None else 'it'} "
                "(or the activation it needs: `MixedPrecisionOutput('softmax')`)"
            )
        message = (
            f"{where}: {why} {fix} (from keras_gpu_tools.layers), "
            "which computes in float32 under any policy, or give the layer `dtype='float32'`."
        )
        out.append((MixedPrecisionFinding(OUTPUT_DTYPE, message, name), layer))
    return out


def _activation_findings(model, skip) -> list[MixedPrecisionFinding]:
    out = []
    for layer in _user_layers(model):
        if id(layer) in skip or layer is model or _compute_dtype(layer) != "float16":
            continue
        activation = _activation_name(layer)
        if activation is None:
            continue
        message = (
            f"{_describe(layer)} computes {activation} in float16: values below {_FLOAT16_TINY:g} become 0"
            + (" and values within 5e-4 of 1 become 1" if activation == "sigmoid" else "")
            + ", so a log or a division after it gives inf or NaN. If its result feeds a log, a "
            "division or a loss, give the layer `dtype='float32'` (or compute the activation in "
            "`MixedPrecisionOutput`); if it is a gate or attention weights multiplied into features, "
            f"this is usually harmless: pass `ignore=[{LOW_PRECISION_ACTIVATION!r}]`."
        )
        out.append(MixedPrecisionFinding(LOW_PRECISION_ACTIVATION, message, layer.name))
    return out


def _loss_scaling_findings(model, layers) -> list[MixedPrecisionFinding]:
    import keras

    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return []
    float16 = [layer.name for layer in layers if layer is not model and _compute_dtype(layer) == "float16"]
    policy = getattr(getattr(model, "dtype_policy", None), "name", None)
    if policy == "mixed_float16":
        cause = "was compiled with `auto_scale_loss=False`"
    else:
        cause = (
            f"has the dtype policy `{policy}`, so `compile()` did not add loss scaling (it does so only "
            "for a model whose own policy is `mixed_float16`)"
        )
    shown = ", ".join(f"`{n}`" for n in float16[:3]) + (f" and {len(float16) - 3} more" if len(float16) > 3 else "")
    message = (
        f"Model `{model.name}` computes in float16 (layers {shown}) but its optimizer "
        f"`{type(optimizer).__name__}` does not scale the loss: the model {cause}. Gradients below "
        f"{_FLOAT16_TINY:g} flush to zero in float16. Compile with `auto_scale_loss=True` under "
        "`keras.mixed_precision.set_dtype_policy('mixed_float16')`, or wrap the optimizer: "
        "`keras.optimizers.LossScaleOptimizer(optimizer)`. If your own train step scales the loss, "
        f"pass `ignore=[{NO_LOSS_SCALING!r}]`."
    )
    return [MixedPrecisionFinding(NO_LOSS_SCALING, message, None)]


def _gpu_findings(dtypes, capabilities, subject: str) -> list[MixedPrecisionFinding]:
    if not dtypes:
        return []
    if capabilities is None:
        capabilities = gpu_compute_capabilities()
    out = []
    for dtype in sorted(dtypes):
        need = MIN_COMPUTE_CAPABILITY[dtype]
        slow = [(i, cc) for i, cc in enumerate(capabilities) if tuple(cc) < need]
        if not slow:
            continue
        gpus = ", ".join(f"GPU:{i} (compute capability {cc[0]}.{cc[1]})" for i, cc in slow)
        if dtype == "bfloat16":
            fix = (
                "Use `mixed_float16` there (tensor cores from compute capability 7.0, with loss scaling) or float32."
                if any(tuple(cc) >= MIN_COMPUTE_CAPABILITY["float16"] for _, cc in slow)
                else "Use float32: `keras.mixed_precision.set_dtype_policy('float32')`."
            )
        else:
            fix = "Use float32: `keras.mixed_precision.set_dtype_policy('float32')`."
        message = (
            f"{subject} computes in {dtype}, but {gpus} has no tensor cores for {dtype} (they need "
            f"compute capability {need[0]}.{need[1]} or later): {dtype} math there is emulated or no "
            f"faster than float32, so mixed precision costs accuracy for little or no speed. {fix}"
        )
        out.append(MixedPrecisionFinding(NO_TENSOR_CORES, message, None))
    return out


def _matmul_sizes(layer, kernel) -> Sequence[tuple[str, int]] | None:
    """(what, size) of the matrix dimensions a kernel multiplies, or None."""
    import keras

    shape = tuple(int(d) for d in kernel.shape)
    if len(shape) == 2:
        return [("input size", shape[0]), ("output size", shape[1])]
    if len(shape) < 2 or isinstance(layer, keras.layers.EinsumDense):
        return None  # an einsum's contracted size is a product of axes: not read here
    return [("input channels", shape[-2]), ("output channels", shape[-1])]  # convolutions


def _alignment_findings(layers) -> list[MixedPrecisionFinding]:
    import keras

    depthwise = tuple(
        c for c in (getattr(keras.layers, n, None) for n in ("DepthwiseConv1D", "DepthwiseConv2D")) if c is not None
    )
    out = []
    for layer in layers:
        if _compute_dtype(layer) not in LOW_PRECISION_DTYPES or not getattr(layer, "built", False):
            continue
        if depthwise and isinstance(layer, depthwise):
            continue  # per-channel products: no tensor cores either way
        problems = []
        for attr in _KERNEL_ATTRIBUTES:
            try:
                kernel = getattr(layer, attr, None)
            except Exception:  # a property of a half-built or quantized layer
                kernel = None
            shape = getattr(kernel, "shape", None)
            if shape is None or None in tuple(shape):
                continue
            size = 1
            for d in shape:
                size *= int(d)
            sizes = _matmul_sizes(layer, kernel)
            if not sizes or size < MIN_ALIGNMENT_KERNEL_SIZE:
                continue
            for what, n in sizes:
                if n % TENSOR_CORE_MULTIPLE:
                    padded = -(-n // TENSOR_CORE_MULTIPLE) * TENSOR_CORE_MULTIPLE
                    prefix = "" if attr == "kernel" else f"{attr} "
                    problems.append(f"{prefix}{what} {n} (pad to {padded})")
        if problems:
            message = (
                f"{_describe(layer)} computes in {_compute_dtype(layer)} with matrix sizes that are not "
                f"multiples of {TENSOR_CORE_MULTIPLE}: {', '.join(problems)}. Tensor cores then run padded "
                f"or not at all. Make units, filters and input features multiples of {TENSOR_CORE_MULTIPLE} "
                "(pad a vocabulary or a feature vector with unused entries)."
            )
            out.append(MixedPrecisionFinding(TENSOR_CORE_ALIGNMENT, message, layer.name))
    return out
