"""The trials of ``find_speedups`` in order, each a row; the model's state kept and put back.

Order: the baseline (the fit as given) and the input-free ceiling (one batch repeated), ``jit_compile`` and
mixed precision (the trials that compile anew: the longest compile the combination can hold is then known), the
input changes, the batch size (its plan's candidates also give the per-call host time), ``steps_per_execution``,
the baseline again (every row is read against it as at the row's own time, on the line between the two timings),
then the changes that paid, together; the rows are listed in the guides' order. Each trial asks the
:class:`~keras_gpu_tools.memory.throughput.Budget` first: one expected to outlast what is left of ``max_seconds``,
or the seconds kept for the baseline again and the combination, is not measured; a timing stops at its share of
what is left once those are kept.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.memory.throughput import Budget, expected_seconds
from keras_gpu_tools.memory.timed_fit import (
    FitInput,
    Pace,
    Timing,
    fit_side_effects,
    forget_compiled_trials,
    paced,
    restore_side_effects,
    time_batch,
    time_fit,
)
from keras_gpu_tools.speedups import rows as R
from keras_gpu_tools.speedups import trials as T
from keras_gpu_tools.speedups.inputs import ARRAYS, TrainingInput, batch_code, describe, head
from keras_gpu_tools.speedups.report import SpeedupReport
from keras_gpu_tools.speedups.rows import SpeedupRow
from keras_gpu_tools.speedups.trials import check_steps, first_line, loss_after, trial_model, whole_calls

logger = logging.getLogger("keras_gpu_tools")

PLAN_GROWTH = 8  # on a CPU (no memory to plan against) the batch plan's candidates go up to 8x the batch
PLAN_SHARES = 2  # the batch plan measures several candidates: it is given the share of two trials
REUSED_COMPILE = 0.1  # seconds: a timed fit's first call under this (or half the baseline's compile) compiled nothing
GPU_WINDOW = 1.0  # seconds: each window fills and drains the device's queue once (docs/decisions/0019)


class _Finder:
    def __init__(
        self,
        model,
        data: TrainingInput,
        budget: Budget,
        backend: Any,
        wanted: tuple[str, ...],
        rng: dict[str, Any] | None = None,
    ):
        self.model, self.data, self.budget, self.backend, self.wanted = model, data, budget, backend, wanted
        self.on_gpu = bool(backend.gpu_devices())
        pace = Pace.for_device(self.on_gpu, budget.max_seconds)
        self.pace = dataclasses.replace(pace, epoch_seconds=GPU_WINDOW) if self.on_gpu else pace
        self.per_call = int(getattr(model, "steps_per_execution", 1) or 1)
        self.rows: list[SpeedupRow] = []
        self.left = 0  # trials still to run (each gets its share of what is left)
        self.expected = 0.0  # what a trial is expected to take: the baseline's compile and least steady time
        self.window = 0.0  # seconds: the baseline's timing window
        self.base_compile = 0.0
        self.compiles: dict[str, float] = {}  # each measured row's compile beyond the baseline's, by change
        self.base: SpeedupRow | None = None
        # The baseline's loss after so many steps, and before them: by the steps (whole calls of each model) and batch.
        self.base_loss: dict[tuple[int, int], tuple[float, float | None]] = {}
        self.check_reused = False  # whether a timed fit found the step its check compiled (until one shows, no)
        self.keeping = False  # whether the combination's seconds are kept for it (until its turn)
        self.again_kept = False  # whether the baseline's second timing's seconds are kept for it (until its turn)
        self.last_at: float | None = None  # when the last timing's steady windows ran (their middle, on the budget)
        self.at: dict[str, float] = {}  # the same, for each row's timing, by change
        self.base_at: float | None = None  # the same, for the baseline's first timing
        self.again: float | None = None  # the baseline's second timing, samples/s
        self.points: list[tuple[int, float]] = []  # (batch, step seconds) of one batch repeated: the host time
        self.input_x: Any = None  # the input change that paid most
        self.input_data: dict[str, Any] = {}  # each input row's data, by change
        self.against_ceiling: set[str] = set()  # rows compared with the ceiling, not with the baseline
        self.batch: int | None = None  # the batch that paid (the combination trains at it where the input can be)
        self.policy: str | None = None
        # The random states at the call: each loss check starts from them, so that the baseline's and a change's
        # steps draw alike where dropout draws from the framework's global generator (torch), however many
        # draws the timed fits before made (the snapshot's, where the caller took one).
        self.rng = backend.rng_state() if rng is None else rng

    # -- timing -----------------------------------------------------------------------
    def _share(self, shares: int = 1) -> float:
        """A trial's seconds: its ``shares`` of what is left, once the seconds of the trials kept for the end are
        kept for them, among the other trials left."""
        kept = self._kept()
        return shares * max(0.0, self.budget.left() - kept) / max(1, self.left - self.again_kept - self.keeping)

    def _kept(self, refusing: bool = False) -> float:
        """The seconds kept until their turn for the baseline's second timing (its steady time: every row is read
        against both timings) and for the combination (what it is expected to take, as far as the rows measured so
        far tell: their longest compile, a check where any row was checked), and a window more for each. A trial is
        ``refusing`` the combination's only once two changes paid: until then, the trial is what it would combine."""
        again = self.expected - self.base_compile + self.window if self.again_kept else 0.0
        if not self.keeping or (refusing and sum(r.paid for r in self.rows) < 2):
            return again
        extra = max(self.compiles.values(), default=0.0)
        return again + self._expected(extra, any(r.check for r in self.rows), self._combined_batch()) + self.window

    def _combined_batch(self) -> int | None:
        """The batch the combination trains at: the batch that paid, where the user's input can be made at it."""
        return self.batch if self.batch and self.data.rebatch_refused(self.batch) is None else None

    def _time(self, model, inputs: FitInput | None, shares: int = 1) -> Timing:
        share = self._share(shares)
        out = self.budget.overrun
        start = time.perf_counter()
        if inputs is None:
            t = time_batch(model, self.data.batch, self.pace, out_of_time=out, share=share, backend=self.backend)
        else:
            t = time_fit(model, inputs, self.pace, out_of_time=out, share=share)
        self.last_at = self.budget.elapsed() - t.step_seconds * t.steps / 2
        # Where the budget went, for whoever tunes its split (logging's DEBUG level).
        spent = (time.perf_counter() - start, share, t.compile_seconds, t.windows, self.budget.left())
        logger.debug(
            "find_speedups: timed in %.1f s (share %.1f s, compile %.1f s, %d steady windows), %.1f s left", *spent
        )
        return t

    def _expected(self, extra: float = 0.0, check: bool = False, batch: int | None = None, per_call: int = 1) -> float:
        """What a trial is expected to take. Its compile is ``extra`` seconds longer than the baseline's. A
        ``check`` compiles the changed step first, on one batch of the trial's ``batch`` (the timed fit then finds
        it compiled, where earlier checks showed so), and the baseline's step at that batch and the check's steps
        (whole calls of ``per_call`` steps) where its loss is not known yet."""
        seconds = self.expected + extra
        if check:
            seconds += 0.0 if self.check_reused else self.base_compile + extra
            steps = whole_calls(R.LOSS_STEPS, self.per_call, per_call)
            if (steps, batch or self.data.batch_size) not in self.base_loss:
                seconds += self.base_compile
        return seconds

    def _refused(
        self, extra: float = 0.0, check: bool = False, batch: int | None = None, per_call: int = 1
    ) -> str | None:
        """Why a trial is not run (it would outlast the budget, or the seconds kept: :meth:`_expected`), or None."""
        return self._refuses(self._expected(extra, check, batch, per_call))

    def _refuses(self, need: float) -> str | None:
        """Why a trial expected to take ``need`` seconds is not run, or None: it would outlast what is left, or eat
        the seconds kept for the trials at the end (a timing cannot stop short of its warm-up and first windows)."""
        reason, kept, left = self.budget.refuses(need), self._kept(refusing=True), self.budget.left()
        if reason is None and kept and need + kept > left:
            ends = (("the baseline's second timing", self.again_kept), ("the combination", self.keeping))
            what = " and ".join(name for name, on in ends if on)
            reason = f"the {left:.1f} s left are kept for {what} ({kept:.1f} s expected)"
        return reason

    def _sps(self, t: Timing, batch: int | None = None, repeated: bool = False) -> float:
        """samples/s of a timing on the user's input at ``batch`` (its pass's last batch may be smaller), or on one
        batch ``repeated``."""
        per_step = (batch or self.data.batch_size) if repeated else self.data.samples_per_step(batch)
        return per_step / t.step_seconds

    def _trial(
        self,
        row: SpeedupRow,
        build: Callable[[], tuple[Any, FitInput | None]],
        check: bool = False,
        batch: int | None = None,
        extra: float = 0.0,
    ) -> SpeedupRow:
        """``row`` measured: built, checked (where ``check``), timed; or why not. ``extra``: how much longer than
        the baseline's its compile is known to be (a combination's, from its parts')."""
        self.left = max(1, self.left)
        start = time.perf_counter()
        try:
            reason = self._refused(extra, check, batch, int(row.compile_args.get("steps_per_execution", 1)))
            if reason:
                return dataclasses.replace(row, status=R.NOT_MEASURED, reason=f"not measured: {reason}")
            try:
                model, inputs = build()
                checked = 0.0
                if check:
                    row, checked = self._check(row, model, batch)
                    if row.status == R.UNSAFE:
                        return row
                timing = self._time(model, inputs)
                if self.last_at is not None:
                    self.at[row.change] = self.last_at
                # The check's fit compiles the step first (and its evaluation's): the timed fit then finds it
                # compiled, as a rule. A combination with this change checks, and so compiles, alike.
                self.compiles[row.change] = max(0.0, max(timing.compile_seconds, checked) - self.base_compile)
                if check:
                    self.check_reused = timing.compile_seconds < max(self.base_compile / 2, REUSED_COMPILE)
            except Exception as e:
                why = "ran out of memory: " if self.backend.is_oom(e) else ""
                return dataclasses.replace(row, status=R.NOT_APPLICABLE, reason=why + first_line(e))
            return R.decide(row, self._sps(timing, batch, repeated=inputs is None), timing.uncertainty, True)
        finally:
            self.left -= 1
            logger.debug("find_speedups: %s took %.1f s", row.change, time.perf_counter() - start)

    def _check(self, row: SpeedupRow, model, batch: int | None = None) -> tuple[SpeedupRow, float]:
        """The numerical check: the loss after K steps against the float32 baseline's, from the same state, on one
        batch of the trial's ``batch`` (so that its compile is the timed fit's); and the seconds the changed
        model's check took (its compiles)."""
        steps = check_steps(R.LOSS_STEPS, self.model, model)  # both train the same steps from the same state
        b = batch or self.data.batch_size
        data = self.data.batch_of(b)
        if (steps, b) not in self.base_loss:
            self.base_loss[steps, b] = loss_after(
                trial_model(self.model), data, steps, initial=True, before_steps=self._same_draws
            )
        start = time.perf_counter()
        changed, _ = loss_after(model, data, steps, before_steps=self._same_draws)
        base, initial = self.base_loss[steps, b]
        seconds = time.perf_counter() - start
        safe, text = R.loss_check(base, changed, steps, initial=initial)
        if not safe:
            return dataclasses.replace(row, status=R.UNSAFE, check=text, reason="unsafe: the loss diverged"), seconds
        return dataclasses.replace(row, check=text), seconds

    def _same_draws(self) -> None:
        self.backend.set_rng_state(self.rng)

    def _row(self, change: str, kind: str, code: str = "", cost: str = "", **compile_args: Any) -> SpeedupRow:
        """A row read against the baseline; one timed after its second timing (the combination), against that."""
        base = self.base
        return SpeedupRow(
            change,
            kind,
            code=code,
            cost=cost,
            before=None if base is None else (self.again or base.after),
            before_uncertainty=None if base is None else base.after_uncertainty,
            compile_args=compile_args,
        )

    # -- the trials -------------------------------------------------------------------
    def run(self) -> list[SpeedupRow]:
        inputs_changes = self.data.changes(self.on_gpu) if "input" in self.wanted else []
        singles = len(set(self.wanted) & {"steps_per_execution", "jit_compile", "mixed_precision"})
        plan = "batch_size" in self.wanted
        # Trials to share what is left among: the baseline (two shares: every row is measured against it, so it is
        # known more closely), the ceiling, each input change, the plan (its timed row adds itself), the single
        # changes, the baseline again, the combination (timed where two changes can pay: its seconds kept till then).
        self.left = 2 + 1 + len(inputs_changes) + PLAN_SHARES * plan + singles + 1 + 1
        self.keeping = len(inputs_changes) + plan + singles >= 2
        base_model = trial_model(self.model)
        timing = self._time(base_model, self.data.fit_input(self.per_call), shares=2)
        self.left -= 2
        self.base_at = self.last_at
        # The fewest windows a timing holds and its warm-up, each as long as the baseline's (a whole pass, where
        # windows are passes: then the compiling first call is a pass too, and its compile figure leaves it out).
        window = timing.step_seconds * timing.steps / timing.windows if timing.windows else self.pace.epoch_seconds
        given = self.data.fit_input(self.per_call)
        first = 1 if given.whole_passes and given.batches else 0
        least = (self.pace.min_windows + 1 + first) * window
        self.window = window
        self.base_compile = timing.compile_seconds
        self.expected = expected_seconds([(timing.compile_seconds, timing.compile_seconds + least)])
        self.again_kept = True
        sps = self._sps(timing)
        self.base = SpeedupRow(
            "baseline: the fit as given",
            R.BASELINE,
            code="model.fit(...)",
            status=R.BASELINE,
            after=sps,
            after_uncertainty=timing.uncertainty,
            cost=f"compile {timing.compile_seconds:.2f} s apart",
        )
        self.rows.append(self.base)
        self._ceiling(base_model)
        # The trials that compile the step anew first: the longest compile the combination can hold is then known,
        # and its seconds kept for it (:meth:`_kept`), before the other trials share what is left.
        if "jit_compile" in self.wanted:
            self._jit_compile()
        if "mixed_precision" in self.wanted:
            self._mixed_precision()
        for change in inputs_changes:
            self._input(base_model, change)
        if "batch_size" in self.wanted:
            self._batch_size(base_model)
        if "steps_per_execution" in self.wanted:
            self._steps_per_execution(base_model)
        self._again(base_model)
        self._combined()
        return sorted(self.rows, key=R.order)  # as the guides list them

    def _ceiling(self, base_model) -> None:
        row = self._row("input-free ceiling: one batch repeated", R.CEILING, code="(no input pipeline)")
        row = self._trial(row, lambda: (base_model, None))
        if row.after is not None:
            self.points.append((self.data.batch_size, self.data.batch_size / row.after))
            row = dataclasses.replace(row, status=R.CEILING, cost=R.ceiling_cost(row.before, row.after))
        self.rows.append(row)

    def _input(self, base_model, change) -> None:
        row = self._row(f"input: {change.change}", "input", code=change.code, cost=change.cost)
        row = dataclasses.replace(row, settings=dict(change.settings))
        if change.settings.get("use_multiprocessing") and not getattr(self.backend, "forks_safely", True):
            self.left -= 1
            reason = f"not measured: a fork of a {self.backend.name} process (its runtime's threads) may deadlock"
            self.rows.append(dataclasses.replace(row, reason=reason))
            return
        row = self._trial(row, lambda: (base_model, self.data.fit_input(self.per_call, x=change.data())))
        self.input_data[row.change] = change.data
        if row.paid:
            best = max((r for r in self.rows if r.kind == "input" and r.paid), key=lambda r: r.after or 0, default=None)
            if best is None or (row.after or 0) > (best.after or 0):
                self.input_x = change.data
        self.rows.append(row)

    def _batch_size(self, base_model) -> None:
        from keras_gpu_tools.planner import plan_batch_size

        b0 = self.data.batch_size
        row = self._row("batch size: plan_batch_size(objective='throughput')", "batch_size")
        reason = self._refused(extra=self.expected)  # the plan, then the timing of the batch it picks: a trial each
        if reason:
            self.left -= PLAN_SHARES
            self.rows.append(dataclasses.replace(row, reason=f"not measured: {reason}"))
            return
        most = self.data.largest_batch()
        if most is not None and most <= b0:
            self.left -= PLAN_SHARES
            reason = f"your data holds {self.data.samples} samples: a batch over {most} leaves under two steps an epoch"
            self.rows.append(dataclasses.replace(row, status=R.NOT_APPLICABLE, reason=reason))
            return
        share = self._share(PLAN_SHARES)
        self.left -= PLAN_SHARES  # the plan's own, from here
        bound = None if self.on_gpu else PLAN_GROWTH * b0
        if most is not None:  # a batch the data cannot fill twice is not a batch a fit on it trains
            bound = most if bound is None else min(bound, most)
        # The user's arrays: the plan times its candidates on them where they hold enough batches, as the fit reads them.
        given = (self.data.x, self.data.y) if self.data.kind == ARRAYS else self.data.batch
        start = time.perf_counter()
        try:
            with paced(self.pace):  # its candidates are read against the ceiling: timed alike
                plan = plan_batch_size(
                    base_model, *given, objective="throughput", max_batch_size=bound, max_seconds=share
                )
            logger.debug("find_speedups: the plan took %.1f s (share %.1f s)", time.perf_counter() - start, share)
        except Exception as e:
            status = R.NOT_MEASURED if "max_seconds" in str(e) else R.NOT_APPLICABLE
            self.rows.append(dataclasses.replace(row, status=status, reason=first_line(e)))
            return
        self.points += [(c.batch_size, c.step_seconds) for c in plan.candidates if c.measured and c.step_seconds]
        b = plan.batch_size
        unmeasured = T.larger_unmeasured(plan.candidates, b0) if b <= b0 else None
        if unmeasured:  # the plan's share ran out (or memory) before any larger batch: no verdict on one
            self.rows.append(dataclasses.replace(row, reason=f"not measured: no batch over {b0} timed ({unmeasured})"))
            return
        # A batch the user's input can make, timed on that input: no larger than the plan measured fitting.
        fitting = max((c.batch_size for c in plan.candidates if c.measured), default=b)
        timeable = self.data.timeable_batch(b, fitting) if b > b0 else b
        moved = f" (the plan's {b}, moved to a batch your input can make)" if timeable != b else ""
        b = timeable
        rule = (
            f"a batch of {b} instead of {b0} changes the optimisation: scale the learning rate with it (linear "
            f"scaling, x{b / b0:g}, with a warm-up for SGD; the square-root rule, x{math.sqrt(b / b0):.2f}, for "
            "Adam-like optimizers) and expect fewer steps per epoch"
        )
        row = dataclasses.replace(
            row, change=f"batch size {b}", code=batch_code(self.data.kind, b), cost=rule, settings={"batch_size": b}
        )
        if b <= b0:  # the knee at or below the batch trained with: a larger batch buys next to nothing
            reason = f"the plan, {b}, is not larger than your batch of {b0}: a larger batch trains no faster"
            self.rows.append(dataclasses.replace(row, status=R.NO_GAIN, reason=reason, cost=""))
            return
        refused = self.data.rebatch_refused(b)
        if refused is None:  # the user's own input at the planned batch
            self.left += 1
            row = dataclasses.replace(row, cost=f"{rule}; timed on {self.data.rebatch_method(b)}{moved}")
            row = self._trial(row, lambda: (base_model, self.data.fit_input(self.per_call, batch_size=b)), batch=b)
        else:  # one batch repeated at both sizes: the step's own speed, as the plan measures it
            chosen = next(c for c in plan.candidates if c.batch_size == b)
            ceiling = next((r for r in self.rows if r.kind == R.CEILING and r.after is not None), None)
            if ceiling is None or chosen.samples_per_sec is None:
                self.rows.append(dataclasses.replace(row, reason="not measured: no figure at your batch to compare"))
                return
            row = dataclasses.replace(
                row,
                before=ceiling.after,
                before_uncertainty=ceiling.after_uncertainty,
                cost=f"{rule}; both figures on one batch repeated, without your input ({refused})",
            )
            row = R.decide(row, chosen.samples_per_sec, chosen.uncertainty)
            self.against_ceiling.add(row.change)
        if row.paid:
            self.batch = b
        self.rows.append(row)

    def _dispatch(self, base_model) -> float | None:
        """The per-call host time, from the ceiling and the plan's candidates (one more size timed where needed)."""
        b0 = self.data.batch_size
        if len({b for b, _ in self.points}) < 2 and b0 >= 4 and not self._refused():
            small = b0 // 4
            cut = head(self.data.batch[0], small), head(self.data.batch[1], small)
            try:
                share = self._share()
                out = self.budget.overrun
                t = time_batch(base_model, cut, self.pace, out_of_time=out, share=share, backend=self.backend)
                self.points.append((small, t.step_seconds))
            except Exception as e:
                logger.info("keras_gpu_tools: find_speedups: no host time measured (%s)", first_line(e))
        return R.dispatch_seconds(self.points)

    def _steps_per_execution(self, base_model) -> None:
        row = self._row("steps_per_execution", "steps_per_execution")
        if not getattr(self.backend, "several_steps_per_call", True):
            self.left -= 1
            reason = f"Keras's {self.backend.name} trainer runs one step per call (steps_per_execution must be 1)"
            self.rows.append(dataclasses.replace(row, status=R.NOT_APPLICABLE, reason=reason))
            return
        dispatch = self._dispatch(base_model)
        step = next((s for b, s in self.points if b == self.data.batch_size), None)
        if dispatch is None or step is None:
            self.left -= 1
            reason = "not measured: no per-call host time (under two batch sizes timed)"
            self.rows.append(dataclasses.replace(row, reason=reason))
            return
        if dispatch <= 0:
            self.left -= 1
            reason = "no per-call host time measured: the step grows in proportion to the batch"
            self.rows.append(dataclasses.replace(row, status=R.NO_GAIN, reason=reason))
            return
        n = R.steps_per_execution(dispatch, step)
        if self.data.batches:  # a call runs within one pass: N divides the batches of a pass
            n = FitInput(dict, self.data.batches).steps(n)
        if n <= self.per_call:
            self.left -= 1
            reason = f"already {self.per_call} steps per call (the host's {1e3 * dispatch:.2f} ms per call asks {n})"
            self.rows.append(dataclasses.replace(row, status=R.NO_GAIN, reason=reason))
            return
        row = dataclasses.replace(
            row,
            change=f"steps_per_execution={n}",
            code=f"model.compile(..., steps_per_execution={n})",
            cost=f"{1e3 * dispatch:.2f} ms of host time per call, now paid once per {n} steps; batch callbacks and "
            f"logs run once per {n} steps",
            compile_args={"steps_per_execution": n},
            settings={"steps_per_execution": n},
        )
        spe = {"steps_per_execution": n}
        self.rows.append(self._trial(row, lambda: (trial_model(self.model, spe), self.data.fit_input(n))))

    def _jit_compile(self) -> None:
        row = self._row("jit_compile=True", "jit_compile", code="model.compile(..., jit_compile=True)")
        if getattr(self.model, "jit_compile", False):
            self.left -= 1
            reason = "already on: the model compiles its step (jit_compile=True)"
            self.rows.append(dataclasses.replace(row, status=R.NOT_APPLICABLE, reason=reason))
            return
        what = getattr(self.backend, "step_compiler", "XLA")
        row = dataclasses.replace(
            row,
            cost=f"the step compiled by {what}: a longer first call",
            compile_args={"jit_compile": True},
            settings={"jit_compile": True},
        )
        args = {"jit_compile": True}
        self.rows.append(
            self._trial(row, lambda: (trial_model(self.model, args), self.data.fit_input(self.per_call)), check=True)
        )

    def _mixed_precision(self) -> None:
        row = self._row("mixed precision", "mixed_precision")
        caps = T.gpu_capabilities(self.on_gpu)
        dtype = str(getattr(getattr(self.model, "dtype_policy", None), "compute_dtype", "float32"))
        if dtype in ("float16", "bfloat16"):
            self.left -= 1
            self.rows.append(dataclasses.replace(row, status=R.NOT_APPLICABLE, reason=f"already {dtype}"))
            return
        if not any(c >= (7, 0) for c in caps):
            self.left -= 1
            self.rows.append(dataclasses.replace(row, reason="no tensor cores: not measured"))
            return
        policy = "mixed_bfloat16" if any(c >= (8, 0) for c in caps) else "mixed_float16"
        row = dataclasses.replace(
            row,
            change=f"mixed precision ({policy})",
            code=f'keras.mixed_precision.set_dtype_policy("{policy}")  # before building the model; '
            "keras_gpu_tools.MixedPrecisionOutput(activation) as its last layer",
            cost="16-bit activations on tensor cores, float32 weights"
            + ("; loss scaling (LossScaleOptimizer)" if policy == "mixed_float16" else ""),
            settings={"dtype_policy": policy},
        )
        row = self._trial(
            row, lambda: (trial_model(self.model, policy=policy), self.data.fit_input(self.per_call)), check=True
        )
        if row.paid:
            self.policy = policy
        self.rows.append(row)

    def _again(self, base_model) -> None:
        """The baseline timed again after the single changes: the search's own A/A. Every row measured against the
        baseline is read against it as at the row's own time, on the line between the two timings (a host whose pace
        drifts moves each row's "before" with it), with an uncertainty of at least half their difference (the drift
        shows in the baseline's ±, not as a speed-up), and is decided again."""
        base, self.again_kept = self.base, False  # its turn: its seconds are no longer kept
        if base is None or base.after is None:
            self.left -= 1
            return
        first = base.after
        try:
            reason = self._refuses(self.expected - self.base_compile)  # its step is compiled already
            if reason is None:
                timing = self._time(base_model, self.data.fit_input(self.per_call))
                again, again_at = self._sps(timing), self.last_at
                if not (again > 0 and math.isfinite(again)):
                    reason = f"it read {again} samples/s"
        except Exception as e:
            reason = first_line(e)
        finally:
            self.left -= 1
        if reason is not None:  # the first timing stands, and the row says why
            self.base = dataclasses.replace(base, cost=f"{base.cost}; not timed again after the other trials: {reason}")
            self.rows = [self.base if row is base else row for row in self.rows]
            return
        mean = (first + again) / 2
        spread = max(R.noise(base.after_uncertainty, timing.uncertainty) / 2, abs(again - first) / (2 * mean))
        self.base = dataclasses.replace(
            base,
            after=mean,
            after_uncertainty=spread,
            cost=f"{base.cost}; timed before and after the other trials: {first:,.0f} then {again:,.0f} samples/s "
            "(each row is read against it as at its own time, on the line between the two)",
        )
        self.again, line = again, ((self.base_at, first), (again_at, again))
        self.rows = rows = R.read_again(self.rows, base, self.base, line, self.at, spread, self.against_ceiling)
        # What the combination takes, as the rows are decided now.
        paid = {r.kind: r for r in rows if r.paid}
        inputs = [r for r in rows if r.kind == "input" and r.paid]
        best = max(inputs, key=lambda r: r.after or 0.0, default=None)
        self.input_x = None if best is None else self.input_data.get(best.change)
        self.batch = paid["batch_size"].settings.get("batch_size") if "batch_size" in paid else None
        self.policy = paid["mixed_precision"].settings.get("dtype_policy") if "mixed_precision" in paid else None

    def _combined(self) -> None:
        paid = sorted((r for r in self.rows if r.paid), key=R.order)  # the report's order
        row = self._row("combined: " + (" + ".join(r.change for r in paid) or "nothing paid"), R.COMBINED)
        if not paid:
            self.rows.append(dataclasses.replace(row, status=R.NO_GAIN, reason="no change paid"))
            return
        if len(paid) == 1:  # nothing to combine: the one change's figures
            one = paid[0]
            why = "one change paid: the combination is that change"
            self.rows.append(dataclasses.replace(one, change=row.change, kind=R.COMBINED, reason=why))
            return
        args: dict[str, Any] = {}
        for r in paid:
            args.update(r.compile_args)
        n = int(args.get("steps_per_execution", self.per_call))
        batch = self._combined_batch()
        code = "; ".join(r.code for r in paid if r.code)
        note = "" if batch or self.batch is None else "the batch size left out (timed without your input)"
        row = dataclasses.replace(row, code=code, compile_args=args, cost=note)
        input_x = self.input_x

        def build():
            model = trial_model(self.model, args, policy=self.policy)
            return model, self.data.fit_input(n, x=None if input_x is None else input_x(), batch_size=batch)

        self.left, self.keeping = 1, False  # the last trial: all that is left
        checked = bool(self.policy) or "jit_compile" in args
        extra = max(self.compiles.get(r.change, 0.0) for r in paid)  # the longest compile of its parts
        row = self._trial(row, build, check=checked, batch=batch, extra=extra)
        self.rows.append(R.against_parts(row, [r for r in paid if r.change not in self.against_ceiling]))


def run(model, x, y, batch_size: int | None, max_seconds: float, wanted: tuple[str, ...]) -> SpeedupReport:
    """Checks the input, keeps the model's state, runs the trials, puts the state back (see the module)."""
    from keras_gpu_tools import backends

    budget = Budget(max_seconds)
    data = describe(x, y, batch_size)
    backend = backends.get()
    snapshot = backend.plan_snapshot(model, data.batch)
    side_effects = fit_side_effects(model)
    finder = _Finder(model, data, budget, backend, wanted, rng=snapshot["rng"])
    try:
        rows = finder.run()
    finally:
        backend.plan_restore(model, snapshot)
        restore_side_effects(model, side_effects)
        compiled = getattr(model, "jit_compile", False) or any(r.compile_args.get("jit_compile") for r in finder.rows)
        forget_compiled_trials(backend, compiled)
    return SpeedupReport(
        rows,
        backend=backend.name,
        device="gpu" if finder.on_gpu else "cpu",
        seconds=budget.elapsed(),
        max_seconds=max_seconds,
    )


__all__ = ["run"]
