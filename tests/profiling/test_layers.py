"""Op names to Keras layer paths, and rows from op times: the forms each framework writes, without a model fit."""

import pytest

from keras_gpu_tools.profiling.layers import (
    OUTSIDE,
    LayerNode,
    Matcher,
    OpTime,
    attribute,
    scope_segments,
    segments_of,
)


def tree():
    inner = LayerNode("inner", "inner", 1, (LayerNode("small", "inner/small"),))
    kids = (
        LayerNode("heavy", "heavy"),
        LayerNode("dense", "dense"),
        LayerNode("dense_1", "dense_1"),
        LayerNode("shared", "shared", 2),
        inner,
    )
    return LayerNode("net", "", 1, kids)


@pytest.mark.parametrize(
    "op, path",
    [
        ("net_1/heavy_1/MatMul", "heavy"),  # TensorFlow with XLA (HLO metadata)
        ("StatefulPartitionedCall/gradient_tape/net_1/heavy_1/MatMul/MatMul:_MklMatMul", "heavy"),  # without
        ("gradient_tape/net_1/inner_1/small_1/MatMul/MatMul", "inner/small"),
        ("jit(one_step_on_data)/jit(main)/net/heavy/dot_general", "heavy"),  # JAX forward
        ("jit(one_step_on_data)/transpose(jvp(net))/inner/small/dot_general", "inner/small"),  # JAX backward
        ("net/dense_1/MatMul", "dense_1"),  # an exact name before another layer's unique scope
        ("net_1/dense_2/MatMul", "dense"),
        ("adam/Sub_2", None),  # the optimizer: in no layer
        ("net_1/Add", None),
    ],
)
def test_op_names_of_each_framework_find_their_layer(op, path):
    assert Matcher(tree()).match(op)[0] == path


def test_tensorflow_unique_scopes_are_read_as_the_trace_writes_them():
    """TensorFlow named the scope of layer `dense` "dense_1", and layer `dense_1`'s "dense_1_1"."""
    ops = ["sequential_1/dense_1/MatMul", "sequential_1/dense_1_1/MatMul"]
    matcher = Matcher(tree(), segments_of(ops))
    assert [matcher.match(op)[0] for op in ops] == ["dense", "dense_1"]


def test_scope_segments_take_off_jax_wrappers():
    assert scope_segments("jit(f)/transpose(jvp(net))/heavy/dot_general:Dot") == [
        "f",
        "net",
        "heavy",
        "dot_general",
    ]


def test_rows_add_forward_and_backward_and_count_tensorflow_calls_by_scope():
    ops = [
        OpTime("net_1/heavy_1/MatMul", 6_000_000_000),
        OpTime("gradient_tape/net_1/heavy_1/MatMul/MatMul", 2_000_000_000, backward=True),
        OpTime("net_1/shared_1/MatMul", 500_000_000),
        OpTime("net_1/shared_3/MatMul", 500_000_000),
        OpTime("adam/Mul", 1_000_000_000),
    ]
    rows, total = attribute(ops, tree(), steps=2)
    by = {r.path: r for r in rows}
    assert [r.path for r in rows] == ["heavy", OUTSIDE, "shared"]
    assert by["heavy"].ms_per_step == pytest.approx(4.0)
    assert (by["heavy"].forward_ms, by["heavy"].backward_ms) == (pytest.approx(3.0), pytest.approx(1.0))
    assert by["heavy"].share == pytest.approx(0.8)
    assert by["shared"].calls == 2 and by["heavy"].calls == 1 and by[OUTSIDE].calls == 0
    assert total == pytest.approx(5.0)


def test_with_steps_known_a_stalled_step_moves_no_row():
    ms = 1_000_000_000
    ops = [OpTime("", 4 * ms, path="heavy", resolved=True, step=s) for s in range(5)]
    ops += [OpTime("", ms, path="inner/small", resolved=True, step=s) for s in range(5)]
    ops.append(OpTime("", 50 * ms, path="inner/small", resolved=True, step=2))  # one stall
    ops.append(OpTime("", 99 * ms, path="heavy", resolved=True, step=None))  # outside the profiled steps
    rows, total = attribute(ops, tree(), steps=5, calls={"heavy": 1, "inner/small": 3})
    by = {r.path: r for r in rows}
    assert by["heavy"].ms_per_step == pytest.approx(4.0) and by["inner/small"].ms_per_step == pytest.approx(1.0)
    assert by["heavy"].share == pytest.approx(0.8) and total == pytest.approx(5.0)
    assert by["inner/small"].calls == 3
