"""What a stage replica measures: busy seconds, rows, batches, and the counters its model
reports (an LLM's tokens, requests, finish reasons, errors by kind). A model replica's
batch sizes and out-of-memory splits are its sizer's (:mod:`chute.stages.batching`)."""

from __future__ import annotations

from collections.abc import Mapping


class StageClock:
    """Busy seconds and rows of one stage replica, and what its model counted."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.rows = 0
        self.batches = 0
        self.counters: dict[str, float] = {}
        """What the model counted (``Adapter.take_counters``) and was not yet reported."""

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
