"""Freeing what a failed step still holds before the retry asks for memory again."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any


def free_failed_step(exc: BaseException, held: Callable[[], bool | None] | None = None) -> None:
    """Frees the tensors a failed step still holds, before the retry asks for memory again.

    The frames of the error's traceback, and of every error chained to it,
    are cleared; then a garbage collection frees the frames no traceback
    shows. Keras drops its own frames from the traceback it re-raises, but
    they sit in reference cycles with the errors, and they hold the failed
    step's tensors: left alone, every retry runs out of memory again and a
    batch that fits as a few micro-batches ends up split far more finely.

    A filtered traceback (Keras keeps only the frames outside Keras) leaves
    out the frames its frames were called from, but they are still linked to
    them (``f_back``) and hold the step's tensors as long as the error lives:
    they are cleared too, up to the first frame still running.

    Those cycles are young (made as the error unwound), so the young
    generations are collected first (about a millisecond). A full collection
    costs far more (a large fraction of a second on a big model), so it runs only where ``held()``
    says the failed step's memory is still allocated, or where nothing can
    tell (``held`` None, or returning None; see :func:`held_since`); inside
    :func:`older_frozen` it sees only what was made since, and costs milliseconds.
    """
    import gc
    import traceback

    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        if tb is not None:
            try:
                traceback.clear_frames(tb)
            except Exception:
                pass
        while tb is not None:
            _clear_callers(tb.tb_frame)
            tb = tb.tb_next
        todo += [e.__cause__, e.__context__]
    gc.collect(1)
    try:
        still = None if held is None else held()
    except Exception:
        still = None
    if still is None or still:
        gc.collect()


# A suspended generator's or coroutine's frame is never cleared: clearing it would close it.
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def _clear_callers(frame: Any) -> None:
    """Clears the finished frames ``frame`` was called from (its ``f_back`` chain), up to the first still running."""
    f = frame.f_back
    while f is not None and not f.f_code.co_flags & _RESUMABLE:
        try:
            f.clear()
        except RuntimeError:  # still running, and so is every frame it was called from
            return
        f = f.f_back


@contextlib.contextmanager
def older_frozen(enabled: bool = True) -> Iterator[None]:
    """Keeps what exists now out of the garbage collector's sight until the block ends (``gc.freeze``).

    A failed step's tensors sit in reference cycles made while it ran; a full
    collection inside the block looks at those objects only, not at the
    millions a process with a framework imported holds (seconds a collection,
    each time an attempt fails). Nothing is lost: everything is handed back to
    the collector at the end. Left alone where the process froze objects itself.
    """
    import gc

    if not enabled or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def in_use(memory: Callable[[], dict[str, Any]]) -> int | None:
    """``bytes_in_use`` of a backend's ``device_memory()`` figures (None where it has none, e.g. a CPU)."""
    try:
        value = (memory() or {}).get("bytes_in_use")
    except Exception:
        return None
    return None if value is None else int(value)


def held_since(memory: Callable[[], dict[str, Any]], before: int | None) -> Callable[[], bool | None]:
    """For :func:`free_failed_step`: whether the device holds clearly more (64 MiB) than ``before`` bytes now."""

    def held() -> bool | None:
        now = in_use(memory)
        return None if now is None or before is None else now > before + 64 * 2**20

    return held
