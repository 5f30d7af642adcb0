"""Dense peak FLOP/s of NVIDIA GPUs, by NVML name and compute dtype, and where each figure comes from.

Figures are NVIDIA's published numbers for dense math (no structured
sparsity: where a datasheet quotes "with sparsity", the figure here is half).
``fp32`` is the plain FP32 (CUDA core) rate, ``tf32``/``fp16``/``bf16``/``fp8``
the Tensor Core rates with FP32 accumulation, the ones training uses. On
GeForce cards (RTX 3090, RTX 4090) the Tensor Core rate with FP32 accumulate
is half the FP16-accumulate rate their spec pages lead with; the table holds
the FP32-accumulate one. A GPU or dtype that is not in the table has no peak,
and then no MFU is reported: it is never guessed. :data:`SOURCES` names the
document and table behind each row (``docs/mfu.md`` shows them all).

The dtype that matters is that of the matrix multiplications. For a float32
model that is TF32 where the framework uses it: TensorFlow by default (on
Ampere and later), JAX by default (``jax_default_matmul_precision`` unset), and
torch only with ``torch.backends.cuda.matmul.allow_tf32 = True``.
"""

from __future__ import annotations

import re

T = 1e12

# (pattern matched against the normalised NVML name, label, {dtype: TFLOP/s dense})
# More specific patterns first. NVML names users see are in tests/telemetry/test_peaks.py.
_PEAKS: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"gh200", "GH200", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}),
    (r"h200 nvl", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5}),
    (r"h200", "H200 SXM", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}),
    (r"h100 nvl", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "fp16": 835.5, "bf16": 835.5, "fp8": 1670.5}),
    (r"h100 pcie", "H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "fp16": 756.5, "bf16": 756.5, "fp8": 1513.0}),
    (r"h100", "H100 SXM", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}),
    (r"h800", "H800 SXM", {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}),
    (r"b200", "B200", {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0}),
    (r"a100", "A100", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    (r"a800", "A800", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}),
    (r"l40s", "L40S", {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0}),
    (r"l40", "L40", {"fp32": 90.5, "tf32": 90.5, "fp16": 181.0, "bf16": 181.0, "fp8": 362.0}),
    (r"\bl4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5}),
    (r"\ba10g\b", "A10G", {"fp32": 35.0, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0}),
    (r"\ba10\b", "A10", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0}),
    (r"\ba40\b", "A40", {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7}),
    (r"\bt4\b", "T4", {"fp32": 8.1, "fp16": 65.0}),
    (r"v100.*pcie", "V100 PCIe", {"fp32": 14.0, "fp16": 112.0}),
    (r"v100", "V100 SXM2", {"fp32": 15.7, "fp16": 125.0}),
    (r"rtx 6000 ada", "RTX 6000 Ada", {"fp32": 91.1, "tf32": 182.1, "fp16": 364.2, "bf16": 364.2, "fp8": 728.5}),
    (r"rtx a6000", "RTX A6000", {"fp32": 38.7, "tf32": 77.4, "fp16": 154.8, "bf16": 154.8}),
    (r"rtx 4090$", "GeForce RTX 4090", {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}),
    (r"rtx 3090$", "GeForce RTX 3090", {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0}),
)

_HOPPER_WP = 'NVIDIA H100 Tensor Core GPU Architecture whitepaper, table "NVIDIA H100 compared to A100" (SXM5)'
#: Where each row's figures come from: the document, and the table in it.
SOURCES: dict[str, str] = {
    "GH200": "NVIDIA GH200 Grace Hopper Superchip datasheet, specifications table (sparse figures halved)",
    "H200 NVL": "NVIDIA H200 Tensor Core GPU datasheet, specifications table, H200 NVL column (sparse figures halved)",
    "H200 SXM": "NVIDIA H200 Tensor Core GPU datasheet, specifications table, H200 SXM column (sparse figures "
    "halved; the same GH100 rates as H100 SXM, whose exact dense values are in " + _HOPPER_WP + ")",
    "H100 NVL": "NVIDIA H100 Tensor Core GPU datasheet, specifications table, H100 NVL column (sparse figures halved)",
    "H100 PCIe": "NVIDIA H100 Tensor Core GPU datasheet, specifications table, H100 PCIe column (sparse figures halved)",
    "H100 SXM": _HOPPER_WP + "; NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column",
    "H800 SXM": "the H100 SXM figures (" + _HOPPER_WP + "): the H800 is an H100 SXM with less NVLink bandwidth",
    "B200": "NVIDIA Blackwell datasheet (GB200 NVL72 / HGX B200), technical specifications table, HGX B200 "
    "individual GPU column (tensor figures with sparsity, halved)",
    "A100": "NVIDIA A100 Tensor Core GPU datasheet, specifications table: the same figures for 40GB/80GB, SXM and PCIe",
    "A800": "NVIDIA A800 datasheet, specifications table (the A100's compute)",
    "L40S": "NVIDIA L40S datasheet, specifications table (sparse figures halved)",
    "L40": "NVIDIA L40 datasheet, specifications table (sparse figures halved)",
    "L4": "NVIDIA L4 Tensor Core GPU datasheet, specifications table (sparse figures halved)",
    "A10G": "no NVIDIA datasheet: AWS's figures for the EC2 G5 instances' A10G, as tabled in Baseten's "
    '"NVIDIA A10 vs A10G for ML model inference" spec sheet (GA102 with GeForce-like tensor rates)',
    "A10": "NVIDIA A10 Tensor Core GPU datasheet, specifications table (sparse figures halved)",
    "A40": "NVIDIA A40 datasheet, specifications table: BF16/TF32 with FP32 accumulate (sparse figures halved)",
    "T4": "NVIDIA T4 Tensor Core GPU datasheet, specifications table: single precision 8.1, mixed precision "
    "(FP16/FP32) 65 TFLOPS (Turing: no TF32, no BF16)",
    "V100 PCIe": "NVIDIA V100 Tensor Core GPU datasheet, specifications table, PCIe column",
    "V100 SXM2": "NVIDIA V100 Tensor Core GPU datasheet, specifications table, SXM2 column",
    "RTX 6000 Ada": "NVIDIA RTX 6000 Ada Generation datasheet, specifications table (sparse figures halved)",
    "RTX A6000": "NVIDIA RTX A6000 datasheet, specifications table (sparse figures halved)",
    "GeForce RTX 4090": 'NVIDIA Ada GPU Architecture whitepaper, appendix table "GeForce RTX 4090": Tensor Core '
    "rates with FP32 accumulate (FP16-accumulate rates are twice these and do not apply to training)",
    "GeForce RTX 3090": 'NVIDIA Ampere GA102 GPU Architecture whitepaper, appendix table "GeForce RTX 3090": Tensor '
    "Core rates with FP32 accumulate (FP16-accumulate rates are twice these and do not apply to training)",
}

_DTYPE_ALIASES = {
    "float32": "fp32",
    "fp32": "fp32",
    "tf32": "tf32",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float8": "fp8",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}


def _normalise(name: str) -> str:
    return re.sub(r"\s+", " ", name.lower().replace("nvidia", "").replace("tesla", "").replace("-", " ")).strip()


def source(label: str) -> str | None:
    """Where the figures of the table's row ``label`` (as :func:`lookup` returns it) come from."""
    return SOURCES.get(label)


def lookup(nvml_name: str) -> tuple[str, dict[str, float]] | None:
    """(label, {dtype: TFLOP/s}) for an NVML device name, or None if unknown."""
    if not nvml_name:
        return None
    name = _normalise(nvml_name)
    for pattern, label, peaks in _PEAKS:
        if re.search(pattern, name):
            return label, dict(peaks)
    return None


def peak_flops(nvml_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of the GPU for ``dtype``, or None where unknown."""
    found = lookup(nvml_name)
    key = _DTYPE_ALIASES.get(str(dtype).lower())
    if found is None or key is None:
        return None
    value = found[1].get(key)
    return value * T if value else None


def matmul_dtype(compute_dtype: str, tf32: bool) -> str:
    """The dtype whose peak applies: float32 becomes tf32 where the framework uses TF32 (``Backend.uses_tf32``)."""
    key = _DTYPE_ALIASES.get(str(compute_dtype).lower(), str(compute_dtype).lower())
    if key == "fp32" and tf32:
        return "tf32"
    return key


# -- FLOPs of a JAX step -------------------------------------------------------------
def _prod(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


def jaxpr_flops(jaxpr) -> float:
    """Matmul and convolution FLOPs of a (closed) jaxpr, sub-jaxprs included.

    The count MFU conventionally uses: ``2 * M * N * K`` per ``dot_general``
    and ``2 * output elements * kernel window * input features per group``
    per convolution; elementwise work is left out. A ``scan`` counts its body
    ``length`` times, a ``cond`` its most expensive branch, a ``while`` its
    body once (its trip count is not known before it runs).
    """
    return sum(flops for _, flops in jaxpr_op_flops(jaxpr))


def _eqn_flops(eqn) -> float:
    name = eqn.primitive.name
    if name == "dot_general":
        (contract, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * _prod(eqn.outvars[0].aval.shape) * _prod(lhs[i] for i in contract)
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        spec = eqn.params["dimension_numbers"].rhs_spec  # (out feature, in feature, spatial...)
        return 2.0 * _prod(eqn.outvars[0].aval.shape) * rhs[spec[1]] * _prod(rhs[d] for d in spec[2:])
    return 0.0


def jaxpr_op_flops(jaxpr, scope: str = "") -> list[tuple[str, float]]:
    """Each matmul's and convolution's FLOPs in a (closed) jaxpr, with its name stack (as :func:`jaxpr_flops` counts).

    The name stack is the equation's own under its callers' (``jvp(net)/heavy``,
    ``transpose(jvp(net))/heavy`` for the backward pass): what Keras's layer
    scopes became. A ``scan``'s ops count ``length`` times, a ``cond``'s are
    its costliest branch's.
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)
    out: list[tuple[str, float]] = []
    for eqn in inner.eqns:
        stack = str(eqn.source_info.name_stack)
        here = f"{scope}/{stack}" if scope and stack else scope or stack
        flops = _eqn_flops(eqn)
        if flops:
            out.append((here, flops))
        subs = []
        for value in eqn.params.values():
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns"):
                    subs.append(v)
        if not subs:
            continue
        found = [jaxpr_op_flops(s, here) for s in subs]
        if eqn.primitive.name == "cond":
            out.extend(max(found, key=lambda ops: sum(f for _, f in ops)))
        elif eqn.primitive.name == "scan":
            length = int(eqn.params.get("length", 1))
            out.extend((name, f * length) for ops in found for name, f in ops)
        else:
            out.extend(op for ops in found for op in ops)
    return out
