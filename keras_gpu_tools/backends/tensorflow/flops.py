"""The FLOPs of one TensorFlow training step, counted from the step's own program.

Two sources, by how the step is compiled:

- ``jit_compile=True``: the step's HLO as XLA receives it
  (``experimental_get_compiler_ir(...)(stage="hlo")``, before optimisation,
  so no matmul is hidden in a cuBLAS custom call yet): every ``dot`` and
  ``convolution`` of every computation.
- otherwise: the ``MatMul``, ``BatchMatMul``, ``Einsum`` and convolution ops
  (forward and their gradients) of the step's traced graph, with their static
  shapes, nested function bodies included (a ``While`` body times its trip
  count where the graph fixes it, else once; an ``If`` its costlier branch).
  The HLO counts a loop's body once, so a step with such a loop (a Keras RNN)
  is counted from its graph even when jit-compiled.

Both read the graph that the fit traced for the batch's exact shapes, else
trace Keras's per-batch step function afresh as a new ``tf.function`` for
them: nothing runs, no variable changes and Keras's own function keeps its
traces. The count is the one MFU conventionally uses,
``2 * M * N * K`` per matmul and ``2 * output elements * kernel window * input
features per group`` per convolution; elementwise work and the optimizer's
update are left out. Results are kept per step function and batch shapes.
"""

from __future__ import annotations

import re
import weakref
from typing import Any

XLA_SOURCE = "XLA HLO of the jit-compiled step (dot and convolution FLOPs)"
GRAPH_SOURCE = "traced TensorFlow graph of the step (MatMul, BatchMatMul, Einsum and convolution FLOPs)"
LOOP_NOTE = ", its loops times their trip counts (XLA's HLO would count a loop's body once)"

_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, tuple[float | None, str]]] = weakref.WeakKeyDictionary()


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


# -- XLA HLO text --------------------------------------------------------------------------
# `%name = f32[16,64]{1,0} dot(f32[16,8]{1,0} %a, f32[8,64]{1,0} %b), lhs_contracting_dims={1}, ...`
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY_RESULT = re.compile(r"^[a-z]\w*\[([\d,]*)\]\S*\s+([\w\-]+)\((.*)$")  # not a tuple
_OPERAND = re.compile(r"(?:[a-z]\w*\[([\d,]*)\]\S*\s+)?%([\w.\-]+)")


def _dims(text: str) -> list[int]:
    return [int(d) for d in text.split(",") if d]


def _live(refs: dict[str, list[str]], roots: list[str]) -> set[str]:
    """The instructions the roots depend on: a result nothing uses (a gradient no one needs) is never computed."""
    live: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name in live or name not in refs:
            continue
        live.add(name)
        stack.extend(refs[name])
    return live


def hlo_flops(hlo_text: str) -> float:
    """Dot and convolution FLOPs of an HLO module's text (every computation, each counted once).

    ``dot``: ``2 * output elements * contracted size``; ``convolution``:
    ``2 * output elements * kernel elements / output features`` (the window
    times the input features per group, padding positions included). An
    instruction whose result does not reach its computation's root is dead
    code that XLA removes, and counts nothing.
    """
    shapes: dict[str, list[int]] = {}
    refs: dict[str, list[str]] = {}
    roots: list[str] = []
    costly: list[tuple[str, str, list[int], str]] = []
    for line in hlo_text.splitlines():
        m = _INSTRUCTION.match(line)
        if m is None:
            continue
        name, rest = m.groups()
        refs[name] = re.findall(r"%([\w.\-]+)", rest)
        if line.lstrip().startswith("ROOT"):
            roots.append(name)
        typed = _ARRAY_RESULT.match(rest)
        if typed is None:
            continue
        out_text, opcode, rest = typed.groups()
        out = _dims(out_text)
        shapes[name] = out
        if opcode in ("dot", "convolution"):
            costly.append((name, opcode, out, rest))
    live = _live(refs, roots) if roots else set(refs)
    total = 0.0
    for name, opcode, out, rest in costly:
        if name not in live:
            continue
        args, _, attrs = rest.partition(")")
        operands = []
        for shape_text, ref in _OPERAND.findall(args):
            operands.append(_dims(shape_text) if shape_text else shapes.get(ref))
        if len(operands) < 2 or operands[0] is None or operands[1] is None:
            continue
        lhs, rhs = operands[0], operands[1]
        if opcode == "dot":
            found = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
            contract = _dims(found.group(1)) if found else []
            total += 2.0 * _prod(out) * _prod(lhs[i] for i in contract)
        else:
            labels = re.search(r"dim_labels=\w+_(\w+)->", attrs)
            o = labels.group(1).find("o") if labels else len(rhs) - 1
            if 0 <= o < len(rhs) and rhs[o]:
                total += 2.0 * _prod(out) * _prod(rhs) / rhs[o]
    return total


# -- a traced graph --------------------------------------------------------------------------
_MATMULS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")
_CONV_FORWARD = ("Conv", "Conv2D", "Conv3D", "DepthwiseConv2dNative")
_CONV_INPUT_GRAD = ("Conv2DBackpropInput", "Conv3DBackpropInputV2", "DepthwiseConv2dNativeBackpropInput")
_CONV_FILTER_GRAD = ("Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter")


def _shape(tensor) -> list[int] | None:
    dims = tensor.shape.as_list() if tensor.shape.rank is not None else None
    return None if dims is None or any(d is None for d in dims) else dims


def _matmul_flops(op) -> float:
    a, out = _shape(op.inputs[0]), _shape(op.outputs[0])
    if a is None or out is None:
        return 0.0
    adjoint = op.get_attr("transpose_a") if op.type == "MatMul" else op.get_attr("adj_x")
    k = a[-2] if adjoint else a[-1]
    return 2.0 * _prod(out) * k


def _einsum_flops(op) -> float:
    if len(op.inputs) != 2:
        return 0.0  # a transpose or a reduction
    equation = op.get_attr("equation").decode().replace(" ", "")
    inputs, _, _ = equation.partition("->")
    sizes: dict[str, int] = {}
    for labels, tensor in zip(inputs.split(","), op.inputs):
        dims = _shape(tensor)
        if dims is None or "." in labels or len(labels) != len(dims):
            return 0.0
        sizes.update(zip(labels, dims))
    return 2.0 * _prod(sizes.values())


def _conv_flops(op) -> float:
    # MACs = forward output elements x (kernel elements / output features); the same for both gradients.
    if op.type in _CONV_FORWARD:
        forward_out, kernel = _shape(op.outputs[0]), _shape(op.inputs[1])
    elif op.type in _CONV_INPUT_GRAD:
        forward_out, kernel = _shape(op.inputs[2]), _shape(op.inputs[1])
    else:
        forward_out, kernel = _shape(op.inputs[2]), _shape(op.outputs[0])
    if forward_out is None or kernel is None:
        return 0.0
    per_output = _prod(kernel[:-2]) if op.type.startswith("Depthwise") else _prod(kernel[:-1])
    return 2.0 * _prod(forward_out) * per_output


def _function_graphs(graph, op, attr: str) -> list[Any]:
    try:
        value = op.get_attr(attr)
    except (ValueError, TypeError):
        return []
    names = [getattr(v, "name", v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    out = []
    for name in names:
        fn = None
        g = graph
        while fn is None and g is not None:  # a nested graph's functions may live in an outer graph
            fn = g._get_function(name.decode() if isinstance(name, bytes) else name)
            g = getattr(g, "outer_graph", None)
        inner = getattr(fn, "graph", None)
        if inner is not None:
            out.append(inner)
    return out


def _live_ops(graph) -> list[Any]:
    """The graph's ops that its outputs or its stateful ops depend on (TensorFlow prunes the others unrun)."""
    ops = graph.get_operations()
    stack = [t.op for t in getattr(graph, "outputs", [])]
    stack += list(getattr(graph, "control_outputs", []))
    stack += [op for op in ops if getattr(op, "_is_stateful", True)]
    live: set[int] = set()
    while stack:
        op = stack.pop()
        if id(op) in live:
            continue
        live.add(id(op))
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return [op for op in ops if id(op) in live]


def _static(tensor, depth: int = 0):
    """The value of a tensor the graph fixes (a constant, or the max/min of one), else None."""
    import numpy as np
    import tensorflow as tf

    value = tf.get_static_value(tensor)
    if value is not None or depth > 8:
        return value
    op = tensor.op
    if op.type == "Identity":
        return _static(op.inputs[0], depth + 1)
    if op.type in ("Max", "Min"):
        x, axis = _static(op.inputs[0], depth + 1), _static(op.inputs[1], depth + 1)
        if x is None or axis is None:
            return None
        reduce = np.max if op.type == "Max" else np.min
        return reduce(x, axis=tuple(int(a) for a in np.atleast_1d(axis)), keepdims=op.get_attr("keep_dims"))
    return None


def _trip_count(op) -> int | None:
    """A ``While``'s iterations where its ``maximum_iterations`` input is fixed (a Keras RNN's timesteps)."""
    if len(op.inputs) < 2:
        return None
    try:
        value = _static(op.inputs[1])
        n = int(value) if value is not None and getattr(value, "size", 1) == 1 else -1
    except Exception:
        return None
    return n if n > 0 else None


def graph_flops(graph, loops: list[int] | None = None, _depth: int = 0, found: list | None = None) -> float:
    """Matmul, einsum and convolution FLOPs of a TensorFlow graph, its functions' bodies included.

    Only ops the graph's outputs or stateful ops (variable updates) depend on
    count: a gradient no one needs is pruned before the step runs. A loop's
    body counts its trip count times where the graph fixes it (then appended
    to ``loops``), else once. ``found``: where each counted op's ``(name,
    FLOPs)`` is appended, a function body's ops under the name of the op that
    calls it (its name scope).
    """
    if _depth > 32:
        return 0.0
    total = 0.0
    for op in _live_ops(graph):
        kind = op.type
        inner: list[tuple[str, float]] | None = [] if found is not None else None
        try:
            if kind in _MATMULS:
                flops = _matmul_flops(op)
            elif kind == "Einsum":
                flops = _einsum_flops(op)
            elif kind in _CONV_FORWARD or kind in _CONV_INPUT_GRAD or kind in _CONV_FILTER_GRAD:
                flops = _conv_flops(op)
            elif kind in ("If", "StatelessIf", "Case", "StatelessCase"):
                attrs = ("then_branch", "else_branch") if kind.endswith("If") else ("branches",)
                branches = [g for a in attrs for g in _function_graphs(graph, op, a)]
                counted = []
                for g in branches:
                    ops: list[tuple[str, float]] | None = [] if found is not None else None
                    counted.append((graph_flops(g, loops, _depth + 1, ops), ops))
                flops, costliest = max(counted, key=lambda c: c[0], default=(0.0, None))
                inner = costliest
            elif kind in ("While", "StatelessWhile"):
                flops = sum(graph_flops(g, loops, _depth + 1, inner) for g in _function_graphs(graph, op, "body"))
                trips = _trip_count(op)
                if trips is not None and flops:
                    if loops is not None:
                        loops.append(trips)
                    flops *= trips
                    inner = [(name, f * trips) for name, f in inner] if inner is not None else None
            elif kind in ("PartitionedCall", "StatefulPartitionedCall"):
                flops = sum(graph_flops(g, loops, _depth + 1, inner) for g in _function_graphs(graph, op, "f"))
            else:
                continue
        except Exception:
            continue  # an op this count does not understand adds nothing
        total += flops
        if found is not None:
            if inner:
                found.extend((f"{op.name}/{name}", f) for name, f in inner)
            elif flops:
                found.append((op.name, flops))
    return total


# -- the step ----------------------------------------------------------------------------
def _spec_key(tf, specs) -> Any:
    return tuple(None if s is None else (tuple(s.shape.as_list()), s.dtype.name) for s in tf.nest.flatten(specs))


def step_flops(function, specs) -> tuple[float | None, str]:
    """The FLOPs of Keras's per-batch step ``function`` (a ``tf.function``) on a batch of ``specs``.

    ``specs`` is the batch's structure of ``tf.TensorSpec``; the source says
    which count gave the figure (see the module's docstring).
    """
    import tensorflow as tf

    key = _spec_key(tf, specs)
    try:
        cached = _CACHE.setdefault(function, {})
    except TypeError:
        cached = {}
    if key in cached:
        return cached[key]
    python_function = function.python_function
    loops: list[int] = []
    graph = _step_graph(tf, function, specs)
    result: tuple[float | None, str] = (graph_flops(graph, loops) or None, GRAPH_SOURCE)
    if loops:
        result = (result[0], GRAPH_SOURCE + LOOP_NOTE)
    elif getattr(function, "_jit_compile", False):
        flat = [s for s in tf.nest.flatten(specs) if s is not None]

        def flat_step(*args):
            given = iter(args)
            leaves = [None if s is None else next(given) for s in tf.nest.flatten(specs)]
            return python_function(tf.nest.pack_sequence_as(specs, leaves))

        try:
            hlo = tf.function(flat_step, jit_compile=True).experimental_get_compiler_ir(*flat)(stage="hlo")
            result = (hlo_flops(hlo) or result[0], XLA_SOURCE)
        except Exception:
            pass  # the graph's count stands
    cached[key] = result
    return result


def op_flops(function, specs) -> list[tuple[str, float]]:
    """Each counted op of Keras's per-batch step on a batch of ``specs``, ``(op name, FLOPs)``, from its traced graph.

    The op names carry the Keras layers' name scopes (``net/heavy/MatMul``,
    ``gradient_tape/net/heavy/MatMul/MatMul_1``): the layer table groups them.
    The graph is the one the fit traced for these shapes, else a new trace
    (:func:`_step_graph`): nothing runs.
    """
    import tensorflow as tf

    found: list[tuple[str, float]] = []
    graph_flops(_step_graph(tf, function, specs), found=found)
    return found


def _step_graph(tf, function, specs):
    """The step's graph for a batch of ``specs``: the fit's own trace where one has exactly these shapes, else a new one.

    Reading the fit's trace costs nothing, where a new trace of a ResNet-50
    step takes seconds of Python. The new trace is of a new ``tf.function``
    of the step's Python function, so Keras's own function keeps its traces
    (and its trace count). A trace with relaxed shapes (an unknown batch
    dimension) is not read: the count needs every dimension.
    """
    wanted = [(tuple(s.shape.as_list()), s.dtype) for s in tf.nest.flatten(specs) if s is not None]
    try:  # the traces of a tf.function, without tracing (no public API lists them)
        traced = list(function._function_cache.values())
    except Exception:
        traced = []
    for concrete in traced:
        try:
            args = tf.nest.flatten(concrete.structured_input_signature[0])
            if [(tuple(a.shape.as_list()), a.dtype) for a in args] == wanted:
                return concrete.graph
        except Exception:
            continue
    return tf.function(function.python_function).get_concrete_function(specs).graph
