"""Who am I in the job: process index and count, the devices of one step, the job's channel.

A Keras job that scales out runs one process over several devices
(``keras.distribution.DataParallel`` on JAX, ``tf.distribute.MirroredStrategy``)
or one process per host or GPU (``keras.distribution.initialize``, which runs
on ``jax.distributed``). Each backend fills a :class:`Topology` from its engine
(``Backend.topology``); where the engine knows of one process only, the usual
launcher variables say whether the process is one of several anyway (then its
logs are kept apart, and job-wide figures are left out: there is no channel).

The channel (:class:`KVExchange`) is the engine's own coordination service: the
JAX distributed client's key-value store. It works over the network between
processes, needs no device memory (so it works after an out-of-memory error)
and is used once per epoch or once per OOM, never per step.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from keras_gpu_tools.logdir import schema

# (index variable, count variable) of the launchers users start jobs with, in
# order: torchrun / torch.distributed, SLURM, Open MPI, MPICH / Intel MPI.
LAUNCHER_VARIABLES = (
    ("RANK", "WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),  # a step's tasks (srun), not the allocation's
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
)

KEY_PREFIX = "keras_gpu_tools"


class ExchangeError(RuntimeError):
    """The job's channel failed or a process did not answer in time."""


@dataclasses.dataclass(frozen=True)
class Topology:
    """This process's place in the job (one process over one device: the defaults)."""

    process_index: int = 0
    process_count: int = 1
    #: job-wide ids of this process's accelerators in the framework's order
    #: (``GPU:0`` first); None where the engine does not number them job-wide
    device_ids: tuple[int, ...] | None = None
    #: devices that run one training step, every process's together
    devices_in_step: int = 1
    #: the distribution in words ("keras.distribution DataParallel, mesh (2,)")
    engine: str = "one device"
    #: where the process index came from ("jax.distributed", "RANK/WORLD_SIZE", ...)
    source: str = "one process"
    host: str = dataclasses.field(default_factory=socket.gethostname)
    #: the job's channel (None: one process, or the engine gives none)
    exchange: Any = dataclasses.field(default=None, compare=False, repr=False)
    #: where another training writes the same log directory at once: this one's runs' own name
    #: under each run (``<host>_pid<pid>``, see ``logdir/claim.py``); "" where it is alone
    training: str = ""

    @property
    def multi_process(self) -> bool:
        return self.process_count > 1

    @property
    def is_chief(self) -> bool:
        """Whether this process writes the job-wide figures (process 0)."""
        return self.process_index == 0

    def run_dir(self, log_dir: str, run_name: str) -> str:
        """This process's TensorBoard run: ``log_dir/run_name``, with ``/process_<i>`` in a job of several.

        A training that found another writing ``log_dir`` at the same time: ``log_dir/run_name/<host>_pid<pid>``.
        """
        base = os.path.join(log_dir, run_name)
        if self.multi_process:
            return os.path.join(base, schema.process_run(self.process_index))
        return os.path.join(base, self.training) if self.training else base

    def job_run_dir(self, log_dir: str, run_name: str) -> str:
        """The run of the job-wide figures (process 0 writes it): ``log_dir/run_name/job``."""
        return os.path.join(log_dir, run_name, schema.JOB_RUN)

    def device_label(self, local_index: int) -> str:
        """A device's name unambiguous across the job: its job-wide id, or ``<host>:<local index>``."""
        if not self.multi_process:
            return str(local_index)
        ids = self.device_ids
        if ids is not None and 0 <= local_index < len(ids):
            return str(ids[local_index])
        return f"{self.host}:{local_index}"

    def describe(self) -> str:
        where = f"process {self.process_index} of {self.process_count}" if self.multi_process else "one process"
        return f"{self.engine}; {where} ({self.source}); {self.devices_in_step} device(s) per step"


def from_launcher(env: Mapping[str, str] | None = None) -> tuple[int, int, str] | None:
    """``(index, count, source)`` from the launcher's variables where they say several processes, else None."""
    env = os.environ if env is None else env
    for index_var, count_var in LAUNCHER_VARIABLES:
        index, count = env.get(index_var), env.get(count_var)
        if index is None or count is None:
            continue
        try:
            i, n = int(index), int(count)
        except ValueError:
            continue
        if n > 1 and 0 <= i < n:
            return i, n, f"{index_var}/{count_var}"
    return None


def single(engine: str = "one device", devices_in_step: int = 1, device_ids=None, env: dict | None = None) -> Topology:
    """A process the engine knows as the only one: the launcher may still say it is one of several."""
    found = from_launcher(env)
    if found is None:
        return Topology(engine=engine, devices_in_step=devices_in_step, device_ids=device_ids)
    i, n, source = found
    return Topology(
        process_index=i,
        process_count=n,
        engine=f"{engine} in each of {n} processes that train independently",
        source=source,
        devices_in_step=devices_in_step,
        device_ids=None,
    )


class JobGather:
    """A callback's per-fit use of the channel: keys of its own, a warning once when it fails.

    After a failure (a process that does not answer within ``timeout_s``) it
    gives up for the rest of the fit: the job's figures are left out rather
    than stalling every epoch end. It says so in the store, and each gather
    first looks there (one look-up): a process that gave up is not waited for
    again by the others, whose last gather may have succeeded (the late
    process found everyone's figures there) and who would otherwise stall the
    job a second time at their next one.
    """

    def __init__(
        self,
        topology: Topology,
        namespace: str,
        warn: Callable[[str], None],
        timeout_s: float = 60.0,
    ):
        self.topology = topology
        self.namespace = namespace
        self.warn = warn
        self.timeout_s = timeout_s
        self.failed = topology.exchange is None
        self._previous: str | None = None  # the key of the last gather that succeeded

    @property
    def active(self) -> bool:
        return self.topology.multi_process and not self.failed

    def gather(self, tag: str, value: Any) -> list[Any] | None:
        """Every process's ``value`` (by process index), or None where it cannot be had."""
        if not self.active:
            return None
        exchange = self.topology.exchange
        quitters = exchange.gave_up(self.namespace) if hasattr(exchange, "gave_up") else {}
        if quitters:
            i = min(quitters)
            self.failed = True
            self.warn(
                f"job-wide figures are left out for the rest of this fit(): process {i} gave up on the job's "
                f"channel ({quitters[i]})"
            )
            return None
        key = f"{self.namespace}/{tag}"
        try:
            if hasattr(exchange, "gather_round"):  # the fit's JobChannel: one deadline per tag for all callbacks
                out = exchange.gather_round(key, value, self.timeout_s, tag)
            else:
                out = exchange.gather(key, value, self.timeout_s)
        except ExchangeError as e:
            self.give_up(str(e))
            self.warn(f"job-wide figures are left out for the rest of this fit(): {e}")
            return None
        # Every process wrote this key after reading the previous one: this
        # process's previous value is read by all and can go (the store would
        # otherwise grow by a value per process, epoch and callback).
        if self._previous is not None and hasattr(exchange, "delete"):
            exchange.delete(self._previous)
        self._previous = key
        return out

    def give_up(self, reason: str) -> None:
        """Stops exchanging for the rest of the fit, and tells the other processes (no wait)."""
        if self.failed:
            return
        self.failed = True
        exchange = self.topology.exchange
        if self.topology.multi_process and hasattr(exchange, "give_up"):
            exchange.give_up(self.namespace, reason)


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """``min``, ``mean``, ``max`` of the known values (None if none is known)."""
    known = [float(v) for v in values if v is not None]
    if not known:
        return None
    return {"min": min(known), "mean": sum(known) / len(known), "max": max(known)}
