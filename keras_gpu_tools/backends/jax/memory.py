"""JAX device memory: the allocator's figures, XLA's memory analysis, and out-of-memory errors.

XLA's memory analysis of a compiled (never run) program is what lets the JAX
backend predict a step's memory (``predicts_memory``): the OOM reducer asks it
before running a split, and ``plan_batch_size`` plans from it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.protocols import Stats
from keras_gpu_tools.runtime import deps

logger = logging.getLogger("keras_gpu_tools")

_gpus: list | None = None  # the device list is fixed once JAX has started


def local_gpus() -> list:
    """This process's JAX GPU devices (none before JAX is imported); listed once."""
    global _gpus
    jax = deps.loaded("jax")
    if jax is None:
        return []
    if _gpus is None:
        _gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    return _gpus


def abstract_arrays(tree):
    """Shape-only stand-ins of the arrays in ``tree``; donated ones included.

    A committed array's stand-in carries its sharding (a mesh's layout, or a
    device put there on purpose); an uncommitted one's carries none, as JAX
    sees the array itself when the step is called: then the lowering (and,
    compiled with the same options, the executable) of a program lowered
    from the stand-ins is the one the call finds in JAX's caches, not a
    second one for a different placement.
    """
    import jax

    def spec(a):
        if hasattr(a, "shape") and hasattr(a, "dtype") and hasattr(a, "is_deleted"):
            sharding = getattr(a, "sharding", None) if getattr(a, "committed", True) else None
            if sharding is None:
                return jax.ShapeDtypeStruct(a.shape, a.dtype)
            try:
                return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
            except Exception:
                return jax.ShapeDtypeStruct(a.shape, a.dtype)
        return a

    return jax.tree_util.tree_map(spec, tree)


def analysed_memory(lowered, asynchronous: bool, settled=None) -> dict[str, int] | None:
    """XLA's memory analysis of ``lowered`` (see :func:`program_memory`), compiled but never run.

    On a CPU, compiled as the jitted call compiles it: a later call of the
    same function on arrays of these shapes and placements reuses the
    executable (JAX keeps it with the lowering), so predicting costs nothing
    there. On a GPU, compiled without autotuning (autotuning runs candidate
    kernels on buffers of the real size: seconds at the sizes that run out
    of memory), so the call compiles again, with autotuning; and twice:
    XLA's default GEMMs without autotuning are Triton fusions with their
    epilogue fused, while the autotuner may pick cuBLAS, whose output is a
    buffer of its own (a wide Dense layer's temporaries can double). The
    larger of the two is what the step may ask. ``settled(memory)``, where
    given, says whether the first compile's analysis already decides (then
    the second is skipped).
    """
    if not asynchronous:
        return program_memory(lowered.compile())
    found = None
    for options in ({"xla_gpu_enable_triton_gemm": False}, {}):
        if found is not None and settled is not None and settled(found):
            break
        try:
            memory = program_memory(lowered.compile(compiler_options={"xla_gpu_autotune_level": 0, **options}))
        except Exception as e:  # an XLA without these options
            logger.debug("keras_gpu_tools: compiling for the memory analysis (%s) failed: %s", options, e)
            continue
        if memory is not None and (found is None or memory["temporaries"] > found["temporaries"]):
            found = memory
    return found if found is not None else program_memory(lowered.compile())


def program_memory(compiled) -> dict[str, int] | None:
    """``arguments``, ``outputs``, ``temporaries``, ``aliased`` bytes of a compiled program (XLA's analysis)."""
    ma = compiled.memory_analysis()
    if isinstance(ma, (list, tuple)):
        ma = ma[0] if ma else None
    if ma is None:
        return None
    return {
        "arguments": int(getattr(ma, "argument_size_in_bytes", 0)),
        "outputs": int(getattr(ma, "output_size_in_bytes", 0)),
        "temporaries": int(getattr(ma, "temp_size_in_bytes", 0)),
        "aliased": int(getattr(ma, "alias_size_in_bytes", 0)),
    }


_XLA_OOM_PREFIX = "RESOURCE_EXHAUSTED"


def _is_xla_oom_message(message: str) -> bool:
    # GPU: "RESOURCE_EXHAUSTED: Out of memory while trying to allocate ...".
    # XLA's CPU runtime reports a failed temporary allocation as
    # "INTERNAL: Error dispatching computation: ... Out of memory allocating N bytes".
    m = message.lstrip()
    return (
        m.startswith(_XLA_OOM_PREFIX)
        or "Out of memory allocating" in m
        or "Out of memory while trying to allocate" in m
    )


def _runtime_errors() -> tuple[type, ...]:
    out = []
    jax = deps.loaded("jax")
    errors = getattr(jax, "errors", None) if jax is not None else None
    for name in ("JaxRuntimeError", "XlaRuntimeError"):
        cls = getattr(errors, name, None)
        if isinstance(cls, type):
            out.append(cls)
    xc = deps.loaded("jaxlib.xla_client")
    cls = getattr(xc, "XlaRuntimeError", None) if xc is not None else None
    if isinstance(cls, type):
        out.append(cls)
    return tuple(out)


class JaxMemory(Backend):
    """Device memory and out-of-memory errors of the JAX backend."""

    def allocator_memory(self, indices: Iterable[int]) -> Stats:
        gpus = local_gpus()
        out: Stats = {}
        for i in indices:
            if i < len(gpus):
                stats = gpus[i].memory_stats() or {}
                if "bytes_in_use" in stats:
                    out[i] = (
                        float(stats["bytes_in_use"]),
                        float(stats.get("peak_bytes_in_use", stats["bytes_in_use"])),
                    )
        return out

    def device_memory(self) -> dict:
        """The first JAX device's memory figures (empty where it reports none, e.g. CPU)."""
        jax = deps.loaded("jax")
        if jax is None:
            return {}
        try:
            dev = jax.local_devices()[0]
            stats = dev.memory_stats() or {}
            out = {"device": getattr(dev, "device_kind", str(dev))}
            for k in ("bytes_limit", "bytes_in_use", "peak_bytes_in_use"):
                if k in stats:
                    out[k] = int(stats[k])
            return out
        except Exception:
            return {}

    def device_peaks(self) -> dict[int, tuple[float, float | None]]:
        out = {}
        for i, dev in enumerate(local_gpus()):
            stats = dev.memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                limit = stats.get("bytes_limit")
                out[i] = (float(stats["peak_bytes_in_use"]), float(limit) if limit else None)
        return out

    def is_oom(self, exc: BaseException) -> bool:
        if deps.loaded("jax") is None and deps.loaded("jaxlib") is None:
            return False
        return any(isinstance(exc, cls) for cls in _runtime_errors()) and _is_xla_oom_message(str(exc))

    def oom_error(self, original: BaseException, message: str) -> BaseException | None:
        made = type(original)(message)
        return made if isinstance(made, BaseException) else None

    def explain_oom(self, error, context) -> tuple[dict, dict]:
        """The device's memory statistics, the largest live arrays, the failing program's memory analysis,
        and (``context["files"]``) the device memory profile (pprof, for ``pprof`` or xprof)."""
        jax = deps.loaded("jax")
        figures: dict[str, Any] = {"sources": []}
        artifacts: dict[str, bytes] = {}
        if jax is None:
            return figures, artifacts
        try:
            dev = jax.local_devices()[0]
            stats = dev.memory_stats() or {}
            if stats:
                figures["device"] = getattr(dev, "device_kind", str(dev))
                figures["in_use_bytes"] = stats.get("bytes_in_use")
                figures["peak_bytes"] = stats.get("peak_bytes_in_use")
                limit = stats.get("bytes_limit")
                if limit:
                    figures["capacity_bytes"] = int(limit)
                    figures["free_bytes"] = max(0, int(limit) - int(stats.get("bytes_in_use", 0)))
                figures["sources"].append(f"{dev}.memory_stats()")
        except Exception:
            pass
        try:
            live = sorted(jax.live_arrays(), key=lambda a: -int(getattr(a, "nbytes", 0)))[:5]
            figures["largest"] = [(f"live array {a.dtype}{list(a.shape)}", int(a.nbytes)) for a in live]
            if live:
                figures["sources"].append("jax.live_arrays()")
        except Exception:
            pass
        runner = context.get("runner")
        program = context.get("program")  # a job's rehearsal, analysed already (JaxRunner.predict_alone)
        if program is None and hasattr(runner, "memory_of"):
            program = runner.memory_of(context["batch"], context["n"], context["k"], context["state"])
        if program:
            figures["program"] = {k: v for k, v in program.items() if k != "need"}
            figures["sources"].append("XLA's memory analysis of the failing program (compiled, not run)")
            if error is None and context.get("predicted_need") is not None:
                figures["requested_bytes"] = int(context["predicted_need"])
                figures["allocation"] = f"the step at split {context['k']} (predicted, not run)"
        if context.get("files"):
            try:
                artifacts["device_memory.prof"] = jax.profiler.device_memory_profile()
            except Exception:
                logger.debug("keras_gpu_tools: no device memory profile", exc_info=True)
        return figures, artifacts
