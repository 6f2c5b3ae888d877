"""A model that lives beside its job file: on a cluster, Ray ships this directory.

``fare:FareModel`` in job.yaml names it by module. The constructor runs once per replica
and reads a data file from this directory, as a real model would read its weights.
"""

from __future__ import annotations

import os

import numpy as np
from features import fare_per_mile

HERE = os.path.dirname(os.path.abspath(__file__))


class FareModel:
    """Flags trips whose fare per mile is above the threshold in ``threshold.txt``."""

    def __init__(self) -> None:
        with open(os.path.join(HERE, "threshold.txt")) as f:
            self.threshold = float(f.read())

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rate = fare_per_mile(batch["fare_amount"], batch["trip_distance"])
        return {"per_mile": rate.astype(np.float32), "high": rate > self.threshold}
