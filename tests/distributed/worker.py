"""One process of a job started by ``launch.py``: join, run the scenario, write its result."""

import faulthandler
import json
import os
import signal
import sys
from pathlib import Path

faulthandler.register(signal.SIGUSR1, all_threads=True)  # launch.py asks for the stacks of a hung job

scenario, index, count, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], Path(sys.argv[5])

import jax  # noqa: E402

# Collectives between CPU processes need gloo; GPU devices use NCCL whatever this says.
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import keras  # noqa: E402

from tests.helpers.fresh_process import tensorflow_hidden  # noqa: E402

with tensorflow_hidden():  # Keras seeds TensorFlow too where installed: an import this JAX job never uses
    keras.distribution.initialize(job_addresses=f"localhost:{port}", num_processes=count, process_id=index)

import importlib  # noqa: E402

module, _, function = scenario.rpartition(".")  # "scenarios.topology": a module of tests/distributed
args = json.loads((out / "args.json").read_text())
result = getattr(importlib.import_module(f"tests.distributed.{module or 'scenarios'}"), function)(
    index, count, out, **args
)
exit_at_once = result.pop("exit_at_once", False)
(out / f"result_{index}.json").write_text(json.dumps(result))
if exit_at_once:  # a job whose other process died: JAX's shutdown would wait for it at exit
    sys.stdout.flush()
    os._exit(0)
