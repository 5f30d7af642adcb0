"""Nested batches: their size, their shapes, their leaves. No framework import."""

from __future__ import annotations

from operator import attrgetter
from typing import Any

#: What :func:`batch_signature` gives each array of a flat tuple batch: a step's
#: idle check can build that tuple itself, with no call of its own (see the backends).
shape_and_dtype = attrgetter("shape", "dtype")


class ReplicaBatch:
    """One batch of a step over several replicas (``tf.distribute``): each replica's share, and the batch as given.

    ``original`` is what the framework's step takes (per-replica values);
    ``parts[r]`` is replica ``r``'s share as a nested batch of arrays. The
    size is the whole batch's, the signature every share's shapes.
    """

    __slots__ = ("original", "parts", "size", "signature")

    def __init__(self, original, parts: list):
        self.original = original
        self.parts = parts
        sizes = [leading_dim(p) or 0 for p in parts]
        self.size = sum(sizes)
        self.signature = ("replicas",) + tuple(batch_signature(p) for p in parts)


def batch_signature(batch) -> tuple:
    """Shapes and dtypes of a (nested) batch; cheap, no framework import.

    Runs on every step of the OOM reducer (the JAX and torch idle steps build a
    flat tuple's signature inline, the same tuple as here, and call this for
    anything else), so it keeps the framework's dtype object as it is
    (hashable, and equal to its name for NumPy and JAX): turning a NumPy dtype
    into a string costs more than the rest together.
    """
    if type(batch) is tuple:
        # The common (x, y) of arrays, in C (no Python bytecode per array): each
        # array's shape as the framework gives it (a tuple, torch.Size or
        # TensorShape, all equal to, and hashed as, the tuple of their sizes).
        # A None, a nested structure or an unhashable shape takes the walk below.
        try:
            sig = tuple(map(shape_and_dtype, batch))
            hash(sig)
            return sig
        except (AttributeError, TypeError):
            pass
    if type(batch) is ReplicaBatch:
        return batch.signature
    out: list[Any] = []
    stack = [batch]
    while stack and len(out) < 64:
        b = stack.pop()
        if isinstance(b, (tuple, list)):
            stack.extend(reversed(b))
        elif isinstance(b, dict):
            stack.extend(reversed([b[k] for k in sorted(b, key=str)]))
        elif b is not None:
            shape = getattr(b, "shape", None)
            out.append((tuple(shape) if shape is not None else None, getattr(b, "dtype", None) or type(b).__name__))
    return tuple(out)


def leading_dim(batch) -> int | None:
    """The batch size: the first dimension of the first array in the batch (every replica's share together)."""
    if type(batch) is ReplicaBatch:
        return batch.size
    b = batch
    for _ in range(8):
        if isinstance(b, (tuple, list)):
            if not b:
                return None
            b = b[0]
        elif isinstance(b, dict):
            if not b:
                return None
            b = next(iter(b.values()))
        else:
            break
    shape = getattr(b, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    try:
        return int(shape[0])
    except (TypeError, ValueError):
        return None


def map_leaves(fn, tree):
    """``tree`` (nested dicts, lists and tuples) with ``fn`` applied to each leaf; None stays None."""
    if tree is None:
        return None
    if isinstance(tree, dict):
        return {k: map_leaves(fn, v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(map_leaves(fn, v) for v in tree)
    return fn(tree)


def leaves(tree):
    """The non-None leaves of nested dicts, lists and tuples (no framework import)."""
    stack = [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, dict):
            stack.extend(t.values())
        elif isinstance(t, (list, tuple)):
            stack.extend(t)
        elif t is not None:
            yield t
