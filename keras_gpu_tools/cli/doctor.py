"""`keras-gpu-tools doctor`: is my GPU used, and if not, why? And how does this process scale out?

:func:`diagnose` turns facts (what the framework sees, what NVML sees, the
environment) into findings; the fact gathering is separate so the reasoning is
tested with made-up facts. Nothing here raises on a machine without a GPU.
"""

from __future__ import annotations

import os
import platform
import sys
import textwrap
from dataclasses import dataclass, field

from keras_gpu_tools.telemetry.nvml import NVML, GPUInfo, NVMLUnavailable, default_nvml

WIDTH = 100  # characters: findings are wrapped to this width


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
    # GPU:<i> -> health field -> None where the GPU reports it, else why not
    health: dict[str, dict[str, str | None]] = field(default_factory=dict)


@dataclass
class DistributionFacts:
    """How this process scales out: the engine, its place in the job, the launcher's word."""

    engine: str = "one device"
    process_index: int = 0
    process_count: int = 1
    source: str = "one process"  # where the index came from: "jax.distributed", "RANK/WORLD_SIZE", ...
    devices_in_step: int = 1
    channel: bool = False  # the job's key-value store is reachable (job-wide figures)
    launcher: list[str] = field(default_factory=list)  # the launcher variables set, "RANK=1"
    notes: list[tuple[str, str]] = field(default_factory=list)  # (level, text) from the backend
    error: str | None = None


@dataclass
class Finding:
    level: str  # "ok", "warn", "problem", "info"
    text: str


def framework_facts(backend: str) -> FrameworkFacts:
    """What the Keras backend in use sees. Imports only that framework."""
    facts = FrameworkFacts(backend)
    try:
        from keras_gpu_tools import backends

        backends.get(backend).framework_facts(facts)
    except Exception as e:  # a broken install is a finding, not a crash
        facts.error = f"{type(e).__name__}: {e}"
    return facts


def distribution_facts(backend: str, gpus: int, env: dict[str, str] | None = None) -> DistributionFacts:
    """The distribution in use (``keras.distribution``, a ``tf.distribute`` scope, launcher variables)."""
    from keras_gpu_tools.runtime import topology as topo

    env = dict(os.environ if env is None else env)
    facts = DistributionFacts()
    facts.launcher = [
        f"{name}={env[name]}" for pair in topo.LAUNCHER_VARIABLES for name in pair if env.get(name) is not None
    ]
    try:
        from keras_gpu_tools import backends

        b = backends.get(backend)
        t = b.topology(None)  # outside any fit: the engine's own state
        facts.engine, facts.source, facts.devices_in_step = t.engine, t.source, t.devices_in_step
        facts.process_index, facts.process_count = t.process_index, t.process_count
        found = topo.from_launcher(env)  # the environment given (the engine read the process's own)
        if not t.multi_process and found is not None:
            facts.process_index, facts.process_count, facts.source = found
        facts.channel = t.exchange is not None
        facts.notes = list(b.distribution_notes(t, gpus, env))
    except Exception as e:  # the doctor reports, it does not crash
        facts.error = f"{type(e).__name__}: {e}"
    return facts


def distribution_findings(d: DistributionFacts) -> list[Finding]:
    out = []
    if d.error:
        out.append(Finding("warn", f"The distribution could not be read: {d.error}"))
    if d.process_count > 1 and not d.channel:
        out.append(
            Finding(
                "warn",
                f"{d.source} say this is process {d.process_index} of {d.process_count}, but the Keras backend "
                "knows of one process: each process trains a model of its own, and keras_gpu_tools keeps their "
                "logs apart (log_dir/<run>/process_<i>) without job-wide figures. To train one model over "
                "several processes, use the JAX backend and call keras.distribution.initialize() first.",
            )
        )
    out += [Finding(level, text) for level, text in d.notes]
    return out


def nvml_facts(nvml: NVML | None = None, env: dict[str, str] | None = None) -> NVMLFacts:
    from keras_gpu_tools.telemetry.devices import visible_gpus

    nvml = nvml or default_nvml()
    try:
        facts = NVMLFacts(True, driver=nvml.driver_version(), cuda_driver=nvml.cuda_driver_version())
        facts.all_gpus = nvml.all_gpus()
        facts.visible = visible_gpus(nvml, env=env)
        facts.health = health_support(nvml, facts.visible)
        return facts
    except NVMLUnavailable as e:
        return NVMLFacts(False, reason=str(e))
    except Exception as e:
        return NVMLFacts(False, reason=f"NVML failed: {type(e).__name__}: {e}")


def health_support(nvml: NVML, gpus: list[GPUInfo]) -> dict[str, dict[str, str | None]]:
    """Each GPU's health fields, read the way GPUUtilizationLogger reads them: None if reported, else why not."""
    import time
    import warnings

    from keras_gpu_tools.runtime.warn_once import WarnOnce
    from keras_gpu_tools.telemetry.health import XidWatcher, field_support
    from keras_gpu_tools.telemetry.sampler import GPUProbe

    out: dict[str, dict[str, str | None]] = {}
    for i, gpu in enumerate(gpus):
        warn = WarnOnce()
        probe = GPUProbe(nvml, i, gpu, warn, pcie=False)
        xid = XidWatcher(nvml, [probe], warn)
        try:
            with warnings.catch_warnings():  # the reasons are listed instead
                warnings.simplefilter("ignore")
                out[f"GPU:{i}"] = field_support(nvml, probe, xid, time.sleep)
        except Exception as e:  # the doctor reports, it does not crash
            out[f"GPU:{i}"] = {"(all)": f"reading the GPU failed: {type(e).__name__}: {e}"}
        finally:
            xid.close()
            probe.close()
    return out


def _install_hint(backend: str) -> str:
    from keras_gpu_tools import backends

    return backends.get(backend).install_hint


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


def render(
    fw: FrameworkFacts,
    nv: NVMLFacts,
    findings: list[Finding],
    env: dict[str, str],
    dist: DistributionFacts | None = None,
) -> str:
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
    for gpu, fields in nv.health.items():
        lines.append("")
        lines.append(f"[health fields, {gpu}] (GPUUtilizationLogger)")
        for name, reason in fields.items():
            lines.append(f"  {name}: " + ("supported" if reason is None else f"not reported: {reason}"))
    if dist is not None:
        lines.append("")
        lines.append("[distribution]")
        lines.append(f"  engine: {dist.engine}")
        where = (
            f"process {dist.process_index} of {dist.process_count} ({dist.source})"
            if dist.process_count > 1
            else "one process"
        )
        lines.append(f"  {where}; {dist.devices_in_step} device(s) per training step")
        if dist.process_count > 1:
            lines.append(f"  job's channel (JAX distributed key-value store): {'yes' if dist.channel else 'no'}")
        if dist.launcher:
            lines.append(f"  launcher variables: {', '.join(dist.launcher)}")
    lines.append("")
    lines.append("Findings")
    marks = {"ok": "OK  ", "warn": "WARN", "problem": "FAIL", "info": "INFO"}
    for f in findings:  # wrapped: a finding is a paragraph, a terminal line is not
        lines.append(
            textwrap.fill(
                f"  [{marks[f.level]}] {f.text}",
                WIDTH,
                subsequent_indent=" " * 9,
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)


def run(backend: str | None = None, nvml: NVML | None = None, env: dict[str, str] | None = None) -> str:
    """What `keras-gpu-tools doctor` prints on this machine."""
    return examine(backend, nvml, env)[0]


def examine(
    backend: str | None = None, nvml: NVML | None = None, env: dict[str, str] | None = None
) -> tuple[str, list[Finding]]:
    """What `keras-gpu-tools doctor` prints, and its findings (the exit status: :func:`exit_code`)."""
    import keras

    env = dict(os.environ if env is None else env)
    fw = framework_facts(backend or keras.backend.backend())
    nv = nvml_facts(nvml, env)
    dist = distribution_facts(fw.backend, max(len(fw.gpus), len(nv.visible)), env)
    findings = diagnose(fw, nv, env) + distribution_findings(dist) + policy_findings(nv)
    return render(fw, nv, findings, env, dist), findings


def exit_code(findings: list[Finding]) -> int:
    """1 where a finding is a problem (printed ``[FAIL]``), else 0: scripts and CI can gate on the doctor."""
    return 1 if any(f.level == "problem" for f in findings) else 0


def policy_findings(nv: NVMLFacts) -> list[Finding]:
    """The global dtype policy against the GPUs in use (check_mixed_precision)."""
    from keras_gpu_tools.mixed_precision.check import check_mixed_precision

    caps = [g.compute_capability for g in nv.visible if g.compute_capability]
    try:
        found = check_mixed_precision(None, compute_capabilities=caps)
    except Exception as e:  # the doctor reports, it does not crash
        return [Finding("warn", f"The mixed-precision check failed: {type(e).__name__}: {e}")]
    return [Finding("warn", f"mixed precision: {f.message}") for f in found]


if __name__ == "__main__":  # pragma: no cover
    _text, _findings = examine()
    print(_text)
    sys.exit(exit_code(_findings))
