"""What a stage replica measures: busy seconds, rows, batches, out-of-memory splits, and
the counters its model reports (an LLM's tokens, requests, finish reasons, errors by kind)."""

from __future__ import annotations

from collections.abc import Mapping


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
        self.counters: dict[str, float] = {}
        """What the model counted (``Adapter.take_counters``) and was not yet reported."""

    def take_splits(self) -> tuple[int, int | None]:
        """The splits since the last call, and the rows per batch now; resets the count."""
        splits, self.oom_splits = self.oom_splits, 0
        return splits, self.batch_rows

    def record(self, seconds: float, rows: int) -> None:
        self.busy += seconds
        self.rows += rows
        self.batches += 1

    def count(self, counters: Mapping[str, float]) -> None:
        """Add what the model counted in a batch."""
        for name, value in counters.items():
            self.counters[name] = self.counters.get(name, 0.0) + value

    def take_counters(self) -> dict[str, float]:
        """The counters since the last call; resets them."""
        counters, self.counters = self.counters, {}
        return counters
