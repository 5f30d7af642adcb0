"""The package's Keras layers, imported on first use.

The layer modules import Keras, so their names are resolved through a module
``__getattr__`` (PEP 562): ``import keras_gpu_tools.layers`` alone imports no
framework. A layer is registered with Keras's serialization only once its
module is imported, so before loading a saved model that contains one, import
the layer (``from keras_gpu_tools.layers import MixedPrecisionOutput``) or pass
it in ``custom_objects``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from keras_gpu_tools.runtime.lazy import lazy_module

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on demand
    from keras_gpu_tools.layers.mixed_precision_output import MixedPrecisionOutput

# Public name -> the module that defines it.
_LAZY = {
    "MixedPrecisionOutput": "keras_gpu_tools.layers.mixed_precision_output",
}

__all__ = ["MixedPrecisionOutput"]


# Hidden from type checkers: they would take a module __getattr__ to mean that any
# attribute exists, and miss a misspelt name; they see the imports above instead.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_module(__name__, _LAZY, globals())
