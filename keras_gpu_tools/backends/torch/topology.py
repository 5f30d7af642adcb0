"""torch's devices, and what ``doctor`` reports of them (fit() on torch trains on one device)."""

from __future__ import annotations

from keras_gpu_tools.backends.base import Backend
from keras_gpu_tools.backends.torch.memory import available_cuda
from keras_gpu_tools.runtime.topology import Topology


class TorchTopology(Backend):
    """Devices of the torch backend."""

    def gpu_devices(self) -> list[str]:
        cuda = available_cuda()
        if cuda is None:
            return []
        return [f"cuda:{i} ({cuda.get_device_name(i)})" for i in range(cuda.device_count())]

    def framework_facts(self, facts) -> None:
        import torch

        facts.version = torch.__version__
        facts.built_with_cuda = torch.version.cuda is not None
        facts.cuda_version = torch.version.cuda
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        facts.cudnn_version = str(cudnn) if cudnn else None
        if torch.cuda.is_available():
            facts.gpus = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]

    def distribution_notes(self, topology: Topology, gpus: int, env: dict[str, str]) -> list[tuple[str, str]]:
        if gpus < 2:
            return []
        return [
            (
                "warn",
                f"{gpus} GPUs are visible, but Keras's fit() on the torch backend trains on one (the current "
                "CUDA device); the others stay idle. For data parallelism with fit(), use the JAX backend "
                "(keras.distribution.DataParallel) or TensorFlow (tf.distribute.MirroredStrategy).",
            )
        ]
