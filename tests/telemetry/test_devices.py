"""CUDA_VISIBLE_DEVICES -> NVML mapping and the NVML accessor, with a fake NVML."""

import pytest

from keras_gpu_tools.telemetry.devices import (
    DeviceSelectionError,
    parse_visible_devices,
    select_devices,
    visible_gpus,
)
from keras_gpu_tools.telemetry.nvml import NA, NVML, NVMLUnavailable
from tests.helpers.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, FakeGPU, FakeNVML


def four_gpus():
    gpus = [FakeGPU(uuid=f"GPU-{i}aaaaaaa-1111-2222-3333-44444444444{i}", name=f"GPU{i}") for i in range(4)]
    return FakeNVML(gpus)


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("0,2", [0, 2]),
        (" 1 , 0 ", [1, 0]),
        ("1,-1,0", [1]),  # CUDA stops at the first invalid entry
        ("GPU-abc,1", ["GPU-abc", 1]),
    ],
)
def test_parse_visible_devices(value, expected):
    assert parse_visible_devices(value) == expected


def test_unset_means_every_gpu_in_nvml_order():
    gpus = visible_gpus(NVML(four_gpus()), env={})
    assert [g.name for g in gpus] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert [g.nvml_index for g in gpus] == [0, 1, 2, 3]


def test_indices_are_reordered_as_cuda_does():
    gpus = visible_gpus(NVML(four_gpus()), env={"CUDA_VISIBLE_DEVICES": "2,0"})
    # GPU:0 of the framework is NVML device 2.
    assert [g.nvml_index for g in gpus] == [2, 0]


def test_uuid_and_uuid_prefix_entries():
    fake = four_gpus()
    env = {"CUDA_VISIBLE_DEVICES": f"{fake.gpus[3].uuid},GPU-1aaa"}
    assert [g.nvml_index for g in visible_gpus(NVML(fake), env=env)] == [3, 1]


def test_invalid_entry_hides_the_rest():
    env = {"CUDA_VISIBLE_DEVICES": "1,7,0"}
    assert [g.nvml_index for g in visible_gpus(NVML(four_gpus()), env=env)] == [1]


def test_no_gpu_visible():
    assert visible_gpus(NVML(four_gpus()), env={"CUDA_VISIBLE_DEVICES": ""}) == []


def test_mig_instances_by_uuid():
    migs = [
        FakeGPU(
            name="NVIDIA A100 MIG 1g.10gb",
            uuid=f"MIG-{j}bbbbbbb-0000-0000-0000-00000000000{j}",
            memory_total=10 * 2**30,
        )
        for j in range(2)
    ]
    parent = FakeGPU(
        name="NVIDIA A100-SXM4-80GB",
        uuid="GPU-parent00-0000-0000-0000-000000000000",
        compute_capability=(8, 0),
        mig=migs,
    )
    nvml = NVML(FakeNVML([parent]))
    gpus = visible_gpus(nvml, env={"CUDA_VISIBLE_DEVICES": migs[1].uuid})
    assert len(gpus) == 1 and gpus[0].is_mig and gpus[0].mig_index == 1
    assert gpus[0].memory_total_bytes == 10 * 2**30
    # The compute capability comes from the parent GPU.
    assert gpus[0].compute_capability == (8, 0)
    # Unset: CUDA exposes a MIG instance, not the parent.
    assert visible_gpus(nvml, env={})[0].is_mig


def test_select_devices_by_index_and_uuid():
    visible = visible_gpus(NVML(four_gpus()), env={"CUDA_VISIBLE_DEVICES": "3,1"})
    assert [(i, g.nvml_index) for i, g in select_devices(visible, None)] == [(0, 3), (1, 1)]
    assert [(i, g.nvml_index) for i, g in select_devices(visible, [1])] == [(1, 1)]
    assert [(i, g.nvml_index) for i, g in select_devices(visible, ["GPU-3aaa"])] == [(0, 3)]


@pytest.mark.parametrize(
    "devices, fragment", [([2], "GPU index 2 does not exist"), (["GPU-zzz"], "no visible GPU has the UUID")]
)
def test_select_unknown_device_names_argument_and_value(devices, fragment):
    visible = visible_gpus(NVML(four_gpus()), env={"CUDA_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(DeviceSelectionError) as info:
        select_devices(visible, devices)
    message = str(info.value)
    assert "`devices`" in message and repr(devices) in message and fragment in message


def test_nvml_unavailable_is_reported_once_with_reason():
    fake = FakeNVML(init_error=NVML_ERROR_LIBRARY_NOT_FOUND)
    nvml = NVML(fake)
    assert not nvml.available()
    assert "Library Not Found" in nvml.unavailable_reason
    with pytest.raises(NVMLUnavailable):
        nvml.query("nvmlDeviceGetCount")
    assert fake.count("nvmlInit") == 1  # not retried on every query


def test_query_returns_na_for_unsupported_and_missing_functions():
    gpu = FakeGPU(unsupported={"nvmlDeviceGetPowerUsage"})
    nvml = NVML(FakeNVML([gpu]))
    reasons = []
    assert nvml.query("nvmlDeviceGetPowerUsage", gpu, on_unsupported=reasons.append) is NA
    assert nvml.query("nvmlDeviceGetSomethingNew", gpu, on_unsupported=reasons.append) is NA
    assert len(reasons) == 2 and "Not Supported" in reasons[0]
    assert not NA  # never usable as a number by accident
