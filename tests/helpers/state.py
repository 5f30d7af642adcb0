"""What a model and the random states hold, to check that a call left them exactly as they were."""

import random

import numpy as np
from keras import ops

from tests.helpers.models import BACKEND


def values(model):
    """Host copies of the model's variables and its optimizer's."""
    return [np.array(ops.convert_to_numpy(v.value)) for v in model.variables + model.optimizer.variables]


def rng_states():
    """One draw of each random state a training step could advance (call it once per state to compare)."""
    from keras.src.backend.common import global_state

    seeds = global_state.get_global_attribute("global_seed_generator")
    out = {"python": random.random(), "numpy": float(np.random.rand())}
    if seeds is not None:
        out["keras"] = np.array(ops.convert_to_numpy(seeds.state.value)).tolist()
    if BACKEND == "torch":
        import torch

        out["torch"] = float(torch.rand(1))
    return out
