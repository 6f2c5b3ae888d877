"""What a stage replica measures: busy seconds, rows, batches and out-of-memory splits."""

from __future__ import annotations


class StageClock:
    """Busy seconds and rows of one stage replica, and its out-of-memory splits."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.rows = 0
        self.batches = 0
        self.oom_splits = 0
        """Out-of-memory splits not yet reported (see :meth:`take_splits`)."""
        self.batch_rows: int | None = None
        """The most rows the replica predicts at once after a split; ``None`` before one."""

    def take_splits(self) -> tuple[int, int | None]:
        """The splits since the last call, and the rows per batch now; resets the count."""
        splits, self.oom_splits = self.oom_splits, 0
        return splits, self.batch_rows

    def record(self, seconds: float, rows: int) -> None:
        self.busy += seconds
        self.rows += rows
        self.batches += 1
