"""Feature code shared by the job's models (a sibling module: it ships with them)."""

from __future__ import annotations

import numpy as np


def fare_per_mile(fare: np.ndarray, miles: np.ndarray) -> np.ndarray:
    """Fare per mile, with trips under 0.1 mile counted as 0.1 mile."""
    return np.asarray(fare, dtype=np.float64) / np.maximum(np.asarray(miles), 0.1)
