"""The job's channel: one JSON value from every process, through the engine's key-value store.

The store is the JAX distributed client's (``keras.distribution.initialize``
runs on ``jax.distributed``): it works over the network between processes,
needs no device memory (so it works after an out-of-memory error) and is used
once per epoch, fit start or OOM, never per step.

A wait for the other processes is cut into short polls, and between them a
``stop()`` the caller gives may end it at once: a process that has died never
writes its value, and the store itself notices a death only when its
heartbeats time out (100 s by default, and JAX then aborts the survivors).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from keras_gpu_tools.runtime.topology import KEY_PREFIX, ExchangeError

POLL_S = 0.25  # one blocking read of the store at most this long, then ``stop()`` is asked


class PeerLost(ExchangeError):
    """A process of the job stopped answering while the others waited for it."""


class KVExchange:
    """Gathers one JSON value from every process through a key-value store.

    ``client`` has JAX's distributed client methods ``key_value_set(key,
    value)`` and ``blocking_key_value_get(key, timeout_ms)``. Each process
    writes its value under ``<prefix>/<key>/<index>`` and reads the others';
    every process gets the same list, ordered by process index.
    """

    def __init__(self, client: Any, process_index: int, process_count: int):
        self.client = client
        self.process_index = process_index
        self.process_count = process_count

    def _key(self, key: str, index: int) -> str:
        return f"{KEY_PREFIX}/{key}/{index}"

    def gather(self, key: str, value: Any, timeout_s: float, stop: Callable[[], str | None] | None = None) -> list[Any]:
        """Every process's ``value`` for ``key``.

        Raises :class:`ExchangeError` after ``timeout_s``, or :class:`PeerLost`
        as soon as ``stop()`` gives a reason (asked every ``POLL_S`` seconds
        while a process has not answered).
        """
        try:
            self.client.key_value_set(self._key(key, self.process_index), json.dumps(value))
        except Exception as e:
            raise ExchangeError(f"writing {key!r} to the job's key-value store failed ({e})") from None
        deadline = time.monotonic() + timeout_s
        out: list[Any] = []
        for i in range(self.process_count):
            if i == self.process_index:
                out.append(value)
                continue
            out.append(self._read(key, i, deadline, timeout_s, stop))
        return out

    def _read(self, key: str, index: int, deadline: float, timeout_s: float, stop) -> Any:
        while True:
            left = deadline - time.monotonic()
            poll = left if stop is None else min(left, POLL_S)
            began = time.monotonic()
            try:
                raw = self.client.blocking_key_value_get(self._key(key, index), max(1, int(poll * 1000)))
                break
            except Exception as e:
                if time.monotonic() >= deadline:
                    raise ExchangeError(
                        f"process {index} gave no {key!r} within {timeout_s:g} s ({type(e).__name__})"
                    ) from None
                time.sleep(max(0.0, began + poll - time.monotonic()))  # a store that fails at once: no busy loop
            reason = stop() if stop is not None else None
            if reason is not None:
                raise PeerLost(f"{reason}; stopped waiting for its {key!r}")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise ExchangeError(f"process {index}'s {key!r} is not JSON ({e})") from None

    def delete(self, key: str) -> None:
        """Removes this process's value of ``key`` (best effort)."""
        try:
            self.client.key_value_delete(self._key(key, self.process_index))
        except Exception:
            pass

    def give_up(self, key: str, reason: str) -> None:
        """Tells the other processes that this one stops exchanging under ``key`` (best effort)."""
        try:
            self.client.key_value_set(self._key(f"{key}/gave_up", self.process_index), json.dumps(reason))
        except Exception:
            pass  # they will time out once instead

    def gave_up(self, key: str) -> dict[int, str]:
        """The other processes that gave up under ``key``, with their reason: one look-up, no wait."""
        dir_get = getattr(self.client, "key_value_dir_get", None)
        if dir_get is None:
            return {}
        try:
            entries = dir_get(f"{KEY_PREFIX}/{key}/gave_up")
        except Exception:
            return {}
        out: dict[int, str] = {}
        for name, raw in entries:
            try:
                index = int(str(name).rsplit("/", 1)[1])
                reason = json.loads(raw)
            except (IndexError, ValueError):
                continue
            if index != self.process_index:
                out[index] = str(reason)
        return out

    # -- signs of life: a counter each process rewrites while it trains --------------------------
    def beat(self, count: int) -> None:
        """Rewrites this process's sign of life (raises where the store fails)."""
        self.client.key_value_set(self._key("alive", self.process_index), str(count), allow_overwrite=True)

    def beats(self) -> dict[int, str | None]:
        """The other processes' signs of life as last written (None: none yet): one look-up each, no wait."""
        out: dict[int, str | None] = {}
        for i in range(self.process_count):
            if i == self.process_index:
                continue
            try:
                out[i] = str(self.client.key_value_try_get(self._key("alive", i)))
            except Exception:
                out[i] = None
        return out
