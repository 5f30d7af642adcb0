"""Framework-free internals: NVML, sampling, TensorBoard writing, life cycle.

Nothing in this package imports Keras, TensorFlow, JAX or torch at module level.
"""
