"""The likely causes of growing memory: each one's name, its evidence in words, and its fix."""

from __future__ import annotations

# Cause keys (LeakVerdict.causes), in the order the verdict weighs them.
CLEAR_SESSION = "clear_session"
FRAMEWORK_PER_FIT = "framework_per_fit"
TENSORS_KEPT = "tensors_kept"
RETRACE = "retrace"
DATA_CACHE = "data_cache"
ALLOCATOR_CACHE = "allocator_cache"
UNKNOWN = "unknown"

TITLES = {
    CLEAR_SESSION: "models built in a loop without `keras.backend.clear_session()`",
    FRAMEWORK_PER_FIT: "the framework's own memory per fit(), which `clear_session()` does not free",
    TENSORS_KEPT: "tensors kept from epoch to epoch (in a callback or a Python list)",
    RETRACE: "a retrace every epoch (new compiled functions each time)",
    DATA_CACHE: "a `tf.data` cache filling",
    ALLOCATOR_CACHE: "the allocator's cache (not a leak)",
    UNKNOWN: "no cause found among those checked",
}

FIXES = {
    CLEAR_SESSION: (
        "Call `keras.backend.clear_session()` before building each new model (and `del` the previous model, "
        "its optimizer and History): Keras's global state otherwise keeps growing with every model built."
    ),
    FRAMEWORK_PER_FIT: (
        "The session is cleared between fits and memory still grows: run each trial in a fresh process "
        "(`multiprocessing` with `maxtasksperchild=1`, or a subprocess per trial) so that its memory goes back "
        "to the system when it ends."
    ),
    TENSORS_KEPT: (
        "Keep only what you need of a tensor, as a Python number (`float(x)`), or clear the list each epoch; "
        "a tensor kept in `logs`, a callback or a list keeps its whole buffer alive."
    ),
    RETRACE: (
        "Give every batch the same shapes and dtypes (`drop_remainder=True`, padding to fixed buckets), pass "
        "tensors rather than changing Python values to compiled functions, and call `compile()` once: each new "
        "trace keeps a program (and its buffers) alive."
    ),
    DATA_CACHE: (
        "An in-memory `cache()` grows until it holds the whole dataset (over several epochs where "
        "`steps_per_epoch` covers only part of it) and then stops: expected. Where the data does not fit in "
        "memory, give `cache()` a file name, or cache before the expensive steps only."
    ),
    ALLOCATOR_CACHE: (
        "Nothing to fix: the allocator keeps freed blocks to reuse them, and what tensors use does not grow."
    ),
    UNKNOWN: (
        "Compare two `tracemalloc` snapshots a few epochs apart (`snapshot.compare_to(...)`) to find the Python "
        "allocations that grow; on a GPU, the framework's memory profiler shows which buffers stay alive."
    ),
}
