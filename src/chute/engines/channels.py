"""The local engine's channels: bounded queues between its threads, and the rebatcher that
cuts what a channel brings into model batches one unit at a time."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque

import numpy as np
import pyarrow as pa

from chute.stages import KEY, decode


class Stopped(Exception):
    """Raised inside a worker thread when the pipeline is shutting down."""


class Idle(Exception):
    """Raised by :meth:`Channel.get` when nothing arrived within its timeout."""


class Channel:
    """A bounded multi-producer, multi-consumer queue that knows when it is finished."""

    def __init__(self, capacity: int, producers: int, stop: threading.Event) -> None:
        self._items: deque[pa.Table] = deque()
        self._cond = threading.Condition()
        self._capacity = capacity
        self._open = producers
        self._stop = stop

    def put(self, item: pa.Table) -> None:
        with self._cond:
            while len(self._items) >= self._capacity:
                self._wait()
            self._items.append(item)
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> pa.Table | None:
        """The next item, or ``None`` once every producer has closed and it is empty;
        :class:`Idle` if ``timeout`` seconds pass without either."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self.check()  # stopping: no more work is taken, even where some is waiting
            while not self._items and self._open > 0:
                if deadline is not None and time.monotonic() >= deadline:
                    raise Idle
                self._wait(0.1 if deadline is None else min(0.1, deadline - time.monotonic()))
            if not self._items:
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def check(self) -> None:
        """:class:`Stopped` if the pipeline is shutting down."""
        if self._stop.is_set():
            raise Stopped

    def poll(self) -> pa.Table | None:
        """The next item if one is waiting now, else ``None`` at once (also while
        stopping: the driver drains what finished)."""
        with self._cond:
            if not self._items:
                return None
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def close(self) -> None:
        """One producer is finished."""
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def _wait(self, seconds: float = 0.1) -> None:
        if self._stop.is_set():
            raise Stopped
        self._cond.wait(max(seconds, 0.0))


class Rebatcher:
    """Cuts a channel's tables into batches of ``rows`` rows (or the rows each
    :meth:`take` asks for: a replica's size of the moment), one unit at a time.

    Readers work on several units at once, so their slices arrive interleaved. Batches are
    cut from each unit's own buffer, because a batch that mixed units would be written as
    one part per unit: many small files. A finished unit's tail goes on at once, joined
    only with the tails that are ready at the same moment (in the buffers, or waiting in
    the channel), never held for rows that have not arrived: a unit commits as soon as
    its last rows are through, whatever the batch size.

    A unit is finished once all its rows have arrived (its last row's key gives their
    number), not when the piece holding its last row does: replicas finish out of order,
    and a unit taken as finished at its last row would hold its earlier rows, arriving
    later, until the input ends (its commit late, its rows in memory all along).
    """

    def __init__(self, source: Channel, rows: int) -> None:
        self._source = source
        self._rows = rows
        self._units: dict[int, list[pa.Table]] = {}
        self._finished: set[int] = set()
        self._arrived: dict[int, int] = {}
        """Rows of each unfinished unit that have arrived so far."""
        self._total: dict[int, int] = {}
        """Rows of each unfinished unit whose last row has arrived."""
        self._drained = False
        self._lock = threading.Lock()

    def take(self, rows: int | None = None) -> pa.Table | None:
        with self._lock:
            self._source.check()  # stopping: not another batch, even one already buffered
            self._rows = rows or self._rows
            while True:
                batch = self._full()
                if batch is None and self._ready():
                    self._add_waiting()
                    batch = self._tails()
                if batch is not None or self._drained:
                    return batch
                self._add(self._source.get())

    def _add(self, table: pa.Table | None) -> None:
        if table is None:
            self._drained = True
            return
        if not table.num_rows:
            return
        units, rows, last = decode(table.column(KEY).to_numpy())
        if units[0] != units[-1]:  # joined tails
            for piece in _by_unit(table):
                self._add(piece)
            return
        unit = int(units[0])
        self._units.setdefault(unit, []).append(table)
        self._arrived[unit] = self._arrived.get(unit, 0) + table.num_rows
        if last.any():  # the unit's last row: its number of rows is known
            self._total[unit] = int(rows[last][-1]) + 1
        if self._arrived[unit] == self._total.get(unit):  # nothing more of it will come
            self._finished.add(unit)
            del self._arrived[unit], self._total[unit]

    def _add_waiting(self) -> None:
        """Take what the channel already holds, until the ready tails fill a batch."""
        while self._rows_of(self._ready()) < self._rows:
            table = self._source.poll()
            if table is None:
                return
            self._add(table)

    def _ready(self) -> list[int]:
        """Units whose buffered rows may go on now: finished ones (all, once drained)."""
        return [u for u in self._units if self._drained or u in self._finished]

    def _rows_of(self, units: list[int]) -> int:
        return sum(t.num_rows for u in units for t in self._units[u])

    def _full(self) -> pa.Table | None:
        for unit, tables in self._units.items():
            if sum(t.num_rows for t in tables) >= self._rows:
                return self._take(unit, self._rows)
        return None

    def _tails(self) -> pa.Table | None:
        """The ready tails joined, up to a batch; ``None`` when there are none."""
        pieces: list[pa.Table] = []
        wanted = self._rows
        for unit in self._ready():
            if wanted == 0:
                break
            pieces.append(self._take(unit, wanted))
            wanted -= pieces[-1].num_rows
        return _concat(pieces) if pieces else None

    def _take(self, unit: int, rows: int) -> pa.Table:
        """The first ``rows`` rows (or fewer, if that is all) of ``unit``'s buffer."""
        table = _concat(self._units[unit])
        rest = table.slice(rows)
        if rest.num_rows:
            self._units[unit] = [rest]
        else:
            del self._units[unit]
            self._finished.discard(unit)
        return table.slice(0, rows)


def _by_unit(table: pa.Table) -> list[pa.Table]:
    """``table`` cut where its rows' unit changes (a batch of joined tails, as an earlier
    model's rebatcher makes them: each unit's rows together, in order)."""
    units, _, _ = decode(table.column(KEY).to_numpy())
    cuts = [0, *(np.flatnonzero(np.diff(units)) + 1).tolist(), len(units)]
    return [table.slice(lo, hi - lo) for lo, hi in itertools.pairwise(cuts)]


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
