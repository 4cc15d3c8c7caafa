"""Engine calls on one stack that many units ask for, made together: one at a time, each with what came meanwhile.

A stack takes one update at a time (its lock), and each update costs the CLI's start, its key derivation and a
run of the program whatever it changes. So requests of several units (a pool's recreations, a shared stack's
recreations and removals) do not queue for an update each: the first starts one at once (it waits for nobody),
and the requests that arrive while it runs go together into the next. Each caller blocks until the update that
carried its request ended, and gets that update's result for its key, or its error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
R = TypeVar("R")


class Batches(Generic[K, V, R]):
    """Requests (``key -> value``) handed to ``call`` in batches; ``call`` returns a result per key of its batch
    (a key it leaves out gets None)."""

    def __init__(self, call: Callable[[dict[K, V]], Mapping[K, R | None]]) -> None:
        self._call = call
        self._changed = threading.Condition()
        self.pending: dict[K, V] = {}
        """Requests waiting for the next call."""
        self.finished: dict[K, tuple[R | None, BaseException | None]] = {}
        """Results of ended calls not yet collected by their callers."""
        self.running = False
        self._in_flight: set[K] = set()

    def submit(self, key: K, value: V) -> R | None:
        """Ask for ``value`` under ``key`` (unique among the requests in flight); blocks until the call that
        carried it ended. Raises that call's error."""
        with self._changed:
            if key in self._in_flight:
                raise ValueError(f"a request for {key!r} is in flight already")
            self._in_flight.add(key)
            self.pending[key] = value
            try:
                while key not in self.finished:
                    if self.running:
                        self._changed.wait()
                        continue
                    self._run_next()
                result, error = self.finished.pop(key)
            finally:
                self._in_flight.discard(key)
        if error is not None:
            raise error
        return result

    def _run_next(self) -> None:
        """Run the pending requests as one call (the condition held on entry and on return, not during it)."""
        batch, self.pending, self.running = self.pending, {}, True
        results: Mapping[K, R | None] = {}
        error: BaseException | None = None
        self._changed.release()
        try:
            results = self._call(batch)
        except BaseException as exc:
            error = exc
        finally:
            self._changed.acquire()
            self.running = False
            self.finished.update({key: (results.get(key), error) for key in batch})
            self._changed.notify_all()
