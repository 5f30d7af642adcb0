"""The package's Keras layers."""

__all__ = []
