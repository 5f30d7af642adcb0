"""InputBoundDetector's advice, applied literally, pays off: seed-style pipelines on image files.

Each test writes a few hundred 64x64 PNG files to ``tmp_path``, trains on them
through the pipeline a user would write first, reads the verdict and its
advice, builds the pipeline exactly as the advice says (the test asserts the
advice says it, then does it) and trains again. The speedups are measured on
this machine: the detector's wall time per step over its steady state (the
verdict's scope), naive against advised. Epoch wall times are printed too.

Reading an image costs a sleep (slow storage) besides the real decode, set to
a multiple of the model's step compute measured first on in-memory arrays,
so on any machine, loaded or not, the naive pipeline waits most of each step.
Each step of advice must make the step faster and, where the pipeline waited
most of the step, remove at least half of its wait per step.
"""

import os
import re
import time

import keras
import numpy as np
import pytest

from keras_gpu_tools.callbacks.input_bound_detector import InputBoundDetector
from keras_gpu_tools.input import categories

N_IMAGES = 384  # 12 batches per epoch
BATCH = 32
SIZE = 64
# The first fills caches and starts workers; the verdict is on the steady state. Four: on a loaded
# 2-core machine a second epoch at twice the third's time is common, and the median of three later
# epochs keeps the first (the cache filling) apart where that of two did not.
EPOCHS = 4


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


def step_compute(backend):
    """Seconds of compute per training step of `model_for(backend)`, measured on in-memory arrays."""
    rng = np.random.default_rng(1)
    x = rng.random((BATCH * 8, SIZE, SIZE, 3), dtype="float32")
    y = (np.arange(BATCH * 8) % 10).astype("int32")
    det = InputBoundDetector(sample_every=1, log_dir=None, verbose=0)
    model_for(backend).fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[det])
    return det.measurement.compute


class EpochTimes(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seconds = []

    def on_epoch_begin(self, epoch, logs=None):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self._t0)


def train(data, backend, name):
    det = InputBoundDetector(window=4, sample_every=4, log_dir=None, verbose=0)
    clock = EpochTimes()
    model_for(backend).fit(data, epochs=EPOCHS, verbose=0, callbacks=[det, clock])
    v, m = det.verdict, det.measurement
    print(
        f"{name}: {v.category} over {v.scope}, wait {100 * v.wait_fraction:.1f}% (whole fit "
        f"{100 * v.fit_wait_fraction:.1f}%), step {1e3 * m.step:.1f} ms, compute {1e3 * m.compute:.1f} ms, "
        f"epochs {', '.join(f'{s:.2f}' for s in clock.seconds)} s"
    )
    for tip in v.advice:
        print(f"  - {tip}")
    return det


def speedup(before, after):
    return before.measurement.step / after.measurement.step


def assert_pays_off(before, after, name):
    """A measured gain, and where the pipeline before waited over 40%, at most half its wait per step left.

    The wait's drop is what the advice addresses; the step's gain follows from it
    but moves with the host's load (a loaded 2-core machine took 1.48x where 1.5x
    was asserted, the wait having dropped from 13.2 to 2.5 ms a step).
    """
    gain = speedup(before, after)
    wait_before, wait_after = before.measurement.wait, after.measurement.wait
    print(f"{name}: {gain:.2f}x, wait {1e3 * wait_before:.2f} -> {1e3 * wait_after:.2f} ms a step")
    detail = f"{name}: {gain:.2f}x\n{before.summary()}\n\n{after.summary()}"
    assert gain >= 1.1, detail
    if before.verdict.wait_fraction > 0.4:
        assert wait_after <= 0.5 * wait_before, detail


@pytest.mark.slow
def test_tf_data_image_files_advice_applied_step_by_step(tmp_path, backend):
    if backend != "tensorflow":
        pytest.skip("the tf.data pipeline is measured on the TensorFlow backend")
    import tensorflow as tf

    paths, labels = write_pngs(str(tmp_path))
    # Five times the compute per batch: the parallel map (two cores here) and
    # the cache each have a wait to remove that is well above the noise.
    per_image = 5 * step_compute(backend) / BATCH

    def slow_storage(path):
        time.sleep(per_image)
        return path

    def load(path, label):  # read, decode, resize: deterministic, worth caching
        path = tf.py_function(slow_storage, [path], tf.string)
        image = tf.image.resize(tf.io.decode_png(tf.io.read_file(path), channels=3), (SIZE, SIZE)) / 255.0
        image.set_shape((SIZE, SIZE, 3))
        return image, label

    def augment(image, label):  # random: after the cache
        image = tf.image.random_flip_left_right(image)
        return tf.image.random_brightness(image, 0.1), label

    files = tf.data.Dataset.from_tensor_slices((paths, labels))
    AUTOTUNE = tf.data.AUTOTUNE

    naive = train(files.map(load).map(augment).batch(BATCH), backend, "naive")
    assert naive.verdict.category == categories.HIGH and naive.verdict.wait_fraction > 0.4, naive.summary()
    advice = "\n".join(naive.verdict.advice)
    assert "`num_parallel_calls=tf.data.AUTOTUNE` to each `.map(...)`" in advice
    assert "`.prefetch(tf.data.AUTOTUNE)`" in advice
    assert (
        "`.cache()` after the expensive deterministic steps (decode, resize) and before random augmentation" in advice
    )
    assert all("Addresses" in tip for tip in naive.verdict.advice)

    # Step 1, the first two tips: every map in parallel, a prefetch at the end.
    parallel = train(
        files.map(load, num_parallel_calls=AUTOTUNE)
        .map(augment, num_parallel_calls=AUTOTUNE)
        .batch(BATCH)
        .prefetch(AUTOTUNE),
        backend,
        "parallel map + prefetch",
    )
    assert_pays_off(naive, parallel, "parallel map + prefetch")
    advice = "\n".join(parallel.verdict.advice)
    assert "num_parallel_calls" not in advice and "prefetch(" not in advice  # done: not advised again
    assert parallel.verdict.input_bound and "`.cache()` after the expensive deterministic steps" in advice

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
    assert_pays_off(parallel, cached, "+ cache")
    assert_pays_off(naive, cached, "all the advice")
    v = cached.verdict
    assert v.category in (categories.MODERATE, categories.NOT), cached.summary()
    # The cache fills in epoch 1: a phase named and left out, not the run's character.
    assert v.scope == f"epochs 2-{EPOCHS}", cached.summary()
    assert [p.steady for p in v.phases] == [False] + [True] * (EPOCHS - 1), cached.summary()
    assert "Left out: epoch 1, which waited" in v.message and "while the cache filled" in v.message
    assert v.fit_wait_fraction > v.wait_fraction
    assert "interleave" not in "\n".join(v.advice)  # nothing is read from files once the cache serves
    assert v.speedup_bound == pytest.approx(1 / (1 - v.wait_fraction))


class ImageFiles(keras.utils.PyDataset):
    """Batches of PNG files read with PIL in `__getitem__`, from storage that takes `per_image` seconds a file."""

    def __init__(self, paths, labels, per_image, **kwargs):
        super().__init__(**kwargs)
        self.paths, self.labels, self.per_image = paths, labels, per_image

    def __len__(self):
        return len(self.paths) // BATCH

    def __getitem__(self, i):
        batch = slice(i * BATCH, (i + 1) * BATCH)
        images = []
        for path in self.paths[batch]:
            time.sleep(self.per_image)
            images.append(read_png(path))
        return np.stack(images), self.labels[batch]


@pytest.mark.slow
@pytest.mark.multibackend
def test_pydataset_slow_getitem_advice_applied(tmp_path, backend):
    if backend == "torch":
        # torch's step runs Python, which PyDataset's worker threads share under the GIL:
        # the loader of torch users, the DataLoader (processes), is measured below.
        pytest.skip("the torch backend's loader is measured with a DataLoader")
    paths, labels = write_pngs(str(tmp_path))
    per_image = 4 * step_compute(backend) / BATCH

    naive = train(ImageFiles(paths, labels, per_image), backend, "PyDataset workers=1")
    assert naive.verdict.category == categories.HIGH and naive.verdict.wait_fraction > 0.4, naive.summary()
    (tip,) = [t for t in naive.verdict.advice if "Raise `workers` to" in t]
    workers = int(re.search(r"Raise `workers` to (\d+)", tip).group(1))
    assert workers >= 2 and "Addresses the loading part of the wait" in tip
    # `__getitem__` waits on storage and PIL, not on pure-Python work: threads, as the tip says for that case.
    advised = train(ImageFiles(paths, labels, per_image, workers=workers), backend, f"PyDataset workers={workers}")
    assert_pays_off(naive, advised, f"workers={workers}")
    assert advised.verdict.category in (categories.MODERATE, categories.NOT), advised.summary()


@pytest.mark.slow
@pytest.mark.multibackend
def test_torch_dataloader_advice_applied(tmp_path, backend, request):
    if backend != "torch":
        pytest.skip("a torch DataLoader trains on the torch backend")
    import torch

    request.getfixturevalue("one_torch_thread")
    paths, labels = write_pngs(str(tmp_path))
    per_image = 3 * step_compute(backend) / BATCH

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            time.sleep(per_image)
            return torch.from_numpy(read_png(paths[i])), int(labels[i])

    naive = train(torch.utils.data.DataLoader(Images(), batch_size=BATCH), backend, "DataLoader num_workers=0")
    assert naive.verdict.category == categories.HIGH and naive.verdict.wait_fraction > 0.4, naive.summary()
    assert not any("pin_memory" in t for t in naive.verdict.advice)  # no GPU here: nothing to pin for
    (tip,) = [t for t in naive.verdict.advice if "Raise `num_workers` to" in t]
    workers = int(re.search(r"Raise `num_workers` to (\d+)", tip).group(1))
    assert workers >= 2 and "set `persistent_workers=True`" in tip
    loader = torch.utils.data.DataLoader(Images(), batch_size=BATCH, num_workers=workers, persistent_workers=True)
    advised = train(loader, backend, f"DataLoader num_workers={workers}")
    assert_pays_off(naive, advised, f"num_workers={workers}")
    assert advised.verdict.category in (categories.MODERATE, categories.NOT), advised.summary()
