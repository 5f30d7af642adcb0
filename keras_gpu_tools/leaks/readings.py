"""One reading of a process's memory: the host, each device's allocator, live tensors, compiled functions."""

from __future__ import annotations

import dataclasses

from keras_gpu_tools.logdir import schema

MIB = 2.0**20


@dataclasses.dataclass
class Reading:
    """The process's memory at one moment (an epoch's end, or a fit's start); bytes throughout.

    A figure a backend cannot read is None (devices: left out), never zero.
    """

    epoch: int  # the fit's epoch index that just ended (-1: the fit's start)
    wall: float  # time.time() of the reading
    host_rss: float | None = None
    in_use: dict[int, float] = dataclasses.field(default_factory=dict)  # local device -> allocator bytes in use
    reserved: dict[int, float] = dataclasses.field(default_factory=dict)  # local device -> bytes the allocator holds
    tensors: tuple[int, float] | None = None  # live tensors of the framework: (count, bytes), where read
    compiled: int | None = None  # traces of the model's train/test/predict functions

    @property
    def device_in_use(self) -> float | None:
        """Every device's bytes in use, summed (None where no device reports them)."""
        return sum(self.in_use.values()) if self.in_use else None

    @property
    def device_reserved(self) -> float | None:
        return sum(self.reserved.values()) if self.reserved else None

    def figures(self) -> dict[str, float]:
        """The reading as History keys (MiB, counts); what is not known is absent."""
        out: dict[str, float] = {}
        if self.host_rss is not None:
            out[schema.MEMORY_HOST_RSS_MIB] = self.host_rss / MIB
        if self.device_in_use is not None:
            out[schema.MEMORY_DEVICE_IN_USE_MIB] = self.device_in_use / MIB
        if self.device_reserved is not None:
            out[schema.MEMORY_DEVICE_RESERVED_MIB] = self.device_reserved / MIB
        if self.tensors is not None:
            out[schema.MEMORY_LIVE_TENSORS] = float(self.tensors[0])
            out[schema.MEMORY_LIVE_TENSOR_MIB] = self.tensors[1] / MIB
        if self.compiled is not None:
            out[schema.MEMORY_COMPILED_FUNCTIONS] = float(self.compiled)
        return out
