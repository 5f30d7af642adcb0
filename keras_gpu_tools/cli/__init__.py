"""The command line: ``keras-gpu-tools doctor | demo | report``."""

from keras_gpu_tools.cli.app import main

__all__ = ["main"]
