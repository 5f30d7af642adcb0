"""Advice: short, specific changes to the input pipeline for what was measured.

Each tip names the part of the measured wait it addresses and what removing
it is worth (an upper bound on the speedup); it fits the pipeline as it runs
(tf.data transformations and which of them run once a ``.cache()`` serves,
PyDataset and DataLoader workers, arrays, the host CPU, whether a GPU trains).
"""

from __future__ import annotations

import math
from typing import Any

from keras_gpu_tools.input.categories import HIGH, MODERATE
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.runtime.units import format_ms


def _saves(m: Measurement, seconds: float | None) -> str:
    """What saving ``seconds`` a step is worth: ``up to 4.1 ms of the 12.0 ms wait per step (at most 1.25x faster)``."""
    if seconds is None or m.wait is None or not m.step:
        return "part of the wait"
    seconds = min(max(seconds, 0.0), m.wait)
    bound = m.step / (m.step - seconds) if seconds < m.step else None
    text = f"up to {format_ms(seconds, 1)} of the {format_ms(m.wait, 1)} wait per step"
    return text + (f" (at most {bound:.2f}x faster)" if bound else "")


WORKER_HEADROOM = 1.25  # loads vary: workers that only just keep up leave steps waiting half the time


def workers_needed(current: int, m: Measurement, cores: int) -> int:
    """Workers that load a batch per step: ``1.25 * current * step / compute``, at least one more than now.

    With ``current`` workers (0: loading in the training loop) a batch arrives
    every ``step``; each worker takes about ``current * step`` per batch, so
    ``current * step / compute`` of them keep up with the device, and a
    quarter more absorb uneven loads. Capped at 32.
    """
    now = max(int(current or 0), 1)
    if m.step and m.compute:
        need = math.ceil(WORKER_HEADROOM * now * m.step / m.compute - 1e-9)
    else:
        need = max(cores, now + 1)
    return int(min(max(need, int(current or 0) + 1, 2), 32))


def advise(
    category: str,
    m: Measurement,
    pipeline: dict[str, Any],
    host: dict[str, float],
    context: dict[str, Any] | None = None,
) -> list[str]:
    """Short, specific changes for what was measured (empty unless input-bound).

    Each tip names the part of the measured wait it addresses. ``context``:
    ``gpu`` (whether the model trains on a GPU; None: unknown), ``epochs``
    (of the fit), ``cache_serves`` (the measured span reads a `.cache()` that
    an earlier epoch filled), ``scope`` (what the figures cover), ``cores``.
    """
    if category not in (HIGH, MODERATE):
        return []
    ctx = context or {}
    gpu = ctx.get("gpu")
    epochs = ctx.get("epochs")
    cores = int(ctx.get("cores") or host.get("cpu_count") or 1)
    scope = ctx.get("scope") or "the measured steps"
    tips: list[str] = []
    own = host.get("process_cpu_percent")
    if own is not None and own >= 85:
        where = "the model's compute and the input pipeline share these cores" if gpu is False else "preprocessing"
        tips.append(
            f"The host CPU is the limit: this process kept {own:.0f}% of the {cores} cores busy ({where}), so more "
            "workers or parallel calls will not help. Do less work per batch: cache decoded data, store inputs "
            "pre-processed"
            + ("" if gpu is False else ", or move augmentation into the model (it runs on the GPU)")
            + f". Addresses all of the {format_ms(m.wait, 1)} wait per step."
        )
    kind = pipeline.get("kind", "unknown")
    if kind == "tf.data":
        tips += _advise_tf_data(m, pipeline, gpu, epochs, cores, scope, bool(ctx.get("cache_serves")))
    elif kind == "PyDataset":
        workers = pipeline.get("workers")
        mp = pipeline.get("use_multiprocessing")
        n = workers_needed(workers or 1, m, cores)
        tip = (
            f"Raise `workers` to {n} (now workers={workers}, use_multiprocessing={mp}): a batch arrives every "
            f"{format_ms(m.step, 1)} and a step computes in {format_ms(m.compute, 1)}, so {n} batches loading in parallel keep up. "
            f"Addresses the loading part of the wait, {_saves(m, m.wait)}"
        )
        if n > cores:
            tip += f"; above the {cores} CPU cores this holds while loads wait on disk or network"
        if not mp:
            tip += (
                ". If `__getitem__` is pure-Python work (the GIL lets one thread run at a time), also set "
                "`use_multiprocessing=True`"
            )
        tips.append(tip + ".")
        if (workers or 1) > 1:
            tips.append(
                f"Raise `max_queue_size` (now {pipeline.get('max_queue_size')}) if load times vary from batch to "
                "batch. Addresses the waits of slow batches, which a deeper queue absorbs."
            )
    elif kind == "generator":
        tips.append(
            "A Python generator runs in the training loop, one batch at a time: rewrite it as a "
            "`keras.utils.PyDataset` with `workers=` or as a tf.data pipeline with a parallel map. "
            f"Addresses all of the {format_ms(m.wait, 1)} wait per step, which is the generator's own time."
        )
    elif kind == "arrays":
        tips.append(
            "With in-memory arrays the per-step cost is slicing and copying the batch: use a larger `batch_size`, "
            "or `steps_per_execution` (TensorFlow, JAX) to run several steps per call. "
            f"Addresses the slicing and copying, {_saves(m, m.wait)}."
        )
    elif kind == "torch DataLoader":
        nw = pipeline.get("num_workers") or 0
        n = workers_needed(nw, m, cores)
        tip = (
            f"Raise `num_workers` to {n} (now {nw}): a batch arrives every {format_ms(m.step, 1)} and a step computes in "
            f"{format_ms(m.compute, 1)}, so {n} worker processes keep up"
            + (f" (above the {cores} CPU cores while loads wait on disk or network)" if n > cores else "")
        )
        if (epochs or 0) > 1 and not pipeline.get("persistent_workers"):
            tip += ", and set `persistent_workers=True` so they are not started again every epoch"
        tips.append(tip + f". Addresses the loading part of the wait, {_saves(m, m.wait)}.")
        if nw and (epochs or 0) > 1 and not pipeline.get("persistent_workers") and n <= nw:
            tips.append(
                "Set `persistent_workers=True` so workers are not restarted every epoch. "
                "Addresses the wait at the start of each epoch."
            )
        if gpu and not pipeline.get("pin_memory"):
            tips.append(
                "Set `pin_memory=True`: copies from pinned host memory to the GPU are faster and asynchronous. "
                "Addresses the host-to-device copy in the wait."
            )
    else:
        tips.append(
            "Prepare batches in parallel and ahead of time (prefetch)"
            + ("" if gpu is False else ", and move augmentation onto the GPU")
            + f". Addresses the {format_ms(m.wait, 1)} wait per step."
        )
    return tips


_FILE_READERS = ("tfrecord", "text_line", "fixed_length_record")
_OP_CALLS = {"parallel_map": ".map (parallel)", "map": ".map", "parallel_batch": ".batch (parallel)"}


def _advise_tf_data(
    m: Measurement, pipeline: dict[str, Any], gpu, epochs, cores: int, scope: str, cache_serves: bool
) -> list[str]:
    tips: list[str] = []
    ops = list(pipeline.get("ops") or [])
    cached = bool(pipeline.get("cache"))
    after_cache = list(pipeline.get("after_cache") or [])  # last first, as in `ops`
    if pipeline.get("sequential_map") and not (cache_serves and "map" not in after_cache):
        where = "each `.map(...)` after `.cache()`" if cache_serves else "each `.map(...)`"
        tips.append(
            f"Pass `num_parallel_calls=tf.data.AUTOTUNE` to {where}: a map without it transforms one "
            f"element at a time. Addresses the map's share of the wait: elements are then prepared {cores} or more "
            f"at a time ({cores} CPU cores; more while they wait on I/O)."
        )
    if not pipeline.get("ends_with_prefetch"):
        tips.append(
            "End the tf.data pipeline with `.prefetch(tf.data.AUTOTUNE)`, so the next batch is prepared while the "
            f"step computes. Addresses the part of the wait that compute can hide: {_saves(m, m.compute)}."
        )
    if not cached:
        once = " (this fit runs one epoch, so the cache would never be read: it pays off over several)"
        tips.append(
            "Add `.cache()` after the expensive deterministic steps (decode, resize) and before random augmentation, "
            "if the data fits in memory or on local disk. Addresses the reading and decoding part of the wait, from "
            "the second epoch on: the first epoch fills the cache" + (once if epochs == 1 else "") + "."
        )
    elif cache_serves:
        work = [_OP_CALLS.get(op, f".{op}") for op in reversed(after_cache) if op not in ("prefetch", "options")]
        if work:
            tips.append(
                f"Over {scope} every batch comes from the cache, so nothing is read or decoded: the wait is the work "
                f"after `.cache()` ({', '.join(work)}). Addresses all of the {format_ms(m.wait, 1)} wait: make that work "
                "cheaper (smaller images, fewer ops), or move random augmentation into the model."
            )
        else:
            tips.append(
                f"Over {scope} every batch comes from the cache and nothing runs after it: the wait is tf.data's own "
                "cost per batch. A larger `batch_size`, or `steps_per_execution` (TensorFlow, JAX), spreads it over "
                f"more examples. Addresses all of the {format_ms(m.wait, 1)} wait."
            )
    source_read = not (cached and cache_serves)
    readers = [op for op in ops if op in _FILE_READERS]
    if (
        source_read
        and readers
        and not pipeline.get("interleave")
        and pipeline.get("ends_with_prefetch")
        and not pipeline.get("sequential_map")
    ):
        tips.append(
            "The files are read one after the other: read them in parallel with "
            "`tf.data.Dataset.list_files(...).interleave(tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE)`. "
            "Addresses the reading part of the wait."
        )
    if not tips:  # prefetches, maps in parallel, caches where it can: the work per element is the limit
        done = ["prefetches"] + (["maps in parallel"] if pipeline.get("parallel_map") else [])
        done += ["caches"] if cached else []
        said = done[0] if len(done) == 1 else f"{', '.join(done[:-1])} and {done[-1]}"
        once = " (this fit runs one epoch: its cache is filled, never read)" if cached and epochs == 1 else ""
        tips.append(
            f"The pipeline already {said}{once}: the work per element is the limit. "
            "Do less of it per step: store the inputs pre-processed (decoded, resized), read smaller ones, or "
            f"move augmentation into the model. Addresses all of the {format_ms(m.wait, 1)} wait per step."
        )
    has_map = pipeline.get("sequential_map") or pipeline.get("parallel_map")
    if gpu is not False and has_map and (not cached or "map" in after_cache or "parallel_map" in after_cache):
        tips.append(
            "Move random augmentation into the model as Keras preprocessing layers (`keras.layers.RandomFlip`, "
            "`RandomBrightness`, ...), so it runs with the step on the GPU. Addresses the augmentation part of "
            "the wait."
        )
    return tips
