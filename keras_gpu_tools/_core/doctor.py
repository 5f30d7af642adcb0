"""`keras-gpu-tools doctor`: is my GPU used, and if not, why?

:func:`diagnose` turns facts (what the framework sees, what NVML sees, the
environment) into findings; the fact gathering is separate so the reasoning is
tested with made-up facts. Nothing here raises on a machine without a GPU.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass, field

from keras_gpu_tools._core.nvml import NVML, GPUInfo, NVMLUnavailable, default_nvml


@dataclass
class FrameworkFacts:
    backend: str
    version: str = "?"
    gpus: list[str] = field(default_factory=list)
    built_with_cuda: bool | None = None  # None: unknown
    cuda_version: str | None = None
    cudnn_version: str | None = None
    notes: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass
class NVMLFacts:
    available: bool
    reason: str | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    all_gpus: list[GPUInfo] = field(default_factory=list)
    visible: list[GPUInfo] = field(default_factory=list)


@dataclass
class Finding:
    level: str  # "ok", "warn", "problem", "info"
    text: str


def framework_facts(backend: str) -> FrameworkFacts:
    """What the Keras backend in use sees. Imports only that framework."""
    facts = FrameworkFacts(backend)
    try:
        from keras_gpu_tools import _backends

        _backends.get(backend).framework_facts(facts)
    except Exception as e:  # a broken install is a finding, not a crash
        facts.error = f"{type(e).__name__}: {e}"
    return facts


def nvml_facts(nvml: NVML | None = None, env: dict[str, str] | None = None) -> NVMLFacts:
    from keras_gpu_tools._core.devices import visible_gpus

    nvml = nvml or default_nvml()
    try:
        facts = NVMLFacts(True, driver=nvml.driver_version(), cuda_driver=nvml.cuda_driver_version())
        facts.all_gpus = nvml.all_gpus()
        facts.visible = visible_gpus(nvml, env=env)
        return facts
    except NVMLUnavailable as e:
        return NVMLFacts(False, reason=str(e))
    except Exception as e:
        return NVMLFacts(False, reason=f"NVML failed: {type(e).__name__}: {e}")


def _install_hint(backend: str) -> str:
    from keras_gpu_tools import _backends

    return _backends.get(backend).install_hint


def diagnose(fw: FrameworkFacts, nv: NVMLFacts, env: dict[str, str]) -> list[Finding]:
    out: list[Finding] = []
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    physical = [g for g in nv.all_gpus if not g.is_mig]
    if fw.error:
        out.append(Finding("problem", f"The {fw.backend} backend could not be inspected: {fw.error}"))
    if not nv.available and not fw.gpus:
        out.append(
            Finding(
                "problem",
                "No NVIDIA GPU is usable: "
                + (nv.reason or "NVML is unavailable")
                + ". On a machine with a GPU, check that the NVIDIA driver is installed "
                "(`nvidia-smi` should list the GPU); in a container, run it with GPU access "
                "(`docker run --gpus all`). Training runs on the CPU.",
            )
        )
        if fw.built_with_cuda is False:
            out.append(
                Finding(
                    "warn",
                    f"This {fw.backend} build has no CUDA support either: on a GPU machine, "
                    + _install_hint(fw.backend)
                    + ".",
                )
            )
        return out
    if nv.available and not physical:
        out.append(Finding("problem", "The NVIDIA driver is loaded but reports no GPU. Training runs on the CPU."))
        return out
    if nv.available and not nv.visible:
        out.append(
            Finding(
                "problem",
                f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU from this process "
                f"({len(physical)} installed). Unset it or list the GPUs to use.",
            )
        )
    if nv.available and nv.visible and not fw.gpus and not fw.error:
        why = ""
        if fw.built_with_cuda is False:
            why = f"this {fw.backend} build has no CUDA support; "
        out.append(
            Finding(
                "problem",
                f"NVML sees {len(nv.visible)} GPU(s) but {fw.backend} sees none: {why}"
                + _install_hint(fw.backend)
                + ".",
            )
        )
    elif nv.available and fw.gpus and len(fw.gpus) != len(nv.visible):
        out.append(
            Finding(
                "warn",
                f"{fw.backend} sees {len(fw.gpus)} GPU(s), NVML maps {len(nv.visible)} from "
                f"CUDA_VISIBLE_DEVICES={cvd!r}: a device was hidden by the framework's own "
                "settings (e.g. tf.config.set_visible_devices) or the mapping is ambiguous.",
            )
        )
    elif fw.gpus:
        out.append(Finding("ok", f"{fw.backend} uses {len(fw.gpus)} GPU(s): " + ", ".join(fw.gpus) + "."))
    if not nv.available and fw.gpus:
        out.append(
            Finding(
                "warn",
                f"{fw.backend} sees GPUs but NVML is unavailable ({nv.reason}): "
                "GPUUtilizationLogger cannot read utilization; `pip install nvidia-ml-py`.",
            )
        )
    names = {g.name for g in physical}
    if (
        len(names) > 1
        and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID"
        and cvd
        and any(c.isdigit() for c in cvd.split(",")[0])
    ):
        out.append(
            Finding(
                "warn",
                "GPUs of different models and numeric CUDA_VISIBLE_DEVICES: CUDA orders them "
                "fastest first, NVML by PCI bus. Set CUDA_DEVICE_ORDER=PCI_BUS_ID so the "
                "numbers agree.",
            )
        )
    for i, g in enumerate(nv.visible):
        out.append(Finding("info", f"GPU:{i} mixed precision: {mixed_precision_advice(g.compute_capability)}"))
    for note in fw.notes:
        out.append(Finding("info", note))
    return out


def mixed_precision_advice(cc) -> str:
    if not cc:
        return "compute capability unknown."
    major, minor = cc
    if (major, minor) >= (8, 0):
        return (
            f"compute capability {major}.{minor}: tensor cores for float16 and bfloat16; "
            "use keras.mixed_precision.set_global_policy('mixed_bfloat16') (no loss scaling needed)."
        )
    if (major, minor) >= (7, 0):
        return (
            f"compute capability {major}.{minor}: tensor cores for float16 only; use 'mixed_float16' "
            "(Keras adds loss scaling); bfloat16 would be emulated and slow."
        )
    return f"compute capability {major}.{minor}: no tensor cores; mixed precision will not speed training up."


def render(fw: FrameworkFacts, nv: NVMLFacts, findings: list[Finding], env: dict[str, str]) -> str:
    import keras

    lines = ["keras-gpu-tools doctor", "=" * 22, ""]
    lines.append(f"Python {platform.python_version()} on {platform.system()} {platform.machine()}")
    lines.append(f"Keras {keras.__version__}, backend: {fw.backend} {fw.version}")
    policy = keras.config.dtype_policy().name
    lines.append(f"Global dtype policy: {policy}")
    lines.append("")
    lines.append(f"[{fw.backend}]")
    lines.append(f"  GPUs seen: {', '.join(fw.gpus) if fw.gpus else 'none'}")
    if fw.built_with_cuda is not None:
        lines.append(f"  built with CUDA: {'yes' if fw.built_with_cuda else 'no'}")
    if fw.cuda_version or fw.cudnn_version:
        lines.append(f"  CUDA {fw.cuda_version or '?'}, cuDNN {fw.cudnn_version or '?'}")
    lines.append("")
    lines.append("[NVML]")
    if nv.available:
        lines.append(f"  driver {nv.driver or '?'}, CUDA driver API {nv.cuda_driver or '?'}")
        for g in nv.all_gpus:
            mem = f"{g.memory_total_bytes / 2**30:.1f} GiB" if g.memory_total_bytes else "? GiB"
            cc = ".".join(map(str, g.compute_capability)) if g.compute_capability else "?"
            lines.append(f"  {g.label}: {mem}, compute capability {cc}")
        lines.append(
            f"  CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES')!r} -> this process uses: "
            + (", ".join(f"GPU:{i} = {g.label}" for i, g in enumerate(nv.visible)) or "none")
        )
    else:
        lines.append(f"  unavailable: {nv.reason}")
    lines.append("")
    lines.append("Findings")
    marks = {"ok": "OK  ", "warn": "WARN", "problem": "FAIL", "info": "INFO"}
    for f in findings:
        lines.append(f"  [{marks[f.level]}] {f.text}")
    return "\n".join(lines)


def run(backend: str | None = None, nvml: NVML | None = None, env: dict[str, str] | None = None) -> str:
    import keras

    env = dict(os.environ if env is None else env)
    fw = framework_facts(backend or keras.backend.backend())
    nv = nvml_facts(nvml, env)
    findings = diagnose(fw, nv, env) + policy_findings(nv)
    return render(fw, nv, findings, env)


def policy_findings(nv: NVMLFacts) -> list[Finding]:
    """The global dtype policy against the GPUs in use (check_mixed_precision)."""
    from keras_gpu_tools._core.mixed_precision import check_mixed_precision

    caps = [g.compute_capability for g in nv.visible if g.compute_capability]
    try:
        found = check_mixed_precision(None, compute_capabilities=caps)
    except Exception as e:  # the doctor reports, it does not crash
        return [Finding("warn", f"The mixed-precision check failed: {type(e).__name__}: {e}")]
    return [Finding("warn", f"mixed precision: {f.message}") for f in found]


if __name__ == "__main__":  # pragma: no cover
    print(run())
    sys.exit(0)
