"""The peak FLOP/s table: the NVML names users see, the figures that apply to training, and their sources."""

import pytest

from keras_gpu_tools.telemetry import peaks

T = 1e12

# (NVML name as nvidia-smi prints it, the table's label, {dtype: dense TFLOP/s with FP32 accumulate})
CARDS = [
    ("Tesla T4", "T4", {"fp32": 8.1, "fp16": 65.0, "tf32": None, "bf16": None, "fp8": None}),
    ("NVIDIA L4", "L4", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5}),
    ("NVIDIA A10G", "A10G", {"fp32": 35.0, "tf32": 35.0, "fp16": 70.0, "bf16": 70.0, "fp8": None}),
    ("NVIDIA A10", "A10", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0, "fp8": None}),
    ("NVIDIA A100-SXM4-80GB", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp8": None}),
    ("NVIDIA A100-SXM4-40GB", "A100", {"tf32": 156.0, "bf16": 312.0}),
    ("NVIDIA A100-PCIE-40GB", "A100", {"tf32": 156.0, "bf16": 312.0}),
    ("NVIDIA A100 80GB PCIe", "A100", {"tf32": 156.0, "bf16": 312.0}),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9}),
    ("NVIDIA H100 PCIe", "H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp8": 1513.0}),
    ("NVIDIA H100 NVL", "H100 NVL", {"tf32": 417.5, "bf16": 835.5}),
    ("NVIDIA H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp8": 1978.9}),
    ("NVIDIA H200 NVL", "H200 NVL", {"bf16": 835.5}),
    ("NVIDIA B200", "B200", {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0}),
    # GeForce: the FP32-accumulate tensor rates (half the FP16-accumulate ones their spec pages lead with).
    ("NVIDIA GeForce RTX 3090", "GeForce RTX 3090", {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0}),
    ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090", {"fp32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3}),
]


@pytest.mark.parametrize("name,label,figures", CARDS, ids=[c[0] for c in CARDS])
def test_the_nvml_names_users_see_find_their_row_and_figures(name, label, figures):
    found = peaks.lookup(name)
    assert found is not None and found[0] == label, found
    for dtype, tflops in figures.items():
        assert peaks.peak_flops(name, dtype) == (None if tflops is None else pytest.approx(tflops * T)), dtype


def test_cards_the_table_lacks_or_nearly_matches_get_no_peak():
    # Never guessed: a card not in the table, or a variant with other clocks, has no peak (MFU is left out).
    for name in (
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA GeForce GTX 1080",
        "",
        "NVIDIA A2",
    ):
        assert peaks.lookup(name) is None, name
    assert peaks.peak_flops("Tesla T4", "bf16") is None  # Turing has no BF16 tensor cores


def test_every_row_says_where_its_figures_come_from():
    labels = [label for _, label, _ in peaks._PEAKS]
    assert len(labels) == len(set(labels))
    for label in labels:
        text = peaks.source(label)
        assert text and ("datasheet" in text or "whitepaper" in text or "no NVIDIA datasheet" in text), label


def test_the_dtype_of_the_matmuls_picks_the_figure():
    assert peaks.matmul_dtype("float32", tf32=True) == "tf32"
    assert peaks.matmul_dtype("float32", tf32=False) == "fp32"
    assert peaks.matmul_dtype("bfloat16", tf32=True) == "bf16"
    assert peaks.peak_flops("NVIDIA H100 80GB HBM3", peaks.matmul_dtype("float16", tf32=True)) == pytest.approx(
        989.4 * T
    )


def test_docs_show_every_row_with_its_figures_and_source():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "mfu.md").read_text(encoding="utf-8")

    def cell(v):
        return "-" if v is None else f"{v:g}"

    for _, label, figures in peaks._PEAKS:
        cells = [label, *(cell(figures.get(d)) for d in ("fp32", "tf32", "fp16", "bf16", "fp8")), peaks.SOURCES[label]]
        assert "| " + " | ".join(cells) + " |" in doc, label
