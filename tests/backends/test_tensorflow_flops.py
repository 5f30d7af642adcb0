"""Counting the dots and convolutions of XLA HLO text (TensorFlow's jit-compiled step), dead code left out."""

from keras_gpu_tools.backends.tensorflow.flops import hlo_flops

HLO = """
HloModule a_inference_step, entry_computation_layout={(f32[16,8]{1,0}, f32[8,4]{1,0})->(f32[16,4]{1,0})}

%add.1 (x.1: f32[], y.1: f32[]) -> f32[] {
  %x.1 = f32[] parameter(0)
  %y.1 = f32[] parameter(1)
  ROOT %add.2 = f32[] add(f32[] %x.1, f32[] %y.1)
}

ENTRY %main.9 (arg0.1: f32[16,8], arg1.1: f32[8,4], arg2.1: f32[16,6,6,3], arg3.1: f32[3,3,3,5]) -> (f32[16,4], f32[16,4,4,5]) {
  %arg0.1 = f32[16,8]{1,0} parameter(0)
  %arg1.1 = f32[8,4]{1,0} parameter(1)
  %arg2.1 = f32[16,6,6,3]{3,2,1,0} parameter(2)
  %arg3.1 = f32[3,3,3,5]{3,2,1,0} parameter(3)
  %dot.3 = f32[16,4]{1,0} dot(f32[16,8]{1,0} %arg0.1, f32[8,4]{1,0} %arg1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %dot.4 = f32[8,8]{1,0} dot(%arg0.1, %arg0.1), lhs_contracting_dims={0}, rhs_contracting_dims={0}
  %unused.5 = f32[8,8]{1,0} negate(f32[8,8]{1,0} %dot.4)
  %convolution.6 = f32[16,4,4,5]{3,2,1,0} convolution(f32[16,6,6,3]{3,2,1,0} %arg2.1, f32[3,3,3,5]{3,2,1,0} %arg3.1), window={size=3x3}, dim_labels=b01f_01io->b01f
  ROOT %tuple.7 = (f32[16,4]{1,0}, f32[16,4,4,5]{3,2,1,0}) tuple(f32[16,4]{1,0} %dot.3, f32[16,4,4,5]{3,2,1,0} %convolution.6)
}
"""


def test_dots_and_convolutions_that_reach_the_root_count():
    dot = 2 * 16 * 4 * 8  # 2 x output elements x contracted size
    conv = 2 * (16 * 4 * 4 * 5) * (3 * 3 * 3)  # 2 x output elements x window x input features
    # %dot.4 (operands named without shapes) feeds only a dead negate: XLA removes it, so it counts nothing.
    assert hlo_flops(HLO) == dot + conv


def test_a_live_dot_whose_operands_are_named_without_shapes_counts():
    live = HLO.replace("tuple(f32[16,4]{1,0} %dot.3,", "tuple(f32[8,8]{1,0} %unused.5,").replace(
        "-> (f32[16,4], f32[16,4,4,5])", "-> (f32[8,8], f32[16,4,4,5])"
    )
    assert hlo_flops(live) == 2 * 8 * 8 * 16 + 2 * (16 * 4 * 4 * 5) * 27


def test_text_without_instructions_counts_nothing():
    assert hlo_flops("") == 0.0
    assert hlo_flops("HloModule m\n") == 0.0


def test_the_graph_count_reads_the_fits_own_trace_of_those_shapes_and_traces_anew_for_others(monkeypatch):
    import numpy as np
    import pytest

    from tests.helpers.models import BACKEND

    if BACKEND != "tensorflow":
        pytest.skip("TensorFlow's traced step")
    import keras
    import tensorflow as tf

    from keras_gpu_tools.backends.tensorflow.flops import op_flops
    from keras_gpu_tools.runtime import keras_internals as ki

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile("sgd", "mse")
    model.fit(np.zeros((16, 8), "float32"), np.zeros((16, 4), "float32"), batch_size=16, epochs=1, verbose=0)
    function = ki.tf_step_function(model.train_function)
    traces = function.experimental_get_tracing_count()

    def specs(n):
        return tf.TensorSpec((n, 8), tf.float32), tf.TensorSpec((n, 4), tf.float32)

    def hand(n):  # the forward matmul and the kernel's gradient (no input gradient is needed)
        return 2 * n * 8 * 4 * 2

    with monkeypatch.context() as m:
        m.setattr(tf, "function", lambda *a, **k: pytest.fail("traced anew though the fit traced these shapes"))
        assert sum(f for _, f in op_flops(function, specs(16))) == hand(16)
    assert sum(f for _, f in op_flops(function, specs(32))) == hand(32)  # shapes the fit never ran: a new trace
    assert function.experimental_get_tracing_count() == traces  # Keras's own function keeps its traces
