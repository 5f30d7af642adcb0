"""Time per Keras layer: a trace's op times attributed to the model's layer paths, forward and backward together.

A layer path names a layer from the model down, without the model's own name
(``"inner/dense"`` for the Dense layer of the nested model ``inner``). Each op
of the trace is matched to the deepest layer whose name scope it carries:

- TensorFlow: ``StatefulPartitionedCall/gradient_tape/net_1/big_1/MatMul/MatMul``
  (TensorFlow makes scope names unique with ``_<n>``: ``shared_1`` and
  ``shared_3`` are two calls of ``shared``);
- JAX: ``jit(one_step_on_data)/transpose(jvp(net))/big/dot_general`` (the
  wrappers JAX's transformations put around a scope are taken off);
- torch: the layer's own ``record_function`` range, installed during the window
  (``backends/torch/layer_scopes.py``), already resolved by the trace reader.

An op in no layer (the loss, the optimizer's update) goes to the row
:data:`OUTSIDE`. Nothing here imports a framework.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from keras_gpu_tools.runtime import keras_internals as ki

#: The row of the ops that sit in no layer: the loss, the optimizer, the step's own ops.
OUTSIDE = "(outside layers)"

_WRAPPED = re.compile(r"^[\w.\-]+\((.*)\)$")  # jvp(net), transpose(jvp(net)), jit(main)
_UNIQUE = re.compile(r"^(.*)_(\d+)$")


@dataclass(frozen=True)
class LayerNode:
    """One layer of the model's tree: its name, path, symbolic call count and the layers it calls."""

    name: str
    path: str
    calls: int = 1
    children: tuple[LayerNode, ...] = ()

    def walk(self) -> Iterable[LayerNode]:
        yield self
        for c in self.children:
            yield from c.walk()


def layer_tree(model) -> LayerNode:
    """The model's layers as a tree of :class:`LayerNode` (the root is the model, path ``""``).

    A layer reached twice (shared) keeps its first path; its call count is
    the number of its symbolic calls (Keras's nodes), at least 1.
    """
    seen: set[int] = set()

    def node(layer, path: str) -> LayerNode:
        seen.add(id(layer))
        kids = []
        for sub in ki.sublayers(layer):
            if id(sub) in seen or type(sub).__name__ == "InputLayer":
                continue
            name = str(getattr(sub, "name", type(sub).__name__))
            kids.append(node(sub, f"{path}/{name}" if path else name))
        calls = max(1, ki.symbolic_calls(layer))
        return LayerNode(str(getattr(layer, "name", "")), path, calls, tuple(kids))

    return node(model, "")


def scope_segments(op_name: str) -> list[str]:
    """The name-scope segments of a framework op name, JAX's transformation wrappers taken off."""
    out = []
    for seg in op_name.split(":")[0].split("/"):
        while True:
            m = _WRAPPED.match(seg)
            if m is None:
                break
            seg = m.group(1)
        if seg:
            out.append(seg)
    return out


def _names(seg: str) -> tuple[str, ...]:
    """A scope segment as a layer name: itself, then without TensorFlow's ``_<n>`` suffix."""
    m = _UNIQUE.match(seg)
    return (seg, m.group(1)) if m else (seg,)


@dataclass
class Matcher:
    """Matches op names to layer paths of one model's tree (cached per op name).

    ``seen``: every scope segment of the trace. TensorFlow may make every scope unique
    (``dense_1`` for the layer ``dense``, ``dense_1_1`` for the layer ``dense_1``): a segment that
    is both a layer's name and another's with a suffix is read as the suffixed one where the
    trace also holds that first layer's name with a suffix of its own.
    """

    tree: LayerNode
    seen: frozenset[str] = frozenset()
    _cache: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def match(self, op_name: str) -> tuple[str | None, str]:
        """``(layer path or None, the scope prefix that matched)``: the prefix tells two calls of a layer apart."""
        hit = self._cache.get(op_name)
        if hit is None:
            hit = self._cache[op_name] = self._match(scope_segments(op_name))
        return hit

    def _match(self, segs: list[str]) -> tuple[str | None, str]:
        node, matched, prefix = self.tree, None, []
        for seg in segs:
            child = _child(node, seg, self.seen)
            if child is not None:
                node, matched = child, child
                prefix.append(seg)  # the layers' own scopes only: a call's, whatever function runs it
                continue
            if matched is not None:
                break  # past the deepest layer: the op's own name
            # before any layer: the step's scopes (gradient_tape, jit(...)), or the model's own name
        return (matched.path, "/".join(prefix)) if matched is not None else (None, "")


def _child(node: LayerNode, seg: str, seen: frozenset[str] = frozenset()) -> LayerNode | None:
    by_name = {c.name: c for c in node.children}
    names = _names(seg)
    if len(names) == 2 and names[0] in by_name and names[1] in by_name:  # "dense_1": dense_1's, or dense's?
        suffixed = re.compile(re.escape(seg) + r"_\d+$")
        return by_name[names[1]] if any(suffixed.match(s) for s in seen) else by_name[names[0]]
    return next((by_name[n] for n in names if n in by_name), None)


def segments_of(names: Iterable[str]) -> frozenset[str]:
    """Every scope segment of these op names (what :class:`Matcher` reads TensorFlow's unique names by)."""
    return frozenset(seg for name in names for seg in scope_segments(name))


@dataclass
class OpTime:
    """One op's time in a trace (picoseconds), and where it belongs."""

    name: str  # the framework op name (scopes), or "" when ``path`` is already known
    ps: int
    backward: bool = False
    flops: float | None = None
    path: str | None = None  # already resolved (torch's layer ranges)
    resolved: bool = False
    step: int | None = None  # the profiled step it ran in, where the trace tells (torch)
    copy: bool = False  # a copy between host and device: no layer's work, kept out of the rows


@dataclass
class LayerRow:
    """One layer's share of a profiled window."""

    path: str
    calls: int
    ms_per_step: float
    share: float  # of the window's op time, 0-1
    forward_ms: float = 0.0  # per step
    backward_ms: float = 0.0  # per step
    flops_per_step: float | None = None
    #: torch only: the allocator's peak inside the layer's range, its sublayers' included (bytes its
    #: thread allocated less freed, at their highest above the range's start; the largest call of the
    #: window). None on TensorFlow and JAX, whose traces book memory to no layer, and for the OUTSIDE row.
    peak_activation_bytes: int | None = None


def attribute(
    ops: Iterable[OpTime],
    tree: LayerNode,
    steps: int,
    calls: dict[str, int] | None = None,
) -> tuple[list[LayerRow], float]:
    """Rows of the layers the ops belong to, heaviest first, and the total op ms per step.

    A layer's ms per step is its time over ``steps``; where every op knows its
    step (torch), the median over the steps instead (a host thread's stall in
    one step of a busy CPU moves no row), its share of the rows' sum.
    ``calls``: counted calls per path (torch: its layer ranges per step);
    else the distinct scopes the forward ops carry (TensorFlow names each call's
    scope apart), at least Keras's symbolic call count.
    """
    ops = list(ops)
    matcher = Matcher(tree, segments_of({op.name for op in ops if not op.resolved}))
    steps = max(1, steps)
    fwd: dict[str, int] = {}
    bwd: dict[str, int] = {}
    flops: dict[str, float] = {}
    scopes: dict[str, set[str]] = {}
    per_step: dict[str, dict[int, int]] | None = {} if any(op.step is not None for op in ops) else None
    for op in ops:
        if per_step is not None and op.step is None:
            continue  # outside the profiled steps
        if op.resolved:
            path: str | None = op.path
        else:
            path, prefix = matcher.match(op.name)
            if path is not None and not op.backward:
                scopes.setdefault(path, set()).add(prefix)
        key = path or OUTSIDE
        book = bwd if op.backward else fwd
        book[key] = book.get(key, 0) + op.ps
        if per_step is not None and op.step is not None:
            by_step = per_step.setdefault(key, {})
            by_step[op.step] = by_step.get(op.step, 0) + op.ps
        if op.flops:
            flops[key] = flops.get(key, 0.0) + op.flops
    nodes = {n.path: n for n in tree.walk()}
    typical: dict[str, float] = {}  # ps per step
    for key in set(fwd) | set(bwd):
        ps = fwd.get(key, 0) + bwd.get(key, 0)
        if per_step:
            known = sorted({s for book in per_step.values() for s in book})
            typical[key] = statistics.median(per_step.get(key, {}).get(s, 0) for s in known)
        else:
            typical[key] = ps / steps
    in_all = sum(typical.values())
    rows = []
    for key, typ in typical.items():
        ps = fwd.get(key, 0) + bwd.get(key, 0)
        n = nodes.get(key)
        if calls is not None and key in calls:  # counted ranges; never fewer than the model's own calls
            count = max(calls[key], n.calls if n is not None else 0)
        else:
            count = max(len(scopes.get(key, ())), n.calls if n is not None else 0) if key != OUTSIDE else 0
        rows.append(
            LayerRow(
                path=key,
                calls=count,
                ms_per_step=typ / 1e9,
                share=typ / in_all if in_all else 0.0,
                forward_ms=typ * fwd.get(key, 0) / ps / 1e9 if ps else 0.0,
                backward_ms=typ * bwd.get(key, 0) / ps / 1e9 if ps else 0.0,
                flops_per_step=flops[key] / steps if key in flops else None,
            )
        )
    rows.sort(key=lambda r: (-r.ms_per_step, r.path))
    return rows, in_all / 1e9


def assign_flops(rows: list[LayerRow], named: Iterable[tuple[str, float]], tree: LayerNode) -> float:
    """Sets each row's ``flops_per_step`` from one step's counted ops ``(scope name or layer path, FLOPs)``.

    Each op goes to the deepest layer its name carries, as a trace's ops do
    (a layer path is its own scope name); the ops in no layer to
    :data:`OUTSIDE`. A layer with counted FLOPs but no time of its own gets a
    row of 0 ms; a row with none counts 0. The rows add up to the returned total.
    """
    named = list(named)
    matcher = Matcher(tree, segments_of(name for name, _ in named))
    by_path: dict[str, float] = {}
    for name, flops in named:
        path = matcher.match(name)[0] or OUTSIDE
        by_path[path] = by_path.get(path, 0.0) + float(flops)
    nodes = {n.path: n for n in tree.walk()}
    have = {r.path for r in rows}
    for path in sorted(set(by_path) - have):
        if by_path[path]:
            rows.append(LayerRow(path, nodes[path].calls if path in nodes else 0, 0.0, 0.0))
    for row in rows:
        row.flops_per_step = by_path.get(row.path, 0.0)
    return sum(by_path.values())
