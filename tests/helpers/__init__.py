"""What several test modules share, imported by name (``from tests.helpers.models import ...``).

``models``: small Keras models, and layers that run out of memory for real;
``data``: small arrays to fit them on; ``callbacks``: Keras callbacks that act
on a fit from outside; ``fake_nvml``: a fake ``pynvml``; ``gpu``: whether this
machine has a GPU; ``files``: hostile files (a FIFO that releases a blocked reader).
"""
