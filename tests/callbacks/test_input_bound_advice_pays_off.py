"""InputBoundDetector's advice, applied literally: seed-style pipelines on image files.

Each test writes a few hundred 64x64 PNG files to ``tmp_path`` and trains on them
through the pipeline a user would write first, then through the pipeline the advice
describes: real fits, whose measured figures are only checked for shape (present,
finite, adding up). What the advice says is decided on fixed figures: ``advise()``
with a highly input-bound ``SLOW`` measurement and the pipeline each real fit
inspected (``det.pipeline``, read from the dataset, not timed). The test asserts the
advice names the change, makes it, checks that the rebuilt pipeline has it, and that
the same figures no longer advise it. Whether the advice pays off (its speedup) is
measured time, which moves with the host's load: a benchmark's claim, not a test's.
"""

import math
import os
import re

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import categories
from keras_gpu_tools.input.advice import advise, workers_needed
from keras_gpu_tools.input.fit import InputFit
from keras_gpu_tools.input.measure import Measurement
from keras_gpu_tools.input.verdict import Judge

N_IMAGES = 384  # 12 batches per epoch
BATCH = 32
SIZE = 64
EPOCHS = 2  # a cache is read from the second epoch on; workers are started again every epoch
CORES = 2


def figures(wait: float, compute: float) -> Measurement:
    """A span's figures where input and compute do not overlap: step = wait + compute (seconds)."""
    step = wait + compute
    return Measurement(
        steps=12,
        sampled_steps=3,
        fetch=wait,
        compute=compute,
        other=0.0,
        step=step,
        wait=wait,
        wait_fraction=wait / step,
        steps_per_sec=1 / step,
        samples_per_sec=BATCH / step,
    )


SLOW = figures(wait=0.008, compute=0.002)  # 80% waiting: highly input-bound, whatever the pipeline
CONTEXT = {"gpu": False, "cores": CORES, "epochs": EPOCHS}


def tips_for(det, **context) -> list[str]:
    """The advice for the pipeline ``det`` inspected in its real fit, on the fixed SLOW figures."""
    return advise(categories.HIGH, SLOW, det.pipeline, {}, dict(CONTEXT, **context))


def write_pngs(directory, n=N_IMAGES):
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        path = os.path.join(directory, f"img_{i:04d}.png")
        Image.fromarray(rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths, (np.arange(n) % 10).astype("int32")


def read_png(path):
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype="float32") / 255.0


def model_for(backend):
    """A small CNN of some 15-30 ms a step on a CPU, well above the few ms of CPU that loading a batch costs.

    JAX's and torch's CPU convolutions are slower: they get the images halved first.
    """
    keras.utils.set_random_seed(0)
    cnn = [
        keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
    ]
    body = cnn if backend == "tensorflow" else [keras.layers.AveragePooling2D(2), *cnn]
    model = keras.Sequential([keras.Input((SIZE, SIZE, 3)), *body, keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def train(data, backend, name):
    """A real fit of ``EPOCHS`` epochs with a detector; its figures are checked for shape only."""
    det = InputBoundDetector(window=4, sample_every=4, log_dir=None, verbose=0)
    model_for(backend).fit(data, epochs=EPOCHS, verbose=0, callbacks=[det])
    v, m = det.verdict, det.measurement
    print(f"{name}: {v.category} over {v.scope}, wait {100 * v.wait_fraction:.1f}%, step {1e3 * m.step:.1f} ms")
    assert v.category in (categories.HIGH, categories.MODERATE, categories.NOT), det.summary()
    assert [p.label for p in v.phases] == [f"epoch {i + 1}" for i in range(EPOCHS)]
    for x in (m.step, m.compute, m.steps_per_sec):
        assert x is not None and math.isfinite(x) and x > 0, det.summary()
    assert 0 <= m.wait <= m.step and m.wait + m.compute + m.other == pytest.approx(m.step, rel=1e-9)
    assert len(det.epoch_history) == EPOCHS and all(e["input/steps"] == N_IMAGES // BATCH for e in det.epoch_history)
    return det


@pytest.mark.slow
def test_tf_data_image_files_advice_applied_step_by_step(tmp_path, backend):
    if backend != "tensorflow":
        pytest.skip("the tf.data pipeline is measured on the TensorFlow backend")
    import tensorflow as tf

    paths, labels = write_pngs(str(tmp_path))

    def load(path, label):  # read, decode, resize: deterministic, worth caching
        image = tf.image.resize(tf.io.decode_png(tf.io.read_file(path), channels=3), (SIZE, SIZE)) / 255.0
        image.set_shape((SIZE, SIZE, 3))
        return image, label

    def augment(image, label):  # random: after the cache
        image = tf.image.random_flip_left_right(image)
        return tf.image.random_brightness(image, 0.1), label

    files = tf.data.Dataset.from_tensor_slices((paths, labels))
    AUTOTUNE = tf.data.AUTOTUNE

    naive = train(files.map(load).map(augment).batch(BATCH), backend, "naive")
    pipe = naive.pipeline
    assert pipe["sequential_map"] and not pipe["parallel_map"] and not pipe["ends_with_prefetch"] and not pipe["cache"]
    tips = tips_for(naive)
    advice = "\n".join(tips)
    assert "`num_parallel_calls=tf.data.AUTOTUNE` to each `.map(...)`" in advice
    assert "`.prefetch(tf.data.AUTOTUNE)`" in advice
    assert (
        "`.cache()` after the expensive deterministic steps (decode, resize) and before random augmentation" in advice
    )
    assert all("Addresses" in tip for tip in tips)

    # Step 1, the first two tips: every map in parallel, a prefetch at the end.
    parallel = train(
        files.map(load, num_parallel_calls=AUTOTUNE)
        .map(augment, num_parallel_calls=AUTOTUNE)
        .batch(BATCH)
        .prefetch(AUTOTUNE),
        backend,
        "parallel map + prefetch",
    )
    pipe = parallel.pipeline
    assert pipe["parallel_map"] and not pipe["sequential_map"] and pipe["ends_with_prefetch"] and not pipe["cache"]
    advice = "\n".join(tips_for(parallel))
    assert "num_parallel_calls" not in advice and "prefetch(" not in advice  # done: not advised again
    assert "`.cache()` after the expensive deterministic steps" in advice  # the tip left

    # Step 2, the tip left: cache after decoding and resizing, before the random augmentation.
    cached = train(
        files.map(load, num_parallel_calls=AUTOTUNE)
        .cache()
        .map(augment, num_parallel_calls=AUTOTUNE)
        .batch(BATCH)
        .prefetch(AUTOTUNE),
        backend,
        "+ cache",
    )
    pipe = cached.pipeline
    assert pipe["cache"] and pipe["ends_with_prefetch"] and not pipe["sequential_map"]
    assert pipe["after_cache"] == ["prefetch", "batch", "parallel_map"]  # last first: only these run once it serves
    tips = tips_for(cached, cache_serves=True, scope="epochs 2-4")
    advice = "\n".join(tips)
    assert "num_parallel_calls" not in advice and "prefetch(" not in advice and "Add `.cache()`" not in advice
    assert "interleave" not in advice  # nothing is read from files once the cache serves
    assert tips == [
        "Over epochs 2-4 every batch comes from the cache, so nothing is read or decoded: the wait is the work after "
        "`.cache()` (.map (parallel), .batch). Addresses all of the 8.0 ms wait: make that work cheaper (smaller "
        "images, fewer ops), or move random augmentation into the model."
    ]

    # The cache fills in epoch 1: a phase named and left out, not the run's character. Fixed figures:
    # epoch 1 reads and decodes (80% of a 10 ms step waiting), epochs 2-4 are served from the cache
    # (a 2.02 ms step, 1% waiting).
    fit = InputFit(Judge(0.05, 0.2, pipe, dict(CONTEXT, epochs=4)))
    for epoch, m in enumerate([SLOW] + [figures(wait=0.00002, compute=0.002)] * 3):
        fit.spans.windows = []
        fit.spans.add_window(f"epoch {epoch + 1}", m, float(epoch))
        fit.end_epoch(epoch, float(epoch), step=12 * (epoch + 1))
    fit.update(final=True)
    v = fit.verdict
    assert v.category == categories.NOT and v.advice == []
    assert v.scope == "epochs 2-4" and [p.steady for p in v.phases] == [False, True, True, True]
    assert v.phases[0].reason == "while the cache filled"
    assert "Left out: epoch 1, which waited 80.0% while the cache filled" in v.message
    assert "since then 1.0% per epoch" in v.message
    assert v.wait_fraction == pytest.approx(0.00002 / 0.00202)
    assert v.fit_wait_fraction == pytest.approx((0.008 + 3 * 0.00002) / (0.010 + 3 * 0.00202))
    assert v.speedup_bound == pytest.approx(1 / (1 - v.wait_fraction))


class ImageFiles(keras.utils.PyDataset):
    """Batches of PNG files read with PIL in `__getitem__`."""

    def __init__(self, paths, labels, **kwargs):
        super().__init__(**kwargs)
        self.paths, self.labels = paths, labels

    def __len__(self):
        return len(self.paths) // BATCH

    def __getitem__(self, i):
        batch = slice(i * BATCH, (i + 1) * BATCH)
        return np.stack([read_png(path) for path in self.paths[batch]]), self.labels[batch]


@pytest.mark.slow
@pytest.mark.multibackend
def test_pydataset_slow_getitem_advice_applied(tmp_path, backend):
    if backend == "torch":
        # torch's step runs Python, which PyDataset's worker threads share under the GIL:
        # the loader of torch users, the DataLoader (processes), is tested below.
        pytest.skip("the torch backend's loader is tested with a DataLoader")
    paths, labels = write_pngs(str(tmp_path))

    naive = train(ImageFiles(paths, labels), backend, "PyDataset workers=1")
    assert (naive.pipeline["kind"], naive.pipeline["workers"], naive.pipeline["use_multiprocessing"]) == (
        "PyDataset",
        1,
        False,
    )
    (tip,) = [t for t in tips_for(naive) if "Raise `workers` to" in t]
    workers = int(re.search(r"Raise `workers` to (\d+)", tip).group(1))
    # A batch arrives every 10 ms and a step computes in 2: 1.25 x 10 / 2 loaders keep up.
    assert workers == workers_needed(1, SLOW, CORES) == 7 and "Addresses the loading part of the wait" in tip
    # `__getitem__` waits on storage and PIL, not on pure-Python work: threads, as the tip says for that case.
    advised = train(ImageFiles(paths, labels, workers=workers), backend, f"PyDataset workers={workers}")
    assert advised.pipeline["kind"] == "PyDataset" and advised.pipeline["workers"] == workers
    # The advice reads the pipeline as it now runs: the count applied is not advised again.
    tips = tips_for(advised)
    assert not any(f"Raise `workers` to {workers} " in t for t in tips)
    assert any(f"(now workers={workers}, use_multiprocessing=False)" in t for t in tips)
    assert any("Raise `max_queue_size` (now 10)" in t for t in tips)  # several workers: uneven loads next


@pytest.mark.slow
@pytest.mark.multibackend
def test_torch_dataloader_advice_applied(tmp_path, backend, request):
    if backend != "torch":
        pytest.skip("a torch DataLoader trains on the torch backend")
    import torch

    request.getfixturevalue("one_torch_thread")
    paths, labels = write_pngs(str(tmp_path))

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            return torch.from_numpy(read_png(paths[i])), int(labels[i])

    naive = train(torch.utils.data.DataLoader(Images(), batch_size=BATCH), backend, "DataLoader num_workers=0")
    pipe = naive.pipeline
    assert (pipe["kind"], pipe["num_workers"], pipe["persistent_workers"]) == ("torch DataLoader", 0, False)
    tips = tips_for(naive)
    assert not any("pin_memory" in t for t in tips)  # no GPU here: nothing to pin for
    (tip,) = [t for t in tips if "Raise `num_workers` to" in t]
    workers = int(re.search(r"Raise `num_workers` to (\d+)", tip).group(1))
    assert workers == workers_needed(0, SLOW, CORES) == 7 and "set `persistent_workers=True`" in tip
    loader = torch.utils.data.DataLoader(Images(), batch_size=BATCH, num_workers=workers, persistent_workers=True)
    advised = train(loader, backend, f"DataLoader num_workers={workers}")
    pipe = advised.pipeline
    assert (pipe["kind"], pipe["num_workers"], pipe["persistent_workers"]) == ("torch DataLoader", workers, True)
    tips = tips_for(advised)
    assert not any("persistent_workers" in t for t in tips)  # done: not advised again
    assert not any(f"Raise `num_workers` to {workers} " in t for t in tips)
    assert any(f"(now {workers})" in t for t in tips)
