"""check_mixed_precision: one model per finding, a clean model, NVML and arguments."""

import types

import keras
import numpy as np
import pytest

from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput
from keras_gpu_tools.mixed_precision import check as mp
from keras_gpu_tools.mixed_precision.check import (
    FINDING_KINDS,
    check_mixed_precision,
    gpu_compute_capabilities,
)
from keras_gpu_tools.telemetry.nvml import NVML

H100 = [(9, 0)]


@pytest.fixture
def policy():
    old = keras.config.dtype_policy()
    yield keras.config.set_dtype_policy
    keras.config.set_dtype_policy(old)


def _clean_model(**compile_kwargs):
    """The recipe: 16-bit body, sizes multiple of 8, float32 output, loss scaling."""
    model = keras.Sequential(
        [
            keras.Input((256,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, name="logits"),
            MixedPrecisionOutput("softmax", name="probs"),
        ]
    )
    model.compile(keras.optimizers.Adam(), "sparse_categorical_crossentropy", **compile_kwargs)
    return model


def _kinds(findings):
    return [f.kind for f in findings]


@pytest.mark.slow
@pytest.mark.multibackend
@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_clean_model_has_no_findings(policy, name):
    policy(name)
    model = _clean_model()
    assert check_mixed_precision(model, compute_capabilities=H100) == []
    model.fit(np.zeros((8, 256), "float32"), np.zeros(8), epochs=1, verbose=0)
    assert check_mixed_precision(model, compute_capabilities=H100) == []


def test_float32_model_has_no_findings(policy):
    policy("float32")
    model = keras.Sequential([keras.Input((300,)), keras.layers.Dense(1001, activation="softmax")])
    model.compile("adam", "mse", auto_scale_loss=False)
    assert check_mixed_precision(model, compute_capabilities=[(6, 0)]) == []


@pytest.mark.multibackend
@pytest.mark.parametrize("name, dtype", [("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")])
def test_output_not_float32(policy, name, dtype):
    policy(name)
    inputs = keras.Input((64,))
    x = keras.layers.Dense(64, activation="relu")(inputs)
    probs = keras.layers.Dense(10, activation="softmax", name="classes")(x)
    logits = keras.layers.Dense(8, name="regression")(x)
    model = keras.Model(inputs, [probs, logits])
    findings = check_mixed_precision(model, compute_capabilities=H100)
    assert _kinds(findings) == ["output_dtype", "output_dtype"]
    by_layer = {f.layer: f.message for f in findings}
    assert f"Output `classes` of the model is {dtype}" in by_layer["classes"]
    assert "MixedPrecisionOutput('softmax')" in by_layer["classes"] and "activation=None" in by_layer["classes"]
    assert "MixedPrecisionOutput()" in by_layer["regression"]


def test_softmax_in_float16_inside_the_model(policy):
    policy("mixed_float16")
    inputs = keras.Input((64,))
    gate = keras.layers.Dense(64, activation="sigmoid", name="gate")(inputs)
    attention = keras.layers.Softmax(name="weights")(gate)
    x = keras.layers.Multiply()([inputs, attention])
    outputs = MixedPrecisionOutput()(keras.layers.Dense(8)(x))
    model = keras.Model(inputs, outputs)
    findings = check_mixed_precision(model, compute_capabilities=H100)
    assert _kinds(findings) == ["low_precision_activation"] * 2
    assert {f.layer for f in findings} == {"gate", "weights"}
    gate_msg = next(f.message for f in findings if f.layer == "gate")
    assert "sigmoid in float16" in gate_msg and "dtype='float32'" in gate_msg

    # The same under bfloat16 (no underflow) and Keras's own attention softmax: no finding.
    policy("mixed_bfloat16")
    inputs = keras.Input((4, 16))
    x = keras.layers.MultiHeadAttention(2, 8)(inputs, inputs)
    model = keras.Model(inputs, MixedPrecisionOutput()(keras.layers.Dense(8, activation="sigmoid")(x)))
    assert check_mixed_precision(model, compute_capabilities=H100) == []


@pytest.mark.multibackend
def test_float16_without_loss_scaling(policy):
    policy("mixed_float16")
    model = _clean_model(auto_scale_loss=False)
    findings = check_mixed_precision(model, compute_capabilities=H100)
    assert _kinds(findings) == ["no_loss_scaling"]
    assert "auto_scale_loss=False" in findings[0].message and "LossScaleOptimizer" in findings[0].message


def test_float16_layers_in_a_float32_model_get_no_loss_scaling(policy):
    # compile() adds loss scaling only when the *model's* policy is mixed_float16.
    policy("float32")
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, dtype="mixed_float16", name="half"), MixedPrecisionOutput()]
    )
    model.compile("sgd", "mse")
    findings = check_mixed_precision(model, compute_capabilities=H100)
    assert _kinds(findings) == ["no_loss_scaling"]
    assert "`half`" in findings[0].message and "`float32`" in findings[0].message
    model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), "mse")
    assert check_mixed_precision(model, compute_capabilities=H100) == []


@pytest.mark.parametrize(
    "name, capabilities, slow, fast",
    [
        ("mixed_float16", [(6, 1)], "GPU:0 (compute capability 6.1)", None),
        ("mixed_bfloat16", [(8, 0), (7, 5)], "GPU:1 (compute capability 7.5)", "GPU:0"),
    ],
)
def test_gpu_without_tensor_cores(policy, name, capabilities, slow, fast):
    policy(name)
    model = _clean_model()
    findings = check_mixed_precision(model, compute_capabilities=capabilities)
    assert _kinds(findings) == ["no_tensor_cores"]
    assert slow in findings[0].message
    if fast:
        assert fast not in findings[0].message
    # Tensor cores for the dtype: 7.0 runs float16, 8.0 runs bfloat16.
    ok = [(7, 0)] if name == "mixed_float16" else [(8, 0)]
    assert check_mixed_precision(model, compute_capabilities=ok) == []


def test_global_policy_alone_is_checked_against_the_gpus(policy):
    # What `keras-gpu-tools doctor` does: no model.
    policy("mixed_bfloat16")
    findings = check_mixed_precision(compute_capabilities=[(7, 0)])
    assert _kinds(findings) == ["no_tensor_cores"]
    assert "`mixed_bfloat16`" in findings[0].message and "mixed_float16" in findings[0].message
    policy("float32")
    assert check_mixed_precision(compute_capabilities=[(6, 0)]) == []


@pytest.mark.multibackend
def test_sizes_not_multiple_of_8(policy):
    policy("mixed_bfloat16")
    model = keras.Sequential(
        [
            keras.Input((300,)),
            keras.layers.Dense(1000, name="aligned_out"),  # 300 inputs: flagged
            keras.layers.Dense(1001, name="vocab"),  # 1001 units: flagged
            keras.layers.Dense(10, name="small"),  # 10,010 weights: too small to matter
            MixedPrecisionOutput(),
        ]
    )
    findings = check_mixed_precision(model, compute_capabilities=H100)
    assert _kinds(findings) == ["tensor_core_alignment"] * 2
    by_layer = {f.layer: f.message for f in findings}
    assert "input size 300 (pad to 304)" in by_layer["aligned_out"]
    assert "output size 1001 (pad to 1008)" in by_layer["vocab"]


def test_conv_and_recurrent_sizes(policy):
    policy("mixed_float16")
    images = keras.Input((16, 16, 3))
    x = keras.layers.Conv2D(128, 3, name="stem")(images)  # 3 input channels: small kernel, ignored
    x = keras.layers.Conv2D(100, 3, name="conv")(x)  # 100 filters: flagged
    sequence = keras.Input((5, 256))
    y = keras.layers.LSTM(250, name="lstm")(sequence)  # recurrent kernel 250 x 1000: flagged
    outputs = MixedPrecisionOutput()(keras.layers.Concatenate()([keras.layers.GlobalAveragePooling2D()(x), y]))
    model = keras.Model([images, sequence], outputs)
    findings = check_mixed_precision(model, compute_capabilities=H100)
    assert [(f.kind, f.layer) for f in findings] == [
        ("tensor_core_alignment", "conv"),
        ("tensor_core_alignment", "lstm_cell"),
    ]
    assert "output channels 100 (pad to 104)" in findings[0].message
    assert "recurrent_kernel input size 250 (pad to 256)" in findings[1].message
    assert "input size 256" not in findings[1].message


def test_ignore(policy):
    policy("mixed_float16")
    model = keras.Sequential([keras.Input((300,)), keras.layers.Dense(1000, activation="softmax")])
    model.compile("adam", "mse", auto_scale_loss=False)
    everything = check_mixed_precision(model, compute_capabilities=[(6, 0)])
    assert set(_kinds(everything)) == {"output_dtype", "no_loss_scaling", "no_tensor_cores", "tensor_core_alignment"}
    assert check_mixed_precision(model, compute_capabilities=[(6, 0)], ignore=FINDING_KINDS) == []


def _fake_pynvml(capability=None, fail_init=False):
    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    def init():
        if fail_init:
            raise NVMLError(9)  # driver not loaded

    def mig_mode(handle):
        raise NVMLError(3)  # not supported

    return types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUUID=lambda h: "GPU-11111111-2222-3333-4444-555555555555",
        nvmlDeviceGetName=lambda h: "Tesla P100",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=16 * 2**30),
        nvmlDeviceGetCudaComputeCapability=lambda h: capability,
        nvmlDeviceGetMigMode=mig_mode,
    )


def test_compute_capabilities_from_nvml(policy, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml = NVML(module=_fake_pynvml(capability=(6, 0)))
    assert gpu_compute_capabilities(nvml) == [(6, 0)]
    monkeypatch.setattr(mp, "gpu_compute_capabilities", lambda nvml=None: [(6, 0)])
    policy("mixed_float16")
    assert _kinds(check_mixed_precision(_clean_model())) == ["no_tensor_cores"]


def test_no_gpu_findings_without_nvml(policy):
    assert gpu_compute_capabilities(NVML(module=_fake_pynvml(fail_init=True))) == []
    policy("mixed_bfloat16")
    findings = check_mixed_precision(_clean_model(), compute_capabilities=[])
    assert findings == []


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"model": "model"}, TypeError, ["`model`", "'model'"]),
        ({"ignore": "output_dtype"}, TypeError, ["`ignore`", "'output_dtype'"]),
        ({"ignore": ["output_dtypes"]}, ValueError, ["`ignore`", "'output_dtypes'", "tensor_core_alignment"]),
        ({"compute_capabilities": "8.0"}, TypeError, ["`compute_capabilities`", "'8.0'"]),
        ({"compute_capabilities": [8.0]}, ValueError, ["`compute_capabilities`", "8.0", "(major, minor)"]),
        ({"compute_capabilities": [(8, -1)]}, ValueError, ["`compute_capabilities`", "(8, -1)"]),
    ],
)
def test_bad_arguments(kwargs, error, words):
    with pytest.raises(error) as info:
        check_mixed_precision(**kwargs)
    for w in words:
        assert w in str(info.value)
