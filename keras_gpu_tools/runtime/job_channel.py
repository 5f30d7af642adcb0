"""One fit()'s use of the job's channel, shared by every callback of the package in a process.

In a job of several processes our callbacks wait for each other at an epoch
end (job-wide figures), at fit start (ProfilerWindow's sessions) and on an
out-of-memory error (the reducer's agreement). Without care, each wait is a
place where the job hangs on us and not on Keras. The channel makes sure:

- **A dead process ends every wait at once.** Each process rewrites a sign of
  life in the store twice a second from a thread of its own; a wait asks
  between short polls whether a process has gone silent for
  ``SILENT_AFTER_S`` (the store's own heartbeat notices a death only after
  100 s, and JAX then aborts the survivors). The wait ends with
  :class:`PeerLost`; a monitoring callback then carries on, so the next step's
  collective raises in fit() as it would without the package.
- **One wait per epoch end, whatever the number of callbacks.** The gathers of
  one round (the same tag, such as ``epoch3``) share one deadline, and after a
  failure no callback waits again in this fit.
- **The processes run the same callbacks.** At fit start each process writes
  which of our callbacks it runs and reads the others' (within
  ``ROSTER_TIMEOUT_S``). A callback that needs every process (the reducer
  agrees on each batch's split) and is missing somewhere is refused on every
  process, naming them; any other callback missing somewhere simply leaves
  its job-wide figures out, with no wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any, Protocol

from keras_gpu_tools.runtime.kv_exchange import KVExchange, PeerLost
from keras_gpu_tools.runtime.ticker import Ticker
from keras_gpu_tools.runtime.topology import ExchangeError

ROSTER_TIMEOUT_S = 30.0  # how long fit start waits for every process's list of callbacks
BEAT_S = 0.5  # how often a process rewrites its sign of life
SILENT_AFTER_S = 5.0  # a process whose sign of life has not changed this long has stopped
_ROUNDS_KEPT = 8  # the deadlines of this many recent rounds are kept

_SERIAL: dict[int, int] = {}  # multi-process fits started, by process index: every process counts alike
_SERIAL_LOCK = threading.Lock()


class JobMember(Protocol):
    """One of the package's callbacks, as the processes compare them at fit start."""

    def _job_role(self) -> tuple[str, str, bool]:
        """(class name, run name, whether every process must run it)."""
        ...


class JobChannel:
    """The job's channel for one fit() of one process; see the module docstring."""

    def __init__(self, exchange: KVExchange, serial: int):
        self.exchange = exchange
        self.index = exchange.process_index
        self.count = exchange.process_count
        self.scope = f"job/fit{serial}"
        self.failure: str | None = None  # why no callback waits again in this fit
        self.roster: dict[tuple[str, str], list[int]] | None = None  # (kind, name) -> processes running it
        self.roster_failure: str | None = None
        self.agreeing: set[tuple[str, str]] = set()  # the callbacks every process must run
        self._deadlines: dict[str, float] = {}
        self._seen: dict[int, tuple[str | None, float]] = {}  # process -> (sign of life, when it last changed)
        self._beats = 0
        self._ticker = Ticker("keras_gpu_tools-heartbeat")
        self._lock = threading.Lock()

    @classmethod
    def of(cls, session: Any, exchange: Any) -> JobChannel | None:
        """The channel of ``session``'s fit, started at the first call (None without a key-value store)."""
        if not isinstance(exchange, KVExchange) or exchange.process_count < 2:
            return None
        channel = session.shared.get("job_channel")
        if channel is None:
            with _SERIAL_LOCK:
                serial = _SERIAL[exchange.process_index] = _SERIAL.get(exchange.process_index, 0) + 1
            channel = session.shared["job_channel"] = cls(exchange, serial)
            session.on_close(channel.close)
            channel.start()
        return channel

    # -- signs of life ---------------------------------------------------------------------------
    def start(self) -> None:
        self._beat()
        self._ticker.every(BEAT_S, self._beat, lambda e: None, delay=BEAT_S)

    def close(self) -> None:
        self._ticker.close()

    def _beat(self) -> None:
        self._beats += 1
        self.exchange.beat(self._beats)  # a failure is retried at the next beat

    def silent(self) -> str | None:
        """Why a process is taken for dead (its sign of life unchanged for ``SILENT_AFTER_S``), or None."""
        now = time.monotonic()
        for i, value in self.exchange.beats().items():
            last = self._seen.get(i)
            if last is None or last[0] != value:
                self._seen[i] = (value, now)
            elif now - last[1] >= SILENT_AFTER_S:
                return f"process {i} stopped answering (no sign of life for {now - last[1]:.0f} s: it has most likely died)"
        return None

    def _stop_reason(self) -> str | None:
        quitters = self.exchange.gave_up(self.scope)
        if quitters:
            i = min(quitters)
            return f"process {i} stopped exchanging ({quitters[i]})"
        return self.silent()

    # -- waits ------------------------------------------------------------------------------------
    def gather(self, key: str, value: Any, timeout_s: float) -> list[Any]:
        """Every process's ``value`` for ``key`` (the job's :class:`Exchange`, as the reducer uses it)."""
        return self.gather_round(key, value, timeout_s, None)

    def delete(self, key: str) -> None:
        self.exchange.delete(key)

    def give_up(self, key: str, reason: str) -> None:
        self.exchange.give_up(key, reason)

    def gave_up(self, key: str) -> dict[int, str]:
        return self.exchange.gave_up(key)

    def gather_round(self, key: str, value: Any, timeout_s: float, round: str | None) -> list[Any]:
        """Every process's ``value`` for ``key``, ending at once when a process dies or gives up.

        Gathers of the same ``round`` share one deadline. After a failure
        (here or in another callback) this raises at once, without waiting.
        """
        if self.failure is None and (quitters := self.exchange.gave_up(self.scope)):
            self.fail(f"process {min(quitters)} stopped exchanging ({quitters[min(quitters)]})")
        if self.failure is not None:
            raise ExchangeError(self.failure)
        now = time.monotonic()
        if round is not None:
            deadline = self._deadlines.setdefault(round, now + timeout_s)
            while len(self._deadlines) > _ROUNDS_KEPT:
                del self._deadlines[next(iter(self._deadlines))]
            timeout_s = deadline - now
            if timeout_s <= 0:
                self.fail(f"this epoch end's wait for the other processes ({round}) has run out")
                raise ExchangeError(self.failure or "")
        try:
            return self.exchange.gather(key, value, timeout_s, stop=self._stop_reason)
        except ExchangeError as e:
            self.fail(str(e))
            raise

    def fail(self, reason: str) -> None:
        """No callback waits again in this fit; the other processes are told (no wait)."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = reason
        self.exchange.give_up(self.scope, f"process {self.index}: {reason}")

    # -- which callbacks every process runs ---------------------------------------------------------
    def compare(self, members: Iterable[JobMember]) -> None:
        """Exchanges this process's callbacks with every other's (the first caller of a fit; at most once)."""
        with self._lock:
            if self.roster is not None or self.roster_failure is not None:
                return
        mine = sorted({m._job_role() for m in members})
        key = f"{self.scope}/roster"
        try:
            rosters = self.exchange.gather(key, [list(r) for r in mine], ROSTER_TIMEOUT_S)
        except ExchangeError as e:
            self.roster_failure = (
                f"{e}: that process runs none of keras_gpu_tools's callbacks, or reached fit() more than "
                f"{ROSTER_TIMEOUT_S:g} s after this one"
            )
            self.exchange.give_up(key, self.roster_failure)
            self.fail(self.roster_failure)
            return
        quitters = self.exchange.gave_up(key)  # a process that stopped waiting before this one arrived
        if quitters:
            i = min(quitters)
            self.roster_failure = f"process {i} stopped waiting for this process's callbacks ({quitters[i]})"
            self.fail(self.roster_failure)
            return
        roster: dict[tuple[str, str], list[int]] = {}
        for p, entries in enumerate(rosters):
            for kind, name, _agrees in entries:
                roster.setdefault((str(kind), str(name)), []).append(p)
        self.agreeing = {(str(k), str(n)) for entries in rosters for k, n, a in entries if a}
        self.roster = roster

    def check(self, member: JobMember) -> str | None:
        """Raises ValueError where the job cannot run as configured; else why ``member``'s job figures are out."""
        kind, name, agrees = member._job_role()
        if self.roster_failure is not None:
            if agrees:
                raise ValueError(
                    f"{kind}: every process of the job must run it (the processes agree on each batch's split), "
                    f"and the processes could not compare their callbacks at fit start: {self.roster_failure}. "
                    "fit() is refused rather than left waiting in a collective."
                )
            return self.roster_failure
        if self.roster is None:
            return None
        everyone = set(range(self.count))
        for entry in sorted(self.agreeing):
            missing = sorted(everyone - set(self.roster[entry]))
            if missing:
                raise ValueError(
                    f"{entry[0]} (run {entry[1]!r}) runs on process(es) {self.roster[entry]} but not on "
                    f"process(es) {missing}: every process of the job must run it (the processes agree on each "
                    "batch's split, and one without it would leave the others waiting), so fit() is refused on "
                    "every process. Give every process the same callbacks."
                )
        running = self.roster.get((kind, name))
        if running is None:
            return None  # not among the callbacks fit() was given: nothing to compare
        missing = sorted(everyone - set(running))
        if missing:
            return f"{kind} (run {name!r}) does not run on process(es) {missing}"
        return None


__all__ = ["ROSTER_TIMEOUT_S", "SILENT_AFTER_S", "JobChannel", "JobMember", "PeerLost"]
