"""Step records from a fake clock: serial steps of a given fetch, compute and rest, as the step hook records them."""

from keras_gpu_tools.runtime.step_record import StepRecord


class FakeClock:
    """A clock the test moves by hand; records are built from its readings."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds


def run_steps(stats, clock, n, fetch, compute, rest, sampled=lambda i: True, first_index=0, samples=32):
    """Simulates n serial steps: fetch, compute, rest (seconds), fed to ``stats``."""
    prev = None
    for i in range(first_index, first_index + n):
        start = clock()
        if prev is not None:
            prev.interval = start - prev.start
            prev.gap = start - prev.end
            stats.add(prev)
        rec = StepRecord(index=i, sampled=sampled(i), start=start, samples=samples)
        clock.advance(fetch)
        rec.fetch = fetch
        fetched = clock()
        clock.advance(compute)
        rec.end = clock()
        if rec.sampled:
            rec.compute = rec.end - fetched
        clock.advance(rest)
        prev = rec
    stats.add(prev)  # the last call: no gap (epoch end)
