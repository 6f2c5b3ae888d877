"""How many rows a model replica predicts at once: :class:`BatchSizer`.

A fixed ``batch_size`` is kept. ``batch_size: auto`` (the default) measures every model
call and moves toward a target, :class:`BatchTarget`: **0.5–2 s of model time per call, at
most 64 MiB of Arrow input and output per call, at most 65,536 rows** (one read batch).
Long enough that a call's fixed cost (conversion, a kernel launch, the Python call) is
small beside its rows; short enough that commits and the progress bar keep moving, and
that a kill or a timeout loses little. It starts at :data:`~chute.job.AUTO_BATCH_ROWS`
rows (1,024), or fewer where the memory cap says so (``chute plan`` says which). After a
call of ``n`` rows that took ``t`` seconds:

- ``t`` under the band: grow toward the rows that would take ~1 s (``n / t``), at most
  four times ``n`` at a step;
- ``t`` over the band: shrink to the rows that would take ~1 s, at once;
- within it, at most half of the band's top: double once, to find out whether a call's
  fixed cost is large (a GPU kernel launch, a remote call); keep doubling while each
  doubling makes a row at least :data:`PAYOFF` times cheaper, and stop at the first that
  does not (a model whose time is linear in its rows settles where it was);
- otherwise within it: keep the size.

The memory cap uses the bytes per row measured in the last call (its input columns and its
outputs as Arrow); the process's RSS is not used, because the replicas of the local engine
share one process.

Out of memory, whatever the size: the call's rows are split in half and retried, and the
replica remembers the smallest size that failed (its *ceiling*). After
:data:`GROW_AFTER_OOM` calls that fit, it grows back toward what it wants (its target,
or the fixed size), probing halfway between the largest size that fitted and the ceiling,
never the ceiling itself. A probe that runs out of memory lowers the ceiling; after
:data:`OOM_PROBES` such probes, or once the gap is within 1/16 of the size, it stops
probing and keeps the largest size that fitted. So out-of-memory errors are bounded per
replica, and the size ends within a few percent below what fits.

A batch size never changes a prediction: models map rows, and the stage reassembles the
calls in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from chute.job import BatchTarget

GROWTH = 4.0
"""The most a size grows in one step, as a multiple of the rows of the call measured."""
GROW_AFTER_OOM = 4
"""Calls that fit, after an out-of-memory split, before the size grows back."""
OOM_PROBES = 3
"""Grow-back probes that may run out of memory before the replica stops probing."""
PAYOFF = 1.2
"""Within the band, a size doubles again only if the last doubling made a row this many
times cheaper."""


@dataclass(frozen=True)
class Batching:
    """What a replica's sizing did since it last said (counts to sum), and its size now;
    and the model loads it made since (:class:`chute.stages.model.ModelStage` adds them)."""

    oom_splits: int = 0
    resizes: int = 0
    calls: int = 0
    """Model calls that fitted."""
    rows: int | None = None
    """The rows of the replica's next call, but never a grow-back probe that has not run
    yet (the largest size that fitted instead); ``None`` before any call."""
    loads: int = 0
    """Times the replica built its model: once at its start, again after a timeout."""
    load_seconds: float = 0.0
    """Their seconds: the model's imports, weights and device set-up (a GPU's context)."""


class BatchSizer:
    """The batch size of one replica: fixed (``target`` is ``None``) or measured.

    >>> sizer = BatchSizer(1_000, BatchTarget())
    >>> sizer.fitted(1_000, 0.01, 0)  # 1,000 rows in 10 ms: grow, at most 4x
    >>> sizer.rows
    4000
    >>> sizer.fitted(4_000, 8.0, 0)  # 4,000 rows in 8 s: shrink to ~1 s
    >>> sizer.rows
    500
    """

    def __init__(self, start: int, target: BatchTarget | None = None) -> None:
        self.start = max(1, start)
        self.rows = self.start
        """The rows of the next call."""
        self.target = target
        self.resizes = 0
        """Changes of size that a measurement made (out-of-memory splits not counted)."""
        self.oom_splits = 0
        self.calls = 0
        """Model calls measured."""
        self.ceiling: int | None = None
        """The smallest size that ran out of memory; never tried again."""
        self._fitted = 0
        """The largest size that fitted since the last out-of-memory error."""
        self._cooling = 0
        """Calls that must fit before the size grows back."""
        self._probes = 0
        self._row_bytes = 0.0
        self._smaller: tuple[int, float] | None = None
        """Rows and seconds of the last call measured before the size last grew."""
        self._settled = False
        """Doubling within the band stopped paying: the size stays until a call leaves it."""
        self._told = Batching()

    def take(self) -> Batching:
        """What happened since the last call (counts), and the size now."""
        told = self._told
        rows = self.rows
        if self.ceiling is not None and self._fitted:
            rows = min(rows, self._fitted)  # a probe above what fitted may not fit
        now = Batching(self.oom_splits, self.resizes, self.calls, rows)
        self._told = now
        return Batching(
            now.oom_splits - told.oom_splits,
            now.resizes - told.resizes,
            now.calls - told.calls,
            rows if self.calls else None,
        )

    def fitted(self, rows: int, seconds: float, nbytes: int) -> None:
        """A call of ``rows`` rows took ``seconds`` and held ``nbytes`` of input and output."""
        self.calls += 1
        if rows <= 0:
            return
        if self.ceiling is None or rows < self.ceiling:
            self._fitted = max(self._fitted, rows)
        self._cooling = max(0, self._cooling - 1)
        if nbytes > 0:
            self._row_bytes = nbytes / rows
        wanted = self._wanted(rows, seconds)
        if self.ceiling is not None and wanted >= self.ceiling:
            wanted = self._probe(wanted)
        if wanted > self.rows and (self._cooling or rows < self.rows // 2):
            return  # not yet after an out-of-memory error; or a tail, too small to tell
        if wanted > self.rows:
            self._smaller = (rows, seconds)
        self._resize(wanted)

    def out_of_memory(self, rows: int) -> None:
        """A call of ``rows`` rows ran out of memory: the next calls take half of it, or
        the largest size that fitted below it, if larger."""
        self.oom_splits += 1
        if self.ceiling is not None and 0 < self._fitted < rows:
            self._probes += 1  # a grow-back probe that did not fit
        self.ceiling = min(rows, self.ceiling or rows)
        if self._fitted >= rows:  # what fitted before does not now (larger rows, say)
            self._fitted = 0
        self._cooling = GROW_AFTER_OOM
        self.rows = max(1, (rows + 1) // 2 if rows > 1 else 1, self._fitted)

    def timed_out(self, rows: int, timeout: float | None) -> bool:
        """A call of ``rows`` rows did not answer within ``timeout`` seconds: a measured
        size shrinks to what the target asks of rows at least that slow, at least by half.
        A call smaller than the size (a batch's tail) says nothing of the size. No ceiling
        is kept: a hang may be a row's, and the measured growth never reaches the timeout
        (it aims at a quarter of it). Says whether the next calls are smaller than ``rows``."""
        if self.target is None or rows <= 1 or not timeout or rows < self.rows:
            return False
        wanted = max(1, min(rows // 2, int(self.target.aim * rows / timeout)))
        self._settled = False
        self._resize(min(self.rows, wanted))
        return self.rows < rows

    def _wanted(self, rows: int, seconds: float) -> int:
        """The size this call's measurement asks for, before the ceiling."""
        target = self.target
        if target is None:
            return self.start
        wanted = self.rows
        if seconds < target.low:
            per_row = max(seconds, 1e-9) / rows
            wanted = max(self.rows, int(min(target.aim / per_row, GROWTH * rows)))
        elif seconds > target.high:
            wanted = max(1, int(target.aim / (seconds / rows)))
            self._settled = False
        elif seconds <= target.high / 2 and rows == self.rows and not self._settled:
            wanted = self._climb(rows, seconds)
        if self._row_bytes > 0:
            wanted = min(wanted, max(1, int(target.memory / self._row_bytes)))
        return max(1, min(wanted, target.max_rows))

    def _climb(self, rows: int, seconds: float) -> int:
        """Within the band: twice the rows, while the last growth paid for itself."""
        if self._smaller is not None:
            before_rows, before_seconds = self._smaller
            if before_seconds / before_rows < PAYOFF * seconds / rows:
                self._settled = True  # a row costs about what it did at the smaller size
                return self.rows
        return 2 * rows

    def _probe(self, wanted: int) -> int:
        """A size at or above the ceiling is not tried: halfway from what fitted, while
        probes are left and the gap is worth it; else the largest size that fitted."""
        assert self.ceiling is not None
        fitted = min(max(self._fitted, self.rows), self.ceiling - 1)
        gap = self.ceiling - fitted
        if self._probes >= OOM_PROBES or gap <= max(1, fitted // 16):
            return min(fitted, wanted)
        return min(fitted + gap // 2, wanted)

    def _resize(self, rows: int) -> None:
        if rows != self.rows:
            self.rows = rows
            self.resizes += 1
